"""The browser test's legibility checks (``tests/figure_checks.py``) can fail: each is run in headless Chromium on
small pages holding a figure built to have its defect, and on the same figure mended with the helper the book uses
(:mod:`depthlib.plots`), and must flag the first and pass the second. No book is built: the figures are drawn by the
plotly.js of the installed plotly wheel, the copy the book vendors."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from depthlib import plots
from tests import figure_checks as fc

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: the width of the book's main column at a 1280 px window (book/depthlib.css), where its figures are drawn
COLUMN_PX = 760


@pytest.fixture(scope="module")
def page():
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (pip) drives Chromium")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        yield page
        browser.close()


def _plotly_js() -> Path:
    import plotly
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _show(page, tmp_path: Path, *items) -> None:
    """Open a page holding ``items`` (figures, each with a numbered caption under it as :func:`plots.show` writes
    it, or HTML strings) in the book's column width."""
    pio.templates["depthlib"] = plots._template()
    body = []
    for k, item in enumerate(items, 1):
        if isinstance(item, go.Figure):
            item.update_layout(template="plotly_white+depthlib")
            body.append(pio.to_html(item, include_plotlyjs=False, full_html=False, default_width="100%",
                                    default_height=item.layout.height or plots.HEIGHT))
            body.append(f"<p class='depthlib-caption'><b>Fig. 9.{k}</b> — a test figure</p>")
        else:
            body.append(item)
    html = tmp_path / "page.html"
    html.write_text(f"<html><head><meta charset='utf-8'><script src='{_plotly_js().as_uri()}'></script></head>"
                    f"<body style='width:{COLUMN_PX}px'>{''.join(body)}</body></html>", encoding="utf-8")
    page.goto(html.as_uri(), wait_until="load")
    page.wait_for_timeout(500)


def _run(page, check: str) -> list[str]:
    return page.evaluate(fc.CHECKS[check])


def _line(title="A figure title", x_title="x (unit)", y_title="y (unit)", **axes) -> go.Figure:
    fig = plots.new_figure(title, x_title, y_title, **axes)
    fig.add_trace(go.Scatter(x=[1, 2, 3, 4, 5], y=[2.0, 3.0, 4.0, 4.5, 5.0], mode="lines+markers", name="data"))
    return fig


def test_axis_title_running_into_the_figure_title_is_flagged(page, tmp_path):
    long = "a long y-axis title that says a great deal about the quantity, the unit and how it was averaged"
    _show(page, tmp_path, _line(y_title=long))
    bad = _run(page, "axis_titles")
    assert bad and "Fig. 9.1" in bad[0] and "overlaps" in bad[0]
    _show(page, tmp_path, plots.fit_axis_titles(_line(y_title=long)))
    assert _run(page, "axis_titles") == []


def test_axis_with_fewer_than_two_tick_labels_is_flagged(page, tmp_path):
    narrow = _line(log_y=True)
    narrow.data[0].y = (0.0101, 0.0103, 0.0104, 0.0106, 0.0108)
    one = go.Figure(narrow)
    one.update_yaxes(tickmode="array", tickvals=[0.01, 0.1])      # decades: none inside the data's range
    _show(page, tmp_path, one)
    bad = _run(page, "tick_labels")
    assert bad and "y axis" in bad[0] and "0 tick label" in bad[0]
    _show(page, tmp_path, plots.decade_ticks(go.Figure(narrow)))
    assert _run(page, "tick_labels") == []
    # a category axis with one category is exempt: its one label names the only row
    single = plots.new_figure("t", "value (unit)", "")
    single.add_trace(go.Scatter(x=[1.0, 2.0], y=["only row", "only row"], mode="markers"))
    single.update_yaxes(type="category")
    _show(page, tmp_path, single)
    assert _run(page, "tick_labels") == []


def test_labels_printed_over_each_other_are_flagged(page, tmp_path):
    forest = plots.new_figure("Exponents", "α (dimensionless)", "")
    forest.add_trace(go.Scatter(x=[0.5, 1.5], y=["a", "b"], mode="markers", showlegend=False))
    forest.update_yaxes(type="category")
    forest.update_xaxes(range=[0, 2])
    broken = go.Figure(forest)
    for x, text in ((1, "1: ensemble averaging"), (1.3, "1.3: a smooth flow")):
        broken.add_vline(x=x, line_dash="dot")
        broken.add_annotation(x=x, y=1, yref="paper", text=text, showarrow=False, xanchor="left", yanchor="bottom")
    ticks = _line()
    ticks.update_xaxes(tickmode="array", tickvals=[1, 1.02, 3], ticktext=["one", "one and a bit", "three"])
    _show(page, tmp_path, broken, ticks)
    bad = _run(page, "labels_overlap")
    assert any("Fig. 9.1" in b and "ensemble averaging" in b for b in bad), bad
    assert any("Fig. 9.2" in b and "one and a bit" in b for b in bad), bad
    _show(page, tmp_path, plots.guides(go.Figure(forest), [(1, "1: ensemble averaging"), (1.3, "1.3: a smooth flow")]))
    assert _run(page, "labels_overlap") == []


def test_labels_cut_by_the_figures_edge_are_flagged(page, tmp_path):
    rows = plots.new_figure("Rows", "value (unit)", "")
    rows.add_trace(go.Scatter(x=[1, 2], y=["a row label far too long for the margin left of the plot", "b"],
                              mode="markers"))
    rows.update_yaxes(type="category", automargin=False)
    _show(page, tmp_path, rows)
    bad = _run(page, "labels_overlap")
    assert bad and "cut by the figure's edge" in bad[0], bad
    _show(page, tmp_path, go.Figure(rows).update_yaxes(automargin=True))
    assert _run(page, "labels_overlap") == []


def test_legend_over_tick_labels_is_flagged(page, tmp_path):
    names = [f"a long category name {k}" for k in range(8)]
    fig = plots.new_figure("Per model", "model", "Δ loss (nats)", log_y=True)
    for i in range(3):
        fig.add_trace(go.Scatter(x=names, y=[10.0 ** (-i - k / 4) for k in range(8)], mode="markers", name=f"third {i}"))
    broken = go.Figure(fig).update_layout(legend=dict(orientation="h", x=0, y=-0.22, yanchor="top"))
    _show(page, tmp_path, broken)
    assert any("(box)" in b or "third" in b for b in _run(page, "labels_overlap"))
    _show(page, tmp_path, go.Figure(fig).update_layout(legend=plots.LEGEND_BELOW))
    assert _run(page, "labels_overlap") == []


def test_data_in_a_corner_of_its_axis_are_flagged(page, tmp_path):
    broken = _line()
    broken.update_xaxes(range=[0, 30])
    _show(page, tmp_path, broken)
    bad = _run(page, "data_span")
    assert bad and "x axis" in bad[0] and "range 0 to 30" in bad[0]
    _show(page, tmp_path, plots.fixed_range(go.Figure(broken), "xaxis", "the scale of a comparison"), _line())
    assert _run(page, "data_span") == []
    # a single value has no span to fill; a WebGL trace's points are measured too
    gl = plots.new_figure("t", "x (unit)", "y (unit)")
    gl.add_trace(go.Scattergl(x=list(range(50)), y=[0.0] * 49 + [100.0], mode="markers"))
    gl.update_xaxes(range=[0, 1000])
    _show(page, tmp_path, gl)
    assert [b for b in _run(page, "data_span") if "x axis" in b]


def test_colours_nothing_names_are_flagged(page, tmp_path):
    forest = plots.new_figure("Per model", "value (unit)", "")
    forest.add_trace(go.Scatter(x=[1, 2, 3], y=["lm a", "toy b", "toy c"], mode="markers", showlegend=False,
                                marker=dict(size=10, color=[plots.color(1), plots.color(0), plots.color(0)])))
    forest.update_yaxes(type="category")
    heat = plots.new_figure("Heat", "x (unit)", "y (unit)")
    heat.add_trace(go.Heatmap(z=[[1, 2], [3, 4]], showscale=False))
    _show(page, tmp_path, go.Figure(forest), heat)
    bad = _run(page, "colours_named")
    assert any("Fig. 9.1" in b and "2 colours" in b for b in bad), bad
    assert any("Fig. 9.2" in b and "without a colorbar" in b for b in bad), bad
    keyed = plots.colour_key(go.Figure(forest), {"language model": plots.color(1), "toy": plots.color(0)})
    _show(page, tmp_path, keyed, plots.new_figure("Heat", "x (unit)", "y (unit)").add_trace(go.Heatmap(z=[[1, 2]])))
    assert _run(page, "colours_named") == []


def test_truncated_table_cells_are_flagged(page, tmp_path):
    frame = pd.DataFrame({"reading": ["gemma-3-270m: 0.67 [0.64, 0.69]; smollm2-135m: 0.61 [0.58, 0.64]"]})
    with pd.option_context("display.max_colwidth", 50):            # pandas' default
        cut = frame._repr_html_()                                   # what a notebook shows
    styled = ("<table><tr><th>claim</th></tr><tr><td><div style='width:80px;overflow:hidden;white-space:nowrap;"
              "text-overflow:ellipsis'>a cell far wider than its box</div></td></tr></table>")
    _show(page, tmp_path, cut, styled)
    bad = _run(page, "table_cells")
    assert any("ends in an ellipsis" in b for b in bad) and any("text-overflow" in b for b in bad), bad
    with pd.option_context("display.max_colwidth", None):          # what plots.setup_plotly sets
        whole = frame._repr_html_()
    _show(page, tmp_path, whole)
    assert _run(page, "table_cells") == []

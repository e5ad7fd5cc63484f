"""Plotly figure builders and the book renderer: one look for every chapter.

Call :func:`setup_plotly` once per notebook. It registers a ``book`` renderer that emits small
``text/html`` (no inlined plotly.js: the book loads the copy vendored from the plotly wheel once per
page) next to the native plotly mimetype that JupyterLab draws. Without it plotly >= 6 emits only the
plotly mimetype inside a kernel, which Jupyter Book cannot render, and figures silently vanish.

Every chapter builds figures with :func:`new_figure` (shared template, units in axis titles) and shows
them with :func:`show`, which puts a caption under the figure saying what to see.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer

#: Colour-blind-safe palette (Okabe–Ito), used in this order by every chapter.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
#: Sequential colour scale for heat maps.
HEAT = "Viridis"
FONT = "Inter, Helvetica Neue, Arial, sans-serif"
WIDTH_CSS = "100%"
HEIGHT = 430


class BookHtmlRenderer(MimetypeRenderer):
    """Renders a figure as an HTML fragment that relies on a page-level plotly.js."""

    def to_mimebundle(self, fig_dict):
        html = pio.to_html(fig_dict, include_plotlyjs=False, include_mathjax=False, full_html=False,
                           default_width=WIDTH_CSS, default_height=fig_dict.get("layout", {}).get("height", HEIGHT),
                           validate=False, config={"displaylogo": False, "responsive": True,
                                                   "displayModeBar": "hover"})
        return {"text/html": html}


def _template() -> go.layout.Template:
    t = go.layout.Template()
    t.layout = go.Layout(
        font=dict(family=FONT, size=13, color="#222"),
        colorway=list(PALETTE),
        plot_bgcolor="white", paper_bgcolor="white",
        margin=dict(l=70, r=30, t=80, b=60),
        height=HEIGHT,
        hovermode="closest",
        legend=dict(bgcolor="rgba(255,255,255,0.8)", bordercolor="#ddd", borderwidth=1),
        xaxis=dict(showline=True, linecolor="#444", mirror=True, ticks="outside", gridcolor="#eee", zeroline=False),
        yaxis=dict(showline=True, linecolor="#444", mirror=True, ticks="outside", gridcolor="#eee", zeroline=False),
    )
    return t


#: the chapter whose figures :func:`show` numbers ("Fig. k.n"), and how many it has shown
_NUMBERING = {"chapter": None, "n": 0}


def setup_plotly(chapter: int | None = None) -> None:
    """Register the depthlib template and the book renderer (idempotent). With ``chapter``, :func:`show` numbers
    the figures it shows from then on "Fig. chapter.1", "Fig. chapter.2", ... (one numbering per notebook)."""
    _NUMBERING.update(chapter=chapter, n=0)
    pio.templates["depthlib"] = _template()
    pio.templates.default = "plotly_white+depthlib"
    pio.renderers["book"] = BookHtmlRenderer()
    pio.renderers.default = "plotly_mimetype+book"


def new_figure(title: str, x_title: str, y_title: str, *, log_x: bool = False, log_y: bool = False,
               height: int = HEIGHT) -> go.Figure:
    """An empty figure in the shared style. Axis titles must carry units, e.g. 'depth ℓ (blocks)'."""
    fig = go.Figure()
    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left", y=0.97, yanchor="top"), height=height)
    # not "linear": plotly then types each axis from its data, so category labels get a category axis
    fig.update_xaxes(title_text=x_title, type="log" if log_x else "-")
    fig.update_yaxes(title_text=y_title, type="log" if log_y else "-")
    return fig


def _axis_values(fig: go.Figure, axis: str) -> np.ndarray:
    """The finite positive data values drawn on layout axis ``axis`` ('xaxis', 'yaxis2', ...)."""
    letter, suffix = axis[0], axis[5:]
    values = []
    for trace in fig.data:
        if (getattr(trace, f"{letter}axis", None) or letter) != letter + suffix:
            continue
        data = getattr(trace, letter, None)
        if data is None:
            continue
        try:
            arr = np.asarray(data, dtype=float).ravel()
        except (TypeError, ValueError):
            continue
        values.append(arr[np.isfinite(arr) & (arr > 0)])
    return np.concatenate(values) if values else np.array([])


def decade_ticks(fig: go.Figure) -> go.Figure:
    """Label log axes at powers of ten only (plotly labels the minor ticks of a short log axis with bare digits,
    "3, 2, 0.1, 9, 8 …"); minor ticks stay, unlabelled. An axis whose data lie within one decade gets the 1-2-5
    values inside it instead. Axes with their own tick values are left alone."""
    layout = fig.layout.to_plotly_json()
    for axis, spec in layout.items():
        if not (axis.startswith("xaxis") or axis.startswith("yaxis")) or spec.get("type") != "log":
            continue
        if spec.get("tickmode") == "array" or spec.get("tickvals") is not None or spec.get("dtick") is not None:
            continue
        values = _axis_values(fig, axis)
        if len(values) == 0:
            continue
        lo, hi = np.floor(np.log10(values.min())), np.floor(np.log10(values.max()))
        if hi > lo:
            fig.update_layout({axis: dict(dtick=1, minor=dict(ticks="outside", ticklen=3, dtick="D1"))})
        else:
            nice = [m * 10 ** lo for m in (1, 2, 5, 10)]
            vals = [v for v in nice if values.min() / 1.5 <= v <= values.max() * 1.5] or [values.min(), values.max()]
            fig.update_layout({axis: dict(tickmode="array", tickvals=vals, ticktext=[f"{v:g}" for v in vals])})
    return fig


#: the most legend entries a figure shows at once: more hide behind a scrollbar at the book's 1280 px
MAX_LEGEND_ENTRIES = 10


def _has_data(trace) -> bool:
    """Whether ``trace`` has a finite number to draw in any of its coordinates (category labels beside missing values
    draw nothing)."""
    for k in ("x", "y", "z", "values", "r"):
        v = getattr(trace, k, None)
        if v is not None and np.size(v):
            numbers = pd.to_numeric(pd.Series(np.asarray(v, dtype=object).ravel()), errors="coerce")
            if np.isfinite(numbers.to_numpy(float)).any():
                return True
    return False


def figure_problems(fig: go.Figure) -> list[str]:
    """What keeps a reader from reading ``fig``: no trace with data, no titled x or y axis (the quantity and its
    unit; with subplots one titled axis of each kind suffices; a category axis's labels name its rows), category
    labels on an axis typed linear or log (plotly draws nothing), or more than :data:`MAX_LEGEND_ENTRIES` legend
    entries shown at once."""
    problems = [] if any(_has_data(t) for t in fig.data) else ["no trace has data"]
    layout = fig.layout.to_plotly_json()
    cartesian = any(getattr(t, "xaxis", None) is not None or t.type in ("scatter", "bar", "box", "heatmap")
                    for t in fig.data)
    for kind in ("x", "y"):
        titled = [a for a, spec in layout.items() if a.startswith(kind + "axis")
                  and ((spec.get("title") or {}).get("text") or spec.get("type") == "category")]
        if cartesian and not titled:
            problems.append(f"no {kind} axis has a title")
    for t in fig.data:
        for kind in ("x", "y"):
            values = getattr(t, kind, None)
            axis = layout.get((getattr(t, f"{kind}axis", None) or kind).replace(kind, kind + "axis", 1), {})
            if (values is not None and axis.get("type") in ("linear", "log")
                    and pd.to_numeric(pd.Series(np.asarray(values, dtype=object).ravel()), errors="coerce").isna().all()
                    and any(isinstance(v, str) for v in np.asarray(values, dtype=object).ravel())):
                problems.append(f"category labels on the numeric {kind} axis (they draw nothing)")
    shown = [t for t in fig.data if t.showlegend is not False and t.visible in (None, True, "legendonly")]
    if layout.get("showlegend") is not False and len(shown) > MAX_LEGEND_ENTRIES:
        problems.append(f"{len(shown)} legend entries shown at once (at most {MAX_LEGEND_ENTRIES})")
    return problems


def show(fig: go.Figure, caption: str) -> None:
    """Display a figure with a caption underneath (rendered as Markdown in JupyterLab and in the book).

    Log axes are labelled at decades only (:func:`decade_ticks`). A figure a reader cannot read
    (:func:`figure_problems`) is an error, so executing the notebooks (nbval, the book build) checks every figure."""
    from IPython.display import Markdown, display
    if not caption.strip():
        raise ValueError("a figure needs a caption that says what to see")
    problems = figure_problems(fig)
    if problems:
        raise ValueError(f"figure {fig.layout.title.text or '(untitled)'!r}: " + "; ".join(problems))
    decade_ticks(fig)
    fig.show()
    if _NUMBERING["chapter"] is not None:
        _NUMBERING["n"] += 1
        caption = f"<b>Fig. {_NUMBERING['chapter']}.{_NUMBERING['n']}</b> — {caption}"
    display(Markdown(f"<p class='depthlib-caption'>{caption}</p>"))


#: the box every page showing a ``smoke`` run carries
PLACEHOLDER_HTML = ("<div class='admonition warning depthlib-placeholder'><p class='admonition-title'>Placeholder "
                    "numbers</p><p>This page shows <code>smoke</code> runs: they only prove that the code runs end to "
                    "end, and their numbers mean nothing. Set <code>PROFILE = \"cpu\"</code> (or build with "
                    "<code>make book</code>) for the book's results.</p></div>")


def run_note(runs) -> None:
    """Say which run(s) a chapter shows (profile, device, commit, code fingerprint) and warn visibly if stale."""
    import html

    from IPython.display import HTML, display

    from depthlib import results
    runs = list(runs.values()) if isinstance(runs, dict) else (runs if isinstance(runs, (list, tuple)) else [runs])
    if any(r.profile == "smoke" for r in runs):
        display(HTML(PLACEHOLDER_HTML))
    lines = "".join(f"<li><code>{html.escape(results.provenance(r))}</code></li>" for r in runs)
    display(HTML(f"<div class='depthlib-provenance'><p>Numbers on this page come from:</p><ul>{lines}</ul></div>"))
    for r in runs:
        warning = results.staleness_note(r)
        if warning:
            display(HTML("<div class='admonition warning'><p class='admonition-title'>Stale run "
                         f"({html.escape(r.experiment)}/{r.key})</p><p>{html.escape(warning)}</p></div>"))


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def slider_steps(labels: Sequence[str], n_traces_per_step: int, *, n_fixed: int = 0,
                 titles: Sequence[str] | None = None) -> list[dict]:
    """Steps for a plotly slider that shows one group of ``n_traces_per_step`` traces at a time.

    Traces are laid out as ``n_fixed`` always-visible traces followed by one group per label. Works in
    the static book (no kernel): every group is precomputed. ``titles`` sets ``title.text`` per step
    (plotly.js >= 3 erases the title if a step sets a bare ``title`` string).
    """
    n = n_fixed + n_traces_per_step * len(labels)
    steps = []
    for i, label in enumerate(labels):
        visible = [True] * n_fixed + [False] * (n - n_fixed)
        start = n_fixed + i * n_traces_per_step
        visible[start:start + n_traces_per_step] = [True] * n_traces_per_step
        update: dict = {}
        if titles is not None:
            update["title.text"] = titles[i]
        steps.append(dict(method="update", label=str(label), args=[{"visible": visible}, update]))
    return steps


def add_slider(fig: go.Figure, steps: list[dict], *, active: int = 0, prefix: str = "") -> go.Figure:
    fig.update_layout(sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix=prefix),
                                    pad=dict(t=50), len=0.95, x=0.025)])
    fig.update_layout(margin=dict(b=120))
    return fig


def dropdown(fig: go.Figure, buttons: list[dict], *, x: float = 1.0, y: float = 1.16,
             direction: str = "down") -> go.Figure:
    """Add a dropdown menu (static-book control) to switch between precomputed views."""
    menus = list(fig.layout.updatemenus or [])
    menus.append(dict(buttons=buttons, x=x, y=y, xanchor="right", yanchor="top", direction=direction,
                      showactive=True))
    fig.update_layout(updatemenus=menus)
    return fig


def log_ticks(values: Iterable[float]) -> dict:
    """Tick values/labels for a log axis showing the data's own values (e.g. depths 6, 12, 24, 48)."""
    vals = sorted(set(float(v) for v in values))
    return dict(tickmode="array", tickvals=vals, ticktext=[f"{v:g}" for v in vals])


def power_law_line(x: np.ndarray, coefficient: float, exponent: float, n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Points of y = coefficient * x^(-exponent) spanning the range of x on a log grid."""
    grid = np.geomspace(np.min(x), np.max(x), n)
    return grid, coefficient * grid ** (-exponent)

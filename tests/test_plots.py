"""The shared plot style: log axes with at least three labels, long axis titles broken, subscripts, colour keys and
guides named in the legend, the placeholder box of smoke runs, the forest plot's category axis, and the check that
refuses a figure a reader cannot read."""
import pandas as pd
import plotly.graph_objects as go
import pytest

from depthlib import plots


def _log_figure(x, y):
    fig = plots.new_figure("t", "x (unit)", "y (unit)", log_x=True, log_y=True)
    fig.add_trace(go.Scatter(x=x, y=y))
    return fig


def _labelled_inside(axis, lo, hi) -> list[str]:
    return [t for v, t in zip(axis.tickvals, axis.ticktext) if lo <= v <= hi]


def test_log_axes_spanning_three_decades_label_decades_only():
    fig = plots.decade_ticks(_log_figure([0.05, 3.0, 40.0], [0.2, 0.9, 300.0]))
    assert _labelled_inside(fig.layout.xaxis, 0.05, 40) == ["0.1", "1", "10"] and fig.layout.xaxis.minor.dtick == "D1"
    assert _labelled_inside(fig.layout.yaxis, 0.2, 300) == ["1", "10", "100"]
    fig = plots.decade_ticks(_log_figure([1e-9, 1e9], [1e-6, 1e-5, 1e-4]))     # at most 8 decades labelled
    assert _labelled_inside(fig.layout.xaxis, 1e-9, 1e9) == [f"10<sup>{e}</sup>" for e in ("−9", "−6", "−3", "0", "3",
                                                                                          "6", "9")]
    assert _labelled_inside(fig.layout.yaxis, 1e-6, 1e-4) == ["10<sup>−6</sup>", "10<sup>−5</sup>", "10<sup>−4</sup>"]


def test_short_log_axes_get_at_least_three_labels_inside_the_data():
    # one decade boundary inside (0.2-3), within one decade (1.2-9, 12-47), within a few per cent (0.0101-0.0108)
    fig = plots.decade_ticks(_log_figure([1.2, 4.0, 9.0], [0.2, 0.9, 3.0]))
    assert _labelled_inside(fig.layout.xaxis, 1.2, 9.0) == ["2", "3", "5", "7"]
    assert _labelled_inside(fig.layout.yaxis, 0.2, 3.0) == ["0.2", "0.5", "1", "2"]
    fig = plots.decade_ticks(_log_figure([12.0, 30.0, 47.0], [0.0101, 0.0104, 0.0108]))
    assert _labelled_inside(fig.layout.xaxis, 12, 47) == ["20", "30", "40"]
    assert _labelled_inside(fig.layout.yaxis, 0.0101, 0.0108) == ["0.0102", "0.0104", "0.0106", "0.0108"]
    fig = plots.decade_ticks(_log_figure([1, 2], [2e-5, 9e-5]))
    assert _labelled_inside(fig.layout.yaxis, 2e-5, 9e-5) == ["2×10<sup>−5</sup>", "3×10<sup>−5</sup>",
                                                              "5×10<sup>−5</sup>", "7×10<sup>−5</sup>"]


def test_log_ticks_span_the_error_bars_autorange_shows():
    # points within one decade (every digit would be labelled) whose intervals reach two decades further: the labels
    # follow the whole axis autorange draws, so they are decades, not crowded digits in a sliver of it
    fig = plots.new_figure("t", "x (unit)", "y (unit)", log_y=True)
    fig.add_trace(go.Scatter(x=[1, 2, 3], y=[0.05, 0.1, 0.4],
                             error_y=dict(type="data", array=[5.0, 0.1, 0.1], arrayminus=[0.0495, 0.05, 0.2])))
    plots.decade_ticks(fig)
    assert _labelled_inside(fig.layout.yaxis, 0.0005, 5.05) == ["0.001", "0.01", "0.1", "1"]


def test_slider_steps_switch_the_log_ticks_with_the_traces_they_show():
    fig = plots.new_figure("t", "x (unit)", "y (unit)", log_y=True)
    fig.add_trace(go.Scatter(x=[1, 2, 3], y=[0.0101, 0.0104, 0.0108]))
    fig.add_trace(go.Scatter(x=[1, 2, 3], y=[1.0, 10.0, 1000.0], visible=False))
    plots.add_slider(fig, plots.slider_steps(["a", "b"], 1))
    plots.decade_ticks(fig)
    assert len(_labelled_inside(fig.layout.yaxis, 0.0101, 0.0108)) >= 3       # the first step's traces
    first, second = (s.args[1] for s in fig.layout.sliders[0].steps)
    assert 1 < len(first["yaxis.tickvals"]) and first["yaxis.tickvals"] != second["yaxis.tickvals"]
    assert second["yaxis.ticktext"][second["yaxis.tickvals"].index(1000.0)] == "1000"


def test_axes_with_their_own_ticks_and_linear_axes_are_left_alone():
    fig = _log_figure([6, 12, 24, 48], [1, 2, 3, 4])
    fig.update_xaxes(**plots.log_ticks([6, 12, 24, 48]))
    fig.add_trace(go.Scatter(x=[1, 2], y=[1, 2], xaxis="x2", yaxis="y2"))
    fig.update_layout(xaxis2=dict(type="linear"))
    plots.decade_ticks(fig)
    assert list(fig.layout.xaxis.tickvals) == [6, 12, 24, 48] and fig.layout.xaxis.dtick is None
    assert fig.layout.xaxis2.dtick is None


def test_long_y_titles_are_broken_onto_lines_and_subscripts_written():
    fig = plots.new_figure("t", "x (unit)", "test loss ÷ best route's loss (geometric mean over replicates, nats)")
    fig.add_trace(go.Scatter(x=[1, 2], y=[1, 2], name="α_ℓ = 1"))
    plots.fit_axis_titles(fig)
    assert "<br>" in fig.layout.yaxis.title.text and "<br>" not in fig.layout.xaxis.title.text
    plots.write_subscripts(fig)
    assert fig.data[0].name == "α<sub>ℓ</sub> = 1"
    assert plots.subscripts("θ(h_l, h_l+1), width d_model") == "θ(h<sub>l</sub>, h<sub>l+1</sub>), width d_model"


def test_colour_key_guides_and_fixed_range_are_said_in_the_figure():
    fig = plots.new_figure("t", "x (unit)", "")
    fig.update_yaxes(type="category")
    fig.add_trace(go.Scatter(x=[1, 2], y=["a", "b"], marker=dict(color=[plots.color(0), plots.color(1)]),
                             showlegend=False))
    plots.colour_key(fig, {"first kind": plots.color(0), "second kind": plots.color(1)})
    plots.guides(fig, [(1, "one"), (3, "three")])
    plots.fixed_range(fig, "xaxis", "compared with 1 and 3")
    assert [t.name for t in fig.data if t.showlegend] == ["first kind", "second kind"]
    assert [(s.x0, s.name, s.showlegend) for s in fig.layout.shapes] == [(1, "one", True), (3, "three", True)]
    assert fig.layout.meta["fixed_range"] == {"xaxis": "compared with 1 and 3"}
    assert plots.figure_problems(fig) == []


def test_forest_plot_draws_its_rows_on_a_category_axis():
    from depthlib.plots import lm
    rows = pd.DataFrame([{"label": "a", "value": 0.8, "lo": 0.7, "hi": 0.9},
                         {"label": "b", "value": 1.2, "lo": 0.9, "hi": 1.5}])
    fig = lm.alpha_comparison(rows)
    assert fig.layout.yaxis.type == "category" and list(fig.layout.yaxis.categoryarray) == ["b", "a"]


def test_run_note_shows_the_placeholder_box_for_smoke_runs(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(getattr(obj, "data", obj)))

    class FakeRun:
        profile, experiment, key, manifest = "smoke", "x", "k", {"profile": "smoke"}
        committed, stale = False, False

    monkeypatch.setattr("depthlib.results.provenance", lambda r: "profile smoke")
    monkeypatch.setattr("depthlib.results.staleness_note", lambda r: "")
    plots.run_note(FakeRun())
    assert "Placeholder numbers" in shown[0]
    shown.clear()
    FakeRun.profile = "cpu"
    plots.run_note(FakeRun())
    assert not any("Placeholder" in s for s in shown)


def test_figure_problems_names_what_keeps_a_reader_from_reading_a_figure():
    good = go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="a"))
    good.update_layout(xaxis_title="depth ℓ (blocks)", yaxis_title="loss (nats/token)")
    assert plots.figure_problems(good) == []
    empty = go.Figure(go.Scatter(x=[], y=[]))
    empty.update_layout(xaxis_title="x (units)", yaxis_title="y (units)")
    assert plots.figure_problems(empty) == ["no trace has data"]
    labels_only = go.Figure(go.Scatter(x=["a", "b"], y=[float("nan"), None]))   # categories beside missing values
    labels_only.update_layout(xaxis_title="model", yaxis_title="y (units)")
    assert plots.figure_problems(labels_only) == ["no trace has data"]
    on_linear = go.Figure(go.Scatter(x=["a", "b"], y=[1.0, 2.0]))
    on_linear.update_layout(xaxis_title="model", yaxis_title="y (units)", xaxis_type="linear")
    assert plots.figure_problems(on_linear) == ["category labels on the numeric x axis (they draw nothing)"]
    heat = go.Figure(go.Heatmap(z=[[1.0, 2.0], [3.0, float("nan")]], x=["a", "b"], y=["c", "d"]))
    heat.update_layout(xaxis_title="x (units)", yaxis_title="y (units)")
    assert plots.figure_problems(heat) == []
    untitled = go.Figure(go.Scatter(x=[1], y=[1]))
    assert plots.figure_problems(untitled) == ["no x axis has a title", "no y axis has a title"]
    crowded = go.Figure([go.Scatter(x=[1], y=[i], name=str(i)) for i in range(plots.MAX_LEGEND_ENTRIES + 1)])
    crowded.update_layout(xaxis_title="x (units)", yaxis_title="y (units)")
    assert "legend entries" in plots.figure_problems(crowded)[0]
    # hidden slider groups and traces kept out of the legend do not count
    for i, t in enumerate(crowded.data):
        t.visible = i < 3
    assert plots.figure_problems(crowded) == []


def test_show_refuses_a_figure_a_reader_cannot_read():
    with pytest.raises(ValueError, match="no x axis has a title"):
        plots.show(go.Figure(go.Scatter(x=[1], y=[1])), "a caption")
    with pytest.raises(ValueError, match="caption"):
        plots.show(go.Figure(go.Scatter(x=[1], y=[1])), " ")


# ---- the live re-fit panels' computations (the panels themselves are driven in tests/test_live_panels.py) ----------
def test_chapter1_refit_summary_follows_the_objective_and_says_why_it_cannot_fit(chinchilla_df):
    from depthlib.plots import scaling as figs
    mse = figs.refit_summary(chinchilla_df, exclude=5, depth_offset=0, objective="mse", solver="converged")
    huber = figs.refit_summary(chinchilla_df, exclude=5, depth_offset=0, objective="huber", solver="converged")
    assert set(mse) == {"alpha_m", "alpha_l", "alpha_D", "L0", "mean_rel_err", "n_points"}
    assert mse["n_points"] == len(chinchilla_df) - 5 and mse["alpha_l"] != huber["alpha_l"]
    too_many = figs.refit_summary(chinchilla_df, exclude=len(chinchilla_df) - 1, depth_offset=0, objective="mse",
                                  solver="converged")
    assert isinstance(too_many, str) and too_many.startswith("cannot fit:")


def test_chapter3_alpha_by_depths_uses_only_the_chosen_depths():
    import numpy as np

    from depthlib.plots import toy as figs
    rows = [dict(rho=0.0, temperature=1.0, replicate=0, depth=d, step=s, test_loss=2.0 * d ** -1.0 * (1 + 1 / s),
                 train_loss=np.nan) for d in (2, 4, 8, 16) for s in (100, 200)]
    curves = pd.DataFrame(rows)
    every = figs.alpha_by_depths(curves, (2, 4, 8, 16), (100, 200))
    assert list(every.columns) == [100, 200] and np.allclose(every.to_numpy(), 1.0, atol=1e-3)
    assert figs.alpha_by_depths(curves, (4,), (100, 200)) == "cannot fit: choose at least two depths"

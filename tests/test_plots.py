"""The shared plot style: log axes labelled at decades, the placeholder box of smoke runs, the forest plot's
category axis, and the check that refuses a figure a reader cannot read."""
import pandas as pd
import plotly.graph_objects as go
import pytest

from depthlib import plots


def _log_figure(x, y):
    fig = plots.new_figure("t", "x (unit)", "y (unit)", log_x=True, log_y=True)
    fig.add_trace(go.Scatter(x=x, y=y))
    return fig


def test_log_axes_spanning_decades_label_decades_only():
    fig = plots.decade_ticks(_log_figure([0.05, 3.0, 40.0], [0.2, 0.9, 3.0]))
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.minor.dtick == "D1"
    assert fig.layout.yaxis.dtick == 1


def test_log_axis_within_one_decade_gets_one_two_five_values():
    fig = plots.decade_ticks(_log_figure([1.2, 4.0, 9.0], [12.0, 30.0, 47.0]))
    assert list(fig.layout.xaxis.tickvals) == [1.0, 2.0, 5.0, 10.0]
    assert list(fig.layout.yaxis.tickvals) == [10.0, 20.0, 50.0]


def test_axes_with_their_own_ticks_and_linear_axes_are_left_alone():
    fig = _log_figure([6, 12, 24, 48], [1, 2, 3, 4])
    fig.update_xaxes(**plots.log_ticks([6, 12, 24, 48]))
    fig.add_trace(go.Scatter(x=[1, 2], y=[1, 2], xaxis="x2", yaxis="y2"))
    fig.update_layout(xaxis2=dict(type="linear"))
    plots.decade_ticks(fig)
    assert list(fig.layout.xaxis.tickvals) == [6, 12, 24, 48] and fig.layout.xaxis.dtick is None
    assert fig.layout.xaxis2.dtick is None


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

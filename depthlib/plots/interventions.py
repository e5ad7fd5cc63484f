"""Figures of chapter 5 (interventions): every prediction's statistic on the LMs beside the two toy controls,
rescaled deletion against the two predicted laws, reordering against distance, parallel groups, stream norms and the
long-lag signature.

Every figure reads the tidy tables of :mod:`depthlib.interventions.analysis`; models are switched with a dropdown
where one figure per model would repeat itself. Loss changes are in nats per scored token (for the toy: the KL to
its teacher per input); most span decades, so their axes are logarithmic and values ≤ 0 are drawn at the axis floor
(listed in the hover text). Error bars are 95 % bootstrap intervals over documents.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from depthlib.plots import HEAT, LEGEND_BELOW, color, colour_key, dropdown, new_figure

FLOOR = 1e-6     # log-axis floor for a loss change ≤ 0
BELOW = LEGEND_BELOW   # a legend under the axes
#: what the two colours of a per-model figure mean: the language models against the toy controls
KIND_COLOURS = {"language model": color(1), "toy control (teacher–student)": color(0)}


def _kind_colour(model: str) -> str:
    return KIND_COLOURS["toy control (teacher–student)" if model.startswith("toy") else "language model"]


def _name(model: str) -> str:
    """A model's label for the reader: a toy replicate 'toy tied r0' reads 'toy tied, replicate 0'."""
    return re.sub(r" r(\d+)$", r", replicate \1", str(model))


def _pos(v) -> np.ndarray:
    return np.maximum(np.asarray(v, dtype=float), FLOOR)


def _one_at_a_time(fig: go.Figure, labels: list[str], draw, title, layout=None) -> go.Figure:
    """Draw each label's traces (``draw(label, visible)`` adds them to ``fig``) and a dropdown that shows one label's
    traces at a time; the title (``title(label)``) and any other layout (``layout(label)``, e.g. shapes) follow the
    choice. The first label is shown; traces drawn before (a colour key) stay shown."""
    spans = []
    for j, label in enumerate(labels):
        start = len(fig.data)
        draw(label, j == 0)
        spans.append((start, len(fig.data)))
    extra = layout or (lambda _label: {})
    inside = lambda i: any(a <= i < b for a, b in spans)     # noqa: E731 (other traces: always shown)
    buttons = [dict(method="update", label=label,
                    args=[{"visible": [a <= i < b or not inside(i) for i in range(len(fig.data))]},
                          {"title.text": title(label), **extra(label)}])
               for label, (a, b) in zip(labels, spans)]
    if labels:
        fig.update_layout(title_text=title(labels[0]), **extra(labels[0]))
        dropdown(fig, buttons)
    return fig


def distance_heatmap(distances: pd.DataFrame, models: list[str]) -> go.Figure:
    """d(h_i, h_{i+n}) = θ/π (Gromov et al.) for every start block i and span n; ✕ marks the block each n drops."""
    fig = new_figure("", "first block dropped i (0-indexed)", "blocks dropped n")

    def draw(m: str, visible: bool) -> None:
        d = distances[distances["model"] == m]
        grid = d.pivot(index="span", columns="start", values="distance")
        fig.add_trace(go.Heatmap(z=grid.to_numpy(), x=grid.columns, y=grid.index, colorscale=HEAT, zmin=0,
                                 colorbar=dict(title="d = θ/π"), visible=visible,
                                 hovertemplate="drop blocks %{x}…%{x}+%{y}−1<br>d = %{z:.3f}<extra></extra>"))
        best = d.loc[d.groupby("span")["distance"].idxmin()]
        fig.add_trace(go.Scatter(x=best["start"], y=best["span"], mode="markers", name="Gromov's choice",
                                 marker=dict(symbol="x", size=8, color="white", line=dict(width=1, color="black")),
                                 visible=visible, hovertemplate="n = %{y}: drop from block %{x}<extra></extra>"))
    return _one_at_a_time(fig, models, draw, lambda m: f"Angular distance between h_i and h_(i+n): {m}")


def _bars(sub: pd.DataFrame) -> dict:
    return dict(type="data", symmetric=False, array=(sub["hi"] - sub["value"]).to_numpy(float),
                arrayminus=(sub["value"] - sub["lo"]).to_numpy(float))


def predictions(table: pd.DataFrame) -> go.Figure:
    """The prediction table as a forest plot: per prediction (dropdown) each model's value and 95 % interval, the
    ensemble's region shaded and the calibrated threshold (dashed) where the two controls separate."""
    from depthlib.interventions.analysis import PREDICTIONS
    labels = [p for p in dict.fromkeys(table["prediction"])]
    fig = new_figure(labels[0] if labels else "", "measured value (unit of the statistic)", "")
    fig.update_yaxes(type="category")            # one row per model and control: the labels name the rows
    regions = {p[1]: p[2] for p in PREDICTIONS}

    def draw(label: str, visible: bool) -> None:
        sub = table[table["prediction"] == label]
        fig.add_trace(go.Scatter(x=sub["value"], y=sub["model"], mode="markers", error_x=_bars(sub), visible=visible,
                                 marker=dict(size=10, color=[_kind_colour(m) for m in sub["model"]]),
                                 name=label, showlegend=False, customdata=sub[["lo", "hi", "reading"]].to_numpy(),
                                 hovertemplate="%{y}: %{x:.4g} [%{customdata[0]:.4g}, %{customdata[1]:.4g}]"
                                               "<br>%{customdata[2]}<extra></extra>"))

    def shapes(label: str) -> dict:
        """The ensemble's region (shaded) and the calibrated threshold (dashed) of one prediction."""
        sub = table[table["prediction"] == label]
        lo, hi = regions.get(label, (np.nan, np.nan))
        thr = float(sub["threshold"].iloc[0])
        shape = [dict(type="rect", xref="x", yref="paper", x0=max(lo, float(sub["lo"].min()) - 1), y0=0, y1=1,
                      x1=min(hi, float(sub["hi"].max()) + 1), fillcolor="rgba(0,128,0,0.08)", line_width=0)]
        if np.isfinite(thr):
            shape.append(dict(type="line", xref="x", yref="paper", x0=thr, x1=thr, y0=0, y1=1,
                              line=dict(dash="dash", color="gray")))
        return {"shapes": shape}
    kinds = {"toy control (teacher–student)" if m.startswith("toy") else "language model" for m in table["model"]}
    colour_key(fig, {k: c for k, c in KIND_COLOURS.items() if k in kinds})      # shown whatever the menu picks
    return _one_at_a_time(fig, labels, draw, lambda label: label, shapes)


def deletion(stats: pd.DataFrame, models: list[str], n_middle: dict[str, int]) -> go.Figure:
    """Rescaled deletion: ΔL/L₀ against k with the two predicted laws (ℓ_m/(ℓ_m − k))^α − 1, α = 1 (ensemble) and
    α = 2 (Euler flow); and the plain deletion's ΔL/L₀ for comparison. One model at a time (dropdown)."""
    from depthlib.interventions.predictions import rescaled_deletion
    fig = new_figure("", "blocks deleted k", "Δ loss / unedited loss", log_y=True)

    def draw(m: str, visible: bool) -> None:
        of = stats[stats["model"] == m]
        sub = of[of["statistic"] == "delete_rescaled_rel"].sort_values("k")
        fig.add_trace(go.Scatter(x=sub["k"], y=_pos(sub["value"]), error_y=_bars(sub), mode="markers+lines",
                                 name="rescaled (measured)", line=dict(color=color(0)), visible=visible))
        plain = of[of["statistic"] == "delete"].sort_values("k")
        base = of[of["statistic"] == "baseline"]["value"]
        if len(plain) and len(base):
            b = float(base.iloc[0])
            fig.add_trace(go.Scatter(x=plain["k"], y=_pos(plain["value"] / b), mode="markers+lines",
                                     name="plain (measured)", line=dict(dash="dot", color=color(3)), visible=visible,
                                     error_y=dict(type="data", symmetric=False,
                                                  array=((plain["hi"] - plain["value"]) / b).to_numpy(float),
                                                  arrayminus=((plain["value"] - plain["lo"]) / b).to_numpy(float))))
        ks = np.arange(1, max(2, int(plain["k"].max()) if len(plain) else 2) + 1)
        for alpha, label, c in ((1.0, "ensemble: α = 1", 1), (2.0, "Euler flow: α = 2", 2)):
            fig.add_trace(go.Scatter(x=ks, y=rescaled_deletion(ks, n_middle[m], alpha), mode="lines", name=label,
                                     line=dict(dash="dash", color=color(c)), visible=visible))
    fig.update_layout(legend=BELOW)
    return _one_at_a_time(fig, models, draw, lambda m: f"Deleting k middle blocks: {m}")


def order_vs_distance(pairs: pd.DataFrame, models: list[str]) -> go.Figure:
    """Each reordering's cost over deleting the same blocks, against its mean displacement d̄ (over the middle and
    inside the plateau); a ratio of 1 (dotted) is "as costly as deleting what it moved"."""
    fig = new_figure("", "mean displacement d̄ = mean |π(i) − i| (blocks)",
                     "ΔL(reordering) / ΔL(deleting them)", log_y=True)

    def draw(m: str, visible: bool) -> None:
        sub = pairs[pairs["model"] == m]
        for i, (scope, g) in enumerate(sub.groupby("scope")):
            fig.add_trace(go.Scatter(x=g["distance"], y=_pos(g["ratio"]), mode="markers", name=f"{scope} (k blocks)",
                                     marker=dict(color=color(i), size=8), visible=visible,
                                     customdata=g[["k", "blocks"]].to_numpy(),
                                     hovertemplate="k = %{customdata[0]}, blocks %{customdata[1]}<br>d̄ = %{x:.1f}, "
                                                   "ratio %{y:.3g}<extra></extra>"))
        if len(sub):
            x = [float(sub["distance"].min()), float(sub["distance"].max())]
            fig.add_trace(go.Scatter(x=x, y=[1, 1], mode="lines", name="as costly as deleting", visible=visible,
                                     line=dict(dash="dot", color="gray")))
    fig.update_layout(legend=BELOW)
    return _one_at_a_time(fig, models, draw, lambda m: f"Reordering vs deleting the moved blocks: {m}")


def ratios(stats: pd.DataFrame, statistic: str, title: str, y_title: str) -> go.Figure:
    """One ratio statistic (e.g. ``parallel_ratio`` per g, ``norm_ratio``) for every model, with its interval: one row
    per model and k (a forest plot, so every row's label is read horizontally), the ratio on a log axis (``y_title``
    names it), 1 dotted, the colour saying language model or toy control."""
    sub = stats[(stats["statistic"] == statistic)].copy()
    sub["label"] = sub["model"].map(_name) + sub["k"].map(lambda k: f" (k/g = {k})")
    sub = sub.iloc[::-1]                         # the first row at the top
    fig = new_figure(title, y_title, "", log_x=True, height=140 + 22 * max(len(sub), 1))
    fig.update_yaxes(type="category", automargin=True)   # one row per model and k: the labels name the rows
    fig.add_trace(go.Scatter(x=_pos(sub["value"]), y=sub["label"], mode="markers",
                             error_x=_bars(sub), marker=dict(size=9, color=[_kind_colour(m) for m in sub["model"]]),
                             showlegend=False, hovertemplate="%{y}: %{x:.3g}<extra></extra>"))
    fig.add_vline(x=1, line_dash="dot", line_color="gray")
    kinds = {"toy control (teacher–student)" if m.startswith("toy") else "language model" for m in sub["model"]}
    return colour_key(fig, {k: c for k, c in KIND_COLOURS.items() if k in kinds})


def positions(stats: pd.DataFrame, models: list[str]) -> go.Figure:
    """Δloss of deleting middle blocks by the third of the middle they sit in (first, middle, last), per model."""
    fig = new_figure("Deletion cost by position in the middle", "model", "Δ loss (nats per token; toy: KL)", log_y=True)
    for i, t in enumerate(("first", "middle", "last")):
        sub = stats[(stats["statistic"] == "position") & (stats["scope"] == t)].set_index("model").reindex(models).reset_index()
        fig.add_trace(go.Scatter(x=sub["model"].map(_name), y=_pos(sub["value"]), error_y=_bars(sub), mode="markers",
                                 name=f"{t} third", marker=dict(size=10, color=color(i))))
    fig.update_layout(legend=BELOW)
    return fig


def norms(profile: pd.DataFrame, models: list[str]) -> go.Figure:
    """The mean stream norm ‖h_i‖ at each block's input over the first middle block's, against relative depth."""
    fig = new_figure("How the residual stream's norm grows along depth", "relative depth (i + ½)/ℓ",
                     "stream norm ‖h<sub>i</sub>‖ ÷ its value at the first middle block (ratio)", log_y=True)
    for i, m in enumerate(models):
        g = profile[profile["model"] == m]
        fig.add_trace(go.Scatter(x=g["depth"], y=g["relative_norm"], mode="lines+markers", name=_name(m),
                                 line=dict(color=color(i))))
    fig.update_layout(legend=BELOW)
    return fig


def signature(stats: pd.DataFrame) -> go.Figure:
    """θ(Δh_l, Δh_{l+1}) against the long-lag cosine, with 95 % intervals; the shaded box is chapter 3's ensemble rule
    (θ > 1.2 rad and cos < 0.1). The toy controls' replicates are small faded points in their pooled mean's colour,
    without legend entries of their own."""
    from depthlib.interventions.predictions import LONG_LAG_MAX, THETA_MIN
    th = stats[stats["statistic"] == "theta_update"].set_index("model")
    lag = stats[stats["statistic"] == "long_lag"].set_index("model")
    models = [m for m in th.index if m in lag.index]
    fig = new_figure("The long-lag signature", "long-lag cos(Δh_l, Δh_l+k), k ≥ ℓ/4",
                     "θ(Δh_l, Δh_l+1) (rad)")
    fig.add_shape(type="rect", x0=-0.2, x1=LONG_LAG_MAX, y0=THETA_MIN, y1=np.pi / 2 + 0.3, fillcolor="rgba(0,128,0,0.1)",
                  line_width=0)
    pooled = {m for m in models if m.startswith("toy ") and len(m.split()) == 2}      # "toy independent", "toy tied"
    for i, m in enumerate(models):
        a, b = th.loc[m], lag.loc[m]
        replicate = m.startswith("toy ") and m not in pooled      # one legend entry per control: its replicates' points
        kind = m.split()[1] if m.startswith("toy ") else m        # share the pooled mean's colour, unlabelled
        c = color(models.index(f"toy {kind}")) if replicate and f"toy {kind}" in models else color(i)
        fig.add_trace(go.Scatter(x=[b["value"]], y=[a["value"]], mode="markers", name=_name(m), showlegend=not replicate,
                                 legendgroup=f"toy {kind}" if m.startswith("toy ") else m, opacity=0.5 if replicate else 1,
                                 marker=dict(size=7 if replicate else 10, color=c,
                                             symbol="circle" if m.startswith("toy") else "diamond"),
                                 error_x=dict(type="data", symmetric=False, array=[b["hi"] - b["value"]],
                                              arrayminus=[b["value"] - b["lo"]]),
                                 error_y=dict(type="data", symmetric=False, array=[a["hi"] - a["value"]],
                                              arrayminus=[a["value"] - a["lo"]])))
    fig.update_layout(legend=BELOW)
    return fig

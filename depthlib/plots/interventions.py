"""Figures of chapter 5 (interventions): angular distances, deletion costs, order, parallel sums, the toy calibration.

Every figure reads the tidy tables of :mod:`depthlib.interventions.analysis`; models are switched with a dropdown
where one figure per model would repeat itself. Loss changes are in nats per predicted token (for the toy: the
KL to its teacher per input); most span decades, so their axes are logarithmic and values ≤ 0 are drawn at the
axis floor (listed in the hover text).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from depthlib.plots import HEAT, color, dropdown, new_figure

FLOOR = 1e-6     # log-axis floor for a loss change ≤ 0
BELOW = dict(orientation="h", x=0, xanchor="left", y=-0.22, yanchor="top")   # a legend under the axes


def _pos(v) -> np.ndarray:
    return np.maximum(np.asarray(v, dtype=float), FLOOR)


def _model_menu(fig: go.Figure, models: list[str], traces_per_model: list[int], titles: list[str] | None = None) -> None:
    """A dropdown that shows one model's traces at a time (traces laid out model after model)."""
    total, buttons, start = sum(traces_per_model), [], 0
    for i, (m, n) in enumerate(zip(models, traces_per_model)):
        visible = [False] * total
        visible[start:start + n] = [True] * n
        update = {"title.text": titles[i]} if titles else {}
        buttons.append(dict(method="update", label=m, args=[{"visible": visible}, update]))
        start += n
    dropdown(fig, buttons)


def distance_heatmap(distances: pd.DataFrame, models: list[str]) -> go.Figure:
    """d(h_i, h_{i+n}) = θ/π (Gromov et al.) for every start block i and span n; ✕ marks the block each n drops."""
    fig = new_figure("", "first block dropped i (0-indexed)", "blocks dropped n")
    counts = []
    for j, m in enumerate(models):
        d = distances[distances["model"] == m]
        grid = d.pivot(index="span", columns="start", values="distance")
        fig.add_trace(go.Heatmap(z=grid.to_numpy(), x=grid.columns, y=grid.index, colorscale=HEAT, zmin=0,
                                 colorbar=dict(title="d = θ/π"), visible=j == 0,
                                 hovertemplate="drop blocks %{x}…%{x}+%{y}−1<br>d = %{z:.3f}<extra></extra>"))
        best = d.loc[d.groupby("span")["distance"].idxmin()]
        fig.add_trace(go.Scatter(x=best["start"], y=best["span"], mode="markers", name="Gromov's choice",
                                 marker=dict(symbol="x", size=8, color="white", line=dict(width=1, color="black")),
                                 visible=j == 0, hovertemplate="n = %{y}: drop from block %{x}<extra></extra>"))
        counts.append(2)
    titles = [f"Angular distance between h_i and h_(i+n): {m}" for m in models]
    fig.update_layout(title_text=titles[0])
    _model_menu(fig, models, counts, titles)
    return fig


def each_block(effects: pd.DataFrame, models: list[str]) -> go.Figure:
    """Δloss of deleting one block, against its relative depth (i + 0.5)/ℓ, one line per model."""
    fig = new_figure("Deleting one block at a time", "relative depth of the deleted block (i + ½)/ℓ",
                     "Δ loss (nats per token; toy: KL)", log_y=True)
    for j, m in enumerate(models):
        e = effects[(effects["model"] == m) & (effects["rule"] == "each")].sort_values("start")
        L = int(e["start"].max()) + 1
        fig.add_trace(go.Scatter(x=(e["start"] + 0.5) / L, y=_pos(e["delta_loss"]), mode="lines+markers",
                                 name=f"{m} (ℓ = {L})", line=dict(color=color(j)), customdata=np.c_[e["start"], e["delta_loss"]],
                                 hovertemplate="block %{customdata[0]}: Δ = %{customdata[1]:.4g}<extra>" + m + "</extra>"))
    return fig


_RULES = [("random", "random middle (mean; band: draws)"), ("gromov", "Gromov et al."),
          ("shortgpt", "ShortGPT"), ("first", "first k blocks"), ("last", "last k blocks")]


def deletion_curves(curves: pd.DataFrame, fits: dict[str, dict], models: list[str], metric: str = "delta_loss") -> go.Figure:
    """Δloss (or ``metric="kl"``: KL to the unedited model) against the number k of deleted blocks for every rule
    (dashed: remaining middle updates rescaled), with the ensemble fit ΔL(k) = c[(ℓ − k)^−α − ℓ^−α] to the
    random-middle Δloss curve."""
    y_title = ("Δ loss (nats per token; toy: KL to teacher)" if metric == "delta_loss"
               else "KL(unedited ‖ edited) (nats per token)")
    fig = new_figure("", "blocks deleted k", y_title, log_y=True)
    counts = []
    for j, m in enumerate(models):
        c, n = curves[curves["model"] == m], 0
        for i, (rule, label) in enumerate(_RULES):
            for rescale in (False, True):
                r = c[(c["rule"] == rule) & (c["rescale"] == rescale)].sort_values("k")
                if r.empty:
                    continue
                dash = "dash" if rescale else "solid"
                name = label + (" — rescaled" if rescale else "")
                if rule == "random":
                    band_y = np.r_[_pos(r[f"{metric}_max"]), _pos(r[f"{metric}_min"])[::-1]]
                    fig.add_trace(go.Scatter(x=np.r_[r["k"], r["k"][::-1]], y=band_y, fill="toself", line=dict(width=0),
                                             fillcolor="rgba(0,114,178,0.15)",
                                             hoverinfo="skip", showlegend=False, visible=j == 0))
                    n += 1
                fig.add_trace(go.Scatter(x=r["k"], y=_pos(r[metric]), mode="lines+markers", name=name,
                                         line=dict(color=color(i), dash=dash), visible=j == 0,
                                         hovertemplate="k = %{x}: Δ = %{y:.4g}<extra>" + name + "</extra>"))
                n += 1
        f = fits.get(m) if metric == "delta_loss" else None
        if f and np.isfinite(f.get("alpha", np.nan)):
            k = np.linspace(min(f["ks"]), max(f["ks"]), 60)
            y = f["c"] * ((f["n_blocks"] - k) ** -f["alpha"] - f["n_blocks"] ** -f["alpha"])
            fig.add_trace(go.Scatter(x=k, y=_pos(y), mode="lines", line=dict(color="black", dash="dot"), visible=j == 0,
                                     name=f"ensemble fit, α = {f['alpha']:.2f} [{f['alpha_lo']:.2f}, {f['alpha_hi']:.2f}]"))
            n += 1
        counts.append(n)
    what = "loss increase" if metric == "delta_loss" else "KL to the unedited model"
    titles = [f"Deleting k blocks, {what}: {m}" for m in models]
    fig.update_layout(title_text=titles[0], height=560, legend=BELOW, margin=dict(b=170))
    _model_menu(fig, models, counts, titles)
    return fig


def order_effects(effects: pd.DataFrame, models: list[str]) -> go.Figure:
    """Δloss of reordering the middle blocks: reversed, random permutations (each a point), adjacent swaps."""
    fig = new_figure("Reordering the middle blocks", "model", "Δ loss (nats per token; toy: KL)", log_y=True)
    for i, (rule, label) in enumerate([("swap", "one adjacent swap"), ("permutation", "random permutation"),
                                       ("reverse", "reversed")]):
        e = effects[(effects["family"] == "order") & (effects["rule"] == rule) & effects["model"].isin(models)]
        fig.add_trace(go.Box(x=e["model"], y=_pos(e["delta_loss"]), name=label, boxpoints="all", jitter=0.4,
                             pointpos=0, marker=dict(color=color(i), size=6), line=dict(color=color(i)),
                             fillcolor="rgba(0,0,0,0)", customdata=e["delta_loss"],
                             hovertemplate="Δ = %{customdata:.4g}<extra>" + label + "</extra>"))
    fig.update_layout(boxmode="group")
    fig.update_xaxes(type="category")
    return fig


def parallel_effects(effects: pd.DataFrame, models: list[str]) -> go.Figure:
    """Δloss of running g consecutive middle blocks in parallel on one input, against where the group starts:
    updates summed (solid) or averaged as in "Painters" (dashed)."""
    fig = new_figure("", "relative depth of the group's first block i/ℓ", "Δ loss vs sequential (nats per token; toy: KL)",
                     log_y=True)
    counts = []
    for j, m in enumerate(models):
        e = effects[(effects["model"] == m) & (effects["family"] == "parallel")]
        L = int(effects.loc[(effects["model"] == m) & (effects["rule"] == "each"), "start"].max()) + 1
        n = 0
        for i, g in enumerate(sorted(e["k"].unique())):
            for rule, dash in (("sum", "solid"), ("mean", "dash")):
                r = e[(e["k"] == g) & (e["rule"] == rule)].sort_values("start")
                name = f"g = {g}, {'summed' if rule == 'sum' else 'averaged'}"
                fig.add_trace(go.Scatter(x=r["start"] / L, y=_pos(r["delta_loss"]), mode="lines+markers", name=name,
                                         line=dict(color=color(i), dash=dash), visible=j == 0,
                                         customdata=np.c_[r["start"], r["delta_loss"]],
                                         hovertemplate="blocks %{customdata[0]}…: Δ = %{customdata[1]:.4g}<extra>" + name
                                         + "</extra>"))
                n += 1
        counts.append(n)
    titles = [f"Parallel groups of g middle blocks: {m}" for m in models]
    fig.update_layout(title_text=titles[0])
    _model_menu(fig, models, counts, titles)
    return fig


def calibration(table: pd.DataFrame) -> go.Figure:
    """Relative loss change ΔL/L₀ of the same interventions on the LMs and on the toy students (grouped bars)."""
    fig = new_figure("The same edits on LMs and on toy students", "intervention",
                     "relative loss change ΔL / L₀", log_y=True, height=580)
    for i, m in enumerate(table["model"].unique()):
        r = table[table["model"] == m]
        fig.add_trace(go.Bar(x=r["intervention"], y=_pos(r["relative"]), name=m, marker_color=color(i),
                             customdata=r["relative"], hovertemplate="%{x}: ΔL/L₀ = %{customdata:.3g}<extra>" + m + "</extra>"))
    fig.update_layout(barmode="group", legend=dict(BELOW, y=-0.42), margin=dict(b=200))
    fig.update_xaxes(type="category", tickangle=-25)
    return fig

"""Figures of the hidden-states chapter (paper Fig. 2a–e), built from the probes' tidy tables only.

Inputs are the tables of :mod:`depthlib.probes` runs: ``layers`` (metric, layer, mean, std, count),
``tokens`` (reservoir of angle trajectories) and the depth table of :func:`depthlib.probes.depth_table`.
``tables`` arguments map a model label to its ``layers`` table.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from depthlib import plots

#: metric -> (axis title with units, x offset, description). x is the block index in the paper's 1-indexing.
METRIC_LABELS = {
    "theta": ("θ(h<sub>l−1</sub>, h<sub>l</sub>) (rad)", "rotation made by each block"),
    "theta_dh": ("θ(Δh<sub>l−1</sub>, Δh<sub>l</sub>) (rad)", "angle between consecutive updates (π/2 = uncorrelated)"),
    "norms": ("‖h<sub>l</sub>‖ (residual-stream norm)", "norm of the residual stream"),
    "angle_to_end": ("θ(h<sub>l</sub>, h<sub>L</sub>) (rad)", "angle to the final state"),
    "progress": ("s<sub>l</sub> (fraction of the chord h<sub>0</sub> → h<sub>L</sub>)", "progress along the chord"),
    "ce_logit": ("next-token loss (nats)", "logit lens"),
    "ce_last_block": ("next-token loss (nats)", "last-block lens"),
}
X_TITLE = {"theta": "block l (1 = first)", "theta_dh": "update pair (blocks l, l+1)",
           "angle_to_end": "layer l (0 = embedding)", "norms": "layer l (0 = embedding)",
           "progress": "layer l (0 = embedding)", "ce_logit": "layer l (0 = embedding)",
           "ce_last_block": "layers kept before the last block"}


def _xy(layers: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = layers[layers.metric == metric].sort_values("layer")
    x = t["layer"].to_numpy() + (1 if metric in ("theta", "theta_dh") else 0)
    return x, t["mean"].to_numpy(), t["std"].to_numpy()


def _band(x, y, sd, color, name, visible=True, legend=False) -> go.Scatter:
    rgba = _rgba(color, 0.15)
    return go.Scatter(x=np.r_[x, x[::-1]], y=np.r_[y + sd, (y - sd)[::-1]], fill="toself", fillcolor=rgba,
                      line=dict(width=0), hoverinfo="skip", name=f"{name} ± 1 sd", showlegend=legend,
                      visible=visible)


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def layer_profile(tables: Mapping[str, pd.DataFrame], metric: str = "theta", *, title: str | None = None,
                  band: bool = True, log_y: bool = False) -> go.Figure:
    """Per-layer mean of one metric (± 1 sd over tokens), one line per model."""
    y_title, what = METRIC_LABELS[metric]
    fig = plots.new_figure(title or f"Per-layer mean: {what}", X_TITLE[metric], y_title, log_y=log_y)
    for i, (name, layers) in enumerate(tables.items()):
        x, y, sd = _xy(layers, metric)
        if band and not log_y:
            fig.add_trace(_band(x, y, sd, plots.color(i), name))
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name, line=dict(color=plots.color(i))))
    if metric == "theta_dh":
        fig.add_hline(y=np.pi / 2, line=dict(dash="dot", color="#777"), annotation_text="π/2 (uncorrelated)")
    return fig


def relative_depth_profile(tables: Mapping[str, pd.DataFrame], metric: str = "theta") -> go.Figure:
    """Per-layer mean angle against relative depth l/L, so models of different depth share an axis."""
    y_title, what = METRIC_LABELS[metric]
    fig = plots.new_figure(f"{what} against relative depth", "relative depth l / L", y_title)
    for i, (name, layers) in enumerate(tables.items()):
        x, y, _ = _xy(layers, metric)
        fig.add_trace(go.Scatter(x=x / x.max(), y=y, mode="lines+markers", name=name,
                                 line=dict(color=plots.color(i))))
    return fig


def lens_losses(layers: pd.DataFrame, model: str = "") -> go.Figure:
    """Next-token loss by layer through the logit lens and the last-block lens; model loss as reference."""
    fig = plots.new_figure(f"Loss by layer through two lenses {('— ' + model) if model else ''}",
                           "layer l (0 = embedding; blocks kept)", "next-token loss (nats)", log_y=True)
    for i, metric in enumerate(("ce_logit", "ce_last_block")):
        x, y, _ = _xy(layers, metric)
        if len(x):
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=METRIC_LABELS[metric][1],
                                     line=dict(color=plots.color(i))))
    x, final, _ = _xy(layers, "ce_logit")
    if len(final):  # a trace, not add_hline: hline annotations land in the wrong place on log axes
        fig.add_trace(go.Scatter(x=[x.min(), x.max()], y=[final[-1]] * 2, mode="lines",
                                 line=dict(dash="dot", color="#777"), name=f"model loss {final[-1]:.2f}"))
    return fig


def pca_scatter(analysis, *, model: str = "", max_points: int = 4000, seed: int = 0) -> go.Figure:
    """Tokens' angle trajectories on the top-2 principal components, coloured by cluster, with the ideals."""
    ev = analysis.explained
    fig = plots.new_figure(f"Angle trajectories of tokens, PCA {('— ' + model) if model else ''}",
                           f"PC1 ({100 * ev[0]:.0f}% of variance) (rad)", f"PC2 ({100 * ev[1]:.0f}%) (rad)")
    rng = np.random.default_rng(seed)
    n = len(analysis.coords)
    idx = np.sort(rng.choice(n, size=min(n, max_points), replace=False))
    for i, name in enumerate(analysis.ideals):
        sel = idx[analysis.label[idx] == name]
        frac = analysis.fractions[name]
        fig.add_trace(go.Scattergl(x=analysis.coords[sel, 0], y=analysis.coords[sel, 1], mode="markers",
                                   marker=dict(size=4, color=plots.color(i), opacity=0.5),
                                   name=f"cluster near '{name}': {100 * frac:.1f}% of tokens"))
    for i, (name, xy) in enumerate(analysis.ideal_coords.items()):
        # named in the legend only: the two ideals often sit a few px apart, where labels print over each other
        fig.add_trace(go.Scatter(x=[xy[0]], y=[xy[1]], mode="markers",
                                 marker=dict(size=16, symbol="star", color=plots.color(i),
                                             line=dict(color="black", width=1.5)),
                                 name=f"ideal '{name}'"))
    return fig


def ideal_trajectories(analysis, theta_mean: np.ndarray, *, model: str = "") -> go.Figure:
    """The two ideal trajectories next to the mean of each cluster (angles by block)."""
    fig = plots.new_figure(f"Ideal trajectories and cluster means {('— ' + model) if model else ''}",
                           "block l (1 = first)", "θ(h<sub>l−1</sub>, h<sub>l</sub>) (rad)")
    x = np.arange(1, len(theta_mean) + 1)
    for i, (name, ideal) in enumerate(analysis.ideals.items()):
        fig.add_trace(go.Scatter(x=x, y=ideal, mode="lines", line=dict(dash="dash", color=plots.color(i)),
                                 name=f"ideal: {name}"))
        if name in analysis.cluster_means:
            fig.add_trace(go.Scatter(x=x, y=analysis.cluster_means[name], mode="lines+markers",
                                     line=dict(color=plots.color(i)), name=f"cluster mean: {name}"))
    return fig


def depth_plot(depths: pd.DataFrame, fit: dict | None = None) -> go.Figure:
    """Middle-layer mean angle against depth for every model available (Fig. 2d), log–log."""
    fig = plots.new_figure("Middle-layer mean angle against depth", "depth L (blocks)",
                           "mean θ over middle blocks (rad)", log_x=True, log_y=True)
    for i, row in depths.reset_index(drop=True).iterrows():
        fig.add_trace(go.Scatter(x=[row.n_layers], y=[row.theta_middle_mean], mode="markers",
                                 marker=dict(size=12, color=plots.color(i)),
                                 name=f"{row.model} ({row.profile}, {row.corpus})"))
    if len(depths) >= 1:
        x = depths["n_layers"].to_numpy(dtype=float)
        lo, hi = x.min() / 1.5, x.max() * 1.5
        c = float(np.exp(np.mean(np.log(depths["theta_middle_mean"]) + np.log(x))))
        grid = np.geomspace(lo, hi, 50)
        fig.add_trace(go.Scatter(x=grid, y=c / grid, mode="lines", line=dict(dash="dot", color="#777"),
                                 name="∝ 1/L (paper's Result 1)"))
        if fit is not None:
            fig.add_trace(go.Scatter(x=grid, y=fit["coefficient"] * grid ** (-fit["alpha"]), mode="lines",
                                     line=dict(color="#444"), name=f"fit: α = {fit['alpha']:.2f}"))
        fig.update_xaxes(**plots.log_ticks(x))
    return fig


def explorer(tables: Mapping[str, pd.DataFrame],
             metrics=("theta", "theta_dh", "angle_to_end", "norms", "progress", "ce_last_block")) -> go.Figure:
    """One figure with a dropdown choosing (model, metric): works in the static book without a kernel."""
    fig = plots.new_figure("Per-layer profiles: choose a model and a metric", "layer / block index", "")
    labels, titles, y_titles = [], [], []
    for i, (name, layers) in enumerate(tables.items()):
        for metric in metrics:
            x, y, sd = _xy(layers, metric)
            if not len(x):
                continue
            first = not labels
            fig.add_trace(_band(x, y, sd, plots.color(i), name, visible=first))
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"{name}: {METRIC_LABELS[metric][1]}",
                                     line=dict(color=plots.color(i)), visible=first))
            labels.append(f"{name} — {METRIC_LABELS[metric][1]}")
            titles.append(f"{name}: {METRIC_LABELS[metric][1]} (mean ± 1 sd over tokens)")
            y_titles.append(METRIC_LABELS[metric][0])
    steps = plots.slider_steps(labels, 2, titles=titles)
    for step, y_title in zip(steps, y_titles):
        step["args"][1]["yaxis.title.text"] = y_title
    fig.update_layout(title=dict(text=titles[0] if titles else ""), yaxis_title=y_titles[0] if y_titles else "",
                      showlegend=False)
    plots.dropdown(fig, steps, x=1.0, y=1.22)
    fig.update_layout(margin=dict(t=110))
    return fig

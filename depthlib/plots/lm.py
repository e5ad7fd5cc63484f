"""Figures of the depth-series chapter (chapter 6), built from the tables of :mod:`depthlib.lm.analysis` only.

The per-layer profiles reuse chapter 2's builders (:mod:`depthlib.plots.probes`) so the two chapters can be
read side by side; depths are coloured along one sequential scale (shallow: dark, deep: light).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from depthlib import plots


def depth_colors(depths) -> dict[int, str]:
    """One colour per depth along Viridis (shallow dark, deep light; the last one stays readable on white)."""
    depths = sorted({int(d) for d in depths})
    return dict(zip(depths, sample_colorscale("Viridis", list(np.linspace(0.0, 0.85, len(depths))))))


def loss_curves(curves: pd.DataFrame, *, log_x: bool = True) -> go.Figure:
    """Held-out loss against tokens seen, one line per depth (the first evaluation, at 0 tokens, is left off a log axis)."""
    fig = plots.new_figure("Held-out loss during training", "tokens seen (per model)",
                           "held-out loss (nats/token)", log_x=log_x)
    colors = depth_colors(curves["depth"])
    for depth, g in curves.groupby("depth"):
        g = g[g["tokens_seen"] > 0] if log_x else g
        fig.add_trace(go.Scatter(x=g["tokens_seen"], y=g["val_loss"], mode="lines+markers", name=f"ℓ = {depth}",
                                 line=dict(color=colors[int(depth)])))
    return fig


def loss_vs_depth(final: pd.DataFrame, band: pd.DataFrame, alpha: dict, paper: tuple[float, float]) -> go.Figure:
    """Final held-out loss against depth with bootstrap intervals, the fitted L∞ + c·ℓ^(−α) and its 95 % band."""
    fig = plots.new_figure("Held-out loss against depth (one width, the same tokens)", "depth ℓ (blocks)",
                           "held-out loss (nats/token)", log_x=True)
    fig.add_trace(go.Scatter(x=np.r_[band["depth"], band["depth"][::-1]], y=np.r_[band["hi"], band["lo"][::-1]],
                             fill="toself", fillcolor="rgba(0,114,178,0.15)", line=dict(width=0), hoverinfo="skip",
                             name="fit, 95 % bootstrap band"))
    fig.add_trace(go.Scatter(x=band["depth"], y=band["fit"], mode="lines", line=dict(color=plots.color(0)),
                             name=f"L∞ + c·ℓ<sup>−α</sup>, α<sub>ℓ</sub> = {alpha['value']:.2f} "
                                  f"[{alpha['lo']:.2f}, {alpha['hi']:.2f}]"))
    fig.add_trace(go.Scatter(x=final["depth"], y=final["val_loss"], mode="markers",
                             error_y=dict(type="data", symmetric=False, array=final["hi"] - final["val_loss"],
                                          arrayminus=final["val_loss"] - final["lo"], color="#444"),
                             marker=dict(size=10, color=plots.color(1)), name="held-out loss (95 % bootstrap)"))
    fig.update_xaxes(**plots.log_ticks(final["depth"]))
    fig.add_annotation(x=1, y=1, xref="paper", yref="paper", xanchor="right", yanchor="bottom", showarrow=False,
                       text=f"paper (LLMs, Chinchilla points): α<sub>ℓ</sub> = {paper[0]} ± {paper[1]}")
    return fig


def alpha_comparison(rows: pd.DataFrame) -> go.Figure:
    """α_ℓ with intervals from several sources (rows: label, value, lo, hi) on one axis, in one colour: the row labels
    name the sources (a colour per row would say nothing the labels do not)."""
    fig = plots.new_figure("The depth exponent α<sub>ℓ</sub>: this family beside the paper", "α<sub>ℓ</sub> (dimensionless)",
                           "", height=300)
    for r in rows.itertuples():
        fig.add_trace(go.Scatter(x=[r.value], y=[r.label], mode="markers", marker=dict(size=12, color=plots.color(0)),
                                 error_x=dict(type="data", symmetric=False, array=[r.hi - r.value],
                                              arrayminus=[r.value - r.lo], color=plots.color(0)),
                                 name=r.label, showlegend=False))
    # the labels are categories: on plotly's default (linear) axis the markers would not be drawn at all
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=list(rows["label"])[::-1])
    fig.update_layout(margin=dict(l=260))
    return fig


def angle_vs_depth(angles: pd.DataFrame, fit: dict) -> go.Figure:
    """Middle-block mean angle against depth (log–log; chapter 2's Fig. 2d style): bootstrap intervals, the fitted
    exponent over the depths in the fit, and a 1/ℓ line through their geometric mean."""
    fig = plots.new_figure("Middle-layer mean angle against depth (one family)", "depth ℓ (blocks)",
                           "mean θ over middle blocks (rad)", log_x=True, log_y=True)
    inside = angles[angles["in_fit"]]
    outside = angles[~angles["in_fit"]]
    fig.add_trace(go.Scatter(x=inside["depth"], y=inside["theta_middle_mean"], mode="markers",
                             error_y=dict(type="data", symmetric=False, array=inside["hi"] - inside["theta_middle_mean"],
                                          arrayminus=inside["theta_middle_mean"] - inside["lo"], color="#444"),
                             marker=dict(size=11, color=plots.color(0)), name="in the fit (95 % bootstrap)"))
    if len(outside):
        fig.add_trace(go.Scatter(x=outside["depth"], y=outside["theta_middle_mean"], mode="markers",
                                 marker=dict(size=11, color="white", line=dict(color=plots.color(0), width=2)),
                                 name="ℓ < 4: fewer than two middle blocks (not fitted)"))
    if len(inside) >= 1:
        x = inside["depth"].to_numpy(float)
        grid = np.geomspace(angles["depth"].min() / 1.2, angles["depth"].max() * 1.2, 50)
        c = float(np.exp(np.mean(np.log(inside["theta_middle_mean"]) + np.log(x))))
        fig.add_trace(go.Scatter(x=grid, y=c / grid, mode="lines", line=dict(dash="dot", color="#777"),
                                 name="∝ 1/ℓ (paper's Result 1)"))
        if np.isfinite(fit.get("value", np.nan)):
            c_fit = float(np.exp(np.mean(np.log(inside["theta_middle_mean"]) + fit["value"] * np.log(x))))
            fig.add_trace(go.Scatter(x=grid, y=c_fit * grid ** -fit["value"], mode="lines", line=dict(color="#444"),
                                     name=f"fit: α<sub>θ</sub> = {fit['value']:.2f}"))
    fig.update_xaxes(**plots.log_ticks(angles["depth"]))
    return fig


def update_angle_vs_depth(angles: pd.DataFrame) -> go.Figure:
    """Mean angle between consecutive updates θ(Δh_l, Δh_{l+1}) over the middle pairs against depth; π/2 = uncorrelated."""
    t = angles[np.isfinite(angles["theta_dh_mean"])]
    fig = plots.new_figure("Angle between consecutive updates against depth", "depth ℓ (blocks)",
                           "mean θ(Δh<sub>l</sub>, Δh<sub>l+1</sub>) (rad)", log_x=True)
    fig.add_trace(go.Scatter(x=t["depth"], y=t["theta_dh_mean"], mode="lines+markers", marker=dict(size=10),
                             line=dict(color=plots.color(2)), name="middle update pairs"))
    fig.add_trace(go.Scatter(x=[t["depth"].min(), t["depth"].max()], y=[np.pi / 2] * 2, mode="lines",
                             line=dict(dash="dot", color="#777"), name="π/2 (uncorrelated)"))
    fig.update_xaxes(**plots.log_ticks(t["depth"]))
    return fig


def cluster_fractions(angles: pd.DataFrame) -> go.Figure:
    """Share of tokens in the 'evenly' trajectory cluster against depth (depths with middle blocks)."""
    t = angles.dropna(subset=["cluster_evenly"]) if "cluster_evenly" in angles else angles.iloc[:0]
    fig = plots.new_figure("Tokens whose angle trajectory is near the 'evenly' ideal", "depth ℓ (blocks)",
                           "share of sampled tokens (%)", log_x=True)
    if len(t):
        fig.add_trace(go.Scatter(x=t["depth"], y=100 * t["cluster_evenly"], mode="lines+markers", marker=dict(size=10),
                                 name="cluster near 'evenly'"))
        fig.update_xaxes(**plots.log_ticks(t["depth"]))
    return fig


def cluster_trajectories(clusters: pd.DataFrame, depth: int) -> go.Figure:
    """The two ideal trajectories and each cluster's mean trajectory of one depth (chapter 2's Fig. 2b companion)."""
    t = clusters[clusters["depth"] == depth]
    fig = plots.new_figure(f"Ideal trajectories and cluster means — ℓ = {depth}", "block l (1 = first)",
                           "θ(h<sub>l−1</sub>, h<sub>l</sub>) (rad)")
    for i, name in enumerate(sorted(t["cluster"].unique())):
        for kind, dash in (("ideal", "dash"), ("cluster mean", None)):
            g = t[(t["cluster"] == name) & (t["kind"] == kind)].sort_values("block")
            if len(g):
                share = f" ({100 * g['fraction'].iloc[0]:.1f}% of tokens)" if kind == "cluster mean" else ""
                fig.add_trace(go.Scatter(x=g["block"], y=g["theta"], mode="lines" if dash else "lines+markers",
                                         line=dict(color=plots.color(i), dash=dash), name=f"{kind}: {name}{share}"))
    return fig


def alpha_by_step(steps: pd.DataFrame, tokens_per_step: int) -> go.Figure:
    """α_ℓ fitted at every evaluation step with its bootstrap interval (steps without a defined fit are left out:
    ``steps`` from :func:`depthlib.lm.analysis.alpha_steps`)."""
    t = steps[steps["defined"]]
    fig = plots.new_figure("Does α<sub>ℓ</sub> drift during training?", "tokens seen (per model)",
                           "α<sub>ℓ</sub> of L∞ + c·ℓ<sup>−α</sup> (dimensionless)")
    x = t["step"] * tokens_per_step
    fig.add_trace(go.Scatter(x=x, y=t["alpha"], mode="lines+markers", marker=dict(size=9), name="α<sub>ℓ</sub>",
                             error_y=dict(type="data", symmetric=False, array=t["hi"] - t["alpha"],
                                          arrayminus=t["alpha"] - t["lo"], color="#444")))
    fig.add_hrect(y0=0.9, y1=1.5, fillcolor="rgba(213,94,0,0.10)", line_width=0,
                  annotation_text="paper: 1.2 ± 0.3", annotation_position="top left")
    return fig


def angles_by_step(t: pd.DataFrame, metric: str = "theta_middle_mean") -> go.Figure:
    """A probe angle of the probed depths against tokens seen (step 0 is the initialisation, drawn at 0 tokens)."""
    label = {"theta_middle_mean": "mean θ over middle blocks (rad)",
             "theta_dh_mean": "mean θ(Δh<sub>l</sub>, Δh<sub>l+1</sub>) (rad)"}[metric]
    fig = plots.new_figure("Angles during training", "tokens seen (per model)", label)
    colors = depth_colors(t["depth"])
    for depth, g in t.groupby("depth"):
        fig.add_trace(go.Scatter(x=g["tokens_seen"], y=g[metric], mode="lines+markers", name=f"ℓ = {depth}",
                                 line=dict(color=colors[int(depth)])))
    if metric == "theta_dh_mean":
        fig.add_hline(y=np.pi / 2, line=dict(dash="dot", color="#777"), annotation_text="π/2")
    return fig


def budget(b: pd.DataFrame) -> go.Figure:
    """Parameters and tokens seen against depth (log–log), with Chinchilla's compute-optimal 20 tokens per parameter."""
    fig = plots.new_figure("Tokens seen against parameters", "depth ℓ (blocks)", "count (parameters or tokens)",
                           log_x=True, log_y=True)
    fig.add_trace(go.Scatter(x=b["depth"], y=b["n_params"], mode="lines+markers", name="parameters (all)"))
    fig.add_trace(go.Scatter(x=b["depth"], y=b["n_non_embedding"], mode="lines+markers",
                             name="parameters (without embedding and head)"))
    fig.add_trace(go.Scatter(x=b["depth"], y=b["tokens_seen"], mode="lines+markers", name="tokens seen by each model"))
    fig.add_trace(go.Scatter(x=b["depth"], y=20 * b["n_params"], mode="lines", line=dict(dash="dot", color="#777"),
                             name="20 tokens per parameter (Chinchilla-optimal)"))
    fig.update_xaxes(**plots.log_ticks(b["depth"]))
    return fig


# ---- the converged series (depthlib.lm.converged; tables from depthlib.lm.converged_views) -------------------------
def _band(x, lo, hi, name: str, fill: str) -> go.Scatter:
    """A filled band between ``lo`` and ``hi`` over ``x`` (one legend entry)."""
    x, lo, hi = (np.asarray(v, dtype=float) for v in (x, lo, hi))
    return go.Scatter(x=np.r_[x, x[::-1]], y=np.r_[hi, lo[::-1]], fill="toself", fillcolor=fill, line=dict(width=0),
                      hoverinfo="skip", name=name)


def converged_alpha_trajectory(traj: pd.DataFrame, stop: dict, final: dict | None = None) -> go.Figure:
    """α_ℓ at every evaluation of the main training (``traj``: the run's ``alpha_by_step``) with its 95 % interval as a
    band, the range of the seeds' own fits, the last ``window`` of training shaded with the stopping rule's numbers
    (``stop``: the run's ``stopping`` row) and, with ``final`` (value, lo, hi, tokens), α_ℓ of each member's best
    stage after the continuations. Evaluations whose fit is undefined or at a search bound are open markers."""
    t = traj.sort_values("step")
    ok = t[t["defined"].astype(bool)]
    fig = plots.new_figure("Does α<sub>ℓ</sub> stop moving? α<sub>ℓ</sub> at every evaluation, 95 % interval",
                           "tokens seen per member", "α<sub>ℓ</sub> of L∞ + c·ℓ<sup>−α</sup> (dimensionless)")
    if len(ok):
        fig.add_trace(_band(ok["tokens"], ok["lo"], ok["hi"], "95 % paired bootstrap (documents, seeds)",
                            "rgba(0,114,178,0.15)"))
        fig.add_trace(_band(ok["tokens"], ok["seed_min"], ok["seed_max"], "range of the seeds' own fits",
                            "rgba(213,94,0,0.12)"))
        fig.add_trace(go.Scatter(x=ok["tokens"], y=ok["alpha"], mode="lines+markers", line=dict(color=plots.color(0)),
                                 marker=dict(size=7), name="α<sub>ℓ</sub> (all members' losses)"))
    bad = t[~t["defined"].astype(bool) & np.isfinite(t["alpha"])]
    if len(bad):
        fig.add_trace(go.Scatter(x=bad["tokens"], y=bad["alpha"], mode="markers", name="undefined or at a search bound",
                                 marker=dict(size=8, color="white", line=dict(color=plots.color(0), width=1.5))))
    if final is not None and np.isfinite(final.get("value", np.nan)):
        fig.add_trace(go.Scatter(x=[final["tokens"]], y=[final["value"]], mode="markers",
                                 marker=dict(size=12, symbol="diamond", color=plots.color(2)),
                                 error_y=dict(type="data", symmetric=False, array=[final["hi"] - final["value"]],
                                              arrayminus=[final["value"] - final["lo"]], color=plots.color(2)),
                                 name=f"each member's best stage (continued; ≤ {final['tokens']:,.0f} tokens)"))
    tokens_at = np.interp([stop["from_step"], stop["to_step"]], t["step"], t["tokens"])
    change = (f"moved {stop['change']:.3f} vs half-width {stop['half_width']:.3f}" if np.isfinite(stop["change"])
              else "rule cannot compare")
    fig.add_vrect(x0=tokens_at[0], x1=tokens_at[1], fillcolor="rgba(0,0,0,0.06)", line_width=0,
                  annotation_text=f"last {100 * float(stop.get('window', 0.3)):.0f} %: {change}",
                  annotation_position="top left")
    for y, label, dash in ((1.0, "ensemble ≈ 1", "dot"), (2.0, "edge of α<sub>ℓ</sub> < 2", "dash"),
                           (3.0, "procedural ≈ 3", "dot")):
        fig.add_hline(y=y, line=dict(color="#999", dash=dash), annotation_text=label,
                      annotation_position="bottom right")
    top = np.nanmax(np.r_[ok["alpha"].to_numpy(float), 3.2]) if len(ok) else 3.2
    fig.update_yaxes(range=[0, min(8.2, max(3.5, 1.25 * top))])
    return plots.fixed_range(fig, "yaxis", "from 0 past 3, so that the exponent is read against ensemble "
                             "averaging's 1, the claim's edge 2 and procedural assembly's 3")


def converged_repetition(curves: pd.DataFrame) -> go.Figure:
    """Held-out loss of every member against epochs of the training stream (``curves``:
    :func:`depthlib.lm.converged_views.repetition_curves`), one colour per depth (both seeds), main training solid,
    continuations dashed, and the epoch where the stream starts to repeat windows."""
    fig = plots.new_figure("Held-out loss against epochs of the training stream (repetition)",
                           "epochs of the training stream (1 = every training window seen once)",
                           "held-out loss (nats/token)")
    colors = depth_colors(curves["depth"])
    for (depth, seed), g in curves.groupby(["depth", "seed"]):
        first = seed == curves.loc[curves["depth"] == depth, "seed"].min()
        for stage, s in g.groupby("stage", sort=False):
            s = s.sort_values("stream_step")
            fig.add_trace(go.Scatter(x=s["epochs"], y=s["val_loss"], mode="lines",
                                     line=dict(color=colors[int(depth)], dash=None if stage == "main" else "dash",
                                               width=1.6),
                                     name=f"ℓ = {int(depth)}", legendgroup=f"ℓ = {int(depth)}",
                                     showlegend=bool(first and stage == "main"),
                                     hovertext=f"ℓ = {int(depth)}, seed {int(seed)}, {stage}", hoverinfo="text+x+y"))
    if curves["epochs"].max() > 1.0:
        fig.add_vline(x=1.0, line=dict(color="#777", dash="dot"), annotation_text="windows start to repeat",
                      annotation_position="top right")
    fig.update_layout(legend_title_text="solid: main training<br>dashed: continuations")
    return fig


def converged_loss_vs_depth(points: pd.DataFrame, members: pd.DataFrame, curves: pd.DataFrame, alpha: dict) -> go.Figure:
    """Each member's best held-out loss against depth (small markers, one per seed), the mean over seeds with its 95 %
    paired bootstrap interval (``points``: :func:`depthlib.lm.converged_views.certified_losses`), the fitted
    L∞ + c·ℓ^(−α) with its band, the envelope of the drop-one-depth refits and the refit without ℓ = 1 (``curves``:
    :func:`depthlib.lm.converged_views.fit_curves`); ``alpha``: the fit row (value, lo, hi). Uncertified members are
    open markers."""
    fig = plots.new_figure("Held-out loss against depth: the fit and its sensitivity", "depth ℓ (blocks)",
                           "held-out loss (nats/token)", log_x=True)
    if np.isfinite(curves["drop_lo"]).any():
        fig.add_trace(_band(curves["depth"], curves["drop_lo"], curves["drop_hi"],
                            "range of the refits without one depth", "rgba(213,94,0,0.13)"))
    if np.isfinite(curves["lo"]).any():
        fig.add_trace(_band(curves["depth"], curves["lo"], curves["hi"], "fit, 95 % bootstrap band",
                            "rgba(0,114,178,0.18)"))
    if np.isfinite(curves["fit"]).any():
        fig.add_trace(go.Scatter(x=curves["depth"], y=curves["fit"], mode="lines", line=dict(color=plots.color(0)),
                                 name=f"L∞ + c·ℓ<sup>−α</sup>, α<sub>ℓ</sub> = {alpha['value']:.2f} "
                                      f"[{alpha['lo']:.2f}, {alpha['hi']:.2f}]"))
    if np.isfinite(curves["without_1"]).any():
        keep = curves[curves["depth"] >= 1.5]
        fig.add_trace(go.Scatter(x=keep["depth"], y=keep["without_1"], mode="lines",
                                 line=dict(color=plots.color(1), dash="dash"), name="refit without ℓ = 1"))
    cert = members["certified"].astype(bool)
    for ok, label, fill in ((True, "a member (certified)", "#555"), (False, "a member (not certified)", "white")):
        m = members[cert == ok]
        if len(m):
            fig.add_trace(go.Scatter(x=m["depth"], y=m["val_loss"], mode="markers", name=label,
                                     marker=dict(size=6, color=fill, line=dict(color="#555", width=1))))
    fig.add_trace(go.Scatter(x=points["depth"], y=points["val_loss"], mode="markers",
                             error_y=dict(type="data", symmetric=False, array=points["hi"] - points["val_loss"],
                                          arrayminus=points["val_loss"] - points["lo"], color="#444"),
                             marker=dict(size=10, color=plots.color(1)), name="mean over seeds (95 % bootstrap)"))
    fig.update_xaxes(**plots.log_ticks(points["depth"]))
    return fig


def converged_alpha_sensitivity(sens: pd.DataFrame, region: tuple[float, float] = (0.0, 2.0)) -> go.Figure:
    """α_ℓ of the fit to every depth and of each refit without one depth (``sens``: the run's ``sensitivity``; fit,
    alpha, lo, hi) with their 95 % intervals, beside the edge of the region where α_ℓ ≈ 1 holds (``region``) and the
    two mechanisms' values. A refit at a search bound (no exponent) is an open marker."""
    from depthlib.lm.converged_views import defined_exponent
    fig = plots.new_figure("Sensitivity of α<sub>ℓ</sub>: refitted without each depth", "α<sub>ℓ</sub> (dimensionless)",
                           "", height=170 + 36 * len(sens))
    labels = list(sens["fit"])
    for r in sens.itertuples():
        ok = defined_exponent(float(r.alpha))
        fig.add_trace(go.Scatter(x=[r.alpha], y=[r.fit], mode="markers", showlegend=False, name=r.fit,
                                 marker=dict(size=11, color=plots.color(0) if ok else "white",
                                             line=dict(color=plots.color(0), width=1.5)),
                                 error_x=dict(type="data", symmetric=False, array=[r.hi - r.alpha],
                                              arrayminus=[r.alpha - r.lo], color=plots.color(0))))
    for x, label, color, dash in ((1.0, "ensemble averaging: 1", "#999", "dot"),
                                  (region[1], f"edge of the region α<sub>ℓ</sub> < {region[1]:g}", plots.color(1), "dash"),
                                  (3.0, "procedural assembly: 3", "#999", "dot")):
        fig.add_trace(go.Scatter(x=[x, x], y=[labels[0], labels[-1]], mode="lines", line=dict(color=color, dash=dash),
                                 name=label, hoverinfo="skip"))
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=labels[::-1])
    fig.update_layout(margin=dict(l=150))
    return fig


def converged_angle_fit(angles: pd.DataFrame, theta: dict) -> go.Figure:
    """Chapter 6's middle-angle figure (:func:`angle_vs_depth`) for the converged series: ``angles`` from
    :func:`depthlib.lm.converged_views.angle_points`, ``theta`` from :func:`depthlib.lm.converged_views.alpha_theta`
    (its value, 95 % t interval and number of depths in the legend)."""
    fig = angle_vs_depth(angles, {"value": theta["value"]})
    fig.update_layout(title_text="Middle-layer angle against depth (converged series)")
    interval = (f" [{theta['lo']:.2f}, {theta['hi']:.2f}] (95 % t)" if np.isfinite(theta["lo"])
                else " (no t interval)")
    for trace in fig.data:
        if (trace.name or "").startswith("fit: α"):
            trace.name = f"fit: α<sub>θ</sub> = {theta['value']:.2f}{interval}, {theta['n_depths']} depths"
    return fig

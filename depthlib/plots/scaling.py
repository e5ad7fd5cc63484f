"""Figures of the Chinchilla chapter (paper Fig. 2f and App. B), built from fits and tidy tables."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from depthlib import plots, scaling

TERM_AXES = {  # term -> (column of the raw data, axis title, raw-unit conversion of the feature)
    "m": ("d_model", "width m (model dimension)", 1.0),
    "l": ("n_layers", "depth ℓ (blocks)", 1.0),
    "D": ("num_tokens", "training tokens D", 1.0),
}


TERM_TICKS = {
    "m": plots.log_ticks([640, 1024, 2048, 4096]),
    "l": plots.log_ticks([10, 20, 30, 40]),
    "D": dict(tickmode="array", tickvals=[1e9, 1e10, 1e11], ticktext=["1B", "10B", "100B"]),
}


def term_part(fit: scaling.Fit, term: str) -> np.ndarray:
    """One term isolated from the observed loss: L − (all other terms) − L0 (the y of Fig. 2f)."""
    j = fit.terms.index(term)
    values = fit.term_values()
    others = values.sum(1) - values[:, j]
    return fit.points.loss - others - fit.param("L0")


def _term_line(fit: scaling.Fit, term: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    grid = np.geomspace(raw.min() * 0.9, raw.max() * 1.1, 100)
    if term == "l":
        feature = np.log(scaling.DEPTH_SCALE * (grid - fit.points.depth_offset))
    elif term == "D":
        feature = np.log(grid / scaling.DATA_SCALE)
    else:
        feature = np.log(grid)
    log_c, alpha = fit.theta[scaling.index(fit.law, f"ln_c_{term}")], fit.param(f"alpha_{term}")
    return grid, np.exp(log_c - alpha * feature)


def _part_traces(fit: scaling.Fit, term: str, color: str, name: str, visible: bool = True) -> list[go.Scatter]:
    col, _, _ = TERM_AXES[term]
    raw = fit.points.frame[col].to_numpy()
    y = term_part(fit, term)
    positive = y > 0
    grid, line = _term_line(fit, term, raw)
    a, se = fit.param(f"alpha_{term}"), fit.se_of(f"alpha_{term}")
    hover = (f"{TERM_AXES[term][1]}: %{{x:.4g}}<br>{term} part: %{{y:.4f}}<br>"
             "loss %{customdata[0]:.4f}, m %{customdata[1]:.0f}, ℓ %{customdata[2]:.0f}<extra></extra>")
    custom = fit.points.frame[["loss", "d_model", "n_layers"]].to_numpy()[positive]
    return [
        go.Scatter(x=raw[positive], y=y[positive], mode="markers", name=f"{name}: runs ({positive.sum()} of {len(y)} > 0)",
                   marker=dict(size=6, color=color, opacity=0.55, line=dict(width=0)), customdata=custom,
                   hovertemplate=hover, visible=visible, legendgroup=name),
        go.Scatter(x=grid, y=line, mode="lines", name=f"{name}: fit, α = {a:.3f} ± {se:.3f}",
                   line=dict(color=color, width=2.5, dash="dash"), visible=visible, legendgroup=name,
                   hoverinfo="skip"),
    ]


def depth_part_slider(fits: dict[int, scaling.Fit], active_exclude: int = 40) -> go.Figure:
    """Fig. 2f with a slider over the number of excluded high-loss rows (precomputed: works without a kernel)."""
    excludes = sorted(fits)
    fig = plots.new_figure("Depth part of the loss against depth (Fig. 2f)", "depth ℓ (blocks, log scale)",
                           "L − width part − data part − L0 (nats/token, log)", log_x=True, log_y=True, height=520)
    titles = []
    for k in excludes:
        fit = fits[k]
        for tr in _part_traces(fit, "l", plots.color(0), "depth", visible=(k == active_exclude)):
            fig.add_trace(tr)
        titles.append(f"Depth part vs depth — {k} highest losses excluded ({fit.points.n} runs): "
                      f"α_ℓ = {fit.param('alpha_l'):.2f} ± {fit.se_of('alpha_l'):.2f}")
    steps = plots.slider_steps([str(k) for k in excludes], 2, titles=titles)
    plots.add_slider(fig, steps, active=excludes.index(active_exclude), prefix="rows excluded (strict rule): ")
    fig.update_layout(title_text=titles[excludes.index(active_exclude)])
    fig.update_xaxes(**plots.log_ticks([8, 12, 16, 24, 32, 48, 64]))
    fig.update_layout(legend=dict(x=0.01, y=0.02, xanchor="left", yanchor="bottom"))
    return fig


def three_parts(fit: scaling.Fit) -> go.Figure:
    """Width, depth and data parts of the loss, each against its own variable, with the fitted power law."""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=[f"width part, α_m = {fit.param('alpha_m'):.2f}",
                                        f"depth part, α_ℓ = {fit.param('alpha_l'):.2f}",
                                        f"data part, α_D = {fit.param('alpha_D'):.3f}"])
    for col, term in enumerate(("m", "l", "D"), start=1):
        for tr in _part_traces(fit, term, plots.color(col - 1), term):
            tr.showlegend = False
            fig.add_trace(tr, row=1, col=col)
        fig.update_xaxes(type="log", title_text=TERM_AXES[term][1] + " (log)", row=1, col=col, **TERM_TICKS[term])
        fig.update_yaxes(type="log", row=1, col=col)
    fig.update_yaxes(title_text="part of the loss (nats/token, log)", row=1, col=1)
    fig.update_layout(title_text=f"The three parts of the fitted law ({fit.preset} fit, {fit.points.n} runs)", height=420)
    return fig


def observed_vs_predicted(fit: scaling.Fit, df: pd.DataFrame) -> go.Figure:
    """Every run's observed final loss against the law's prediction; excluded runs shown apart."""
    x_all = scaling.features(df, fit.law, fit.points.depth_offset)
    pred_all = scaling.predict(fit.theta[None], x_all)[0][0]
    dropped = scaling.excluded_mask(df["loss"].to_numpy(), fit.exclude)
    fig = plots.new_figure(f"Observed vs predicted loss (mean relative error {100 * fit.mean_rel_err:.2f}% on fitted runs)",
                           "predicted loss L̂ (nats/token)", "observed loss L (nats/token)", log_x=True, log_y=True)
    lo, hi = float(min(pred_all.min(), df["loss"].min())) * 0.97, float(max(pred_all.max(), df["loss"].max())) * 1.03
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="L = L̂",
                             line=dict(color="#888", dash="dot"), hoverinfo="skip"))
    for mask, name, color in ((~dropped, f"fitted ({(~dropped).sum()})", plots.color(0)),
                              (dropped, f"excluded ({dropped.sum()})", plots.color(1))):
        fig.add_trace(go.Scatter(
            x=pred_all[mask], y=df["loss"].to_numpy()[mask], mode="markers", name=name,
            marker=dict(size=6, color=color, opacity=0.6),
            customdata=df.loc[mask, ["d_model", "n_layers", "num_tokens"]].to_numpy(),
            hovertemplate="L̂ %{x:.3f}, L %{y:.3f}<br>m %{customdata[0]:.0f}, ℓ %{customdata[1]:.0f}, "
                          "D %{customdata[2]:.3g}<extra></extra>"))
    return fig


def bootstrap_histograms(boot: pd.DataFrame, fit: scaling.Fit, paper_fit: scaling.Fit | None = None) -> go.Figure:
    """Distributions of the three exponents over bootstrap resamples, with the 95% percentile interval."""
    cols = ["alpha_m", "alpha_l", "alpha_D"]
    labels = {"alpha_m": "α_m (width)", "alpha_l": "α_ℓ (depth)", "alpha_D": "α_D (data)"}
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07, subplot_titles=[labels[c] for c in cols])
    for i, col in enumerate(cols, start=1):
        v = boot[col].to_numpy()
        lo, hi = np.percentile(v, [2.5, 97.5])
        fig.add_trace(go.Histogram(x=v, nbinsx=40, marker_color=plots.color(i - 1), opacity=0.75, showlegend=False,
                                   name=labels[col], hovertemplate="%{x:.3f}: %{y} resamples<extra></extra>"),
                      row=1, col=i)
        for x, dash, text in ((lo, "dot", "2.5%"), (hi, "dot", "97.5%"), (fit.param(col), "solid", "fit")):
            fig.add_vline(x=x, line=dict(color="#333", dash=dash, width=1.5), row=1, col=i)
        if paper_fit is not None:
            fig.add_vline(x=paper_fit.param(col), line=dict(color=plots.color(1), dash="dash", width=1.5), row=1, col=i)
        fig.update_xaxes(title_text="exponent (dimensionless)", row=1, col=i)
    fig.update_yaxes(title_text="resamples (count)", row=1, col=1)
    fig.update_layout(title_text=f"Bootstrap of converged fits: {len(boot)} resamples of {fit.points.n} runs", height=400)
    return fig


def exclusion_scan(scan: pd.DataFrame, paper_scan: pd.DataFrame | None = None) -> go.Figure:
    """α_ℓ (± Gauss–Newton SE) against the number of excluded high-loss rows, for ℓ and ℓ − 2."""
    fig = plots.new_figure("Depth exponent against the rows excluded", "rows excluded (the k highest losses, strict rule)",
                           "depth exponent α_ℓ (dimensionless)")
    for i, (offset, group) in enumerate(scan.groupby("depth_offset")):
        g = group.sort_values("exclude")
        name = "ℓ" if offset == 0 else f"ℓ − {offset}"
        color = plots.color(i)
        fig.add_trace(go.Scatter(
            x=np.r_[g["exclude"], g["exclude"][::-1]],
            y=np.r_[g["alpha_l"] + g["se_alpha_l"], (g["alpha_l"] - g["se_alpha_l"])[::-1]],
            fill="toself", fillcolor=color, opacity=0.15, line=dict(width=0), hoverinfo="skip",
            name=f"{name}: ± 1 SE", legendgroup=name))
        fig.add_trace(go.Scatter(x=g["exclude"], y=g["alpha_l"], mode="lines+markers", name=f"{name}: converged fit",
                                 line=dict(color=color), marker=dict(size=4), legendgroup=name,
                                 customdata=g[["n_points", "se_alpha_l", "alpha_D"]].to_numpy(),
                                 hovertemplate="k = %{x}: α_ℓ = %{y:.3f} ± %{customdata[1]:.3f}<br>"
                                               "%{customdata[0]} runs, α_D = %{customdata[2]:.3f}<extra></extra>"))
    if paper_scan is not None and len(paper_scan):
        for i, (offset, g) in enumerate(paper_scan.groupby("depth_offset")):
            name = "ℓ" if offset == 0 else f"ℓ − {offset}"
            fig.add_trace(go.Scatter(x=g["exclude"], y=g["alpha_l"], mode="markers", name=f"{name}: paper's Adam (50k steps)",
                                     marker=dict(symbol="x", size=8, color=plots.color(i)),
                                     hovertemplate="k = %{x}: α_ℓ = %{y:.3f} (Adam)<extra></extra>"))
    fig.add_hline(y=1, line=dict(color="#555", dash="dot"), annotation_text="ensemble averaging (1)")
    fig.add_hline(y=3, line=dict(color="#555", dash="dot"), annotation_text="procedural, converged (3)")
    fig.add_vline(x=40, line=dict(color="#999", dash="dash"), annotation_text="paper: 40")
    return fig


def width_depth_optimum(fit: scaling.Fit, df: pd.DataFrame) -> go.Figure:
    """The compute-optimal width for each depth implied by the fit, with Chinchilla's own shapes.

    For a fit with depth offset 2 the optimum is under N ∝ m²(ℓ − 2), not the parameter count; the title says so."""
    opt = scaling.width_depth_optimum(fit)
    shapes = df[["d_model", "n_layers"]].drop_duplicates()
    var = "(ℓ − 2)" if fit.points.depth_offset == 2 else "ℓ"
    constraint = "at fixed m²(ℓ − 2), not the parameter count" if fit.points.depth_offset == 2 else "at fixed N ∝ m²ℓ"
    fig = plots.new_figure(f"Width–depth optimum {constraint}: m* ∝ {var}^{opt['m_vs_l_exponent']:.2f}, "
                           f"loss ∝ N^−{opt['N_exponent']:.3f}",
                           "depth ℓ (blocks, log)", "width m (model dimension, log)", log_x=True, log_y=True)
    ell = np.geomspace(6, 80, 50)
    depth = ell - fit.points.depth_offset
    fig.add_trace(go.Scatter(x=ell, y=opt["m_prefactor"] * depth ** opt["m_vs_l_exponent"], mode="lines",
                             name="optimum implied by the fit", line=dict(color=plots.color(0), width=2.5)))
    fig.add_trace(go.Scatter(x=shapes["n_layers"], y=shapes["d_model"], mode="markers", name="Chinchilla's architectures",
                             marker=dict(color=plots.color(1), size=7),
                             hovertemplate="ℓ %{x:.0f}, m %{y:.0f}<extra></extra>"))
    return fig


def refit_summary(df: pd.DataFrame, *, exclude: int, depth_offset: int, objective: str, solver: str) -> dict | str:
    """The decomposed law refitted with the live panel's settings: its exponents, L0, mean relative error and points
    (3 digits), or ``"cannot fit: …"`` where the settings leave no fit."""
    from depthlib.errors import InputError
    try:
        fit = scaling.fit_decomposed_law(df, preset=solver, exclude=exclude, depth_offset=depth_offset,
                                         objective=objective)
    except InputError as err:
        return f"cannot fit: {err}"
    keep = ("alpha_m", "alpha_l", "alpha_D", "L0", "mean_rel_err", "n_points")
    return {k: v for k, v in fit.summary(3).items() if k in keep}


def refit_panel(df: pd.DataFrame, exclude: int) -> None:
    """Chapter 1's live re-fit panel (ipywidgets, needs a kernel): the points excluded, the depth offset, the
    objective and the solver chosen, then "Run Interact" prints :func:`refit_summary` and draws :func:`three_parts`."""
    import ipywidgets as widgets

    def refit(exclude, depth_offset, objective, solver):
        summary = refit_summary(df, exclude=exclude, depth_offset=depth_offset, objective=objective, solver=solver)
        print(summary)
        if isinstance(summary, dict):
            three_parts(scaling.fit_decomposed_law(df, preset=solver, exclude=exclude, depth_offset=depth_offset,
                                                   objective=objective)).show()
    widgets.interact_manual(refit, exclude=widgets.IntSlider(value=exclude, min=0, max=100), depth_offset=[0, 2],
                            objective=["mse", "huber"], solver=["converged", "paper"])

"""Figures of the toy-regimes chapter (paper §4, Fig. 3b, 4a–c), built from the sweep's tidy tables only.

* :func:`alpha_heatmap`         α_ℓ over (temperature, ρ), the paper's two edges ρ = 0 and ρ = 1 marked
* :func:`loss_vs_depth_slider`  test loss against depth with the fitted power law, one slider step per (ρ, T)
* :func:`alpha_vs_step`         α_ℓ against training step, a slider over temperature, one line per ρ
* :func:`step_angle_profiles`   θ(h_l, h_{l+1}) against relative depth l/ℓ, a slider over (ρ, T)
* :func:`middle_step_vs_depth`  mean middle-layer step angle against depth, with a 1/ℓ guide
* :func:`update_angles`         mean θ(Δh_l, Δh_{l+1}) of students and teachers against ρ, π/2 and 0 marked
* :func:`long_lag`              mean long-lag cos(Δh_l, Δh_{l+k}) of students and teachers against ρ
* :func:`lag_profiles`          cos(Δh_l, Δh_{l+k}) against lag k/ℓ for the teachers and the deepest students
* :func:`calibration_alpha`     the calibration runs' α_ℓ against step (Fig. 4a,b), lr decay marked
* :func:`calibration_losses`    the calibration runs' final test loss against depth, with their fits
* :func:`converged_losses`      the converged protocol's best losses against depth: both teachers, the untrained
                                Euler discretisation and the committed from-scratch students
* :func:`converged_routes`      every route's loss relative to the best one, per depth (which route wins where)
* :func:`continuation_gains`    the certified protocol's continuation gains per student, the 2 % certificate marked
* :func:`alpha_by_fit`          the certified protocol's α_ℓ per fit (envelope, each route, untrained warm starts)
                                with intervals, and the drop-one-depth range
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from depthlib import plots
from depthlib.toy import analysis


def _cells(df: pd.DataFrame) -> list[tuple[float, float]]:
    return sorted({(float(r), float(t)) for r, t in zip(df["rho"], df["temperature"])})


def alpha_heatmap(alpha: pd.DataFrame, title: str = "Depth exponent α_ℓ over temperature and layer correlation"):
    """Heat map of α_ℓ (table from :func:`analysis.final_alpha`): x = teacher temperature T, y = ρ."""
    temps = sorted(alpha["temperature"].unique())
    rhos = sorted(alpha["rho"].unique())
    z = np.full((len(rhos), len(temps)), np.nan)
    text = np.full(z.shape, "", dtype=object)
    for r in alpha.itertuples():
        i, j = rhos.index(r.rho), temps.index(r.temperature)
        z[i, j] = r.alpha
        text[i, j] = f"{r.alpha:.2f}"
    fig = plots.new_figure(title, "teacher temperature T (log-spaced grid points)", "teacher layer correlation ρ")
    fig.add_trace(go.Heatmap(x=list(range(len(temps))), y=list(range(len(rhos))), z=z, text=text,
                             texttemplate="%{text}", colorscale=plots.HEAT, colorbar=dict(title="α_ℓ"),
                             hovertemplate="T=%{customdata[0]}<br>ρ=%{customdata[1]}<br>α_ℓ=%{z:.3f}<extra></extra>",
                             customdata=[[[f"{t:g}", f"{r:g}"] for t in temps] for r in rhos]))
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(temps))), ticktext=[f"{t:.3g}" for t in temps])
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(rhos))), ticktext=[f"{r:g}" for r in rhos])
    edges = {0.0: "ρ = 0: independent teacher (paper: α_ℓ ≈ 1)", 1.0: "ρ = 1: tied teacher (paper: α_ℓ → 3 at high T)"}
    for rho, label in edges.items():
        if rho in rhos:
            i = rhos.index(rho)
            fig.add_shape(type="rect", x0=-0.46, x1=len(temps) - 0.54, y0=i - 0.42, y1=i + 0.42,
                          line=dict(color="white", width=3, dash="dash"))
            fig.add_annotation(x=len(temps) - 0.5, y=i + (0.5 if rho == 1.0 else -0.5), text=label, showarrow=False,
                               xanchor="right", yanchor="bottom" if rho == 1.0 else "top",
                               font=dict(size=11, color="#222"), bgcolor="rgba(255,255,255,0.75)")
    fig.update_layout(height=max(380, 70 * len(rhos) + 200))
    return fig


def loss_vs_depth_slider(curves: pd.DataFrame, step: int | None = None):
    """Final test loss against depth (log–log) with the fitted c·ℓ^(−α_ℓ), one slider step per (ρ, T)."""
    step = int(curves["step"].max()) if step is None else step
    df = curves[curves["step"] == step]
    depths = sorted(df["depth"].unique())
    fig = plots.new_figure("Test loss against depth", "student depth ℓ (blocks)",
                           "test loss (KL from the teacher, nats)", log_x=True, log_y=True)
    labels, titles = [], []
    summary = analysis.final_alpha(df)
    for rho, temp in _cells(df):
        g = df[(df["rho"] == rho) & (df["temperature"] == temp)]
        for rep, gr in g.groupby("replicate"):
            fig.add_trace(go.Scatter(x=gr["depth"], y=gr["test_loss"], mode="markers", visible=False,
                                     marker=dict(color=plots.color(int(rep)), size=9),
                                     name=f"replicate {rep}", showlegend=True))
        mean = g.groupby("depth")["test_loss"].mean()
        fit = analysis.fit_power_law(mean.index, mean.values)
        x, y = plots.power_law_line(np.array(depths, float), fit["c"], fit["alpha"])
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", visible=False, line=dict(color="#444", dash="dash"),
                                 name=f"fit: α_ℓ = {fit['alpha']:.2f}"))
        row = summary[(summary["rho"] == rho) & (summary["temperature"] == temp)].iloc[0]
        labels.append(f"ρ={rho:g}, T={temp:.3g}")
        titles.append(f"Test loss against depth: ρ = {rho:g}, T = {temp:.3g}, α_ℓ = {row.alpha:.2f} "
                      f"[{row.lo:.2f}, {row.hi:.2f}]")
    n_rep = df["replicate"].nunique()
    for tr in fig.data[: n_rep + 1]:
        tr.visible = True
    fig.update_layout(title_text=titles[0])
    plots.add_slider(fig, plots.slider_steps(labels, n_rep + 1, titles=titles), prefix="")
    fig.update_xaxes(**plots.log_ticks(depths))
    return fig


def alpha_vs_step(alpha_steps: pd.DataFrame):
    """α_ℓ against training step, one line (with its interval band) per ρ; a slider over temperature."""
    temps = sorted(alpha_steps["temperature"].unique())
    rhos = sorted(alpha_steps["rho"].unique())
    fig = plots.new_figure("α_ℓ during training", "training step", "depth exponent α_ℓ (dimensionless)")
    for temp in temps:
        for i, rho in enumerate(rhos):
            g = alpha_steps[(alpha_steps["rho"] == rho) & (alpha_steps["temperature"] == temp)].sort_values("step")
            c = plots.color(i)
            fig.add_trace(go.Scatter(x=np.r_[g["step"], g["step"][::-1]], y=np.r_[g["hi"], g["lo"][::-1]],
                                     fill="toself", fillcolor=c, opacity=0.15, line=dict(width=0), hoverinfo="skip",
                                     showlegend=False, visible=False))
            fig.add_trace(go.Scatter(x=g["step"], y=g["alpha"], mode="lines+markers", line=dict(color=c),
                                     name=f"ρ = {rho:g}", visible=False))
    per = 2 * len(rhos)
    for tr in fig.data[:per]:
        tr.visible = True
    for y, label in ((1.0, "α_ℓ = 1 (ensemble averaging)"), (3.0, "α_ℓ = 3 (procedural, converged)")):
        fig.add_hline(y=y, line=dict(color="#999", dash="dot"), annotation_text=label,
                      annotation_position="top left")
    titles = [f"α_ℓ during training, T = {t:.3g}" for t in temps]
    fig.update_layout(title_text=titles[0])
    plots.add_slider(fig, plots.slider_steps([f"T={t:.3g}" for t in temps], per, titles=titles))
    return plots.fixed_range(fig, "yaxis", "α_ℓ is read against both mechanisms' values, 1 and 3, and every "
                                           "temperature of the slider keeps the same frame")


def step_angle_profiles(sig: pd.DataFrame):
    """θ(h_l, h_{l+1}) against relative depth (l + ½)/ℓ for every trained depth; slider over (ρ, T)."""
    stu = sig[sig["net"] == "student"]
    depths = sorted(stu["depth"].unique())
    fig = plots.new_figure("Step angle per layer", "relative layer position (l + ½)/ℓ", "θ(h_l, h_l+1) (rad)",
                           log_y=True)
    labels = []
    for rho, temp in _cells(stu):
        g = stu[(stu["rho"] == rho) & (stu["temperature"] == temp)]
        for i, d in enumerate(depths):
            gd = g[g["depth"] == d]
            fig.add_trace(go.Scatter(x=(gd["layer"] + 0.5) / d, y=gd["theta_step"], mode="lines+markers",
                                     marker=dict(size=5), line=dict(color=plots.color(i)), name=f"ℓ = {d:g}",
                                     visible=False))
        labels.append(f"ρ={rho:g}, T={temp:.3g}")
    for tr in fig.data[: len(depths)]:
        tr.visible = True
    titles = [f"Step angle per layer: {lab}" for lab in labels]
    fig.update_layout(title_text=titles[0])
    plots.add_slider(fig, plots.slider_steps(labels, len(depths), titles=titles))
    return fig


def middle_step_vs_depth(summary: pd.DataFrame):
    """Mean middle-layer θ(h_l, h_{l+1}) against depth (log–log), one line per ρ with a 1/ℓ guide; a slider over
    temperature (one line per (ρ, T) at once would need a legend of 15 entries)."""
    stu = summary[summary["net"] == "student"]
    depths = np.array(sorted(stu["depth"].unique()), float)
    fig = plots.new_figure("Middle-layer step angle against depth", "student depth ℓ (blocks)",
                           "mean middle-layer θ(h_l, h_l+1) (rad)", log_x=True, log_y=True)
    rhos = sorted(stu["rho"].unique())
    temps = sorted(stu["temperature"].unique())
    top = float(stu["theta_step"].max())
    x, y = plots.power_law_line(depths, top * depths.min(), 1.0)
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(color="#999", dash="dot"), name="∝ 1/ℓ (guide)"))
    for j, temp in enumerate(temps):
        for i, rho in enumerate(rhos):
            g = stu[(stu["rho"] == rho) & (stu["temperature"] == temp)].sort_values("depth")
            slope = f" (slope {g['step_angle_slope'].iloc[0]:.2f})" if len(g) else ""
            fig.add_trace(go.Scatter(x=g["depth"], y=g["theta_step"], mode="lines+markers", visible=j == 0,
                                     line=dict(color=plots.color(i)), name=f"ρ = {rho:g}{slope}"))
    titles = [f"Middle-layer step angle against depth, T = {t:.3g}" for t in temps]
    fig.update_layout(title_text=titles[0])
    plots.add_slider(fig, plots.slider_steps([f"T={t:.3g}" for t in temps], len(rhos), n_fixed=1, titles=titles))
    fig.update_xaxes(**plots.log_ticks(depths))
    return fig


def _students_and_teachers_vs_rho(summary: pd.DataFrame, column: str, title: str, y_title: str):
    """``column`` of the signature summary against ρ: one line per student depth (mean over T), teachers as crosses."""
    fig = plots.new_figure(title, "teacher layer correlation ρ", y_title)
    stu = summary[summary["net"] == "student"]
    for i, (d, g) in enumerate(stu.groupby("depth")):
        g = g.groupby("rho", as_index=False)[column].mean()
        fig.add_trace(go.Scatter(x=g["rho"], y=g[column], mode="lines+markers",
                                 line=dict(color=plots.color(i)), name=f"student ℓ = {d:g} (mean over T)"))
    tea = summary[summary["net"] == "teacher"].groupby("rho", as_index=False)[column].mean()
    fig.add_trace(go.Scatter(x=tea["rho"], y=tea[column], mode="markers", name="teacher (ℓ* blocks)",
                             marker=dict(symbol="x", size=12, color="#000")))
    return fig


def update_angles(summary: pd.DataFrame):
    """Mean middle-layer θ(Δh_l, Δh_{l+1}) against ρ: students (per depth) and the teachers themselves."""
    fig = _students_and_teachers_vs_rho(summary, "theta_update", "Angle between successive updates",
                                        "mean middle-layer θ(Δh_l, Δh_l+1) (rad)")
    fig.add_hline(y=math.pi / 2, line=dict(color="#999", dash="dot"),
                  annotation_text="π/2: ensemble averaging (LLMs)", annotation_position="bottom right")
    fig.add_hline(y=0, line=dict(color="#999", dash="dot"), annotation_text="0: smooth, procedural",
                  annotation_position="top left")
    fig.update_yaxes(range=[-0.1, 1.8])
    return fig


def long_lag(summary: pd.DataFrame):
    """Mean long-lag cos(Δh_l, Δh_{l+k}), k ≥ ℓ/4, against ρ: students (per depth) and the teachers."""
    fig = _students_and_teachers_vs_rho(summary, "long_lag_cos", "Do distant updates share a direction?",
                                        "mean cos(Δh_l, Δh_l+k), k ≥ ℓ/4 (middle blocks)")
    fig.add_hline(y=0, line=dict(color="#999", dash="dot"), annotation_text="0: no shared direction (ensemble)",
                  annotation_position="top left")
    fig.update_yaxes(range=[-0.15, 1.05])
    return fig


def lag_profiles(lag: pd.DataFrame, temperature: float | None = None):
    """cos(Δh_l, Δh_{l+k}) against relative lag k/ℓ: the teachers (solid) and the deepest students at one
    temperature (dashed, default the highest), one colour per ρ."""
    temperature = lag["temperature"].max() if temperature is None else temperature
    fig = plots.new_figure("Update correlation against lag", "lag k / ℓ (fraction of the network's blocks)",
                           "mean cos(Δh_l, Δh_l+k)")
    stu = lag[(lag["net"] == "student") & np.isclose(lag["temperature"], temperature)]
    deepest = stu["depth"].max()
    for i, rho in enumerate(sorted(lag["rho"].unique())):
        for net, g, dash in (("teacher", lag[lag["net"] == "teacher"], "solid"),
                             (f"student ℓ = {deepest:g}, T = {temperature:.3g}", stu[stu["depth"] == deepest], "dash")):
            g = g[g["rho"] == rho].sort_values("lag")
            if g.empty:
                continue
            fig.add_trace(go.Scatter(x=g["lag"] / g["depth"], y=g["cos"], mode="lines",
                                     line=dict(color=plots.color(i), dash=dash), name=f"ρ = {rho:g}: {net}"))
    fig.add_hline(y=0, line=dict(color="#999", dash="dot"))
    return fig


def calibration_alpha(alpha_steps: pd.DataFrame, steps: int):
    """α_ℓ against training step for the calibration runs (one line and t-band per teacher); the start of the
    final lr decay (80 % of ``steps``) is marked."""
    fig = plots.new_figure("α_ℓ during training: tied against independent teacher", "training step",
                           "depth exponent α_ℓ (dimensionless)")
    for i, (kind, g) in enumerate(sorted(alpha_steps.groupby("teacher"), key=lambda kv: kv[0] != "tied")):
        g = g.sort_values("step")
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=np.r_[g["step"], g["step"][::-1]], y=np.r_[g["hi"], g["lo"][::-1]],
                                 fill="toself", fillcolor=c, opacity=0.15, line=dict(width=0), hoverinfo="skip",
                                 showlegend=False))
        fig.add_trace(go.Scatter(x=g["step"], y=g["alpha"], mode="lines+markers", line=dict(color=c),
                                 name=f"{kind} (ρ = {g['rho'].iloc[0]:g})"))
    for y, label in ((1.0, "1: ensemble averaging"), (3.0, "3: procedural, converged")):
        fig.add_hline(y=y, line=dict(color="#999", dash="dot"), annotation_text=label, annotation_position="top left")
    fig.add_vline(x=0.8 * steps, line=dict(color="#bbb", dash="dash"), annotation_text="lr decay starts",
                  annotation_position="top right")
    return plots.fixed_range(fig, "yaxis", "α_ℓ is read against both mechanisms' values, 1 and 3")


def calibration_losses(curves: pd.DataFrame):
    """Final test loss against depth (log–log) for each calibration teacher, with its fitted c·ℓ^(−α_ℓ)."""
    last = curves[curves["step"] == curves.groupby("teacher")["step"].transform("max")]
    depths = sorted(last["depth"].unique())
    fig = plots.new_figure("Final test loss against depth", "student depth ℓ (blocks)",
                           "test loss (KL from the teacher, nats)", log_x=True, log_y=True)
    for i, (kind, g) in enumerate(sorted(last.groupby("teacher"), key=lambda kv: kv[0] != "tied")):
        mean = g.groupby("depth")["test_loss"].mean()
        fit = analysis.fit_power_law(mean.index, mean.values)
        fig.add_trace(go.Scatter(x=mean.index, y=mean.values, mode="markers", marker=dict(color=plots.color(i), size=10),
                                 name=f"{kind} (ρ = {g['rho'].iloc[0]:g})"))
        x, y = plots.power_law_line(np.array(depths, float), fit["c"], fit["alpha"])
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(color=plots.color(i), dash="dash"),
                                 name=f"fit: α_ℓ = {fit['alpha']:.2f}"))
    fig.update_xaxes(**plots.log_ticks(depths))
    return fig


def converged_losses(best: pd.DataFrame, rows: pd.DataFrame, paper: pd.DataFrame | None = None,
                     temperature: float = 1.0):
    """Converged test loss against depth (log–log) at ``temperature``: each replicate's best route (small markers;
    crossed where a ``certified`` column says a student is not certified), their geometric mean with its power-law
    fit (line), the tied teacher's untrained Euler discretisation (dotted) and, if given, the committed from-scratch
    students (open markers). ``best``: the converged protocol's ``best`` or the certified protocol's ``certified``."""
    b = best[best["temperature"] == temperature]
    depths = sorted(b["depth"].unique())
    fig = plots.new_figure(f"Converged loss against depth, T = {temperature:g}", "student depth ℓ (blocks)",
                           "held-out test loss (KL from the teacher, nats)", log_x=True, log_y=True)
    for i, teacher in enumerate(("tied", "independent")):
        g = b[b["teacher"] == teacher]
        if g.empty:
            continue
        fig.add_trace(go.Scatter(x=g["depth"], y=g["test_loss"], mode="markers", name=f"{teacher}: replicates",
                                 marker=dict(color=plots.color(i), size=6, opacity=0.5),
                                 customdata=g[["replicate", "route"]],
                                 hovertemplate="ℓ=%{x}, replicate %{customdata[0]}: %{y:.3g} (%{customdata[1]})"))
        if "certified" in g and not g["certified"].all():
            u = g[~g["certified"].astype(bool)]
            fig.add_trace(go.Scatter(x=u["depth"], y=u["test_loss"], mode="markers", name=f"{teacher}: not certified",
                                     marker=dict(color=plots.color(i), size=12, symbol="x-open", line=dict(width=2))))
        mean = g.groupby("depth")["test_loss"].apply(lambda v: float(np.exp(np.log(v).mean())))
        fit = analysis.fit_power_law(mean.index, mean.values)
        x, y = plots.power_law_line(np.array(depths, float), fit["c"], fit["alpha"])
        fig.add_trace(go.Scatter(x=mean.index, y=mean.values, mode="markers", marker=dict(color=plots.color(i), size=11),
                                 name=f"{teacher}: geometric mean"))
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(color=plots.color(i), dash="dash"),
                                 name=f"{teacher}: fit α_ℓ = {fit['alpha']:.2f}"))
    euler = rows[(rows["route"] == "euler") & (rows["temperature"] == temperature)]
    if len(euler):
        e = euler.groupby("depth")["initial_loss"].apply(lambda v: float(np.exp(np.log(v).mean())))
        fig.add_trace(go.Scatter(x=e.index, y=e.values, mode="lines+markers", line=dict(color="#444", dash="dot"),
                                 marker=dict(symbol="x", size=8), name="tied: untrained Euler discretisation"))
    if paper is not None and len(paper):
        q = paper[paper["temperature"] == temperature]
        for i, teacher in enumerate(("tied", "independent")):
            g = q[q["teacher"] == teacher]
            if len(g):
                fig.add_trace(go.Scatter(x=g["depth"], y=g["test_loss"], mode="markers",
                                         marker=dict(color=plots.color(i), size=11, symbol="circle-open", line=dict(width=2)),
                                         name=f"{teacher}: paper recipe, committed budget"))
    fig.update_xaxes(**plots.log_ticks(depths))
    return fig


#: the training routes of :mod:`depthlib.toy.converged` and :mod:`depthlib.toy.certified` in words
ROUTE_NAMES = {"scratch": "from scratch (paper's init)", "euler": "Euler warm start (teacher's flow)",
               "progressive": "progressive (from depth ℓ/2)", "distilled": "group distillation"}


def route_name(route: str) -> str:
    """A route's name for the reader ('continued2' reads 'best route, continued 2×')."""
    if route.startswith("continued") and route[len("continued"):].isdigit():
        return f"best route, continued {route[len('continued'):]}×"
    return ROUTE_NAMES.get(route, route)


def converged_routes(rows: pd.DataFrame, best: pd.DataFrame):
    """Each trained route's held-out loss divided by the best route's, per (teacher, T, depth), geometric mean over
    replicates: 1 is the winning route; a dropdown picks the teacher and temperature."""
    keys = ["teacher", "temperature", "replicate", "depth"]
    m = rows.merge(best[keys + ["test_loss"]], on=keys, suffixes=("", "_best"))
    m["ratio"] = m["test_loss"] / m["test_loss_best"]
    agg = m.groupby(["teacher", "temperature", "depth", "route"])["ratio"].apply(
        lambda v: float(np.exp(np.log(v).mean()))).reset_index()
    cells = sorted({(t, T) for t, T in zip(agg["teacher"], agg["temperature"])}, key=lambda c: (c[0] != "tied", -c[1]))
    routes = sorted(agg["route"].unique(), key=lambda r: (r.startswith("continued"), r))
    fig = plots.new_figure("Which route reaches the lowest loss", "student depth ℓ (blocks)",
                           "test loss ÷ best route's (ratio, geometric mean over replicates)", log_x=True, log_y=True)
    for c, (teacher, T) in enumerate(cells):
        g = agg[(agg["teacher"] == teacher) & (agg["temperature"] == T)]
        for i, route in enumerate(routes):
            r = g[g["route"] == route]
            fig.add_trace(go.Scatter(x=r["depth"], y=r["ratio"], mode="lines+markers", name=route_name(route),
                                     visible=c == 0,
                                     line=dict(color=plots.color(i)), legendgroup=route))
    n = len(routes)
    buttons = [dict(label=f"{t}, T = {T:g}", method="update",
                    args=[{"visible": [k // n == c for k in range(n * len(cells))]}]) for c, (t, T) in enumerate(cells)]
    plots.dropdown(fig, buttons)
    fig.update_xaxes(**plots.log_ticks(sorted(agg["depth"].unique())))
    return fig


def alpha_by_depths(curves: pd.DataFrame, depths, steps) -> pd.DataFrame | str:
    """α_ℓ per cell (rows ρ, T) and evaluation step (columns), fitted on the chosen depths and steps only (3
    digits), or ``"cannot fit: …"`` with fewer than two depths."""
    if len(depths) < 2:
        return "cannot fit: choose at least two depths"
    table = analysis.alpha_table(curves, depths=list(depths), step_range=steps)
    return table.pivot_table(index=["rho", "temperature"], columns="step", values="alpha").round(3)


def alpha_refit_panel(curves: pd.DataFrame) -> None:
    """Chapter 3's live re-fit panel (ipywidgets, needs a kernel): depths and a step range chosen, "Run Interact"
    shows :func:`alpha_by_depths`."""
    import ipywidgets as widgets
    from IPython.display import display

    def refit(depths, steps):
        out = alpha_by_depths(curves, depths, steps)
        print(out) if isinstance(out, str) else display(out)
    all_depths, all_steps = sorted(curves.depth.unique()), sorted(curves.step.unique())
    widgets.interact_manual(refit, depths=widgets.SelectMultiple(options=all_depths, value=tuple(all_depths)),
                            steps=widgets.SelectionRangeSlider(options=all_steps, index=(0, len(all_steps) - 1)))


def continuation_gains(stages: pd.DataFrame, gain_below: float):
    """Every continuation's gain (held-out loss before − after, ÷ before, in %) against student depth, one marker
    per continuation (hover: replicate, round), a dropdown per teacher and temperature; the certificate's threshold
    is the dashed line: a student is certified by the first continuation below it."""
    c = stages[stages["stage"].str.contains("+", regex=False)].copy()
    c["round"] = c["stage"].str.split("+c", regex=False).str[1].astype(int)
    c["gain_pct"] = 100 * c["gain"]
    cells = sorted({(t, T) for t, T in zip(c["teacher"], c["temperature"])}, key=lambda k: (k[0] != "tied", -k[1]))
    rounds = sorted(c["round"].unique())
    fig = plots.new_figure("Continuation gains: the certificate", "student depth ℓ (blocks)",
                           "held-out loss gained by a continuation (%)", log_x=True)
    for k, (teacher, T) in enumerate(cells):
        g = c[(c["teacher"] == teacher) & (c["temperature"] == T)]
        for i, rnd in enumerate(rounds):
            r = g[g["round"] == rnd]
            fig.add_trace(go.Scatter(x=r["depth"], y=r["gain_pct"], mode="markers", visible=k == 0,
                                     name=f"continuation {rnd}", legendgroup=str(rnd),
                                     marker=dict(color=plots.color(i), size=9, opacity=0.8),
                                     customdata=r[["replicate", "route"]],
                                     hovertemplate="ℓ=%{x}, replicate %{customdata[0]} (%{customdata[1]}): "
                                                   "%{y:.2f} %"))
    fig.add_hline(y=100 * gain_below, line=dict(color="#444", dash="dash"),
                  annotation_text=f"certified below {100 * gain_below:g} %")
    fig.add_hline(y=0, line=dict(color="#999", width=1))
    n = len(rounds)
    plots.dropdown(fig, [dict(label=f"{t}, T = {T:g}", method="update",
                              args=[{"visible": [j // n == k for j in range(n * len(cells))]}])
                         for k, (t, T) in enumerate(cells)])
    fig.update_xaxes(**plots.log_ticks(sorted(c["depth"].unique())))
    return fig


def alpha_by_fit(summary: pd.DataFrame, fragility: pd.DataFrame):
    """α_ℓ with its 95 % interval for every fit of the certified protocol (the envelope of certified students, each
    route's own students, the untrained warm starts), one row per fit and a colour per teacher and temperature; the
    envelope's drop-one-depth range is the thick bar beside it."""
    cells = sorted({(t, T) for t, T in zip(summary["teacher"], summary["temperature"])},
                   key=lambda k: (k[0] != "tied", -k[1]))
    fits = ["envelope"] + sorted(f for f in summary["fit"].unique() if f != "envelope")
    fig = plots.new_figure("Depth exponent by fit", "α_ℓ (−d log L / d log ℓ, dimensionless)", "fit")
    for k, (teacher, T) in enumerate(cells):
        g = summary[(summary["teacher"] == teacher) & (summary["temperature"] == T)].set_index("fit").reindex(fits)
        fig.add_trace(go.Scatter(x=g["alpha"], y=[f"{f}" for f in fits], mode="markers",
                                 name=f"{teacher}, T = {T:g}", marker=dict(color=plots.color(k), size=9),
                                 error_x=dict(type="data", symmetric=False, array=g["hi"] - g["alpha"],
                                              arrayminus=g["alpha"] - g["lo"])))
        f = fragility[(fragility["teacher"] == teacher) & (fragility["temperature"] == T)
                      & fragility["fit"].str.startswith("without")]
        if len(f):
            fig.add_trace(go.Scatter(x=[f["alpha"].min(), f["alpha"].max()], y=["envelope drop-one range"] * 2,
                                     mode="lines+markers", line=dict(color=plots.color(k), width=6),
                                     name=f"{teacher}, T = {T:g}: without one depth", showlegend=False))
    return plots.guides(fig, plots.MECHANISM_GUIDES, dashes=("dot", "dash"))


def alpha_by_round(rounds: pd.DataFrame):
    """The envelope's α_ℓ (each depth's best held-out loss so far) after 0, 1, 2, … rounds of continuations, with its
    95 % interval over replicates, one line per teacher and temperature: a flat line means more training of every
    student no longer moves the exponent, whether or not the losses are certified."""
    cells = sorted({(t, T) for t, T in zip(rounds["teacher"], rounds["temperature"])},
                   key=lambda k: (k[0] != "tied", -k[1]))
    fig = plots.new_figure("Depth exponent after each round of continuations",
                           "rounds of continuations (each: half the steps so far, re-warmed)",
                           "α_ℓ of the envelope (dimensionless)")
    for k, (teacher, T) in enumerate(cells):
        g = rounds[(rounds["teacher"] == teacher) & (rounds["temperature"] == T)].sort_values("round")
        fig.add_trace(go.Scatter(x=g["round"], y=g["alpha"], mode="lines+markers", name=f"{teacher}, T = {T:g}",
                                 line=dict(color=plots.color(k)),
                                 error_y=dict(type="data", symmetric=False, array=g["hi"] - g["alpha"],
                                              arrayminus=g["alpha"] - g["lo"])))
    fig.update_xaxes(dtick=1)
    return plots.guides(fig, plots.MECHANISM_GUIDES, axis="y", dashes=("dot", "dash"))

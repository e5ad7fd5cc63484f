"""Figures of chapter 7 (can depth be made compositional?): drawn from the tables of :mod:`depthlib.compose.analysis`."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from depthlib import plots

FAMILY_COLORS = {"untied": plots.color(0), "looped": plots.color(1), "tied": plots.color(2)}
FAMILY_NAMES = {"untied": "untied", "looped": "looped (prelude, core × r, coda)", "tied": "fully tied"}


def _errors(df: pd.DataFrame, col: str, lo: str, hi: str) -> dict:
    return dict(type="data", symmetric=False, array=(df[hi] - df[col]).fillna(0),
                arrayminus=(df[col] - df[lo]).fillna(0), thickness=1.2)


def loss_vs_depth(losses: pd.DataFrame, L: int | None, *, excess: bool = True, interval: str = "t") -> go.Figure:
    """Held-out excess loss over the Bayes loss (or the loss itself) against effective depth, one line per family,
    with 95 % intervals (``interval``: "t" over replicates, or "bootstrap" over documents, named in the title); the
    hierarchy's depth L marked (None: no hierarchy, e.g. on text). Losses are per symbol of the grammar (L given) or
    per token of text (L None)."""
    col = "excess" if excess else "val_loss"
    lo, hi = (f"{col}_lo", f"{col}_hi") if excess else ("val_lo", "val_hi")
    unit = "nats/token" if L is None else "nats/symbol"
    fig = plots.new_figure("Excess loss over the Bayes loss against effective depth" if excess else
                           f"Held-out loss against effective depth (95 % {interval} intervals)",
                           "effective depth ℓ (block applications)",
                           f"excess loss L − L<sub>Bayes</sub> ({unit})" if excess else f"held-out loss ({unit})",
                           log_x=True, log_y=excess)
    for family, g in losses.groupby("family", sort=False):
        g = g.sort_values("depth")
        fig.add_trace(go.Scatter(x=g["depth"], y=g[col], mode="lines+markers", error_y=_errors(g, col, lo, hi),
                                 line=dict(color=FAMILY_COLORS.get(family)), marker=dict(size=9),
                                 name=FAMILY_NAMES.get(family, family)))
    if L is not None:
        _mark_depth(fig, L, f"hierarchy depth L = {L}")
    fig.update_xaxes(**plots.log_ticks(losses["depth"]))
    return fig


def _mark_depth(fig: go.Figure, L: int, text: str) -> None:
    """The grammar's depth L as a dotted vertical line, labelled at the top of a log-x axis."""
    fig.add_vline(x=L, line=dict(dash="dot", color="#666"))
    fig.add_annotation(x=np.log10(L), y=1, yref="paper", text=text, showarrow=False, xanchor="left", yanchor="top")


def alpha_forest(alphas: pd.DataFrame) -> go.Figure:
    """α_ℓ of every family and law with its 95 % t interval over replicates, coloured by family (legend); 1 (ensemble
    averaging) and 3 (procedural assembly's smooth-flow rate, paper §4) marked."""
    rows = alphas[np.isfinite(alphas["value"])].copy()
    rows["label"] = [plots.wrap(f"{FAMILY_NAMES.get(r.family, r.family)} — {r.law} ({r.n_seeds} replicates)", 44)
                     for r in rows.itertuples()]
    fig = plots.new_figure("Depth exponent α<sub>ℓ</sub> per family (95 % t interval over replicates)",
                           "α<sub>ℓ</sub> (dimensionless)", "", height=120 + 45 * max(len(rows), 1))
    fig.add_trace(go.Scatter(x=rows["value"], y=rows["label"], mode="markers",
                             error_x=_errors(rows, "value", "lo", "hi"),
                             marker=dict(size=10, color=[FAMILY_COLORS.get(f) for f in rows["family"]]),
                             name="α<sub>ℓ</sub>", showlegend=False))
    plots.colour_key(fig, {FAMILY_NAMES.get(f, f): FAMILY_COLORS[f] for f in dict.fromkeys(rows["family"])
                           if f in FAMILY_COLORS})
    return _with_mechanism_guides(fig)


def loss_curves(curves: pd.DataFrame, family: str) -> go.Figure:
    """Held-out excess loss during training of one family (mean over replicates), one line per depth."""
    c = curves[(curves["family"] == family) & (curves["step"] > 0)]
    fig = plots.new_figure(f"Training: excess held-out loss — {FAMILY_NAMES.get(family, family)}",
                           "optimiser step (64 fresh sequences each)", "excess loss (nats/symbol)", log_y=True)
    for i, (depth, g) in enumerate(c.groupby("depth")):
        fig.add_trace(go.Scatter(x=g["step"], y=g["excess"].clip(lower=1e-5), mode="lines",
                                 line=dict(color=plots.color(i)), name=f"ℓ = {depth}"))
    if len(c):
        last = c["step"].max()
        fig.add_vrect(x0=0.8 * last, x1=last, fillcolor="rgba(0,0,0,0.06)", line_width=0,
                      annotation_text="last 20 % (convergence test)", annotation_position="top left")
    return fig


def diagnostic_vs_depth(diag: pd.DataFrame, col: str, title: str, y_title: str, *, ref: float | None = None,
                        ref_text: str = "", log_y: bool = False) -> go.Figure:
    """One diagnostic against effective depth, one line per family, 95 % t intervals over replicates."""
    fig = plots.new_figure(title, "effective depth ℓ (block applications)", y_title, log_x=True, log_y=log_y)
    for family, g in diag.groupby("family", sort=False):
        g = g.dropna(subset=[col]).sort_values("depth")
        if len(g):
            fig.add_trace(go.Scatter(x=g["depth"], y=g[col], mode="lines+markers",
                                     error_y=_errors(g, col, f"{col}_lo", f"{col}_hi"),
                                     line=dict(color=FAMILY_COLORS.get(family)), marker=dict(size=9),
                                     name=FAMILY_NAMES.get(family, family)))
    if ref is not None:
        fig.add_hline(y=ref, line=dict(dash="dot", color="#666"), annotation_text=ref_text,
                      annotation_position="bottom right")
    fig.update_xaxes(**plots.log_ticks(diag["depth"]))
    return fig


def profiles(layers: pd.DataFrame, depth: int, y_title: str, title: str, *, x_title: str = "block l (0 = first)",
             ref: float | None = None) -> go.Figure:
    """A per-block (or per-lag) profile of the three families at one effective depth, with 95 % t intervals."""
    fig = plots.new_figure(title, x_title, y_title)
    x = "layer" if "layer" in layers else "k"
    y = "mean" if "mean" in layers else "cos"
    t = layers[layers["depth"] == depth]
    for family, g in t.groupby("family", sort=False):
        g = g.sort_values(x)
        fig.add_trace(go.Scatter(x=g[x], y=g[y], mode="lines+markers", error_y=_errors(g, y, "lo", "hi"),
                                 line=dict(color=FAMILY_COLORS.get(family)), name=FAMILY_NAMES.get(family, family)))
    if ref is not None:
        fig.add_hline(y=ref, line=dict(dash="dot", color="#666"))
    return fig


def deletion_profile(edits: pd.DataFrame, family: str) -> go.Figure:
    """Δloss from deleting the block application at each position, one line per depth, for one family."""
    t = edits[edits["family"] == family]
    fig = plots.new_figure(f"Deleting one block application — {FAMILY_NAMES.get(family, family)}",
                           "relative position of the deleted application j/(ℓ−1)", "Δ held-out loss (nats/symbol)",
                           log_y=True)
    for i, (depth, g) in enumerate(t.groupby("depth")):
        if depth < 2:
            continue
        g = g.sort_values("position")
        fig.add_trace(go.Scatter(x=g["position"] / (depth - 1), y=g["delta"].clip(lower=1e-4), mode="lines+markers",
                                 line=dict(color=plots.color(i)), name=f"ℓ = {depth}"))
    return fig


def cluster_trajectories(clusters: pd.DataFrame, family: str, depth: int, seed: int) -> go.Figure:
    """The two ideal trajectories and each cluster's mean trajectory of one member: chapter 6's figure
    (:func:`depthlib.plots.lm.cluster_trajectories`) for one family and replicate."""
    from depthlib.plots import lm
    t = clusters[(clusters["family"] == family) & (clusters["seed"] == seed)]
    fig = lm.cluster_trajectories(t, depth)
    fig.update_layout(title_text=f"Ideal trajectories and cluster means — {FAMILY_NAMES.get(family, family)}, "
                                 f"ℓ = {depth}")
    return fig


__all__ = ["alpha_forest", "cluster_trajectories", "deletion_profile", "diagnostic_vs_depth", "loss_curves",
           "loss_vs_depth", "profiles"]


def _with_mechanism_guides(fig: go.Figure) -> go.Figure:
    """Grey lines at α_ℓ = 1 (ensemble averaging) and 3 (a smooth flow) on a forest plot of exponents, named in the
    legend (:func:`depthlib.plots.guides`: labels at the lines print over each other at this width), the legend under
    the plot so that the rows' labels and the axis share the width."""
    plots.guides(fig, plots.MECHANISM_GUIDES)
    fig.update_yaxes(type="category", automargin=True)
    rows = len(fig.data[0].y) if fig.data and fig.data[0].y is not None else 1
    entries = sum(t.showlegend is True for t in fig.data) + 2
    # two-line row labels need ~50 px a row; the legend below ~24 px an entry (entries this long take a row each)
    fig.update_layout(legend=plots.LEGEND_BELOW, height=130 + 50 * rows + 24 * entries)
    return plots.fixed_range(fig, "xaxis", "every exponent is read against the two mechanisms' values, 1 and 3")


# ---- the hierarchy part (:mod:`depthlib.compose.hierarchy_views` makes the tables) ---------------------------------
HIERARCHY_AXES = {"leaf excess": "next-leaf excess L − L<sub>Bayes</sub> (nats/leaf)",
                  "root cross-entropy": "root cross-entropy (nats/sequence)",
                  "root error": "root error 1 − accuracy (fraction of held-out sequences)"}


def hierarchy_loss_vs_depth(losses: pd.DataFrame, quantity: str, L: int, baseline: float | None = None) -> go.Figure:
    """One quantity of the hierarchy part (``losses``: :func:`depthlib.compose.hierarchy_views.loss_table`) against
    effective depth, one line per family (mean over replicates, 95 % t intervals; hollow markers: not every replicate
    certified), the grammar's depth L marked and, for the next leaf, the best n-gram's excess as a dashed line. The
    root error is drawn on a linear axis (a member with no held-out error is 0), the others log–log."""
    g = losses[losses["quantity"] == quantity]
    log_y = quantity != "root error"
    fig = plots.new_figure(f"Hierarchy control: {quantity} against effective depth (95 % t over replicates)",
                           "effective depth ℓ (block applications)", HIERARCHY_AXES[quantity], log_x=True,
                           log_y=log_y)
    for family, f in g.groupby("family", sort=False):
        f = f.sort_values("depth")
        if log_y:
            f = f[f["value"] > 0]
        full = f["certified"] >= f["replicates"]
        fig.add_trace(go.Scatter(x=f["depth"], y=f["value"], mode="lines+markers",
                                 error_y=_errors(f, "value", "lo", "hi"), line=dict(color=FAMILY_COLORS.get(family)),
                                 marker=dict(size=9, symbol=["circle" if c else "circle-open" for c in full]),
                                 name=FAMILY_NAMES.get(family, family)))
    if baseline is not None and np.isfinite(baseline):
        # a trace, not a shape: the legend names it (no annotation to collide with L's label) and the log axis's
        # ticks (plots.decade_ticks) see its value, which may lie far from the members'
        fig.add_trace(go.Scatter(x=[g["depth"].min(), g["depth"].max()], y=[baseline, baseline], mode="lines",
                                 line=dict(dash="dash", color="#444"), name="best n-gram table"))
    _mark_depth(fig, L, f"grammar depth L = {L}")
    fig.update_xaxes(**plots.log_ticks(g["depth"]))
    return fig


def hierarchy_ngram(baselines: pd.DataFrame) -> go.Figure:
    """The next-leaf excess of the position-specific n-gram tables against their context (previous leaves; ± 1.96
    s.e.), with each family's deepest member as a horizontal line (``baselines``:
    :func:`depthlib.compose.hierarchy_views.baseline_table`)."""
    ng = baselines[baselines["source"].str.startswith("n-gram")].sort_values("context")
    fig = plots.new_figure("Local statistics against the networks: next-leaf excess over the Bayes loss",
                           "context of the n-gram table (previous leaves)",
                           "next-leaf excess L − L<sub>Bayes</sub> (nats/leaf)", log_y=True)
    fig.add_trace(go.Scatter(x=ng["context"], y=ng["excess"], mode="lines+markers", name="n-gram tables",
                             error_y=_errors(ng, "excess", "lo", "hi"), line=dict(color="#444")))
    for k, r in enumerate(baselines[~baselines["source"].str.startswith("n-gram")].itertuples()):
        family = r.source.split(",")[0]
        fig.add_trace(go.Scatter(x=[ng["context"].min(), ng["context"].max()], y=[r.excess, r.excess], mode="lines",
                                 line=dict(color=FAMILY_COLORS.get(family, plots.color(k)), dash="dash"),
                                 name=f"{FAMILY_NAMES.get(family, family)}: {r.source.split(', ')[-1]}"))
    return fig


def hierarchy_gains(gains: pd.DataFrame, gain_below: float) -> go.Figure:
    """Every continuation's gain (% of the certified quantity before it) against effective depth, one colour per
    family, one marker per task; the certificate's threshold as a dotted line (``gains``:
    :func:`depthlib.compose.hierarchy_views.gains_table`)."""
    fig = plots.new_figure("Continuation gains: what keeps the members from being certified",
                           "effective depth ℓ (block applications)", "gain of a continuation (% of the quantity before)",
                           log_x=True)
    symbols = {"leaf": "circle", "root": "diamond"}
    for (task, family), g in gains.groupby(["task", "family"], sort=False):
        fig.add_trace(go.Scatter(x=g["depth"] * (1 + 0.03 * (g["round"] - 1)), y=100 * g["gain"], mode="markers",
                                 marker=dict(size=8, symbol=symbols.get(task, "square"),
                                             color=FAMILY_COLORS.get(family)),
                                 name=f"{FAMILY_NAMES.get(family, family)}, {task}"))
    fig.add_hline(y=100 * gain_below, line=dict(dash="dot", color="#666"),
                  annotation_text=f"certified below {100 * gain_below:g} %", annotation_position="bottom right")
    fig.update_xaxes(**plots.log_ticks(gains["depth"]))
    return fig


def hierarchy_alpha_by_round(rounds: pd.DataFrame, quantity: str) -> go.Figure:
    """α_ℓ of ``quantity`` after every round of continuations (each member's best stage so far), against the training
    sequences a member had drawn, one line per family with its 95 % t interval (``rounds``:
    :func:`depthlib.compose.hierarchy_views.round_table`); 1 (ensemble averaging) dotted. A flat line: more training
    no longer moves the exponent, certified or not."""
    g = rounds[rounds["quantity"] == quantity]
    fig = plots.new_figure(f"Depth exponent of the {quantity} after each round of continuations",
                           "training sequences per member (thousands)", "α<sub>ℓ</sub> (dimensionless)")
    for family, f in g.groupby("family", sort=False):
        f = f.sort_values("round")
        fig.add_trace(go.Scatter(x=f["sequences"] / 1000, y=f["alpha"], mode="lines+markers",
                                 error_y=_errors(f, "alpha", "lo", "hi"), line=dict(color=FAMILY_COLORS.get(family)),
                                 name=FAMILY_NAMES.get(family, family)))
    fig.add_hline(y=1.0, line=dict(dash="dot", color="#666"), annotation_text="1: ensemble averaging")
    return fig


def hierarchy_slopes(slopes: pd.DataFrame, quantity: str, L: int) -> go.Figure:
    """Local exponents −Δlog E/Δlog ℓ between neighbouring depths (at their geometric mean) with 95 % t intervals,
    one line per family, L marked (``slopes``: the run's ``fit_slopes``): a threshold at L shows as a peak there."""
    g = slopes[slopes["quantity"] == quantity].assign(mid=lambda d: np.sqrt(d["from"] * d["to"]))
    fig = plots.new_figure(f"Local depth exponents of the {quantity} (95 % t over replicates)",
                           "effective depth ℓ (geometric mean of the two depths)",
                           "local exponent −Δlog E / Δlog ℓ (dimensionless)", log_x=True)
    for family, f in g.groupby("family", sort=False):
        f = f.sort_values("mid")
        fig.add_trace(go.Scatter(x=f["mid"], y=f["slope"], mode="lines+markers", error_y=_errors(f, "slope", "lo", "hi"),
                                 line=dict(color=FAMILY_COLORS.get(family)), name=FAMILY_NAMES.get(family, family)))
    fig.add_hline(y=1.0, line=dict(dash="dot", color="#999"))
    fig.add_vline(x=L, line=dict(dash="dot", color="#666"))
    fig.add_annotation(x=np.log10(L), y=1, yref="paper", text=f"L = {L}", showarrow=False, xanchor="left",
                       yanchor="top")
    return fig


HIERARCHY_EDIT_STYLE = {"delete": ("solid", "circle", "delete one middle block"),
                        "swap": ("dash", "diamond", "swap two middle neighbours"),
                        "permute": ("dot", "square", "permute the middle")}
HIERARCHY_EDIT_AXES = {"leaf": "Δ next-leaf loss (nats/leaf)", "root": "Δ root error (fraction of probe sequences)"}


def hierarchy_edits(costs: pd.DataFrame, task: str, L: int) -> go.Figure:
    """Chapter 5's edits on the hierarchy control for one task (``costs``: :func:`depthlib.compose.hierarchy_views.
    edit_costs`): the cost of deleting one middle block (solid), swapping two middle neighbours (dashed) and a random
    order of the middle (dotted) against effective depth, one colour per family, mean over replicates with 95 % t
    intervals (each nudged a few % of ℓ sideways so that they do not cover each other); zero and the grammar's depth L
    marked. An ensemble's moves cost less than its deletions (chapter 5); an assembly line's cost more."""
    c = costs[costs["task"] == task]
    fig = plots.new_figure(f"Hierarchy control, {'next leaf' if task == 'leaf' else 'root'}: moving blocks against "
                           "deleting one", "effective depth ℓ (block applications)",
                           HIERARCHY_EDIT_AXES[task], log_x=True)
    for (family, edit), g in c.groupby(["family", "edit"], sort=False):
        g = g.dropna(subset=["value"]).sort_values("depth")
        if g.empty:
            continue
        dash, symbol, label = HIERARCHY_EDIT_STYLE.get(edit, ("solid", "circle", edit))
        # nudged sideways (a few % of ℓ, by edit and family) so that the intervals at one depth do not cover each other
        nudge = 1 + 0.03 * (list(HIERARCHY_EDIT_STYLE).index(edit) - 1 if edit in HIERARCHY_EDIT_STYLE else 0) \
            + 0.01 * (list(FAMILY_COLORS).index(family) - 1 if family in FAMILY_COLORS else 0)
        fig.add_trace(go.Scatter(x=g["depth"] * nudge, y=g["value"], mode="lines+markers",
                                 error_y=_errors(g, "value", "lo", "hi"),
                                 line=dict(color=FAMILY_COLORS.get(family), dash=dash),
                                 marker=dict(size=9, symbol=symbol),
                                 name=f"{FAMILY_NAMES.get(family, family)}: {label}"))
    fig.add_hline(y=0, line=dict(color="#666", width=1))
    _mark_depth(fig, L, f"grammar depth L = {L}")
    if len(c):
        fig.update_xaxes(**plots.log_ticks(c["depth"]))
    return fig


# ---- the families on chapter 6's text at its certified budget (:mod:`depthlib.compose.text_certified_views`) -------
def text_certified_losses(losses: pd.DataFrame) -> go.Figure:
    """Each member's held-out loss at the end of its final stage against effective depth, one line per family (one
    seed; hollow markers: not certified), log–log (``losses``: :func:`depthlib.compose.text_certified_views.
    loss_table`)."""
    fig = plots.new_figure("Reusing depth on text at chapter 6's certified budget: held-out loss",
                           "effective depth ℓ (block applications)", "held-out loss (nats/token)", log_x=True,
                           log_y=True)
    for family, g in losses.groupby("family", sort=False, observed=True):
        g = g.groupby("depth", as_index=False).agg(val_loss=("val_loss", "mean"), certified=("certified", "all"))
        fig.add_trace(go.Scatter(x=g["depth"], y=g["val_loss"], mode="lines+markers",
                                 line=dict(color=FAMILY_COLORS.get(family)),
                                 marker=dict(size=9, symbol=["circle" if c else "circle-open" for c in g["certified"]]),
                                 name=FAMILY_NAMES.get(family, family)))
    fig.update_xaxes(**plots.log_ticks(losses["depth"]))
    return fig


def text_certified_alphas(exponents: pd.DataFrame) -> go.Figure:
    """α_ℓ over effective depth of every family whose exponent is shown (``exponents``:
    :func:`depthlib.compose.text_certified_views.exponent_table`), with its 95 % paired bootstrap interval over
    held-out documents, coloured by family; 1 and 3 marked. A family without a shown exponent is left out (the table
    beside the figure says why)."""
    rows = exponents[exponents["shown"]].copy()
    rows["label"] = [plots.wrap(f"{FAMILY_NAMES.get(r.family, r.family)} (ℓ = {r.depths})", 44)
                     for r in rows.itertuples()]
    fig = plots.new_figure("Text at chapter 6's certified budget: depth exponent α<sub>ℓ</sub> per family",
                           "α<sub>ℓ</sub> (dimensionless)", "", height=120 + 45 * max(len(rows), 1))
    fig.add_trace(go.Scatter(x=rows["alpha"], y=rows["label"], mode="markers", error_x=_errors(rows, "alpha", "lo", "hi"),
                             marker=dict(size=10, color=[FAMILY_COLORS.get(f) for f in rows["family"]]),
                             name="α<sub>ℓ</sub>", showlegend=False))
    plots.colour_key(fig, {FAMILY_NAMES.get(f, f): FAMILY_COLORS[f] for f in dict.fromkeys(rows["family"])
                           if f in FAMILY_COLORS})
    return _with_mechanism_guides(fig)


# ---- the looped toy students under chapter 3's certified protocol (:mod:`depthlib.compose.looped_views`) ------------
#: line dash, marker symbol and legend name of each kind of student in :func:`looped_loss_vs_depth`
LOOPED_LOSS_STYLE = {"looped": ("solid", "circle", "looped (one block × ℓ), envelope"),
                     "looped, scratch → halved": ("dot", "square", "looped, scratch → halved alone"),
                     "untied": ("dash", "diamond", "untied (chapter 3), envelope")}
#: marker symbol of each fit in :func:`looped_alpha_forest` (open where not every student is certified)
LOOPED_FIT_SYMBOL = {"looped envelope": "circle", "looped, scratch → halved": "square",
                     "looped route euler": "triangle-up", "looped route halved": "triangle-down",
                     "looped untrained euler": "x", "untied envelope (chapter 3)": "diamond"}
_KEY_GREY = "#555"
#: the teachers' colours in chapter 3's certified figures (:mod:`depthlib.plots.toy`: tied first), which this section
#: shows beside its own
LOOPED_TEACHER_COLORS = {"tied": plots.color(0), "independent": plots.color(1)}


def _open(symbol: str, filled: bool) -> str:
    return symbol if filled or symbol == "x" else f"{symbol}-open"


def looped_loss_vs_depth(lines: pd.DataFrame, temperature: float = 1.0) -> go.Figure:
    """Held-out KL (nats; geometric mean over replicates, 95 % t interval of its logarithm) against student depth
    (log–log) at ``temperature``, from :func:`depthlib.compose.looped_views.loss_lines`: the looped envelope (solid),
    the scratch → halved chain alone (dotted), chapter 3's untied envelope (dashed), one colour per teacher; open
    markers where not every replicate's student is certified; the untrained Euler start in grey."""
    t = lines[np.isclose(lines["temperature"], temperature)]
    fig = plots.new_figure(f"Toy, certified protocol: looped and untied students against depth, T = {temperature:g}",
                           "student depth ℓ (block applications)", "held-out KL from the teacher (nats)",
                           log_x=True, log_y=True)
    for (kind, teacher), g in t.groupby(["kind", "teacher"], sort=False):
        if kind not in LOOPED_LOSS_STYLE:
            continue
        g = g.sort_values("depth")
        dash, symbol, name = LOOPED_LOSS_STYLE[kind]
        full = (g["certified"] >= g["n"]).to_numpy()
        fig.add_trace(go.Scatter(x=g["depth"], y=g["loss"], mode="lines+markers", error_y=_errors(g, "loss", "lo", "hi"),
                                 line=dict(color=LOOPED_TEACHER_COLORS.get(teacher), dash=dash),
                                 marker=dict(size=9, symbol=[_open(symbol, f) for f in full], line=dict(width=1.5)),
                                 name=f"{name}, {teacher} teacher"))
    euler = t[t["kind"] == "untrained Euler start"].sort_values("depth")
    if len(euler):
        fig.add_trace(go.Scatter(x=euler["depth"], y=euler["loss"], mode="lines+markers",
                                 line=dict(color="#777", dash="dot", width=1.5), marker=dict(symbol="x", size=8),
                                 name="untrained Euler start, tied teacher (the same network looped or untied)"))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", hoverinfo="skip",
                             marker=dict(symbol="circle-open", size=9, color=_KEY_GREY, line=dict(width=1.5)),
                             name="open marker: not every replicate certified"))
    fig.update_layout(legend=plots.LEGEND_BELOW, height=plots.HEIGHT + 24 * len(fig.data))
    fig.update_xaxes(**plots.log_ticks(t["depth"]))
    return fig


def looped_alpha_forest(exponents: pd.DataFrame) -> go.Figure:
    """α_ℓ [95 % t over replicates] of every fit of :func:`depthlib.compose.looped_views.exponent_table` — the looped
    envelope, the scratch → halved chain, each looped route before any continuation, the untrained Euler start and
    chapter 3's untied envelope on the looped depths — one row each, coloured by teacher, the marker's shape naming
    the fit (open: not every student certified, or no certificate); grey bars: the range of the refits without one
    depth; 1 and 3 marked."""
    rows = exponents[np.isfinite(exponents["alpha"])].iloc[::-1].copy()      # a category axis starts at the bottom
    rows["label"] = [f"{r.fit}<br>{r.teacher} teacher, ℓ = {r.depths}" for r in rows.itertuples()]
    fig = plots.new_figure("Toy, certified protocol: depth exponent α<sub>ℓ</sub> of looped and untied students",
                           "α<sub>ℓ</sub> (dimensionless; 95 % t over replicates)", "")
    fig.add_trace(go.Scatter(x=rows["alpha"], y=rows["label"], mode="markers", error_x=_errors(rows, "alpha", "lo", "hi"),
                             marker=dict(size=11, color=[LOOPED_TEACHER_COLORS.get(t) for t in rows["teacher"]],
                                         symbol=[_open(LOOPED_FIT_SYMBOL.get(f, "circle"), c == "certified")
                                                 for f, c in zip(rows["fit"], rows["certificate"])],
                                         line=dict(width=1.5)),
                             name="α<sub>ℓ</sub>", showlegend=False))
    drop = rows[np.isfinite(rows["drop_one_min"])]
    xs, ys = [], []
    for r in drop.itertuples():
        xs += [r.drop_one_min, r.drop_one_max, None]
        ys += [r.label, r.label, None]
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#999", width=9), opacity=0.6,
                                 name="range of the refits without one depth", hoverinfo="skip"))
    plots.colour_key(fig, {f"{t} teacher": LOOPED_TEACHER_COLORS[t] for t in dict.fromkeys(rows["teacher"])
                           if t in LOOPED_TEACHER_COLORS}, symbol="square")
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", hoverinfo="skip",
                             marker=dict(symbol="circle-open", size=10, color=_KEY_GREY, line=dict(width=1.5)),
                             name="open marker: not every student certified (or no certificate)"))
    return _with_mechanism_guides(fig)

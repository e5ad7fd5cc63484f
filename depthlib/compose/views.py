"""Chapter 7's tables and Markdown, built from its finished runs for the notebook (``notebooks/07_compose.ipynb``).

Every function reads the runs' tables through :mod:`depthlib.compose.analysis` (nothing is computed that a run
stores) and returns a DataFrame or a Markdown string for the notebook to display; no compute code imports this module,
so editing it never makes a committed run stale. The runs: ``run`` the positive control on the random hierarchy model
(``runs["rhm"]``), ``toy`` the looped students in chapter 3's toy (``runs["toy"]``) and ``untied`` chapter 3's
converged run; the certified text part's and the unseen control's views are :mod:`depthlib.compose.text_certified_views`
and :mod:`depthlib.compose.hierarchy_views`.
Units: losses and excess losses in nats per symbol (grammar), the toy's losses in nats (held-out KL), angles in
radians, cosines and exponents dimensionless; intervals are 95 % (t over replicates unless stated).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.compose import analysis

__all__ = ["alpha_text", "conclusion_text", "convergence_table", "convergence_text", "diagnostics_text",
           "equal_depth_table", "equal_parameters_text", "limits_text", "looped_students_table", "settings_table",
           "slopes_table", "toy_conclusion_text", "toy_convergence_text", "toy_settings_table",
           "toy_signatures_table", "toy_signatures_text", "toy_slope_intervals", "toy_slopes_table"]


def _describe(run: results.Run) -> dict:
    from depthlib.compose.chapter import describe
    return describe(run)


# ---- the positive control: the random hierarchy model -------------------------------------------------------------
def settings_table(run: results.Run, profile: str) -> pd.DataFrame:
    """The grammar, the families and the budget, one row per setting (column ``<profile> profile``): (v, m, s, L) and
    its seed, leaves per sequence, the held-out set's Bayes loss (nats/symbol), effective depths and parameters per
    family, replicates, width and heads, steps × fresh sequences, held-out and probe sequences, members trained."""
    info, losses = _describe(run), analysis.loss_table(run)
    g = info["grammar"]
    params = losses.drop_duplicates(["family", "n_blocks"]).groupby("family")["n_params"].agg(["min", "max"])
    return pd.Series({
        "grammar (v, m, s, L)": f"({g['v']}, {g['m']}, {g['s']}, {g['L']}), seed {g['seed']}",
        "leaves per sequence": info["length"],
        "Bayes loss of the held-out set (nats/symbol)": f"{losses.bayes.mean():.4f}",
        "families": ", ".join(info["families"]),
        **{f"effective depths, {f}": ", ".join(map(str, d)) for f, d in info["depths"].items()},
        **{f"parameters, {f}": f"{params.loc[f, 'min']:,} – {params.loc[f, 'max']:,}" for f in params.index},
        "replicates (initialisation and samples)": len(info["seeds"]),
        "width d_model / heads": f"{info['d_model']} / {info['n_heads']}",
        "optimiser steps × fresh sequences per step": f"{info['steps']} × {info['batch_size']}",
        "held-out / probe sequences": f"{info['n_held_out']} / {info['n_probe']}",
        "members trained": info["n_members"]}, name=f"{profile} profile").to_frame()


def convergence_table(run: results.Run) -> pd.DataFrame:
    """Per (family, depth): the largest relative improvement over replicates of the held-out loss and of the excess
    loss over the last 20 % of training (fractions, 4 digits), and whether every replicate met the 1 % rule."""
    losses = analysis.loss_table(run)
    conv = losses[["family", "depth", "rel_improvement_max", "rel_improvement_excess_max", "converged"]].rename(columns={
        "rel_improvement_max": "loss improvement, last 20 % (max over replicates)",
        "rel_improvement_excess_max": "excess improvement, last 20 % (max)", "converged": "converged (< 1 %, all)"})
    return conv.round(4).set_index(["family", "depth"])


def convergence_text(run: results.Run) -> str:
    """**Measured** (Markdown): how many (family, depth) cells converged by the 1 % rule, the largest improvement of the
    held-out loss over the last 20 % (%), and how much the excess loss still fell there (largest and median, %)."""
    losses = analysis.loss_table(run)
    return (f"**Measured.** {int(losses.converged.sum())} of {len(losses)} (family, depth) cells have every replicate "
            f"converged by the 1 % rule; the largest improvement of the held-out loss over the last 20 % is "
            f"{100 * losses.rel_improvement_max.max():.2f} %. The excess loss still fell by up to "
            f"{100 * losses.rel_improvement_excess_max.max():.0f} % over the same stretch "
            f"(median {100 * losses.rel_improvement_excess_max.median():.0f} %): the deep members' small excesses are "
            "converged in the protocol's sense, not at their floor, and the numbers below read accordingly.")


def _alpha_phrase(r) -> str:
    """One row of :func:`depthlib.compose.analysis.alpha_table` in words: α with its 95 % t interval over the depths
    fitted, or why there is none (too few depths; a replicate without a fit inside the searched range)."""
    if not np.isfinite(r.value):
        return f"{r.family} ({r.law}): no fit (too few depths)"
    if not r.defined:
        return f"{r.family} ({r.law}): {r.value:.2f}, but not every replicate gave a fit inside the searched range"
    return f"{r.family} ({r.law}, depths {r.depths}): α = {r.value:.2f} [{r.lo:.2f}, {r.hi:.2f}]"


def alpha_text(run: results.Run, profile: str) -> str:
    """**Measured** (Markdown): the excess loss per family and depth with its 95 % t interval (nats/symbol), the Bayes
    loss, every family's depth exponents (:func:`_alpha_phrase`) and the root-mean-square log residual of the excess
    power law per family."""
    losses, alphas = analysis.loss_table(run), analysis.alpha_table(run)
    fits = analysis.fit_laws(run.table("members"))
    rmse = fits[fits.law == "excess"].groupby("family")["rmse"].mean()
    return ("**Measured** (" + profile + " profile; 95 % t intervals over replicates). Excess loss (nats/symbol) by "
            "depth: "
            + "; ".join(f"{f}: " + ", ".join(f"ℓ = {r.depth}: {r.excess:.4f} [{r.excess_lo:.4f}, {r.excess_hi:.4f}]"
                                             for r in g.itertuples()) for f, g in losses.groupby("family", sort=False))
            + f". Bayes loss {losses.bayes.mean():.4f}. Depth exponents: "
            + "; ".join(_alpha_phrase(r) for r in alphas.itertuples())
            + ". Root-mean-square log residual of the excess power law: "
            + ", ".join(f"{f} {v:.2f}" for f, v in rmse.items())
            + " (a power law through a threshold leaves large residuals: 0.1 is a 10 % miss per point).")


def slopes_table(run: results.Run) -> pd.DataFrame:
    """The local exponents −Δlog E/Δlog ℓ between consecutive depths per family (:func:`depthlib.compose.analysis.
    local_slopes`: mean and 95 % t interval over replicates, dimensionless, 2 digits), indexed by family and step."""
    slopes = analysis.local_slopes(run)
    return (slopes.assign(step=[f"{a} → {b}" for a, b in zip(slopes["from"], slopes["to"])])
            .set_index(["family", "step"])[["slope", "lo", "hi", "n_seeds"]].round(2)
            .rename(columns={"lo": "95 % low", "hi": "95 % high", "n_seeds": "replicates"}))


def equal_depth_table(run: results.Run) -> pd.DataFrame:
    """The excess loss (nats/symbol, mean over replicates, 4 digits) per effective depth, one column per family; "—"
    where a family has no member of that depth."""
    losses = analysis.loss_table(run)
    piv = losses.pivot(index="depth", columns="family", values="excess")
    rows = []
    for depth in piv.index:
        row = {"effective depth ℓ": depth}
        for f in piv.columns:
            row[f"excess, {f}"] = piv.loc[depth, f]
        rows.append(row)
    table = pd.DataFrame(rows).set_index("effective depth ℓ")
    return table.round(4).astype(object).where(table.notna(), "—")


def equal_parameters_text(run: results.Run) -> str:
    """**Measured** (Markdown): the excess (nats/symbol) of the untied members with as many blocks as a looped (3) and
    a tied (1) member, beside the looped members' at ℓ > 3 and the tied ones' at ℓ > 1."""
    losses = analysis.loss_table(run)
    same_params = {f: losses[(losses.family == "untied") & (losses.n_blocks == b)].excess.mean()
                   for f, b in (("looped", 3), ("tied", 1))}
    return ("**Measured.** At equal parameters, the untied ℓ = 3 member (3 blocks, as every looped member) has excess "
            f"{same_params['looped']:.4f} and the untied ℓ = 1 member (1 block, as every tied member) "
            f"{same_params['tied']:.4f} nats/symbol; the looped members at ℓ > 3 reach " + ", ".join(
                f"{r.excess:.4f} (ℓ = {r.depth})"
                for r in losses[(losses.family == "looped") & (losses.depth > 3)].itertuples())
            + " and the tied ones at ℓ > 1 " + ", ".join(
                f"{r.excess:.4f} (ℓ = {r.depth})"
                for r in losses[(losses.family == "tied") & (losses.depth > 1)].itertuples())
            + ": applying the same weights again buys what extra blocks buy, to the extent these numbers say.")


def _diagnostic(d: pd.DataFrame, col: str, family: str, depth: int, digits: int = 2, pct: bool = False) -> str:
    """One diagnostic of ``d`` (:func:`depthlib.compose.analysis.diagnostic_table` indexed by family and depth) as
    "value [lo, hi]" (the value alone without an interval); ``pct``: a share, in %, its interval clipped to [0, 1]."""
    v, lo, hi = d.loc[(family, depth), [col, f"{col}_lo", f"{col}_hi"]]
    if pct:                                       # a share: its t interval is clipped to [0, 1]
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    f = (lambda x: f"{100 * x:.1f} %") if pct else (lambda x: f"{x:.{digits}f}")
    return f"{f(v)} [{f(lo)}, {f(hi)}]" if np.isfinite(lo) else f(v)


def diagnostics_text(run: results.Run, profile: str) -> str:
    """**Measured** (Markdown list, one item per family at its deepest member): the middle angle and θ(Δh) (rad), the
    long-lag cosine, the 'evenly' cluster (% of tokens), the loss added by deleting one middle application
    (nats/symbol) beside the member's own excess and an ensemble's expected cost, deleting the first application and,
    for the untied family, swapping two neighbours and permuting the middle; means with 95 % t intervals."""
    info, d = _describe(run), analysis.diagnostic_table(run).set_index(["family", "depth"])
    lines = []
    for family in info["families"]:
        fd = max(info["depths"][family])
        lines.append(f"* **{family}, ℓ = {fd}**: middle angle {_diagnostic(d, 'theta_middle_mean', family, fd)} rad; "
                     f"θ(Δh) {_diagnostic(d, 'theta_dh_mean', family, fd)} rad; long-lag cosine "
                     f"{_diagnostic(d, 'long_lag_cos', family, fd)}; "
                     f"'evenly' cluster {_diagnostic(d, 'cluster_evenly', family, fd, pct=True)} of tokens; "
                     f"deleting one middle application +{_diagnostic(d, 'delete_middle_delta', family, fd, 3)} "
                     f"nats/symbol (the member's own excess: {_diagnostic(d, 'probe_excess', family, fd, 4)}; "
                     f"{_diagnostic(d, 'delete_vs_ensemble', family, fd, 1)} × an ensemble's expected cost); deleting "
                     f"the first +{_diagnostic(d, 'delete_first_delta', family, fd, 3)}"
                     + (f"; swapping two neighbours +{_diagnostic(d, 'swap_delta', family, fd, 3)}; a random order of "
                        f"the middle +{_diagnostic(d, 'permute_delta', family, fd, 3)}" if family == "untied" else "")
                     + ".")
    return "**Measured** (" + profile + " profile; means over replicates with 95 % t intervals):\n\n" + "\n".join(lines)


# ---- the looped students in chapter 3's toy -----------------------------------------------------------------------
def toy_settings_table(toy: results.Run) -> pd.DataFrame:
    """The toy run's settings, one row each (column ``value``): teachers (depth ℓ*, temperatures T), replicates, looped
    depths and steps per depth, batch × pool, learning rates, trained parameters per student, students trained and
    wall time (min)."""
    tinfo, looped_rows = _describe(toy), toy.table("looped")
    return pd.Series({
        "teachers": ", ".join(tinfo["teachers"]) + " (ℓ* = " + str(tinfo["teacher_depth"]) + ", T = "
                    + ", ".join(f"{t:g}" for t in tinfo["temperatures"]) + ")",
        "replicates (the calibration's teachers)": tinfo["replicates"],
        "looped depths": ", ".join(map(str, tinfo["depths"])),
        "steps per depth": ", ".join(f"ℓ = {d}: {s:,}" for d, s in tinfo["steps"].items()),
        "batch × pool": f"{tinfo['batch']} × {tinfo['pool_batches']} batches",
        "lr (scratch; warm starts ×)": f"{tinfo['flow_lr']:.2e}; × {tinfo['lr_warm']:g}",
        "trained parameters per looped student": f"{int(looped_rows.parameters.iloc[0]):,} at every depth",
        "students trained": len(looped_rows),
        "wall time": f"{tinfo['wall_time_s'] / 60:.0f} min on one core"}, name="value").to_frame()


def looped_students_table(toy: results.Run) -> pd.DataFrame:
    """Every looped student (teacher, replicate, depth): its route, steps, held-out loss (KL, nats; 3 significant
    digits), relative improvement over the last 20 % of steps and whether it met the 1 % rule."""
    looped_rows = toy.table("looped")
    show_rows = looped_rows[["teacher", "replicate", "depth", "route", "steps", "test_loss",
                             "rel_improvement_last20", "converged"]].sort_values(["teacher", "replicate", "depth"])
    return (show_rows.assign(test_loss=show_rows.test_loss.map("{:.3e}".format),
                             rel_improvement_last20=show_rows.rel_improvement_last20.map("{:.4f}".format))
            .rename(columns={"rel_improvement_last20": "improvement, last 20 %", "test_loss": "held-out loss"})
            .set_index(["teacher", "replicate", "depth"]))


def toy_slope_intervals(toy: results.Run) -> pd.DataFrame:
    """The local exponents −Δlog L/Δlog ℓ of the best looped students between neighbouring depths, per teacher: mean
    over replicates with its 95 % t interval (columns slope, lo, hi, n; index teacher, depth_from, depth_to)."""
    from depthlib.toy import converged as toy_converged
    toy_slopes = toy_converged.local_slopes(toy.table("best"))
    return toy_slopes.groupby(["teacher", "depth_from", "depth_to"])["slope"].apply(
        lambda s: analysis.mean_interval(s)).apply(pd.Series).rename(columns={0: "slope", 1: "lo", 2: "hi", 3: "n"})


def toy_slopes_table(toy: results.Run) -> pd.DataFrame:
    """:func:`toy_slope_intervals` for the reader: 2 digits, the index and columns named."""
    return (toy_slope_intervals(toy).round(2).rename_axis(index=["teacher", "from ℓ", "to ℓ"])
            .rename(columns={"lo": "95 % low", "hi": "95 % high", "n": "replicates"}))


def toy_convergence_text(toy: results.Run) -> str:
    """**Measured** (Markdown): how many looped students met the 1 % rule and the largest improvement over the last
    20 % of steps (%)."""
    looped_rows = toy.table("looped")
    return (f"**Measured.** {int(looped_rows.converged.sum())} of {len(looped_rows)} looped students are converged by "
            f"the protocol's 1 % rule (largest improvement over the last 20 % of steps: "
            f"{100 * looped_rows.rel_improvement_last20.max():.3f} %). The second table gives the local exponents "
            "−Δlog L/Δlog ℓ between neighbouring depths (95 % t intervals over replicates): a plateau shows as slopes "
            "falling towards 0.")


def _interval_strings(t: pd.DataFrame, col: str) -> list[str]:
    """Each row's ``col`` as "v [lo, hi]" (3 significant digits; the value alone where there is no interval)."""
    return [f"{v:.3g} [{lo:.3g}, {hi:.3g}]" if np.isfinite(lo) else f"{v:.3g}"
            for v, lo, hi in zip(t[col], t[f"{col}_lo"], t[f"{col}_hi"])]


def toy_signatures_table(toy: results.Run) -> pd.DataFrame:
    """Per (net, teacher, depth) in the toy: the middle θ(h_l, h_l+1) and θ(Δh_l, Δh_l+1) (rad) and the long-lag
    cosine (k ≥ ℓ/4) of the looped students and their teachers, each "mean [95 % t interval]" over replicates."""
    tsig = analysis.toy_signatures(toy)
    return (tsig.assign(theta_step=_interval_strings(tsig, "theta_step"),
                        theta_update=_interval_strings(tsig, "theta_update"),
                        long_lag_cos=_interval_strings(tsig, "long_lag_cos"))
            [["net", "teacher", "depth", "theta_step", "theta_update", "long_lag_cos", "n"]]
            .rename(columns={"theta_step": "middle θ(h_l, h_l+1) (rad)", "theta_update": "θ(Δh_l, Δh_l+1) (rad)",
                             "long_lag_cos": "long-lag cos (k ≥ ℓ/4)", "n": "replicates"})
            .set_index(["net", "teacher", "depth"]))


def _signature(ts: pd.DataFrame, net: str, teacher: str, depth: int, col: str) -> str:
    """One signature of ``ts`` (:func:`depthlib.compose.analysis.toy_signatures` indexed by net, teacher, depth) as
    "v [lo, hi]" (3 significant digits; the value alone without an interval)."""
    r = ts.loc[(net, teacher, depth)]
    return f"{r[col]:.3g}" + (f" [{r[col + '_lo']:.3g}, {r[col + '_hi']:.3g}]" if np.isfinite(r[col + '_lo']) else "")


def _not_ensemble(ts: pd.DataFrame, teacher: str) -> bool:
    """Whether chapter 3's rule calls every looped student of ``teacher`` a non-ensemble: θ(Δh) ≤ 1.2 rad or a
    long-lag cosine ≥ 0.1 at every depth with both measured."""
    r = ts.loc[("looped student", teacher)].dropna(subset=["theta_update", "long_lag_cos"])
    return bool(((r["theta_update"] <= 1.2) | (r["long_lag_cos"] >= 0.1)).all())


def toy_signatures_text(toy: results.Run) -> str:
    """**Measured** (Markdown): the looped students' update angle (rad) and long-lag cosine at the deepest depth on
    each teacher, the teachers' long-lag cosines, what chapter 3's ensemble rule calls the students, and how their
    middle step angle (rad) falls from the shallowest to the deepest depth."""
    tinfo = _describe(toy)
    ts = analysis.toy_signatures(toy).set_index(["net", "teacher", "depth"])

    def tsv(net, teacher, depth, col):
        return _signature(ts, net, teacher, depth, col)
    tdeep, tshallow = max(tinfo["depths"]), min(tinfo["depths"])
    tdepth = int(ts.loc[("teacher", "tied")].index[0])
    flow_rule = {t: _not_ensemble(ts, t) for t in ("tied", "independent")}
    calls = ("every looped student a non-ensemble on both teachers" if all(flow_rule.values())
             else "some looped students an ensemble")
    return f"""**Measured** (means over {int(ts['n'].max())} replicates, 95 % t intervals). At ℓ = {tdeep} the looped students'
consecutive updates meet at {tsv('looped student', 'tied', tdeep, 'theta_update')} rad on the tied teacher and
{tsv('looped student', 'independent', tdeep, 'theta_update')} rad on the independent one, and their distant updates point
the same way: long-lag cosine {tsv('looped student', 'tied', tdeep, 'long_lag_cos')} (tied) and
{tsv('looped student', 'independent', tdeep, 'long_lag_cos')} (independent). The teachers (ℓ* = {tdepth}) give
{tsv('teacher', 'tied', tdepth, 'long_lag_cos')} (tied: one flow) and {tsv('teacher', 'independent', tdepth, 'long_lag_cos')}
(independent: {tdepth} different blocks). Chapter 3's rule — an ensemble needs θ(Δh) > 1.2 rad **and** a long-lag cosine below
0.1 — calls {calls}:
it reads the weight sharing correctly, whatever the target. On the independent teacher, then, the student is a flow asked
to imitate an ensemble; the measures show *what it is*, not how well it fits, and its loss plateau (above) is the
price. Note also that the middle step angle of the looped students falls as ℓ^−1 on both teachers (from
{tsv('looped student', 'independent', tshallow, 'theta_step')} rad at ℓ = {tshallow} to
{tsv('looped student', 'independent', tdeep, 'theta_step')} at ℓ = {tdeep} on the independent teacher): a flow with step
1/ℓ and an ensemble give the same 1/ℓ, which is why the book's verdict says that row tells the two apart only from
compositional assembly."""


# ---- what the chapter can and cannot say, and its conclusion --------------------------------------------------------
def limits_text(run: results.Run, toy: results.Run | None = None, untied: results.Run | None = None,
                certified_text: results.Run | None = None, hierarchy: results.Run | None = None) -> str:
    """What this chapter can and cannot say, and what was not done (Markdown list): replicates, the grammar's size, the
    models' width and parameters, sequences per member, the text part's budget (``certified_text``: the part at
    chapter 6's certified budget, when shown), the old toy part's budget beside chapter 3's converged run (``toy``
    and ``untied``, when shown: the certified toy part says its own limits,
    :func:`depthlib.compose.looped_views.limits_text`), whether the root task and a deeper grammar were run
    (``hierarchy``: the unseen control, when shown) and what the `paper` profile (defined, not run) would train."""
    from depthlib.compose.chapter import PROFILES, describe_text_certified
    info = _describe(run)
    not_done = ("a grammar deeper than the unseen control's (its root task is there, above)" if hierarchy is not None
                else "classification of the root, and deeper grammars (no number in this book)")
    certified = ""
    if certified_text is not None:
        c = describe_text_certified(certified_text)
        seeds = "one seed" if len(c["seeds"]) == 1 else f"{len(c['seeds'])} seeds"
        certified = (f"\n* **On text**, at chapter 6's certified budget ({seeds}, width {c['d_model']}, "
                     f"{c['tokens_per_member'] / 1e6:.2f} M tokens a member before continuations, effective depths to "
                     f"{max(max(d) for d in c['depths'].values())}), the intervals are over held-out documents, not "
                     "over retrained members, and a member not certified after its continuations is reported as such.")
    unseen = ""
    if hierarchy is not None:
        from depthlib.compose import hierarchy_views
        cert = hierarchy_views.verdict_rows(hierarchy).set_index("key").loc["certified"]
        unseen = (f" The unseen control is trained with the same rule made strict (chapter 3's certificate): "
                  f"{cert['measured']}; so at this budget its exponents and slope changes are undecided, however "
                  "narrow their intervals.")
    losses = analysis.loss_table(run)
    paper, paper_text = PROFILES["paper"].run, PROFILES["paper"].text_certified
    return f"""
* **Can:** on one target whose hierarchy and Bayes loss are known exactly, whether untied, looped and fully tied
  residual transformers of one width lose their excess loss with effective depth as a power law or at a threshold near
  the hierarchy's depth, with intervals over {len(info['seeds'])} replicates; and whether the diagnostics behind the
  paper's "not compositional" reading separate networks that must compose {info['grammar']['L']} parsing steps from
  the LLMs of chapter 2.
* **Cannot:** speak for language. The grammar has {info['length']} leaves and {info['grammar']['L']} levels, the models width
  {info['d_model']} and at most {losses.n_params.max():,} parameters, each member saw
  {info['sequences_per_member']:,} fresh sequences; the excess losses of the deep members were still falling when the
  1 % rule on the total loss was met, so their values (and every α fitted through them) are those of this
  budget.{unseen}{certified}
* **Not done (cut for the budget):** {not_done}; more than one seed on text.{_old_toy_limits(toy, untied)}
* **What a GPU-scale run needs.** The `paper` profile (defined, not run) is a deeper grammar ((v, m, s, L) =
  ({paper.grammar.v}, {paper.grammar.m}, {paper.grammar.s}, {paper.grammar.L}), {paper.grammar.length} leaves), width
  {paper.model.d_model}, effective depths {min(paper.depths)}–{max(paper.depths)}, {len(paper.seeds)} replicates and
  {paper.train.steps:,} steps × {paper.train.batch_size} sequences per member, so that depths span well past L and the
  excess converges; on real text the `paper` profile's text part (defined, not run: chapter 6's `paper` series, width
  {paper_text.series.model.d_model}, effective depths up to {max(paper_text.depths)}, {len(paper_text.seeds)} seeds,
  {paper_text.series.train.steps:,} steps × {paper_text.series.train.batch_size} windows of
  {paper_text.series.model.context} tokens before continuations) and,
  beyond it, a web-scale corpus with enough tokens per parameter (Chinchilla's ≈ 20) at every effective depth and
  several seeds — hours of one GPU per family.
"""


def _old_toy_limits(toy: results.Run | None, untied: results.Run | None) -> str:
    """The old toy part's budget beside chapter 3's converged run (one sentence; empty without both runs)."""
    if toy is None or untied is None:
        return ""
    tinfo = _describe(toy)
    return f""" The looped toy students were run with
  {tinfo['replicates']} replicates and depths
  {', '.join(map(str, tinfo['depths']))} (chapter 3's untied students: {untied.config['cells'][0][2]} replicates,
  depths {', '.join(map(str, untied.config['depths']))}), {tinfo['steps'][max(tinfo['depths'])]:,} steps at the deepest
  (chapter 3's run: {untied.config['steps_deepest']:,}) and {tinfo['continuations']} continuation rounds (chapter 3's:
  {untied.config['continuations']})."""


def _alpha_interval(table: pd.DataFrame, family: str) -> str:
    """A family's α (``table``: :func:`depthlib.compose.analysis.alpha_table` rows of one law, indexed by family) as
    "v [lo, hi]", or "no fit" without an interval."""
    r = table.loc[family]
    return f"{r.value:.2f} [{r.lo:.2f}, {r.hi:.2f}]" if np.isfinite(r.lo) else "no fit"


def _versus_one(r) -> str:
    """Where an α interval (a row with lo, hi) lies against ensemble averaging's 1."""
    return ("faster than ensemble averaging's 1" if r.lo > 1 else "slower than ensemble averaging's 1" if r.hi < 1
            else "consistent with ensemble averaging's 1")


def conclusion_text(run: results.Run) -> str:
    """The conclusion on the random hierarchy model (Markdown): the untied family's α (excess and free-floor laws) with
    its local slopes (dimensionless), the deletion cost over an ensemble's, the paper's diagnostics at the deepest
    member, the looped and tied exponents and signatures, their excess (nats/symbol) at equal parameters and depth,
    and what limits the numbers (the excess still falling, wall time in min)."""
    info, losses, alphas = _describe(run), analysis.loss_table(run), analysis.alpha_table(run)
    fits = analysis.fit_laws(run.table("members"))
    diag = analysis.diagnostic_table(run)
    ex = alphas[alphas.law == "excess"].set_index("family")
    ff = alphas[alphas.law == "free floor"].set_index("family")
    fl = fits[(fits.law == "free floor") & (fits.family == "untied")]
    slopes = analysis.local_slopes(run)
    steep = slopes[slopes.family == "untied"].sort_values("slope").iloc[-1]
    exc = losses.set_index(["family", "depth"]).excess
    deep_u, deep_l, deep_t = (max(info["depths"][f]) for f in ("untied", "looped", "tied"))

    def a(f, table=ex):
        return _alpha_interval(table, f)
    dr = diag.set_index(["family", "depth"])
    below = slopes[(slopes.family == "untied") & (slopes["to"] <= 3)]
    below_slopes = ", ".join(f"{r.slope:.1f}" for r in below.itertuples())
    peak = f"{steep.slope:.1f} [{steep.lo:.1f}, {steep.hi:.1f}]"

    def versus_one(f):
        return _versus_one(ex.loc[f])
    ratio_u = dr.loc["untied"].delete_vs_ensemble.dropna()
    return f"""
On a target that must be parsed in L = {info['grammar']['L']} levels, untied residual transformers of width {info['d_model']}
lose their excess over the Bayes loss as ℓ^−α with **α = {a('untied')}** over effective depths {ex.loc['untied'].depths}:
{versus_one('untied')}, far from a smooth flow's 3, and not a clean power law — the local slope is
{below_slopes} up to ℓ = 3 and peaks at {peak} between ℓ = {steep['from']} and {steep['to']}, around
the hierarchy's depth. (The paper's law with a free floor gives {a('untied', ff)}, but puts the floor at
{fl.L_inf.min():.3f}–{fl.L_inf.max():.3f} nats, below the exact Bayes loss {losses.bayes.mean():.3f} that no model can reach; the
excess law, whose floor is known, is the one to read.) By chapter 5's edits these networks are assembly lines: deleting
one middle application costs {ratio_u.min():.0f}–{ratio_u.max():.0f} × what an ensemble would lose (means at ℓ = 3–{deep_u}). The
paper's diagnostics nonetheless read them as they read LLMs: {100 * dr.loc[('untied', deep_u), 'cluster_evenly']:.0f} % of
tokens "updated evenly", consecutive updates at {dr.loc[('untied', deep_u), 'theta_dh_mean']:.2f} rad (π/2 = 1.57) at
ℓ = {deep_u}. **The trajectory clusters and update angles cannot tell composition from averaging; the edits can.**

Reusing depth does not steepen the law. Over effective depth, a looped core (prelude, core × (ℓ−2), coda) gives
**α = {a('looped')}** ({versus_one('looped')}) and one fully tied block **α = {a('tied')}** ({versus_one('tied')}; the
free-floor fit, {a('tied', ff)}, is too wide to say), with the signatures of a
flow at ℓ = {deep_t}: consecutive updates at {dr.loc[('looped', deep_l), 'theta_dh_mean']:.2f} (looped) and
{dr.loc[('tied', deep_t), 'theta_dh_mean']:.2f} rad (tied), long-lag cosines {dr.loc[('looped', deep_l), 'long_lag_cos']:.2f} and
{dr.loc[('tied', deep_t), 'long_lag_cos']:.2f}, deletion costing {dr.loc[('looped', deep_l), 'delete_vs_ensemble']:.1f} and
{dr.loc[('tied', deep_t), 'delete_vs_ensemble']:.2f} × an ensemble's. What reuse buys is loss per parameter: at ℓ = {deep_l} the
looped model (3 blocks) has excess {exc[('looped', deep_l)]:.4f} against {exc[('untied', 3)]:.4f} for the untied model with the
same 3 blocks, and the tied one (1 block) {exc[('tied', deep_t)]:.4f} against {exc[('untied', 1)]:.4f}; at equal effective depth
the untied model is best ({exc[('untied', deep_u)]:.4f}).

**At this scale**, then, a hierarchical target makes untied depth compositional by the edits and moves α_ℓ modestly
above 1; reusing depth does not move it up (the looped exponent is consistent with 1, the tied one lies below it). \
These are the exponents of one grammar, one width and one budget: every
member met the 1 % rule, but the deep members' excess was still falling (by up to
{100 * losses.rel_improvement_excess_max.max():.0f} % over the last 20 % of steps), so longer training could steepen the
untied law further. Whether reuse or hierarchy changes α_ℓ *for language* is not answered here (see what a GPU-scale
run needs, above). The run took {info['wall_time_s'] / 60:.0f} min of wall time on one core ({info['n_members']} members).
"""


def _toy_alpha(ta: pd.DataFrame, kind: str, teacher: str) -> str:
    """α_ℓ of one kind of toy student on one teacher (``ta``: :func:`depthlib.compose.analysis.toy_alphas` indexed by
    kind and teacher) as "v [lo, hi]"."""
    r = ta.loc[(kind, teacher)]
    return f"{r.alpha:.2f} [{r.lo:.2f}, {r.hi:.2f}]"


def _against(ta: pd.DataFrame, kind: str, teacher: str, other: str = "untied") -> str:
    """"below", "above" or "overlapping": one kind's α_ℓ interval on ``teacher`` against ``other``'s."""
    a, b = ta.loc[(kind, teacher)], ta.loc[(other, teacher)]
    return "below" if a.hi < b.lo else "above" if a.lo > b.hi else "overlapping"


def _versus_three(r) -> str:
    """Where an α interval (a row with lo, hi) lies against a smooth flow's 3."""
    return "below a smooth flow's 3" if r.hi < 3 else "above 3" if r.lo > 3 else "consistent with a smooth flow's 3"


def _versus_one_toy(r) -> str:
    """Where an α interval (a row with lo, hi) lies against 1."""
    return "below 1" if r.hi < 1 else "above 1" if r.lo > 1 else "consistent with 1"


def _loss_ratio(tl: pd.DataFrame, teacher: str, depth: int) -> float:
    """The best looped student's converged loss over the untied student's (``tl``: :func:`depthlib.compose.analysis.
    toy_losses` indexed by kind, teacher, depth)."""
    return tl.loc[("looped", teacher, depth), "loss"] / tl.loc[("untied", teacher, depth), "loss"]


def toy_conclusion_text(toy: results.Run, untied: results.Run) -> str:
    """The conclusion on the looped toy students (Markdown): α_ℓ (dimensionless, 95 % intervals) on the tied teacher
    beside the untied students' and 3, the scratch → halved chain's, the looped over untied loss ratios at the
    shallowest and deepest common depths, the independent teacher's α_ℓ, losses (nats) and local slope, convergence
    and wall time (min)."""
    tinfo = _describe(toy)
    toy_losses, toy_alphas = analysis.toy_losses(toy, untied), analysis.toy_alphas(toy, untied)
    looped_rows = toy.table("looped")
    slope_iv = toy_slope_intervals(toy)
    ta = toy_alphas.set_index(["kind", "teacher"])
    tl = toy_losses.set_index(["kind", "teacher", "depth"])

    def tiv(kind, teacher):
        return _toy_alpha(ta, kind, teacher)

    def against(kind, teacher, other="untied"):
        return _against(ta, kind, teacher, other)

    def versus_three(teacher):
        return _versus_three(ta.loc[("looped", teacher)])

    def versus_one_toy(teacher):
        return _versus_one_toy(ta.loc[("looped", teacher)])

    def ratio(teacher, depth):
        return _loss_ratio(tl, teacher, depth)
    common = sorted(set(tinfo["depths"]) & set(toy_losses.query("kind == 'untied'").depth))   # depths both runs trained
    d_lo, d_hi = common[0], common[-1]
    last = slope_iv.loc["independent"].iloc[-1]
    last_t = slope_iv.loc["tied"].iloc[-1]
    n_rep = int(ta.loc[("looped", "tied"), "replicates"])
    tied_best = toy.table("best").query("teacher == 'tied'")
    n_euler, n_tied = int((tied_best.route == "euler").sum()), len(tied_best)
    chain_ratio = tl.loc[(analysis.TOY_CHAIN, "tied", d_hi), "loss"] / tl.loc[("looped", "tied", d_hi), "loss"]
    return f"""
**Looped students in chapter 3's toy.** A student that applies one block ℓ times with step 1/ℓ — an autonomous flow,
{int(looped_rows.parameters.iloc[0]):,} parameters at every depth — trained by chapter 3's converged protocol
(T = 1, ℓ = {', '.join(map(str, tinfo['depths']))}, {n_rep} replicates, 95 % t intervals over replicates) gives
**α_ℓ = {tiv('looped', 'tied')} on the tied teacher**, {versus_three('tied')} and {against('looped', 'tied')} the untied
students' {tiv('untied', 'tied')} ({n_euler} of {n_tied} of its best tied students are the Euler route's). Trained
from scratch alone (the scratch → halved chain) it gives {tiv(analysis.TOY_CHAIN, 'tied')}, its loss
{chain_ratio:.1f} × the best route's at ℓ = {d_hi}. The best looped loss is {ratio('tied', d_lo):.1f} × the untied \
student's at ℓ = {d_lo} and
{ratio('tied', d_hi):.1f} × at ℓ = {d_hi} (local slope between the two deepest depths {last_t.slope:.2f}
[{last_t.lo:.2f}, {last_t.hi:.2f}]). On the **independent teacher** it gives **α_ℓ = {tiv('looped', 'independent')}**
({versus_one_toy('independent')}; {against('looped', 'independent')} the untied students' {tiv('untied', 'independent')}):
its loss goes from {tl.loc[('looped', 'independent', d_lo), 'loss']:.2e} at ℓ = {d_lo} to
{tl.loc[('looped', 'independent', d_hi), 'loss']:.2e} at ℓ = {d_hi}, {ratio('independent', d_hi):.1f} × the untied
student's there, with a local slope of {last.slope:.2f} [{last.lo:.2f}, {last.hi:.2f}] between the two deepest depths.
{int(looped_rows.converged.sum())} of {len(looped_rows)} looped students met the 1 % rule (largest improvement over the
last 20 %: {100 * looped_rows.rel_improvement_last20.max():.3f} %); the run's second and third segments took
{tinfo['wall_time_s'] / 60:.0f} min on one core (the first, which trained six of the tied teacher's chain students, is not
in the run's wall time).
"""


# ---- the chapter's answer ------------------------------------------------------------------------------------
#: chapter 7's verdict rows, in the order the answer takes them, with what each one asks
ANSWER_ROWS = {"hierarchical": "a hierarchical target (untied blocks on the random hierarchy model)",
               "looped": "reusing depth on that target (a looped core, or one tied block)",
               "looped_text": "reusing depth on chapter 6's text"}


def answer(rows) -> str:
    """Chapter 7's answer (Markdown) from its verdict rows (:func:`depthlib.verdict.verdict`, chapter 7): for each of
    :data:`ANSWER_ROWS`, its exponents as the verdict table prints them (:func:`depthlib.verdict.numbers`), its status
    and, where it is undecided, why (the measurements' own notes: members not certified, no exponent); then what
    would decide it. The first words say how many rows decide anything."""
    from depthlib import verdict
    by = {r.claim.key: r for r in rows}
    shown = [(key, by[key]) for key in ANSWER_ROWS if key in by and by[key].measurements]
    if not shown:
        return "**Not tested here:** no run of this chapter's profile is available."
    decided = [r for _, r in shown if r.status not in ("undecided", "not tested here")]
    lead = ("Undecided at this scale" if not decided else
            "Decided" if len(decided) == len(shown) else f"Partly decided ({len(decided)} of {len(shown)} claims)")
    parts = [f"**{lead}.**"]
    for key, row in shown:
        numbers = "; ".join(f"{model} {number}" for model, number in verdict.numbers(row).items())
        why = ""
        if row.status == "undecided":
            notes = [m.note.split("; ")[-1] for m in row.measurements if not m.converged or m.lo is None]
            why = " because " + "; ".join(dict.fromkeys(n for n in notes if n)) if any(notes) else ""
        parts.append(f"For {ANSWER_ROWS[key]}, α_ℓ over effective depth is {numbers} (the claim: below 2) — "
                     f"**{row.status}**{why}.")
    if len(decided) < len(shown):
        parts.append("An exponent decides only when its members are certified by chapter 3's continuation rule (a "
                     "re-warmed continuation gains less than 2 %); deciding these rows needs more training than this "
                     "profile affords: the `paper` profile (a GPU).")
    return " ".join(parts)

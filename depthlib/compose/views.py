"""Chapter 7's tables and Markdown, built from its finished runs for the notebook (``notebooks/07_compose.ipynb``).

Every function reads the runs' tables through :mod:`depthlib.compose.analysis` (nothing is computed that a run
stores) and returns a DataFrame or a Markdown string for the notebook to display; no compute code imports this module,
so editing it never makes a committed run stale. The runs: ``run`` the positive control on the random hierarchy model
(``runs["rhm"]``); the certified text part's, the unseen control's and the looped toy students' views are
:mod:`depthlib.compose.text_certified_views`, :mod:`depthlib.compose.hierarchy_views` and
:mod:`depthlib.compose.looped_views`.
Units: losses and excess losses in nats per symbol (grammar), angles in
radians, cosines and exponents dimensionless; intervals are 95 % (t over replicates unless stated).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.claims import Measurement
from depthlib.compose import analysis

__all__ = ["alpha_text", "answer", "conclusion_text", "convergence_table", "convergence_text", "diagnostics_reading",
           "diagnostics_text", "equal_depth_table", "equal_parameters_text", "limits_text", "measurements",
           "settings_table", "slopes_table"]


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


EVENLY = 0.99           # an "all even" member: at least this share of its tokens in the paper's "updated evenly" cluster
ASSEMBLY = 2.0          # an "assembly line": deleting one middle application costs over this many ensembles' costs


def _range(values: pd.Series, digits: int = 2, scale: float = 1.0, unit: str = "") -> str:
    """The finite ``values`` as "a" or "a–b" (times ``scale``, ``digits`` decimals, ``unit`` after)."""
    v = scale * values.dropna().to_numpy(float)
    lo, hi = f"{v.min():.{digits}f}", f"{v.max():.{digits}f}"
    return (lo if lo == hi else f"{lo}–{hi}") + unit


class _UntiedEdits(NamedTuple):
    """The untied members of a :func:`depthlib.compose.analysis.diagnostic_table` read by the rule of
    :func:`diagnostics_reading` (:func:`_untied_edits`)."""
    members: pd.DataFrame       # the untied rows, indexed by depth
    middle: pd.DataFrame        # those with middle blocks (a deletion cost over an ensemble's)
    even: pd.Series             # their 'evenly' shares (fraction of tokens), by depth
    assembly: bool              # every middle member's deletion interval lies above ASSEMBLY ensembles' costs
    all_even: bool              # every share is at least EVENLY


def _untied_edits(d: pd.DataFrame) -> _UntiedEdits:
    """The untied members of ``d`` (:func:`depthlib.compose.analysis.diagnostic_table`) and the rule's two readings."""
    u = d[d["family"] == "untied"].set_index("depth")
    mid, even = u[u["delete_vs_ensemble"].notna()], u["cluster_evenly"].dropna()
    return _UntiedEdits(u, mid, even, bool(len(mid)) and bool((mid["delete_vs_ensemble_lo"] > ASSEMBLY).all()),
                       bool(len(even)) and bool((even >= EVENLY).all()))


def diagnostics_reading(run: results.Run) -> str:
    """Whether the paper's cluster diagnostic calls the positive control compositional, read from the run (Markdown).

    Rule, on the untied members with middle blocks: they are **assembly lines** by chapter 5's edits when the lower
    end of the 95 % interval of every member's deletion cost over an ensemble's expected cost exceeds
    :data:`ASSEMBLY`; the cluster diagnostic calls a member **all even** when at least :data:`EVENLY` of its tokens
    fall in the "updated evenly" cluster (the paper's reading of LLMs, 99.6 %). The answer is "No" when the untied
    members are assembly lines the diagnostic calls all even. The reused-depth families' numbers (deepest members)
    say what the 2-means split does separate."""
    info = _describe(run)
    d = analysis.diagnostic_table(run)
    u, mid, even, assembly, all_even = _untied_edits(d)
    if not len(mid) or not len(even):
        return "*The run has no untied member with middle blocks, so the diagnostic cannot be read against the edits.*"
    head = ("**No — and the edits show why not.**" if assembly and all_even else
            "**Yes, at least in part.**" if assembly else
            "**The edits do not call the untied members assembly lines either**, so this control does not test the "
            "diagnostic.")
    deep = int(u.index.max())
    ordered = mid[mid["swap_delta"].notna()]
    order = ordered["swap_delta"] / ordered["delete_middle_delta"]
    shuffled = u.loc[deep, "permute_delta"]
    edits = (f"The untied members must infer {info['grammar']['L']} levels of hidden symbols, and by chapter 5's edits "
             + ("they are assembly lines" if assembly else "they are not clearly assembly lines")
             + f": deleting one middle block application costs {_range(mid['delete_vs_ensemble'], 0)} times what an "
             f"ensemble of similar members would lose (means at ℓ = {int(mid.index.min())}–{int(mid.index.max())}; "
             f"rule: the interval's lower end above {ASSEMBLY:g} at every depth), and swapping two neighbours costs "
             f"{_range(order, 1)} times a deletion")
    if np.isfinite(shuffled):
        edits += (f"; at ℓ = {deep} a random order of the middle costs +{shuffled:.3f} nats/symbol against "
                  f"+{u.loc[deep, 'delete_middle_delta']:.3f} for one deletion")
    angles = mid["theta_middle_mean"].dropna()
    signs = (f"Yet {_range(even, 1, 100, ' %')} of the tokens of the untied members at ℓ = {int(even.index.min())}–"
             f"{int(even.index.max())} fall in the \"updated evenly\" cluster (the paper reads 99.6 % in LLMs), "
             f"consecutive updates are at {_range(u['theta_dh_mean'], 2)} rad (π/2 ≈ 1.57: unrelated) and the middle "
             f"angle falls from {angles.iloc[0]:.2f} rad at ℓ = {int(angles.index[0])} to {angles.iloc[-1]:.2f} at "
             f"ℓ = {int(angles.index[-1])} — the LLM signatures of chapter 2. The trajectory clusters only ask whether a "
             "token *stops being updated* early; a network whose blocks each do a different, necessary step by a "
             "similar amount of rotation passes as \"even\".")
    reused = [f for f in info["families"] if f != "untied"]
    rows = d[d["family"].isin(reused)].set_index(["family", "depth"])
    flow = []
    for f in reused:
        fd = max(info["depths"][f])
        r = rows.loc[(f, fd)]
        flow.append(f"{f} ℓ = {fd}: consecutive updates at {r['theta_dh_mean']:.2f} rad, long-lag cosine "
                    f"{r['long_lag_cos']:.2f}, deleting one application {r['delete_vs_ensemble']:.2f} × an ensemble's "
                    f"cost, {100 * r['cluster_evenly']:.0f} % of tokens \"even\"")
    split = rows["cluster_evenly"].dropna()
    separates = bool(len(split)) and bool((split < even.min()).all())
    shares = ", ".join(f"{f} ℓ = {k}: {100 * v:.0f} %" for (f, k), v in split.items())
    reading = (f"The reused-depth families behave more like a flow ({'; '.join(flow)}). Their \"even\" shares ({shares}) "
               + ("all lie below every untied member's, so the 2-means split separates flows from non-flows, not "
                  "composition from averaging." if separates else
                  "do not all lie below the untied members', so the 2-means split does not reliably separate even flows "
                  "from non-flows, let alone composition from averaging."))
    return (f"{head} {edits}. {signs}\n\n{reading} To call a network compositional, the diagnostic would need what the "
            "edits measure — whether the blocks are interchangeable and indispensable — or a readout of *what* each "
            "block computes (e.g., linear probes for the hidden symbols of each level of the hierarchy at each depth), "
            "not how far each block turns the state.")


# ---- what the chapter can and cannot say, and its conclusion --------------------------------------------------------
def limits_text(run: results.Run, certified_text: results.Run | None = None, hierarchy: results.Run | None = None) -> str:
    """What this chapter can and cannot say, and what was not done (Markdown list): replicates, the grammar's size, the
    models' width and parameters, sequences per member, the text part's budget (``certified_text``: the part at
    chapter 6's certified budget, when shown), whether the root task and a deeper grammar were run
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
* **Not done (cut for the budget):** {not_done}; more than one seed on text.
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
    untied = _untied_edits(diag)
    ratio_u = untied.middle.delete_vs_ensemble
    edits = ("By chapter 5's edits these networks are assembly lines" if untied.assembly else
             "By chapter 5's edits these networks are not clearly assembly lines")
    span = f"{int(untied.middle.index.min())}–{deep_u}"
    return f"""
On a target that must be parsed in L = {info['grammar']['L']} levels, untied residual transformers of width {info['d_model']}
lose their excess over the Bayes loss as ℓ^−α with **α = {a('untied')}** over effective depths {ex.loc['untied'].depths}:
{versus_one('untied')}, far from a smooth flow's 3, and not a clean power law — the local slope is
{below_slopes} up to ℓ = 3 and peaks at {peak} between ℓ = {steep['from']} and {steep['to']}, around
the hierarchy's depth. (The paper's law with a free floor gives {a('untied', ff)}, but puts the floor at
{fl.L_inf.min():.3f}–{fl.L_inf.max():.3f} nats, below the exact Bayes loss {losses.bayes.mean():.3f} that no model can reach; the
excess law, whose floor is known, is the one to read.) {edits}: deleting
one middle application costs {ratio_u.min():.0f}–{ratio_u.max():.0f} × what an ensemble would lose (means at ℓ = {span}). The
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
        numbers = "; ".join(f"{model}: {number}" for model, number in verdict.numbers(row).items())
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


def measurements(parts: dict[str, results.Run | None]) -> dict[str, list]:
    """Chapter 7's numbers for the verdict's claims: the hierarchy control's certified exponents (else the first
    grammar's, not certified), the looped toy students' and the families' on chapter 6's text, each labelled by its
    family or teacher and what it measures."""
    run, hierarchy = parts.get("rhm"), parts.get("hierarchy")
    out: dict[str, list[Measurement]] = {"hierarchical": [], "looped": []}
    if hierarchy is not None:       # the unseen, certified control supersedes the first grammar
        from depthlib.compose import hierarchy_views
        what = {"leaf": "next-leaf excess", "root": "root error"}     # excess over the exact Bayes loss
        for claim, ms in hierarchy_views.measurements(hierarchy).items():
            out[claim] = [Measurement(f"{m['family']}, effective depths {m['depths']} (unseen RHM; {what[m['task']]})",
                                      m["value"], m["lo"], m["hi"], hierarchy.profile, m["note"],
                                      converged=m["certified"], certified=m["certified_of"],
                                      gaining=m["gaining"], facts=m["facts"]) for m in ms]
    elif run is not None:
        # its members met a rule of little change at the end of their schedule, which certifies nothing (chapter 3)
        for r in analysis.alpha_table(run).itertuples():
            if not r.defined:
                continue
            law = "excess over the Bayes loss" if r.law == "excess" else "L∞ + c·ℓ^−α, free floor"
            m = Measurement(f"{r.family}, effective depths {r.depths} (RHM; {law})", r.value, r.lo, r.hi,
                            run.profile, f"95 % t interval over {r.n_seeds} replicates; members not certified",
                            converged=False)
            out["hierarchical" if r.family == "untied" else "looped"].append(m)
    looped_toy = parts.get("toy_certified")
    if looped_toy is not None:          # looped students of chapter 3's teachers, certified
        from depthlib.compose import looped_views
        for claim, ms in looped_views.measurements(looped_toy).items():
            out[claim] = [Measurement(f"looped students of the {m['teacher']} teacher, ℓ = {m['depths']} (T = 1)",
                                      m["value"], m["lo"], m["hi"], looped_toy.profile, m["note"],
                                      converged=m["certified"], certified=m["certified_of"],
                                      facts=m.get("facts", {})) for m in ms]
    certified_text = parts.get("text_certified")
    if certified_text is not None:      # the families at chapter 6's certified budget
        from depthlib.compose import text_certified_views
        out["looped_text"] = [
            Measurement(f"{m['family']}, effective depths {m['depths']} (text at chapter 6's certified budget; "
                        "L∞ + c·ℓ^−α)", m["value"], m["lo"], m["hi"], certified_text.profile, m["note"],
                        converged=m["certified"], certified=m["certified_of"])
            for m in text_certified_views.measurements(certified_text)]
    return out

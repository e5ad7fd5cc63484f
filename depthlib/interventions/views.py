"""Chapter 5's answer and conclusion, worded from the prediction table (:func:`~depthlib.interventions.analysis.
prediction_table`) by stated rules, so that the prose follows the runs.

What the edits can conclude is bounded by the controls (chapter 3's students of an independent and of a tied teacher):
a statistic reads an LM only where it held on the ensemble's control and separates the two controls. Two cautions are
measured here rather than asserted: how far apart the controls' intervals are (a separation by a hair calibrates
little), and how far beyond *both* controls an LM lies (a reading far outside the calibrated range is an
extrapolation: it can reject the derivation's weakly coupled ensemble, for which every such ratio is ≪ 1, but cannot
say which mechanism produces the LM's 1/ℓ). Every number is a 95 % bootstrap interval over documents.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.claims import Measurement

__all__ = ["answer", "conclusion", "coupling_summary", "grammar_order", "measurements"]

#: the two edits that test coupling: reordering (like with like, over the whole middle) and parallel groups
COUPLING = (("order_ratio", "middle", "reordering k middle blocks costs {v} times what deleting the same blocks costs"),
            ("parallel_ratio", "", "summing g blocks run in parallel costs {v} of averaging them"))


def _iv(v: float, lo: float, hi: float, digits: int = 2) -> str:
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _rows(preds: pd.DataFrame, statistic: str, scope: str = "") -> pd.DataFrame:
    rows = preds[preds["statistic"] == statistic]
    if scope:
        rows = rows[rows["scope"] == scope]
    return rows


def coupling_summary(preds: pd.DataFrame) -> pd.DataFrame:
    """One row per coupling edit (reordering, parallel) and LM: the LM's value with its interval, the k it is read at,
    the controls' values and intervals at that k, the gap between the controls' intervals (negative: they overlap),
    and how many times the LM's lower bound exceeds the larger control's upper bound (``beyond``)."""
    out = []
    for statistic, scope, _ in COUPLING:
        for k, g in _rows(preds, statistic, scope).groupby("k"):
            by = {r.model: r for r in g.itertuples()}
            e, f = by.get("toy independent"), by.get("toy tied")
            if e is None or f is None:
                continue
            gap = max(f.lo - e.hi, e.lo - f.hi)
            for m, r in by.items():
                if m.startswith("toy"):
                    continue
                out.append(dict(statistic=statistic, k=int(k), model=m, value=r.value, lo=r.lo, hi=r.hi,
                                ensemble=e.value, ensemble_lo=e.lo, ensemble_hi=e.hi, flow=f.value, flow_lo=f.lo,
                                flow_hi=f.hi, controls_gap=gap, usable=bool(r.held_on_control and
                                                                            r.separates_controls),
                                beyond=r.lo / max(e.hi, f.hi)))
    return pd.DataFrame(out)


def _controls_span(c: pd.DataFrame) -> str:
    lo, hi = np.nanmin(c[["ensemble", "flow"]].to_numpy()), np.nanmax(c[["ensemble", "flow"]].to_numpy())
    return f"{lo:.3f}–{hi:.3f}"


def _lm_values(c: pd.DataFrame) -> str:
    size = {"order_ratio": "k", "parallel_ratio": "g"}       # blocks moved; blocks in a parallel group
    return "; ".join(f"{r.model} {_iv(r.value, r.lo, r.hi)} ({size[r.statistic]} = {r.k})" for r in c.itertuples())


def _signature(preds: pd.DataFrame) -> str:
    theta, lag = _rows(preds, "theta_update"), _rows(preds, "long_lag")
    lms = [m for m in theta["model"] if not m.startswith("toy")]
    if not lms:
        return ""
    t = {r.model: r for r in theta.itertuples()}
    g = {r.model: r for r in lag.itertuples()}
    fails = [m for m in lms if m in g and not (g[m].hi < 0.1)]
    text = ("The update-angle signature reads ensemble-like against the controls (θ(Δh_l, Δh_l+1): " +
            ", ".join(f"{m} {_iv(t[m].value, t[m].lo, t[m].hi)} rad" for m in lms) + "; long-lag cosine: " +
            ", ".join(f"{m} {_iv(g[m].value, g[m].lo, g[m].hi, 3)}" for m in lms if m in g) + ")")
    if fails:
        text += f", though {' and '.join(fails)} fail{'s' if len(fails) == 1 else ''} chapter 3's fixed rule " \
                "(long-lag cosine below 0.1)"
    return text + "; nearly orthogonal neighbouring updates do not show that the blocks are independent"


def _deletion(preds: pd.DataFrame) -> str:
    d = _rows(preds, "alpha_del")
    e = d[d["model"] == "toy independent"]
    if not len(e) or bool(e["held_on_control"].any()):
        return ""
    return ("the rescaled-deletion law (α̂ = 1 for an ensemble) fails on the ensemble's own control "
            f"(α̂ {e['value'].min():.1f}–{e['value'].max():.1f}): the derivation's ensemble model does not describe "
            "that control, whose blocks are distinct functions rather than redundant estimates of one update, so the "
            "law is not applied to the LMs")


def answer(preds: pd.DataFrame) -> str:
    """The chapter's short answer (Markdown, for its question-and-answer box): what the coupling edits show on the LMs,
    what they cannot decide and why (the controls' separation, the LMs' distance beyond both), the signature and the
    deletion law in one sentence each. The details are in :func:`conclusion`."""
    c = coupling_summary(preds)
    if not len(c):
        return "The run has no toy controls or no LM, so no prediction can be read."
    order, par = c[c["statistic"] == "order_ratio"], c[c["statistic"] == "parallel_ratio"]
    lm = lambda rows: ", ".join(f"{r.model} {_iv(r.value, r.lo, r.hi)}" for r in rows.itertuples())  # noqa: E731
    text = "**Not as the weakly coupled ensemble of the paper's derivation.** "
    if len(order) and len(par):
        text += (f"Reordering middle blocks costs {lm(order)} times what deleting the same blocks costs, and summing "
                 f"blocks run in parallel costs {lm(par)} of averaging them, where that ensemble predicts ≪ 1, as both "
                 f"toy controls show ({_controls_span(c)}). ")
    gap = order["controls_gap"].min() if len(order) else np.nan
    text += ("**Whether averaging of errors causes the LMs' 1/ℓ, these edits cannot decide:** the ensemble's control "
             "and the smooth flow's both sit at ≪ 1" + (f" (their reordering intervals {gap:.4f} apart)"
                                                        if np.isfinite(gap) and gap > 0 else "")
             + f", and the LMs lie {c['beyond'].min():.0f}–{c['beyond'].max():.0f} times beyond both, where neither "
             "calibrates. ")
    theta = _rows(preds, "theta_update")
    lms = theta[~theta["model"].str.startswith("toy")]
    if len(lms):
        text += (f"Neighbouring updates are nearly orthogonal ({lm(lms)} rad), as for the ensemble's control; ")
    dele = _deletion(preds)
    text += ("the rescaled-deletion law fails on its own control and is not applied." if dele else "")
    if not bool(c["usable"].all()):
        text += " Some coupling readings are not applied: their prediction failed on its control or the controls " \
                "do not separate."
    return text.strip()


def grammar_order(diagnostics: pd.DataFrame) -> str:
    """Chapter 7's order sensitivity in one clause: at its deepest untied member trained on the grammar, swapping two
    neighbouring blocks beside deleting one middle block (nats/symbol, 95 % t intervals over replicates), from
    :func:`depthlib.compose.analysis.diagnostic_table`; "" where the run has neither."""
    d = diagnostics[(diagnostics["family"] == "untied") & diagnostics["swap_delta"].notna()
                    & diagnostics["delete_middle_delta"].notna()]
    if not len(d):
        return ""
    r = d.loc[d["depth"].idxmax()]
    return (f"in chapter 7's untied transformers trained on a grammar that must be composed (ℓ = {int(r['depth'])}), "
            f"swapping two neighbouring blocks costs {_iv(*r[['swap_delta', 'swap_delta_lo', 'swap_delta_hi']])} "
            f"nats/symbol against {_iv(*r[['delete_middle_delta', 'delete_middle_delta_lo', 'delete_middle_delta_hi']])}"
            " for deleting one middle block")


def conclusion(preds: pd.DataFrame, grammar: pd.DataFrame | None = None) -> str:
    """The chapter's conclusion (Markdown): the claim the coupling edits support, the one they cannot support, and
    the controls' limits, each with its numbers; ``grammar``: chapter 7's diagnostic table, for the order sensitivity
    of a network built to compose (:func:`grammar_order`)."""
    c = coupling_summary(preds)
    if not len(c):
        return "No conclusion: the run lacks the toy controls or the LMs."
    order = c[c["statistic"] == "order_ratio"]
    plateau = _rows(preds, "order_ratio", "plateau")
    plateau_lms = plateau[~plateau["model"].str.startswith("toy")]
    text = ("**What the edits show.** In both LMs, moving middle blocks costs more than removing them, and running "
            "them side by side costs a large fraction of averaging them (" + _lm_values(c) + "). The weakly coupled "
            "ensemble the paper's derivation assumes (independent errors, coupling κ small) predicts ratios ≪ 1 for "
            "both, so that idealisation does not describe these LMs: their middle blocks depend on the order they run "
            "in and on their predecessors' outputs.\n\n")
    text += ("**What they cannot show.** They do not decide whether averaging of errors is what makes these LMs' loss "
             "fall as 1/ℓ. The two controls, an ensemble and a smooth flow, both give ratios ≪ 1 "
             f"({_controls_span(c)}); the flow's control is a tied teacher, whose blocks are near-copies of one block, "
             "so it is nearly interchangeable too")
    gap = order["controls_gap"].min() if len(order) else np.nan
    if np.isfinite(gap) and gap > 0:
        text += f", and at their closest the controls' reordering intervals are {gap:.4f} apart"
    text += (f". The LMs lie {c['beyond'].min():.0f}–{c['beyond'].max():.0f} times beyond the larger control, in a "
             "range neither calibrates; their \"flow side\" reading there is an extrapolation, not a calibrated "
             "flow. ")
    order7 = grammar_order(grammar) if grammar is not None else ""
    if order7:
        text += order7[0].upper() + order7[1:] + ": order sensitivity is not specific to one mechanism. "
    if len(plateau_lms) and not bool(plateau["separates_controls"].any()):
        text += ("Inside the plateau of similar blocks the controls do not separate, so the LMs' plateau reorderings ("
                 + "; ".join(f"{r.model} {_iv(r.value, r.lo, r.hi)}" for r in plateau_lms.itertuples())
                 + " times the cost of deleting the same blocks) are shown but not read. ")
    dele = _deletion(preds)
    if dele:
        text += dele[0].upper() + dele[1:] + ". "
    sig = _signature(preds)
    if sig:
        text += sig[0].upper() + sig[1:] + "."
    return text


def measurements(parts: dict[str, results.Run | None]) -> dict[str, list]:
    """Chapter 5's numbers for the verdict's claims: per LLM, reordering ÷ deleting the same middle blocks (95 %
    bootstrap over documents), applied only where the prediction held on its toy control and the two controls
    separate."""
    from depthlib.interventions import analysis
    from depthlib.interventions.chapter import statistics
    runs = {part: run for part, run in parts.items() if run is not None}
    if "toy" not in runs or len(runs) == 1:
        return {"order_matters_little": []}
    table = analysis.prediction_table(statistics(runs), [m for m in runs if m != "toy"])
    rows = table[(table["statistic"] == "order_ratio") & (table["scope"] == "middle")
                 & ~table["model"].str.startswith("toy")] if len(table) else table
    students = runs["toy"].table("students")
    controls = (f"controls: {len(students)} of chapter 3's students at ℓ = {int(students['depth'].iloc[0])}"
                + (f", {int(students['certified'].sum())} certified" if "certified" in students else ""))
    out = []
    for r in rows.itertuples():
        usable = bool(r.held_on_control and r.separates_controls)
        why = (f"reading: {r.reading} (controls separate at {r.threshold:.3g})" if usable else
               "not applied: " + ("the prediction failed on its control" if not r.held_on_control
                                  else "the two controls do not separate"))
        out.append(Measurement(r.model, r.value, r.lo, r.hi, runs[r.model].profile,
                               f"reordering ÷ deleting the same blocks, 95 % bootstrap over documents; {why}; "
                               f"{controls}", converged=usable))
    return {"order_matters_little": out}

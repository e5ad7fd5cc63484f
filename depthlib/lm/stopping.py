"""When a depth series is done: its exponent α_ℓ has stopped moving and every member is certified.

The paper's depth exponent (§3, eq. 3: L = … + c_ℓ/ℓ^α_ℓ, α_ℓ ≈ 1.2 for LLMs from Chinchilla's *converged* runs) is
a statement about trained-to-convergence models. A series trained for a fixed budget shows α_ℓ(t), which drifts while
the deep members are still catching up (chapter 6's first series: 2.70 → 1.09 → 0.81 over its last 400 steps). This
module decides from the series' own tables whether that drift is over:

* :func:`alpha_trajectory` — α_ℓ at every evaluation step with its 95 % interval from the paired bootstrap over
  held-out documents and seeds (:func:`depthlib.lm.fit.alpha_by_step`: each resample draws documents and seeds with
  replacement), and the fit of every seed on its own (:func:`seed_alphas`) beside it;
* :func:`settled` — **the exponent has stopped moving** when, over the evaluations of the last ``window`` (30 %) of
  training, α_ℓ changes (max − min of the point fits) by less than the half-width of its own interval at the last
  evaluation (an interval that runs to a bound of the searched range, α ∈ [0.02, 8], is cut off there: its
  half-width measures nothing, and the rule says so instead of passing);
* :func:`done` — the series is done when it has settled **and** every member is certified by chapter 3's continuation
  rule (:mod:`depthlib.lm.continuation`, :data:`depthlib.toy.certified.GAIN_BELOW`); otherwise it says which
  condition failed and which members are not certified.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib.errors import InputError
from depthlib.lm import fit

#: The share of training, counted back from the last step, over which α_ℓ must stay within its interval.
WINDOW = 0.3
#: Evaluations the window must hold for the rule to say anything (one evaluation cannot show a change).
MIN_EVALUATIONS = 3


def seed_alphas(doc_losses: pd.DataFrame) -> pd.DataFrame:
    """The depth law L = L∞ + c·ℓ^(−α_ℓ) fitted to each seed's held-out losses at each evaluation step (no
    resampling): step, seed, alpha, L_inf, c, at_bound. ``doc_losses``: depth, seed, step, doc_id, n_tokens,
    nll_sum (one row per held-out document)."""
    per = (doc_losses.groupby(["step", "seed", "depth"], as_index=False)
           .agg(nll=("nll_sum", "sum"), n=("n_tokens", "sum")))
    per["loss"] = per["nll"] / per["n"]                                    # token-weighted held-out loss
    rows = []
    for (step, seed), g in per.groupby(["step", "seed"]):
        f = fit.fit_depth_law(g["depth"], g["loss"])
        rows.append({"step": int(step), "seed": int(seed), "alpha": f["alpha"], "L_inf": f["L_inf"], "c": f["c"],
                     "at_bound": bool(f["at_bound"])})
    return pd.DataFrame(rows)


def alpha_trajectory(doc_losses: pd.DataFrame, n_resamples: int = 200, seed: int = 0) -> pd.DataFrame:
    """α_ℓ at every evaluation step: step, alpha (the fit to the data), lo, hi (95 % paired bootstrap over held-out
    documents and seeds), L_inf, share_undefined_or_at_bound, defined (the point fit exists and lies inside the
    searched range), and the range of the per-seed fits (seed_min, seed_max, n_seeds)."""
    t = fit.alpha_by_step(doc_losses, n_resamples, seed)
    lo, hi = fit.ALPHA_RANGE
    a = t["alpha"].to_numpy(float)
    t["defined"] = np.isfinite(a) & (a > lo * 1.05) & (a < hi * 0.95)
    seeds = seed_alphas(doc_losses).groupby("step")["alpha"].agg(["min", "max", "count"])
    t["seed_min"] = t["step"].map(seeds["min"])
    t["seed_max"] = t["step"].map(seeds["max"])
    t["n_seeds"] = t["step"].map(seeds["count"]).astype(int)
    return t


def settled(trajectory: pd.DataFrame, total_steps: int, window: float = WINDOW) -> dict:
    """Whether α_ℓ has stopped moving: over the evaluations at steps ≥ (1 − ``window``)·``total_steps`` the point
    fits change (max − min) by less than the half-width (hi − lo)/2 of the interval at the last evaluation.

    Returns settled (bool), change, half_width, alpha, lo, hi (the last evaluation's), from_step, to_step,
    n_evaluations and reason (empty when settled; else why not: the change, a fit undefined or at a bound in the
    window, the last interval reaching a bound of the searched range, or too few evaluations). ``trajectory``:
    :func:`alpha_trajectory`'s columns step, alpha, lo, hi."""
    if not 0 < window < 1:
        raise InputError(f"window must be in (0, 1), got {window}")
    if trajectory.empty:
        raise InputError("no α_ℓ trajectory to judge")
    t = trajectory.sort_values("step")
    start = (1.0 - window) * total_steps
    last = t[t["step"] >= start - 1e-9]
    final = t.iloc[-1]
    out = {"settled": False, "change": np.nan, "half_width": float(final["hi"] - final["lo"]) / 2,
           "alpha": float(final["alpha"]), "lo": float(final["lo"]), "hi": float(final["hi"]),
           "from_step": int(last["step"].min()) if len(last) else int(final["step"]),
           "to_step": int(final["step"]), "n_evaluations": int(len(last)), "window": float(window), "reason": ""}
    if len(last) < MIN_EVALUATIONS:
        out["reason"] = (f"the last {window:.0%} of training holds {len(last)} evaluation(s); the rule needs "
                         f"{MIN_EVALUATIONS}")
        return out
    lo_a, hi_a = fit.ALPHA_RANGE
    a = last["alpha"].to_numpy(float)
    bad = ~np.isfinite(a) | (a <= lo_a * 1.05) | (a >= hi_a * 0.95)
    if bad.any():
        steps = ", ".join(str(int(s)) for s in last["step"].to_numpy()[bad])
        out["reason"] = f"α_ℓ is undefined or at a search bound at step(s) {steps}"
        return out
    if not np.isfinite(out["half_width"]):
        out["reason"] = "the last evaluation's interval is undefined"
        return out
    if out["lo"] <= lo_a * 1.05 or out["hi"] >= hi_a * 0.95:
        out["reason"] = (f"the last evaluation's interval [{out['lo']:.3g}, {out['hi']:.3g}] reaches a search bound "
                         f"of α_ℓ ∈ [{lo_a:g}, {hi_a:g}]: its half-width is no measure of α_ℓ")
        return out
    out["change"] = float(a.max() - a.min())
    out["settled"] = bool(out["change"] < out["half_width"])
    if not out["settled"]:
        out["reason"] = (f"α_ℓ moved by {out['change']:.3g} over steps {out['from_step']}–{out['to_step']}, not less "
                         f"than its interval's half-width {out['half_width']:.3g}")
    return out


def done(settled_: dict, members: pd.DataFrame) -> dict:
    """The series' verdict: done (settled and every member certified), settled, n_members, n_certified, uncertified
    (``'ℓ=<depth> seed <seed> (gains …)'`` for each member not certified) and reason. ``members``: depth, seed,
    certified, gains (the continuations' relative gains, as text)."""
    cert = members["certified"].astype(bool)
    open_ = members[~cert.to_numpy()]
    uncertified = [f"ℓ={int(r.depth)} seed {int(r.seed)} (gains {r.gains})" for r in open_.itertuples()]
    reasons = ([] if settled_["settled"] else [f"not settled: {settled_['reason']}"]) + (
        [f"{len(open_)} of {len(members)} members not certified: {'; '.join(uncertified)}"] if len(open_) else [])
    return {"done": bool(settled_["settled"] and not len(open_)), "settled": bool(settled_["settled"]),
            "n_members": int(len(members)), "n_certified": int(cert.sum()), "uncertified": uncertified,
            "reason": "; ".join(reasons)}


__all__ = ["MIN_EVALUATIONS", "WINDOW", "alpha_trajectory", "done", "seed_alphas", "settled"]

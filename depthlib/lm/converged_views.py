"""Chapter 6's converged series read for the notebook: its answer paragraph, its verdict rows and its figures' tables.

Everything here is computed live from a finished ``lm-converged`` run's tables (:mod:`depthlib.lm.converged`): no
compute entry imports this module, so editing it never makes a run stale. Every function takes either the run or a
mapping of its tables (table name → DataFrame, and optionally ``"config"`` → the run's config), so the rules can be
tested on tables with known answers. Units: losses in nats per token, angles in radians, exponents dimensionless.

**The verdict rows** (:func:`verdict_rows`) decide each claim by a rule stated in its row, with three statuses:

* ``holds`` — the measurement is what the claim predicts (for an exponent: its 95 % interval lies inside the region of
  the book's verdict, :data:`depthlib.claims.CLAIMS`: α_ℓ < 2, half-way between ensemble averaging's 1 and procedural
  assembly's 3; α_θ within 0.5 of 1);
* ``contradicted`` — the measurement is what would contradict it (for an exponent: its interval lies wholly outside
  the region);
* ``undecided`` — the rule cannot say: an exponent of a series that has not stopped moving (the stopping rule,
  :mod:`depthlib.lm.stopping`) or whose members are not all certified (:mod:`depthlib.lm.continuation`), a fit that is
  undefined or at a bound of the searched range, too few depths, or an interval that straddles a region's edge.

A number from members that are still improving decides nothing, whatever its interval (the book's rule for chapters 3
and 7): the exponent rows check the stopping rule and the certificate first.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib import claims
from depthlib.lm import fit
from depthlib.sources import config as _config
from depthlib.sources import table as _table

__all__ = ["ALPHA_CLAIM", "MIN_ANGLE_DEPTHS", "STATUSES", "THETA_CLAIM", "alpha_theta", "angle_points", "answer",
           "certified_losses", "defined_exponent", "final_alpha", "fit_curves", "members_table", "repetition_check",
           "repetition_curves", "sensitivity_summary", "settings_table", "stopping", "verdict_rows",
           "verdict_table"]

STATUSES = ("holds", "contradicted", "undecided")
#: α_θ is a result only from at least this many depths with middle blocks (ℓ ≥ 4)
MIN_ANGLE_DEPTHS = 5
_CLAIMS = {c.key: c for c in claims.CLAIMS}
#: the book's region and paper value for α_ℓ of a depth series (α_ℓ < 2) and for α_θ (within 0.5 of 1)
ALPHA_CLAIM, THETA_CLAIM = _CLAIMS["series_alpha"], _CLAIMS["angle_depth"]


def defined_exponent(alpha: float) -> bool:
    """A fitted α_ℓ inside the searched range :data:`depthlib.lm.fit.ALPHA_RANGE` (not at a bound, not undefined)."""
    lo, hi = fit.ALPHA_RANGE
    return bool(np.isfinite(alpha) and lo * 1.05 < alpha < hi * 0.95)


def _at_search_bound(lo: float, hi: float) -> bool:
    a, b = fit.ALPHA_RANGE
    return bool(lo <= a * 1.05 or hi >= b * 0.95)


def _fit(source, quantity: str) -> dict:
    return _table(source, "fit").set_index("quantity").loc[quantity].to_dict()


def _iv(x: dict, digits: int = 2) -> str:
    """'value [lo, hi]' of a fit row (the interval left off when it is undefined)."""
    text = f"{x['value']:.{digits}f}"
    if np.isfinite(x.get("lo", np.nan)) and np.isfinite(x.get("hi", np.nan)):
        text += f" [{x['lo']:.{digits}f}, {x['hi']:.{digits}f}]"
    return text


# ---- tables behind the figures and the text ----------------------------------------------------------------------
def certified_losses(source, level: float = 0.95) -> pd.DataFrame:
    """Per depth, the held-out loss each member reached at the end of its best stage (the loss α_ℓ is fitted to: the
    mean over seeds of each seed's token-weighted loss) with a percentile interval from a paired bootstrap over
    held-out documents and seeds (the run's ``n_bootstrap`` and ``bootstrap_seed``): depth, val_loss, lo, hi,
    n_seeds, n_certified (members of the depth certified), n_docs."""
    from depthlib.lm.converged import final_doc_losses
    members = _table(source, "members")
    docs = final_doc_losses(_table(source, "doc_losses"), members)
    cfg = _config(source)
    depths, nll, n = fit._cube(docs, "nll_sum", "n_tokens")
    draws, seeds = fit._resample_index(nll.shape[2], nll.shape[1], int(cfg.get("n_bootstrap", 1000)),
                                       int(cfg.get("bootstrap_seed", 0)))
    boot = np.stack([(nll[:, seeds[r]][:, :, draws[r]].sum(2) / n[:, seeds[r]][:, :, draws[r]].sum(2)).mean(1)
                     for r in range(len(draws))])                                       # (resample, depth)
    q = (1 - level) / 2
    cert = members.groupby("depth")["certified"].sum()
    return pd.DataFrame({"depth": depths.astype(int), "val_loss": boot[0], "lo": np.quantile(boot, q, axis=0),
                         "hi": np.quantile(boot, 1 - q, axis=0), "n_seeds": nll.shape[1],
                         "n_certified": [int(cert.get(d, 0)) for d in depths], "n_docs": nll.shape[2]})


def fit_curves(source, grid=None, level: float = 0.95) -> pd.DataFrame:
    """The depth law on ``grid`` (depths; default 60 points spaced evenly in log ℓ over the series' depths): the fit
    to the data (``fit``), its pointwise percentile band over the bootstrap fits (``lo``, ``hi``), the refit without
    ℓ = 1 (``without_1``; NaN when ℓ = 1 is not in the series) and the envelope of the drop-one-depth refits
    (``drop_lo``, ``drop_hi``: the lowest and highest of the curves refitted without each depth in turn, from the run's
    ``sensitivity`` table). A refit that is undefined or at a bound of the searched range has no exponent and is left
    out of both."""
    if grid is None:
        depths = _members(source)["depth"]
        grid = np.geomspace(depths.min(), depths.max(), 60)
    grid = np.asarray(grid, dtype=float)
    boot = _table(source, "fit_bootstrap")
    ok = boot[np.isfinite(boot["alpha"])]
    point = boot[boot["resample"] == 0].iloc[0]

    def curve(r) -> np.ndarray:
        return (r["L_inf"] + r["c"] * grid ** -r["alpha"]) if np.isfinite(r["alpha"]) else np.full(len(grid), np.nan)
    curves = (ok["L_inf"].to_numpy()[:, None]
              + ok["c"].to_numpy()[:, None] * grid[None, :] ** -ok["alpha"].to_numpy()[:, None])
    q = (1 - level) / 2
    sens = _table(source, "sensitivity")
    drops = sens[(sens["left_out"] > 0).to_numpy() & np.array([defined_exponent(a) for a in sens["alpha"]], bool)]
    drop_curves = np.array([curve(r) for _, r in drops.iterrows()]) if len(drops) else np.full((1, len(grid)), np.nan)
    one = drops[drops["left_out"] == 1]
    with np.errstate(all="ignore"):
        return pd.DataFrame({
            "depth": grid, "fit": curve(point),
            "lo": np.quantile(curves, q, axis=0) if len(ok) else np.nan,
            "hi": np.quantile(curves, 1 - q, axis=0) if len(ok) else np.nan,
            "without_1": curve(one.iloc[0]) if len(one) else np.nan,
            "drop_lo": np.nanmin(drop_curves, axis=0), "drop_hi": np.nanmax(drop_curves, axis=0)})


def sensitivity_summary(source) -> dict:
    """The fit's sensitivity: ``all`` (every depth), ``without_1`` (the refit without ℓ = 1, None when ℓ = 1 is not in
    the series) and the range of α_ℓ over the refits without each depth in turn: ``drop_min``/``drop_max`` with the
    depth left out at each end (``drop_min_without``, ``drop_max_without``) and ``n_undefined`` (refits undefined or at
    a search bound). Each fit is a dict: alpha, lo, hi, n_depths, defined."""
    sens = _table(source, "sensitivity")

    def row(r) -> dict:
        return {"alpha": float(r["alpha"]), "lo": float(r["lo"]), "hi": float(r["hi"]),
                "n_depths": int(r["n_depths"]), "defined": defined_exponent(float(r["alpha"]))}
    every = sens[sens["left_out"] == 0].iloc[0]
    drops = sens[sens["left_out"] > 0]
    fine = drops[[defined_exponent(a) for a in drops["alpha"]]]
    one = drops[drops["left_out"] == 1]
    out = {"all": row(every), "without_1": row(one.iloc[0]) if len(one) else None,
           "n_drop": int(len(drops)), "n_undefined": int(len(drops) - len(fine)),
           "drop_min": np.nan, "drop_max": np.nan, "drop_min_without": None, "drop_max_without": None}
    if len(fine):
        lo_r, hi_r = fine.loc[fine["alpha"].idxmin()], fine.loc[fine["alpha"].idxmax()]
        out.update(drop_min=float(lo_r["alpha"]), drop_max=float(hi_r["alpha"]),
                   drop_min_without=int(lo_r["left_out"]), drop_max_without=int(hi_r["left_out"]))
    return out


def alpha_theta(source) -> dict:
    """α_θ of ⟨θ⟩_mid ∝ ℓ^(−α_θ) over the depths with middle blocks: value, n_depths, se (least squares), the 95 % t
    interval with n − 2 degrees of freedom (``lo``, ``hi``: the interval the book's verdict uses, which counts how far
    the points stray from a power law) and the bootstrap interval over held-out text (``boot_lo``, ``boot_hi``)."""
    a = _fit(source, "alpha_theta")
    n = int(a["n_depths"]) if np.isfinite(a["n_depths"]) else 0
    lo, hi = claims.t_interval(float(a["value"]), float(a["se"]), n - 2)
    return {"value": float(a["value"]), "n_depths": n, "se": float(a["se"]), "lo": lo, "hi": hi,
            "boot_lo": float(a["lo"]), "boot_hi": float(a["hi"])}


def angle_points(source, level: float = 0.95) -> pd.DataFrame:
    """Per depth, the middle-block mean angle of the probes of each member's best stage (rad, mean over seeds) with a
    percentile interval from the run's bootstrap over held-out text where the depth enters the α_θ fit: depth,
    theta_middle_mean, theta_dh_mean, lo, hi, in_fit (ℓ ≥ 4: at least two middle blocks)."""
    summary = _table(source, "probe_summary")
    out = summary.groupby("depth", as_index=False)[["theta_middle_mean", "theta_dh_mean"]].mean()
    boot = _table(source, "angle_bootstrap")
    q = (1 - level) / 2
    out["lo"] = [np.quantile(boot[f"theta_mid_{d}"], q) if f"theta_mid_{d}" in boot else np.nan for d in out["depth"]]
    out["hi"] = [np.quantile(boot[f"theta_mid_{d}"], 1 - q) if f"theta_mid_{d}" in boot else np.nan
                 for d in out["depth"]]
    out["in_fit"] = out["depth"] >= fit.ANGLE_MIN_DEPTH
    return out


def settings_table(run, profile: str) -> pd.DataFrame:
    """The converged series' family, budget and rules, one row per setting (column ``<profile> profile``): depths,
    seeds, width, heads, context, vocabulary, optimiser steps and tokens of a member's main training, the corpus and its
    training tokens, epochs of the main training, parameters and tokens per parameter of the shallowest and deepest
    member, the continuation (share of the member's steps so far, how many at most, the gain that certifies) and the
    stopping rule's window."""
    from depthlib.lm.chapter import describe
    info = describe(run)
    b = _table(run, "budget").sort_values("depth")
    shallow, deep = b.iloc[0], b.iloc[-1]
    return pd.Series({
        "depths ℓ": ", ".join(map(str, info["depths"])), "seeds per depth": len(info["seeds"]),
        "width d_model": info["d_model"], "attention heads": info["n_heads"], "context (tokens)": info["context"],
        "vocabulary (BPE tokens)": info["vocab_size"], "optimiser steps (main training)": info["steps"],
        "tokens per member (main training)": f"{info['tokens_per_member']:,}",
        "corpus (training tokens)": f"{info['corpus']} ({info['train_tokens']:,})",
        "epochs of the main training": f"{float(b['epochs'].iloc[0]):.2f}",
        "parameters, shallowest → deepest": f"{int(shallow['n_params']):,} → {int(deep['n_params']):,}",
        "tokens per parameter, shallowest → deepest": f"{shallow['tokens_per_parameter']:.1f} → "
                                                      f"{deep['tokens_per_parameter']:.1f}",
        "a continuation (share of the steps so far)": f"{100 * info['continuation']:.0f} %",
        "continuations at most": info["max_continuations"],
        "certified when a continuation gains less than": f"{100 * info['gain_below']:.0f} %",
        "stopping rule's window (last share of training)": f"{100 * info['window']:.0f} %"},
        name=f"{profile} profile").to_frame()


def stopping(source) -> dict:
    """The run's stopping-rule row (:func:`depthlib.lm.stopping.settled` and :func:`~depthlib.lm.stopping.done`) as a
    dict: settled, change, half_width, from_step, to_step, n_evaluations, window, settled_reason, done, reason, ..."""
    return _table(source, "stopping").iloc[0].to_dict()


def final_alpha(source) -> dict:
    """α_ℓ fitted to each member's best stage (value, lo, hi) and ``tokens``: the most tokens a member had seen at the
    end of its best stage (the continuations make it differ by member), where the α_ℓ(t) figure draws it."""
    return {**{k: float(v) for k, v in _fit(source, "alpha").items() if k in ("value", "lo", "hi")},
            "tokens": float(_members(source)["tokens_certified"].max())}


def members_table(source) -> pd.DataFrame:
    """One row per member, for the reader: depth, seed, held-out loss at the end of the main training and of its best
    stage (nats/token), the best stage, the continuations' gains, certified, tokens per parameter (main training)."""
    m = _members(source).sort_values(["depth", "seed"])
    return m[["depth", "seed", "main_val_loss", "val_loss", "stage", "gains", "certified",
              "tokens_per_parameter"]].rename(columns={
                  "main_val_loss": "loss, main training", "val_loss": "loss, best stage", "stage": "best stage",
                  "gains": "continuations' gains", "tokens_per_parameter": "tokens / parameter"}).round(
        {"loss, main training": 4, "loss, best stage": 4, "tokens / parameter": 1}).set_index(["depth", "seed"])


def repetition_curves(source) -> pd.DataFrame:
    """Held-out loss of every member and stage against epochs of the training stream (the run's ``curves``): depth,
    seed, stage, stream_step, epochs, val_loss, sorted for drawing."""
    c = _table(source, "curves")
    return c[["depth", "seed", "stage", "stream_step", "epochs", "val_loss"]].sort_values(
        ["depth", "seed", "stream_step", "stage"]).reset_index(drop=True)


def repetition_check(source, level: float = 0.95) -> pd.DataFrame:
    """Per member, did its held-out loss rise during the main training once it had been lowest? depth, seed, epochs
    (of the stream at the end of the main training), epochs_at_min and min_val_loss (its lowest held-out loss),
    final_val_loss, rise (final − lowest, nats/token; 0 when the last evaluation is the lowest), rise_lo, rise_hi (a
    paired percentile interval over held-out documents: the same documents at both evaluations) and rose (rise_lo >
    0). The continuations are left out: each re-warms its learning rate, which moves the loss by itself."""
    cfg = _config(source)
    n_resamples, seed = int(cfg.get("step_bootstrap", 200)), int(cfg.get("bootstrap_seed", 0))
    curves = _table(source, "curves")
    docs = _table(source, "doc_losses")
    curves, docs = curves[curves["stage"] == "main"], docs[docs["stage"] == "main"]
    q = (1 - level) / 2
    rows = []
    for (depth, s), g in curves.groupby(["depth", "seed"]):
        g = g.sort_values("stream_step")
        low, last = g.loc[g["val_loss"].idxmin()], g.iloc[-1]
        d = docs[(docs["depth"] == depth) & (docs["seed"] == s)]
        at = {k: d[d["step"] == int(r["step"])].set_index("doc_id").sort_index() for k, r in (("min", low),
                                                                                               ("end", last))}
        nll_min, nll_end = at["min"]["nll_sum"].to_numpy(float), at["end"]["nll_sum"].to_numpy(float)
        n = at["end"]["n_tokens"].to_numpy(float)
        draws, _ = fit._resample_index(len(n), 1, n_resamples, seed)
        rises = np.array([(nll_end[k].sum() - nll_min[k].sum()) / n[k].sum() for k in draws]) if len(n) else [np.nan]
        lo, hi = (float(np.quantile(rises, q)), float(np.quantile(rises, 1 - q))) if len(n) else (np.nan, np.nan)
        rows.append({"depth": int(depth), "seed": int(s), "epochs": float(last["epochs"]),
                     "epochs_at_min": float(low["epochs"]), "min_val_loss": float(low["val_loss"]),
                     "final_val_loss": float(last["val_loss"]), "rise": float(last["val_loss"] - low["val_loss"]),
                     "rise_lo": lo, "rise_hi": hi, "rose": bool(lo > 0)})
    return pd.DataFrame(rows)


# ---- the verdict rows --------------------------------------------------------------------------------------------
def _members(source) -> pd.DataFrame:
    return _table(source, "members")


def _gating(source) -> str:
    """Why an exponent of this series decides nothing yet ('' when the series has stopped moving and every member
    is certified)."""
    stop, m = stopping(source), _members(source)
    why = []
    if not bool(stop["settled"]):
        why.append("α_ℓ has not stopped moving by the stopping rule")
    open_ = m[~m["certified"].astype(bool)]
    if len(open_):
        why.append(f"{len(open_)} of {len(m)} members are not certified")
    return " and ".join(why)


def _row(key, claim, prediction, would_contradict, measured, status, reason) -> dict:
    return {"key": key, "claim": claim, "prediction": prediction, "would_contradict": would_contradict,
            "measured": measured, "status": status, "reason": reason}


def _stopping_row(source) -> dict:
    stop = stopping(source)
    window = float(stop.get("window", 0.3))
    traj = _table(source, "alpha_by_step")
    inside = traj[(traj["step"] >= stop["from_step"]) & (traj["step"] <= stop["to_step"])].sort_values("step")
    moved = (f"α_ℓ {inside['alpha'].iloc[0]:.2f} → {inside['alpha'].iloc[-1]:.2f} over steps {int(stop['from_step'])}"
             f"–{int(stop['to_step'])} ({int(stop['n_evaluations'])} evaluations)") if len(inside) else "no evaluation"
    change, half = float(stop["change"]), float(stop["half_width"])
    if bool(stop["settled"]):
        status, reason = "holds", f"change {change:.3f} < half-width {half:.3f}"
    elif np.isfinite(change) and np.isfinite(half) and change >= half:
        status, reason = "contradicted", f"change {change:.3f} ≥ half-width {half:.3f}"
    else:
        status, reason = "undecided", str(stop.get("settled_reason", "")) or "the rule cannot be applied"
    measured = moved + (f"; change (max − min) {change:.3f} against the last interval's half-width {half:.3f}"
                        if np.isfinite(change) else f"; the last interval's half-width {half:.3f}")
    return _row("stopped", "α_ℓ has stopped moving (the series' stopping rule)",
                f"over the last {100 * window:.0f} % of the main training α_ℓ changes (max − min) by less than its last "
                "interval's half-width", "a change at least as large as the half-width, every fit in the window "
                "defined", measured, status, reason)


def _certified_row(source) -> dict:
    m = _members(source)
    cfg = _config(source)
    gain = float(cfg.get("gain_below", 0.02))
    share = cfg.get("continuation", 0.5)
    open_ = m[~m["certified"].astype(bool)]
    measured = f"{len(m) - len(open_)} of {len(m)} members certified" + (
        "; not: " + "; ".join(f"ℓ = {int(r.depth)} seed {int(r.seed)} (gains {r.gains})" for r in open_.itertuples())
        if len(open_) else "")
    status = "holds" if not len(open_) else "contradicted"
    return _row("certified", "Every member is at its loss floor (the book's certificate)",
                f"a continuation of {100 * share:.0f} % of a member's steps so far, re-warmed and decayed, gains less "
                f"than {100 * gain:.0f} % of its held-out loss, for every member", "a member whose last allowed "
                f"continuation still gained {100 * gain:.0f} % or more", measured, status,
                "every member certified" if status == "holds" else f"{len(open_)} member(s) still gaining")


def _budget_row(source) -> dict:
    from depthlib.lm.budget import CHINCHILLA_TOKENS_PER_PARAMETER, floor
    b = _table(source, "budget").sort_values("depth")
    f = floor(b)
    shallow = b.iloc[0]
    measured = (f"{f['tokens_per_parameter']:.1f} tokens per parameter at ℓ = {f['depth']} (deepest), "
                f"{shallow['tokens_per_parameter']:.1f} at ℓ = {int(shallow['depth'])}")
    return _row("budget", f"The deepest member gets ≥ {CHINCHILLA_TOKENS_PER_PARAMETER:g} tokens per parameter "
                "(Chinchilla's ratio)", f"main-training tokens / all parameters ≥ {CHINCHILLA_TOKENS_PER_PARAMETER:g} "
                "at the deepest member", f"fewer than {CHINCHILLA_TOKENS_PER_PARAMETER:g}", measured,
                "holds" if f["met"] else "contradicted", "floor met" if f["met"] else "floor not met")


def _repetition_row(source) -> dict:
    rep = repetition_check(source)
    epochs = float(rep["epochs"].max())
    rose = rep[rep["rose"]]
    up = rep[(rep["rise"] > 0) & ~rep["rose"]]
    measured = f"main training: {epochs:.2f} epochs of the training stream; " + (
        f"{len(rose)} of {len(rep)} members' held-out loss rose after its minimum (earliest at epoch "
        f"{rose['epochs_at_min'].min():.2f}, by up to {rose['rise'].max():.3f} nats/token)" if len(rose) else
        "no member's held-out loss rose after its minimum beyond its interval over documents"
        + (f" ({len(up)} ended above their minimum, within it)" if len(up) else ""))
    if epochs <= 1.0:
        status, reason = "undecided", "the main training never reached a repeated window (≤ 1 epoch)"
    elif len(rose):
        status, reason = "contradicted", "a member's rise has a 95 % interval over documents above 0"
    elif len(up):
        status, reason = "undecided", "a member ended above its minimum, its interval over documents includes 0"
    else:
        status, reason = "holds", "every member ended at its lowest held-out loss or within noise of it"
    return _row("repetition", "Held-out loss does not rise once the training stream repeats (sotu, reused)",
                "no member's held-out loss ends the main training above its minimum (paired 95 % interval over "
                "held-out documents)", "a rise whose interval lies above 0 in a main training that passes one epoch",
                measured, status, reason)


def _alpha_row(source) -> dict:
    a = _fit(source, "alpha")
    boot = _table(source, "fit_bootstrap")
    point = boot[boot["resample"] == 0].iloc[0]
    m = _members(source)
    every = bool(m["certified"].astype(bool).all())
    measured = (f"α_ℓ = {_iv(a)} (fitted to each member's best held-out loss, {int(a['n_depths'])} depths; "
                f"95 % paired bootstrap over held-out documents and seeds, {int(a['n_resamples'])} resamples, "
                f"{100 * a['share_undefined_or_at_bound']:.0f} % undefined or at a bound)")
    gate = _gating(source)
    if gate:
        status, reason = "undecided", gate
    elif not defined_exponent(float(a["value"])) or bool(point["at_bound"]):
        status, reason = "undecided", "the fit is undefined or at a bound of the searched range α ∈ [0.02, 8]"
    else:
        status, reason = claims.region_status(ALPHA_CLAIM, float(a["value"]), float(a["lo"]), float(a["hi"]))
    if not every:
        measured += "; not every member is certified, so these are not converged losses"
    return _row("alpha", "A depth series trained until α_ℓ stops moving: α_ℓ ≈ 1", f"{ALPHA_CLAIM.region_text} "
                f"(paper: {ALPHA_CLAIM.paper_text})", "a 95 % interval wholly above 2 (toward procedural assembly's "
                "3)", measured, status, reason)


def _sensitivity_row(source) -> dict:
    s = sensitivity_summary(source)
    sens = _table(source, "sensitivity")
    drops = sens[sens["left_out"] > 0]
    one = s["without_1"]
    measured = ((f"without ℓ = 1: α_ℓ = {one['alpha']:.2f} [{one['lo']:.2f}, {one['hi']:.2f}]; " if one["defined"]
                 else "without ℓ = 1: no exponent (undefined or at a search bound); ") if one else "") + (
        f"leaving out one depth at a time: {s['drop_min']:.2f} (without ℓ = {s['drop_min_without']}) to "
        f"{s['drop_max']:.2f} (without ℓ = {s['drop_max_without']})" if np.isfinite(s["drop_min"]) else
        "no drop-one refit is defined") + (f"; {s['n_undefined']} of {s['n_drop']} refits undefined or at a bound"
                                           if s["n_undefined"] else "")
    gate = _gating(source)
    statuses = [("undecided", f"without ℓ = {int(r.left_out)}: the fit is undefined or at a search bound")
                if not defined_exponent(float(r.alpha)) else claims.region_status(ALPHA_CLAIM, r.alpha, r.lo, r.hi)
                for r in drops.itertuples()]
    if gate:
        status, reason = "undecided", gate
    elif not statuses:
        status, reason = "undecided", "no drop-one refit"
    elif any(st == "contradicted" for st, _ in statuses):
        left = [int(r.left_out) for r, (st, _) in zip(drops.itertuples(), statuses) if st == "contradicted"]
        status, reason = "contradicted", f"without ℓ = {', '.join(map(str, left))} the interval lies wholly above 2"
    elif all(st == "holds" for st, _ in statuses):
        status, reason = "holds", "every drop-one refit's interval lies inside the region"
    else:
        left = [int(r.left_out) for r, (st, _) in zip(drops.itertuples(), statuses) if st == "undecided"]
        status, reason = "undecided", (f"without ℓ = {', '.join(map(str, left))} the refit straddles an edge of the "
                                       "region or is undefined")
    return _row("alpha_sensitivity", "α_ℓ < 2 does not rest on one depth", "every refit without one depth (ℓ = 1 "
                "among them) keeps its 95 % interval inside α_ℓ < 2", "a refit whose interval lies wholly above 2",
                measured, status, reason)


def _continuation_row(source) -> dict:
    a, end = _fit(source, "alpha"), _fit(source, "alpha_main_end")
    half = (float(end["hi"]) - float(end["lo"])) / 2
    shift = abs(float(a["value"]) - float(end["value"]))
    measured = (f"α_ℓ = {_iv(end)} at the end of the main training, {_iv(a)} from each member's best stage")
    if not (defined_exponent(float(a["value"])) and defined_exponent(float(end["value"]))):
        status, reason = "undecided", "a fit is undefined or at a bound of the searched range"
    elif not np.isfinite(half) or _at_search_bound(float(end["lo"]), float(end["hi"])):
        status, reason = "undecided", "the main training's last interval reaches a search bound: no half-width"
    else:
        measured += f"; moved {shift:.3f} against the half-width {half:.3f}"
        status, reason = (("holds", f"{shift:.3f} < {half:.3f}") if shift < half
                          else ("contradicted", f"{shift:.3f} ≥ {half:.3f}"))
    return _row("continuations", "(Ours) The continuations leave α_ℓ where the main training left it",
                "|α_ℓ(best stages) − α_ℓ(end of main training)| < the half-width of the main training's last "
                "interval", "a shift at least as large as that half-width", measured, status, reason)


def _theta_row(source) -> dict:
    t = alpha_theta(source)
    n = t["n_depths"]
    measured = (f"α_θ = {t['value']:.2f} over {n} depths with middle blocks ("
                + (f"least-squares SE {t['se']:.2f}; 95 % t interval [{t['lo']:.2f}, {t['hi']:.2f}]"
                   if np.isfinite(t["lo"]) else "no t interval with so few depths")
                + f"; bootstrap over held-out text [{t['boot_lo']:.2f}, {t['boot_hi']:.2f}])")
    m = _members(source)
    open_ = int((~m["certified"].astype(bool)).sum())
    if n < MIN_ANGLE_DEPTHS:
        status, reason = "undecided", f"{n} depth(s) with middle blocks; the rule needs {MIN_ANGLE_DEPTHS}"
    elif open_:
        status, reason = "undecided", f"{open_} of {len(m)} members are not certified (probes of unconverged models)"
    else:
        status, reason = claims.region_status(THETA_CLAIM, t["value"], t["lo"], t["hi"])
    return _row("alpha_theta", THETA_CLAIM.claim, f"{THETA_CLAIM.region_text.split(' (')[0]} (paper: "
                f"{THETA_CLAIM.paper_text})", "a 95 % t interval wholly outside [0.5, 1.5]", measured, status,
                reason)


def verdict_rows(source) -> pd.DataFrame:
    """The converged series' verdict, one row per claim: key, claim, prediction, would_contradict, measured, status
    (one of :data:`STATUSES`) and reason (the rule's reason for the status). Rows: the stopping rule (``stopped``),
    the certificate (``certified``), the budget floor (``budget``), the repetition check (``repetition``), α_ℓ ≈ 1
    (``alpha``), its sensitivity (``alpha_sensitivity``), the continuations' effect on α_ℓ (``continuations``) and
    α_θ ≈ 1 (``alpha_theta``); each row states its own rule in its prediction and would_contradict columns."""
    return pd.DataFrame([_stopping_row(source), _certified_row(source), _budget_row(source), _repetition_row(source),
                         _alpha_row(source), _sensitivity_row(source), _continuation_row(source),
                         _theta_row(source)])


def measurements(source) -> dict[str, list]:
    """The book's verdict rows ``series_alpha`` and ``angle_depth`` from the converged series: α_ℓ fitted to every
    member's best stage and α_θ with its t interval, each a :class:`depthlib.claims.Measurement` that decides only
    where this chapter's own rows do (``usable``: the α_ℓ row and its drop-one sensitivity, or the α_θ row, are not
    "undecided" — the stopping rule, every member certified, no fit at a search bound, five depths with middle
    blocks); otherwise the note says why not."""
    rows = verdict_rows(source).set_index("key")
    cfg, a, t = _config(source), _fit(source, "alpha"), alpha_theta(source)
    depths = ", ".join(str(d) for d in sorted(cfg.get("depths", [])))
    seeds = len(cfg.get("seeds", []))

    def why(*keys):
        open_ = [rows.loc[k, "reason"] for k in keys if rows.loc[k, "status"] == "undecided"]
        return "; ".join(dict.fromkeys(open_))

    alpha_open, theta_open = why("alpha", "alpha_sensitivity"), why("alpha_theta")
    m = _members(source)
    certified = (int(m["certified"].astype(bool).sum()), len(m))
    return {
        "series_alpha": [claims.Measurement(
            f"converged series ℓ = {depths}, {seeds} seeds", float(a["value"]), float(a["lo"]), float(a["hi"]),
            cfg.get("profile"), "95 % paired bootstrap over held-out documents and seeds; each member's best stage"
            + (f"; undecided: {alpha_open}" if alpha_open else "; every member certified"),
            converged=not alpha_open, certified=certified)],
        "angle_depth": [claims.Measurement(
            f"converged series, {t['n_depths']} depths with middle blocks", t["value"],
            t["lo"] if np.isfinite(t["lo"]) else None, t["hi"] if np.isfinite(t["hi"]) else None, cfg.get("profile"),
            f"least-squares t interval over {t['n_depths']} points"
            + (f"; undecided: {theta_open}" if theta_open else ""), converged=not theta_open, certified=certified)]}


def verdict_table(source) -> pd.DataFrame:
    """:func:`verdict_rows` as the notebook shows it: indexed by claim; prediction, would contradict, measured,
    status."""
    return verdict_rows(source).set_index("claim")[["prediction", "would_contradict", "measured", "status"]].rename(
        columns={"would_contradict": "would contradict"})


# ---- the answer paragraph ----------------------------------------------------------------------------------------
def answer(source) -> str:
    """The converged series' answer, one paragraph of Markdown generated from its tables: whether α_ℓ stopped moving
    by the stopping rule (the values over the last 30 %, the change against the half-width), how many members are
    certified (the gains of those that are not), α_ℓ with its interval and its sensitivity (without ℓ = 1, the
    drop-one range), α_θ with its interval and the number of depths, tokens per parameter at the shallowest and the
    deepest member, and where the held-out loss started to rise if it did; then the status of α_ℓ ≈ 1 and α_θ ≈ 1 by
    :func:`verdict_rows`, "undecided" where the rules say so."""
    rows = verdict_rows(source).set_index("key")
    cfg = _config(source)
    stop, m = stopping(source), _members(source)
    traj = _table(source, "alpha_by_step")
    parts = []
    if cfg.get("profile") == "smoke":
        parts.append("*(smoke profile: placeholder numbers.)*")
    # 1. the stopping rule
    window = float(stop.get("window", 0.3))
    inside = traj[(traj["step"] >= stop["from_step"]) & (traj["step"] <= stop["to_step"])].sort_values("step")
    values = " → ".join(f"{a:.2f}" for a in inside["alpha"])
    head = {"holds": "**α_ℓ stopped moving by the stopping rule.**",
            "contradicted": "**α_ℓ had not stopped moving by the stopping rule.**",
            "undecided": "**Whether α_ℓ stopped moving is undecided by the stopping rule.**"}[rows.loc["stopped",
                                                                                                  "status"]]
    text = (f"{head} Over the last {100 * window:.0f} % of the main training (steps {int(stop['from_step'])}–"
            f"{int(stop['to_step'])}, {int(stop['n_evaluations'])} evaluations) α_ℓ went {values}")
    if np.isfinite(stop["change"]):
        text += (f": it changed by {stop['change']:.3f}, "
                 + ("less than" if stop["change"] < stop["half_width"] else "not less than")
                 + f" its last interval's half-width {stop['half_width']:.3f}.")
    else:
        text += f"; the rule cannot compare: {stop.get('settled_reason', '')}."
    parts.append(text)
    # 2. the certificate
    open_ = m[~m["certified"].astype(bool)]
    cert = f"**{len(m) - len(open_)} of {len(m)} members are certified** (a continuation of " \
           f"{100 * float(cfg.get('continuation', 0.5)):.0f} % of a member's steps so far, re-warmed and decayed, gained " \
           f"less than {100 * float(cfg.get('gain_below', 0.02)):.0f} %; at most {cfg.get('max_continuations', '?')} " \
           "continuations)"
    if len(open_):
        cert += "; not certified, with their continuations' gains: " + "; ".join(
            f"ℓ = {int(r.depth)} seed {int(r.seed)} ({r.gains})" for r in open_.itertuples())
    parts.append(cert + ".")
    # 3. α_ℓ and its sensitivity
    a, end = _fit(source, "alpha"), _fit(source, "alpha_main_end")
    s = sensitivity_summary(source)
    if defined_exponent(float(a["value"])):
        text = (f"Fitted to each member's best held-out loss ({'all certified' if not len(open_) else 'certified or not'}"
                f"; {int(a['n_depths'])} depths × {m['seed'].nunique()} seeds), **α_ℓ = {_iv(a)}** (95 % paired "
                f"bootstrap over held-out documents and seeds"
                + ("; the interval reaches a bound of the searched range α ∈ [0.02, 8]"
                   if _at_search_bound(float(a["lo"]), float(a["hi"])) else "")
                + f"), against {_iv(end)} at the end of the main training")
    else:
        text = (f"Fitted to each member's best held-out loss, α_ℓ is **not measured**: the fit is undefined or at a "
                f"bound of the searched range (α = {a['value']:.2f})")
    one = s["without_1"]
    if one is not None:
        text += (f". Without ℓ = 1 it is {one['alpha']:.2f} [{one['lo']:.2f}, {one['hi']:.2f}]" if one["defined"]
                 else f". Without ℓ = 1 the fit has no exponent (undefined or at a search bound, α = {one['alpha']:.2f})")
    if np.isfinite(s["drop_min"]):
        text += (f"; leaving out one depth at a time it ranges from {s['drop_min']:.2f} (without ℓ = "
                 f"{s['drop_min_without']}) to {s['drop_max']:.2f} (without ℓ = {s['drop_max_without']})")
    if s["n_undefined"]:
        text += f", {s['n_undefined']} of {s['n_drop']} refits undefined or at a bound"
    parts.append(text + ".")
    # 4. α_θ
    t = alpha_theta(source)
    parts.append(f"The middle angle's exponent (⟨θ⟩_mid ∝ ℓ^−α_θ) is **α_θ = {t['value']:.2f}** over {t['n_depths']} "
                 "depths with middle blocks (95 % t interval "
                 + (f"[{t['lo']:.2f}, {t['hi']:.2f}]" if np.isfinite(t["lo"]) else "undefined with so few depths")
                 + f"; bootstrap over held-out text [{t['boot_lo']:.2f}, {t['boot_hi']:.2f}]).")
    # 5. budget and repetition
    b = _table(source, "budget").sort_values("depth")
    shallow, deep = b.iloc[0], b.iloc[-1]
    rep = repetition_check(source)
    rose = rep[rep["rose"]]
    text = (f"Each member's main training is {int(deep['tokens']):,} tokens: {shallow['tokens_per_parameter']:.1f} "
            f"tokens per parameter at ℓ = {int(shallow['depth'])} and {deep['tokens_per_parameter']:.1f} at ℓ = "
            f"{int(deep['depth'])} (Chinchilla's 20: {'met' if rows.loc['budget', 'status'] == 'holds' else 'not met'}"
            f"), {rep['epochs'].max():.2f} epochs of the training stream. ")
    if rep["epochs"].max() <= 1.0:
        text += "No training window repeated during the main training, so it shows nothing about repetition."
    elif len(rose):
        first = rose.loc[rose["epochs_at_min"].idxmin()]
        text += (f"The held-out loss of {len(rose)} of {len(rep)} members rose after its minimum (95 % interval over "
                 f"documents above 0); it started rising earliest at epoch {first['epochs_at_min']:.2f} (ℓ = "
                 f"{int(first['depth'])}, seed {int(first['seed'])}), by up to {rose['rise'].max():.3f} nats/token.")
    else:
        text += ("No member's held-out loss rose after its minimum beyond its interval over documents, with the "
                 "stream repeating after epoch 1.")
    parts.append(text)
    # 6. the statuses
    parts.append(f"By the rules below, α_ℓ ≈ 1 (α_ℓ < 2) **{rows.loc['alpha', 'status']}** "
                 f"({rows.loc['alpha', 'reason']}) and α_θ ≈ 1 **{rows.loc['alpha_theta', 'status']}** "
                 f"({rows.loc['alpha_theta', 'reason']}).")
    return " ".join(parts)

"""Chapter 5's summaries of an intervention run: every plan's effect, and every prediction's statistic with its
95 % interval (bootstrap over documents), read against the two toy controls.

Everything here reads the runs' tables (``scores``: per plan and document, sums over the scored tokens), so a figure
or a table is redrawn from a committed run without recomputing. Per-token means pool the tokens of all documents; a
bootstrap resample draws documents with replacement and is shared by every plan of a model, so differences and
ratios of plans get paired intervals. The predictions and the calibration rule are in
:mod:`depthlib.interventions.predictions`.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.finite import pool
from depthlib.interventions import predictions as pr
from depthlib.measures import middle_blocks

#: how many bootstrap resamples every interval uses
N_BOOT = 1000


def baseline_loss(scores: pd.DataFrame, identity_text: str) -> float:
    """Mean loss per predicted token of the unedited model (nats)."""
    s = scores[scores["plan"] == identity_text]
    return float(s["loss"].sum(skipna=False) / s["n"].sum())


def _identity_text(meta: pd.DataFrame) -> str:
    return meta.loc[meta["family"] == "identity", "plan"].iloc[0]


def plan_effects(meta: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """One row per plan and rule (``meta``'s rows) with: loss (nats/token), delta_loss (vs the unedited model),
    kl (KL(unedited ‖ edited), nats/token), agree (fraction of tokens whose top-1 prediction is unchanged).

    A plan whose edited pass was not finite on some document (scores NaN: it overflowed) gets NaN for all four,
    with a warning naming it: its documents are never pooled away."""
    if "model" not in meta:
        meta, scores = meta.assign(model=""), scores.assign(model="")
    pooled = pool(scores, ["model", "plan"], ["loss", "kl", "agree", "n"])
    broken = pooled[pooled["loss"].isna() | pooled["kl"].isna()].reset_index()
    if len(broken):
        names = ", ".join(f"{r.plan}" + (f" ({r.model})" if r.model else "") for r in broken.itertuples())
        warnings.warn(f"{len(broken)} plan(s) gave non-finite log-probabilities (the edited fp32 pass overflowed) "
                      f"on some documents: {names}; their loss, delta_loss, kl and agreement are null",
                      stacklevel=2)
    per = pooled[["loss", "kl", "agree"]].div(pooled["n"], axis=0).reset_index()
    base = {m: per.loc[(per["model"] == m) & (per["plan"] == _identity_text(g)), "loss"].iloc[0]
            for m, g in meta.groupby("model")}
    per["delta_loss"] = per["loss"] - per["model"].map(base)
    return meta.merge(per, on=["model", "plan"], how="left")


def n_blocks_of(meta: pd.DataFrame) -> int:
    """ℓ of the model a plan table belongs to (its identity plan runs every block once)."""
    from depthlib.interventions.plan import parse_plan
    text = _identity_text(meta)
    last = max(int(part.split("-")[-1]) for part in text.split(","))
    return len(parse_plan(text, last + 1).steps)


# ---- the statistics of one model -------------------------------------------------------------------------
def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)


def model_statistics(meta: pd.DataFrame, scores: pd.DataFrame, signature: pd.DataFrame | None = None, *,
                     n_boot: int = N_BOOT, seed: int = 0) -> dict[tuple, np.ndarray]:
    """{(statistic, scope, k): (n_boot + 1,) vector} of one model: the estimate, then bootstrap replicates.

    statistics: ``delete`` and ``delete_rescaled`` (mean Δloss over the random middle draws of k blocks),
    ``alpha_del`` (prediction 1's exponent from the rescaled mean, with the unedited loss as L_ex: exact when the
    loss floor is 0 (the toy), a lower bound otherwise (an LM)), ``order_ratio`` (Σ Δloss of the reorderings
    over Σ Δloss of deleting the same blocks, per scope and k, and k = 0 for all of a scope), ``norm_ratio``
    (norm-matched over plain reorderings of the same sets), ``parallel_ratio`` (summed over averaged, per g),
    ``position`` (mean Δloss of deleting one block, per third of the middle: scope first | middle | last; without
    single-block deletions, the smallest k's random sets by the third their mean falls in),
    ``permutation`` (median Δloss over random orders of the whole middle), and from ``signature`` ``theta_update``
    and ``long_lag`` (bootstrap over its documents)."""
    ident = meta.loc[meta["family"] == "identity", "plan"].iloc[0]
    B = pr.bootstrap_plans(scores, ident, n_boot, seed)
    n_mid = len(range(n_blocks_of(meta))[middle_blocks(n_blocks_of(meta))])
    out: dict[tuple, np.ndarray] = {}
    dele = meta[(meta["family"] == "delete") & (meta["rule"] == "random")]
    for k, g in dele[(dele["scope"] == "middle") & ~dele["rescale"]].groupby("k"):
        out[("delete", "middle", int(k))] = B.delta(g["plan"]).mean(0)
    for k, g in dele[(dele["scope"] == "middle") & dele["rescale"]].groupby("k"):
        resc = B.delta(g["plan"]).mean(0)
        out[("delete_rescaled", "middle", int(k))] = resc
        out[("delete_rescaled_rel", "middle", int(k))] = resc / B.base
        out[("alpha_del", "middle", int(k))] = pr.deletion_alpha(resc, B.base, k, n_mid)   # L_ex = L_0
    order = meta[(meta["family"] == "order") & (meta["rule"] == "shift")]
    plain = dele[~dele["rescale"]].set_index("pair")["plan"]
    for scope, g in order.groupby("scope"):
        for k, gk in [*g.groupby("k"), (0, g)]:
            num = B.delta(gk["plan"]).sum(0)
            den = B.delta(plain.loc[gk["pair"]]).sum(0)
            out[("order_ratio", scope, int(k))] = _ratio(num, den)
    norm = meta[(meta["family"] == "order") & (meta["rule"] == "shift-norm")]
    if len(norm):
        same = order.set_index("pair").loc[norm["pair"], "plan"]
        out[("norm_ratio", "middle", int(norm["k"].iloc[0]))] = _ratio(B.delta(norm["plan"]).sum(0), B.delta(same).sum(0))
    par = meta[meta["family"] == "parallel"]
    for g_size, g in par.groupby("k"):
        s, m = g[g["rule"] == "sum"], g[g["rule"] == "mean"]
        out[("parallel_ratio", "middle", int(g_size))] = _ratio(B.delta(s["plan"]).sum(0), B.delta(m["plan"]).sum(0))
        out[("parallel_sum", "middle", int(g_size))] = B.delta(s["plan"]).mean(0)
        out[("parallel_mean", "middle", int(g_size))] = B.delta(m["plan"]).mean(0)
    each = meta[(meta["rule"] == "each") & (meta["third"] != "")]
    each = each[each["start"].isin(range(n_blocks_of(meta))[middle_blocks(n_blocks_of(meta))])]
    if each.empty:            # no single-block deletions: the smallest k's random middle sets, by their mean's third
        small = dele[(dele["scope"] == "middle") & ~dele["rescale"]]
        each = small[small["k"] == small["k"].min()] if len(small) else small
    for t, g in each.groupby("third"):
        out[("position", t, int(g["k"].iloc[0]))] = B.delta(g["plan"]).mean(0)
    perm = meta[(meta["family"] == "order") & (meta["rule"] == "permutation")]
    if len(perm):
        out[("permutation", "middle", int(perm["k"].iloc[0]))] = np.median(B.delta(perm["plan"]), 0)
    out[("baseline", "", 0)] = B.base
    if signature is not None and len(signature) >= 2:
        theta, lag = pr.bootstrap_docs(signature, ("theta_sum", "lag_sum"), ("theta_n", "lag_n"), n_boot, seed)
        out[("theta_update", "", 0)] = theta
        out[("long_lag", "", 0)] = lag
    return out


def statistics_table(per_model: dict[str, dict[tuple, np.ndarray]]) -> pd.DataFrame:
    """Tidy (model, statistic, scope, k, value, lo, hi) from :func:`model_statistics` of several models."""
    rows = []
    for model, stats in per_model.items():
        for (name, scope, k), v in stats.items():
            est, lo, hi = pr.interval(v)
            rows.append(dict(model=model, statistic=name, scope=scope, k=k, value=est, lo=lo, hi=hi))
    return pd.DataFrame(rows)


def control_of(model: str) -> str | None:
    """``independent`` or ``tied`` for a toy student's name (``toy independent r0``), else None."""
    parts = model.split()
    return parts[1] if len(parts) == 3 and parts[0] == "toy" else None


def pooled_controls(per_model: dict[str, dict[tuple, np.ndarray]], seed: int = 0) -> dict[str, dict[tuple, np.ndarray]]:
    """{"toy independent", "toy tied": statistics}: the mean over a control's replicates of each statistic, with a
    two-level bootstrap: each resample draws the replicates with replacement and, within each, the documents (its own
    bootstrap column), so the interval includes the spread between training seeds, not only between documents."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[tuple, np.ndarray]] = {}
    for kind in ("independent", "tied"):
        members = [s for m, s in per_model.items() if control_of(m) == kind]
        if not members:
            continue
        keys = set.intersection(*(set(s) for s in members))
        n_cols = min(len(next(iter(s.values()))) for s in members)
        picks = rng.integers(0, len(members), size=(n_cols, len(members)))      # replicates per column
        picks[0] = np.arange(len(members))                                       # column 0: the estimate
        stats = {}
        for key in keys:
            M = np.stack([s[key][:n_cols] for s in members])                     # (replicates, columns)
            stats[key] = M[picks, np.arange(n_cols)[:, None]].mean(1)
        out[f"toy {kind}"] = stats
    return out


#: the predictions the chapter tests: (statistic, label, the ensemble's region, what an ensemble and a smooth flow
#: predict). The region is the a-priori derivation's (predictions module); "held on its control" needs the
#: independent students' interval inside it.
PREDICTIONS = (
    ("alpha_del", "1. rescaled deletion: exponent α̂", (0.0, 1.5),
     "α = 1 (1/ℓ law)", "α = 2 (Euler flow)"),
    ("order_ratio", "3. reordering ÷ deleting the moved blocks", (-np.inf, 1.0),
     "≪ 1 (only the coupling, O(κ²))", "(κ d̄/ℓ_m)², grows with distance; ≳ 1 if compositional"),
    ("parallel_ratio", "4. parallel: summed ÷ averaged", (-np.inf, 1.0),
     "≪ 1 (sum ≈ sequence)", "(κ g/2ℓ_m)²; ≳ 1 if compositional"),
    ("theta_update", "5. θ(Δh_l, Δh_l+1) (rad)", (pr.THETA_MIN, np.pi),
     "≈ π/2", "small (aligned updates)"),
    ("long_lag", "5. long-lag cos(Δh_l, Δh_l+k), k ≥ ℓ/4", (-1.0, pr.LONG_LAG_MAX),
     "≈ 0", "high (shared direction)"),
)


def _keys(stats: dict[tuple, np.ndarray], name: str, scope: str) -> set[int]:
    return {k[2] for k in stats if k[0] == name and k[1] == scope}


def _reading(value: tuple[float, float, float], cal: dict, ensemble: tuple, flow: tuple) -> str:
    """:func:`~depthlib.interventions.predictions.side`, and "… beyond its control" where the whole interval also lies
    past that control's interval (further from the threshold than the control itself)."""
    where = pr.side(value, cal)
    _, lo, hi = value
    if where in ("ensemble", "flow"):
        ctrl = ensemble if where == "ensemble" else flow
        outward_low = (where == "ensemble") == cal["ensemble_below"]          # the control lies below the threshold
        if (outward_low and hi < ctrl[1]) or (not outward_low and lo > ctrl[2]):
            return f"{where} side, beyond the {where}'s control"
    return where


def series_statistics(series: results.Run, n_boot: int = N_BOOT, seed: int = 0,
                      min_depth: int = 4) -> dict[str, dict[tuple, np.ndarray]]:
    """{``depth series ℓ = d``: {theta_update, long_lag}} for every depth ≥ ``min_depth`` of a chapter-6 depth series
    (its ``signature`` table: the same :func:`~depthlib.measures.update_signature` on its probe
    pieces), bootstrapped over the pieces' held-out documents as the LMs' over theirs; empty for a series computed
    before the signature was measured."""
    from depthlib.data import parent_id
    if not series.has("signature"):
        return {}
    sig = series.table("signature")
    sig = sig[sig["step"] == sig["step"].max()]
    out = {}
    for depth, g in sig.groupby("depth"):
        if depth < min_depth or g["lag_n"].sum() <= 0:
            continue
        per_doc = g.assign(doc=g["doc_id"].map(parent_id)).groupby("doc")[
            ["theta_sum", "theta_n", "lag_sum", "lag_n"]].sum()
        theta, lag = pr.bootstrap_docs(per_doc, ("theta_sum", "lag_sum"), ("theta_n", "lag_n"), n_boot, seed)
        out[f"depth series ℓ = {int(depth)}"] = {("theta_update", "", 0): theta, ("long_lag", "", 0): lag}
    return out


def rule_readings(per_model: dict[str, dict[tuple, np.ndarray]]) -> pd.DataFrame:
    """Chapter 3's fixed rule on every model and pooled control: ensemble iff θ(Δh_l, Δh_l+1) > 1.2 rad and the
    long-lag cosine < 0.1 — "ensemble" when both intervals clear their thresholds, "not an ensemble" when either
    interval lies wholly on the wrong side, else "undecided"."""
    rows = []
    for model, stats in [*pooled_controls(per_model).items(), *per_model.items()]:
        if ("theta_update", "", 0) not in stats or model.startswith("toy ") and len(model.split()) == 3:
            continue
        t, g = pr.interval(stats[("theta_update", "", 0)]), pr.interval(stats[("long_lag", "", 0)])
        if t[1] > pr.THETA_MIN and g[2] < pr.LONG_LAG_MAX:
            verdict = "ensemble"
        elif t[2] < pr.THETA_MIN or g[1] > pr.LONG_LAG_MAX:
            verdict = "not an ensemble"
        else:
            verdict = "undecided"
        rows.append(dict(model=model, theta=t[0], theta_lo=t[1], theta_hi=t[2], long_lag=g[0], long_lag_lo=g[1],
                         long_lag_hi=g[2], rule=verdict))
    return pd.DataFrame(rows)


def prediction_table(per_model: dict[str, dict[tuple, np.ndarray]], lms: list[str]) -> pd.DataFrame:
    """One row per (prediction, k, model) for the two pooled controls (:func:`pooled_controls`) and the LMs: the
    measured value and its interval, whether it lies in the ensemble's region, whether the statistic held on its
    control and separates the two controls at that k (:func:`~depthlib.interventions.predictions.calibrate`), the
    threshold, and the reading of each LM. Each LM is read at the largest k (blocks deleted or moved, group size) that
    it shares with the controls; the reordering also inside the plateau where the LM has plateau plans."""
    controls = pooled_controls(per_model)
    if set(controls) != {"toy independent", "toy tied"}:
        return pd.DataFrame()
    e_stats, f_stats = controls["toy independent"], controls["toy tied"]
    rows = []
    for name, label, (r_lo, r_hi), ens, flow in PREDICTIONS:
        for scope in (("middle", "plateau") if name == "order_ratio" else ("", "middle")):
            shared = _keys(e_stats, name, scope) & _keys(f_stats, name, scope)
            if not shared:
                continue
            read: dict[int, list[str]] = {}
            for m in lms:
                common = shared & _keys(per_model.get(m, {}), name, scope) - ({0} if scope == "middle" and
                                                                            name == "order_ratio" else set())
                if common:
                    read.setdefault(max(common), []).append(m)
            if not read:
                ks = shared - ({0} if name == "order_ratio" else set())
                read = {max(ks or shared): []}
            for k, models in sorted(read.items()):
                key = (name, scope, k)
                e, f = pr.interval(e_stats[key]), pr.interval(f_stats[key])
                held = bool(np.isfinite(e[1]) and r_lo <= e[1] and e[2] <= r_hi)
                cal = pr.calibrate(e, f, log=name.endswith("ratio"))
                for model, (v, lo, hi) in [("toy independent", e), ("toy tied", f),
                                           *((m, pr.interval(per_model[m][key])) for m in models)]:
                    if model.startswith("toy"):
                        reading = "ensemble's control" if model == "toy independent" else "flow's control"
                    elif not (held and cal["separates"]):
                        reading = "not applied"
                    else:
                        reading = _reading((v, lo, hi), cal, e, f)
                        if name == "alpha_del" and reading.startswith("ensemble"):
                            reading = "undecided (α̂ is a lower bound)"
                    rows.append(dict(prediction=label + (" (plateau)" if scope == "plateau" else ""), statistic=name,
                                     scope=scope, k=k, model=model, value=v, lo=lo, hi=hi, ensemble_predicts=ens,
                                     flow_predicts=flow,
                                     in_ensemble_region=bool(np.isfinite(lo) and r_lo <= lo and hi <= r_hi),
                                     held_on_control=held, separates_controls=cal["separates"],
                                     threshold=cal["threshold"], reading=reading))
    return pd.DataFrame(rows)


def _num(v: float, lo: float, hi: float) -> str:
    if not np.isfinite(lo):
        return f"{v:.3g} (no interval)"
    return f"{v:.3g} [{lo:.3g}, {hi:.3g}]"


def verdict_sentences(table: pd.DataFrame) -> list[str]:
    """One paragraph per prediction of :func:`prediction_table`: the two controls' values, whether the prediction held
    on its control and separated the controls, and what each LM's value says; every number with its 95 % interval."""
    out = []
    for (label, name, k), g in table.groupby(["prediction", "statistic", "k"], sort=False):
        rows = {r.model: r for r in g.itertuples()}
        label = label if k == 0 else f"{label}, k = {k}"
        e, f = rows.get("toy independent"), rows.get("toy tied")
        if e is None or f is None:
            continue
        text = (f"**{label}** (ensemble: {e.ensemble_predicts}; smooth flow: {e.flow_predicts}). "
                f"Independent-teacher students {_num(e.value, e.lo, e.hi)}, tied-teacher students "
                f"{_num(f.value, f.lo, f.hi)}. ")
        if not e.held_on_control:
            text += "The ensemble's prediction **failed on its own control**, so it is not applied to the LMs"
        elif not e.separates_controls:
            text += ("It held on the ensemble's control, but the two controls' intervals overlap, so the statistic "
                     "cannot tell the mechanisms apart and is not applied to the LMs")
        else:
            text += (f"It held on the ensemble's control and separates the controls (threshold {e.threshold:.3g}, "
                     "half-way between them)")
        lm = [r for m, r in rows.items() if not m.startswith("toy")]
        if lm:
            text += "; measured on the LMs: " + "; ".join(
                f"{r.model} {_num(r.value, r.lo, r.hi)} — {r.reading}" for r in lm)
        out.append(text + ".")
    return out


def rule_sentence(rules: pd.DataFrame) -> str:
    """One sentence: chapter 3's fixed rule (θ > 1.2 rad and long-lag cosine < 0.1) on every model of
    :func:`rule_readings`."""
    parts = [f"{r.model}: θ = {_num(r.theta, r.theta_lo, r.theta_hi)} rad, long-lag cos = "
             f"{_num(r.long_lag, r.long_lag_lo, r.long_lag_hi)} → {r.rule}" for r in rules.itertuples()]
    return "**Chapter 3's fixed rule** (ensemble iff θ(Δh_l, Δh_l+1) > 1.2 rad and long-lag cosine < 0.1): " + \
        "; ".join(parts) + "."


def middle_sizes(plans: pd.DataFrame) -> dict[str, int]:
    """{model: ℓ_m}, the number of middle blocks of each model in a plans table."""
    return {m: len(range(n_blocks_of(g))[middle_blocks(n_blocks_of(g))]) for m, g in plans.groupby("model", sort=False)}


#: what the chapter's tables call the statistics and columns (a reader meets no code names)
READER_NAMES = {
    "delete": "delete k blocks: Δloss (nats/token)",
    "delete_rescaled": "delete k, rest rescaled: Δloss (nats/token)",
    "delete_rescaled_rel": "delete k, rest rescaled: Δloss ÷ unedited loss",
    "alpha_del": "rescaled deletion: exponent α̂",
    "order_ratio": "reordering ÷ deleting the moved blocks",
    "norm_ratio": "norm-matched ÷ plain reordering",
    "permutation": "random order of the whole middle: median Δloss (nats/token)",
    "parallel_ratio": "parallel: summed ÷ averaged",
    "held_on_control": "held on its control", "separates_controls": "controls separate",
    "theta": "θ(Δh_l, Δh_l+1) (rad)", "theta_lo": "θ: 95 % low", "theta_hi": "θ: 95 % high",
    "long_lag": "long-lag cosine", "long_lag_lo": "long-lag: 95 % low", "long_lag_hi": "long-lag: 95 % high",
    "rule": "chapter 3's rule",
}


def for_reader(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with reader names (:data:`READER_NAMES`) for its statistics and columns and "—" for what a model
    does not have (a k or a plan family it was not run at)."""
    named = table.rename(index=READER_NAMES, columns=READER_NAMES)
    return named.astype(object).where(named.notna(), "—")


def formatted(table: pd.DataFrame, index: str | list[str], columns: str = "model", digits: int = 3) -> pd.DataFrame:
    """A wide table of "value [lo, hi]" strings (95 % intervals) from a tidy table with value, lo and hi, with
    reader names (:func:`for_reader`)."""
    t = table.copy()
    t["shown"] = [f"{v:.{digits}g} [{lo:.{digits}g}, {hi:.{digits}g}]" if np.isfinite(lo) else f"{v:.{digits}g}"
                  for v, lo, hi in zip(t["value"], t["lo"], t["hi"])]
    order = list(dict.fromkeys(t[columns]))
    return for_reader(t.pivot_table(index=index, columns=columns, values="shown", aggfunc="first", sort=False)[order])


def order_pairs(effects: pd.DataFrame) -> pd.DataFrame:
    """One row per reordering of a deleted set (prediction 3, like with like): model, scope, k, distance d̄, the
    reordering's Δloss, the Δloss of deleting the same blocks, their ratio, and the norm-matched reordering's Δloss."""
    order = effects[(effects["family"] == "order") & (effects["rule"] == "shift")]
    dele = effects[(effects["family"] == "delete") & (effects["rule"] == "random") & ~effects["rescale"]]
    norm = effects[(effects["family"] == "order") & (effects["rule"] == "shift-norm")]
    out = order.merge(dele[["model", "pair", "delta_loss"]], on=["model", "pair"], suffixes=("", "_deleted"))
    out = out.merge(norm[["model", "pair", "delta_loss"]].rename(columns={"delta_loss": "delta_loss_norm_matched"}),
                    on=["model", "pair"], how="left")
    out["ratio"] = out["delta_loss"] / out["delta_loss_deleted"]
    return out[["model", "scope", "k", "blocks", "distance", "third", "delta_loss", "delta_loss_deleted", "ratio",
                "delta_loss_norm_matched"]]


def norm_profile(influence: pd.DataFrame) -> pd.DataFrame:
    """Per model and block: the mean stream norm ‖h_i‖ at the block's input over that at the first middle block's,
    and the relative depth (i + ½)/ℓ (the ranking documents' means)."""
    rows = []
    for model, g in influence.groupby("model", sort=False):
        g = g.sort_values("block")
        L = len(g)
        first = g["norm"].to_numpy()[middle_blocks(L)][0]
        rows.append(pd.DataFrame({"model": model, "block": g["block"], "depth": (g["block"] + 0.5) / L,
                                  "norm": g["norm"], "relative_norm": g["norm"] / first,
                                  "plateau": g["plateau"] if "plateau" in g else False}))
    return pd.concat(rows, ignore_index=True)


def norm_sentence(per_model: dict[str, dict[tuple, np.ndarray]]) -> str:
    """One sentence: how much of a reordering's cost is left when each moved block's update is norm-matched
    (``norm_ratio``: norm-matched over plain, the same sets), per LM and pooled control."""
    parts = []
    for model, stats in [*pooled_controls(per_model).items(), *per_model.items()]:
        if model.startswith("toy ") and len(model.split()) == 3:
            continue
        for key in sorted(k for k in stats if k[0] == "norm_ratio"):
            v, lo, hi = pr.interval(stats[key])
            parts.append(f"{model} (k = {key[2]}) {_num(v, lo, hi)}")
    if not parts:
        return ""
    return ("**Norm or order?** A norm-matched reordering (each moved block's update scaled to the stream norm of its new "
            "slot) costs, as a fraction of the plain reordering of the same blocks: " + "; ".join(parts) +
            ". A fraction near 1 means the stream's norm explains little of the cost; order does.")

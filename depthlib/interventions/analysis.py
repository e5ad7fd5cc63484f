"""Chapter 5's summaries of an intervention run: the effect of every plan, deletion curves, and the ensemble fit.

Everything here reads the run's tables (``scores``: per plan and document, sums over predicted tokens), so a
figure is redrawn from a committed run without recomputing. Per-token means pool the tokens of all documents.
The deletion curve's fit is the ensemble prediction (paper §3: L(ℓ) = L∞ + c/ℓ^α, so removing k of ℓ similar
blocks costs ΔL(k) = c[(ℓ − k)^−α − ℓ^−α]); its interval is a bootstrap over documents.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

GROUP = ["model"]


def baseline_loss(scores: pd.DataFrame, identity_text: str) -> float:
    """Mean loss per predicted token of the unedited model (nats)."""
    s = scores[scores["plan"] == identity_text]
    return float(s["loss"].sum() / s["n"].sum())


def _identity_text(meta: pd.DataFrame) -> str:
    return meta.loc[meta["family"] == "identity", "plan"].iloc[0]


def plan_effects(meta: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """One row per plan and rule (``meta``'s rows) with: loss (nats/token), delta_loss (vs the unedited model),
    kl (KL(unedited ‖ edited), nats/token), agree (fraction of tokens whose top-1 prediction is unchanged)."""
    if "model" not in meta:
        meta, scores = meta.assign(model=""), scores.assign(model="")
    pooled = scores.groupby(["model", "plan"], sort=False)[["loss", "kl", "agree", "n"]].sum()
    per = pooled[["loss", "kl", "agree"]].div(pooled["n"], axis=0).reset_index()
    base = {m: per.loc[(per["model"] == m) & (per["plan"] == _identity_text(g)), "loss"].iloc[0]
            for m, g in meta.groupby("model")}
    per["delta_loss"] = per["loss"] - per["model"].map(base)
    return meta.merge(per, on=["model", "plan"], how="left")


def deletion_curves(effects: pd.DataFrame) -> pd.DataFrame:
    """Δloss and KL against k for every deletion rule (with and without rescaling): mean, min and max over the
    random draws (one value for the deterministic rules)."""
    d = effects[(effects["family"] == "delete") & (effects["rule"] != "each")]
    return (d.groupby(["model", "rule", "rescale", "k"])
             .agg(delta_loss=("delta_loss", "mean"), delta_min=("delta_loss", "min"), delta_max=("delta_loss", "max"),
                  kl=("kl", "mean"), draws=("delta_loss", "size")).reset_index())


def _fit_alpha(k: np.ndarray, dl: np.ndarray, n_blocks: int) -> tuple[float, float]:
    """Least-squares (α, c) of ΔL(k) = c[(ℓ − k)^−α − ℓ^−α]; c has a closed form for each α."""
    def basis(a):
        return (n_blocks - k) ** -a - float(n_blocks) ** -a

    def sse(a):
        b = basis(a)
        c = float(b @ dl / (b @ b))
        return float(((dl - c * b) ** 2).sum())
    grid = np.linspace(0.05, 8.0, 160)
    a0 = grid[int(np.argmin([sse(a) for a in grid]))]
    res = minimize_scalar(sse, bounds=(max(0.01, a0 - 0.1), a0 + 0.1), method="bounded")
    a = float(res.x)
    b = basis(a)
    return a, float(b @ dl / (b @ b))


def ensemble_fit(meta: pd.DataFrame, scores: pd.DataFrame, n_blocks: int, *, rule: str = "random",
                 rescale: bool = False, model: str | None = None, n_boot: int = 500, seed: int = 0) -> dict:
    """Fit ΔL(k) = c[(ℓ − k)^−α − ℓ^−α] to the mean deletion curve of ``rule`` (ℓ = ``n_blocks``).

    Returns α, c, the 95 % bootstrap interval of α (documents resampled with replacement; the draws and ks fixed),
    and the points fitted. Needs at least three values of k.
    """
    if model is not None:
        meta, scores = meta[meta["model"] == model], scores[scores["model"] == model]
    rows = meta[(meta["family"] == "delete") & (meta["rule"] == rule) & (meta["rescale"] == rescale)]
    ident = _identity_text(meta)
    wide = scores.pivot_table(index="plan", columns="doc_index", values=["loss", "n"], aggfunc="sum")
    loss, n = wide["loss"], wide["n"].loc[ident]
    ks = np.array(sorted(rows["k"].unique()), dtype=float)
    if len(ks) < 3:
        return dict(alpha=np.nan, c=np.nan, alpha_lo=np.nan, alpha_hi=np.nan, ks=ks.tolist(), delta=[])
    plans_by_k = [rows.loc[rows["k"] == k, "plan"].tolist() for k in ks]

    def curve(w: np.ndarray) -> np.ndarray:                  # w: weight of each document (bootstrap counts)
        tokens = float((n.to_numpy() * w).sum())
        base = float((loss.loc[ident].to_numpy() * w).sum()) / tokens
        return np.array([np.mean([(loss.loc[p].to_numpy() * w).sum() / tokens - base for p in ps]) for ps in plans_by_k])
    dl = curve(np.ones(len(n)))
    alpha, c = _fit_alpha(ks, dl, n_blocks)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        w = np.bincount(rng.integers(0, len(n), len(n)), minlength=len(n)).astype(float)
        boots.append(_fit_alpha(ks, curve(w), n_blocks)[0])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return dict(alpha=alpha, c=c, alpha_lo=float(lo), alpha_hi=float(hi), ks=ks.tolist(), delta=dl.tolist(),
                n_boot=n_boot, rule=rule, rescale=rescale, n_blocks=n_blocks)


def key_numbers(effects: pd.DataFrame, ks=(1, 2, 4, 8), groups=(2, 4, 8)) -> dict:
    """The closing note's numbers for one model: Δloss for deleting k middle blocks (best rule, random mean),
    the spread over permutations, reversed, adjacent swaps, and the parallel-sum and averaged Δloss per g."""
    out: dict = {}
    dele = effects[(effects["family"] == "delete") & (~effects["rescale"])]
    for k in ks:
        rules = dele[dele["k"] == k].groupby("rule")["delta_loss"].mean()
        best = rules.drop(["first", "last", "each"], errors="ignore")
        if len(best):
            out[f"delete_{k}"] = {"best_rule": best.idxmin(), "best": float(best.min()),
                                  "random_mean": float(rules.get("random", np.nan))}
    order = effects[effects["family"] == "order"]
    perm = order[order["rule"] == "permutation"]["delta_loss"]
    if len(perm):
        out["permutations"] = {"min": float(perm.min()), "median": float(perm.median()), "max": float(perm.max()),
                               "n": int(len(perm))}
    for rule in ("reverse", "swap"):
        v = order[order["rule"] == rule]["delta_loss"]
        if len(v):
            out[rule] = {"mean": float(v.mean()), "max": float(v.max()), "n": int(len(v))}
    par = effects[effects["family"] == "parallel"]
    for g in groups:
        for rule in ("sum", "mean"):
            v = par[(par["k"] == g) & (par["rule"] == rule)]["delta_loss"]
            if len(v):
                out[f"parallel_{rule}_{g}"] = {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max()),
                                               "positions": int(len(v))}
    return out

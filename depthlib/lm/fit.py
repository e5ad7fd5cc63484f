"""Fits of the depth series: L(ℓ) = L∞ + c·ℓ^(−α_ℓ) and the middle-angle exponent, with bootstrap intervals.

The paper's decomposed law (§3, eq. 3) has the depth term c_ℓ/ℓ^α_ℓ on top of the width and data terms; at one fixed
width and one data budget those are a constant, L∞ here. For fixed α the law is linear in (L∞, c), so the fit profiles
α over a grid (least squares in L, c ≥ 0) and refines the best grid point; it never fails to converge, which a bootstrap
of thousands of refits needs. The middle-angle exponent (paper Result 1, ⟨θ⟩_mid ∝ ℓ^(−α_θ)) is
:func:`depthlib.measures.fit_power_law` on the per-depth middle-block means of :func:`depthlib.probes.metrics.middle_mean`.

Intervals come from a **paired bootstrap over held-out documents**: each resample draws documents with replacement,
the same draw for every depth, recomputes each depth's token-weighted loss (or angle) and refits; with several seeds the
seeds are drawn with replacement too. Percentile intervals.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from depthlib.data import parent_id
from depthlib.errors import InputError
from depthlib.measures import fit_power_law
from depthlib.probes.metrics import middle_mean

#: α_ℓ is searched in this range (a fit at an end of it is flagged ``at_bound``).
ALPHA_RANGE = (0.02, 8.0)
_GRID = np.geomspace(*ALPHA_RANGE, 240)
#: The middle-angle exponent is fitted over depths with at least two middle blocks (ℓ ≥ 4: blocks 2 … ℓ−1).
ANGLE_MIN_DEPTH = 4


def _linear(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least squares y ≈ a + c·x with c ≥ 0: (a, c, rss)."""
    xm, ym = x.mean(), y.mean()
    sxx = ((x - xm) ** 2).sum()
    c = max(float(((x - xm) * (y - ym)).sum() / sxx), 0.0) if sxx > 0 else 0.0
    a = ym - c * xm
    return a, c, float(((y - a - c * x) ** 2).sum())


def fit_depth_law(depths, losses) -> dict:
    """Fit L(ℓ) = L∞ + c·ℓ^(−α) to one loss per depth: alpha, L_inf, c, rmse (nats), n, at_bound.

    NaNs where fewer than three distinct depths (three parameters) or where the losses do not fall with depth (c = 0)."""
    ell = np.asarray(depths, dtype=float)
    y = np.asarray(losses, dtype=float)
    ok = np.isfinite(ell) & np.isfinite(y) & (ell > 0)
    ell, y = ell[ok], y[ok]
    nan = {"alpha": np.nan, "L_inf": np.nan, "c": np.nan, "rmse": np.nan, "n": int(len(ell)), "at_bound": False}
    if len(np.unique(ell)) < 3:
        return nan
    rss = np.array([_linear(ell ** -a, y)[2] for a in _GRID])
    i = int(np.argmin(rss))
    lo, hi = _GRID[max(i - 1, 0)], _GRID[min(i + 1, len(_GRID) - 1)]
    best = minimize_scalar(lambda a: _linear(ell ** -a, y)[2], bounds=(lo, hi), method="bounded",
                           options={"xatol": 1e-6})
    alpha = float(best.x) if best.fun <= rss[i] else float(_GRID[i])
    a, c, r = _linear(ell ** -alpha, y)
    if c <= 0:
        return nan
    at_bound = alpha <= ALPHA_RANGE[0] * 1.05 or alpha >= ALPHA_RANGE[1] * 0.95
    return {"alpha": alpha, "L_inf": a, "c": c, "rmse": float(np.sqrt(r / len(y))), "n": int(len(y)),
            "at_bound": bool(at_bound)}


def depth_losses(doc_losses: pd.DataFrame, step: int | None = None) -> pd.DataFrame:
    """Held-out loss per depth (token-weighted over documents, then the mean over seeds) at ``step`` (default: last)."""
    t = _at_step(doc_losses, step)
    per_seed = t.groupby(["depth", "seed"]).agg(nll=("nll_sum", "sum"), n=("n_tokens", "sum")).reset_index()
    per_seed["val_loss"] = per_seed["nll"] / per_seed["n"]
    return per_seed.groupby("depth", as_index=False).agg(val_loss=("val_loss", "mean"), n_seeds=("seed", "nunique"),
                                                         n_tokens=("n", "first"))


def _at_step(doc_losses: pd.DataFrame, step: int | None) -> pd.DataFrame:
    if doc_losses.empty:
        raise InputError("no held-out losses to fit")
    step = int(doc_losses["step"].max()) if step is None else int(step)
    t = doc_losses[doc_losses["step"] == step]
    if t.empty:
        raise InputError(f"no held-out losses at step {step}")
    return t


def _resample_index(n_docs: int, n_seeds: int, n_resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Document and seed draws of every resample: (n_resamples, n_docs) and (n_resamples, n_seeds) indices;
    resample 0 is the data itself."""
    rng = np.random.default_rng(seed)
    docs = rng.integers(0, n_docs, size=(n_resamples, n_docs))
    seeds = rng.integers(0, n_seeds, size=(n_resamples, n_seeds)) if n_seeds > 1 else np.zeros((n_resamples, 1), int)
    docs[0], seeds[0] = np.arange(n_docs), np.arange(n_seeds)
    return docs, seeds


def _cube(t: pd.DataFrame, value: str, weight: str):
    """(depth, seed, doc) arrays of ``value`` and ``weight`` from a tidy table (every cell must be present)."""
    depths, seeds, docs = (np.sort(t[c].unique()) for c in ("depth", "seed", "doc_id"))
    idx = pd.MultiIndex.from_product([depths, seeds, docs], names=["depth", "seed", "doc_id"])
    g = t.set_index(["depth", "seed", "doc_id"])[[value, weight]].reindex(idx)
    if g.isna().any().any():
        raise InputError("the held-out table is incomplete: every depth and seed needs every document")
    shape = (len(depths), len(seeds), len(docs))
    return depths, g[value].to_numpy(float).reshape(shape), g[weight].to_numpy(float).reshape(shape)


def bootstrap_depth_law(doc_losses: pd.DataFrame, n_resamples: int = 1000, seed: int = 0,
                        step: int | None = None) -> pd.DataFrame:
    """The depth law refitted on ``n_resamples`` paired bootstrap resamples of the held-out documents (and seeds):
    one row per resample (0 = the data itself) with alpha, L_inf, c, rmse, at_bound."""
    t = _at_step(doc_losses, step)
    depths, nll, n = _cube(t, "nll_sum", "n_tokens")
    docs, seeds = _resample_index(nll.shape[2], nll.shape[1], n_resamples, seed)
    rows = []
    for r in range(n_resamples):
        sub_nll = nll[:, seeds[r]][:, :, docs[r]].sum(2)                   # (depth, seed)
        sub_n = n[:, seeds[r]][:, :, docs[r]].sum(2)
        loss = (sub_nll / sub_n).mean(1)                                   # (depth,)
        rows.append({"resample": r, **fit_depth_law(depths, loss)})
    return pd.DataFrame(rows)


def interval(values, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the finite ``values`` (NaNs where none)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return np.nan, np.nan
    q = (1 - level) / 2
    return float(np.quantile(v, q)), float(np.quantile(v, 1 - q))


def summarize_bootstrap(boot: pd.DataFrame, columns=("alpha", "L_inf", "c"), level: float = 0.95) -> dict:
    """Point estimate (resample 0), percentile interval and the share of resamples whose fit is undefined or at a bound."""
    point = boot[boot["resample"] == 0].iloc[0]
    out = {}
    for col in columns:
        lo, hi = interval(boot[col], level)
        out[col] = {"value": float(point[col]), "lo": lo, "hi": hi}
    bad = ~np.isfinite(boot["alpha"].to_numpy(float)) | boot.get("at_bound", pd.Series(False, index=boot.index)).to_numpy(bool)
    out["n_resamples"] = int(len(boot))
    out["share_undefined_or_at_bound"] = float(bad.mean())
    out["level"] = level
    return out


def alpha_by_step(doc_losses: pd.DataFrame, n_resamples: int = 200, seed: int = 0) -> pd.DataFrame:
    """α_ℓ (point and bootstrap interval) at every evaluation step: does the exponent drift during training?"""
    rows = []
    for step in sorted(doc_losses["step"].unique()):
        boot = bootstrap_depth_law(doc_losses, n_resamples, seed, step=int(step))
        s = summarize_bootstrap(boot)
        rows.append({"step": int(step), "alpha": s["alpha"]["value"], "lo": s["alpha"]["lo"], "hi": s["alpha"]["hi"],
                     "L_inf": s["L_inf"]["value"], "share_undefined_or_at_bound": s["share_undefined_or_at_bound"]})
    return pd.DataFrame(rows)


# ---- the middle-layer angle against depth (paper Result 1, Fig. 2d) -------------------------------------------
def angle_exponent(summary: pd.DataFrame, column: str = "theta_middle_mean", min_depth: int = ANGLE_MIN_DEPTH,
                   step: int | None = None) -> dict:
    """Least-squares ⟨θ⟩_mid ∝ ℓ^(−α_θ) over depths ≥ ``min_depth`` (mean over seeds): alpha, c, alpha_se, n."""
    t = summary if step is None else summary[summary["step"] == step]
    if step is None and "step" in t:
        t = t[t["step"] == t.groupby("depth")["step"].transform("max")]
    t = t[t["depth"] >= min_depth].groupby("depth", as_index=False)[column].mean()
    return fit_power_law(t["depth"], t[column])


def _angle_cubes(probe_docs: pd.DataFrame) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per depth, (seed, doc, block) arrays of token-weighted angle sums and token counts from a tidy probe table."""
    out = {}
    for depth, g in probe_docs.groupby("depth"):
        n_seed, n_doc = g["seed"].nunique(), g["doc_id"].nunique()
        sums = g.pivot_table(index=["seed", "doc_id"], columns="block", values="theta_sum", aggfunc="sum")
        cnt = g.pivot_table(index=["seed", "doc_id"], columns="block", values="n_valid", aggfunc="sum")
        if len(sums) != n_seed * n_doc:
            raise InputError(f"the probe table of depth {depth} is incomplete: every seed needs every document")
        out[int(depth)] = (sums.to_numpy(float).reshape(n_seed, n_doc, -1), cnt.to_numpy(float).reshape(n_seed, n_doc, -1))
    return out


def middle_angles(cubes: dict, docs: np.ndarray, seeds: np.ndarray) -> dict[int, float]:
    """Middle-block mean angle (rad) per depth for one draw of held-out documents and seeds (mean over seeds)."""
    out = {}
    for depth, (sums, cnt) in cubes.items():
        s = sums[seeds][:, docs].sum(1)                     # (seed, block)
        c = cnt[seeds][:, docs].sum(1)
        out[depth] = float(np.mean([middle_mean(s[k] / np.maximum(c[k], 1)) for k in range(len(seeds))]))
    return out


def tidy_probe_docs(docs: pd.DataFrame, n_blocks: int) -> pd.DataFrame:
    """A probe run's per-piece table (doc_id '<id>#k', n_valid, theta_0 … theta_{L−1}) as tidy per-(document, block)
    token-weighted sums: doc_id (the held-out document), block, n_valid, theta_sum."""
    rows = []
    parent = docs["doc_id"].map(parent_id)
    for l in range(n_blocks):
        rows.append(pd.DataFrame({"doc_id": parent, "block": l, "n_valid": docs["n_valid"],
                                  "theta_sum": docs[f"theta_{l}"] * docs["n_valid"]}))
    t = pd.concat(rows, ignore_index=True)
    return t.groupby(["doc_id", "block"], as_index=False).agg(n_valid=("n_valid", "sum"), theta_sum=("theta_sum", "sum"))


def bootstrap_angle_exponent(probe_docs: pd.DataFrame, n_resamples: int = 1000, seed: int = 0,
                             min_depth: int = ANGLE_MIN_DEPTH) -> pd.DataFrame:
    """The middle-angle exponent on paired bootstrap resamples of held-out documents (the final probes, depths ≥
    ``min_depth``): one row per resample (0 = the data) with alpha and the middle angle of each depth."""
    t = probe_docs[probe_docs["depth"] >= min_depth]
    if "step" in t:
        t = t[t["step"] == t.groupby("depth")["step"].transform("max")]
    if t["depth"].nunique() < 2:
        return pd.DataFrame({"resample": [0], "alpha": [np.nan]})
    docs, seeds = _resample_index(t["doc_id"].nunique(), t["seed"].nunique(), n_resamples, seed)
    cubes = _angle_cubes(t)
    rows = []
    for r in range(n_resamples):
        angles = middle_angles(cubes, docs[r], seeds[r])
        fit = fit_power_law(list(angles), list(angles.values()))
        rows.append({"resample": r, "alpha": fit["alpha"], **{f"theta_mid_{d}": v for d, v in angles.items()}})
    return pd.DataFrame(rows)

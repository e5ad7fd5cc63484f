"""Uncertainty and validation of the converged fit (paper App. B): bootstrap, held-out splits, exclusion scans.

Everything is vectorised over many fits at once by expressing a data subset as per-row weights (bootstrap counts,
0/1 train or exclusion masks), all solved in one batched Levenberg–Marquardt call.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from depthlib.errors import InputError
from depthlib.scaling.fits import gauss_newton_se
from depthlib.scaling.model import index, parameter_names, predict
from depthlib.scaling.points import N_EXCLUDED_PAPER, Points, check_enough_points, excluded_mask, select_points
from depthlib.scaling.solvers import PAPER_START, adam_paper, converged_theta, levenberg_marquardt


def bootstrap_counts(n_points: int, n_resamples: int, seed: int = 0) -> np.ndarray:
    """How often each of ``n_points`` rows is drawn in each of ``n_resamples`` resamples (with replacement), (S, n):
    the weights :func:`bootstrap` solves with. The same ``seed`` gives the same draws."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_points, size=(n_resamples, n_points))
    counts = np.zeros((n_resamples, n_points))
    np.add.at(counts, (np.arange(n_resamples)[:, None], idx), 1.0)
    return counts


def bootstrap(df: pd.DataFrame, n_resamples: int = 1000, seed: int = 0, *, exclude: int = N_EXCLUDED_PAPER,
              depth_offset: int = 0, law: str = "decomposed", objective: str = "mse",
              resamples: Iterable[int] | None = None) -> pd.DataFrame:
    """Converged fits of ``n_resamples`` bootstrap resamples (rows drawn with replacement), batched.

    Each resample is a vector of row counts used as weights, so all resamples are solved in one batched
    LM call started at the full-data minimiser (each problem of the batch is solved independently of the others).
    ``resamples`` solves only those resamples of the same draw (a replay of part of a run).
    Returns one row per resample: θ, α's and a converged flag.
    """
    if n_resamples < 1:
        raise InputError(f"n_resamples must be >= 1, got {n_resamples}")
    if objective != "mse":
        raise InputError("the bootstrap uses the paper's objective (mse)")
    points = select_points(df, exclude, depth_offset, law)
    counts = bootstrap_counts(points.n, n_resamples, seed)
    chosen = np.arange(n_resamples) if resamples is None else np.asarray(list(resamples), int)
    if chosen.size == 0 or chosen.min() < 0 or chosen.max() >= n_resamples:
        raise InputError(f"resamples must be indices in [0, {n_resamples - 1}]")
    theta0, _ = converged_theta(points)
    theta, cost, ok = levenberg_marquardt(np.tile(theta0, (len(chosen), 1)), points.x, points.loss, counts[chosen])
    out = pd.DataFrame(theta, columns=parameter_names(law))
    out.insert(0, "resample", chosen)
    out["risk"] = 100 * cost / points.n
    out["converged"] = ok
    return out


def bootstrap_summary(boot: pd.DataFrame, level: float = 0.95) -> dict:
    """Mean, std and percentile interval of each exponent and L0 over the resamples."""
    lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    out = {"n_resamples": int(len(boot)), "n_converged": int(boot["converged"].sum()), "level": level}
    for col in [c for c in boot.columns if c.startswith("alpha_")] + ["L0"]:
        v = boot[col].to_numpy()
        out[col] = {"mean": round(float(v.mean()), 4), "std": round(float(v.std(ddof=1)), 4),
                    "lo": round(float(np.percentile(v, lo)), 4), "hi": round(float(np.percentile(v, hi)), 4)}
    return out


def held_out(df: pd.DataFrame, n_splits: int = 10, test_fraction: float = 0.2, seed: int = 0, *,
             exclude: int = N_EXCLUDED_PAPER, depth_offset: int = 0) -> pd.DataFrame:
    """Random train/test splits (80/20 as App. B.3): converged fit on train, errors on both.

    Returns one row per split: train/test log-MSE and mean relative error, α's.
    """
    points = select_points(df, exclude, depth_offset)
    rng = np.random.default_rng(seed)
    n_test = int(test_fraction * points.n)
    check_enough_points(points.n - n_test, "decomposed", "each training split")
    masks = np.ones((n_splits, points.n))
    for s in range(n_splits):
        masks[s, rng.permutation(points.n)[:n_test]] = 0.0
    theta0, _ = converged_theta(points)
    theta, _, ok = levenberg_marquardt(np.tile(theta0, (n_splits, 1)), points.x, points.loss, masks)
    pred, _ = predict(theta, points.x)
    log_sq = (np.log(points.loss)[None] - np.log(pred)) ** 2
    rel = np.abs(points.loss[None] - pred) / points.loss[None]
    train, test = masks == 1, masks == 0
    rows = []
    for s in range(n_splits):
        rows.append({"split": s, "n_train": int(train[s].sum()), "n_test": int(test[s].sum()),
                     "train_log_mse": log_sq[s, train[s]].mean(), "test_log_mse": log_sq[s, test[s]].mean(),
                     "train_rel_err": rel[s, train[s]].mean(), "test_rel_err": rel[s, test[s]].mean(),
                     **{name: theta[s, index("decomposed", name)] for name in ("alpha_m", "alpha_l", "alpha_D")},
                     "converged": bool(ok[s])})
    return pd.DataFrame(rows)


def exclusion_scan(df: pd.DataFrame, excludes: Iterable[int] = range(0, 101), depth_offsets: Iterable[int] = (0, 2),
                   preset: str = "converged", steps: int = 50_000) -> pd.DataFrame:
    """α's (± Gauss–Newton SE) against the number of excluded rows and the depth offset (App. B.3).

    All exclusion counts of one offset are solved together: an exclusion is a 0/1 weight on all rows.
    preset "paper" runs the paper's Adam (batched) instead of the converged solver.
    """
    excludes = list(excludes)
    rows = []
    for offset in depth_offsets:
        allpts = select_points(df, 0, offset)
        masks = np.array([~excluded_mask(allpts.loss, k) for k in excludes], float)   # (K, n)
        for k, mask in zip(excludes, masks):
            check_enough_points(int(mask.sum()), "decomposed", f"excluding {k} of {allpts.n} rows, the fit")
        if preset == "paper":
            thetas = adam_paper(allpts, masks, steps=steps)
        else:
            # every exclusion from two starts (the paper's and the k=40 minimiser): one batched call
            starts = np.vstack([PAPER_START, converged_theta(select_points(df, N_EXCLUDED_PAPER, offset))[0]])
            theta, cost, _ = levenberg_marquardt(np.repeat(starts, len(excludes), 0), allpts.x, allpts.loss,
                                                 np.tile(masks, (len(starts), 1)))
            theta, cost = theta.reshape(len(starts), len(excludes), -1), cost.reshape(len(starts), len(excludes))
            thetas = theta[np.argmin(cost, 0), np.arange(len(excludes))]
        for k, theta, mask in zip(excludes, thetas, masks):
            kept = Points("decomposed", allpts.x[mask == 1], allpts.loss[mask == 1], allpts.frame[mask == 1], offset)
            se = gauss_newton_se(theta, kept)
            pred = predict(theta[None], kept.x)[0][0]
            rows.append({"exclude": k, "depth_offset": offset, "n_points": kept.n, "preset": preset,
                         **dict(zip(parameter_names("decomposed"), theta)),
                         **{f"se_{a}": se[index("decomposed", a)] for a in ("alpha_m", "alpha_l", "alpha_D")},
                         "mean_rel_err": float(np.mean(np.abs(kept.loss - pred) / kept.loss))})
    return pd.DataFrame(rows)

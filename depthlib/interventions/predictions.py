"""What ensemble averaging and a smooth flow predict for each intervention, and the statistics that test it (ch. 5).

Two idealised middles of ℓ_m blocks, each block adding an update f_i(h) to the residual stream (paper §1, §5):

* **Ensemble averaging.** f_i(h) = (μ + ε_i + κ A_i h)/ℓ_m: a shared drift μ, independent zero-mean errors ε_i of
  variance σ² and a weak coupling κ (A_i independent, unit scale). The unedited output is h_0 + μ + ε̄ with
  ε̄ = Σε_i/ℓ_m, so its excess loss (squared error) is L_ex = σ²/ℓ_m: the paper's 1/ℓ law.
* **A smooth flow** (procedural assembly). f_i(h) = F(h, t_i)/ℓ_m, t_i = (i + ½)/ℓ_m, the Euler discretisation of
  dh/dt = F(h, t); the excess loss is the discretisation error, ∝ ℓ_m^−2 for Euler steps.

Predictions (derived in chapter 5's notebook, tested on synthetic middles in ``tests/test_interventions_predictions``):

1. **Deletion, rescaled.** Deleting k blocks and multiplying the remaining middle updates by ℓ_m/(ℓ_m − k) keeps the
   drift (or the flow's total time) and leaves ℓ_m − k members. Ensemble: L_ex becomes σ²/(ℓ_m − k), so
   ΔL/L_ex = (ℓ_m/(ℓ_m − k))^α − 1 with α = 1; a smooth flow integrated with ℓ_m − k Euler steps: α = 2. The
   estimate :func:`deletion_alpha` inverts this for α. With the unedited loss L_0 ≥ L_ex in place of L_ex (the LMs,
   whose loss floor is unknown) it is a lower bound on α.
2. **Deletion, plain.** Removes k/ℓ_m of the drift (or skips k/ℓ_m of the flow): ΔL ≈ (k/ℓ_m)²‖μ‖² − kσ²/ℓ_m² for
   both. Plain deletion does not tell them apart; it is the like-with-like reference for reordering.
3. **Reordering.** The sum of the updates does not depend on their order; only the coupling does. Moving block i by
   |π(i) − i| positions changes its input by ≈ |π(i) − i| updates, so the error is the coupling times that.
   Ensemble: R = ΔL(permutation) / ΔL(deleting the same moved blocks) = O(κ²) ≪ 1. Smooth flow of turning rate κ
   (radians per unit time): R ≈ (κ d̄/ℓ_m)² grows as the square of the mean displacement d̄ = mean |π(i) − i|;
   compositional assembly (each block needs its predecessor's output): R ≳ 1.
4. **Parallel groups.** g consecutive blocks on one input, updates summed: the error is again only the coupling
   (sum ≈ sequence); averaged: (g − 1)/g of the group's updates are lost, like deleting g − 1 blocks.
   S_g = ΔL(summed)/ΔL(averaged) = O(κ²) ≪ 1 for an ensemble; ≈ (κ g/(2ℓ_m))² for a smooth flow (one Euler step of
   size g/ℓ_m instead of g steps); ≳ 1 for compositional assembly.
5. **The long-lag signature** (chapter 3's rule): an ensemble without a dominant drift has θ(Δh_l, Δh_{l+1}) ≈ π/2
   and long-lag cos(Δh_l, Δh_{l+k}), k ≥ ℓ/4, ≈ 0; a smooth flow has θ small and the long-lag cosine high.

Every number gets a 95 % bootstrap interval over documents (:func:`bootstrap_plans`); a statistic is used on the LMs
only if its prediction held on its own control and it separated the two controls (:func:`calibrate`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from depthlib.errors import InputError
from depthlib.measures import middle_blocks

#: chapter 3's rule: an ensemble iff θ(Δh_l, Δh_{l+1}) > THETA_MIN and the long-lag cosine < LONG_LAG_MAX
THETA_MIN, LONG_LAG_MAX = 1.2, 0.1
#: the exponent of the rescaled-deletion law each mechanism predicts (ensemble: the 1/ℓ law; Euler flow: 1/ℓ²)
ALPHA_ENSEMBLE, ALPHA_FLOW = 1.0, 2.0


# ---- closed forms --------------------------------------------------------------------------------------------
def rescaled_deletion(k, n_middle: int, alpha: float):
    """ΔL/L_ex of deleting k of ``n_middle`` blocks with the rest rescaled: (ℓ_m/(ℓ_m − k))^α − 1 (prediction 1)."""
    k = np.asarray(k, dtype=float)
    return (n_middle / (n_middle - k)) ** alpha - 1.0


def deletion_alpha(delta, excess, k, n_middle: int):
    """α̂ = log(1 + ΔL/L_ex) / log(ℓ_m/(ℓ_m − k)): the exponent a rescaled deletion's cost implies (prediction 1).
    NaN where ΔL/L_ex ≤ −1 or k is not in 1..ℓ_m − 1."""
    delta, excess, k = (np.asarray(v, dtype=float) for v in (delta, excess, k))
    ok = (k >= 1) & (k < n_middle) & (delta / excess > -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log1p(delta / excess) / np.log(n_middle / (n_middle - k))
    return np.where(ok, out, np.nan)


def mean_displacement(order: Sequence[int]) -> float:
    """d̄ = mean |π(i) − i| over the blocks a reordering moves, in positions of the stream (0 for no move):
    ``order`` lists the blocks in their new slots, the slots being the same blocks sorted (slot j sits where block
    sorted(order)[j] sat)."""
    slots = sorted(order)
    moved = [abs(b - s) for b, s in zip(order, slots) if b != s]
    return float(np.mean(moved)) if moved else 0.0


def flow_order_ratio(turn_rate: float, displacement, n_middle: int):
    """R ≈ (κ d̄/ℓ_m)² of a smooth flow turning at κ rad per unit time (prediction 3; its scale, not a fit)."""
    return (turn_rate * np.asarray(displacement, dtype=float) / n_middle) ** 2


# ---- the plateau rule --------------------------------------------------------------------------------------
def plateau(step_angle: Sequence[float], n_blocks: int, tol: float = 1.5, min_blocks: int = 4) -> list[int]:
    """The plateau of similar middle blocks: the longest run of consecutive middle blocks whose step angle
    θ(h_i, h_{i+1}) (measured on the ranking documents) lies within a factor ``tol`` of the median middle step
    angle; ties go to the earliest run. [] when the longest run is shorter than ``min_blocks``.

    ``step_angle`` has one value per block (0 … n_blocks − 1)."""
    a = np.asarray(step_angle, dtype=float)
    if a.shape != (n_blocks,):
        raise InputError(f"plateau: need one step angle per block ({n_blocks}), got {a.shape}")
    if not tol > 1:
        raise InputError(f"plateau: tol must be > 1, got {tol}")
    mid = list(range(n_blocks))[middle_blocks(n_blocks)]
    med = float(np.median(a[mid]))
    inside = [b for b in mid if med / tol <= a[b] <= med * tol]
    best: list[int] = []
    run: list[int] = []
    for b in mid:
        if b in inside and (not run or b == run[-1] + 1):
            run.append(b)
        elif b in inside:
            run = [b]
        else:
            run = []
        if len(run) > len(best):
            best = list(run)
    return best if len(best) >= min_blocks else []


def third(blocks: Sequence[int], n_blocks: int) -> str:
    """Which third of the middle the mean of ``blocks`` falls in: "first", "middle" or "last"."""
    mid = list(range(n_blocks))[middle_blocks(n_blocks)]
    x = (float(np.mean(blocks)) - mid[0] + 0.5) / len(mid)
    return ("first", "middle", "last")[min(2, max(0, int(x * 3)))]


def ensemble_by_rule(theta: float, long_lag: float) -> bool:
    """Chapter 3's rule: ensemble iff θ(Δh_l, Δh_{l+1}) > 1.2 rad and the long-lag cosine < 0.1."""
    return bool(theta > THETA_MIN and long_lag < LONG_LAG_MAX)


# ---- intervals: bootstrap over documents ----------------------------------------------------------------------
def bootstrap_weights(n_docs: int, n_boot: int, seed: int = 0) -> np.ndarray:
    """(n_boot + 1, n_docs) resampling counts: row 0 all ones (the estimate itself), then documents drawn with
    replacement (multinomial counts), keyed by ``seed``."""
    if n_docs < 2:
        raise InputError(f"a bootstrap over documents needs at least 2 documents, got {n_docs}")
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(n_docs, np.full(n_docs, 1.0 / n_docs), size=n_boot).astype(float)
    return np.vstack([np.ones(n_docs), draws])


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(estimate, lo, hi) from a vector whose first entry is the estimate and the rest bootstrap replicates
    (percentile interval, NaN replicates dropped; NaN when fewer than 20 are finite)."""
    samples = np.asarray(samples, dtype=float)
    est, reps = samples[0], samples[1:]
    reps = reps[np.isfinite(reps)]
    if len(reps) < 20 or not np.isfinite(est):
        return float(est), float("nan"), float("nan")
    q = (1 - level) / 2
    return float(est), float(np.quantile(reps, q)), float(np.quantile(reps, 1 - q))


@dataclass
class PooledLosses:
    """Per-plan mean loss per token under every bootstrap weight: ``loss[plan]`` is a (n_boot + 1,) vector."""

    plans: list[str]
    matrix: np.ndarray          # (plans, n_boot + 1)
    base: np.ndarray            # (n_boot + 1,) the identity's

    def delta(self, plans: Sequence[str]) -> np.ndarray:
        """(len(plans), n_boot + 1) loss change of each plan from the unedited model."""
        idx = [self.plans.index(p) for p in plans]
        return self.matrix[idx] - self.base[None]


def bootstrap_plans(scores: pd.DataFrame, identity_text: str, n_boot: int = 1000, seed: int = 0,
                    value: str = "loss") -> PooledLosses:
    """Pool every plan's per-document sums of ``value`` (columns plan, doc_index, n, value) into a mean per token,
    under the same bootstrap resamples of the documents for every plan (so differences and ratios of plans get
    paired intervals). Raises one line if a plan lacks a document another has."""
    wide = scores.pivot_table(index="plan", columns="doc_index", values=value, aggfunc="sum", dropna=False)
    n = scores[scores["plan"] == identity_text].set_index("doc_index")["n"].reindex(wide.columns)
    if n.isna().any() or wide.isna().to_numpy().any():
        raise InputError("bootstrap: every plan needs a finite score on every document")
    W = bootstrap_weights(wide.shape[1], n_boot, seed)                      # (B+1, docs)
    pooled = wide.to_numpy(float) @ W.T / (W @ n.to_numpy(float))[None]   # (plans, B+1)
    plans = list(wide.index)
    return PooledLosses(plans, pooled, pooled[plans.index(identity_text)])


def bootstrap_docs(table: pd.DataFrame, sums: Sequence[str], counts: Sequence[str], n_boot: int = 1000,
                   seed: int = 0) -> np.ndarray:
    """(len(sums), n_boot + 1) pooled means Σsum/Σcount of per-document rows (e.g. :func:`depthlib.measures.update_signature`)."""
    W = bootstrap_weights(len(table), n_boot, seed)
    return np.stack([(W @ table[s].to_numpy(float)) / (W @ table[c].to_numpy(float)) for s, c in zip(sums, counts)])


# ---- the calibration rule ------------------------------------------------------------------------------------
def calibrate(ensemble: tuple[float, float, float], flow: tuple[float, float, float], *, log: bool = False) -> dict:
    """Whether a statistic separates its two controls and where its threshold lies.

    ``ensemble`` and ``flow`` are (value, lo, hi) of the independent-teacher and tied-teacher students. The statistic
    separates them when their 95 % intervals are disjoint; the threshold is then half-way between the two values (on
    a log scale for ratios, ``log``) and the ensemble side is the side of the independent control."""
    (e, elo, ehi), (f, flo, fhi) = ensemble, flow
    finite = all(np.isfinite(v) for v in (e, elo, ehi, f, flo, fhi))
    separates = bool(finite and (ehi < flo or fhi < elo))
    if not separates:
        return {"separates": False, "threshold": float("nan"), "ensemble_below": bool(e < f) if finite else None}
    if log and e > 0 and f > 0:
        thr = math.exp((math.log(e) + math.log(f)) / 2)
    else:
        thr = (e + f) / 2
    return {"separates": True, "threshold": float(thr), "ensemble_below": bool(e < f)}


def side(value: tuple[float, float, float], calibration: dict) -> str:
    """Where an interval lies against a calibrated threshold: "ensemble", "flow" or "undecided"."""
    if not calibration.get("separates"):
        return "not applied"
    _, lo, hi = value
    thr, below = calibration["threshold"], calibration["ensemble_below"]
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "undecided"
    if hi < thr:
        return "ensemble" if below else "flow"
    if lo > thr:
        return "flow" if below else "ensemble"
    return "undecided"


__all__ = ["ALPHA_ENSEMBLE", "ALPHA_FLOW", "LONG_LAG_MAX", "THETA_MIN", "PooledLosses", "bootstrap_docs",
           "bootstrap_plans", "bootstrap_weights", "calibrate", "deletion_alpha", "ensemble_by_rule",
           "flow_order_ratio", "interval", "mean_displacement", "plateau", "rescaled_deletion", "side", "third"]

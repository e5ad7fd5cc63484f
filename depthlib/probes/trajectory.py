"""Angle trajectories: PCA, the two ideal trajectories, clusters, and the depth law (paper §2.7).

Each valid token has an angle trajectory (θ_0, …, θ_{L−1}). The paper (Fig. 2b) runs PCA over all
tokens and finds two clusters: 99.6 % near an ideal "updated evenly in the middle" trajectory and 0.4 %,
mostly document-initial tokens, near "stops updating early". The exact ideal vectors and cluster rule
are not published; our construction (our reading of paper App. A):

* both ideals share the empirical mean first and last angles (θ_0, θ_{L−1});
* **evenly**: every middle angle equals the empirical middle-layer mean;
* **stops early**: the middle angles equal that mean up to block ``stop_after`` and are 0 after it;
* tokens, centred with the token mean, are projected on the top-2 principal components; clusters come
  from 2-means in the full angle space started at the two ideals, and each cluster is named by the
  ideal its centre is nearer to.

Result 1 (Fig. 2d): the middle-layer mean angle falls with depth ∝ 1/ℓ across a model family;
:func:`fit_depth_exponent` fits ⟨θ⟩_mid = c · ℓ^(−α) by least squares in log–log space.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib.errors import InputError
from depthlib.measures import fit_power_law, middle_blocks


def theta_matrix(tokens: pd.DataFrame) -> np.ndarray:
    """(N, L) angle trajectories from a reservoir table with columns theta_0 … theta_{L−1}."""
    cols = sorted((c for c in tokens.columns if c.startswith("theta_")), key=lambda c: int(c.split("_")[1]))
    if not cols:
        raise InputError("token table has no theta_<l> columns")
    return tokens[cols].to_numpy(dtype=np.float64)


def ideal_trajectories(theta: np.ndarray, stop_after: int = 2) -> dict[str, np.ndarray]:
    """The two ideal (L,) trajectories built from the data's own first, last and middle angles."""
    n_layers = theta.shape[1]
    mean = theta.mean(0)
    mid = middle_blocks(n_layers)
    middle_value = float(mean[mid].mean()) if n_layers > 2 else float(mean.mean())
    even = np.full(n_layers, middle_value)
    even[0], even[-1] = mean[0], mean[-1]
    stop = even.copy()
    stop[1 + stop_after:n_layers - 1] = 0.0
    return {"evenly": even, "stops early": stop}


@dataclass
class TrajectoryAnalysis:
    """PCA coordinates of tokens and ideals, cluster labels and fractions."""

    coords: np.ndarray               # (N, 2) token projections on PC1, PC2
    ideal_coords: dict[str, np.ndarray]  # name -> (2,)
    explained: np.ndarray            # (2,) explained-variance ratios
    label: np.ndarray                # (N,) name of the nearer ideal's cluster for each token
    fractions: dict[str, float]      # cluster name -> fraction of tokens
    ideals: dict[str, np.ndarray]    # name -> (L,) ideal trajectory
    cluster_means: dict[str, np.ndarray]  # name -> (L,) mean trajectory of the tokens in that cluster


def analyze_trajectories(theta: np.ndarray, stop_after: int = 2, n_iter: int = 50) -> TrajectoryAnalysis:
    """PCA of angle trajectories, the two ideals and 2-means clusters seeded at the ideals."""
    theta = np.asarray(theta, dtype=np.float64)
    if theta.ndim != 2 or theta.shape[0] < 3:
        raise InputError(f"need an (N >= 3, L) matrix of angle trajectories, got shape {theta.shape}")
    ideals = ideal_trajectories(theta, stop_after)
    mean = theta.mean(0)
    _, s, vt = np.linalg.svd(theta - mean, full_matrices=False)
    pcs = vt[:2]                                                   # (2, L)
    sign = np.sign(pcs.sum(1, keepdims=True))                      # deterministic orientation
    pcs = pcs * np.where(sign == 0, 1, sign)
    explained = (s[:2] ** 2) / max((s ** 2).sum(), 1e-300)
    coords = (theta - mean) @ pcs.T
    ideal_coords = {k: (v - mean) @ pcs.T for k, v in ideals.items()}
    names = list(ideals)
    centres = np.stack([ideals[k] for k in names])                 # (2, L)
    for _ in range(n_iter):
        d = ((theta[:, None, :] - centres[None]) ** 2).sum(-1)     # (N, 2)
        assign = d.argmin(1)
        new = np.stack([theta[assign == k].mean(0) if np.any(assign == k) else centres[k] for k in range(2)])
        if np.allclose(new, centres):
            break
        centres = new
    # name each cluster by the ideal its centre is nearer to (both may map to one ideal: then merged)
    to_ideal = [int(np.argmin([((c - ideals[n]) ** 2).sum() for n in names])) for c in centres]
    label = np.array([names[to_ideal[a]] for a in assign], dtype=object)
    fractions = {n: float(np.mean(label == n)) for n in names}
    means = {n: theta[label == n].mean(0) for n in names if np.any(label == n)}
    return TrajectoryAnalysis(coords, ideal_coords, explained, label, fractions, ideals, means)


def small_cluster_tokens(tokens: pd.DataFrame, analysis: TrajectoryAnalysis, special_ids=()) -> dict:
    """Who falls in the smaller cluster: its share of tokens, of special tokens (``special_ids``, e.g. Gemma's
    <bos>) and of document positions 0 and ≤ 1, its share once special tokens are left out, and its size relative
    to the position-0 share of all sampled tokens (≈ 1 means "the first token of each document", so the cluster's
    size says how long the documents are, not how many tokens stop early)."""
    small = min(analysis.fractions, key=analysis.fractions.get)
    inside = analysis.label == small
    pos = tokens["position"].to_numpy()
    special = (tokens["token"].isin(list(special_ids)).to_numpy() if "token" in tokens
               else np.zeros(len(tokens), dtype=bool))
    n = int(inside.sum())
    pos0 = float(np.mean(pos == 0))
    return dict(cluster=small, n_tokens=n,
                fraction_of_tokens=float(inside.mean()),
                share_position_0=float(np.mean(pos[inside] == 0)) if n else float("nan"),
                share_position_le_1=float(np.mean(pos[inside] <= 1)) if n else float("nan"),
                share_special=float(np.mean(special[inside])) if n else float("nan"),
                fraction_without_special=float(inside[~special].mean()) if (~special).any() else float("nan"),
                share_position_0_overall=pos0,
                ratio_to_position_0_share=float(inside.mean() / pos0) if pos0 else float("nan"))


def fit_depth_exponent(depths, middle_angles) -> dict:
    """Least-squares fit of ⟨θ⟩_mid = c · ℓ^(−α) in log–log space (paper Result 1 expects α ≈ 1)."""
    fit = fit_power_law(depths, middle_angles)
    if fit["n"] < 2 or not np.isfinite(fit["alpha"]):
        raise InputError("the depth fit needs at least two models of different depth")
    return dict(alpha=fit["alpha"], coefficient=fit["c"], n_models=fit["n"])

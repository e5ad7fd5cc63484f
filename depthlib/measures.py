"""Measurements shared by the chapters: angles between vectors, log–log power-law fits and the update signature.

The LLM probes (paper §2) and the toy students' signatures (§4) use the same angle θ(a, b), the toy α_ℓ fits and
the middle-angle-vs-depth fit use the same power law, and chapters 5, 6 and 7 read the same update signature
(:func:`update_signature`), so each is written once here.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
import torch

_EPS = 1e-12


def angle_between(a: torch.Tensor, b: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """θ(a, b) = arccos(clamp(cos(a, b), −1, 1)) along ``dim``, in radians (0 when a or b is zero).

    Computed in at least fp32 (bf16/fp16 inputs are promoted: a bf16 cosine near 1 cannot resolve angles
    below ≈ 0.09 rad); fp64 inputs stay fp64.
    """
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    a, b = a.to(dtype), b.to(dtype)
    dot = (a * b).sum(dim)
    denom = a.norm(dim=dim) * b.norm(dim=dim)
    cos = torch.where(denom > 0, dot / denom.clamp_min(_EPS), torch.ones_like(dot))
    return torch.arccos(cos.clamp(-1.0, 1.0))


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> dict:
    """Least-squares fit of log y = log c − α log x. Returns α, c, the SE of α and the number of points
    (NaNs when fewer than two distinct finite points)."""
    lx = np.log(np.asarray(x, dtype=float))
    ly = np.log(np.asarray(y, dtype=float))
    ok = np.isfinite(lx) & np.isfinite(ly)
    lx, ly = lx[ok], ly[ok]
    n = len(lx)
    if n < 2 or np.ptp(lx) == 0:
        return {"alpha": np.nan, "c": np.nan, "alpha_se": np.nan, "n": n}
    A = np.vstack([np.ones(n), lx]).T
    coef, *_ = np.linalg.lstsq(A, ly, rcond=None)
    resid = ly - A @ coef
    se = math.sqrt(resid @ resid / (n - 2) / np.sum((lx - lx.mean()) ** 2)) if n > 2 else np.nan
    return {"alpha": float(-coef[1]), "c": math.exp(coef[0]), "alpha_se": se, "n": n}


def middle_blocks(n_blocks: int) -> slice:
    """Indices of per-block quantities θ(h_l, h_{l+1}), l = 0..L−1, over the middle blocks: all but the first and
    the last block (the paper's l = 2..ℓ−1, §2.7 item 3); a network of one or two blocks keeps them all."""
    return slice(1, n_blocks - 1) if n_blocks > 2 else slice(0, n_blocks)


def middle_update_pairs(n_blocks: int) -> slice:
    """Indices of the update angles θ(Δh_l, Δh_{l+1}), l = 0..L−2, whose two blocks are both middle blocks (no pair
    with the first or the last block), so θ and θ(Δh) average over the same blocks; short networks keep all."""
    return slice(1, n_blocks - 2) if n_blocks > 3 else slice(0, max(n_blocks - 1, 0))


# ---- the long-lag signature ------------------------------------------------------------------------------------
def update_signature(states: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> pd.DataFrame:
    """Per document: θ(Δh_l, Δh_{l+1}) summed over middle update pairs and tokens, and cos(Δh_l, Δh_{l+k}) summed over
    middle pairs with k ≥ ℓ/4 and tokens, with their counts (columns doc, theta_sum, theta_n, lag_sum, lag_n), so that
    documents pool and bootstrap. ``states`` ℓ+1 tensors (docs, tokens, d) or (docs, d); ``mask`` (docs, tokens)."""
    h = torch.stack([s.double() for s in states])                         # (ℓ+1, docs, [tokens,] d)
    if h.dim() == 3:
        h = h[:, :, None]
    dh = h[1:] - h[:-1]                                                    # (ℓ, docs, tokens, d)
    L = dh.shape[0]
    m = torch.ones(dh.shape[1:3], dtype=torch.bool) if mask is None else mask.bool()
    w = m.double()                                                         # (docs, tokens)
    pairs = middle_update_pairs(L)
    theta = angle_between(dh[:-1], dh[1:])[pairs]                          # (pairs, docs, tokens)
    u = dh / dh.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    mid = u[middle_blocks(L)]                                              # (n_mid, docs, tokens, d)
    n_mid = mid.shape[0]
    lag_sum = torch.zeros(dh.shape[1], dtype=torch.float64)
    lag_n = torch.zeros(dh.shape[1], dtype=torch.float64)
    for k in range(max(1, math.ceil(L / 4)), n_mid):
        c = (mid[:-k] * mid[k:]).sum(-1)                                   # (n_mid-k, docs, tokens)
        lag_sum += (c * w).sum((0, 2))
        lag_n += w.sum(-1) * c.shape[0]
    return pd.DataFrame({"doc": np.arange(dh.shape[1]), "theta_sum": (theta * w).sum((0, 2)).numpy(),
                         "theta_n": (w.sum(-1) * theta.shape[0]).numpy(), "lag_sum": lag_sum.numpy(),
                         "lag_n": lag_n.numpy()})

"""Which blocks to drop: Gromov et al.'s angular distance and ShortGPT's Block Influence (chapter 5).

Both rules read the unedited residual stream h_0 … h_L (h_i is the input of block i, 0-indexed):

* angular distance (Gromov et al. 2024, "The Unreasonable Ineffectiveness of the Deeper Layers"):
  d(h_i, h_{i+n}) = θ(h_i, h_{i+n}) / π; to drop n blocks, drop blocks i*, …, i*+n−1 with i* = argmin_i d(h_i, h_{i+n}).
  Gromov et al. use the last token of each prompt; here d is averaged over every real (non-padding) token.
* Block Influence (Men et al. 2024, ShortGPT): BI_i = 1 − mean cos(h_i, h_{i+1}); drop the k blocks of lowest BI.

θ is :func:`depthlib.measures.angle_between`, the one angle of the book.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from depthlib.measures import angle_between


class BlockSimilarity:
    """Streamed sums over real tokens of θ(h_i, h_{i+n}) for every pair and of cos(h_i, h_{i+1})."""

    def __init__(self, n_blocks: int):
        self.n_blocks = n_blocks
        self.angle_sum = torch.zeros(n_blocks + 1, n_blocks + 1, dtype=torch.float64)   # [i, j]: Σ θ(h_i, h_j), i < j
        self.cos_sum = torch.zeros(n_blocks, dtype=torch.float64)                      # [i]: Σ cos(h_i, h_{i+1})
        self.norm_sum = torch.zeros(n_blocks + 1, dtype=torch.float64)                 # [i]: Σ ‖h_i‖
        self.n_tokens = 0

    def update(self, states: list[torch.Tensor], mask: torch.Tensor | None = None) -> None:
        """Add one batch: ``states`` L+1 tensors (..., d_model); ``mask`` (...) True on real tokens."""
        X = torch.stack([s.float() for s in states])                       # (L+1, ..., d)
        X = X[:, mask] if mask is not None else X.reshape(X.shape[0], -1, X.shape[-1])   # (L+1, N, d)
        for n in range(1, self.n_blocks + 1):
            theta = angle_between(X[:-n], X[n:])                           # (L+1-n, N)
            i = torch.arange(self.n_blocks + 1 - n)
            self.angle_sum[i, i + n] += theta.double().sum(-1)
        self.cos_sum += torch.nn.functional.cosine_similarity(X[:-1], X[1:], dim=-1).double().sum(-1)
        self.norm_sum += X.double().norm(dim=-1).sum(-1)
        self.n_tokens += X.shape[1]

    def distances(self) -> pd.DataFrame:
        """One row per (start i, span n): the mean angular distance d(h_i, h_{i+n}) = θ/π (Gromov et al.)."""
        mean = (self.angle_sum / max(self.n_tokens, 1) / np.pi).numpy()
        rows = [{"start": i, "span": n, "distance": float(mean[i, i + n])}
                for n in range(1, self.n_blocks + 1) for i in range(self.n_blocks + 1 - n)]
        return pd.DataFrame(rows)

    def influence(self) -> pd.DataFrame:
        """One row per block i: Block Influence BI_i = 1 − mean cos(h_i, h_{i+1}) (ShortGPT), the mean step angle
        θ(h_i, h_{i+1}) and the mean stream norm ‖h_i‖ at the block's input (and ``norm_out``, ‖h_{i+1}‖)."""
        cos = (self.cos_sum / max(self.n_tokens, 1)).numpy()
        theta = np.diag((self.angle_sum / max(self.n_tokens, 1)).numpy(), 1)
        norm = (self.norm_sum / max(self.n_tokens, 1)).numpy()
        return pd.DataFrame({"block": np.arange(self.n_blocks), "block_influence": 1 - cos, "theta": theta,
                             "norm": norm[:-1], "norm_out": norm[1:]})


def gromov_blocks(distances: pd.DataFrame, n: int) -> list[int]:
    """The n consecutive blocks Gromov et al.'s rule drops: i* … i*+n−1, i* minimising d(h_i, h_{i+n})."""
    rows = distances[distances["span"] == n]
    start = int(rows.loc[rows["distance"].idxmin(), "start"])
    return list(range(start, start + n))


def shortgpt_blocks(influence: pd.DataFrame, k: int) -> list[int]:
    """The k blocks of lowest Block Influence (ShortGPT's order), ties broken by block index."""
    order = influence.sort_values(["block_influence", "block"], kind="stable")["block"]
    return sorted(int(b) for b in order.iloc[:k])

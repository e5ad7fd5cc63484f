"""Per-token geometry of the residual stream (paper §2.3–2.4).

For every *valid* token — the token and its next-token target are both real (§2.3), which drops padding
and each document's last token — and every layer:

=============  ===========  =========================================================================
key            shape        definition
=============  ===========  =========================================================================
theta          (N, L)       θ(h_l, h_{l+1}), l = 0..L−1: the rotation made by block l+1
theta_dh       (N, L−1)     θ(Δh_l, Δh_{l+1}), Δh_l = h_{l+1} − h_l: angle between consecutive updates
norms          (N, L+1)     ‖h_l‖
angle_to_end   (N, L)       θ(h_l, h_L)
progress       (N, L+1)     s_l = ⟨h_l − h_0, h_L − h_0⟩ / ‖h_L − h_0‖²: progress along the chord h_0 → h_L
=============  ===========  =========================================================================

Unlike the paper's scripts, h_L is the pre-norm residual stream (see :mod:`depthlib.probes.tap`), and
cosines are computed in fp32 and clamped to [−1, 1] before arccos (the scripts used bf16, which cannot
resolve angles below ≈ 0.088 rad; anchors §E.6).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from depthlib.measures import angle_between, middle_blocks, middle_update_pairs  # noqa: F401  (angle re-exported)

METRICS = ("theta", "theta_dh", "norms", "angle_to_end", "progress")


def valid_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq) bool: position t is valid iff tokens t and t+1 are both real (§2.3). Last column False."""
    m = attention_mask.bool()
    valid = torch.zeros_like(m)
    valid[:, :-1] = m[:, :-1] & m[:, 1:]
    return valid


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq) position of each token within its document (0 = first real token; any padding side)."""
    m = attention_mask.long()
    return (m.cumsum(dim=1) - 1).clamp_min(0)


@dataclass
class TokenMetrics:
    """Per-valid-token metrics of one batch (fp32), with where each token came from."""

    theta: torch.Tensor          # (N, L)
    theta_dh: torch.Tensor       # (N, L-1)
    norms: torch.Tensor          # (N, L+1)
    angle_to_end: torch.Tensor   # (N, L)
    progress: torch.Tensor       # (N, L+1)
    row: torch.Tensor            # (N,) batch row of each token
    position: torch.Tensor       # (N,) position within its document
    token: torch.Tensor          # (N,) token id
    target: torch.Tensor         # (N,) next-token id

    def __len__(self) -> int:
        return int(self.theta.shape[0])

    def get(self, name: str) -> torch.Tensor:
        return getattr(self, name)

    def select(self, keep: torch.Tensor) -> "TokenMetrics":
        """The tokens where the (N,) bool mask ``keep`` is true."""
        return TokenMetrics(*(getattr(self, f.name)[keep] for f in fields(self)))


def token_metrics(hidden: list[torch.Tensor] | torch.Tensor, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor) -> TokenMetrics:
    """All per-token metrics of §2.4 for the valid tokens of one batch.

    ``hidden`` is the list h_0 … h_L of (batch, seq, d) tensors (any dtype) or a (batch, L+1, seq, d)
    tensor. Only valid tokens are gathered before the fp32 cast, so memory is (N, L+1, d) fp32.
    """
    valid = valid_mask(attention_mask)                            # (batch, seq)
    rows, cols = valid.nonzero(as_tuple=True)                     # flattened in (batch, position) order
    if isinstance(hidden, torch.Tensor):
        h = hidden[rows, :, cols].float()                         # (N, L+1, d)
    else:
        h = torch.stack([x[rows, cols] for x in hidden], dim=1).float()  # (N, L+1, d)
    dh = h[:, 1:] - h[:, :-1]                                     # (N, L, d)
    theta = angle_between(h[:, :-1], h[:, 1:])                    # (N, L)
    theta_dh = angle_between(dh[:, :-1], dh[:, 1:])               # (N, L-1)
    norms = h.norm(dim=-1)                                        # (N, L+1)
    angle_to_end = angle_between(h[:, :-1], h[:, -1:].expand_as(h[:, :-1]))  # (N, L)
    chord = h[:, -1] - h[:, 0]                                    # (N, d)
    progress = ((h - h[:, :1]) * chord[:, None]).sum(-1) / (chord.pow(2).sum(-1, keepdim=True) + 1e-10)
    progress[:, 0], progress[:, -1] = 0.0, 1.0                    # s_0 = 0, s_L = 1 exactly (§2.4)
    pos = positions(attention_mask)
    return TokenMetrics(theta, theta_dh, norms, angle_to_end, progress, rows, pos[rows, cols],
                        input_ids[rows, cols], input_ids[rows, cols + 1])


def middle_mean(theta_by_layer: np.ndarray) -> float:
    """Mean of the per-layer mean angles over the middle blocks (§2.7 item 3; :func:`depthlib.measures.middle_blocks`)."""
    theta_by_layer = np.asarray(theta_by_layer, dtype=float)
    return float(theta_by_layer[middle_blocks(len(theta_by_layer))].mean())


def middle_update_mean(theta_dh_by_pair: np.ndarray, n_blocks: int) -> float:
    """Mean update angle θ(Δh_l, Δh_{l+1}) over the pairs of middle blocks (:func:`depthlib.measures.middle_update_pairs`)."""
    return float(np.asarray(theta_dh_by_pair, dtype=float)[middle_update_pairs(n_blocks)].mean())

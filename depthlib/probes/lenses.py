"""Per-layer next-token loss through lenses (paper §2.5).

Three readings of the residual stream h_l of each valid token, scored by the cross-entropy of the
next token (nats):

* **logit lens** — W_U · norm(h_l), l = 0..L (at l = L it is the model's own output);
* **last-block lens** (the paper's) — W_U · norm(Block_L(h_l)), l = 0..L−1: the loss of a shortened
  network made of the first l blocks followed by the last block. The last block is re-run with the
  arguments the model itself passed to it (causal + padding mask, rotary cos/sin, position ids:
  :meth:`depthlib.probes.tap.Tap.run_last_block`), which avoids the paper scripts' padding-only-mask
  pitfall (§2.5). At l = L−1 it is the model's own output (the tests check they agree);
* **model** — the model's own loss, the same at every l (a reference line).

Logits are computed in chunks of tokens so a 262k vocabulary never materialises a (tokens × vocab)
fp32 tensor: at most ``max_logit_elements`` floats exist at once.
"""
from __future__ import annotations

import torch

from depthlib.models.arch import Arch
from depthlib.probes.metrics import valid_mask
from depthlib.probes.tap import Tap

#: 2^24 floats = 64 MB of fp32 logits at a time (64 tokens for Gemma's 262,144 vocab, 341 for SmolLM2).
MAX_LOGIT_ELEMENTS = 1 << 24
LENSES = ("logit", "last_block")


@torch.no_grad()
def chunked_cross_entropy(arch: Arch, h: torch.Tensor, targets: torch.Tensor,
                          max_logit_elements: int = MAX_LOGIT_ELEMENTS) -> torch.Tensor:
    """Next-token CE (nats, fp32) of pre-norm states ``h`` (N, d) against ``targets`` (N,), in chunks."""
    chunk = max(1, int(max_logit_elements) // max(arch.vocab_size, 1))
    out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    for start in range(0, h.shape[0], chunk):
        logits = arch.unembed(h[start:start + chunk]).float()          # (chunk, vocab) fp32
        tgt = targets[start:start + chunk]
        out[start:start + chunk] = torch.logsumexp(logits, -1) - logits.gather(1, tgt[:, None])[:, 0]
    return out


@torch.no_grad()
def lens_losses(tap: Tap, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                select: torch.Tensor | None = None,
                max_logit_elements: int = MAX_LOGIT_ELEMENTS) -> dict[str, torch.Tensor]:
    """Per-token, per-layer CE through the logit lens and the last-block lens.

    ``select`` is an optional bool (batch, seq) mask choosing a subset of the valid tokens (the
    unembedding dominates the cost; a subsample keeps CPU runs short). Returns ``{"logit": (n, L+1),
    "last_block": (n, L), "rows": (n,), "cols": (n,)}`` with tokens in (batch, position) order.
    """
    arch, L = tap.arch, tap.n_layers
    valid = valid_mask(attention_mask)
    if select is not None:
        valid = valid & select
    rows, cols = valid.nonzero(as_tuple=True)
    targets = input_ids[rows, cols + 1]
    ce = lambda h: chunked_cross_entropy(arch, h, targets, max_logit_elements)  # noqa: E731
    logit = torch.stack([ce(tap.hidden[l][rows, cols]) for l in range(L + 1)], dim=1)       # (n, L+1)
    last = [ce(tap.run_last_block(tap.hidden[l])[rows, cols]) for l in range(L - 1)]
    last.append(logit[:, L])                                      # l = L-1: the model's own output
    return {"logit": logit, "last_block": torch.stack(last, dim=1), "rows": rows, "cols": cols}


@torch.no_grad()
def last_block_logits(tap: Tap, layer: int) -> torch.Tensor:
    """Full logits (batch, seq, vocab) of the last-block lens at ``layer`` (tests and small inputs only)."""
    return tap.arch.unembed(tap.run_last_block(tap.hidden[layer]))

"""Residual transformers that differ in how they reuse depth: untied, looped (prelude, core × r, coda), fully tied.

The family of chapter 6 (:mod:`depthlib.lm.model`: GPT-NeoX's parallel block h ← h + attn(LN h) + mlp(LN' h), so a
block makes one update Δh_l, paper §2.7) written out here so that one block can be applied several times. A model
holds ``n_blocks`` distinct blocks and a **schedule**, the block applied at each of its ``depth`` steps:

=============  ==========================================  =================
family         schedule at effective depth ℓ               distinct blocks
=============  ==========================================  =================
``untied``     0, 1, …, ℓ−1                                ℓ
``looped``     0, 1, 1, …, 1, 2 (prelude, core × (ℓ−2),    3
               coda; Geiping et al. 2025's recurrent depth)
``tied``       0, 0, …, 0                                  1
=============  ==========================================  =================

Effective depth ℓ counts block applications, the ℓ of the paper's L(ℓ) (§3); the parameter count of a looped or tied
model does not grow with it. Initialisation as chapter 6's Pythia recipe: every matrix N(0, 2/(5d)), the blocks'
output projections N(0, (2/(ℓ√d))²) with ℓ the effective depth (each *application* then starts with a 1/ℓ update).
Chapter 5's edits are schedules too: deleting the k-th application or reordering them is a forward pass with
another schedule (:meth:`ComposeModel.forward` takes one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from depthlib.compose.network import FAMILIES, MIN_DEPTH, schedule
from depthlib.errors import InputError
from depthlib.validate import int_in_range


@dataclass(frozen=True)
class GrammarModelConfig:
    """Everything but the family and the depth: width, heads, MLP ratio."""

    d_model: int = 32
    n_heads: int = 2
    mlp_ratio: int = 4

    def validate(self) -> "GrammarModelConfig":
        int_in_range("d_model", self.d_model, 4, 1 << 14)
        int_in_range("n_heads", self.n_heads, 1, self.d_model)
        if self.d_model % self.n_heads:
            raise InputError(f"d_model {self.d_model} must split into {self.n_heads} heads")
        int_in_range("mlp_ratio", self.mlp_ratio, 1, 64)
        return self


class Block(nn.Module):
    """One parallel pre-norm block: returns the update attn(LN h) + mlp(LN' h), not h plus it."""

    def __init__(self, d: int, heads: int, ratio: int):
        super().__init__()
        self.heads = heads
        self.ln_attn, self.ln_mlp = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, ratio * d), nn.Linear(ratio * d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.ln_attn(h)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        return self.proj(att) + self.down(F.gelu(self.up(self.ln_mlp(h))))


class ComposeModel(nn.Module):
    """A causal LM over ``vocab`` symbols (plus a start symbol, id ``vocab``) on sequences of ``length`` tokens, with
    the blocks and schedule of ``family`` at effective depth ``depth``."""

    def __init__(self, cfg: GrammarModelConfig, family: str, depth: int, vocab: int, length: int):
        super().__init__()
        cfg.validate()
        self.family, self.depth, self.vocab = family, int(depth), int(vocab)
        n_blocks, self.schedule = schedule(family, depth)
        d = cfg.d_model
        self.embed = nn.Embedding(vocab + 1, d)
        self.position = nn.Embedding(length, d)
        self.blocks = nn.ModuleList(Block(d, cfg.n_heads, cfg.mlp_ratio) for _ in range(n_blocks))
        self.ln_final = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def init_weights(self, seed: int) -> "ComposeModel":
        """Chapter 6's Pythia initialisation (small_init, wang_init with the effective depth), seeded; biases 0."""
        d = self.embed.embedding_dim
        small, wang = math.sqrt(2.0 / (5.0 * d)), 2.0 / (self.depth * math.sqrt(d))
        gen = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.ndim >= 2:
                    std = wang if name.endswith(("proj.weight", "down.weight")) else small
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
                elif name.endswith("bias") and not name.startswith("ln"):
                    if ".ln_" not in name:
                        p.zero_()
        return self

    def inputs(self, leaves: torch.Tensor) -> torch.Tensor:
        """The start symbol followed by all leaves but the last: position t predicts leaf t."""
        start = torch.full_like(leaves[:, :1], self.vocab)
        return torch.cat([start, leaves[:, :-1]], 1)

    def forward(self, leaves: torch.Tensor, order: list[int] | None = None, *, states: bool = False):
        """Logits (batch, length, vocab) predicting every leaf from the ones before it; ``order``: the schedule to
        apply (default the model's own; chapter 5's edits pass another); with ``states`` also the residual stream
        h_0 … h_ℓ (h_0 the embedding, h_ℓ before the final norm, paper §2.7)."""
        ids = self.inputs(leaves)
        h = self.embed(ids) + self.position.weight[: ids.shape[1]]
        hs = [h]
        for b in self.schedule if order is None else order:
            h = h + self.blocks[b](h)
            if states:
                hs.append(h)
        logits = self.head(self.ln_final(h))
        return (logits, hs) if states else logits


def build_model(cfg: GrammarModelConfig, family: str, depth: int, vocab: int, length: int, seed: int) -> ComposeModel:
    return ComposeModel(cfg, family, depth, vocab, length).init_weights(seed)


def parameter_counts(model: ComposeModel) -> dict:
    """All parameters and those of the blocks (what tying shares)."""
    blocks = sum(p.numel() for p in model.blocks.parameters())
    return {"n_params": int(sum(p.numel() for p in model.parameters())), "n_block_params": int(blocks),
            "n_blocks": len(model.blocks)}


__all__ = ["FAMILIES", "MIN_DEPTH", "Block", "ComposeModel", "GrammarModelConfig", "build_model", "parameter_counts",
           "schedule"]

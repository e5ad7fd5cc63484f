"""Chapter 7's grammar members on chapter 6's language model: one transformer stack for the book.

A member is chapter 6's model (:func:`depthlib.lm.model.build_model`: GPT-NeoX's parallel block
h ← h + attn(LN h) + mlp(LN' h), so a block makes one update Δh_l, paper §2.7; rotary positions; Pythia's
initialisation) with a family's **schedule**, the block applied at each of its ``depth`` steps
(:func:`depthlib.lm.families.build_family_model`, the looped and tied members chapter 7 also trains on text):

=============  ==========================================  =================
family         schedule at effective depth ℓ               distinct blocks
=============  ==========================================  =================
``untied``     0, 1, …, ℓ−1                                ℓ
``looped``     0, 1, 1, …, 1, 2 (prelude, core × (ℓ−2),    3
               coda; Geiping et al. 2025's recurrent depth)
``tied``       0, 0, …, 0                                  1
=============  ==========================================  =================

Effective depth ℓ counts block applications, the ℓ of the paper's L(ℓ) (§3); the parameter count of a looped or
tied member does not grow with it, and Pythia's output projections are scaled by the effective depth (each
application starts with a 1/ℓ update). The grammar's ``vocab`` symbols are tokens ``0 … vocab − 1`` and a start
symbol is token ``vocab``; position t reads the start symbol and leaves 0 … t − 1 and predicts leaf t.

**Absolute positions.** A grammar's sequences have one fixed length, and where a leaf sits in the tree is its
position: which leaves share its parent, grandparent, … is fixed by t. Chapter 6's rotary embedding (on a quarter of
each head) tells attention only *relative* offsets, so a member adds a learned embedding of the absolute position to
its token embedding (initialised as Pythia's other embeddings, N(0, 2/(5d))), as GPT-2 does (``positions``). It
matters: ``benchmarks/bench_compose_positions.py`` trains an untied ℓ = 4 member on the cpu grammar of
:mod:`depthlib.compose.hierarchy` with and without it (400 steps × 64 sequences, three seeds; measured 2026-12-06:
next-leaf excess 0.0941, 0.0869, 0.0927 nats with it against 0.2147, 0.2095, 0.2206 without).

:class:`GrammarNet` is what chapter 7's training, certificate, diagnostics and root classifier call: ``net(leaves)``
gives the next-leaf logits, ``net(leaves, order)`` applies another schedule (chapter 5's edits: deleting the k-th
application or reordering them), ``net(leaves, states=True)`` adds the residual stream h_0 … h_ℓ, read with hooks on
the blocks (h_ℓ before the final norm, as :mod:`depthlib.probes.tap` reads it from any LM).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from depthlib.errors import InputError
from depthlib.lm.families import build_family_model
from depthlib.lm.model import ARCHS, ModelConfig
from depthlib.models.arch import arch_of, block_input, block_output
from depthlib.validate import int_in_range

FAMILIES = ("untied", "looped", "tied")
#: the smallest effective depth of each family (a looped model has a prelude, at least one core step and a coda)
MIN_DEPTH = {"untied": 1, "looped": 3, "tied": 1}


def schedule(family: str, depth: int) -> tuple[int, list[int]]:
    """(distinct blocks, the block applied at each of the ``depth`` steps) of a family's member."""
    if family not in FAMILIES:
        raise InputError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    int_in_range(f"{family} depth", depth, MIN_DEPTH[family], 4096)
    if family == "untied":
        return depth, list(range(depth))
    if family == "looped":
        return 3, [0] + [1] * (depth - 2) + [2]
    return 1, [0] * depth


@dataclass(frozen=True)
class GrammarModelConfig:
    """Everything but the family and the depth: chapter 6's architecture (``arch``), width, heads, MLP ratio."""

    d_model: int = 32
    n_heads: int = 2
    mlp_ratio: int = 4
    arch: str = "neox"              # chapter 6's GPT-NeoX (Pythia's); "llama" as chapter 6's option
    positions: bool = True          # a learned embedding of the absolute position (False: chapter 6's rotary alone)

    def validate(self) -> "GrammarModelConfig":
        if self.arch not in ARCHS:
            raise InputError(f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        if not isinstance(self.positions, bool):
            raise InputError(f"positions must be true or false, got {self.positions!r}")
        self.lm_config(4).validate()
        return self

    def lm_config(self, length: int) -> ModelConfig:
        """Chapter 6's settings of a member reading ``length`` positions (Pythia's initialisation)."""
        return ModelConfig(arch=self.arch, d_model=self.d_model, n_heads=self.n_heads, mlp_ratio=self.mlp_ratio,
                           context=int(length), init="pythia")


class GrammarNet(nn.Module):
    """A causal LM over ``vocab`` symbols (plus the start symbol, token ``vocab``) on sequences of ``length`` tokens:
    chapter 6's member of effective depth ``depth`` with the schedule of ``family`` and a learned embedding of the
    absolute position, initialised from ``seed``."""

    def __init__(self, cfg: GrammarModelConfig, family: str, depth: int, vocab: int, length: int, seed: int):
        super().__init__()
        cfg.validate()
        int_in_range("vocab", vocab, 2, 1 << 16)
        self.family, self.depth, self.vocab = family, int(depth), int(vocab)
        n_blocks, self.schedule = schedule(family, depth)
        self.lm = build_family_model(cfg.lm_config(length), self.depth, self.vocab + 1, seed, eos_id=self.vocab,
                                     blocks=self.schedule)
        self.lm.config.use_cache = False
        d = cfg.d_model
        gen = torch.Generator().manual_seed(int(seed))
        # (length, d) the absolute positions' embedding, or None (rotary positions alone)
        self.position = (nn.Parameter(torch.randn(int(length), d, generator=gen) * math.sqrt(2.0 / (5.0 * d)))
                         if cfg.positions else None)
        # the decoder that holds ``layers``, the applications in order (not registered twice: it lives in ``lm``)
        object.__setattr__(self, "_decoder", arch_of(self.lm).base)
        applied = list(self._decoder.layers)
        first = {b: j for j, b in reversed(list(enumerate(self.schedule)))}     # block → its first application
        # (n_blocks,) the distinct blocks; a plain list, so that they are registered once, through ``lm``
        self._blocks = [getattr(applied[first[b]], "block", applied[first[b]]) for b in range(n_blocks)]

    @property
    def blocks(self) -> list[nn.Module]:
        """The distinct blocks, block b applied wherever the schedule says b."""
        return list(self._blocks)

    def inputs(self, leaves: torch.Tensor) -> torch.Tensor:
        """(batch, length) tokens: the start symbol followed by all leaves but the last."""
        start = torch.full_like(leaves[:, :1], self.vocab)
        return torch.cat([start, leaves[:, :-1]], 1)

    def forward(self, leaves: torch.Tensor, order: list[int] | None = None, *, states: bool = False):
        """Logits (batch, length, vocab) predicting every leaf from the ones before it; ``order``: the schedule to
        apply (default the member's own; chapter 5's edits pass another); with ``states`` also the residual stream
        h_0 … h_ℓ (h_0 the token and position embedding, h_ℓ before the final norm, paper §2.7), one (batch, length,
        d) tensor each."""
        decoder = self._decoder
        own = decoder.layers
        if order is not None and list(order) != self.schedule:
            for b in order:
                int_in_range("block", b, 0, len(self._blocks) - 1)
            decoder.layers = nn.ModuleList([self._blocks[b] for b in order])
        hs: list[torch.Tensor] = []
        handles = []
        if states:
            def enter(_module, args, kwargs):
                if not hs:
                    hs.append(block_input(args, kwargs))

            def leave(_module, _args, output):
                hs.append(block_output(output))
            for block in self._blocks:
                handles.append(block.register_forward_pre_hook(enter, with_kwargs=True))
                handles.append(block.register_forward_hook(leave))
        try:
            h0 = self.lm.get_input_embeddings()(self.inputs(leaves))
            if self.position is not None:
                h0 = h0 + self.position[: leaves.shape[1]]
            logits = self.lm(inputs_embeds=h0, use_cache=False).logits[..., :self.vocab]
        finally:
            for h in handles:
                h.remove()
            decoder.layers = own
        return (logits, hs) if states else logits


def build_model(cfg: GrammarModelConfig, family: str, depth: int, vocab: int, length: int, seed: int) -> GrammarNet:
    """A freshly initialised member (the same arguments give the same weights)."""
    if family not in FAMILIES:
        raise InputError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    int_in_range(f"{family} depth", depth, MIN_DEPTH[family], 4096)
    return GrammarNet(cfg, family, depth, vocab, length, seed)


def token_nll(model: GrammarNet, leaves: torch.Tensor, order: list[int] | None = None) -> torch.Tensor:
    """(batch, length) next-leaf cross-entropy in nats."""
    logits = model(leaves, order)
    return F.cross_entropy(logits.transpose(1, 2), leaves, reduction="none")


def parameter_counts(model: GrammarNet) -> dict:
    """All parameters and those of the blocks (what tying shares)."""
    blocks = sum(p.numel() for b in model.blocks for p in b.parameters())
    return {"n_params": int(sum(p.numel() for p in model.parameters())), "n_block_params": int(blocks),
            "n_blocks": len(model.blocks)}


__all__ = ["FAMILIES", "MIN_DEPTH", "GrammarModelConfig", "GrammarNet", "build_model", "parameter_counts", "schedule",
           "token_nll"]

"""Chapter 6's language model with its depth reused: the untied, looped and fully tied families of chapter 7.

The paper's §5 proposes that reusing depth (looped or recurrent blocks) could turn ensemble-like depth into
procedural or compositional depth. This module builds the three families from **chapter 6's** model
(:func:`depthlib.lm.model.build_model`: GPT-NeoX's parallel block, Pythia's initialisation): chapter 7's members on a
grammar (:mod:`depthlib.compose.network`) and on chapter 6's text, where they are trained at exactly chapter 6's
budget, data order and certificate (:mod:`depthlib.lm.converged`), and compared with its certified depth series:

* ``untied``: blocks 0, 1, …, ℓ−1 (chapter 6's model, unchanged);
* ``looped``: 0, 1, 1, …, 1, 2 (prelude, core × (ℓ−2), coda);
* ``tied``: 0, 0, …, 0,

the schedules of chapter 7's families (:func:`depthlib.compose.network.schedule`), passed in by the caller.

Effective depth ℓ counts block applications, the ℓ of L(ℓ); a member of every family costs the same per token at the
same ℓ. A looped or tied member is chapter 6's member of depth ℓ (the same seed, so the same initialisation, whose
output projections are scaled by the effective depth) whose layer list applies its first blocks by the schedule
above. Each application is its own thin module (:class:`Application`) around the shared block, so the block's
parameters are shared and receive the sum of their gradients, while a hook on application j (the probes' taps,
:mod:`depthlib.probes.tap`) fires once, at step j. Its key–value cache is switched off (``use_cache``): a shared
block would append to one cache entry at every application.
"""
from __future__ import annotations

from typing import Sequence

from depthlib.lm.model import ModelConfig, build_model


def _decoder(model):
    """The decoder that holds the list of blocks (GPT-NeoX ``gpt_neox``, Llama ``model``)."""
    return model.gpt_neox if hasattr(model, "gpt_neox") else model.model


def _application_class():
    import torch.nn as nn

    class Application(nn.Module):
        """One application of a shared block: calls it with the decoder's arguments and returns its output."""

        def __init__(self, block: nn.Module):
            super().__init__()
            self.block = block

        def forward(self, *args, **kwargs):
            return self.block(*args, **kwargs)
    return Application


def build_family_model(cfg: ModelConfig, depth: int, vocab_size: int, seed: int, eos_id: int = 0,
                       blocks: Sequence[int] | None = None):
    """A freshly initialised member of effective depth ``depth``: chapter 6's member of that depth and seed, whose step
    j applies block ``blocks[j]`` (a family's schedule, :func:`depthlib.compose.network.schedule`; None or 0, 1, …, ℓ−1:
    chapter 6's untied model itself, unchanged)."""
    import torch.nn as nn
    model = build_model(cfg, depth, vocab_size, seed, eos_id)
    steps = list(range(depth)) if blocks is None else [int(b) for b in blocks]
    if len(steps) != depth:
        raise ValueError(f"a schedule of {len(steps)} steps for depth {depth}")
    if steps == list(range(depth)):
        return model
    decoder = _decoder(model)
    blocks = list(decoder.layers)[:max(steps) + 1]
    application = _application_class()
    decoder.layers = nn.ModuleList([application(blocks[i]) for i in steps])
    model.config.use_cache = False
    return model


__all__ = ["build_family_model"]

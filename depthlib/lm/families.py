"""Chapter 6's language model with its depth reused: the untied, looped and fully tied families of chapter 7.

The paper's §5 proposes that reusing depth (looped or recurrent blocks) could turn ensemble-like depth into
procedural or compositional depth. Chapter 7 tests that on its own transformer (:mod:`depthlib.compose.model`); this
module builds the same three families from **chapter 6's** model (:func:`depthlib.lm.model.build_model`: GPT-NeoX's
parallel block, Pythia's initialisation), so that they can be trained on chapter 6's text at exactly chapter 6's
budget, data order and certificate (:mod:`depthlib.lm.converged`), and compared with its certified depth series:

=============  =============================================  =================
family         block applied at each of the ℓ steps           distinct blocks
=============  =============================================  =================
``untied``     0, 1, …, ℓ−1 (chapter 6's model, unchanged)     ℓ
``looped``     0, 1, 1, …, 1, 2 (prelude, core × (ℓ−2), coda)  3
``tied``       0, 0, …, 0                                      1
=============  =============================================  =================

Effective depth ℓ counts block applications, the ℓ of L(ℓ); a member of every family costs the same per token at the
same ℓ. A looped or tied member is chapter 6's member of depth ℓ (the same seed, so the same initialisation, whose
output projections are scaled by the effective depth) whose layer list applies its first blocks by the schedule
above. Each application is its own thin module (:class:`Application`) around the shared block, so the block's
parameters are shared and receive the sum of their gradients, while a hook on application j (the probes' taps,
:mod:`depthlib.probes.tap`) fires once, at step j. Its key–value cache is switched off (``use_cache``): a shared
block would append to one cache entry at every application.
"""
from __future__ import annotations

from depthlib.errors import InputError
from depthlib.lm.model import ModelConfig, build_model
from depthlib.validate import int_in_range

FAMILIES = ("untied", "looped", "tied")
#: the smallest effective depth of each family (a looped member has a prelude, at least one core step and a coda)
MIN_DEPTH = {"untied": 1, "looped": 3, "tied": 1}


def schedule(family: str, depth: int) -> tuple[int, list[int]]:
    """(distinct blocks, the block applied at each of the ``depth`` steps) of a family's member; the same schedules as
    chapter 7's own transformer (:func:`depthlib.compose.model.schedule`, checked equal in the tests)."""
    if family not in FAMILIES:
        raise InputError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    int_in_range(f"{family} depth", depth, MIN_DEPTH[family], 4096)
    if family == "untied":
        return depth, list(range(depth))
    if family == "looped":
        return 3, [0] + [1] * (depth - 2) + [2]
    return 1, [0] * depth


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


def build_family_model(cfg: ModelConfig, family: str, depth: int, vocab_size: int, seed: int, eos_id: int = 0):
    """A freshly initialised member of ``family`` at effective depth ``depth``: chapter 6's member of that depth and
    seed, its blocks tied by :func:`schedule` (``untied``: chapter 6's model itself, unchanged)."""
    import torch.nn as nn
    n_blocks, steps = schedule(family, depth)
    model = build_model(cfg, depth, vocab_size, seed, eos_id)
    if family == "untied":
        return model
    decoder = _decoder(model)
    blocks = list(decoder.layers)[:n_blocks]
    application = _application_class()
    decoder.layers = nn.ModuleList([application(blocks[i]) for i in steps])
    model.config.use_cache = False
    return model


__all__ = ["FAMILIES", "MIN_DEPTH", "build_family_model", "schedule"]

"""The corruption of causal tracing: Gaussian noise at the subject tokens and its scale σ (paper Fig. 6, anchors §A2).

Presets of σ (``TraceConfig.noise``):

- ``"rome"`` (default): σ = 3 × the std of the embedding outputs at the subject tokens of a fact set
  (ROME's ``collect_embedding_std`` idea, on our own fact set, :mod:`depthlib.tracing.facts`);
- ``"paper"``: σ = 3 × the std of the embedding matrix (as the model applies it: Gemma's √d scaling is
  included, so for Pythia it is exactly ``embed_in.weight.std()``);
- a float (or a string holding one): σ itself (absolute, as ROME's ``noise=`` argument).

The noise is drawn once per prompt from a seeded generator (ROME seeds its noise with ``RandomState(1)``), so
the same draw serves every restored site.
"""
from __future__ import annotations

import math
import warnings
from typing import Sequence

import torch

from depthlib.errors import InputError
from depthlib.models.arch import arch_of
from depthlib.tracing.facts import Fact, load_facts
from depthlib.tracing.locate import Located, locate

NOISE_PRESETS = ("rome", "paper")


@torch.no_grad()
def embedding_matrix_std(model) -> float:
    """Std of all entries of the embedding matrix *as the model applies it* (the σ of paper Fig. 6).

    Runs the embedding module over the whole vocabulary in chunks (Gemma's √d scale is inside the
    module), accumulating in float64.
    """
    arch = arch_of(model)
    vocab = arch.embed.weight.shape[0]
    device = arch.embed.weight.device
    total, total_sq, count = 0.0, 0.0, 0
    for lo in range(0, vocab, 16384):
        ids = torch.arange(lo, min(vocab, lo + 16384), device=device)
        e = arch.embed(ids).double()
        total += float(e.sum())
        total_sq += float((e * e).sum())
        count += e.numel()
    mean = total / count
    return math.sqrt(max(total_sq / count - mean * mean, 0.0) * count / (count - 1))


@torch.no_grad()
def subject_embedding_std(model, tokenizer, facts: Sequence[Fact]) -> float:
    """Std of the embedding outputs at the subject tokens of ``facts`` (ROME's noise scale, anchors §A2)."""
    arch = arch_of(model)
    rows = []
    for fact in facts:
        loc = locate(tokenizer, fact.prompt, fact.subject)
        a, b = loc.subject_range
        ids = loc.input_ids[0, a:b].to(arch.embed.weight.device)
        rows.append(arch.embed(ids).double().flatten())
    if not rows:
        raise InputError("the fact set for the 'rome' noise scale is empty")
    return float(torch.cat(rows).std())


def noise_sigma(model, tokenizer, noise: str | float, facts: Sequence[Fact] | None = None) -> float:
    """σ of the Gaussian noise for a preset ("rome": 3 × subject-embedding std; "paper": 3 × matrix std) or a float.

    ``facts`` (for "rome") defaults to the committed fact set.
    """
    if isinstance(noise, str):
        if noise == "rome":
            return 3.0 * subject_embedding_std(model, tokenizer, load_facts() if facts is None else facts)
        if noise == "paper":
            return 3.0 * embedding_matrix_std(model)
        try:
            noise = float(noise)
        except ValueError:
            raise InputError(f"noise must be 'rome', 'paper' or a number, got {noise!r}") from None
    noise = float(noise)
    if not math.isfinite(noise) or noise < 0:
        raise InputError(f"noise σ must be a finite number >= 0, got {noise:g}")
    if noise == 0:
        warnings.warn("noise σ = 0 corrupts nothing: p_corrupt will equal p_clean and every effect is 0/0", stacklevel=2)
    return noise


def subject_noise(located: Located, d_model: int, samples: int, sigma: float, seed: int) -> torch.Tensor:
    """Seeded Gaussian noise, (samples, T, d): N(0, σ²) at the subject tokens, zero elsewhere."""
    gen = torch.Generator().manual_seed(int(seed))
    a, b = located.subject_range
    noise = torch.zeros(samples, located.n_tokens, d_model)
    noise[:, a:b] = sigma * torch.randn(samples, b - a, d_model, generator=gen)
    return noise

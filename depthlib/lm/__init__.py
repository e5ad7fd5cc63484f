"""Chapter 6: a depth series of small language models trained here, differing only in depth (paper §3, Limitations).

The paper infers α_ℓ for LLMs from Chinchilla's reconstructed losses and its "middle-layer angle ∝ 1/ℓ" from Pythia;
this package makes the family the paper's Limitations ask for: decoder-only LMs at one width, trained on the same
tokens in the same order, then measured by the probes of chapter 2.

- :mod:`~depthlib.lm.tokenizer`   byte-level BPE trained on the training documents (``tokenizers``)
- :mod:`~depthlib.lm.corpus`      held-out split, token windows, the one data order, the probes' pieces
- :mod:`~depthlib.lm.model`       the family's config (GPT-NeoX; Llama as an option), parameter and FLOP counts
- :mod:`~depthlib.lm.train`       AdamW with warm-up and cosine decay; seeded, resumable, exact; held-out loss per document
- :mod:`~depthlib.lm.fit`         L(ℓ) = L∞ + c·ℓ^(−α_ℓ), the middle-angle exponent, bootstrap over held-out documents
- :mod:`~depthlib.lm.throughput`  the fp32 matmul ceiling and the fraction of it training reaches
- :mod:`~depthlib.lm.series`      one series: train, save (Hugging Face folders), probe, tidy tables
- :mod:`~depthlib.lm.chapter`     the chapter's profiles, the run it shows, its replay check
"""
from __future__ import annotations

from depthlib.lm.chapter import PROFILES, describe, profile_config, replay, runs
from depthlib.lm.series import EXPERIMENT, SeriesConfig, run_series

__all__ = ["EXPERIMENT", "PROFILES", "SeriesConfig", "describe", "profile_config", "replay", "run_series", "runs"]

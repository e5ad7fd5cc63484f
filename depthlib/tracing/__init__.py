"""ROME-style causal tracing (paper §6, Fig. 6; Meng et al. 2022, "Locating and Editing Factual Associations").

A fact is a prompt, a subject inside it and a target continuation ("The Space Needle is in downtown",
"Space Needle", " Seattle"). The model runs clean, with noise on the subject's embeddings, and corrupted with
the clean value of one state restored at one (layer, token) site; how much a site restores p(target) says
how much that state carries the fact. One concept per module:

- :mod:`~depthlib.tracing.locate`    the subject's tokens and the target token, found by characters; token roles
- :mod:`~depthlib.tracing.noise`     the noise presets ("rome", "paper", or σ) and the seeded subject noise
- :mod:`~depthlib.tracing.patching`  clean states, the corrupted run, restored forwards (full and resumed)
- :mod:`~depthlib.tracing.tracer`    :class:`TraceConfig`, :class:`CausalTracer` -> :class:`TraceResult`,
                                     the naive reference :func:`naive_grid`, :func:`trace_facts`
- :mod:`~depthlib.tracing.facts`     our fact set (package data ``facts/``): load, save, check, build
- :mod:`~depthlib.tracing.analysis`  fact-set averages, the two functional groups, prompt peaks, closing note
- :mod:`~depthlib.tracing.chapter`   the chapter contract: PROFILES, the run it shows (:func:`runs`), replay; the
                                     same run as jobs of an executor (prompts per model, then fact slices)

Model plumbing (architecture table, loading, hooks) is in :mod:`depthlib.models`.
"""
from __future__ import annotations

from depthlib.tracing.analysis import average_effect, closing_note, functional_groups, prompt_peaks
from depthlib.tracing.chapter import (
    CHAPTER_PROMPTS,
    COMPUTE,
    EXPERIMENT,
    PROFILES,
    TracingProfile,
    chapter_config,
    chapter_tables,
    replay,
)
from depthlib.tracing.facts import Fact, build_fact_set, check_facts, known_facts, load_facts, save_facts
from depthlib.tracing.locate import ROLES, Located, locate
from depthlib.tracing.noise import (
    NOISE_PRESETS,
    embedding_matrix_std,
    noise_sigma,
    subject_embedding_std,
    subject_noise,
)
from depthlib.tracing.patching import (
    KINDS,
    clean_states,
    corrupted_run,
    last_logits,
    patched_probs,
    restored_logits,
    resume_from,
    site_module,
)
from depthlib.tracing.tracer import (
    CausalTracer,
    Trace,
    TraceConfig,
    TraceResult,
    naive_grid,
    paper_config,
    trace,
    trace_facts,
    window_layers,
)

__all__ = [
    "CHAPTER_PROMPTS", "COMPUTE", "EXPERIMENT", "KINDS", "NOISE_PRESETS", "PROFILES", "ROLES",
    "CausalTracer", "Fact", "Located", "Trace", "TraceConfig", "TraceResult",
    "TracingProfile", "average_effect", "build_fact_set", "chapter_config", "chapter_tables", "check_facts",
    "clean_states", "closing_note", "corrupted_run", "embedding_matrix_std", "functional_groups",
    "known_facts", "last_logits", "load_facts", "locate", "naive_grid", "noise_sigma", "paper_config",
    "patched_probs", "prompt_peaks", "replay", "restored_logits", "resume_from", "save_facts", "site_module",
    "subject_embedding_std", "subject_noise", "trace", "trace_facts", "window_layers",
]

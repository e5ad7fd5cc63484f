"""Hidden-state probes of real LLMs (paper §2, Fig. 2a–e; App. A).

- :mod:`~depthlib.probes.tap`         h_0 … h_L with h_L before the final norm, and the last block's call
- :mod:`~depthlib.probes.metrics`     per-token angles, update angles, norms, angle to end, progress
- :mod:`~depthlib.probes.lenses`      per-layer loss: logit lens and the paper's last-block lens
- :mod:`~depthlib.probes.stream`      bounded-memory streaming over a corpus -> tidy tables
- :mod:`~depthlib.probes.trajectory`  PCA of angle trajectories, ideal trajectories, clusters, depth fit
- :mod:`~depthlib.probes.chapter`     the cached run of one model (whole or as document shards), the chapter's
                                      profiles, the runs it shows, weight-noise sensitivity, replay

Where blocks, embeddings, norms and heads live is :mod:`depthlib.models.arch`, shared with the causal tracer.

:func:`run_probe` (in :mod:`~depthlib.probes.chapter`, re-exported here) is the cached entry point used by the CLI
(``depthlib probes``).
"""
from __future__ import annotations

from depthlib.probes.chapter import (
    CODE,
    EXPERIMENT_PREFIX,
    PROFILES,
    SHARD_EXPERIMENT,
    TABLES,
    ProbeProfile,
    chapter_runs,
    depth_table,
    experiment_name,
    load_result,
    open_probe_run,
    probe_key,
    replay,
    run_probe,
    sensitivity_runs,
    sensitivity_table,
)
from depthlib.probes.stream import ProbeConfig, ProbeResult, probe_documents, summarize

__all__ = ["CODE", "EXPERIMENT_PREFIX", "PROFILES", "ProbeConfig", "ProbeProfile", "ProbeResult", "SHARD_EXPERIMENT",
           "TABLES", "chapter_runs", "depth_table", "experiment_name", "load_result", "open_probe_run",
           "probe_documents", "probe_key", "replay", "run_probe", "sensitivity_runs", "sensitivity_table",
           "summarize"]

"""Hidden-state probes of real LLMs (paper §2, Fig. 2a–e; App. A).

- :mod:`~depthlib.probes.tap`         h_0 … h_L with h_L before the final norm, and the last block's call
- :mod:`~depthlib.probes.metrics`     per-token angles, update angles, norms, angle to end, progress
- :mod:`~depthlib.probes.lenses`      per-layer loss: logit lens and the paper's last-block lens
- :mod:`~depthlib.probes.stream`      bounded-memory streaming over a corpus -> tidy tables
- :mod:`~depthlib.probes.trajectory`  PCA of angle trajectories, ideal trajectories, clusters, depth fit
- :mod:`~depthlib.probes.chapter`     the chapter's profiles, the runs it shows, weight-noise sensitivity, replay
- :mod:`~depthlib.probes.shards`      a probe run as document shards on an executor, merged into one pass's run

Where blocks, embeddings, norms and heads live is :mod:`depthlib.models.arch`, shared with the causal tracer.

:func:`run_probe` is the cached entry point used by the CLI (``depthlib probes``); the chapter's profiles, the runs
it shows and their replay check are in :mod:`~depthlib.probes.chapter`.
"""
from __future__ import annotations

import sys
from dataclasses import asdict

import pandas as pd

from depthlib import finite, results
from depthlib.errors import InputError
from depthlib.inputs import corpus_fingerprint, model_fingerprint, safe_name
from depthlib.probes.stream import ProbeConfig, ProbeResult, load_probed_model, probe_documents, summarize
from depthlib.validate import int_in_range

EXPERIMENT_PREFIX = "probes-"
#: the code a probe run's numbers depend on (its compute entries: chapter 2's ``COMPUTE``, the shards' code)
CODE = ("depthlib.probes.stream:probe_documents", "depthlib.data:corpus")
TABLES = ("layers", "histograms", "tokens", "docs")


def experiment_name(model: str) -> str:
    """Results-cache experiment of one model, e.g. 'probes-gemma-3-270m', 'probes-EleutherAI--pythia-410m'."""
    return EXPERIMENT_PREFIX + safe_name(model)


def probe_key(model: str, corpus: str, n_docs: int, config: ProbeConfig) -> dict:
    """The results-cache config of a probe run (what decides its numbers): the settings, and what the model and
    the corpus *are* (their fingerprints), so the same text naming other files never finds a stale run."""
    key = dict(model=model, corpus=corpus, n_docs=int(n_docs), **asdict(config))
    key.pop("device")  # the device changes speed, not the numbers (beyond bf16 noise) ...
    key["dtype"] = str(config.torch_dtype).replace("torch.", "")  # ... but "auto" means bf16 on CUDA, fp32 on CPU
    key["model_fingerprint"] = model_fingerprint(model)
    key["corpus_fingerprint"] = corpus_fingerprint(corpus)
    return key


#: runs of document shards (:mod:`depthlib.probes.shards`) live apart from the runs a chapter shows
SHARD_EXPERIMENT = "probe-shards"


def open_probe_run(model: str, corpus: str, n_docs: int, config: ProbeConfig,
                   doc_range: tuple[int, int] | None = None) -> results.Run:
    """The cache entry of a probe run, or of the shard ``doc_range`` = (start, stop) of its documents."""
    key = probe_key(model, corpus, n_docs, config)
    if doc_range is None:
        return results.open_run(experiment_name(model), key)
    return results.open_run(SHARD_EXPERIMENT, {**key, "doc_range": [int(doc_range[0]), int(doc_range[1])]})


def run_probe(model: str, corpus: str = "sotu", n_docs: int = 16, config: ProbeConfig | None = None, *,
              profile: str = "custom", progress: bool = True, force: bool = False,
              doc_range: tuple[int, int] | None = None) -> results.Run:
    """Probe ``model`` on ``n_docs`` documents of ``corpus``; cached in the results cache.

    Returns the :class:`depthlib.results.Run` (tables ``layers``, ``histograms``, ``tokens``, ``docs``
    and a manifest with the summary). A finished run with the same settings is reused. With ``doc_range`` =
    (start, stop), only documents start … stop−1 of the ``n_docs`` are probed (a shard, merged by
    :func:`depthlib.probes.shards.run_sharded`).
    """
    from depthlib import data
    cfg = (config or ProbeConfig()).validate()
    int_in_range("n_docs", n_docs, 1)
    start, stop = doc_range if doc_range is not None else (0, n_docs)
    if not 0 <= start < stop <= n_docs:
        raise InputError(f"document range {start}..{stop} is not inside the {n_docs} documents")
    run = open_probe_run(model, corpus, n_docs, cfg, doc_range)
    with results.computing(run.experiment, run.config, profile=profile, code=CODE,
                           seed=cfg.seed, device=cfg.device, force=force, tables=TABLES,
                           checkpoints=("checkpoint.pt",)) as job:
        if job.complete:
            print(f"[depthlib] loaded a finished run from the cache: {job.run.path}", file=sys.stderr)
            return job.run
        docs = data.corpus(corpus, n_docs)[start:stop]
        m, tok = load_probed_model(model, cfg)
        finite.check_weights(m, model)
        job.run.path.mkdir(parents=True, exist_ok=True)
        with finite.guard(m, model, cfg.torch_dtype):   # NaN/inf activations stop the run (a float16 overflow, say)
            res = probe_documents(m, tok, docs, cfg, progress=progress, model_name=model, doc_offset=start,
                                  checkpoint=job.run.path / "checkpoint.pt")    # saves as it goes; a rerun resumes
        for name in TABLES:
            job.run.write_table(name, getattr(res, name))
        job.record(summary=res.summary(), model=model, corpus=corpus)
        (job.run.path / "checkpoint.pt").unlink(missing_ok=True)
    return job.run


def load_result(run: results.Run) -> ProbeResult:
    """The tables of a finished run as a :class:`ProbeResult`."""
    return ProbeResult(*(run.table(t) for t in TABLES), info=run.manifest.get("summary", {}))


def depth_table(runs: dict[str, results.Run]) -> pd.DataFrame:
    """One row per model: depth L, middle-layer mean angle, update angle, profile, corpus (Fig. 2d)."""
    rows = []
    for model, run in runs.items():
        s = run.manifest.get("summary", {})
        rows.append(dict(model=model, n_layers=s.get("n_layers"), d_model=s.get("d_model"),
                         theta_middle_mean=s.get("theta_middle_mean"), theta_dh_mean=s.get("theta_dh_mean"),
                         profile=run.manifest.get("profile"), corpus=run.manifest.get("corpus"),
                         n_tokens=s.get("n_tokens")))
    return pd.DataFrame(rows).sort_values("n_layers").reset_index(drop=True) if rows else pd.DataFrame(rows)


from depthlib.probes.chapter import (  # noqa: E402  (needs run_probe)
    PROFILES,
    ProbeProfile,
    chapter_runs,
    replay,
    sensitivity_runs,
    sensitivity_table,
)

__all__ = ["PROFILES", "ProbeConfig", "ProbeProfile", "ProbeResult", "chapter_runs",
           "depth_table", "experiment_name", "load_result", "probe_documents", "probe_key", "replay",
           "run_probe", "sensitivity_runs", "sensitivity_table", "summarize"]

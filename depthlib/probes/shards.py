"""A probe run as shards of documents: each shard probes a contiguous range of the corpus's documents as
its own resumable run, and the shards merge into the run one pass would make, under the same cache key.

Why the merge is exact: every random choice of the stream (which tokens the lenses score, which tokens the sample
keeps) is keyed by (seed, document index, position) (:func:`depthlib.probes.stream.token_keys`), and a shard is
given its documents' corpus indices (``doc_offset``). So

* histograms and per-document rows are those of one pass, bit for bit;
* per (metric, layer) counts, sums and sums of squares add up (means and standard deviations agree with one pass
  to float round-off, ~1e-15 relative: the float64 sums are added in another order);
* the token sample is the union's ``reservoir_size`` smallest sample keys, the sample one pass keeps.

``tests/test_probes.py`` checks a sharded run against one pass with the serial, joblib and submitit executors.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from depthlib import executors, results
from depthlib.errors import InputError
from depthlib.probes import CODE, TABLES, experiment_name, probe_key, run_probe
from depthlib.probes.stream import ProbeConfig, summarize


def shard_ranges(n_docs: int, n_shards: int, batch_size: int = 1) -> list[tuple[int, int]]:
    """``n_shards`` contiguous (start, stop) document ranges covering 0 … n_docs−1, as equal as whole batches allow."""
    if n_shards < 1:
        raise InputError(f"--shards must be >= 1, got {n_shards}")
    batches = -(-n_docs // batch_size)
    n_shards = min(n_shards, batches)
    cuts = [round(i * batches / n_shards) * batch_size for i in range(n_shards + 1)]
    return [(a, min(b, n_docs)) for a, b in zip(cuts[:-1], cuts[1:])]


def probe_shard(model: str, corpus: str, n_docs: int, config: dict, start: int, stop: int) -> str:
    """Probe (or resume, or load) documents start … stop−1; returns the shard's run folder (picklable for executors)."""
    return str(run_probe(model, corpus, n_docs, ProbeConfig(**config), profile="shard", progress=False,
                         doc_range=(start, stop)).path)


def _merge_layers(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Per (metric, layer) count, mean and std of the union from each part's count, mean and std."""
    rows = []
    keyed = [p.set_index(["metric", "layer"]) for p in parts]
    for key in parts[0].set_index(["metric", "layer"]).index:
        c = np.array([float(k.at[key, "count"]) for k in keyed])
        mean = np.array([float(k.at[key, "mean"]) for k in keyed])
        std = np.array([float(k.at[key, "std"]) for k in keyed])
        some, several = c > 0, c > 1                       # an empty part has mean NaN, a single one std NaN
        total = c.sum()
        s = (mean[some] * c[some]).sum()                   # Σ x
        q = (c[some] * mean[some] ** 2).sum() + (std[several] ** 2 * (c[several] - 1)).sum()   # Σ x²
        m = s / total if total else np.nan
        var = max(q / total - m ** 2, 0.0) * total / (total - 1) if total > 1 else np.nan
        rows.append(dict(metric=key[0], layer=int(key[1]), mean=m, std=np.sqrt(var), count=int(total)))
    return pd.DataFrame(rows)


def _merge_histograms(parts: list[pd.DataFrame]) -> pd.DataFrame:
    out = parts[0].copy()
    out["count"] = sum(p["count"].to_numpy() for p in parts)
    return out


def _merge_tokens(parts: list[pd.DataFrame], size: int) -> pd.DataFrame:
    """The ``size`` smallest sample keys of the union (ties by document, then position), in document order."""
    union = pd.concat(parts, ignore_index=True)
    kept = union.sort_values(["sample_key", "doc_index", "position"], kind="stable").head(size)
    return kept.sort_values(["doc_index", "position"]).reset_index(drop=True)


def _computing(model: str, corpus: str, n_docs: int, cfg: ProbeConfig, profile: str):
    """The lifecycle (:func:`depthlib.results.computing`) of the one-pass run of ``model``: the merge is tested to
    equal one pass, so it records the one pass's compute entries."""
    return results.computing(experiment_name(model), probe_key(model, corpus, n_docs, cfg), profile=profile,
                             seed=cfg.seed, code=CODE, device=cfg.device, tables=TABLES)


def _write_merged(job: results.Computation, model: str, corpus: str, n_docs: int, cfg: ProbeConfig,
                  shard_runs: list[results.Run], executor: str) -> None:
    run = job.run
    tables = {name: [r.table(name) for r in shard_runs] for name in TABLES}
    layers = _merge_layers(tables["layers"])
    run.write_table("layers", layers)
    run.write_table("histograms", _merge_histograms(tables["histograms"]))
    run.write_table("tokens", _merge_tokens(tables["tokens"], cfg.reservoir_size))
    run.write_table("docs", pd.concat(tables["docs"], ignore_index=True))
    info = [r.manifest["summary"] for r in shard_runs]
    merged_info = {**{k: v for k, v in info[0].items() if not k.endswith("_by_layer") and not k.startswith("theta_")},
                   "n_docs": sum(i["n_docs"] for i in info), "n_tokens": sum(i["n_tokens"] for i in info),
                   "probe_seconds": round(sum(i["probe_seconds"] for i in info), 3)}
    job.record(summary=summarize(layers, merged_info), model=model, corpus=corpus, executor=executor,
               shards=[f"{r.experiment}/{r.key}" for r in shard_runs],
               shard_wall_time_s=[r.manifest.get("wall_time_s") for r in shard_runs])


def run_sharded(model: str, corpus: str, n_docs: int, cfg: ProbeConfig, executor: executors.ExecutorConfig,
                n_shards: int, *, profile: str = "custom") -> results.Run:
    """Probe ``model`` as ``n_shards`` document shards with ``executor`` and merge them; a finished run is loaded.
    A failed shard raises one :class:`InputError` line naming it and its log; finished shards stay cached."""
    cfg = cfg.validate()
    with _computing(model, corpus, n_docs, cfg, profile) as job:
        if job.complete:
            return job.run
        ranges = shard_ranges(n_docs, n_shards, cfg.batch_size)
        units = [executors.Unit(f"{experiment_name(Path(model).name)}-docs{a}-{b}",
                                "depthlib.probes.shards:probe_shard",
                                dict(model=model, corpus=corpus, n_docs=n_docs, config=dataclasses.asdict(cfg),
                                     start=a, stop=b)) for a, b in ranges]
        shard_runs = executors.finished_runs(units, executor, f"probe of {model}")
        _write_merged(job, model, corpus, n_docs, cfg, shard_runs, executor.kind)
    return job.run


__all__ = ["probe_shard", "run_sharded", "shard_ranges"]

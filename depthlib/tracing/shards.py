"""Chapter 4's causal-tracing run as jobs of an executor, merged into the run one process would make.

Two rounds of units, each its own resumable run under the experiment ``tracing-shards``:

1. per model: which chapter prompts and facts it knows (``check``) and the heat maps of the prompts (``prompts``);
2. per model and slice of the facts it knows: the fact-set traces and their noise-only baseline.

Why the merge is exact: a fact's trace depends on that fact alone (its noise is drawn from the trace's own seed,
:func:`depthlib.tracing.noise.subject_noise`), so the slices, concatenated in order, are the one-process tables;
``tests/test_tracing.py`` checks this bit for bit with the serial, joblib and submitit executors.
"""
from __future__ import annotations

import pandas as pd

from depthlib import executors, results
from depthlib.errors import InputError
from depthlib.tracing import chapter
from depthlib.tracing.facts import load_facts, safe_name

SHARD_EXPERIMENT = "tracing-shards"
#: a shard's numbers are computed by the chapter's code (its code modules are derived from the chapter's entry; the
#: merge is tested to equal the one-process run bit for bit)
CODE = tuple(chapter.COMPUTE.values())


def prompts_unit(config: dict, model: str, device: str = "cpu") -> str:
    """Round 1 for ``model`` of the chapter run ``config``: its check and prompt heat maps; returns the shard's
    run folder."""
    with results.computing(SHARD_EXPERIMENT, {**config, "model": model, "part": "prompts"}, profile=config["name"],
                           seed=config["seed"], code=CODE, device=device) as job:
        if not job.complete:
            check, prompts = chapter.model_prompts(model, config, device)
            job.run.write_table("prompts", prompts)
            job.run.write_table("check", check)
    return str(job.run.path)


def facts_unit(config: dict, model: str, fact_ids: list, device: str = "cpu") -> str:
    """Round 2 for ``model``: the fact-set traces and baseline of the facts ``fact_ids`` (in that order)."""
    with results.computing(SHARD_EXPERIMENT, {**config, "model": model, "part": "facts", "fact_ids": list(fact_ids)},
                           profile=config["name"], seed=config["seed"], code=CODE, device=device) as job:
        if not job.complete:
            by_id = {f.id: f for f in load_facts()}
            facts, baseline = chapter.model_fact_traces(model, config, [by_id[i] for i in fact_ids], device)
            job.run.write_table("facts", facts)
            job.run.write_table("baseline", baseline)
            job.record(fact_ids=list(fact_ids))
    return str(job.run.path)


def _slices(items: list, n: int) -> list[list]:
    """``items`` cut into at most ``n`` contiguous, nearly equal, non-empty slices (none if there are no items)."""
    n = min(n, len(items))
    cuts = [round(i * len(items) / n) for i in range(n + 1)]
    return [items[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def _run_round(units: list[executors.Unit], executor: executors.ExecutorConfig) -> list[results.Run]:
    return executors.finished_runs(units, executor, "causal tracing")


def run_sharded(profile: str, executor: executors.ExecutorConfig, *, extra_models=(), device: str = "cpu",
                fact_shards: int = 2) -> results.Run:
    """Compute the chapter run of ``profile`` as jobs of ``executor`` (each model's facts in ``fact_shards``
    slices) and merge them into the one-process run's cache key; a finished run is loaded."""
    if fact_shards < 1:
        raise InputError(f"--shards must be >= 1, got {fact_shards}")
    config = chapter.chapter_config(profile, extra_models)
    chapter.check_models(config["models"])
    with chapter.computing(config, device=device) as job:
        if job.complete:
            return job.run
        models = config["models"]
        first = _run_round([executors.Unit(f"trace-{safe_name(m)}-prompts", "depthlib.tracing.shards:prompts_unit",
                                           dict(config=config, model=m, device=device)) for m in models], executor)
        plan = [(m, ids) for m, r in zip(models, first)
                for ids in _slices([f.id for f in chapter.chosen_facts(config, r.table("check"))], fact_shards)]
        second = _run_round([executors.Unit(f"trace-{safe_name(m)}-facts-{ids[0]}-{ids[-1]}",
                                            "depthlib.tracing.shards:facts_unit",
                                            dict(config=config, model=m, fact_ids=ids, device=device))
                             for m, ids in plan], executor)
        for m, r in zip(models, first):
            parts = [s for (name, _), s in zip(plan, second) if name == m]

            def cat(table: str) -> pd.DataFrame:
                frames = [s.table(table) for s in parts]
                return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
            chapter.write_model_tables(job.run, m, r.table("check"), r.table("prompts"), cat("facts"), cat("baseline"))
        job.record(executor=executor.kind, shards=[f"{s.experiment}/{s.key}" for s in first + second],
                   shard_wall_time_s=[s.manifest.get("wall_time_s") for s in first + second])
    return job.run


__all__ = ["CODE", "SHARD_EXPERIMENT", "facts_unit", "prompts_unit", "run_sharded"]

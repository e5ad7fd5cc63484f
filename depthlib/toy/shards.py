"""A toy sweep as shards: one shard per teacher correlation ρ (its teachers, every temperature and
replicate, all their students), each its own resumable run, merged into the run the serial sweep would make.

Why the merge is exact: every student's initial weights, data stream and teacher come from seeds derived from its own
(ρ, T, replicate, depth) (:func:`depthlib.toy.models.derive_seed`), so a student trains the same whichever other
students share its engine; the shard runs' per-student tables, put back in the serial run's row order, are the
serial run's tables, and α_ℓ is refitted from the merged curves by the same code. ``tests/test_toy.py`` checks the
merged tables against a serial run bit for bit, with the serial, joblib and submitit (local and debug) executors, at
the same torch thread count (float64 reductions such as the lag cosines differ in the last bits across thread counts).
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from depthlib import executors, paths, results
from depthlib.contract import from_dict
from depthlib.toy import analysis
from depthlib.toy.sweep import EXPERIMENT, SweepConfig, run_sweep

#: shard runs live apart from the sweeps a chapter shows
SHARD_EXPERIMENT = "toy-shards"
#: a merged run's numbers are computed by the sweep's code (its code modules are derived from the sweep's entry; the
#: merge is tested to equal the serial sweep bit for bit)
CODE = ("depthlib.toy.sweep:run_sweep",)


def shard_configs(cfg: SweepConfig) -> list[SweepConfig]:
    """One config per ρ of ``cfg`` (its cells at that ρ, in ``cfg``'s order); one shard if there is one ρ."""
    rhos = list(dict.fromkeys(c[0] for c in cfg.cells))
    return [dataclasses.replace(cfg, cells=tuple(c for c in cfg.cells if c[0] == rho)) for rho in rhos]


def train_shard(config: dict, device: str = "cpu") -> str:
    """Train (or resume, or load) one shard; returns its run folder. Module-level, so executors can pickle it."""
    cfg = from_dict(SweepConfig, config)
    return str(run_sweep(cfg, device, progress=False, experiment=SHARD_EXPERIMENT).path)


def _order(cfg: SweepConfig, df: pd.DataFrame, before: tuple = (), after: tuple = ()) -> pd.DataFrame:
    """Student rows (rho, temperature, replicate, depth) sorted as the serial sweep writes them: by ``before``,
    then cell, replicate and depth in ``cfg``'s order, then ``after``."""
    cell = {c: i for i, c in enumerate(cfg.cells)}
    depth = {d: i for i, d in enumerate(cfg.depths)}
    keyed = df.assign(_cell=[cell[(r, t)] for r, t in zip(df["rho"], df["temperature"])],
                      _depth=[depth[int(d)] for d in df["depth"]])
    return (keyed.sort_values([*before, "_cell", "replicate", "_depth", *after], kind="stable")
            .drop(columns=["_cell", "_depth"]).reset_index(drop=True))


def _students_then_teachers(cfg: SweepConfig, df: pd.DataFrame, within: str) -> pd.DataFrame:
    """Signature-like tables as the serial sweep writes them: students in order (each by ``within``), then the
    replicate-0 teachers by ρ."""
    teachers = df[df["net"] == "teacher"].sort_values(["rho", within], kind="stable")
    return pd.concat([_order(cfg, df[df["net"] == "student"], after=(within,)), teachers], ignore_index=True)


def _computing(cfg: SweepConfig, device: str, root=None):
    """The lifecycle (:func:`depthlib.results.computing`) of the serial sweep's run of ``cfg``."""
    shards = paths.local_results_dir() / SHARD_EXPERIMENT
    return results.computing(EXPERIMENT, cfg.validate().to_dict(), profile=cfg.profile, seed=cfg.seed, code=CODE,
                             device=device, root=root, kept_in=shards,
                             saves=f"finished shards (one per ρ) and their checkpoints are under {shards}")


def merge(cfg: SweepConfig, shard_runs: list[results.Run], job: results.Computation, *, executor: str) -> None:
    """Write the merged run of ``cfg`` (the serial sweep's cache key, ``job.run``) from its finished shard runs."""
    run = job.run
    tables = {name: pd.concat([r.table(name) for r in shard_runs], ignore_index=True)
              for name in ("curves", "signatures", "lag_cos", "teachers")}
    curves = _order(cfg, tables["curves"], before=("step",))
    run.write_table("curves", curves)
    run.write_table("alpha", analysis.final_alpha(curves))
    run.write_table("alpha_steps", analysis.alpha_table(curves))
    run.write_table("signatures", _students_then_teachers(cfg, tables["signatures"], "layer"))
    run.write_table("lag_cos", _students_then_teachers(cfg, tables["lag_cos"], "lag"))
    run.write_table("teachers", tables["teachers"].sort_values(["replicate", "rho"], kind="stable")
                    .reset_index(drop=True))
    m = [r.manifest for r in shard_runs]
    flop = sum(x.get("flop_total") or 0 for x in m)
    wall = job.elapsed
    job.record(n_students=sum(x.get("n_students") or 0 for x in m), flop_total=flop,
               gflop_per_s=round(flop / wall / 1e9, 2) if wall > 0 else None,
               executor=executor, shards=[f"{r.experiment}/{r.key}" for r in shard_runs],
               shard_wall_time_s=[x.get("wall_time_s") for x in m])


def run_sharded(cfg: SweepConfig, executor: executors.ExecutorConfig, device: str = "cpu") -> results.Run:
    """Train ``cfg`` as one shard per ρ with ``executor`` and merge them; a finished merged run is loaded.
    A failed shard raises one :class:`InputError` line naming it and its log; finished shards stay cached."""
    with _computing(cfg, device) as job:
        if job.complete:
            return job.run
        units = [executors.Unit(f"toy-rho{s.cells[0][0]:g}", "depthlib.toy.shards:train_shard",
                                {"config": s.to_dict(), "device": device}) for s in shard_configs(cfg)]
        shard_runs = executors.finished_runs(units, executor, f"toy sweep {job.run.key}")
        merge(cfg, shard_runs, job, executor=executor.kind)
    return job.run


__all__ = ["CODE", "EXPERIMENT", "SHARD_EXPERIMENT", "merge", "run_sharded", "shard_configs", "train_shard"]

"""Runs made of units: a protocol trains one resumable run per unit (a teacher, temperature and replicate), saved
stage by stage, and merges the units' tables into the run a chapter shows (design: one runner owns every run).

Chapter 3's converged and certified protocols (:mod:`depthlib.toy.converged`, :mod:`depthlib.toy.certified`) and
chapter 7's looped students under the certified protocol (:mod:`depthlib.compose.looped_certified`) are such runs. A
:class:`UnitProtocol` names, as dotted strings (so an executor's worker needs nothing registered), the unit's
training function — ``train_unit(cfg, cell, load, save, say, device)``, returning its tables in ``unit_tables``
order — its settings class and the function that merges the units' tables.

A unit's run is opened through the one lifecycle (:func:`depthlib.results.computing`): every finished stage (a
student: its weights, curve and summary row) is one file in the unit's folder, written atomically, so an interrupted
unit resumes stage by stage. A finished unit can be committed on its own (``python -m depthlib.results commit <unit
folder>``: its tables and manifest, never its students' weights); a later stretch on a fresh machine then trains only
the units that are not committed (:func:`committed_unit`), and the merge reads nothing but the units' tables.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from depthlib import paths, results


def resolve(dotted: str):
    """The object at ``module:name``."""
    module, name = dotted.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class UnitProtocol:
    """A run made of units: its experiment (the merged run), its units' experiment, where its code lives."""

    name: str                      # a unit's label begins with it (progress lines, executor logs)
    experiment: str                # the merged run
    units: str                     # one run per (teacher, T, replicate)
    train: str                     # "module:function": train_unit(cfg, cell, load, save, say, device) -> tables
    config_class: str              # "module:Class" of the settings (a Profile)
    unit_tables: tuple[str, ...]   # what ``train`` returns, in order
    merge: str                     # "module:function": (cfg, {table: stacked units' table}) -> {table: merged}, or
                                   # ({table: merged}, {manifest entry: value}) to record the merge's checks too
    stage_format: str = "student"  # a saved stage: "student" (depthlib.toy.certified.Student), "triple"
                                   # (weights, curve, row: the converged protocol's) or "tables" ({name: DataFrame}:
                                   # a finished member's tables, chapter 7's hierarchy control)

    def label(self, cell: dict) -> str:
        """The unit's name in progress lines: a toy unit's teacher, temperature and replicate, else its cell's
        values."""
        if "rho" in cell:
            from depthlib.toy.converged import TEACHER_KINDS
            return f"{self.name}-{TEACHER_KINDS[cell['rho']]}-T{cell['temperature']:g}-r{cell['replicate']}"
        return "-".join([self.name, *(str(v) for v in cell.values())])

    def settings(self, config: dict):
        return resolve(self.config_class).from_dict(config).validate()


def merged_by_units() -> dict[str, str]:
    """Every chapter's units experiment → the experiment of the run its units merge into. A unit's tables are rows of
    its merged run's, so a replay that compares the merged run's tables compares its units' (:mod:`depthlib.purity`)."""
    from depthlib.chapters import CHAPTERS
    found = {}
    for chapter in CHAPTERS:
        for value in vars(chapter.module).values():
            for p in value.values() if isinstance(value, dict) else (value,):
                if isinstance(p, UnitProtocol):
                    found[p.units] = p.experiment
    return found


def _stage_io(protocol: UnitProtocol, run: results.Run, job):
    """``load(stage, depth)`` and ``save(stage, depth, ...)`` of one unit: every finished student (its weights, curve
    and summary row), or member (its tables), is one file in the unit's folder, written atomically."""
    import torch

    from depthlib.toy.certified import Student
    from depthlib.toy.models import StudentWeights

    tables = protocol.stage_format == "tables"

    def path(stage, depth):
        return run.path / (f"{stage}_{depth:03d}.pt" if tables else f"student_{stage}_{depth:03d}.pt")

    def load(stage, depth):
        p = path(stage, depth)
        if not (p.exists() and results.readable_checkpoint(p)):
            return None
        s = torch.load(p, weights_only=False)
        if tables:
            return s
        w, curve, row = StudentWeights(**s["weights"]), pd.DataFrame(s["curve"]), s["row"]
        return Student(w, row, curve) if protocol.stage_format == "student" else (w, curve, row)

    def save(stage, depth, *done):
        if tables:
            results.atomic_torch_save(path(stage, depth), done[0])
            job.save_progress()
            return
        w, curve, row = ((done[0].weights, done[0].curve, done[0].row) if protocol.stage_format == "student"
                         else done)
        results.atomic_torch_save(path(stage, depth), {"weights": dataclasses.asdict(w), "row": row,
                                                       "curve": curve.to_dict("list")})
        job.save_progress()

    return load, save


def committed_unit(protocol: UnitProtocol, config: dict, cell: dict) -> results.Run | None:
    """The unit of these settings committed under ``data/results/<units experiment>`` by an earlier stretch of the
    run, if it is fresh (computed by the current code), else None. A committed unit has no weights, so what reuses
    them (chapter 5's toy controls) trains the unit again in the local cache."""
    root = paths.committed_results_dir()
    return None if root is None else results.fresh_run(protocol.units, {**config, "cell": cell}, [root])


def train_unit(protocol: dict, config: dict, cell: dict, device: str = "cpu", progress: bool = False,
               committed: bool = True) -> str:
    """Every stage of one unit of ``protocol`` (a :class:`UnitProtocol` as a dict, so any executor can carry it),
    resumable stage by stage in the unit's folder in the local cache. Returns the unit's run folder: a committed one
    (:func:`committed_unit`) when ``committed`` and there is one."""
    import torch

    from depthlib import runtime
    p = UnitProtocol(**{**protocol, "unit_tables": tuple(protocol["unit_tables"])})
    if committed and (done := committed_unit(p, config, cell)) is not None:
        return str(done.path)
    runtime.configure_process()
    cfg = p.settings(config)
    with results.computing(p.units, {**cfg.to_dict(), "cell": cell}, profile=cfg.profile, code=(p.train,),
                           seed=cfg.seed, device=device,
                           saves="every finished student of this unit is saved in {folder}") as job:
        if job.complete:
            return str(job.run.path)
        run = job.run
        load, save = _stage_io(p, run, job)
        say = (lambda msg: print(f"[depthlib] {p.label(cell)}: {msg}", file=sys.stderr, flush=True)) \
            if progress else (lambda msg: None)
        out = resolve(p.train)(cfg, cell, load, save, say, device)
        if p.stage_format == "triple":               # the converged protocol returns (rows, [curves])
            out = (pd.DataFrame(out[0]), pd.concat(out[1], ignore_index=True))
        for name, table in zip(p.unit_tables, out):
            run.write_table(name, table)
        job.record(cell=cell, torch_threads=torch.get_num_threads())
    return str(run.path)


def train_units(protocol: UnitProtocol, cfg, cells: list[dict], device: str = "cpu", *, committed: bool = True,
                executor=None) -> list[results.Run]:
    """The finished runs of the units ``cells``, trained now where neither the local cache nor — when ``committed`` —
    the committed results hold them (:func:`train_unit`), on ``executor`` (default: one process per core, each on one
    torch thread — the measured-fast layout)."""
    from depthlib import executors
    units = [executors.Unit(protocol.label(c), "depthlib.units:train_unit",
                            {"protocol": dataclasses.asdict(protocol), "config": cfg.to_dict(), "cell": c,
                             "device": device, "committed": committed})
             for c in cells]
    ex = executor or executors.ExecutorConfig("joblib", jobs=max(1, min(os.cpu_count() or 1, len(units))), threads=1)
    try:
        return executors.finished_runs(units, ex, f"{protocol.name} protocol ({cfg.profile})")
    except KeyboardInterrupt as err:           # the units run in their own lifecycles: say where they are kept
        if isinstance(err, results.RunInterrupted):
            raise
        folder = paths.local_results_dir() / protocol.units
        raise results.RunInterrupted(folder, f"every finished unit (a teacher, temperature and replicate) is kept "
                                             f"under {folder}") from None


def _units_wall_time(unit_runs: list[results.Run], started: float | None) -> float:
    """Wall time of the units, in seconds: since ``started`` (``time.time()`` when the command began them; units that
    ran side by side count once) plus the recorded wall time of every unit finished before it (an earlier command's);
    without ``started``, the units' wall times one after another."""
    walls = [(r, float(r.manifest.get("wall_time_s") or 0.0)) for r in unit_runs]
    if started is None:
        return sum(w for _, w in walls)
    earlier = sum(w for r, w in walls if (r.path / "manifest.json").stat().st_mtime < started)
    return max(time.time() - started, 0.0) + earlier


def merge_units(protocol: UnitProtocol, cfg, unit_runs: list[results.Run], started: float | None = None
                ) -> results.Run:
    """The protocol's run: its tables merged from its units' by ``protocol.merge``.

    Its manifest's ``wall_time_s`` is the whole run's: the units' (:func:`_units_wall_time`; ``started``: when the
    command began them), recorded as the earlier segments of the run, plus the merge (``merge_wall_time_s``);
    ``unit_wall_time_s`` is the units' wall times added up (more than the wall time when they ran side by side)."""
    run = results.prepare_run(results.open_run(protocol.experiment, cfg.to_dict()))
    before = None
    if not run.complete:             # the units are this run's earlier segments: the lifecycle adds the merge to them
        before = round(_units_wall_time(unit_runs, started), 3)
        run.path.mkdir(parents=True, exist_ok=True)
        run.record_elapsed(before)
    with results.computing(protocol.experiment, cfg.to_dict(), profile=cfg.profile, code=(protocol.train,),
                           seed=cfg.seed, device="cpu") as job:
        if job.complete:
            return job.run
        run = job.run
        stacked = {name: pd.concat([r.table(name) for r in unit_runs], ignore_index=True)
                   for name in protocol.unit_tables}
        merged = resolve(protocol.merge)(cfg, stacked)
        merged, checks = merged if isinstance(merged, tuple) else (merged, {})
        for name, table in merged.items():
            run.write_table(name, table)
        units = {r.path.name: {"cell": r.manifest.get("cell"), "wall_time_s": r.manifest.get("wall_time_s"),
                               "torch_threads": r.manifest.get("torch_threads")} for r in unit_runs}
        job.record(**checks, units=units, unit_wall_time_s=round(sum(u["wall_time_s"] or 0 for u in units.values()), 3),
                   merge_wall_time_s=round(max(job.elapsed - (before or 0.0), 0.0), 3))
    return run


def protocol_run(protocol: UnitProtocol, profile: str, settings: Callable[[str], object | None],
                 cells: Callable[[object], list[dict]], device: str = "cpu", *, rerun: bool = False,
                 executor=None) -> results.Run:
    """The protocol's run a chapter shows for ``profile`` (the one rule, :func:`depthlib.results.select_run`;
    ``settings(profile)``: that profile's settings, None for an unknown one); if there is none, its units
    (``cells(settings)``, in the order they should run) are trained now (:func:`train_units`) and merged. A unit
    committed by an earlier stretch (:func:`committed_unit`) is not retrained, unless ``rerun``."""
    results.check_profile(profile)
    cfg = settings(profile)

    def make() -> results.Run:
        started = time.time()
        done = train_units(protocol, cfg, cells(cfg), device, committed=not rerun, executor=executor)
        return merge_units(protocol, cfg, done, started)

    return results.chapter_run(protocol.experiment, profile, make, rerun=rerun,
                               expected_config=lambda q: None if settings(q) is None else settings(q).to_dict())


__all__ = ["UnitProtocol", "committed_unit", "merge_units", "merged_by_units", "protocol_run", "resolve", "train_unit",
           "train_units"]

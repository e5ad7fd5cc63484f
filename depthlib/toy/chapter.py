"""Chapter 3's glue: the profiles of the toy sweep, the run the chapter shows, and its replay check.

Every chapter has this module with the same three names (design: "Every chapter has the same shape"):
``PROFILES`` (smoke | cpu | paper settings), ``chapter_run(profile, rerun=...)`` (the run found by
:func:`depthlib.results.chapter_run`, computed if there is none) and ``replay(run)`` (recompute a cheap prefix
of a run with the current code and return the committed and recomputed numbers side by side).
"""
from __future__ import annotations

import dataclasses
import shutil
import sys

import numpy as np
import pandas as pd

from depthlib import results, runtime
from depthlib.errors import InputError
from depthlib.toy.sweep import (
    EXPERIMENT,
    PAPER_TEMPERATURES,
    SweepConfig,
    build_engine,
    grid,
    open_sweep_run,
    run_sweep,
)

#: The phase diagram. smoke: seconds, proves the code path (numbers meaningless). cpu: teachers of five ρ, all
#: normalised to the ρ = 0 teacher's displacement (so ρ changes how smooth the teacher is, not how far it goes),
#: × 3 temperatures, 3 depths over two octaves, batch 256, final lr decay (measured on this project's 2-core machines): 10.6 GFLOP
#: per step × 6k steps. paper: exp-9 + exp-9-1 (ρ ∈ {0, 1}, 16 T, 3 replicates, 6 depths, 40k × 1024) plus a ρ
#: grid at three temperatures.
PROFILES: dict[str, SweepConfig] = {
    "smoke": SweepConfig("smoke", variant="exp-9-decay", cells=grid((0.0, 0.5, 1.0), (0.1, 1.0)), depths=(2, 4, 8),
                         replicates=1, steps=60, batch=64, eval_every=20, eval_batches=2, eval_batch_size=256,
                         teacher_depth=16, signature_inputs=128, teacher_norm="displacement"),
    "cpu": SweepConfig("cpu", variant="exp-9-decay",
                       cells=grid((0.0, 0.25, 0.5, 0.75, 1.0), [PAPER_TEMPERATURES[i] for i in (0, 8, 15)]),
                       depths=(6, 12, 24), replicates=1, steps=6_000, batch=256, eval_every=500,
                       teacher_norm="displacement"),
    "paper": SweepConfig("paper", variant="exp-9",
                         cells=grid((0.0, 1.0), PAPER_TEMPERATURES)
                         + grid((0.25, 0.5, 0.75, 0.9), [PAPER_TEMPERATURES[i] for i in (0, 8, 15)]),  # 0.01, 0.117, 1
                         replicates=3, steps=40_000, batch=1024, eval_every=500),
}

#: The calibration (paper §4, Fig. 4a,b): the two edge cells at T = 1, the paper's unnormalised teachers, one run
#: each (so they train side by side as two 1-thread processes). Both in the exp-9-3 form (the student is given
#: the teacher's fixed head; lr 2.4e-3/√ℓ, final 20 % linear decay to 10 %), so only the teacher differs.
#: cpu: 4 depths over three octaves, batch 1024, 24k steps (6.65 GFLOP per step and run). paper: 80k steps, the
#: paper's six depths, 3 replicates (common random numbers: one teacher per replicate).
CALIBRATION_EXPERIMENT = "toy-calibration"
CALIBRATION_KINDS = {1.0: "tied", 0.0: "independent"}


def _calibration(profile: str, **settings) -> tuple[SweepConfig, ...]:
    return tuple(SweepConfig(profile, variant="exp-9-3", cells=grid((rho,), (1.0,)), **settings)
                 for rho in CALIBRATION_KINDS)


CALIBRATION: dict[str, tuple[SweepConfig, ...]] = {
    "smoke": _calibration("smoke", depths=(2, 4, 8), replicates=1, steps=80, batch=64, eval_every=20,
                          eval_batches=2, eval_batch_size=256, teacher_depth=16, signature_inputs=128),
    "cpu": _calibration("cpu", depths=(6, 12, 24, 48), replicates=1, steps=24_000, batch=1024, eval_every=500),
    "paper": _calibration("paper", depths=(6, 12, 16, 24, 32, 48), replicates=3, steps=80_000, batch=1024,
                          eval_every=500),
}


def profile_config(profile: str = "smoke", *, rhos=None, temperatures=None, depths=None, steps=None,
                   replicates=None, **overrides) -> SweepConfig:
    """A profile's config, optionally overridden (then labelled ``custom``: never shown by the book)."""
    if profile not in PROFILES:
        raise InputError(f"unknown profile {profile!r} (have {', '.join(PROFILES)})")
    cfg = PROFILES[profile]
    changes = dict(overrides)
    if rhos is not None or temperatures is not None:
        r = rhos if rhos is not None else sorted({c[0] for c in cfg.cells})
        t = temperatures if temperatures is not None else sorted({c[1] for c in cfg.cells})
        changes["cells"] = grid(r, t)
    if depths is not None:
        changes["depths"] = tuple(int(d) for d in depths)
    if steps is not None:
        changes["steps"] = int(steps)
        changes["eval_every"] = min(cfg.eval_every, max(1, int(steps)))
    if replicates is not None:
        changes["replicates"] = int(replicates)
    if changes:
        cfg = dataclasses.replace(cfg, profile="custom", **changes)
    return cfg.validate()


def train(cfg: SweepConfig, device: str = "cpu", *, force: bool = False, progress: bool = True,
          allow_tf32: bool = False, root=None, experiment: str = EXPERIMENT) -> results.Run:
    """Train (or resume, or load) a sweep, checking its run folder first (:func:`depthlib.results.prepare_run`):
    a partial run with an unreadable curve table or ``checkpoint.pt`` (or a finished run whose manifest or tables
    do not read or fail their checksums) is reported in one stderr line naming its folder, deleted and restarted,
    instead of failing after all the remaining training; ``force`` deletes the run first. Temporary files a crash
    left in the folder (e.g. a checkpoint cut short by a full disk) are removed."""
    runtime.configure_process()   # a long run: steady malloc, passive OpenMP waiting
    run = open_sweep_run(cfg, allow_tf32, root, experiment)
    results.remove_stray_tmp(run.path)
    results.prepare_run(run, force=force, checkpoints=("checkpoint.pt",))
    try:
        return run_sweep(cfg, device, progress=progress, allow_tf32=allow_tf32, root=root, experiment=experiment)
    finally:
        results.remove_stray_tmp(run.path)


def _expected(profile: str) -> dict | None:
    return PROFILES[profile].to_dict() if profile in PROFILES else None


def chapter_run(profile: str = "smoke", device: str = "cpu", *, rerun: bool = False,
                progress: bool = False) -> results.Run:
    """The sweep chapter 3 shows for ``profile`` (the one rule: :func:`depthlib.results.select_run`);
    if there is none, the profile is trained now (cached, resumable)."""
    results.check_profile(profile)
    return results.chapter_run(EXPERIMENT, profile, lambda: train(PROFILES[profile], device, progress=progress),
                               expected_config=_expected, rerun=rerun)


def train_calibration(profile: str, kind: str, device: str = "cpu") -> str:
    """Train (or resume, or load) one calibration run (``kind``: tied | independent); returns its folder.
    Module-level, so an executor can run the two side by side."""
    cfg = next(c for c in CALIBRATION[profile] if CALIBRATION_KINDS[c.cells[0][0]] == kind)
    return str(train(cfg, device, progress=False, experiment=CALIBRATION_EXPERIMENT).path)


def calibration_runs(profile: str = "smoke", device: str = "cpu", *, rerun: bool = False,
                     executor=None) -> dict[str, results.Run]:
    """The calibration runs chapter 3 shows for ``profile``, by kind (``tied``, ``independent``): the same rule
    as every chapter (:func:`depthlib.results.select_run`, matched on each run's own config). Missing ones are
    trained now, in this process or, with an :class:`~depthlib.executors.ExecutorConfig`, as units of it."""
    from depthlib import executors
    results.check_profile(profile)
    found, missing = {}, []
    for i, cfg in enumerate(CALIBRATION[profile]):
        def expected(prof, i=i):
            return CALIBRATION[prof][i].to_dict() if prof in CALIBRATION else None
        kind = CALIBRATION_KINDS[cfg.cells[0][0]]
        run = results.select_run(CALIBRATION_EXPERIMENT, profile, expected_config=expected, rerun=rerun)
        try:
            found[kind] = run.validate() if run is not None else None
        except results.CorruptRunError as err:
            if run.committed:
                raise
            print(f"[depthlib] {err}; recomputing it", file=sys.stderr)
            shutil.rmtree(run.path)
            found[kind] = None
        if found[kind] is None:
            missing.append(kind)
    if missing:
        units = [executors.Unit(f"calibration-{kind}", "depthlib.toy.chapter:train_calibration",
                                {"profile": profile, "kind": kind, "device": device}) for kind in missing]
        runs = executors.finished_runs(units, executor or executors.ExecutorConfig(), CALIBRATION_EXPERIMENT,
                                       f"calibration ({profile})")
        for kind, run in zip(missing, runs):
            found[kind] = run
            found[kind].config = run.manifest["config"]
    return {kind: found[kind] for kind in (CALIBRATION_KINDS[c.cells[0][0]] for c in CALIBRATION[profile])}


def calibration_tables(runs: dict[str, results.Run]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The calibration runs' curves and α_ℓ-per-step tables, stacked, with a ``teacher`` column (tied | independent)."""
    curves = pd.concat([r.table("curves").assign(teacher=k) for k, r in runs.items()], ignore_index=True)
    steps = pd.concat([r.table("alpha_steps").assign(teacher=k) for k, r in runs.items()], ignore_index=True)
    return curves, steps


def calibration_summary(runs: dict[str, results.Run]) -> pd.DataFrame:
    """One row per calibration run: its final α_ℓ with interval, how fast α_ℓ still moved (per 1,000 steps, a
    least-squares slope) over the last 20 % of training (the lr decay) and the 20 % before, the final test
    loss of every depth and the local slopes −Δlog L/Δlog ℓ between neighbouring depths."""
    rows = []
    for kind, run in runs.items():
        cfg = config_of(run)
        steps = run.table("alpha_steps").sort_values("step")
        curves = run.table("curves")
        last = curves[curves["step"] == curves["step"].max()].groupby("depth")["test_loss"].mean().sort_index()
        final = steps.iloc[-1]
        row = {"teacher": kind, "rho": cfg.cells[0][0], "temperature": cfg.cells[0][1], "variant": cfg.variant,
               "steps": cfg.steps, "batch": cfg.batch, "alpha": final["alpha"], "lo": final["lo"], "hi": final["hi"],
               "interval": final["interval"]}
        for name, (a, b) in {"decay": (0.8, 1.0), "before_decay": (0.6, 0.8)}.items():
            win = steps[(steps["step"] > a * cfg.steps) & (steps["step"] <= b * cfg.steps)]
            rate = np.polyfit(win["step"] / 1000, win["alpha"], 1)[0] if len(win) >= 2 else np.nan
            row[f"alpha_per_1k_steps_{name}"] = float(rate)
        for d, loss in last.items():
            row[f"loss_depth_{int(d)}"] = float(loss)
        depths = last.index.to_numpy(float)
        for (d0, d1), (l0, l1) in zip(zip(depths[:-1], depths[1:]), zip(last.values[:-1], last.values[1:])):
            row[f"slope_{int(d0)}_{int(d1)}"] = float(-np.log(l1 / l0) / np.log(d1 / d0))
        rows.append(row)
    return pd.DataFrame(rows)


def calibration_findings(summary: pd.DataFrame) -> list[str]:
    """The chapter's sentences about the calibration, generated from :func:`calibration_summary`: no number in
    them is typed by hand."""
    lines = []
    for r in summary.itertuples():
        slopes = [c for c in summary.columns if c.startswith("slope_")]
        local = ", ".join(f"{c[6:].replace('_', '→')}: {getattr(r, c):.2f}" for c in slopes)
        rates = [f"{rate:+.3f} per 1,000 steps {when}" for rate, when in
                 ((r.alpha_per_1k_steps_decay, "during the final decay"),
                  (r.alpha_per_1k_steps_before_decay, "in the 20 % of steps before it")) if np.isfinite(rate)]
        moved = f"; α_ℓ moved {' and '.join(rates)}" if rates else ""
        lines.append(f"{r.teacher} teacher (ρ = {r.rho:g}, T = {r.temperature:g}, {r.variant}, {r.steps:,} steps × "
                     f"{r.batch}): α_ℓ = {r.alpha:.2f} [{r.lo:.2f}, {r.hi:.2f}] — {r.interval}; local slopes {local}"
                     f"{moved}.")
    if {"tied", "independent"} <= set(summary["teacher"]):
        t, i = (summary[summary["teacher"] == k].iloc[0] for k in ("tied", "independent"))
        apart = t["lo"] > i["hi"]
        lines.append(f"Tied minus independent: Δα_ℓ = {t['alpha'] - i['alpha']:+.2f}; the 95 % intervals "
                     + ("do not overlap." if apart else "overlap."))
    return lines


def replay(run: results.Run, n_students: int = 1) -> pd.DataFrame:
    """Retrain the ``n_students`` shallowest students of the first cell up to the run's first evaluation with the
    current code; returns their committed and recomputed test losses (columns ``committed``, ``replayed``)."""
    cfg = config_of(run)
    first_cell, depths = cfg.cells[0], sorted(cfg.depths)[:n_students]
    def keep(row):
        return ((row["rho"], row["temperature"]) == first_cell and row["replicate"] == 0
                and row["depth"] in depths)
    eng, students, _ = build_engine(cfg, "cpu", keep=keep)
    first_eval = min(cfg.eval_every, cfg.steps)
    for _ in range(first_eval):
        eng.step()
    replayed = students.assign(step=first_eval, replayed=eng.evaluate().cpu().numpy())
    curves = run.table("curves").rename(columns={"test_loss": "committed"})
    return replayed.merge(curves[["rho", "temperature", "replicate", "depth", "step", "committed"]],
                          on=["rho", "temperature", "replicate", "depth", "step"], how="left")


def config_of(run: results.Run) -> SweepConfig:
    """The :class:`SweepConfig` a run was trained with."""
    return SweepConfig(**{**run.config, "cells": tuple(tuple(c) for c in run.config["cells"]),
                          "depths": tuple(run.config["depths"])})


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    m = run.manifest
    c = m.get("config", {})
    return {**results.run_info(run), **{k: c.get(k) for k in ("variant", "steps", "batch", "depths", "replicates",
                                                             "teacher_depth")},
            "rhos": sorted({cell[0] for cell in c.get("cells", [])}),
            "temperatures": sorted({cell[1] for cell in c.get("cells", [])}), "flop": m.get("flop_total")}

"""Chapter 3's glue: the profiles of the toy sweep, the run the chapter shows, and its replay check.

Every chapter has this module with the same three names (design: "Every chapter has the same shape"):
``PROFILES`` (smoke | cpu | paper settings), ``chapter_run(profile, rerun=...)`` (the run found by
:func:`depthlib.results.chapter_run`, computed if there is none) and ``replay(run)`` (recompute a cheap prefix
of a run with the current code and return the committed and recomputed numbers side by side).
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from depthlib import results
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

#: smoke: seconds, proves the code path (numbers meaningless). cpu: the reduced sweep sized for `make book`'s
#: 20-minute budget on 2 idle cores (8.6 GFLOP/step × 10k steps at ≈ 100 GFLOP/s; several times longer on a busy
#: machine): 3 ρ × 2 T, 4 depths over 3 octaves, batch 256, final lr decay (toy-performance.md §4: the decay is
#: the single most important change at a small budget). paper: exp-9 + exp-9-1 (ρ ∈ {0, 1},
#: 16 T, 3 replicates, 6 depths, 40k × 1024) plus a ρ grid at three temperatures.
PROFILES: dict[str, SweepConfig] = {
    "smoke": SweepConfig("smoke", variant="exp-9-decay", cells=grid((0.0, 0.5, 1.0), (0.1, 1.0)), depths=(2, 4, 8),
                         replicates=1, steps=60, batch=64, eval_every=20, eval_batches=2, eval_batch_size=256,
                         teacher_depth=16, signature_inputs=128),
    "cpu": SweepConfig("cpu", variant="exp-9-decay", cells=grid((0.0, 0.5, 1.0), (0.1, 1.0)), depths=(6, 12, 24, 48),
                       replicates=1, steps=10_000, batch=256, eval_every=1_000),
    "paper": SweepConfig("paper", variant="exp-9",
                         cells=grid((0.0, 1.0), PAPER_TEMPERATURES)
                         + grid((0.25, 0.5, 0.75, 0.9), [PAPER_TEMPERATURES[i] for i in (0, 8, 15)]),  # 0.01, 0.117, 1
                         replicates=3, steps=40_000, batch=1024, eval_every=500),
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
          allow_tf32: bool = False, root=None) -> results.Run:
    """Train (or resume, or load) a sweep, checking its run folder first (:func:`depthlib.results.prepare_run`):
    a partial run with an unreadable curve table or ``checkpoint.pt`` (or a finished run whose manifest or tables
    do not read or fail their checksums) is reported in one stderr line naming its folder, deleted and restarted,
    instead of failing after all the remaining training; ``force`` deletes the run first. Temporary files a crash
    left in the folder (e.g. a checkpoint cut short by a full disk) are removed."""
    run = open_sweep_run(cfg, allow_tf32, root)
    results.remove_stray_tmp(run.path)
    results.prepare_run(run, force=force, checkpoints=("checkpoint.pt",))
    try:
        return run_sweep(cfg, device, progress=progress, allow_tf32=allow_tf32, root=root)
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


def replay(run: results.Run, n_students: int = 1) -> pd.DataFrame:
    """Retrain the ``n_students`` shallowest students of the first cell up to the run's first evaluation with the
    current code; returns their committed and recomputed test losses (columns ``committed``, ``replayed``)."""
    cfg = SweepConfig(**{**run.config, "cells": tuple(tuple(c) for c in run.config["cells"]),
                         "depths": tuple(run.config["depths"])})
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


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    m = run.manifest
    c = m.get("config", {})
    return {**results.run_info(run), **{k: c.get(k) for k in ("variant", "steps", "batch", "depths", "replicates",
                                                             "teacher_depth")},
            "rhos": sorted({cell[0] for cell in c.get("cells", [])}),
            "temperatures": sorted({cell[1] for cell in c.get("cells", [])}), "flop": m.get("flop_total")}

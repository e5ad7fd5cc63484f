"""Wall time of a toy sweep run serially and as joblib workers on this machine.

Trains the chapter-3 sweep of ``--profile`` (default ``cpu``: 5 ρ × 3 T × depths 6/12/24, batch 256) twice, each in
its own empty cache folder, one after the other:

* ``serial``: one process, one engine for all students, on all the machine's cores (torch threads = cores);
* ``joblib``: one shard per ρ (:mod:`depthlib.toy.shards`) on ``--jobs`` loky worker processes of one torch thread
  each, merged into the serial run's tables.

Prints both wall times, their ratio, and how far the merged tables are from the serial ones (not bit for bit here:
float64 reductions differ in the last bits between thread counts; ``tests/test_executors.py`` checks bit-for-bit
equality at equal thread counts). ``--steps`` shortens the sweep (every shard's cost scales with it), ``--quick``
runs a smoke-sized sweep in seconds. Writes ``benchmarks/out/bench_executors_<profile>.json``. No assertions.

    python benchmarks/bench_executors.py [--profile cpu] [--steps 1500] [--jobs 2] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: spinning threads stall a shared box

import numpy as np  # noqa: E402
import torch  # noqa: E402

from depthlib import executors  # noqa: E402
from depthlib.runtime import steady_malloc  # noqa: E402
from depthlib.toy import chapter, shards  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


def _timed(folder: Path, compute):
    os.environ["DEPTHLIB_CACHE_DIR"] = str(folder)           # read at call time, passed on to the workers
    t0 = time.perf_counter()
    run = compute()
    return run, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu", choices=("smoke", "cpu", "paper"))
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the profile's)")
    ap.add_argument("--jobs", type=int, default=2, help="joblib workers (default 2)")
    ap.add_argument("--quick", action="store_true", help="the smoke profile at 20 steps (seconds)")
    args = ap.parse_args()
    steady_malloc()
    profile, steps = ("smoke", 20) if args.quick else (args.profile, args.steps)
    cfg = chapter.profile_config(profile, steps=steps)
    cores = os.cpu_count() or 1
    print(f"sweep: profile {profile}, {len(cfg.cells)} cells × {cfg.replicates} replicate(s) × depths "
          f"{list(cfg.depths)}, {cfg.steps} steps × batch {cfg.batch}; {cores} cores", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        torch.set_num_threads(cores)
        serial, t_serial = _timed(Path(tmp) / "serial", lambda: chapter.compute(cfg, progress=False))
        print(f"serial, {cores} torch threads: {t_serial:.1f} s", flush=True)
        ex = executors.ExecutorConfig("joblib", jobs=args.jobs, threads=max(1, cores // args.jobs))
        merged, t_jobs = _timed(Path(tmp) / "joblib", lambda: shards.run_sharded(cfg, ex))
        n_shards = len(merged.manifest["shards"])
        print(f"joblib, {args.jobs} workers × {ex.threads} thread(s), {n_shards} shards: {t_jobs:.1f} s", flush=True)
        a, b = serial.table("alpha"), merged.table("alpha")
        ca, cb = serial.table("curves"), merged.table("curves")
        rel = np.abs(cb["test_loss"].to_numpy() / ca["test_loss"].to_numpy() - 1)
        out = {"profile": profile, "steps": cfg.steps, "cells": len(cfg.cells), "depths": list(cfg.depths),
               "batch": cfg.batch, "cores": cores, "jobs": args.jobs, "shards": n_shards,
               "serial_wall_s": round(t_serial, 1), "joblib_wall_s": round(t_jobs, 1),
               "speedup_joblib_over_serial": round(t_serial / t_jobs, 3),
               "shard_wall_s": merged.manifest.get("shard_wall_time_s"),
               "max_abs_alpha_difference": float(np.nanmax(np.abs(a["alpha"].to_numpy() - b["alpha"].to_numpy()))),
               "max_rel_test_loss_difference": float(np.nanmax(rel)),
               "gflop_per_s": {"serial": serial.manifest.get("gflop_per_s"),
                               "joblib": merged.manifest.get("gflop_per_s")}}
    print(json.dumps(out, indent=2))
    OUT.mkdir(exist_ok=True)
    (OUT / f"bench_executors_{profile}.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

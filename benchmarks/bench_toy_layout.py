"""Which process/thread layout trains toy students fastest on this machine (the default of ``depthlib toy``).

The same work — ``--units`` independent units, each one engine of ``--students`` students of depth ``--depth``
trained ``--steps`` steps at batch ``--batch`` — is timed in three layouts, one after another in this run:

* ``1 process × all threads``: the units one after another in this process, torch's default thread count;
* ``1 process × 1 thread``:     the units one after another, one torch thread;
* ``joblib × 1 thread``:        one worker process per core, one torch thread each (``depthlib toy``'s default for the
                                converged protocol, and ``--threads 1`` for the rest).

Prints each layout's wall time and its ratio to the default (joblib × 1 thread). No assertions: a benchmark reports.

    python benchmarks/bench_toy_layout.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import time


def unit(depth: int, students: int, steps: int, batch: int, threads: int, seed: int) -> float:
    """Train one unit; returns its wall time in seconds."""
    import torch

    from depthlib.runtime import configure_process
    from depthlib.toy.engine import BatchedStudents, StudentSpec
    from depthlib.toy.models import make_teacher, variant
    configure_process(threads)
    t0 = time.perf_counter()
    teacher = make_teacher(1.0, seed)
    eng = BatchedStudents([teacher], [StudentSpec(0, 1.0, depth, seed + k) for k in range(students)],
                          variant("exp-9-3"), steps, batch=batch, eval_batches=1, eval_batch_size=batch, chunk=4)
    for _ in range(steps):
        eng.step()
    torch.set_num_threads(os.cpu_count() or 1)
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny settings: a smoke test of the code path")
    p.add_argument("--units", type=int, default=4)
    p.add_argument("--students", type=int, default=2)
    p.add_argument("--depth", type=int, default=24)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=1024)
    a = p.parse_args(argv)
    if a.quick:
        a.units, a.students, a.depth, a.steps, a.batch = 2, 1, 4, 5, 64
    cores = os.cpu_count() or 1
    work = [(a.depth, a.students, a.steps, a.batch) for _ in range(a.units)]
    out = {}
    t0 = time.perf_counter()
    for i, w in enumerate(work):
        unit(*w, threads=cores, seed=i)
    out[f"1 process × {cores} threads"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i, w in enumerate(work):
        unit(*w, threads=1, seed=i)
    out["1 process × 1 thread"] = time.perf_counter() - t0
    from joblib import Parallel, delayed
    t0 = time.perf_counter()
    Parallel(n_jobs=cores)(delayed(unit)(*w, threads=1, seed=i) for i, w in enumerate(work))
    out[f"joblib {cores} workers × 1 thread (default)"] = time.perf_counter() - t0
    default = out[f"joblib {cores} workers × 1 thread (default)"]
    for name, s in out.items():
        print(f"{name:40s} {s:8.2f} s   {s / default:5.2f}× the default's wall time")
    return out


if __name__ == "__main__":
    main()

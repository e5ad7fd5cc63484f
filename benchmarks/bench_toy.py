"""Toy training speed: the batched engine against a plain one-student-at-a-time loop.

In one process, interleaved round by round (each round runs every contender once, so machine load hits
both alike), at the paper's shapes and numerics (fp32, batch 1024 unless --batch):

* ``plain``: the paper's loop (``exp-9.py`` step body): for each student, its own teacher forward, the
  student forward/backward by autograd, ``torch.optim.Adam`` per-tensor (for-loop) update.
* ``batched``: :class:`depthlib.toy.engine.BatchedStudents`, one step for all students.
* ``matmul``: this machine's fp32 matmul rate (square ``torch.mm``), the ceiling the others are held to.

Reports model-steps/s, achieved GFLOP/s (matmul FLOPs, 2·m·n·k), the fraction of the measured matmul rate,
the median per-round speed-up, and a same-numerics check (max relative loss difference after a few steps
on identical seeds and inputs). Writes ``benchmarks/out/bench_toy_<device>.json``. No assertions.

With ``--device cuda`` it also times the full paper sweep engine (exp-9 + exp-9-1: 96 teacher cells ×
6 depths = 576 students, batch 1024) and projects the 40k-step wall time; ``--tf32`` adds a TF32-vs-fp32
loss comparison on the same seeds (the accuracy check any TF32 use must pass). ``--quick`` shrinks
everything so the whole script runs in well under a minute on a CPU (a smoke test of the code path).

    python benchmarks/bench_toy.py [--quick] [--threads 2] [--rounds 5] [--device cpu|cuda] [--tf32]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: 2 spinning threads on a busy box stall

import torch  # noqa: E402

from depthlib.toy.engine import BatchedStudents, StudentSpec  # noqa: E402
from depthlib.toy.models import ToyShape, derive_seed, make_teacher, variant  # noqa: E402
from depthlib.toy.reference import make_plain, plain_step  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_rate(device, n: int, reps: int) -> float:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    torch.mm(a, b)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    _sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9


def build(args, device):
    shape = ToyShape(teacher_depth=args.teacher_depth)
    train = variant(args.variant)
    teachers = [make_teacher(rho, derive_seed(0, "teacher", 0), shape) for rho in args.rho]
    specs = [StudentSpec(i, T, d, derive_seed(0, "student", 0, d))
             for i in range(len(teachers)) for T in args.temperature for d in args.depths]
    eng = BatchedStudents(teachers, specs, train, 10 ** 6, batch=args.batch, shape=shape, device=str(device),
                          chunk=args.chunk, data_seeds=[11], eval_batches=1, eval_batch_size=8)
    plains = [make_plain(teachers[s.teacher], s, train, shape, str(device)) for s in specs]
    return shape, train, eng, plains


def plain_flops(eng: BatchedStudents) -> float:
    """FLOPs of one round of the plain loop: every student recomputes its teacher."""
    d, H, V, B = eng.shape.d_model, eng.shape.d_mlp, eng.shape.vocab, eng.batch
    unit = 2 * (d * H + H * d) * B
    teacher = eng.t_Wu.shape[0] * unit + 2 * d * V * B
    students = sum(3.0 * unit * s.depth + 3 * 2 * d * V * B for s in eng.specs)
    return students + eng.K * teacher


def numerics_check(args, device, n_steps: int) -> float:
    """Max relative training-loss difference, batched vs plain, same seeds and inputs, ``n_steps`` steps
    (on the shallowest and deepest students at the lowest and highest temperature, to keep it short)."""
    import copy
    args = copy.copy(args)
    args.depths = sorted({min(args.depths), max(args.depths)})
    args.temperature = sorted({min(args.temperature), max(args.temperature)})
    shape, train, eng, plains = build(args, device)
    g = torch.Generator(device=device).manual_seed(11)
    worst = 0.0
    for t in range(n_steps):
        x = torch.randn((1, args.batch, shape.d_model), generator=g, device=device)
        lb = eng.step(x)
        for k, p in enumerate(plains):
            lp = plain_step(p, x[0], train, t, 10 ** 6)
            worst = max(worst, abs(lb[k].item() - lp) / abs(lp))
    return worst


def bench(args) -> dict:
    device = torch.device(args.device)
    load_start = os.getloadavg()
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    shape, train, eng, plains = build(args, device)
    K = eng.K
    g = torch.Generator(device=device).manual_seed(5)
    f_batched = eng.flops_per_step()
    f_plain = plain_flops(eng)
    # warm-up
    eng.step()
    for p in plains:
        plain_step(p, torch.randn(args.batch, shape.d_model, generator=g, device=device), train, 0, 10 ** 6)
    _sync(device)
    rounds = []
    for r in range(args.rounds):
        t0 = time.perf_counter()
        for t in range(args.plain_steps):
            for p in plains:
                plain_step(p, torch.randn(args.batch, shape.d_model, generator=g, device=device), train, t, 10 ** 6)
        _sync(device)
        t_plain = (time.perf_counter() - t0) / args.plain_steps
        t0 = time.perf_counter()
        for _ in range(args.batched_steps):
            eng.step()
        _sync(device)
        t_batched = (time.perf_counter() - t0) / args.batched_steps
        mm = matmul_rate(device, args.matmul_n, args.matmul_reps)
        rounds.append({"plain_s_per_round": t_plain, "batched_s_per_step": t_batched, "matmul_gflops": mm,
                       "speedup": t_plain / t_batched})
        print(f"round {r}: plain {K / t_plain:8.2f} model-steps/s | batched {K / t_batched:8.2f} model-steps/s | "
              f"x{t_plain / t_batched:5.2f} | matmul {mm:7.1f} GFLOP/s", file=sys.stderr, flush=True)
    med = lambda key: statistics.median(x[key] for x in rounds)  # noqa: E731
    mm = med("matmul_gflops")
    out = {
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "load_average_start_end": [load_start, None],
        "variant": args.variant, "students": K, "depths": args.depths, "temperatures": args.temperature, "rhos": args.rho,
        "batch": args.batch, "teacher_depth": args.teacher_depth, "chunk": eng.chunk,
        "gflop_per_round": {"plain": f_plain / 1e9, "batched": f_batched / 1e9},
        "plain": {"model_steps_per_s": K / med("plain_s_per_round"),
                  "gflop_per_s": f_plain / med("plain_s_per_round") / 1e9},
        "batched": {"model_steps_per_s": K / med("batched_s_per_step"),
                    "gflop_per_s": f_batched / med("batched_s_per_step") / 1e9},
        "matmul_fp32_gflop_per_s": mm,
        "speedup_median": med("speedup"),
        "speedup_per_round": [x["speedup"] for x in rounds],
        "rounds": rounds,
    }
    out["plain"]["fraction_of_matmul"] = out["plain"]["gflop_per_s"] / mm
    out["batched"]["fraction_of_matmul"] = out["batched"]["gflop_per_s"] / mm
    out["numerics_max_rel_loss_diff"] = {"steps": args.check_steps,
                                         "value": numerics_check(args, device, args.check_steps)}
    if args.device.startswith("cuda") or args.sweep:
        out["paper_sweep"] = sweep_projection(args, device)
    out["load_average_start_end"][1] = os.getloadavg()
    return out


def sweep_projection(args, device) -> dict:
    """Time the exp-9 + exp-9-1 sweep engine (or a tiny stand-in with --quick) and project 40k steps."""
    from depthlib.toy import chapter, sweep
    cfg = chapter.PROFILES["paper"].sweep
    cells = sweep.grid((0.0, 1.0), sweep.PAPER_TEMPERATURES)
    if args.quick:
        cfg = sweep.SweepConfig("quick", cells=sweep.grid((0.0, 1.0), (1.0,)), depths=(2, 4), replicates=1,
                                steps=100, batch=64, eval_batches=1, eval_batch_size=64, teacher_depth=8)
        cells = cfg.cells
    import dataclasses
    cfg = dataclasses.replace(cfg, cells=cells)
    result = {"students": cfg.n_students, "steps": cfg.steps, "batch": cfg.batch}
    for tf32 in ([False, True] if args.tf32 else [False]):
        eng, _, _ = sweep.build_engine(dataclasses.replace(cfg, tf32=tf32), str(device))
        losses = [eng.step() for _ in range(args.sweep_warmup)]
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(args.sweep_steps):
            losses.append(eng.step())
        _sync(device)
        dt = (time.perf_counter() - t0) / args.sweep_steps
        t0 = time.perf_counter()
        eng.evaluate()
        _sync(device)
        t_eval = time.perf_counter() - t0
        n_eval = cfg.steps // cfg.eval_every
        key = "tf32" if tf32 else "fp32"
        result[key] = {"s_per_step": dt, "gflop_per_s": eng.flops_per_step() / dt / 1e9,
                       "projected_wall_min": (dt * cfg.steps + t_eval * n_eval) / 60,
                       "losses": torch.stack(losses).cpu()}
    if args.tf32:
        a, b = result["fp32"]["losses"], result["tf32"]["losses"]
        result["tf32_max_rel_loss_diff"] = float(((a - b).abs() / a.abs()).max())
    for key in ("fp32", "tf32"):
        if key in result:
            result[key].pop("losses")
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny settings: a smoke test of the code path")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--chunk", type=int, default=None, help="students per chunk (default: 4 on CPU, all on CUDA)")
    p.add_argument("--tf32", action="store_true", help="CUDA: also time TF32 and compare its losses to fp32")
    p.add_argument("--sweep", action="store_true", help="also time the paper-sweep engine (always on CUDA)")
    p.add_argument("--calibration", action="store_true",
                   help="chapter 3's calibration run instead: one tied teacher, exp-9-3, T = 1, depths 6/12/24/48")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.exit(2, "bench_toy: error: --device cuda requested but no CUDA device is available\n")
    args.rho = [0.0, 1.0]
    args.temperature = [0.01, 0.1, 0.3, 1.0]  # 4 temperatures share each teacher, as in the paper's sweep
    args.depths = [6, 12, 16, 24, 32, 48]
    args.teacher_depth = 128
    args.variant = "exp-9"
    if args.calibration:
        args.rho, args.temperature, args.depths, args.variant = [1.0], [1.0], [6, 12, 24, 48], "exp-9-3"
    args.plain_steps, args.batched_steps, args.check_steps = 1, 3, 20
    args.matmul_n, args.matmul_reps = (2048, 5) if args.device == "cpu" else (8192, 20)
    args.sweep_warmup, args.sweep_steps = 3, 10
    if args.chunk is None:
        args.chunk = 4 if args.device == "cpu" else 0
    if args.quick:
        args.rho, args.temperature, args.depths, args.teacher_depth = [0.0, 1.0], [1.0], [2, 4], 16
        args.batch, args.rounds, args.check_steps = min(args.batch, 128), min(args.rounds, 2), 3
        args.matmul_n, args.matmul_reps = 512, 3
        args.sweep_warmup, args.sweep_steps = 1, 2
    out = bench(args)
    OUT.mkdir(parents=True, exist_ok=True)
    name = (f"bench_toy_{args.device.replace(':', '')}{'_calibration' if args.calibration else ''}"
            f"{'_quick' if args.quick else ''}_t{args.threads}.json")
    (OUT / name).write_text(json.dumps(out, indent=2, default=float))
    print(json.dumps({k: out[k] for k in ("device", "threads", "students", "batch", "plain", "batched",
                                          "matmul_fp32_gflop_per_s", "speedup_median",
                                          "numerics_max_rel_loss_diff", "load_average_start_end")
                      }, indent=2, default=float))
    if "paper_sweep" in out:
        print(json.dumps({"paper_sweep": out["paper_sweep"]}, indent=2, default=float))
    return out


if __name__ == "__main__":
    main()

"""Depth-series training speed: tokens/s of each member and the fraction of the fp32 matmul ceiling.

In one process, interleaved round by round (each round times the matmul ceiling and then a few optimiser steps of every
depth, so machine load hits them alike), with the profile's exact model, batch and optimiser
(:mod:`depthlib.lm.model`, :mod:`depthlib.lm.train`; random tokens, which cost what real ones cost):

* ``matmul``: this machine's fp32 rate of a square ``torch.mm`` (:func:`depthlib.lm.throughput.matmul_ceiling`);
* per depth: seconds per step, tokens/s, GFLOP/s (training FLOPs 6N + 6ℓTd per token,
  :func:`depthlib.lm.model.flops_per_token`) and that rate as a fraction of the ceiling measured in the same round;
* the projected training time of the whole series (Σ over depths of steps × median s/step; evaluations and probes
  not included).

Prints one JSON object and writes ``benchmarks/out/bench_lm_<profile>_<device>.json``. No assertions: numbers only.

    python benchmarks/bench_lm.py [--quick] [--profile cpu|paper] [--depths 1 4 16] [--rounds 3] [--steps 3]
                                  [--threads 2] [--device cpu|cuda]
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

from depthlib.lm import chapter  # noqa: E402
from depthlib.lm.model import build_model, flops_per_token, parameter_counts  # noqa: E402
from depthlib.lm.throughput import matmul_ceiling  # noqa: E402
from depthlib.lm.train import learning_rate, make_optimizer, token_losses  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(args) -> dict:
    device = torch.device(args.device)
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    cfg = chapter.PROFILES[args.profile].series
    if args.quick:
        cfg = chapter.PROFILES["smoke"].series
    depths = sorted(args.depths or cfg.depths)
    vocab, T, B = cfg.vocab_size, cfg.model.context, cfg.train.batch_size
    g = torch.Generator().manual_seed(0)
    members = {}
    for d in depths:
        m = build_model(cfg.model, d, vocab, 0).to(device)
        members[d] = (m, make_optimizer(m, cfg.train))
    ids = torch.randint(0, vocab, (B, T), generator=g).to(device)

    def steps(d: int, n: int) -> float:
        m, opt = members[d]
        _sync(device)
        t0 = time.perf_counter()
        for s in range(n):
            for group in opt.param_groups:
                group["lr"] = learning_rate(cfg.train, s)
            loss = token_losses(m, ids).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), cfg.train.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(device)
        return (time.perf_counter() - t0) / n

    load_start = os.getloadavg()
    for d in depths:                      # warm-up: allocator, kernels
        steps(d, 1)
    rounds = []
    for r in range(args.rounds):
        ceiling = matmul_ceiling(str(device), n=args.matmul_n, reps=args.matmul_reps, rounds=1)
        row = {"matmul_gflop_per_s": ceiling}
        for d in depths:
            dt = steps(d, args.steps)
            rate = flops_per_token(cfg.model, d, vocab) * B * T / dt / 1e9
            row[d] = {"s_per_step": dt, "tokens_per_s": B * T / dt, "gflop_per_s": rate, "fraction_of_matmul": rate / ceiling}
        rounds.append(row)
        print(f"round {r}: matmul {ceiling:6.1f} GFLOP/s | " + " | ".join(
            f"ℓ={d}: {row[d]['tokens_per_s']:7.0f} tok/s {100 * row[d]['fraction_of_matmul']:4.0f}%" for d in depths),
            file=sys.stderr, flush=True)

    def med(d, key):
        return statistics.median(x[d][key] for x in rounds)
    per_depth = {d: {"params": parameter_counts(members[d][0])["n_params"],
                     "flop_per_token": flops_per_token(cfg.model, d, vocab),
                     **{k: med(d, k) for k in ("s_per_step", "tokens_per_s", "gflop_per_s", "fraction_of_matmul")}}
                 for d in depths}
    series_s = sum(per_depth[d]["s_per_step"] * cfg.train.steps for d in depths) * len(cfg.seeds)
    total_flop = sum(per_depth[d]["flop_per_token"] for d in depths) * B * T
    total_s = sum(per_depth[d]["s_per_step"] for d in depths)
    ceiling = statistics.median(x["matmul_gflop_per_s"] for x in rounds)
    return {
        "profile": "smoke (--quick)" if args.quick else args.profile,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "load_average_start_end": [load_start, os.getloadavg()],
        "d_model": cfg.model.d_model, "context": T, "batch_tokens": B * T, "vocab_size": vocab,
        "matmul_fp32_gflop_per_s": ceiling,
        "per_depth": per_depth,
        "series": {"tokens_per_s_all_depths": B * T * len(depths) / total_s, "gflop_per_s": total_flop / total_s / 1e9,
                   "fraction_of_matmul": total_flop / total_s / 1e9 / ceiling,
                   "projected_training_min": series_s / 60 if not args.depths else None,
                   "steps_per_model": cfg.train.steps},
        "rounds": [{"matmul_gflop_per_s": x["matmul_gflop_per_s"],
                    **{str(d): x[d]["tokens_per_s"] for d in depths}} for x in rounds],
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the smoke profile's tiny models: a smoke test of the code path")
    p.add_argument("--profile", choices=("cpu", "paper"), default="cpu")
    p.add_argument("--depths", type=int, nargs="+", default=None, help="a subset of the profile's depths")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="optimiser steps per depth per round")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.exit(2, "bench_lm: error: --device cuda requested but no CUDA device is available\n")
    args.matmul_n, args.matmul_reps = (1024, 8) if args.device == "cpu" else (8192, 20)
    if args.quick:
        args.rounds, args.steps, args.matmul_n, args.matmul_reps = min(args.rounds, 2), min(args.steps, 2), 512, 3
    out = bench(args)
    OUT.mkdir(parents=True, exist_ok=True)
    name = f"bench_lm_{'quick' if args.quick else args.profile}_{args.device.replace(':', '')}.json"
    (OUT / name).write_text(json.dumps(out, indent=2, default=float))
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=2, default=float))
    return out


if __name__ == "__main__":
    main()

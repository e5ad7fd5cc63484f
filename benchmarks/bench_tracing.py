"""Benchmark: one full causal trace, batched (depthlib.tracing) vs a naive loop (paper Fig. 6).

The full trace is every layer × every token × the 3 restored kinds (block, MLP, attention) with 10 noise
samples, on Gemma-3-270M. The naive loop runs one forward per (layer, token, sample) with the same hooks
(and also keeps only the last position's logits, so the ratio measures the batching and skipping, not the
unembedding). Runs are interleaved (batched, naive, batched, ...) and the ratio is of medians.

    python benchmarks/bench_tracing.py            # 10 samples, 3 kinds, 2 repeats
    python benchmarks/bench_tracing.py --quick    # 2 samples, block outputs only, 1 repeat

Writes benchmarks/out/bench_tracing.json. No assertion on time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from depthlib import tracing
from depthlib.models import load_model

PROMPT, SUBJECT, TARGET = "The Space Needle is in downtown", "Space Needle", " Seattle"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 samples, block only, 1 repeat")
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="float32 (default: CPUs without avx512_bf16 run bf16 several times slower)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--samples", type=int, default=None, help="override the number of noise samples")
    ap.add_argument("--kinds", nargs="+", choices=tracing.KINDS, default=None, help="override the kinds")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    samples = args.samples or (2 if args.quick else 10)
    kinds = tuple(args.kinds or (("block",) if args.quick else tracing.KINDS))
    repeats = args.repeats or (1 if args.quick else 2)
    model, tok = load_model(args.model, dtype=args.dtype)
    cfg = tracing.TraceConfig(samples=samples, noise="rome")
    tracer = tracing.CausalTracer(model, tok, cfg)
    sigma = tracer.sigma

    def batched():
        return tracer.trace(PROMPT, SUBJECT, TARGET, kinds=kinds)

    def naive():
        return {k: tracing.naive_grid(model, tok, PROMPT, SUBJECT, TARGET, kind=k, config=cfg, sigma=sigma)
                for k in kinds}

    times = {"batched": [], "naive": []}
    diff = 0.0
    for r in range(repeats):
        for name, fn in (("batched", batched), ("naive", naive)):
            t0 = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t0)
            print(f"repeat {r}: {name:8s} {times[name][-1]:8.2f} s", flush=True)
            if name == "batched":
                b = out
            else:
                diff = max(diff, max(float(np.nanmax(np.abs(b[k].grid - out[k]))) for k in kinds))
    L, T = tracer.arch.n_layers, len(b[kinds[0]].tokens)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"model": args.model, "dtype": args.dtype, "threads": args.threads, "samples": samples,
              "kinds": list(kinds), "layers": L, "tokens": T,
              "naive_forwards": L * T * samples * len(kinds), "batched_forwards": L * len(kinds) + 2 * len(kinds),
              "batched_s": med["batched"], "naive_s": med["naive"], "ratio": med["naive"] / med["batched"],
              "max_abs_diff_p": diff, "times": times, "cpu_count": os.cpu_count(),
              "load_avg": os.getloadavg()}
    print(json.dumps({k: result[k] for k in ("batched_s", "naive_s", "ratio", "max_abs_diff_p")}, indent=None))
    print(f"speed-up of the batched trace over the naive loop: {result['ratio']:.1f}x "
          f"({L} layers x {T} tokens x {samples} samples x {len(kinds)} kinds)")
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_tracing.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

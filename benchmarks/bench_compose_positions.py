"""Chapter 7's grammar members with and without a learned absolute position (compose.network's ``positions``).

A grammar's leaves sit at fixed places in its tree, and chapter 6's rotary embedding tells attention only relative
offsets. This trains an untied member of the hierarchy control's cpu settings (its grammar, width, heads and
schedule; :mod:`depthlib.compose.hierarchy`) for one main stage of ``--steps`` optimiser steps on the training stream,
with and without the learned absolute position embedding, for each seed, on one thread, and prints the held-out
next-leaf excess over the exact Bayes loss (nats per leaf) at the end: what the embedding buys at equal budget.

Prints one JSON object and writes ``benchmarks/out/bench_compose_positions.json``. No assertions.

    python benchmarks/bench_compose_positions.py [--steps 400] [--depth 4] [--seeds 0,1,2]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path


def measure(steps: int, depth: int, seeds: list[int], profile: str = "cpu") -> dict:
    import torch

    from depthlib.compose import chapter, hierarchy, network, rhm
    from depthlib.compose.certify import train_stage
    torch.set_num_threads(1)
    cfg = chapter.PROFILES[profile].hierarchy
    train = dataclasses.replace(cfg.train, steps=steps, evals=5)
    held, _ = hierarchy.held_out_sets(cfg)
    grammar = rhm.make_grammar(cfg.grammar)
    out = {"profile": profile, "steps": steps, "batch_size": train.batch_size, "depth": depth, "seeds": seeds}
    for positions in (True, False):
        model_cfg = dataclasses.replace(cfg.model, positions=positions)
        excess, seconds = [], []
        for seed in seeds:
            t0 = time.perf_counter()
            net = network.build_model(model_cfg, "untied", depth, cfg.grammar.v, cfg.grammar.length,
                                      hierarchy.member_seed(seed, "leaf", "untied", depth))
            curve, _ = train_stage("leaf", net, grammar, train, cfg.base(seed), held)
            excess.append(round(float(curve["excess"].iloc[-1]), 4))
            seconds.append(round(time.perf_counter() - t0, 1))
        out["with" if positions else "without"] = {"excess": excess, "seconds": seconds}
    return out


def main() -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="optimiser steps of the main stage (a multiple of 5)")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--quick", action="store_true", help="the smoke profile, 20 steps, one seed")
    args = p.parse_args()
    profile = "cpu"
    if args.quick:
        profile, args.steps, args.seeds = "smoke", 20, "0"
    out = measure(args.steps, args.depth, [int(s) for s in args.seeds.split(",")], profile)
    folder = Path(__file__).parent / "out"
    folder.mkdir(exist_ok=True)
    (folder / "bench_compose_positions.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

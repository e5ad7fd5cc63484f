"""The converged depth series' budget: a timed slice of its members, and the wall time it projects.

Two one-thread worker processes (the run's layout: one per core) each time a slice of one member of the profile's
converged series (:mod:`depthlib.lm.converged`) side by side, on the real data (the series' tokenizer, windows and
data order) through the real training loop (:func:`depthlib.lm.train.train_model`): by default the deepest member
(ℓ = 16) and the shallowest (ℓ = 1), each with one held-out evaluation. Seconds per optimiser step are a + b·ℓ
(:func:`depthlib.lm.budget.step_seconds`); the projected wall time (:func:`depthlib.lm.budget.estimate_wall`) is every
member's main training plus one continuation of ``continuation`` × its steps (the fewest the certificate takes), the
members handed deepest first to the two workers, evaluations added at their measured share. Two projections: as
measured, and on idle cores (each slice's seconds per step × the share of a core its process got, its CPU time over
its wall time). The machine's load average is printed beside them: timings taken while other jobs share the cores
are upper bounds.

Prints one JSON object and writes ``benchmarks/out/bench_lm_converged_<profile>.json``. No assertions: numbers only.

    python benchmarks/bench_lm_converged.py [--quick] [--profile cpu] [--steps 300] [--depths 16 1]

``--quick`` (what ``make bench`` passes to every benchmark): the smoke profile's tiny members for 20 steps, a check of
the code path whose projection means nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: spinning threads on a busy box stall

OUT = Path(__file__).resolve().parent / "out"


def time_member(profile: str, depth: int, steps: int) -> dict:
    """Seconds per optimiser step (training only) and per held-out evaluation of ``depth``'s member, one thread."""
    import torch

    from depthlib.lm import chapter, series
    from depthlib.lm.model import build_model
    from depthlib.lm.train import train_model
    torch.set_num_threads(1)
    cfg = chapter.PROFILES[profile].converged
    tok, data, _, _ = series.prepare_data(cfg.series())
    model = build_model(cfg.model, depth, len(tok), 0, tok.eos_token_id)
    short = dataclasses.replace(cfg.train, steps=steps, warmup=min(cfg.train.warmup, steps), eval_every=steps)
    t0, c0 = time.perf_counter(), time.process_time()
    rec = train_model(model, data, short, seed=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"depth": depth, "steps": steps, "s_per_step": rec["seconds"] / steps,
            "s_per_eval": rec["eval_seconds"] / 2, "wall_s": wall, "cpu_s": cpu, "cpu_share": cpu / wall,
            "load_average": os.getloadavg()}


def main() -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the smoke profile, 20 steps: a smoke test of the code path")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--steps", type=int, default=300, help="steps of the deepest member (the shallowest takes more, "
                                                          "so that the two run side by side for as long)")
    p.add_argument("--depths", type=int, nargs=2, default=(16, 1), metavar=("DEEP", "SHALLOW"))
    args = p.parse_args()
    if args.quick:
        args.profile, args.steps, args.depths = "smoke", 20, (8, 1)
    from joblib import Parallel, delayed

    from depthlib.lm import budget, chapter
    cfg = chapter.PROFILES[args.profile].converged
    deep, shallow = args.depths
    plan = [(deep, args.steps), (shallow, int(args.steps * (1 + 0.12 * deep) / (1 + 0.12 * shallow)))]
    load_before = os.getloadavg()
    timed = Parallel(n_jobs=2, backend="loky")(delayed(time_member)(args.profile, d, n) for d, n in plan)
    evals = len(cfg.train.eval_steps())
    eval_share = sum(t["s_per_eval"] for t in timed) * evals / sum(t["s_per_step"] * cfg.train.steps for t in timed)
    total_steps = round(cfg.train.steps * (1 + cfg.continuation))
    most_steps = round(cfg.train.steps * (1 + cfg.continuation * cfg.max_continuations))
    out = {"profile": args.profile, "slices": timed, "load_average_before": load_before, "eval_share": eval_share,
           "members": len(cfg.units()), "steps_per_member_one_continuation": total_steps,
           "steps_per_member_max_continuations": most_steps}
    # as measured (other jobs sharing the cores), and on idle cores (each slice's seconds × its share of a core)
    for label, scale in (("measured", lambda t: 1.0), ("idle_cores", lambda t: t["cpu_share"])):
        a, b = budget.step_seconds({t["depth"]: t["s_per_step"] * scale(t) for t in timed})
        est = budget.estimate_wall(cfg.depths, cfg.seeds, total_steps, a, b, workers=2, eval_share=eval_share)
        worst = budget.estimate_wall(cfg.depths, cfg.seeds, most_steps, a, b, workers=2, eval_share=eval_share)
        out[label] = {"s_per_step": {"a": a, "b_per_block": b}, "wall_h": est["wall_s"] / 3600,
                      "member_h": est["member_s"] / 3600, "wall_h_every_member_max_continuations": worst["wall_s"] / 3600}
    OUT.mkdir(exist_ok=True)
    (OUT / f"bench_lm_converged_{args.profile}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

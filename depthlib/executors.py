"""Where units of work run: in this process, on local worker processes (joblib), or as SLURM jobs (submitit).

Nothing here schedules anything itself: joblib's loky processes use the cores of one machine, submitit
submits SLURM job arrays (its ``local`` and ``debug`` clusters run real subprocess jobs, or in-process, for tests).

A :class:`Unit` is a small picklable description of one piece of work: a module-level function, its keyword
arguments, and a label. Its function computes one run into the results cache and returns that run's folder, so

* re-running the same command resumes: a unit whose run is complete loads it from the cache in a moment, and a unit
  cut off mid-way (a preempted or timed-out SLURM job is requeued by submitit's checkpointing) resumes from the
  run's own last checkpoint;
* a failed unit is reported with its log file, and the others are kept.

Workers see the submitting process's ``DEPTHLIB_*`` environment (cache and results folders) and use
``threads`` torch threads each (default: the machine's cores divided among the concurrent jobs), since two
processes with two spinning OpenMP threads each on two cores run small ops up to 90× slower.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from depthlib import paths, runtime
from depthlib.errors import InputError, MachineError

EXECUTORS = ("serial", "joblib", "submitit")
SUBMITIT_CLUSTERS = ("auto", "slurm", "local", "debug")


@dataclass(frozen=True)
class ExecutorConfig:
    """How to run a list of units. The SLURM settings are passed through to submitit (ignored elsewhere)."""

    kind: str = "serial"                 # serial | joblib | submitit
    jobs: int = 1                        # joblib: worker processes; submitit: ignored (array_parallelism)
    threads: int | None = None           # torch threads per unit (default: cores // concurrent units, ≥ 1)
    cluster: str = "auto"                # submitit: auto (SLURM if present, else local) | slurm | local | debug
    partition: str | None = None         # SLURM partition
    gpus_per_job: int = 0                # SLURM GPUs per job
    time_min: int = 240                  # SLURM time limit per job, minutes (a timed-out toy shard is requeued)
    array_parallelism: int = 64          # SLURM: at most this many jobs of the array run at once
    cpus_per_job: int | None = None      # SLURM cpus per task (default: threads)
    folder: str | None = None            # submitit logs (default: <cache>/submitit)
    shards: int | None = None            # joblib, submitit: the run's work in this many pieces (default: jobs)

    def validate(self) -> "ExecutorConfig":
        if self.kind not in EXECUTORS:
            raise InputError(f"unknown executor {self.kind!r} (have {', '.join(EXECUTORS)})")
        if self.cluster not in SUBMITIT_CLUSTERS:
            raise InputError(f"unknown submitit cluster {self.cluster!r} (have {', '.join(SUBMITIT_CLUSTERS)})")
        for name in ("jobs", "time_min", "array_parallelism"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"{_FLAG.get(name, '--' + name.replace('_', '-'))} must be >= 1, "
                                 f"got {getattr(self, name)}")
        for name in ("threads", "cpus_per_job", "shards"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.gpus_per_job < 0:
            raise InputError(f"--gpus-per-job must be >= 0, got {self.gpus_per_job}")
        return self

    def preflight(self) -> "ExecutorConfig":
        """:class:`MachineError` if this executor cannot start here (its package missing, ``--cluster slurm`` on a
        machine without SLURM): checked before a command touches any run, so ``--force`` deletes nothing first."""
        import importlib.util
        import shutil
        package = {"joblib": "joblib", "submitit": "submitit"}.get(self.kind)
        if package and importlib.util.find_spec(package) is None:
            raise MachineError(f"--executor {self.kind} needs the {package} package: pip install {package}")
        if self.kind == "submitit" and self.cluster == "slurm" and shutil.which("srun") is None:
            raise MachineError("--cluster slurm: this machine has no SLURM (srun is not on PATH); run it on a SLURM "
                               "login node, or use --cluster local or --executor joblib here")
        return self

    def n_shards(self) -> int:
        """How many pieces a run's work is cut into under this executor: ``shards``, or one per job."""
        return int(self.shards if self.shards is not None else self.jobs)

    def unit_threads(self, n_units: int) -> int:
        if self.threads is not None:
            return int(self.threads)
        concurrent = 1 if self.kind == "serial" else max(1, min(self.jobs, n_units))
        return max(1, (os.cpu_count() or 1) // concurrent)


#: the command-line flag of each setting whose name differs from it
_FLAG = {"time_min": "--time"}
#: settings that only one executor reads (the others would silently ignore them)
_ONLY = {"jobs": ("joblib",), "shards": ("joblib", "submitit"), "cluster": ("submitit",),
         "partition": ("submitit",), "gpus_per_job": ("submitit",), "time_min": ("submitit",),
         "array_parallelism": ("submitit",)}


def from_flags(kind: str = "serial", *, threads: int | None = None, **given) -> ExecutorConfig:
    """The :class:`ExecutorConfig` of a command's flags (None: not given), checked: a flag that ``kind`` would
    ignore (``--jobs`` or ``--partition`` with the serial executor, say) is an :class:`InputError`, and the
    executor must be able to start here (:meth:`ExecutorConfig.preflight`)."""
    ignored = [k for k, v in given.items() if v is not None and kind not in _ONLY[k]]
    if ignored:
        users = " or ".join(sorted({e for k in ignored for e in _ONLY[k]}))
        names = ", ".join(_FLAG.get(k, "--" + k.replace("_", "-")) for k in ignored)
        raise InputError(f"{names} would be ignored by --executor {kind}: "
                         f"{'they apply' if len(ignored) > 1 else 'it applies'} to --executor {users}")
    settings = {k: v for k, v in given.items() if v is not None}
    settings.setdefault("jobs", 2)
    return ExecutorConfig(kind, threads=threads, **settings).validate().preflight()


@dataclass(frozen=True)
class Unit:
    """One piece of work: ``module.function(**kwargs)``, which computes (or loads) a run and returns its folder."""

    label: str
    function: str                        # "package.module:function"
    kwargs: dict = field(default_factory=dict)

    def __call__(self, threads: int = 1, env: dict | None = None) -> str:
        os.environ.update(env or {})
        runtime.configure_process()              # a worker is a long run's entry point (before torch loads)
        import torch
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            module, name = self.function.split(":")
            return str(getattr(importlib.import_module(module), name)(**self.kwargs))
        finally:
            torch.set_num_threads(before)          # serial and debug units run in the caller's process


@dataclass
class Outcome:
    """What became of one unit: its run folder, or its error and where the log is."""

    label: str
    ok: bool
    run: str | None = None
    error: str | None = None
    log: str | None = None
    wall_s: float = 0.0


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith("DEPTHLIB_") or k == "OMP_WAIT_POLICY"}


def _logs_dir(cfg: ExecutorConfig) -> Path:
    folder = Path(cfg.folder) if cfg.folder else paths.cache_dir() / "submitit"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _guarded(unit: Unit, threads: int, env: dict, log_dir: str) -> Outcome:
    """Run a unit in this process (serial, or inside a joblib worker); an exception becomes an Outcome whose
    traceback is written to ``log_dir/<label>.log``."""
    t0 = time.perf_counter()
    try:
        return Outcome(unit.label, True, run=unit(threads, env), wall_s=time.perf_counter() - t0)
    except Exception as err:  # noqa: BLE001 - one unit's failure must not lose the others
        log = Path(log_dir) / f"{unit.label}.log"
        log.write_text(traceback.format_exc())
        return Outcome(unit.label, False, error=f"{type(err).__name__}: {err}", log=str(log),
                       wall_s=time.perf_counter() - t0)


def _bar(units: list[Unit], cfg: ExecutorConfig):
    """One progress bar over the units (a unit's own progress is in its log or its run folder)."""
    import sys

    from tqdm.auto import tqdm
    return tqdm(total=len(units), desc=f"{cfg.kind} units", unit="unit", file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5 if sys.stderr.isatty() else 30)


def run_units(units: list[Unit], cfg: ExecutorConfig = ExecutorConfig()) -> list[Outcome]:
    """Run ``units`` with the chosen executor and return one :class:`Outcome` per unit, in order."""
    cfg.validate()
    if not units:
        return []
    threads, env, logs = cfg.unit_threads(len(units)), _env(), _logs_dir(cfg)
    with _bar(units, cfg) as bar:
        if cfg.kind == "serial":
            out = []
            for u in units:
                out.append(_guarded(u, threads, env, str(logs)))
                bar.update()
            return out
        if cfg.kind == "joblib":
            from joblib import Parallel, delayed
            done: dict[int, Outcome] = {}
            arriving = None
            # idle workers pull the next unit; results arrive as units finish (the bar moves), put back in order
            try:
                with _ctrl_c_spares_workers():        # the workers start here, and so do loky's threads
                    arriving = Parallel(n_jobs=min(cfg.jobs, len(units)), backend="loky", batch_size=1,
                                        return_as="generator_unordered")(
                        delayed(_indexed)(i, u, threads, env, str(logs)) for i, u in enumerate(units))
                for i, outcome in arriving:
                    done[i] = outcome
                    bar.update()
            except KeyboardInterrupt:
                with _quiet_teardown():
                    if arriving is not None:     # closed now: collected later, joblib would warn of the units it
                        arriving.close()         # cancels after the command's one line
                    _stop_loky()
                raise
            return [done[i] for i in range(len(units))]
        return _run_submitit(units, cfg, threads, env, logs, bar)


@contextlib.contextmanager
def _ctrl_c_spares_workers() -> Iterator[None]:
    """Inside the block, SIGINT is blocked in this thread, and so in the worker processes and threads started here
    (a process inherits its parent thread's signal mask across fork and exec, and Python leaves it as it is): a
    terminal's Ctrl-C, which reaches the whole process group, interrupts only this process, which then stops the
    workers (:func:`_stop_loky`), instead of each worker printing its own ``KeyboardInterrupt`` traceback (one that
    is still importing joblib, or waiting for its next unit). A Ctrl-C that comes inside the block (another thread
    may take it) is raised when the block ends, never in the middle of starting the workers (loky's own thread
    would fail with a traceback of its own). The standard library's resource tracker is started first: starting it
    unblocks SIGINT (CPython 3.11); so is loky's, quietly (:func:`_start_loky_tracker_quietly`)."""
    import signal
    import threading
    from multiprocessing import resource_tracker
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    resource_tracker.ensure_running()
    _start_loky_tracker_quietly()
    main = threading.current_thread() is threading.main_thread()
    caught: list[int] = []
    handler = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum)) if main else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)     # while the handler only counts, nothing is raised
        if main:                                             # in between: both are restored
            signal.signal(signal.SIGINT, handler)
    if caught and callable(handler):
        handler(signal.SIGINT, None)                         # Python's default: KeyboardInterrupt
    elif caught and handler == signal.SIG_DFL:
        raise KeyboardInterrupt


def _start_loky_tracker_quietly() -> None:
    """Start loky's resource tracker (if it is not running) with its own warnings ignored. After a Ctrl-C stops the
    workers as they start, the tracker may find at exit a semaphore whose release message this process had no time
    to send, and warns of a "leaked" semaphore (then, having found it already removed, of a ``FileNotFoundError``)
    after the command's one line, on a loaded machine only (a race; seen once in CI). The tracker still removes what
    is left: only its message is not said. The tracker is a separate process, so its warning filters are its
    command-line ``-W`` options, which it takes from ``sys.warnoptions`` when it is started."""
    import sys
    try:
        from joblib.externals.loky.backend import resource_tracker as loky_tracker
    except ImportError:  # pragma: no cover - joblib without loky: nothing to start
        return
    quiet = "ignore::UserWarning:" + loky_tracker.__name__
    added = quiet not in sys.warnoptions
    if added:
        sys.warnoptions.append(quiet)
    try:
        loky_tracker.ensure_running()
    finally:
        if added:
            sys.warnoptions.remove(quiet)


@contextlib.contextmanager
def _quiet_teardown() -> Iterator[None]:
    """Inside the block (stopping the workers after a Ctrl-C) joblib's warnings are not said, and neither is the
    failure of loky's manager thread: stopped while it still holds units it has not handed to a worker, it looks one
    up after the stop dropped it (a ``KeyError``). Both threads end inside the block (the stop waits for them)."""
    import threading
    previous = threading.excepthook

    def hook(args) -> None:
        if getattr(args.thread, "name", "") != "ExecutorManagerThread":
            previous(args)
    threading.excepthook = hook
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        threading.excepthook = previous


def _stop_loky() -> None:
    """After a Ctrl-C: stop loky's worker processes now, releasing their semaphores (else its resource tracker
    warns of leaked semaphores after the command's one line)."""
    try:
        from joblib.externals.loky import get_reusable_executor
        get_reusable_executor().shutdown(wait=True, kill_workers=True)
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def _indexed(i: int, unit: Unit, threads: int, env: dict, log_dir: str) -> tuple[int, Outcome]:
    return i, _guarded(unit, threads, env, log_dir)


def _run_submitit(units: list[Unit], cfg: ExecutorConfig, threads: int, env: dict, logs: Path,
                  bar) -> list[Outcome]:
    import submitit
    from submitit.helpers import Checkpointable

    class Requeued(Checkpointable):
        """A unit that submitit requeues when its job times out or is preempted (its run resumes itself)."""

        def __init__(self, unit: Unit):
            self.unit = unit

        def __call__(self) -> str:
            return self.unit(threads, env)

    executor = submitit.AutoExecutor(folder=str(logs / "%j"), cluster=None if cfg.cluster == "auto" else cfg.cluster)
    params: dict[str, Any] = {"timeout_min": cfg.time_min, "cpus_per_task": cfg.cpus_per_job or threads,
                              "gpus_per_node": cfg.gpus_per_job, "name": "depthlib",
                              "slurm_array_parallelism": cfg.array_parallelism}
    if cfg.partition:
        params["slurm_partition"] = cfg.partition
    executor.update_parameters(**params)
    t0 = time.perf_counter()
    log = logs / "controllers.log"
    try:
        with _controllers_log(log):
            jobs = executor.submit_array([Requeued(u) for u in units])  # one SLURM array (one job per unit elsewhere)
    except (submitit.core.utils.UncompletedJobError, submitit.core.utils.FailedSubmissionError, OSError) as err:
        # sbatch refused the array (a bad partition, say: FailedJobError with sbatch's stderr), or is missing
        with open(log, "a") as handle:
            handle.write(traceback.format_exc())
        first = next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
        more = f" and {len(units) - 1} other unit{'s' * (len(units) > 2)} of its array" if len(units) > 1 else ""
        raise InputError(f"submitting unit {units[0].label}{more} to {cfg.cluster} failed: {first.strip()} "
                         f"(log: {log})") from None
    out: dict[int, Outcome] = {}
    poll_s = 1.0 if cfg.cluster in ("local", "debug") else 15.0     # SLURM: do not hammer the scheduler
    while len(out) < len(units):
        for i, (unit, job) in enumerate(zip(units, jobs)):
            if i in out or not _finished(job):
                continue
            try:
                out[i] = Outcome(unit.label, True, run=job.result(), log=str(job.paths.stdout),
                                 wall_s=time.perf_counter() - t0)
            except Exception as err:  # noqa: BLE001
                message = str(err).strip().splitlines()
                out[i] = Outcome(unit.label, False, error=message[-1] if message else type(err).__name__,
                                 log=str(job.paths.stderr), wall_s=time.perf_counter() - t0)
            bar.update()
        if len(out) < len(units):
            time.sleep(poll_s)
    return [out[i] for i in range(len(units))]


@contextlib.contextmanager
def _controllers_log(log: Path) -> Iterator[None]:
    """Inside the block, submitit's local job controllers (one subprocess per job) write to ``log`` instead of the
    terminal: a Ctrl-C reaches them too, and each would print its own ``KeyboardInterrupt`` traceback after the
    command's one line. Their jobs' own output goes to the jobs' logs as before; so does this process's stderr (where
    submitit prints sbatch's refusal before raising it)."""
    try:
        from submitit.local import local
    except ImportError:
        yield
        return
    original = local.subprocess

    class _ToLog:
        def __getattr__(self, name):
            return getattr(original, name)

        @staticmethod
        def Popen(*args, **kwargs):  # noqa: N802 - subprocess's name
            kwargs.setdefault("stdout", handle)
            kwargs.setdefault("stderr", original.STDOUT)
            return original.Popen(*args, **kwargs)

    with open(log, "a") as handle, contextlib.redirect_stderr(handle):   # and what sbatch says when it refuses
        local.subprocess = _ToLog()
        try:
            yield
        finally:
            local.subprocess = original


def _finished(job) -> bool:
    """Whether a submitit job has ended (a debug job runs here, inside ``done``, and may raise there)."""
    try:
        return job.done()
    except Exception:  # noqa: BLE001 - its result() raises the same error, which becomes the Outcome
        return True


def failures(outcomes: list[Outcome]) -> str | None:
    """One line per failed unit (label, error, log), or None when all finished."""
    bad = [o for o in outcomes if not o.ok]
    if not bad:
        return None
    return "; ".join(f"{o.label} failed ({o.error}; log: {o.log})" for o in bad)


def finished_runs(units: list[Unit], cfg: ExecutorConfig, what: str) -> list:
    """Run ``units`` and return their finished :class:`depthlib.results.Run` s, in order; if any
    failed, raise one :class:`InputError` line naming ``what``, each failed unit and its log (the rest stay cached)."""
    from depthlib.results import Run
    outcomes = run_units(units, cfg)
    problem = failures(outcomes)
    if problem:
        raise InputError(f"{what}: {problem}; the finished units are cached, rerun to resume")
    return [Run.load(o.run) for o in outcomes]


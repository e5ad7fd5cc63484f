"""THE run lifecycle (design: Data flow): open a run, repair what a crash or a damaged disk left (losing only what
is unreadable), resume it, time every segment, and finish it with its manifest, atomically with respect to Ctrl-C
(:func:`computing`). Every chapter's runs are computed through it.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from depthlib.errors import InputError
from depthlib.store import PROGRESS, CorruptRunError, Run, _sha256, damage_repaired, note, open_run

_TMP_NAME = re.compile(r"\.tmp(\d+)$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_stray_tmp(folder: Path) -> list[Path]:
    """Delete the temporary files (``<name>.tmp<pid>``) an interrupted atomic write left in ``folder``: this
    process's own and those of processes that are gone (a write cut short by a full disk would keep it full).
    Returns what was removed; a folder that cannot be listed is left alone."""
    removed = []
    try:
        candidates = [p for p in Path(folder).rglob("*.tmp*") if p.is_file()]
    except OSError:
        return removed
    for path in candidates:
        match = _TMP_NAME.search(path.name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or not _pid_alive(pid):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def readable_checkpoint(path: Path) -> bool:
    """A ``torch.save`` file (a zip archive) is whole: every member's CRC checks (cheap; nothing is unpickled)."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def _readable_table(path: Path) -> bool:
    """A parquet file reads whole (a partial run's tables are small: one curve per evaluation, one unit's rows)."""
    try:
        import pyarrow.parquet as pq
        pq.read_table(path)
        return True
    except Exception:  # noqa: BLE001 - any unreadable file counts
        return False


def corruption(run: Run, tables: Sequence[str] = (), checkpoints: Sequence[str] = ()) -> str | None:
    """What is wrong with an existing run folder, in a few words, or None if it reads: a finished run's manifest
    and every table (present and matching the manifest's checksum); a partial run's tables (its ``units/`` included)
    and checkpoints (every ``*.pt`` under it)."""
    try:
        m = run.manifest
    except CorruptRunError:
        return "its manifest.json is unreadable"
    if m.get("status") == "complete":
        listed = m.get("tables")
        if not isinstance(listed, dict):
            return "its manifest lists no table checksums"
        for name in sorted(set(listed) | set(tables)):
            path = run.table_path(name)
            info = listed.get(name)
            if not path.exists():
                return f"table {name} is missing"
            if not isinstance(info, dict) or _sha256(path) != info.get("sha256"):
                return f"table {name} fails its checksum"
        return None
    for path in sorted(run.path.rglob("*.parquet")):
        if not _readable_table(path):
            return f"table {path.relative_to(run.path).with_suffix('').as_posix()} is unreadable"
    for path in sorted({*run.path.rglob("*.pt"), *(run.path / c for c in checkpoints)}):
        if path.exists() and not readable_checkpoint(path):
            return f"{path.relative_to(run.path).as_posix()} is unreadable"
    return None


def repair(run: Run, *, tables: Sequence[str] = (), checkpoints: Sequence[str] = (),
           unit_marker: str | None = None) -> list[str]:
    """Delete only what is unreadable in a run folder, so that a rerun resumes from everything that is whole; returns
    what was removed, in words (empty: nothing was wrong). A finished unit is never lost to a damaged neighbour:

    - an unreadable manifest, or a finished run's table that is missing or fails its checksum: the manifest (and that
      table) go, and the run resumes as a partial run: its body skips what its units, tables and checkpoints hold and
      rebuilds the rest (the lm and compose runs merge their tables again from ``units/``);
    - an unreadable table or checkpoint (``*.parquet``, ``*.pt`` anywhere under the folder, ``checkpoints`` named by
      the caller): that file goes. Under ``units/``, where a unit's tables are ``<unit>_<table>`` and it counts as
      finished once its ``<unit>_<unit_marker>`` table exists (written last; its other files are ``<unit>_*`` or
      ``<unit>.pt``), the unit's marker goes too, so that unit
      alone is computed again."""
    removed: list[str] = []

    def drop(path: Path, why: str) -> None:
        path.unlink(missing_ok=True)
        removed.append(why)
    manifest = run.path / "manifest.json"
    problem = corruption(run, tables) if manifest.exists() else None
    if problem is not None:
        try:
            complete = run.manifest.get("status") == "complete"
        except CorruptRunError:
            complete = False
        if complete and problem.startswith("table ") and "fails its checksum" in problem:
            name = problem.split()[1]
            drop(run.table_path(name), f"table {name} (it failed its checksum)")
        drop(manifest, f"its manifest ({problem})")
    units = run.path / "units"
    tables_ = [(p, "table") for p in sorted(run.path.rglob("*.parquet")) if not _readable_table(p)]
    saved = [(p, "checkpoint") for p in sorted({*run.path.rglob("*.pt"), *(run.path / c for c in checkpoints)})
             if p.exists() and not readable_checkpoint(p)]
    for path, kind in tables_ + saved:
        drop(path, f"the unreadable {kind} {path.relative_to(run.path).as_posix()}")
        if unit_marker and path.parent == units:
            suffix = f"_{unit_marker}.parquet"
            for marker in units.glob(f"*{suffix}"):
                unit = marker.name[: -len(suffix)]
                if path.stem == unit or path.stem.startswith(f"{unit}_"):
                    drop(marker, f"the marker of its unit {unit} (that unit is computed again)")
    return removed


def prepare_run(run: Run, *, force: bool = False, tables: Sequence[str] = (),
                checkpoints: Sequence[str] = (), unit_marker: str | None = None) -> Run:
    """Validate a local run when it is opened to compute into: with ``force`` its folder is deleted (recomputed from
    scratch); a damaged one is repaired (:func:`repair`: only what is unreadable goes, reported in one stderr line
    naming its folder), so the caller resumes from every finished unit instead of failing on every rerun; a complete
    one computed by other code (stale) is deleted, so the caller recomputes it instead of handing back numbers the
    current code did not produce."""
    if not run.path.exists():
        return run
    remove_stray_tmp(run.path)
    if run.committed:
        raise InputError(f"{run.path} is a committed run: it is never deleted or recomputed in place")
    if force:
        print(f"[depthlib] --force: deleting the cached run {run.path} and recomputing it", file=sys.stderr)
        shutil.rmtree(run.path)
        return run
    removed = repair(run, tables=tables, checkpoints=checkpoints, unit_marker=unit_marker)
    if removed and not damage_repaired(run.path):      # one line per damaged run: said once, where it was found
        note(f"[depthlib] damaged run {run.path}: removed {'; '.join(removed)}; the rest is kept and the run resumes")
    elif run.complete and run.stale:
        print(f"[depthlib] {run.path} was computed by other code; deleting it and recomputing", file=sys.stderr)
        shutil.rmtree(run.path)
    return run


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C while a run was computed: ``folder`` is the folder that keeps what it saved (its run folder, or where
    its units are kept) and ``saves`` says what is kept there (a rerun of the same command resumes from it); None
    when ``folder`` does not exist: it was interrupted before anything was written there, and no message names it."""

    def __init__(self, folder: Path, saves: str | None):
        saves = saves if Path(folder).is_dir() else None
        super().__init__(saves or f"interrupted before anything was saved in {folder}")
        self.folder, self.saves = Path(folder), saves


class CheckpointWriteError(OSError):
    """A checkpoint could not be written into the run folder ``filename`` (torch reports a full disk as a
    RuntimeError of its stream writer)."""


def _is_write_failure(err: RuntimeError) -> bool:
    text = str(err)
    return any(s in text for s in ("PytorchStreamWriter", "file write failed", "unexpected pos"))


@contextmanager
def guarding(folder: Path, saves: str | None = None, kept_in: Path | None = None) -> Iterator[None]:
    """Around the computation of a run into ``folder``: any failure removes the temporary files this process left
    there (a write cut short by a full disk must not keep the disk full); Ctrl-C becomes :class:`RunInterrupted`
    saying what ``saves`` (default: the finished tables) is kept in ``kept_in`` (default: ``folder``), or nothing
    where that folder does not exist yet; a checkpoint that torch could not write becomes
    :class:`CheckpointWriteError` naming the folder."""
    folder = Path(folder)
    try:
        yield
    except BaseException as err:
        if folder.is_dir():
            remove_stray_tmp(folder)
        if isinstance(err, KeyboardInterrupt) and not isinstance(err, RunInterrupted):
            raise RunInterrupted(folder if kept_in is None else kept_in,
                                 saves or f"the finished tables are kept in {folder}") from None
        if isinstance(err, RuntimeError) and _is_write_failure(err):
            raise CheckpointWriteError(28, "cannot write a checkpoint", str(folder)) from err
        raise


#: the wall clock of :class:`Computation` (a test may replace it)
_clock = time.perf_counter


class Computation:
    """A run being computed (:func:`computing`): the run, whether it was complete when opened, and what its
    manifest will say besides the lifecycle's own fields."""

    def __init__(self, run: Run, *, profile: str, code: Sequence[str], seed: int | None, device: str | None):
        self.run, self.profile, self.code, self.seed, self.device = run, profile, tuple(code), seed, device
        self.complete = run.complete           # complete (and fresh) when opened: nothing to compute
        self.extra: dict[str, Any] = {}
        self._stopped = False
        self._start = _clock()
        self._before = 0.0 if self.complete else run.elapsed_before()

    @property
    def elapsed(self) -> float:
        """Wall time of this run so far, in seconds, over every segment (an interrupted run resumes its count)."""
        return self._before + _clock() - self._start

    def save_progress(self) -> None:
        """Record the wall time so far, so that a resumed run's manifest counts this segment too."""
        self.run.record_elapsed(self.elapsed)

    def record(self, **fields: Any) -> None:
        """Fields the manifest will hold besides the lifecycle's (a summary, the models, the executor ...)."""
        self.extra.update(fields)

    def stop(self) -> None:
        """Leave the run unfinished (it resumes next time), e.g. a test that interrupts it on purpose."""
        self._stopped = True


@contextmanager
def computing(experiment: str, config: dict[str, Any], *, profile: str, code: Sequence[str],
              seed: int | None = None, device: str | None = None, force: bool = False, root: Path | None = None,
              tables: Sequence[str] = (), checkpoints: Sequence[str] = (), saves: str | None = None,
              unit_marker: str | None = None, kept_in: Path | None = None) -> Iterator[Computation]:
    """THE run lifecycle: open the run of (experiment, config) in the local cache, check it (:func:`prepare_run`:
    ``force`` deletes it; a damaged one is repaired, losing only what is unreadable; a complete one computed by other
    code is deleted and recomputed; a partial one is kept to resume), hand it to the body, and finish it.

    The body sees a :class:`Computation` ``job``: when ``job.complete`` the run was complete when opened and the body
    computes nothing (the manifest is left as it is). Otherwise the body writes the run's tables (``job.run``),
    calls ``job.save_progress()`` after each so that the wall time counts across resumes, and ``job.record(...)`` for
    manifest fields. On a normal exit the run is finished (:func:`_finish`, atomic with respect to Ctrl-C): its
    manifest records ``profile``, ``seed``, ``device``, the wall time over all segments and the code modules derived
    from ``code`` (compute entries, :func:`compute_modules`); only then are the progress file and the
    ``checkpoints`` (paths relative to the run folder) removed: the body never deletes its own checkpoint. On an
    exception the wall time so far is saved and the failure is handled as :func:`guarding` says (``saves``: what an
    interrupted run keeps, in ``kept_in``, default the run folder): the run resumes next time. ``unit_marker``: see
    :func:`repair`."""
    run = prepare_run(open_run(experiment, config, root=root), force=force, tables=tables, checkpoints=checkpoints,
                      unit_marker=unit_marker)
    job = Computation(run, profile=profile, code=code, seed=seed, device=device)
    try:
        with guarding(run.path, saves.format(folder=run.path) if saves else None, kept_in):
            yield job
    except BaseException:
        if not job.complete and run.path.exists():
            try:
                job.save_progress()
            except OSError:
                pass                            # a full disk must not hide the original error
        raise
    if job.complete or job._stopped:
        return
    _finish(job, checkpoints)


@contextmanager
def _sigint_deferred() -> Iterator[list[int]]:
    """Ctrl-C (SIGINT) held back inside the with-block: the signals that arrived are in the yielded list. Outside the
    main thread (where no handler can be set) nothing is deferred."""
    import signal
    import threading
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)


def _finish(job: Computation, checkpoints: Sequence[str]) -> None:
    """Finish a computed run, atomic with respect to Ctrl-C: the manifest is written (atomically) before anything it
    replaces — the progress file, the checkpoints — is removed, with SIGINT held back meanwhile; a Ctrl-C that came
    during it is raised afterwards as :class:`RunInterrupted` saying that the run was saved."""
    run = job.run
    with _sigint_deferred() as caught:
        run.finish(profile=job.profile, seed=job.seed, wall_time_s=job.elapsed, code=job.code, device=job.device,
                   **job.extra)
        for name in (PROGRESS, *checkpoints):
            (run.path / name).unlink(missing_ok=True)
    if caught:
        raise RunInterrupted(run.path, f"the run had finished: it is complete and saved in {run.path}")

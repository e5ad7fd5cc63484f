"""The results cache as the chapters use it: one namespace over the run store (:mod:`depthlib.store`), the run
lifecycle (:mod:`depthlib.lifecycle`), the selection rule (:mod:`depthlib.selection`) and code identity
(:mod:`depthlib.fingerprints`); and what is only here: committing a run into ``data/results`` (:func:`commit_run`),
what a chapter says about its run (:func:`provenance`, :func:`staleness_note`), and the command line
``python -m depthlib.results commit|locate``.

Provenance cannot lie: a run records the **code fingerprint** of the modules that computed its numbers. A run whose
fingerprint differs from the current code's is *stale*; ``tests/test_committed_runs.py`` fails on a stale committed
run and replays a cheap prefix of every fresh one; a provably pure change re-stamps committed runs by
:mod:`depthlib.purity`.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from depthlib import paths
from depthlib.errors import InputError
from depthlib.fingerprints import (  # noqa: F401 - one namespace for the chapters
    GLUE_MODULES,
    code_at,
    code_fingerprint,
    compute_modules,
    device_description,
    environment_versions,
    git_edits,
    git_state,
    is_glue,
)
from depthlib.fingerprints import code_commit as _code_commit
from depthlib.lifecycle import (  # noqa: F401 - one namespace for the chapters
    CheckpointWriteError,
    Computation,
    RunInterrupted,
    computing,
    corruption,
    guarding,
    prepare_run,
    readable_checkpoint,
    remove_stray_tmp,
    repair,
)
from depthlib.selection import (  # noqa: F401 - one namespace for the chapters
    CUSTOM,
    PROFILE_RANK,
    chapter_run,
    check_profile,
    find_runs,
    fresh_run,
    named_settings,
    profile_settings,
    roots,
    select_run,
    shown_profiles,
    shown_run,
)
from depthlib.store import (  # noqa: F401 - one namespace for the chapters
    PROGRESS,
    CorruptRunError,
    Run,
    atomic_folder,
    atomic_torch_save,
    atomic_write,
    config_key,
    file_sha256,
    normalise,
    open_run,
)


def commit_run(run: Run, dest: Path | None = None, omit: Sequence[str] = ()) -> Path:
    """Copy a finished run's manifest and tables (no checkpoints, no per-step scratch) into ``data/results``.

    ``omit`` leaves out tables the book does not read (e.g. the token sample of a sensitivity run) to keep the
    repository small; the committed manifest lists them under ``omitted_tables``."""
    if not run.complete:
        raise InputError(f"run {run.path} is not complete")
    dest_root = dest or paths.committed_results_dir()
    if dest_root is None:
        raise InputError("no data/results folder here (not a checkout): set DEPTHLIB_RESULTS_DIR")
    # named by the manifest's experiment: a run found under a former name (a local cache from before a rename)
    target = Path(dest_root) / (run.manifest.get("experiment") or run.experiment) / run.key
    if target.resolve() == run.path.resolve():
        raise InputError(f"run {run.path} is already committed")
    target.mkdir(parents=True, exist_ok=True)
    manifest = run.manifest
    unknown = set(omit) - set(manifest.get("tables", {}))
    if unknown:
        raise InputError(f"run {run.path} has no table(s) {', '.join(sorted(unknown))} to omit")
    for name in manifest.get("tables", {}):
        if name not in omit:
            shutil.copy2(run.table_path(name), target / f"{name}.parquet")
    if omit:
        manifest["omitted_tables"] = sorted(set(omit) | set(manifest.get("omitted_tables", [])))
        manifest["tables"] = {k: v for k, v in manifest["tables"].items() if k not in omit}
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str, allow_nan=False)
    atomic_write(target / "manifest.json", lambda tmp: tmp.write_text(text + "\n"))
    return target



def provenance(run: Run) -> str:
    """One line for a chapter's text: profile, device, commit, fingerprint, date, wall time, where it came from."""
    m = run.manifest
    commit = m.get("git_sha") or "unknown"
    if m.get("git_dirty"):
        # a dirty tree at compute time: the commit alone does not name the code; say which commit holds it
        commit += (f" with local edits; its computing code is commit {m['code_commit'][:7]}'s" if m.get("code_commit")
                   else f" with local edits to {', '.join(m['git_edited_files'])}" if m.get("git_edited_files")
                   else " with local edits (the code fingerprint identifies the computing code)")
    where = "committed run" if run.committed else "computed on this machine"
    return (f"profile {m.get('profile')} · {m.get('device')} · commit {commit} · code {m.get('code_fingerprint')}"
            f" · {m.get('created')} · wall time {m.get('wall_time_s', 0):.0f} s · {where} ({run.experiment}/{run.key})")


def run_info(run: Run) -> dict[str, Any]:
    """The provenance every chapter states about its run: profile, device, date, commit, wall time."""
    m = run.manifest
    return {"profile": m.get("profile"), "device": m.get("device"), "date": m.get("created"),
            "commit": m.get("git_sha"), "wall_time_s": m.get("wall_time_s")}


def staleness_note(run: Run) -> str:
    """A warning sentence when the run was computed by other code than the current one; '' when it is fresh."""
    if not run.stale:
        return ""
    m = run.manifest
    try:
        now = code_fingerprint(m["code_modules"]) if m.get("code_modules") else "unknown"
    except InputError:
        now = "unknown"
    return (f"These numbers were computed by code with fingerprint {m.get('code_fingerprint', '(unrecorded)')}; "
            f"the current code ({', '.join(m.get('code_modules', [])) or 'modules unrecorded'}) has {now}. "
            "They may not be what the current code computes: rebuild with `make book RERUN=1` to recompute.")


def code_commit(run: Run) -> str | None:
    """:func:`depthlib.fingerprints.code_commit` of a run's manifest."""
    return _code_commit(run.manifest)


def locate(run: Run) -> str | None:
    """Record in a run computed from a tree with local edits the commit that holds its computing code
    (:func:`code_commit`), so its provenance names it; returns that commit."""
    found = code_commit(run)
    if found and run.manifest.get("code_commit") != found:
        m = {**run.manifest, "code_commit": found}
        text = json.dumps(m, indent=2, sort_keys=True, default=str, allow_nan=False)
        atomic_write(run.path / "manifest.json", lambda tmp: tmp.write_text(text + "\n"))
    return found


USAGE = ("usage: python -m depthlib.results commit RUN_FOLDER [RUN_FOLDER ...]\n"
         "       python -m depthlib.results locate [RUN_FOLDER ...]   (default: committed runs made with local edits)")
#: the options each subcommand takes
_OPTIONS = {"commit": (), "locate": ()}


def _finished(path: Path) -> Run:
    """The finished run in the folder ``path``, else InputError (CorruptRunError) saying in one line what is wrong."""
    if not path.is_dir():
        raise InputError(f"no run folder at {path}")
    run = Run.load(path)
    if not run.complete:
        raise InputError(f"run {path} is not finished (no complete manifest): compute it to the end first")
    return run


def _has_committed_runs() -> bool:
    """Whether there is a committed results folder to look at (``locate`` with no folder looks there)."""
    root = paths.committed_results_dir()
    return root is not None and root.is_dir()


def _committed_folders() -> list[Path]:
    root = paths.committed_results_dir()
    return sorted(p.parent for p in root.glob("*/*/manifest.json")) if root is not None else []


def main(argv: list[str] | None = None) -> int:
    """``python -m depthlib.results commit RUN_FOLDER ...`` copies finished local runs into ``data/results``;
    ``locate`` names the commit holding the code
    of runs computed with local edits (:func:`locate`). A failure is one line ``error: ...`` and exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(USAGE)
        return 0
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    usage = next((line.strip().removeprefix("usage: ") for line in USAGE.splitlines()
                  if command in _OPTIONS and f" {command} " in line),
                 "python -m depthlib.results commit|locate ... (--help for more)")
    unknown = [a for a in args if a.startswith("-") and a not in _OPTIONS.get(command, ())]
    if command not in _OPTIONS:
        why = f"unknown command {command!r}" if command else "no command"
    elif unknown:
        why = f"{command}: unknown option {unknown[0]}"
    elif (command == "commit" and not args) or any(not a.strip() for a in args):
        why = f"{command}: name the run folder(s) to {command}"     # none, or an empty one (an unset variable)
    elif command == "locate" and not args and not _has_committed_runs():
        root = paths.committed_results_dir()
        why = ("locate: no committed runs here " + (f"({root} is not a folder)" if root is not None else
                                                    "(no data/results folder: not a checkout)")
               + "; name the run folder(s) to locate, or set DEPTHLIB_RESULTS_DIR")
    else:
        why = None
    if why:
        print(f"error: {why} (usage: {' '.join(usage.split())})", file=sys.stderr)
        return 2
    folders = [Path(a) for a in args if not a.startswith("-")]
    failed = located = 0
    try:
        for path in folders or (_committed_folders() if command != "commit" else []):
            run = _finished(path)
            name = f"{path.parent.name}/{path.name}"
            if command == "commit":
                if run.committed:
                    print(f"already committed: {path}")
                elif run.stale:
                    raise InputError(f"run {path} was computed by code other than the current code; "
                                     "recompute it first")
                else:
                    print(commit_run(run.validate()))
            elif run.manifest.get("git_dirty"):
                found = locate(run)
                failed, located = failed + (found is None), located + 1
                print(f"{name}: computed at {run.manifest.get('git_sha')} with local edits; "
                      + (f"its code is commit {found}'s" if found else "no commit holds its code: recompute it"))
            elif folders:                      # by default only the runs made with local edits are listed
                print(f"{name}: not computed with local edits (its commit "
                      f"{run.manifest.get('git_sha') or '(unrecorded)'} holds its code): nothing to locate")
        if command == "locate" and not folders and not located:
            print("no committed run was computed with local edits: nothing to locate")
    except InputError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {command} failed on {err.filename or 'a run folder'}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m depthlib.results`` (commit, locate) and the book's and cache's write failures: every failure is
one line ``error: ...`` on stderr with exit status 2 (never a traceback, never a silent exit 0), and the line says
what is actually wrong."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from depthlib import cli, results


def _make(root: Path, experiment: str = "exp", finish: bool = True, **manifest) -> results.Run:
    """A finished run (a table and a manifest) under ``root``, its manifest fields overridden by ``manifest``
    (e.g. ``git_dirty=False``: the test's tree may have local edits)."""
    run = results.open_run(experiment, {"a": 1}, root=root)
    run.write_table("t", pd.DataFrame({"x": [1.0, 2.0]}))
    if finish:
        run.finish(profile="smoke", seed=0, wall_time_s=1.0, code=("depthlib.measures",))
        (run.path / "manifest.json").write_text(json.dumps({**run.manifest, **manifest}))
    return run


def _one_error(err: str, *parts: str) -> None:
    """``err`` is one line ``error: ...`` holding every one of ``parts``."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for part in parts:
        assert part in lines[0], (part, err)


def _module_main(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "depthlib.results", *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=120)


# ---- 10, 11: a missing folder or a corrupt manifest -----------------------------------------------------
def test_locate_of_a_missing_folder_is_one_line_not_a_traceback(tmp_path):
    """Case 10 (reported on ``restamp``, the one-off migration since replaced by ``depthlib.purity``), as a real
    process: no InputError traceback."""
    done = _module_main("locate", str(tmp_path / "nonexistent"))
    assert done.returncode == 2 and done.stdout == ""
    _one_error(done.stderr, "no run folder at", str(tmp_path / "nonexistent"))


def test_locate_of_a_corrupt_manifest_is_one_line(roots, tmp_path):
    """Case 11, as a real process: no CorruptRunError traceback."""
    folder = tmp_path / "exp" / "0123456789ab"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{not json")
    done = _module_main("locate", str(folder))
    assert done.returncode == 2
    _one_error(done.stderr, str(folder), "unreadable manifest.json")


# ---- 12, 13: commit says what is wrong ------------------------------------------------------------------
def test_commit_of_a_committed_run_says_already_committed(roots, capsys):
    """Case 12: committing a run that is already under data/results is no failure (nothing is wrong and nothing is
    copied: no SameFileError): exit 0 and one line ``already committed: <path>`` on stdout."""
    committed, _ = roots
    run = _make(committed)
    assert results.main(["commit", str(run.path)]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == f"already committed: {run.path}" and out.err == ""
    with pytest.raises(results.InputError, match="already committed"):
        results.commit_run(run)                      # the library says so too, instead of shutil.SameFileError


def test_commit_says_missing_unfinished_or_stale(roots, tmp_path, capsys):
    """Case 13: a missing folder, an unfinished run (no manifest, or one whose status is not complete) and a stale
    run each get their own message; only the stale one says 'computed by code other than the current code'."""
    _, local = roots
    assert results.main(["commit", str(tmp_path / "nonexistent")]) == 2
    _one_error(capsys.readouterr().err, f"no run folder at {tmp_path / 'nonexistent'}")

    unfinished = _make(local, finish=False)
    assert results.main(["commit", str(unfinished.path)]) == 2
    _one_error(capsys.readouterr().err, f"run {unfinished.path} is not finished (no complete manifest)",
               "compute it to the end first")

    running = _make(local, "other", status="running")
    assert results.main(["commit", str(running.path)]) == 2
    err = capsys.readouterr().err
    _one_error(err, f"run {running.path} is not finished")
    assert "current code" not in err

    stale = _make(local, "stale", code_fingerprint="000000000000")
    assert results.main(["commit", str(stale.path)]) == 2
    _one_error(capsys.readouterr().err, "computed by code other than the current code; recompute it first")


# ---- 14: locate answers, unknown flags are refused --------------------------------------------------------
def test_locate_of_a_missing_folder_and_of_a_clean_run(roots, tmp_path, capsys):
    """Case 14: a missing folder is an error; a fine run not computed with local edits gets one line saying so."""
    _, local = roots
    assert results.main(["locate", str(tmp_path / "nonexistent")]) == 2
    _one_error(capsys.readouterr().err, f"no run folder at {tmp_path / 'nonexistent'}")

    clean = _make(local, git_dirty=False)
    assert results.main(["locate", str(clean.path)]) == 0
    out = capsys.readouterr()
    assert out.err == "" and len(out.out.strip().splitlines()) == 1
    assert f"exp/{clean.key}" in out.out and "not computed with local edits" in out.out


@pytest.mark.parametrize("command", ["commit", "locate"])
def test_unknown_flags_are_a_one_line_usage_error(roots, command, capsys):
    """Case 14: ``--bogus-flag`` is refused by every subcommand, before any folder is looked at."""
    _, local = roots
    run = _make(local, git_dirty=False)
    assert results.main([command, "--bogus-flag", str(run.path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    _one_error(out.err, "--bogus-flag", command, "usage")


def test_unknown_flag_as_a_process():
    done = _module_main("locate", "--bogus-flag")
    assert done.returncode == 2 and done.stdout == ""
    _one_error(done.stderr, "unknown option --bogus-flag")


# ---- 15: a run from a former experiment folder is committed under its manifest's experiment ----------------
def test_commit_names_the_folder_by_the_manifests_experiment(roots, capsys):
    """Case 15: a local run in ``trace/<key>`` (the former name) whose manifest says ``tracing`` is committed to
    ``tracing/<key>``, not ``trace/<key>``."""
    committed, local = roots
    run = _make(local, "tracing")
    former = local / "trace" / run.key
    former.parent.mkdir(parents=True)
    run.path.rename(former)
    assert results.main(["commit", str(former)]) == 0
    assert capsys.readouterr().out.strip() == str(committed / "tracing" / run.key)
    assert not (committed / "trace").exists()
    copied = results.Run.load(committed / "tracing" / run.key)
    assert copied.manifest["experiment"] == "tracing" and copied.validate() and copied.complete


# ---- 19: the write failures name the folder that cannot be written ----------------------------------------
def test_book_out_that_cannot_be_written_names_out(tmp_path, monkeypatch, capsys):
    """Case 19: ``depthlib book --out`` under a regular file (tests run as root, so chmod would not stop a write):
    one line naming ``--out`` and its folder, exit 2, no hint at DEPTHLIB_CACHE_DIR; no notebook is executed."""
    from depthlib import book
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(book, "execute_notebook", lambda *a, **k: pytest.fail("executed a notebook"))
    monkeypatch.setattr(book, "prepare_models", lambda notebooks: [])
    monkeypatch.setattr(book, "vendor_assets", lambda: pytest.fail("vendored the assets"))
    (tmp_path / "afile").write_text("a file, not a folder")
    out = tmp_path / "afile" / "out"
    assert cli.main(["book", "--profile", "smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--out" in err and str(out) in err and "DEPTHLIB_CACHE_DIR" not in err

    def read_only(self, *a, **kw):         # an existing folder on a read-only file system
        raise OSError(errno.EROFS, "Read-only file system", str(self))
    monkeypatch.setattr(Path, "touch", read_only)
    assert cli.main(["book", "--profile", "smoke", "--out", str(tmp_path / "ro")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"depthlib book: error: cannot write the book's build folder --out {tmp_path / 'ro'}: "
                           "Read-only file system; choose a writable folder with --out")


def test_read_only_cache_names_the_file_it_cannot_write(tmp_path, monkeypatch, capsys):
    """Case 19: a table write that fails as pyarrow fails on a read-only cache (an OSError with an errno and no
    file name) is reported by the CLI with the table's full path, not 'cannot write the cache' or a bare file name."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    run = results.open_run("compose", {"a": 1})

    def read_only(self, path, **kwargs):
        raise OSError(errno.EROFS, f"Failed to open local file '{path}'. Detail: [errno 30] Read-only file system")
    monkeypatch.setattr(pd.DataFrame, "to_parquet", read_only)

    import argparse
    args = argparse.Namespace(handler=lambda a: run.write_table("members", pd.DataFrame({"x": [1]})), threads=None)
    assert cli._run(args, ["compose", "--force"], "depthlib compose") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"cannot write {run.table_path('members')}: read-only file system" in err
    assert "DEPTHLIB_CACHE_DIR" in err     # the unwritable file is in the cache: pointing it elsewhere helps


def test_unwritable_place_outside_the_cache_gets_no_cache_hint(tmp_path, monkeypatch):
    """An OS failure outside the cache names its folder and does not suggest moving the cache."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    line = cli._environment_error(OSError(errno.EROFS, "Read-only file system", str(tmp_path / "elsewhere" / "x")))
    assert line.startswith(f"cannot write {tmp_path / 'elsewhere' / 'x'}: read-only file system")
    assert "DEPTHLIB_CACHE_DIR" not in line


def test_a_missing_table_is_not_reported_as_a_write_failure(tmp_path, monkeypatch):
    """Reading a table a run lacks (an incomplete run) says so, not 'cannot write the cache'; a missing file is named."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    line = cli._environment_error(FileNotFoundError("run toy/abc has no table 'curves'"))
    assert line.startswith("run toy/abc has no table 'curves': the run is incomplete") and "write" not in line
    gone = tmp_path / "gone.csv"
    line = cli._environment_error(FileNotFoundError(errno.ENOENT, "No such file or directory", str(gone)))
    assert line == f"no file or folder {gone}"


@pytest.mark.parametrize("argv, said", [([], "no command"), (["frob"], "unknown command 'frob'"),
                                        (["commit"], "commit: name the run folder(s) to commit")])
def test_a_missing_or_unknown_command_is_one_line(argv, said, capsys):
    assert results.main(argv) == 2
    _one_error(capsys.readouterr().err, said, "usage: python -m depthlib.results")


@pytest.mark.parametrize("command", ["commit", "locate"])
@pytest.mark.parametrize("blank", ["", " "])
def test_a_blank_folder_argument_is_a_usage_error(roots, command, blank, capsys):
    """Case 13's rest: an empty folder argument (``commit ""``, an unset shell variable) said "run . is not finished"
    or "no run folder at " instead of asking for the folder."""
    assert results.main([command, blank]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    _one_error(out.err, f"{command}: name the run folder(s)", "usage: python -m depthlib.results")


def test_locate_with_no_folder_and_no_committed_runs_is_an_error(tmp_path, monkeypatch, capsys):
    """Case 13's rest: ``locate`` with no folder looks at the committed runs; where there are none to look at (no
    data/results folder: not a checkout) it said "no committed run was computed with local edits" and exit 0."""
    from depthlib import paths
    monkeypatch.delenv("DEPTHLIB_RESULTS_DIR", raising=False)
    monkeypatch.setattr(paths, "in_checkout", lambda: False)
    assert results.main(["locate"]) == 2
    _one_error(capsys.readouterr().err, "locate: no committed runs here", "name the run folder(s)")
    monkeypatch.setenv("DEPTHLIB_RESULTS_DIR", str(tmp_path / "nowhere"))
    assert results.main(["locate"]) == 2
    _one_error(capsys.readouterr().err, f"locate: no committed runs here ({tmp_path / 'nowhere'} is not a folder)")
    monkeypatch.setenv("DEPTHLIB_RESULTS_DIR", str(tmp_path))
    assert results.main(["locate"]) == 0                       # a results folder, none of its runs made with edits
    assert capsys.readouterr().out.strip() == "no committed run was computed with local edits: nothing to locate"

"""A damaged or interrupted run never loses a finished unit (the run lifecycle, :func:`depthlib.results.computing`).

Each test first reproduces what a user did: a truncated member checkpoint in a partial depth series, a corrupt manifest
of a finished compose run, a corrupt member table in compose ``units/``, Ctrl-C while an interventions run finishes.
Recovery deletes only what is unreadable, rebuilds what intact units hold, and ``finish`` writes the manifest before it
removes anything the manifest replaces, with Ctrl-C held back meanwhile."""
from __future__ import annotations

import os
import signal

import pandas as pd
import pytest

from depthlib import results
from depthlib.compose import experiment as compose
from depthlib.lm import series
from tests.test_lm import TINY


def _stamp(folder) -> dict[str, int]:
    """name -> mtime (ns) of every file under ``folder``: a file rewritten gets a new one."""
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


# ---- the depth series: a truncated member checkpoint ---------------------------------------------------------
def test_a_truncated_member_checkpoint_costs_that_member_only(cache, tmp_path, monkeypatch, capsys):
    whole = series.run_series(TINY, progress=False, root=tmp_path / "reference")
    assert series.run_series(TINY, progress=False, stop_after_units=1) is None      # depth 1 finished
    run = series.open_series_run(TINY)
    units = run.path / series.UNITS
    finished = _stamp(units)
    assert "d001_s0_model.parquet" in finished
    (units / "checkpoint_d002_s0.pt").write_bytes(b"PK\x03\x04 truncated")          # depth 2 was cut mid-save
    capsys.readouterr()
    again = series.run_series(TINY, progress=False)
    err = capsys.readouterr().err
    assert "damaged run" in err and "checkpoint units/checkpoint_d002_s0.pt" in err and "deleting it" not in err
    kept = _stamp(units)
    assert all(kept[name] == t for name, t in finished.items() if name.startswith("d001_")), "depth 1 was retrained"
    for name in ("curves", "doc_losses", "fit_bootstrap"):
        pd.testing.assert_frame_equal(again.table(name), whole.table(name), check_exact=True)


# ---- compose: a corrupt manifest, a corrupt member table ----------------------------------------------------
@pytest.fixture
def compose_run(cache, monkeypatch):
    from depthlib.compose import chapter
    cfg = chapter.PROFILES["smoke"].run
    run = compose.run_compose(cfg, progress=False)
    reference = {t: run.table(t) for t in compose.UNIT_TABLES}
    trained = []
    real = compose.train_member
    monkeypatch.setattr(compose, "train_member", lambda *a, **k: trained.append(a[2:5]) or real(*a, **k))
    return cfg, run, reference, trained


def _same_tables(run, reference):
    """Equal value for value, wall times aside (a retrained member takes other seconds)."""
    from depthlib.purity import VOLATILE
    for name, table in reference.items():
        keep = [c for c in table.columns if not VOLATILE.search(c)]
        pd.testing.assert_frame_equal(run.table(name)[keep], table[keep], check_exact=True)


def test_a_corrupt_manifest_of_a_finished_run_is_rebuilt_from_its_units(compose_run, capsys):
    cfg, run, reference, trained = compose_run
    (run.path / "manifest.json").write_text('{"status": "compl')
    capsys.readouterr()
    again = compose.run_compose(cfg, progress=False)
    assert "its manifest (its manifest.json is unreadable)" in capsys.readouterr().err
    assert again.complete and trained == []                                           # no member retrained
    _same_tables(again, reference)


def test_a_corrupt_member_table_retrains_that_member_only(compose_run, capsys):
    cfg, run, reference, trained = compose_run
    (run.path / "manifest.json").unlink()                                             # interrupted before the merge
    first = compose.unit_name(*cfg.units()[0])
    (run.path / compose.UNITS / f"{first}_curves.parquet").write_bytes(b"PAR1 garbled")
    capsys.readouterr()
    again = compose.run_compose(cfg, progress=False)
    err = capsys.readouterr().err
    assert f"units/{first}_curves" in err and f"marker of its unit {first}" in err
    assert trained == [tuple(cfg.units()[0])]
    _same_tables(again, reference)


def test_a_finished_tables_bad_checksum_removes_that_table_and_resumes(compose_run, capsys):
    cfg, run, reference, trained = compose_run
    path = run.table_path("curves")
    path.write_bytes(path.read_bytes()[:-20])
    again = compose.run_compose(cfg, progress=False)
    assert "table curves (it failed its checksum)" in capsys.readouterr().err
    assert trained == [] and again.complete
    _same_tables(again, reference)


# ---- Ctrl-C while a run finishes ------------------------------------------------------------------------------
def _body_run(cache, *, interrupt_in_finish: bool):
    """A run with a checkpoint, as the interventions body leaves it; Ctrl-C during its finish if asked."""
    import torch
    with results.computing("demo", {"a": 1}, profile="smoke", code=("depthlib.measures",),
                           checkpoints=("checkpoint.pt",)) as job:
        if job.complete:
            return job.run
        job.run.path.mkdir(parents=True, exist_ok=True)
        torch.save({"done": 3}, job.run.path / "checkpoint.pt")
        job.run.write_table("scores", pd.DataFrame({"x": [1.0, 2.0]}))
        if interrupt_in_finish:
            real = results.Run.finish

            def finish(self, **kw):
                os.kill(os.getpid(), signal.SIGINT)       # the user presses Ctrl-C as the manifest is written
                return real(self, **kw)
            results.Run.finish = finish
    return job.run


def test_ctrl_c_during_finish_keeps_the_finished_run(cache):
    real = results.Run.finish
    try:
        with pytest.raises(results.RunInterrupted, match="complete and saved"):
            _body_run(cache, interrupt_in_finish=True)
    finally:
        results.Run.finish = real
    run = results.open_run("demo", {"a": 1})
    assert run.complete and not (run.path / "checkpoint.pt").exists() and not (run.path / results.PROGRESS).exists()


def test_the_checkpoint_outlives_everything_but_the_manifest(cache):
    """The lifecycle, not the body, removes the checkpoints, after the manifest: an interrupt before it keeps them."""
    run = _body_run(cache, interrupt_in_finish=False)
    assert run.complete and not (run.path / "checkpoint.pt").exists()
    import inspect

    from depthlib import interventions
    assert "unlink" not in inspect.getsource(interventions._compute)      # the body never deletes its checkpoint


def test_ctrl_c_just_after_the_last_plan_keeps_the_interventions_run(cache, tmp_path, monkeypatch, capsys):
    """The user's case: Ctrl-C as ``interventions`` finishes its last plan. It used to exit with "nothing was
    saved", the six tables on disk but no manifest and no checkpoint, and the rerun recomputed every plan."""
    from depthlib.cli import main
    from tests import tiny
    from tests.test_reliability import _tiny_folder
    folder = _tiny_folder(tmp_path / "model")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(tiny.TEXTS))
    argv = ["interventions", "--model", str(folder), "--corpus", str(corpus), "--docs", "2", "--rank-docs", "2",
            "--max-length", "16", "--plan", "delete:1", "--json"]
    real = results.Run.finish

    def finish(self, **kw):
        os.kill(os.getpid(), signal.SIGINT)
        return real(self, **kw)
    monkeypatch.setattr(results.Run, "finish", finish)
    capsys.readouterr()
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "complete and saved" in err and "nothing was saved" not in err
    monkeypatch.setattr(results.Run, "finish", real)
    assert main(argv) == 0 and "loaded a finished run from the cache" in capsys.readouterr().err


def test_ctrl_c_in_the_converged_protocol_says_its_finished_units_are_kept(cache, monkeypatch, capsys):
    """The sweep's case F2: Ctrl-C while the protocol's units ran said "nothing was saved", though every finished unit
    stays in its own run folder and the rerun resumes them."""
    from depthlib import executors
    from depthlib.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(executors, "finished_runs", interrupted)
    (cache / "results" / "toy-converged-units").mkdir(parents=True)      # a unit had finished (none: F7's test)
    assert main(["toy", "--profile", "smoke", "--protocol", "converged", "--json"]) == 130
    err = capsys.readouterr().err
    assert "every finished unit" in err and "toy-converged-units" in err and "nothing was saved" not in err


# ---- one damaged run, one line ----------------------------------------------------------------------------------
def _demo_run():
    with results.computing("demo", {"a": 1}, profile="smoke", code=("depthlib.measures",)) as job:
        if not job.complete:
            job.run.write_table("scores", pd.DataFrame({"x": [1.0, 2.0]}))
    return job.run


@pytest.mark.parametrize("damage", ["manifest", "table"])
def test_a_damaged_run_is_reported_in_one_line(cache, capsys, damage):
    """The sweep's case F8: the chapter's choice of a run (:func:`results.shown_run`, asked once per part that looks,
    as ``toy --calibration both`` does) said "skipping …" or "repairing it", and the lifecycle's repair of the same
    folder said "damaged run …" again: two or three lines for one damaged run."""
    run = _demo_run()
    if damage == "manifest":
        (run.path / "manifest.json").write_text('{"status": "compl')
    else:
        path = run.table_path("scores")
        path.write_bytes(path.read_bytes()[:-20])
    capsys.readouterr()
    for _ in range(2):
        assert results.shown_run("demo", "smoke") is None
    again = results.chapter_run("demo", "smoke", _demo_run)
    assert again.complete and again.path == run.path
    err = capsys.readouterr().err
    assert len([ln for ln in err.splitlines() if run.key in ln]) == 1, err
    damage_again = again.table_path("scores")                     # the next damage is said again
    damage_again.write_bytes(damage_again.read_bytes()[:-20])
    assert results.chapter_run("demo", "smoke", _demo_run).complete
    assert len([ln for ln in capsys.readouterr().err.splitlines() if run.key in ln]) == 1


# ---- Ctrl-C before anything is written ------------------------------------------------------------------------
def _interrupted(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("argv, patch, kept", [
    (["toy", "--json"], "depthlib.toy.sweep.build_engine", None),
    (["toy", "--executor", "joblib", "--json"], "depthlib.executors.finished_runs", "toy-shards"),
])
def test_ctrl_c_during_setup_names_no_folder_that_does_not_exist(cache, monkeypatch, capsys, argv, patch, kept):
    """The sweep's case F7: Ctrl-C while a toy sweep was set up (its teachers built, its shards submitted) named the
    run folder (or the shards' folder) as where its checkpoint was kept, though nothing had created it yet."""
    from depthlib.cli import main
    monkeypatch.setattr(patch, _interrupted)
    assert main(argv) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == f"depthlib toy: interrupted before anything was saved; run `depthlib {' '.join(argv)}` again", line
    assert not (cache / "results").exists()
    if kept:                                  # a shard of it had finished: the folder exists, and is named
        (cache / "results" / kept).mkdir(parents=True)
        assert main(argv) == 130
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"are under {cache / 'results' / kept}; run `" in line, line

"""The results cache and the one run-selection rule (depthlib.results): keys, atomic writes, manifests with
checksums, code fingerprints and staleness, ranking, corrupt runs, committing."""
from __future__ import annotations

import json
import sys
import textwrap

import pandas as pd
import pytest

from depthlib import fingerprints, paths, results, store
from depthlib.errors import InputError

CODE = ("depthlib.measures",)


def _make(root, profile, config, created, code=CODE, experiment="exp"):
    run = results.open_run(experiment, config, root=root)
    run.write_table("t", pd.DataFrame({"x": [1.0, 2.0]}))
    run.finish(profile=profile, seed=0, wall_time_s=1.0, code=code)
    m = run.manifest
    m["created"] = created
    (run.path / "manifest.json").write_text(json.dumps(m))
    return run


def test_config_key_is_stable_and_order_free():
    a = results.config_key({"b": 1, "a": [1, 2], "c": {"y": 1, "x": 2}})
    assert a == results.config_key({"c": {"x": 2, "y": 1}, "a": [1, 2], "b": 1})
    assert len(a) == 12 and int(a, 16) >= 0
    assert results.config_key({"a": 1}) != results.config_key({"a": 2})
    assert results.config_key({"a": (1, 2)}) == results.config_key({"a": [1, 2]})


def test_config_key_pinned():
    """The key of a config never changes across versions (committed runs are found by it)."""
    import hashlib
    blob = json.dumps({"profile": "smoke", "steps": 60}, sort_keys=True, separators=(",", ":"))
    assert results.config_key({"profile": "smoke", "steps": 60}) == hashlib.sha256(blob.encode()).hexdigest()[:12]


def test_write_table_is_atomic(tmp_path):
    run = results.open_run("exp", {"a": 1}, root=tmp_path)
    run.write_table("t", pd.DataFrame({"x": [1]}))

    class Boom:
        def to_parquet(self, path, index=False):
            path.write_bytes(b"half a file")
            raise OSError("disk full")
    with pytest.raises(OSError):
        run.write_table("t", Boom())
    assert run.table("t")["x"].tolist() == [1]                       # the old table survives
    assert not list(run.path.glob("*.tmp*"))                          # no stray temporary file


def test_truncated_table_counts_as_missing_and_unreadable_table_is_one_line(tmp_path):
    run = results.open_run("exp", {"a": 1}, root=tmp_path)
    run.write_table("t", pd.DataFrame({"x": range(100)}))
    data = run.table_path("t").read_bytes()
    run.table_path("t").write_bytes(data[: len(data) // 2])
    with pytest.raises(results.CorruptRunError, match="unreadable"):
        run.table("t")
    assert not run.has("t") and not run.table_path("t").exists()      # recomputed on resume


def test_manifest_records_fingerprint_checksums_and_validates(roots):
    committed, local = roots
    run = _make(local, "cpu", {"a": 1}, "2026-01-01T00:00:00Z")
    m = run.manifest
    assert m["code_fingerprint"] == results.code_fingerprint(CODE) and m["code_modules"] == list(CODE)
    assert set(m["tables"]) == {"t"} and len(m["tables"]["t"]["sha256"]) == 64
    assert not run.stale and run.validate() is run
    run.table_path("t").write_bytes(run.table_path("t").read_bytes() + b"x")
    with pytest.raises(results.CorruptRunError, match="checksum"):
        run.validate()


def test_corrupt_manifest_is_reported_and_skipped(roots, capsys):
    committed, local = roots
    good = _make(local, "cpu", {"a": 1}, "2026-01-01T00:00:00Z")
    bad = _make(local, "cpu", {"a": 2}, "2026-01-02T00:00:00Z")
    (bad.path / "manifest.json").write_text('{"status": "compl')
    assert [r.path for r in results.find_runs("exp")] == [good.path]
    assert str(bad.path) in capsys.readouterr().err


def _module(tmp_path, monkeypatch, source):
    pkg = tmp_path / "fpmods"
    pkg.mkdir(exist_ok=True)
    (pkg / "fp_target.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(pkg))
    fingerprints._module_digest.cache_clear()
    return results.code_fingerprint(["fp_target"])


def test_fingerprint_ignores_docs_and_comments_but_not_code(tmp_path, monkeypatch):
    base = _module(tmp_path, monkeypatch, '''
        """Doc."""
        def f(x):
            """What f does."""
            return x + 1  # a comment
    ''')
    same = _module(tmp_path, monkeypatch, '''
        """Another doc."""

        def f(x):
            # reworded comment
            return x + 1
    ''')
    changed = _module(tmp_path, monkeypatch, '''
        def f(x):
            return x + 2
    ''')
    fingerprints._module_digest.cache_clear()
    sys.modules.pop("fp_target", None)
    assert base == same != changed


def test_stale_run_detected_and_ranked_after_fresh(roots, tmp_path, monkeypatch):
    committed, local = roots
    _module(tmp_path, monkeypatch, "def f():\n    return 1\n")
    old = _make(committed, "cpu", {"a": 1}, "2026-01-01T00:00:00Z", code=("fp_target",))
    assert not old.stale
    _module(tmp_path, monkeypatch, "def f():\n    return 2\n")
    assert old.stale and "make book RERUN=1" in results.staleness_note(old)
    fresh = _make(local, "cpu", {"a": 1}, "2025-01-01T00:00:00Z", code=("fp_target",))
    assert results.staleness_note(fresh) == ""
    assert results.select_run("exp", "cpu").path == fresh.path           # fresh beats committed-but-stale
    fresh_path = fresh.path
    import shutil
    shutil.rmtree(fresh_path)
    assert results.select_run("exp", "cpu").path == old.path             # else the stale one, with its warning
    assert results.select_run("exp", "cpu", rerun=True) is None          # RERUN never shows stale or committed


def test_ranking_profile_then_committed_then_newest(roots):
    committed, local = roots
    smoke = _make(local, "smoke", {"p": "smoke"}, "2026-03-01T00:00:00Z")
    cpu_local_new = _make(local, "cpu", {"p": "cpu", "v": 2}, "2026-03-01T00:00:00Z")
    cpu_committed_old = _make(committed, "cpu", {"p": "cpu", "v": 1}, "2026-01-01T00:00:00Z")
    assert results.select_run("exp", "cpu").path == cpu_committed_old.path   # committed > cached
    paper = _make(local, "paper", {"p": "paper"}, "2025-01-01T00:00:00Z")
    assert results.select_run("exp", "cpu").path == paper.path               # paper > cpu
    assert results.select_run("exp", "smoke").path == smoke.path             # smoke shows only smoke
    assert results.select_run("exp", "paper").path == paper.path
    assert results.select_run("exp", "cpu", rerun=True).path == paper.path   # rerun: local only
    (paper.path / "manifest.json").unlink()
    assert results.select_run("exp", "cpu", rerun=True).path == cpu_local_new.path
    assert results.select_run("exp", "paper") is None                        # paper never falls back to cpu


def test_runs_under_a_former_experiment_name_are_still_found(roots):
    """A local cache from before a chapter's rename (chapter 6's runs were ``lm-depth``, now ``lm``) keeps its runs."""
    from depthlib.chapters import chapter_of, former_names
    committed, local = roots
    assert former_names("lm") == ("lm-depth",) and former_names("scaling") == ("chinchilla",)
    old = _make(local, "cpu", {"p": 1}, "2026-01-01T00:00:00Z", experiment="lm-depth")
    assert results.select_run("lm", "cpu").path == old.path
    assert chapter_of("lm-depth").name == "lm" and chapter_of("causal_tracing").name == "tracing"
    new = _make(local, "cpu", {"p": 1}, "2026-02-01T00:00:00Z", experiment="lm")
    assert results.select_run("lm", "cpu").path == new.path        # the newer run, under the name it has now


def test_expected_config_and_custom_runs(roots):
    committed, local = roots
    old = _make(local, "cpu", {"steps": 10}, "2026-01-01T00:00:00Z")
    custom = _make(local, "custom", {"steps": 3}, "2026-02-01T00:00:00Z")
    expected = {"cpu": {"steps": 20}}.get
    assert results.select_run("exp", "cpu", expected_config=expected) is None   # settings changed: not shown
    assert results.select_run("exp", "cpu", expected_config=lambda p: {"steps": 10}).path == old.path
    assert results.select_run("exp", "cpu", expected_config=expected, include_custom=True).path == custom.path


def test_chapter_run_computes_once_and_recomputes_corrupt_local(roots):
    committed, local = roots
    calls = []

    def compute():
        calls.append(1)
        return _make(local, "cpu", {"a": 1}, f"2026-01-0{len(calls)}T00:00:00Z")
    first = results.chapter_run("exp", "cpu", compute)
    assert results.chapter_run("exp", "cpu", compute).path == first.path and len(calls) == 1
    first.table_path("t").write_bytes(b"garbage")
    again = results.chapter_run("exp", "cpu", compute)
    assert len(calls) == 2 and again.validate()


def test_commit_run_copies_tables_and_manifest_only(roots):
    committed, local = roots
    run = _make(local, "cpu", {"a": 1}, "2026-01-01T00:00:00Z")
    (run.path / "checkpoint.pt").write_bytes(b"weights")
    target = results.commit_run(run)
    assert sorted(p.name for p in target.iterdir()) == ["manifest.json", "t.parquet"]
    copied = results.select_run("exp", "cpu")
    assert copied.committed and copied.path == target


def test_commit_command_refuses_stale_and_reports_in_one_line(roots, tmp_path, monkeypatch, capsys):
    committed, local = roots
    _module(tmp_path, monkeypatch, "def f():\n    return 1\n")
    run = _make(local, "cpu", {"a": 1}, "2026-01-01T00:00:00Z", code=("fp_target",))
    _module(tmp_path, monkeypatch, "def f():\n    return 3\n")
    assert results.main(["commit", str(run.path)]) == 2
    assert "recompute it first" in capsys.readouterr().err


def test_elapsed_time_accumulates_across_segments(tmp_path):
    run = results.open_run("exp", {"a": 1}, root=tmp_path)
    assert run.elapsed_before() == 0.0
    run.record_elapsed(12.5)
    assert run.elapsed_before() == 12.5


def test_profiles_and_paths(monkeypatch, tmp_path):
    assert results.shown_profiles("smoke") == ("smoke",)
    assert results.shown_profiles("cpu") == ("paper", "cpu")
    assert results.shown_profiles("paper") == ("paper",)
    with pytest.raises(InputError, match="unknown profile 'gpu'"):
        results.check_profile("gpu")
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "c"))
    assert paths.local_results_dir() == tmp_path / "c" / "results"
    assert paths.package_file("measures.py").exists()


def test_commit_run_can_omit_tables_and_says_so(roots):
    committed, local = roots
    run = results.open_run("exp", {"a": 1}, root=local)
    run.write_table("keep", pd.DataFrame({"x": [1]}))
    run.write_table("big", pd.DataFrame({"x": range(1000)}))
    run.finish(profile="cpu", seed=0, wall_time_s=1.0, code=CODE)
    target = results.commit_run(run, omit=("big",))
    assert sorted(p.name for p in target.iterdir()) == ["keep.parquet", "manifest.json"]
    copied = results.Run("exp", {}, target)
    assert copied.manifest["omitted_tables"] == ["big"] and copied.validate() and not copied.stale
    with pytest.raises(InputError, match="no table"):
        results.commit_run(run, omit=("nope",))


# ---- a run is validated when it is opened ----------------------------------------------------------
def test_prepare_run_keeps_a_sound_run_and_deletes_a_forced_one(roots, capsys):
    _, local = roots
    run = _make(local, "smoke", {"a": 1}, "2024-01-01")
    assert results.prepare_run(run, tables=("t",)).complete and capsys.readouterr().err == ""
    results.prepare_run(run, force=True)
    assert not run.path.exists() and f"--force: deleting the cached run {run.path}" in capsys.readouterr().err


@pytest.mark.parametrize("damage, removed, kept", [
    (lambda run: (run.path / "manifest.json").write_text('{"status": "compl'),
     "its manifest (its manifest.json is unreadable)", ["t.parquet"]),
    (lambda run: (run.path / "manifest.json").write_text("[1, 2]"),
     "its manifest (its manifest.json is unreadable)", ["t.parquet"]),
    (lambda run: run.table_path("t").write_bytes(run.table_path("t").read_bytes()[:50]),
     "table t (it failed its checksum); its manifest (table t fails its checksum)", []),
    (lambda run: run.table_path("t").unlink(), "its manifest (table t is missing)", []),
])
def test_prepare_run_repairs_a_damaged_finished_run_keeping_what_is_whole(roots, capsys, damage, removed, kept):
    """Only the damaged part goes (the run resumes from the rest): never the whole folder."""
    _, local = roots
    run = _make(local, "smoke", {"a": 1}, "2024-01-01")
    damage(run)
    results.prepare_run(run, tables=("t",))
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"[depthlib] damaged run {run.path}: removed {removed}; the rest is kept and the run resumes"]
    assert sorted(p.name for p in run.path.iterdir()) == kept


def test_prepare_run_checks_a_partial_runs_tables_and_checkpoint(tmp_path, capsys):
    import torch
    run = results.open_run("exp", {"a": 2}, root=tmp_path)
    run.write_table("curve_1", pd.DataFrame({"x": range(50)}))
    run.write_table("curve_2", pd.DataFrame({"x": range(50)}))
    torch.save({"w": torch.ones(100)}, run.path / "checkpoint.pt")
    assert results.corruption(run, checkpoints=("checkpoint.pt",)) is None
    assert results.readable_checkpoint(run.path / "checkpoint.pt")
    data = (run.path / "checkpoint.pt").read_bytes()
    (run.path / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    assert not results.readable_checkpoint(run.path / "checkpoint.pt")
    assert results.corruption(run, checkpoints=("checkpoint.pt",)) == "checkpoint.pt is unreadable"
    garbled = bytearray(run.table_path("curve_1").read_bytes())
    garbled[10:60] = b"x" * 50
    run.table_path("curve_1").write_bytes(bytes(garbled))
    assert results.corruption(run) == "table curve_1 is unreadable"
    results.prepare_run(run)
    assert sorted(p.name for p in run.path.iterdir()) == ["curve_2.parquet"]       # the whole table is kept
    err = capsys.readouterr().err
    assert "unreadable table curve_1.parquet" in err and "unreadable checkpoint checkpoint.pt" in err


def test_a_damaged_unit_file_costs_its_unit_only(tmp_path, capsys):
    """Under units/, an unreadable table or checkpoint of a unit also removes that unit's marker (written last), so
    exactly that unit is computed again; other units and their markers are kept."""
    run = results.open_run("exp", {"a": 3}, root=tmp_path)
    units = results.Run("exp", {}, run.path / "units")
    for unit in ("d001_s0", "d002_s0"):
        for table in ("curve", "model"):
            units.write_table(f"{unit}_{table}", pd.DataFrame({"x": [1]}))
        (units.path / f"{unit}.pt").write_bytes(b"not a zip")   # d002's block checkpoint: unreadable too
    (units.path / "d001_s0.pt").unlink()
    units.table_path("d001_s0_curve").write_bytes(b"PAR1 garbled")
    assert results.repair(run, unit_marker="model") == [
        "the unreadable table units/d001_s0_curve.parquet", "the marker of its unit d001_s0 (that unit is computed again)",
        "the unreadable checkpoint units/d002_s0.pt", "the marker of its unit d002_s0 (that unit is computed again)"]
    assert sorted(p.name for p in units.path.iterdir()) == ["d002_s0_curve.parquet"]


def test_stray_tmp_files_of_gone_processes_are_removed(tmp_path):
    import os
    import subprocess
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f"checkpoint.pt.tmp{gone}").write_bytes(b"x" * 10)
    (tmp_path / f"t.parquet.tmp{os.getpid()}").write_bytes(b"x")
    (tmp_path / f"t.parquet.tmp{os.getppid()}").write_bytes(b"x")        # a live process's: kept
    (tmp_path / "notes.tmp.txt").write_bytes(b"x")                         # not ours: kept
    removed = {p.name for p in results.remove_stray_tmp(tmp_path)}
    assert removed == {f"checkpoint.pt.tmp{gone}", f"t.parquet.tmp{os.getpid()}"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"t.parquet.tmp{os.getppid()}", "notes.tmp.txt"])


def test_file_digest_is_cached_by_path_size_and_mtime(tmp_path, monkeypatch):
    import hashlib
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "weights.bin"
    f.write_bytes(b"abc")
    assert results.file_sha256(f) == hashlib.sha256(b"abc").hexdigest()
    calls = []
    monkeypatch.setattr(store, "_sha256", lambda p: calls.append(p) or "0" * 64)
    assert results.file_sha256(f) == hashlib.sha256(b"abc").hexdigest() and not calls     # memory
    store._DIGESTS.clear()
    assert results.file_sha256(f) == hashlib.sha256(b"abc").hexdigest() and not calls     # disk
    f.write_bytes(b"abcd")                                                                   # size changes
    assert results.file_sha256(f) == "0" * 64 and calls


def test_prepare_run_recomputes_a_stale_complete_run(tmp_path, monkeypatch, capsys):
    """Opening a complete run made by other code to compute into deletes it, instead of handing back its numbers."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    run = results.open_run("demo", {"a": 1})
    run.write_table("t", pd.DataFrame({"x": [1.0]}))
    run.finish(profile="smoke", seed=0, wall_time_s=0.0, code=("depthlib.measures",))
    m = run.manifest
    m["code_fingerprint"] = "000000000000"
    (run.path / "manifest.json").write_text(json.dumps(m))
    assert run.stale
    results.prepare_run(run)
    assert not run.path.exists() and "computed by other code" in capsys.readouterr().err

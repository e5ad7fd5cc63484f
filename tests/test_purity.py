"""The pure-refactor rule (depthlib.purity): a committed run is re-stamped only when the smoke replay before and after
a change is bit-identical and the run was fresh before it; the comparison sees a one-ulp change and ignores wall
times. (The replay itself, two smoke runs of a chapter in subprocesses, is exercised by `python -m depthlib.purity`;
its record in the committed manifests is checked by tests/test_committed_runs.py.)"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from depthlib import paths, purity, results


def _side(root, tables: dict[str, pd.DataFrame]):
    for name, df in tables.items():
        (root / "series").mkdir(parents=True, exist_ok=True)
        df.to_parquet(root / "series" / f"{name}.parquet", index=False)
    return root


def test_compare_sees_one_ulp_and_ignores_wall_times(tmp_path):
    loss = np.array([2.5, 3.25])
    a = _side(tmp_path / "a", {"curves": pd.DataFrame({"loss": loss, "train_seconds": [1.0, 2.0]})})
    b = _side(tmp_path / "b", {"curves": pd.DataFrame({"loss": loss, "train_seconds": [9.0, 7.0]})})
    assert purity.compare(a, b) == []
    c = _side(tmp_path / "c", {"curves": pd.DataFrame({"loss": np.nextafter(loss, 10), "train_seconds": [1.0, 2.0]})})
    assert purity.compare(a, c) == ["series/curves.parquet"]
    d = _side(tmp_path / "d", {"curves": pd.DataFrame({"loss": loss.astype("float32"), "train_seconds": [1.0, 2.0]})})
    assert purity.compare(a, d) == ["series/curves.parquet"]                  # a dtype change is a change
    e = _side(tmp_path / "e", {"other": pd.DataFrame({"loss": loss})})
    assert purity.compare(a, e) == ["series: the tables differ"]


def test_a_retired_part_is_not_compared_and_its_runs_are_never_restamped(tmp_path, lm_run, monkeypatch):
    """A change that removes a part: the parts both sides compute are compared; the retired one is reported, and a run
    whose experiment was not among the compared parts is not re-stamped, however equal the rest."""
    loss = pd.DataFrame({"loss": [2.5, 3.25]})
    before = _side(tmp_path / "before", {"curves": loss})
    (before / "old").mkdir()
    loss.to_parquet(before / "old" / "curves.parquet")
    after = _side(tmp_path / "after", {"curves": loss})
    assert purity.compare(before, after) == [] and purity.retired_and_added(before, after) == (["old"], [])
    assert purity.retired_and_added(after, before) == ([], ["old"])
    monkeypatch.setattr(results.Run, "stale", property(lambda self: True))
    line = purity.restamp(lm_run, {**_replay(True), "experiments": ["compose-rhm"]})
    assert line.startswith("recompute  lm/") and "not replayed" in line
    assert purity.restamp(lm_run, {**_replay(True), "experiments": ["lm"]}).startswith("restamped")


@pytest.fixture
def lm_run(tmp_path, monkeypatch):
    """A run of chapter 6's experiment whose recorded fingerprint is the current code's (as at HEAD)."""
    if not paths.in_checkout():
        pytest.skip("needs the git checkout")
    run = results.open_run("lm", {"a": 1}, root=tmp_path)
    run.write_table("t", pd.DataFrame({"x": [1.0]}))
    run.finish(profile="cpu", seed=0, wall_time_s=1.0, code=("depthlib.lm.series:run_series",))
    return run


def _replay(equal: bool) -> dict:
    head, _ = results.git_state()
    return {"profile": "smoke", "before_commit": head, "equal": equal, "differences": [] if equal else ["x/t.parquet"],
            "tables": 3, "rows": 10}


def test_restamp_needs_an_equal_replay_and_a_run_fresh_before(lm_run, monkeypatch):
    assert purity.restamp(lm_run, _replay(True)).startswith("fresh")            # nothing to do
    monkeypatch.setattr(results.Run, "stale", property(lambda self: True))      # as after a change of its code
    assert purity.restamp(lm_run, _replay(False)).startswith("recompute  lm/") # the replay differs
    m = json.loads((lm_run.path / "manifest.json").read_text())
    assert "restamped_by_replay" not in m
    line = purity.restamp(lm_run, _replay(True))
    assert line.startswith("restamped") and "bit-identical" in line
    m = json.loads((lm_run.path / "manifest.json").read_text())
    assert m["restamped_by_replay"]["equal"] and m["restamped_by_replay"]["from_fingerprint"]
    m["code_fingerprint"] = "000000000000"                                      # not what the code was before
    (lm_run.path / "manifest.json").write_text(json.dumps(m))
    assert "was not fresh" in purity.restamp(lm_run, _replay(True))


def test_parts_are_judged_one_by_one(lm_run, monkeypatch):
    """A change that moves one part's numbers (another part's new model) re-stamps the runs of the parts whose replays
    stayed bit-identical and sends the moved part's runs to be recomputed."""
    monkeypatch.setattr(results.Run, "stale", property(lambda self: True))
    moved = {**_replay(False), "differences": ["hierarchy/curves.parquet"], "experiments": ["compose-rhm", "lm"]}
    line = purity.restamp(lm_run, {**moved, "differing_experiments": ["lm"]})
    assert line.startswith("recompute  lm/") and "its part's replay differs" in line
    line = purity.restamp(lm_run, {**moved, "differing_experiments": ["compose-rhm"]})
    assert line.startswith("restamped") and "other parts differ: compose-rhm" in line


def test_the_command_refuses_bad_arguments_in_one_line(capsys):
    assert purity.main(["lm"]) == 2 and capsys.readouterr().err.startswith("usage:")
    assert purity.main(["--before", "HEAD", "--bogus", "lm"]) == 2
    assert purity.main(["--before", "HEAD", "nochapter"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: no chapter 'nochapter' (have scaling, probes, toy, tracing, interventions, lm, compose)")


def test_a_units_run_is_compared_with_the_run_it_merges_into():
    """A unit's tables are rows of its merged run's, so the replay that compares the merged run's tables vouches for
    its units: every protocol of chapters 3 and 7 maps its units experiment to its merged one."""
    from depthlib import units
    found = units.merged_by_units()
    assert found["toy-certified-units"] == "toy-certified" and found["toy-converged-units"] == "toy-converged"
    assert found["compose-toy-certified-units"] == "compose-toy-certified"


def test_a_module_the_change_deleted_is_read_at_the_commit_before(tmp_path, monkeypatch):
    """A committed run may record a module the change deletes (a retired part's, e.g. chapter 7's old looped toy
    module): whether the run was fresh before the change is decided from that module's source at the earlier commit,
    found where a module of its name lives (``a/b.py``), not from the checkout, which no longer has it."""
    import ast
    import hashlib
    import subprocess

    from depthlib import fingerprints

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    source = '"""A retired part."""\n\ndef f():\n    return 1\n'
    (tmp_path / "retired_pkg").mkdir()
    (tmp_path / "retired_pkg" / "gone.py").write_text(source)
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "a part")
    before = git("rev-parse", "HEAD")
    git("rm", "-q", "retired_pkg/gone.py")
    git("commit", "-q", "-m", "the part retired")
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    expected = hashlib.sha256(ast.dump(fingerprints._strip_docstrings(ast.parse(source))).encode()).hexdigest()
    assert fingerprints.code_at(before, "retired_pkg.gone") == expected
    assert fingerprints.code_at("HEAD", "retired_pkg.gone") is None          # gone after the change: not fresh there

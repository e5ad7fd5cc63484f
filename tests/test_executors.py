"""Executors (issue 14): serial, joblib (2 local workers) and submitit (local subprocess jobs and in-process debug)
run the same units for real; a toy sweep run as one shard per ρ merges into exactly the serial sweep's tables."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from depthlib import cli, executors, results
from depthlib.errors import InputError
from depthlib.toy import chapter, shards, sweep

TABLES = ("curves", "alpha", "alpha_steps", "signatures", "lag_cos", "teachers")


def _config():
    return chapter.profile_config("smoke", rhos=[0.0, 1.0], temperatures=[1.0], depths=[2, 4], steps=20)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


@pytest.fixture()
def serial_tables(cache):
    """The tables of the sweep trained in one engine, in this process (then removed from the cache), on one torch
    thread like the shards (float64 reductions such as the lag cosines differ in the last bits across thread counts)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = chapter.train(_config(), progress=False)
    finally:
        torch.set_num_threads(before)
    tables = {name: run.table(name) for name in TABLES}
    import shutil
    shutil.rmtree(run.path)
    return tables


@pytest.mark.parametrize("kind,cluster", [("serial", "auto"), ("joblib", "auto"), ("submitit", "local"),
                                          ("submitit", "debug")])
def test_sharded_sweep_equals_serial_bit_for_bit(serial_tables, cache, kind, cluster):
    ex = executors.ExecutorConfig(kind, jobs=2, threads=1, cluster=cluster)
    merged = shards.run_sharded(_config(), ex)
    assert merged.manifest["executor"] == kind and len(merged.manifest["shards"]) == 2
    assert not merged.stale and merged.path == sweep.open_sweep_run(_config()).path
    for name in TABLES:
        pd.testing.assert_frame_equal(merged.table(name), serial_tables[name], check_exact=True, obj=name)


def test_rerun_skips_finished_shards(cache):
    cfg = _config()
    first = shards.run_sharded(cfg, executors.ExecutorConfig("joblib", jobs=2, threads=1))
    shard_paths = [cache / "results" / s for s in first.manifest["shards"]]
    created = [json.loads((p / "manifest.json").read_text())["created"] for p in shard_paths]
    import shutil
    shutil.rmtree(first.path)                          # the merged run is gone; its shards are cached
    again = shards.run_sharded(cfg, executors.ExecutorConfig("serial", threads=1))
    assert [json.loads((p / "manifest.json").read_text())["created"] for p in shard_paths] == created
    pd.testing.assert_frame_equal(again.table("curves"), first.table("curves"), check_exact=True)


@pytest.mark.parametrize("kind,cluster", [("serial", "auto"), ("joblib", "auto"), ("submitit", "local")])
def test_a_failed_unit_is_reported_with_its_log_and_the_others_kept(cache, kind, cluster):
    good = _config().to_dict()
    bad = {**good, "cells": [[2.0, 1.0]]}                         # ρ = 2: an InputError inside the unit
    units = [executors.Unit("good", "depthlib.toy.shards:train_shard", {"config": good}),
             executors.Unit("bad", "depthlib.toy.shards:train_shard", {"config": bad})]
    out = executors.run_units(units, executors.ExecutorConfig(kind, jobs=2, threads=1, cluster=cluster))
    assert out[0].ok and results.Run("toy-shards", {}, Path(out[0].run)).complete
    assert not out[1].ok and "rho must be in [0, 1]" in (out[1].error or "") + open(out[1].log).read()
    line = executors.failures(out)
    assert line.startswith("bad failed") and out[1].log in line


def test_bad_executor_settings_are_one_line_errors(cache, capsys):
    with pytest.raises(InputError, match="unknown executor"):
        executors.ExecutorConfig("mpi").validate()
    with pytest.raises(InputError, match="--jobs must be >= 1"):
        executors.ExecutorConfig("joblib", jobs=0).validate()
    assert cli.main(["toy", "--executor", "joblib", "--jobs", "0"]) == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err


def test_cli_runs_shards_and_the_calibration_pair_on_workers(cache, capsys):
    assert cli.main(["toy", "--rho", "0", "1", "--temperature", "1", "--depths", "2", "4", "--steps", "20",
                     "--executor", "joblib", "--jobs", "2", "--threads", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [a["rho"] for a in out["alpha"]] == [0.0, 1.0]
    assert results.Run("toy", {}, Path(out["run"])).manifest["executor"] == "joblib"
    assert cli.main(["toy", "--calibration", "both", "--executor", "joblib", "--threads", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["runs"]) == {"tied", "independent"} and out["alpha"][0]["teacher"] == "tied"

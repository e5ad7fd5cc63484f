"""Executors: serial, joblib (2 local workers) and submitit (local subprocess jobs and in-process debug)
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
        run = chapter.compute(_config(), progress=False)
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


# ---- probes: document shards merge into one pass ------------------------------------------------------------------
PROBE_TEXTS = [f"Document {i}: " + "the residual stream moves a little at every layer, " * (1 + i % 4) for i in range(9)]


@pytest.fixture()
def probe_setup(cache):
    """A tiny Llama saved as a Hugging Face folder with its tokenizer, and a 9-document text corpus."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(PROBE_TEXTS * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                         max_position_embeddings=64))
    folder = cache / "tiny-llama"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    corpus = cache / "corpus.txt"
    corpus.write_text("\n\n".join(PROBE_TEXTS))
    from depthlib.probes import ProbeConfig
    cfg = ProbeConfig(max_length=24, batch_size=2, lens_tokens_per_doc=3, lens_docs=5, reservoir_size=40,
                      histogram_bins=30)
    return str(folder), str(corpus), cfg


@pytest.mark.parametrize("kind,cluster", [("serial", "auto"), ("joblib", "auto"), ("submitit", "local"),
                                          ("submitit", "debug")])
def test_sharded_probe_equals_one_pass(probe_setup, kind, cluster):
    import numpy as np
    import torch

    from depthlib import probes
    from depthlib.probes import chapter as probe_chapter
    model, corpus, cfg = probe_setup
    before = torch.get_num_threads()
    torch.set_num_threads(1)                                # like the shards: fp32 sums differ across thread counts
    try:
        one = probes.run_probe(model, corpus, 9, cfg, progress=False)
    finally:
        torch.set_num_threads(before)
    tables = {name: one.table(name) for name in probes.TABLES}
    summary = one.manifest["summary"]
    import shutil
    shutil.rmtree(one.path)
    ex = executors.ExecutorConfig(kind, jobs=2, threads=1, cluster=cluster)
    merged = probe_chapter.run_sharded(model, corpus, 9, cfg, ex, n_shards=3)
    assert merged.path == one.path and merged.manifest["executor"] == kind and len(merged.manifest["shards"]) == 3
    assert len(tables["tokens"]) == 40 < summary["n_tokens"]                    # the sample had to choose
    for name in ("histograms", "tokens", "docs"):
        pd.testing.assert_frame_equal(merged.table(name), tables[name], check_exact=True, obj=name)
    pd.testing.assert_frame_equal(merged.table("layers"), tables["layers"], check_exact=False, rtol=1e-12, atol=0)
    ms = merged.manifest["summary"]
    assert ms["n_tokens"] == summary["n_tokens"] and ms["n_docs"] == 9
    np.testing.assert_allclose(ms["theta_by_layer"], summary["theta_by_layer"], rtol=1e-12)


def test_probe_shard_ranges_cover_the_documents_in_whole_batches():
    from depthlib.probes.chapter import shard_ranges
    assert shard_ranges(9, 3, 2) == [(0, 4), (4, 6), (6, 9)]          # 5 batches: 2, 1, 2
    assert shard_ranges(128, 2, 8) == [(0, 64), (64, 128)]
    assert shard_ranges(3, 8, 1) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(InputError, match="--shards must be >= 1"):
        shard_ranges(9, 0)


def test_cli_probe_and_trace_take_an_executor(probe_setup, capsys):
    model, corpus, _ = probe_setup
    assert cli.main(["probes", "--model", model, "--corpus", corpus, "--docs", "4", "--max-length", "16",
                     "--batch-size", "2", "--executor", "joblib", "--jobs", "2", "--shards", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    manifest = results.Run("probes", {}, Path(out["results"])).manifest
    assert manifest["executor"] == "joblib" and len(manifest["shards"]) == 2 and out["n_docs"] == 4
    for args, message in [(["probes", "--model", model, "--corpus", corpus, "--executor", "joblib", "--shards", "0"],
                           "--shards must be >= 1"),
                          (["probes", "--model", model, "--corpus", corpus, "--executor", "joblib", "--force"],
                           "--force works with --executor serial only"),
                          (["tracing", "--profile", "smoke", "--prompt", "x"], "drop --prompt"),
                          (["tracing", "--prompt", "The Space Needle is in"], "tracing needs --model, --subject"),
                          (["lm", "--executor", "joblib", "--jobs", "0"], "--jobs must be >= 1")]:
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (args, err)

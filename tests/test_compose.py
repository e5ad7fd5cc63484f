"""Chapter 7: the random hierarchy model, training to convergence, diagnostics, the chapter glue (the members
themselves: test_compose_network)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from depthlib.compose import network as M
from depthlib.compose import rhm
from depthlib.compose import train as T
from depthlib.errors import InputError

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # small ops: one thread is fastest


GRAMMARS = [rhm.RHMConfig(8, 2, 2, 3), rhm.RHMConfig(4, 3, 2, 2, seed=5), rhm.RHMConfig(5, 2, 3, 2, seed=1)]


# ---- the grammar ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", GRAMMARS, ids=str)
def test_rules_are_unambiguous(cfg):
    """Every right-hand side of a level is produced by exactly one (symbol, rule): v·m distinct s-tuples."""
    g = rhm.make_grammar(cfg)
    for k in range(cfg.L):
        tuples = g.rules[k].reshape(cfg.v * cfg.m, cfg.s)
        assert len({tuple(t) for t in tuples}) == cfg.v * cfg.m
        assert (g.parent[k] >= 0).sum() == cfg.v * cfg.m
        weights = cfg.v ** np.arange(cfg.s - 1, -1, -1)
        codes = (tuples * weights).sum(1)
        assert (g.parent[k][codes] == np.repeat(np.arange(cfg.v), cfg.m)).all()


@pytest.mark.parametrize("cfg", GRAMMARS, ids=str)
def test_every_sequence_parses_back_to_its_root_and_tree(cfg):
    g = rhm.make_grammar(cfg)
    leaves, levels, choices = rhm.sample(g, np.arange(3000), stream=3, with_tree=True)
    assert leaves.shape == (3000, cfg.length) and leaves.min() >= 0 and leaves.max() < cfg.v
    parsed, picked = rhm.parse(g, leaves)
    for a, b in zip(parsed, levels):
        assert np.array_equal(a, b)
    for a, b in zip(picked, choices):
        assert np.array_equal(a, b)


def test_a_sequence_the_grammar_cannot_derive_fails_to_parse():
    cfg = rhm.RHMConfig(8, 2, 2, 3)
    g = rhm.make_grammar(cfg)
    unused = np.flatnonzero(g.parent[cfg.L - 1] < 0)[0]          # a pair no level-(L−1) symbol produces
    x = rhm.sample(g, np.arange(1))
    x[0, :2] = [unused // cfg.v, unused % cfg.v]
    levels, _ = rhm.parse(g, x)
    assert levels[0][0, 0] == -1


@pytest.mark.parametrize("cfg", GRAMMARS[:2], ids=str)
def test_roots_and_synonyms_are_uniform(cfg):
    """Chi-square tests (α = 1e-3) that roots are uniform over v and every symbol's m rules are chosen uniformly, at
    every level; and the test can fail: a skewed choice of rules is rejected."""
    g = rhm.make_grammar(cfg)
    _, levels, choices = rhm.sample(g, np.arange(20_000), stream=4, with_tree=True)
    assert stats.chisquare(np.bincount(levels[0][:, 0], minlength=cfg.v)).pvalue > 1e-3
    for k in range(cfg.L):
        sym, ch = levels[k].ravel(), choices[k].ravel()
        counts = np.zeros((cfg.v, cfg.m))
        np.add.at(counts, (sym, ch), 1)
        p = stats.chi2.sf((((counts - counts.sum(1, keepdims=True) / cfg.m) ** 2)
                           / (counts.sum(1, keepdims=True) / cfg.m)).sum(), cfg.v * (cfg.m - 1))
        assert p > 1e-3, (k, counts)
    skewed = np.where(ch % cfg.m == 0, 0, ch) if cfg.m > 1 else ch
    sym = levels[cfg.L - 1].ravel()
    counts = np.zeros((cfg.v, cfg.m))
    np.add.at(counts, (sym, np.where(np.arange(len(skewed)) % 5 == 0, 0, skewed)), 1)
    expected = counts.sum(1, keepdims=True) / cfg.m
    assert stats.chi2.sf(((counts - expected) ** 2 / expected).sum(), cfg.v * (cfg.m - 1)) < 1e-3


def test_samples_depend_on_their_index_not_on_the_batch():
    g = rhm.make_grammar(rhm.RHMConfig(8, 2, 2, 3))
    whole = rhm.sample(g, np.arange(100))
    parts = np.concatenate([rhm.sample(g, np.arange(60, 100)), rhm.sample(g, np.arange(0, 60))])
    assert np.array_equal(whole, np.concatenate([parts[40:], parts[:40]]))
    assert not np.array_equal(rhm.sample(g, np.arange(100), stream=1), whole)


def test_bayes_loss_matches_counting():
    """The inside algorithm's −log P(x_t | x_<t) equals the empirical conditional frequencies of many samples."""
    g = rhm.make_grammar(rhm.RHMConfig(4, 2, 2, 2, seed=3))
    big = rhm.sample(g, np.arange(200_000), stream=5)
    x = rhm.sample(g, np.arange(20), stream=6)
    exact = rhm.bayes_nll(g, x)
    codes = big @ (4 ** np.arange(3, -1, -1))
    for i, row in enumerate(x):
        for t in range(4):
            match_prefix = np.ones(len(big), bool) if t == 0 else (big[:, :t] == row[:t]).all(1)
            p = (match_prefix & (big[:, t] == row[t])).sum() / match_prefix.sum()
            assert abs(-np.log(p) - exact[i, t]) < 0.05, (i, t)
    assert codes.size and np.all(exact >= -1e-12)


def test_bayes_loss_of_a_whole_sequence_is_its_log_probability():
    """Σ_t −log P(x_t | x_<t) = −log P(x): root 1/v, one rule 1/m at each of the (s^L − 1)/(s − 1) nodes."""
    cfg = rhm.RHMConfig(8, 2, 2, 3)
    g = rhm.make_grammar(cfg)
    x = rhm.sample(g, np.arange(50))
    nodes = (cfg.s ** cfg.L - 1) // (cfg.s - 1)
    assert np.allclose(rhm.bayes_nll(g, x).sum(1), np.log(cfg.v) + nodes * np.log(cfg.m))


@pytest.mark.parametrize("kw", [dict(v=4, m=5, s=2, L=2), dict(v=1), dict(s=1), dict(L=0)])
def test_bad_grammar_is_refused(kw):
    with pytest.raises(InputError):
        rhm.RHMConfig(**kw).validate()


# ---- the looped models ------------------------------------------------------------------------------------
# ---- training -------------------------------------------------------------------------------------------
def test_schedule_matches_the_converged_protocol():
    from depthlib.toy import converged
    assert (T.CONVERGED_BELOW, T.LAST_FRACTION) == (converged.CONVERGED_BELOW, converged.LAST_FRACTION)
    cfg = T.GrammarTrainConfig(steps=100, evals=20, lr=1.0)
    rates = [cfg.rate(s) for s in range(100)]
    assert rates[0] == 0.5 and rates[10] == 1.0 and rates[49] == 1.0
    assert all(r == pytest.approx(0.1) for r in rates[80:])
    assert 80 in cfg.eval_steps()


def test_a_tiny_member_converges_near_the_bayes_loss():
    """Converged-training check on a tiny instance: a 2-block model on a 4-leaf grammar meets the 1 % rule and ends
    within 0.05 nats of the exact Bayes loss."""
    g = rhm.make_grammar(rhm.RHMConfig(4, 2, 2, 2, seed=1))
    m = M.build_model(M.GrammarModelConfig(d_model=16, n_heads=2), "untied", 2, 4, 4, seed=0)
    rec = T.train(m, g, T.GrammarTrainConfig(steps=600, batch_size=64, lr=1e-2, n_held_out=512), seed=0)
    assert rec["converged"], rec["rel_improvement"]
    assert 0 <= rec["curve"]["excess"].iloc[-1] < 0.05
    assert rec["curve"]["excess"].iloc[0] > 0.3


def test_training_stops_at_an_evaluation_and_replays_exactly():
    g = rhm.make_grammar(rhm.RHMConfig(4, 2, 2, 2, seed=1))
    cfg = T.GrammarTrainConfig(steps=40, batch_size=8, evals=20, n_held_out=16)
    runs = []
    for _ in range(2):
        m = M.build_model(M.GrammarModelConfig(d_model=8, n_heads=2), "looped", 3, 4, 4, seed=0)
        runs.append(T.train(m, g, cfg, seed=1, stop_at=4)["curve"])
    assert list(runs[0]["step"]) == [0, 2, 4]
    assert runs[0].equals(runs[1])


# ---- diagnostics ----------------------------------------------------------------------------------------
def test_diagnostics_edits_and_signatures():
    from depthlib.compose.diagnostics import diagnose
    g = rhm.make_grammar(rhm.RHMConfig(4, 2, 2, 2, seed=1))
    x, b = T.held_out(g, 32, T.PROBE_STREAM)
    untied = M.build_model(M.GrammarModelConfig(d_model=16, n_heads=2), "untied", 6, 4, 4, seed=0)
    d = diagnose(untied, x, float(b.mean()), n_permutations=3)
    edits = d["edits"]
    assert set(edits["edit"]) == {"delete", "swap", "permute"}
    assert (edits["edit"] == "delete").sum() == 6 and (edits["edit"] == "swap").sum() == 5
    assert (edits["edit"] == "permute").sum() == 3
    lags = d["lags"]
    assert list(lags["k"]) == [1, 2, 3, 4, 5]
    assert d["summary"]["cluster_evenly"] >= 0 and np.isfinite(d["summary"]["theta_middle_mean"])
    tied = M.build_model(M.GrammarModelConfig(d_model=16, n_heads=2), "tied", 6, 4, 4, seed=0)
    t = diagnose(tied, x, float(b.mean()))
    assert set(t["edits"]["edit"]) == {"delete"}                       # a swap of one block is the same model
    assert np.allclose(t["edits"]["delta"], t["edits"]["delta"].iloc[0])


# ---- the chapter ----------------------------------------------------------------------------------------
def test_profiles_validate_and_round_trip():
    from depthlib.compose import chapter
    from depthlib.compose.experiment import ComposeConfig
    for name, p in chapter.PROFILES.items():
        cfg = p.run.validate()
        assert cfg.profile == name
        assert ComposeConfig.from_dict(cfg.to_dict()) == cfg
    cpu = chapter.PROFILES["cpu"].run
    assert min(cpu.depths) < cpu.grammar.L < max(cpu.depths) and len(cpu.seeds) >= 3


def test_smoke_run_end_to_end_and_replay(cache):
    from depthlib.compose import analysis, chapter
    run = chapter.runs("smoke")["rhm"]
    assert run.complete and not run.stale
    members = run.table("members")
    cfg = chapter.PROFILES["smoke"].run
    assert len(members) == len(cfg.units())
    again = chapter.runs("smoke")["rhm"]
    assert again.path == run.path
    rep = chapter.replay(run)
    assert np.allclose(rep["committed"], rep["replayed"], rtol=1e-6)
    s = chapter.summary(run)
    assert s["profile"] == "smoke" and set(s["losses"]) == set(cfg.families)
    assert len(analysis.loss_table(run)) == len(members)
    diag = analysis.diagnostic_table(run)
    assert {"delete_vs_ensemble", "cluster_evenly", "long_lag_cos"} <= set(diag.columns)
    alphas = analysis.alpha_table(run)
    assert set(alphas["law"]) == {"excess", "free floor"}
    assert not alphas["defined"].any()              # one replicate, at most four depths: no interval, no free floor


def test_fits_need_parameters_plus_two_points_and_recover_an_exponent():
    import pandas as pd

    from depthlib.compose import analysis
    depths = np.array([1, 2, 3, 4, 6, 8])
    rows = [{"family": "untied", "seed": s, "depth": d, "bayes": 0.5, "excess": 0.2 * d ** -1.5 * (1 + 0.01 * s),
             "val_loss": 0.5 + 0.2 * d ** -1.5 * (1 + 0.01 * s)} for s in range(3) for d in depths]
    rows += [{"family": "looped", "seed": s, "depth": d, "bayes": 0.5, "excess": 0.1 / d, "val_loss": 0.5 + 0.1 / d}
             for s in range(3) for d in (3, 4, 6)]
    fits = analysis.fit_laws(pd.DataFrame(rows))
    ex = fits[(fits.family == "untied") & (fits.law == "excess")]
    assert np.allclose(ex["alpha"], 1.5) and ex["defined"].all()
    ff = fits[(fits.family == "untied") & (fits.law == "free floor")]
    assert np.allclose(ff["alpha"], 1.5, atol=1e-3) and np.allclose(ff["L_inf"], 0.5, atol=1e-4)
    assert not fits[fits.family == "looped"]["defined"].any()         # three depths: fewer than parameters + 2
    m, lo, hi, n = analysis.mean_interval([1.0, 2.0, 3.0])
    assert (m, n) == (2.0, 3) and lo < 1.0 and hi > 3.0


@pytest.mark.parametrize("args, message", [(["--families", "recurrent"], "--families"),
                                           (["--depths", "2,x"], "--depths"), (["--depths", "0"], "depth"),
                                           (["--families", "looped", "--depths", "1,2"], "looped"),
                                           (["--part", "toy_certified", "--depths", "2,4"], "at least 3 distinct depths"),
                                           (["--part", "text_certified", "--seeds", "5"], "--seeds")])
def test_cli_bad_input_is_one_line_exit_2(capsys, args, message):
    from depthlib.cli import main
    assert main(["compose", "--profile", "smoke", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthlib compose: error:") and message in err[0], err


def test_cli_part_with_families_and_depths_prints_its_summary(capsys, cache):
    """``depthlib compose --part rhm --families ... --depths ...`` trains a custom run (here: two tiny members) and
    prints that part's summary, an exponent it cannot fit given as null with the reason."""
    import json

    from depthlib.cli import main
    assert main(["compose", "--part", "rhm", "--profile", "smoke", "--families", "untied", "--depths", "1,2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == "custom" and out["meaningful"] is False
    assert set(out["losses"]) == {"untied"} and set(out["losses"]["untied"]) == {"1", "2"}
    assert out["alpha"]["untied (excess)"]["value"] is None
    assert out["alpha"]["untied (excess)"]["reason"] == "2 depths (the excess law needs 4)"


def test_compute_takes_an_executor_as_chapters_3_and_6_do():
    """compute(cfg, device, *, force, progress, executor): members train one per core by default, one at a time with
    a serial executor, the joblib executor's workers at a time; another executor is one line, before anything trains."""
    from depthlib.compose import chapter
    from depthlib.executors import ExecutorConfig
    assert chapter._jobs(None) is None and chapter._jobs(ExecutorConfig("serial")) == 1
    assert chapter._jobs(ExecutorConfig("joblib", jobs=3)) == 3
    with pytest.raises(InputError, match="serial or joblib, not submitit"):
        chapter.compute(chapter.PROFILES["smoke"].hierarchy, executor=ExecutorConfig("submitit"))
    with pytest.raises(InputError, match="serial or joblib, not submitit"):
        chapter.runs("smoke", executor=ExecutorConfig("submitit"))

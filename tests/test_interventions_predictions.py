"""Chapter 5's predictions on synthetic middles where the answer is known: an ensemble of independent small updates
around a shared drift, and the Euler discretisation of a smooth non-autonomous flow; the plateau rule; the interval
code and the calibration rule."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from depthlib.errors import InputError
from depthlib.interventions import analysis
from depthlib.interventions import predictions as pr
from depthlib.interventions.evaluate import score_plans
from depthlib.interventions.suite import SuiteConfig, build_plans
from depthlib.measures import update_signature

L, D, DOCS, PER_DOC = 24, 32, 32, 16
SUITE = SuiteConfig(ks=(2, 4, 8), draws=10, each_block=False, plateau_k=0, norm_matched=0, permutations=0,
                    reverse=False, group_sizes=(2, 4), group_positions=3)


class Synthetic:
    """A residual middle ``h ← h + f_i(h)`` scored by the squared error of its output to ``target`` (per "document")."""

    def __init__(self, update, h0: torch.Tensor, target: torch.Tensor):
        self.update, self.target = update, target
        self.states = [h0]
        for i in range(L):
            self.states.append(self.block(i, self.states[-1]))

    def block(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return h + self.update(i, h)

    def score(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        err = ((h - self.target) ** 2).sum(-1).view(DOCS, PER_DOC).sum(1)
        zero = torch.zeros(DOCS)
        return {"loss": err.float(), "kl": zero, "agree": zero, "n": torch.full((DOCS,), PER_DOC)}


def _inputs(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((DOCS * PER_DOC, D), generator=g, dtype=torch.float64)


def ensemble(seed: int = 0, drift: float = 1.0, sigma: float = 0.6) -> Synthetic:
    """f_i(h) = (μ + W_i h)/L: a shared drift μ and independent zero-mean errors W_i h (W_i Gaussian, scale σ/√D);
    the target is h_0 + μ, so the unedited excess loss is Σ_i W_i h/L ~ σ²‖h‖²/L (the 1/ℓ law)."""
    g = torch.Generator().manual_seed(seed + 1)
    mu = torch.randn(D, generator=g, dtype=torch.float64)
    mu = drift * mu / mu.norm() * math.sqrt(D)
    W = torch.randn((L, D, D), generator=g, dtype=torch.float64) * sigma / math.sqrt(D)
    h0 = _inputs(seed)
    return Synthetic(lambda i, h: (mu + h @ W[i].T) / L, h0, h0 + mu)


def flow(seed: int = 0, rate: float = 3.0, turn: float = math.pi) -> Synthetic:
    """f_i(h) = J(t_i) h / L, J(t) = rate (cos(turn·t) J₁ + sin(turn·t) J₂) with J₁, J₂ non-commuting rotation generators: the
    Euler steps of a smooth non-autonomous flow; the target is the exact flow (Euler with 64× finer steps)."""
    g = torch.Generator().manual_seed(seed + 2)
    A, B = (torch.randn((D, D), generator=g, dtype=torch.float64) for _ in range(2))
    J1, J2 = (M - M.T for M in (A, B))
    J1, J2 = J1 / torch.linalg.matrix_norm(J1, 2), J2 / torch.linalg.matrix_norm(J2, 2)

    def J(t: float) -> torch.Tensor:
        return rate * (math.cos(turn * t) * J1 + math.sin(turn * t) * J2)
    h0 = _inputs(seed)
    fine, h = 64 * L, h0.clone()
    for j in range(fine):
        h = h + h @ J((j + 0.5) / fine).T / fine
    return Synthetic(lambda i, h: h @ J((i + 0.5) / L).T / L, h0, h)


def statistics(model: Synthetic) -> tuple[dict, pd.DataFrame]:
    plans, meta = build_plans(L, SUITE)
    scores, _ = score_plans(plans, [(list(range(DOCS)), lambda: model)], progress=False)
    stats = analysis.model_statistics(meta.assign(model="m"), scores, n_boot=200)
    sig = update_signature([s.view(DOCS, PER_DOC, D) for s in model.states])
    stats.update(analysis.model_statistics(meta, scores, sig, n_boot=200))
    return stats, analysis.plan_effects(meta.assign(model="m"), scores.assign(model="m"))


@pytest.fixture(scope="module")
def ens():
    return statistics(ensemble())


@pytest.fixture(scope="module")
def flo():
    return statistics(flow())


def value(stats, *key):
    return pr.interval(stats[key])


def test_rescaled_deletion_follows_the_ensembles_one_over_l_law(ens):
    for k in (4, 8):
        v, lo, hi = value(ens[0], "alpha_del", "middle", k)
        assert 0.6 < lo and hi < 1.4, f"k={k}: α̂ = {v:.3f} [{lo:.3f}, {hi:.3f}], the ensemble predicts 1"


def test_rescaled_deletion_of_a_flow_costs_more_than_the_ensemble_law(flo):
    v, lo, hi = value(flo[0], "alpha_del", "middle", 8)
    assert lo > pr.ALPHA_ENSEMBLE + 0.5, f"a flow's α̂ = {v:.3f} [{lo:.3f}, {hi:.3f}]: Euler alone predicts 2"


def test_reordering_costs_the_ensemble_almost_nothing_but_the_flow_a_lot(ens, flo):
    e, f = value(ens[0], "order_ratio", "middle", 0), value(flo[0], "order_ratio", "middle", 0)
    assert e[2] < 0.1, f"ensemble: reordering / deleting the moved blocks = {e}"
    assert f[1] > 10 * e[2], f"flow {f} vs ensemble {e}: a flow's order matters"
    cal = pr.calibrate(e, f, log=True)
    assert cal["separates"] and cal["ensemble_below"] and e[0] < cal["threshold"] < f[0]


def test_a_flows_reordering_cost_grows_with_the_displacement(flo):
    pairs = analysis.order_pairs(flo[1])
    pairs = pairs[pairs["k"] == 2]                      # swaps of two blocks at distances 1 … 21
    near, far = pairs[pairs["distance"] <= pairs["distance"].median()], pairs[pairs["distance"] > pairs["distance"].median()]
    assert far["ratio"].mean() > 2 * near["ratio"].mean()


def test_summing_a_parallel_group_is_nearly_free_for_an_ensemble(ens, flo):
    for g in (2, 4):
        e = value(ens[0], "parallel_ratio", "middle", g)
        assert e[2] < 0.1, f"g={g}: summed / averaged = {e}"
    assert value(flo[0], "parallel_ratio", "middle", 4)[0] > value(ens[0], "parallel_ratio", "middle", 4)[0]


def test_the_long_lag_signature_and_chapter_3s_rule(ens, flo):
    """An ensemble without a dominant drift passes chapter 3's rule; with a drift as large as the stream (the fixture's)
    the long-lag cosine shows it. A smooth flow fails on θ; its long-lag cosine is high only while it turns little
    over ℓ/4 blocks (the fixture's field turns by π over the middle, and its distant updates decorrelate)."""
    quiet = ensemble(drift=0.1)
    sig = update_signature([s.view(DOCS, PER_DOC, D) for s in quiet.states])
    (te, _), (le, _) = ((pr.interval(v)[0], None) for v in pr.bootstrap_docs(sig, ("theta_sum", "lag_sum"),
                                                                               ("theta_n", "lag_n"), 50))
    assert pr.ensemble_by_rule(te, le) and abs(le) < 0.05, (te, le)
    assert value(ens[0], "long_lag", "", 0)[1] > pr.LONG_LAG_MAX            # the shared drift
    tf = value(flo[0], "theta_update", "", 0)[0]
    assert not pr.ensemble_by_rule(tf, 0.0) and tf < 0.5, tf
    slow = flow(rate=0.5, turn=0.3)
    sig = update_signature([s.view(DOCS, PER_DOC, D) for s in slow.states])
    lf = float(sig["lag_sum"].sum() / sig["lag_n"].sum())
    assert lf > 0.5, lf


# ---- closed forms ----------------------------------------------------------------------------------------
def test_deletion_alpha_inverts_the_rescaled_law():
    k = np.array([1, 2, 5, 10])
    for alpha in (0.5, 1.0, 2.0, 3.0):
        np.testing.assert_allclose(pr.deletion_alpha(pr.rescaled_deletion(k, 22, alpha), 1.0, k, 22), alpha)
    assert np.isnan(pr.deletion_alpha(-2.0, 1.0, 2, 22)) and np.isnan(pr.deletion_alpha(0.1, 1.0, 22, 22))


def test_mean_displacement():
    assert pr.mean_displacement([3, 4, 5]) == 0.0
    assert pr.mean_displacement([5, 3]) == 2.0
    assert pr.mean_displacement([7, 2, 4]) == pytest.approx((5 + 2 + 3) / 3)   # slots 2, 4, 7


# ---- the plateau rule -------------------------------------------------------------------------------------
def test_plateau_is_the_longest_run_near_the_median():
    angles = [2.0, 0.9, 0.1, 0.3, 0.31, 0.29, 0.3, 0.32, 0.8, 0.3, 0.3, 1.5]
    assert pr.plateau(angles, 12) == [3, 4, 5, 6, 7]
    assert pr.plateau(angles, 12, min_blocks=6) == []
    assert pr.plateau([1.0] * 8, 8) == list(range(1, 7))                       # ends excluded
    assert pr.plateau([0.3, 0.3, 0.3, 0.3, 9.0, 0.3, 0.3, 0.3, 0.3], 9, min_blocks=3) == [1, 2, 3]   # tie: earliest
    with pytest.raises(InputError, match="one step angle per block"):
        pr.plateau([1.0, 2.0], 5)
    with pytest.raises(InputError, match="tol"):
        pr.plateau([1.0] * 5, 5, tol=1.0)


def test_third_of_the_middle():
    assert [pr.third([b], 20) for b in (1, 6, 7, 12, 13, 18)] == ["first", "first", "middle", "middle", "last", "last"]


# ---- intervals and the calibration rule ------------------------------------------------------------------------
def test_bootstrap_interval_covers_the_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = 0
    for rep in range(200):
        x = rng.normal(1.0, 1.0, size=40)
        W = pr.bootstrap_weights(40, 400, seed=rep)
        _, lo, hi = pr.interval(W @ x / W.sum(1))
        hits += lo <= 1.0 <= hi
    assert 0.88 <= hits / 200 <= 0.99


def test_bootstrap_plans_pairs_the_resamples():
    rows = [dict(plan=p, doc_index=d, n=10, loss=float(10 * (1 + d % 3) * (2 if p == "b" else 1)), kl=0.0, agree=0.0)
            for p in ("a", "b") for d in range(8)]
    B = pr.bootstrap_plans(pd.DataFrame(rows), "a", n_boot=100)
    ratio = B.matrix[B.plans.index("b")] / B.base                             # b = 2a on every document
    np.testing.assert_allclose(ratio, 2.0)
    v, lo, hi = pr.interval(B.base)
    assert lo < v < hi
    with pytest.raises(InputError, match="finite score"):
        pr.bootstrap_plans(pd.DataFrame(rows[:-1]), "a")
    with pytest.raises(InputError, match="at least 2 documents"):
        pr.bootstrap_weights(1, 10)


def test_interval_needs_enough_finite_replicates():
    assert np.isnan(pr.interval(np.r_[1.0, np.full(50, np.nan)])[1])


def test_calibration_rule():
    cal = pr.calibrate((0.02, 0.01, 0.03), (2.0, 1.0, 3.0), log=True)
    assert cal["separates"] and cal["threshold"] == pytest.approx(0.2) and cal["ensemble_below"]
    assert pr.side((0.05, 0.04, 0.06), cal) == "ensemble"
    assert pr.side((1.5, 0.9, 2.1), cal) == "flow"
    assert pr.side((0.2, 0.1, 0.3), cal) == "undecided"
    over = pr.calibrate((0.5, 0.1, 1.1), (1.0, 0.9, 1.2))
    assert not over["separates"] and pr.side((0.1, 0.0, 0.2), over) == "not applied"
    assert pr.calibrate((1.6, 1.5, 1.7), (0.3, 0.2, 0.4))["ensemble_below"] is False


# ---- the prediction table: controls pooled over replicates, LMs read against them -------------------------------
def _stats(value: float, spread: float, seed: int, k: int = 4) -> dict:
    rng = np.random.default_rng(seed)
    col = np.r_[value, value + spread * rng.standard_normal(300)]
    return {("parallel_ratio", "middle", k): col, ("theta_update", "", 0): col + 1.0}


def test_prediction_table_reads_an_lm_only_where_the_controls_separate():
    per = {**{f"toy independent r{r}": _stats(0.01, 0.001, r) for r in range(3)},
           **{f"toy tied r{r}": _stats(0.2 + 0.3 * r, 0.01, 10 + r) for r in range(3)},
           "lm": _stats(0.02, 0.002, 99)}
    t = analysis.prediction_table(per, ["lm"])
    par = t[t["statistic"] == "parallel_ratio"].set_index("model")
    assert par.loc["toy independent", "held_on_control"] and par.loc["toy independent", "separates_controls"]
    assert par.loc["lm", "reading"] == "ensemble" and par.loc["lm", "k"] == 4
    # the tied replicates spread 0.2 … 0.8: the pooled interval covers the seeds' spread, not only the documents'
    assert par.loc["toy tied", "hi"] - par.loc["toy tied", "lo"] > 0.2
    theta = t[t["statistic"] == "theta_update"].set_index("model")     # 1.01 vs 1.2–1.8: fails on its control
    assert not theta.loc["toy independent", "held_on_control"] and theta.loc["lm", "reading"] == "not applied"
    text = " ".join(analysis.verdict_sentences(t))
    assert "failed on its own control" in text and "lm 0.02" in text


def test_chapter_3s_rule_reads_intervals():
    def sig(theta, lag):
        return {("theta_update", "", 0): np.r_[theta, theta + 0.001 * np.arange(-50, 50)],
                ("long_lag", "", 0): np.r_[lag, lag + 0.0001 * np.arange(-50, 50)]}
    rules = analysis.rule_readings({"a": sig(1.5, 0.02), "b": sig(1.5, 0.3), "c": sig(1.2, 0.05)}).set_index("model")
    assert rules.loc["a", "rule"] == "ensemble" and rules.loc["b", "rule"] == "not an ensemble"
    assert rules.loc["c", "rule"] == "undecided"                  # θ's interval straddles 1.2
    assert "→ ensemble" in analysis.rule_sentence(rules.reset_index())


def test_norm_sentence_reports_the_norm_matched_fraction():
    col = np.r_[0.8, 0.8 + 0.01 * np.sin(np.arange(100))]
    text = analysis.norm_sentence({"lm": {("norm_ratio", "middle", 6): col}})
    assert "lm (k = 6) 0.8 [" in text and analysis.norm_sentence({"lm": {}}) == ""


def test_reader_tables_rename_and_fill_only_the_missing_cells():
    import pandas as pd

    from depthlib.interventions import analysis
    t = pd.DataFrame({"held_on_control": [True, None], "gemma": [0.5, None]}, index=["alpha_del", "order_ratio"])
    shown = analysis.for_reader(t)
    assert list(shown.columns) == ["held on its control", "gemma"]
    assert list(shown.index) == [analysis.READER_NAMES["alpha_del"], analysis.READER_NAMES["order_ratio"]]
    assert shown.iloc[0].tolist() == [True, 0.5] and shown.iloc[1].tolist() == ["—", "—"]

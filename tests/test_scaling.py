"""Numeric truth of the Chinchilla fits (paper §3, spec §3 and §5)."""
import numpy as np
import pytest
from scipy.optimize import least_squares

from depthlib import InputError, scaling


def test_strict_exclusion_rule_drops_42_rows(chinchilla_df):
    dropped = scaling.excluded_mask(chinchilla_df["loss"].to_numpy(), 40)
    assert dropped.sum() == 42          # ties at the 40th-largest loss are dropped too
    assert scaling.select_points(chinchilla_df).n == 203
    assert scaling.excluded_mask(chinchilla_df["loss"].to_numpy(), 0).sum() == 0
    with pytest.raises(InputError, match="exclude must be in"):
        scaling.excluded_mask(chinchilla_df["loss"].to_numpy(), 245)


@pytest.fixture(scope="module")
def paper_fit(chinchilla_df):
    return scaling.fit_decomposed_law(chinchilla_df, preset="paper")


def test_paper_preset_reproduces_published_fit(paper_fit):
    p = paper_fit.params()
    assert p["alpha_m"] == pytest.approx(0.977, abs=0.005)
    assert p["alpha_l"] == pytest.approx(1.201, abs=0.005)
    assert p["alpha_D"] == pytest.approx(0.299, abs=0.005)
    assert p["L0"] == pytest.approx(1.750, abs=0.005)
    assert round(100 * paper_fit.mean_rel_err, 2) == 0.40
    assert paper_fit.points.n == 203
    # Gauss–Newton SEs as printed in the paper (spec §3.7)
    se = paper_fit.summary()["se"]
    assert se["alpha_l"] == pytest.approx(0.2685, abs=0.005)
    assert se["alpha_m"] == pytest.approx(0.0833, abs=0.002)
    assert se["alpha_D"] == pytest.approx(0.0139, abs=0.001)


@pytest.fixture(scope="module")
def converged_fit(chinchilla_df):
    return scaling.fit_decomposed_law(chinchilla_df)


def _scipy_reference(points, theta0, weights=None):
    """One problem at a time, float64 MINPACK LM: the reference for the batched solver."""
    sw = np.ones(points.n) if weights is None else np.sqrt(weights)

    def fun(th):
        return sw * scaling.log_residuals(th[None], points.x, points.loss)[0][0]

    def jac(th):
        return sw[:, None] * scaling.log_residuals(th[None], points.x, points.loss)[1][0]

    return least_squares(fun, theta0, jac=jac, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15).x


def test_converged_preset_is_the_true_minimiser(converged_fit, paper_fit):
    ref = _scipy_reference(converged_fit.points, scaling.PAPER_START)
    np.testing.assert_allclose(converged_fit.theta[3:], ref[3:], atol=1e-5)
    # it beats the paper's early-stopped point on the paper's own objective
    assert converged_fit.risk < paper_fit.risk
    assert converged_fit.risk == pytest.approx(0.0030274, abs=2e-7)
    # every start of the grid reached it (one basin, spec §5.5)
    assert converged_fit.extra["n_starts_at_best"] == converged_fit.extra["n_starts"]
    # the gradient vanishes there
    r, J = scaling.log_residuals(converged_fit.theta[None], converged_fit.points.x, converged_fit.points.loss)
    assert np.abs(J[0].T @ r[0]).max() < 1e-9


def test_batched_solver_equals_one_at_a_time_on_random_weights(converged_fit):
    pts = converged_fit.points
    rng = np.random.default_rng(1)
    weights = rng.integers(0, 3, size=(4, pts.n)).astype(float)
    theta, _, ok = scaling.levenberg_marquardt(np.tile(scaling.PAPER_START, (4, 1)), pts.x, pts.loss, weights)
    assert ok.all()
    for s in range(4):
        ref = _scipy_reference(pts, scaling.PAPER_START, weights[s])
        np.testing.assert_allclose(theta[s, 3:], ref[3:], atol=1e-4)


def test_synthetic_law_is_recovered():
    rng = np.random.default_rng(0)
    n = 300
    x = np.column_stack([np.log(rng.uniform(500, 5000, n)), np.log(100 * rng.uniform(8, 60, n)),
                         np.log(rng.uniform(200, 3e5, n))])
    truth = np.array([np.log(300), np.log(2000), np.log(9), 1.0, 1.1, 0.3, 1.7])
    loss = scaling.predict(truth[None], x)[0][0] * np.exp(rng.normal(0, 1e-4, n))
    theta, _, ok = scaling.levenberg_marquardt(scaling.start_grid(x, loss), x, loss)
    best = theta[np.argmin(scaling.risk(theta, x, loss))]
    np.testing.assert_allclose(best[3:], truth[3:], atol=0.02)


def test_depth_offset_and_huber_and_classic_law(chinchilla_df, converged_fit):
    off = scaling.fit_decomposed_law(chinchilla_df, depth_offset=2)
    assert off.param("alpha_l") < converged_fit.param("alpha_l")   # ℓ−2 lowers α_ℓ (App. B)
    assert off.param("alpha_D") == pytest.approx(converged_fit.param("alpha_D"), abs=0.002)
    hub = scaling.fit_decomposed_law(chinchilla_df, objective="huber")
    assert 0.5 < hub.param("alpha_l") < 2.5 and hub.mean_rel_err < 0.005
    classic = scaling.fit_decomposed_law(chinchilla_df, law="chinchilla")
    assert set(classic.params()) == {"alpha_N", "alpha_D", "L0", "c_N", "c_D"}
    assert 0.2 < classic.param("alpha_N") < 0.6 and classic.mean_rel_err < 0.006
    with pytest.raises(InputError, match="depth_offset must be 0 or 2"):
        scaling.fit_decomposed_law(chinchilla_df, depth_offset=1)
    with pytest.raises(InputError, match="preset must be"):
        scaling.fit_decomposed_law(chinchilla_df, preset="fast")


def test_bootstrap_is_seeded_converged_and_sane(chinchilla_df):
    a = scaling.bootstrap(chinchilla_df, n_resamples=40, seed=3)
    b = scaling.bootstrap(chinchilla_df, n_resamples=40, seed=3)
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    assert a["converged"].all()
    summary = scaling.bootstrap_summary(a)
    assert summary["alpha_D"]["lo"] < 0.299 < summary["alpha_D"]["hi"]
    with pytest.raises(InputError):
        scaling.bootstrap(chinchilla_df, n_resamples=0)


def test_held_out_splits(chinchilla_df):
    h = scaling.held_out(chinchilla_df, n_splits=5, seed=0)
    assert (h["n_train"] == 163).all() and (h["n_test"] == 40).all()
    assert h["test_rel_err"].mean() < 0.006


def test_exclusion_scan_matches_single_fits(chinchilla_df, converged_fit):
    scan = scaling.exclusion_scan(chinchilla_df, excludes=[10, 40], depth_offsets=[0])
    row = scan.set_index("exclude").loc[40]
    assert row["n_points"] == 203
    assert row["alpha_l"] == pytest.approx(converged_fit.param("alpha_l"), abs=1e-4)
    single = scaling.fit_decomposed_law(chinchilla_df, exclude=10)
    assert scan.set_index("exclude").loc[10, "alpha_l"] == pytest.approx(single.param("alpha_l"), abs=1e-4)


def test_width_depth_optimum_gives_one_third_for_unit_exponents(converged_fit):
    import copy
    fit = copy.deepcopy(converged_fit)
    fit.theta[3:5] = 1.0
    opt = scaling.width_depth_optimum(fit)
    assert opt["N_exponent"] == pytest.approx(1 / 3)
    assert opt["m_vs_l_exponent"] == pytest.approx(1.0)

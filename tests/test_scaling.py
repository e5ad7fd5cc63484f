"""Numeric truth of the Chinchilla fits (paper §3, App. B)."""
import dataclasses

import numpy as np
import pytest
from scipy.optimize import least_squares

from depthlib import InputError, results, scaling
from depthlib.scaling import chapter, law


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


def _published_digits_tolerance() -> float:
    """1e-5 where torch runs the kernels of the original loop (x86-64 AVX2, where its published digits are reproduced
    bit for bit); elsewhere the 50k-step trajectory amplifies other roundings to ~1e-4 (spec: chaos, see adam_paper)."""
    import torch
    return 1e-5 if torch.backends.cpu.get_cpu_capability() == "AVX2" else 1e-3


def test_paper_preset_reproduces_published_fit(paper_fit):
    # before (float32 forward for the width and depth terms): α_ℓ 1.201606, c_ℓ 1287.3; published 1.201390, 1284.37
    p, pub, tol = paper_fit.params(), scaling.PUBLISHED, _published_digits_tolerance()
    for key in ("alpha_m", "alpha_l", "alpha_D", "L0"):
        assert p[key] == pytest.approx(pub[key], abs=tol), key
    assert p["c_l"] == pytest.approx(1284.37, rel=100 * tol)
    assert p["c_m"] == pytest.approx(333.38, rel=100 * tol)
    assert p["c_D"] == pytest.approx(8.4867, rel=100 * tol)
    # the original's last logged objective (before its final update, fit-5 notebook: 0.0030680681655081803)
    assert paper_fit.extra["logged_risk"] == pytest.approx(pub["logged_risk"], rel=1e3 * tol)
    assert round(100 * paper_fit.mean_rel_err, 2) == 0.40
    assert paper_fit.points.n == 203
    # Gauss–Newton SEs as printed in the paper (paper App. B)
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


def _original_loop(points, steps):
    """The fit-5 loop as paper App. B describes it: torch autograd and torch.optim.Adam, float64 ln c, float32 exponents
    and L0 (0-d), float64 data. The reference the paper preset must equal bit for bit."""
    import torch
    f = points.frame
    m, ell = torch.tensor(f["d_model"].to_numpy(float)), torch.tensor(f["n_layers"].to_numpy(float)) * 100
    D, loss = torch.tensor(f["num_tokens"].to_numpy(float)) / 1e6, torch.tensor(f["loss"].to_numpy(float))
    coeffs = torch.nn.Parameter(torch.tensor([np.log(200), np.log(200), np.log(10)]))
    exponents = torch.nn.Parameter(torch.tensor([1.0, 1.0, 0.33]))
    E = torch.nn.Parameter(torch.tensor(1.69))
    opt = torch.optim.Adam([{"params": coeffs, "lr": 5e-3}, {"params": exponents, "lr": 5e-4}, {"params": E, "lr": 5e-3}])
    for _ in range(steps):
        opt.zero_grad()
        lc_m, lc_l, lc_D = coeffs
        a_m, a_l, a_D = exponents
        pred = (lc_D - a_D * D.log()).exp() + (lc_m - a_m * m.log()).exp() + (lc_l - a_l * ell.log()).exp() + E
        risk = (loss.log() - pred.log()).pow(2).mean() * 100
        risk.backward()
        opt.step()
    return np.concatenate([coeffs.detach().numpy(), exponents.detach().double().numpy(), [E.item()]])


def test_paper_preset_is_the_original_loop_bit_for_bit(chinchilla_df):
    """Same arithmetic as the original: float32 parameters and Adam state, float64 forward and loss."""
    points = scaling.select_points(chinchilla_df)
    steps = 3_000
    ours, risks = scaling.adam_paper(points, steps=steps, return_risks=True)
    np.testing.assert_array_equal(ours[0], _original_loop(points, steps))
    assert risks.shape == (steps, 1)


def test_objective_at_the_published_end_point(chinchilla_df, converged_fit, paper_fit):
    """R at the published end point is 0.0030578 (was reported as 0.0030333, the old preset's end point): the
    converged fit is 1.0% below it (was: 0.20%)."""
    pts = converged_fit.points
    r_pub = float(scaling.risk(law.published_theta(), pts.x, pts.loss)[0])
    assert r_pub == pytest.approx(0.0030578, abs=5e-8)
    assert paper_fit.risk == pytest.approx(r_pub, rel=1e3 * _published_digits_tolerance())
    assert (r_pub - converged_fit.risk) / r_pub == pytest.approx(0.0100, abs=0.0005)
    table = scaling.fits_table({"converged": converged_fit})
    assert table.loc["published (R at its printed end point)", "objective R ×10³"] == pytest.approx(3.0578, abs=1e-4)
    # the end point sits on one of Adam's spikes: the objective was ~0.2% above the minimum shortly before
    history = paper_fit.extra["risk_history"]
    assert history[-20] < r_pub
    assert (np.median(history[-2000:]) - converged_fit.risk) / converged_fit.risk == pytest.approx(0.002, abs=0.001)


def test_converged_preset_is_the_true_minimiser(converged_fit, paper_fit):
    ref = _scipy_reference(converged_fit.points, scaling.PAPER_START)
    # two solvers' minimisers agree only to their stopping rules: LM's leaves α_ℓ within 4e-6 (parameter_tolerance)
    np.testing.assert_allclose(converged_fit.theta[3:], ref[3:], atol=1e-5)
    # it beats the paper's early-stopped point on the paper's own objective
    assert converged_fit.risk < paper_fit.risk
    assert converged_fit.risk == pytest.approx(0.0030274, abs=2e-7)
    # every start of the grid reached it (one basin, the reproduction of chapter 1)
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
        np.testing.assert_allclose(theta[s, 3:], ref[3:], atol=1e-4)   # two solvers' stopping rules


def test_parameter_tolerance_is_what_the_stopping_rule_leaves(converged_fit):
    """Minimisers of one problem from different starts agree within parameter_tolerance, and the tolerance is the
    largest move of one parameter that raises the cost by rel_cost · C (the quadratic model's δ* = c H⁻¹ e_i)."""
    pts = converged_fit.points
    starts = np.vstack([scaling.PAPER_START, scaling.start_grid(pts.x, pts.loss)[[0, 13, 26]]])
    theta, cost, ok = scaling.levenberg_marquardt(starts, pts.x, pts.loss)
    assert ok.all()
    tol = scaling.parameter_tolerance(theta[0], pts.x, pts.loss)[0]
    assert (np.abs(theta - theta[0]) <= tol).all()
    assert scaling.parameter_tolerance(theta[0], pts.x, pts.loss, rel_cost=4e-12)[0] == pytest.approx(2 * tol)
    eps = 1e-6                                       # well above the cost's float round-off
    big = scaling.parameter_tolerance(theta[0], pts.x, pts.loss, rel_cost=eps)[0]
    from scipy.optimize import least_squares
    for name in ("alpha_l", "alpha_D", "L0"):
        # the profile: parameter i held at its tolerance's end, the others minimised again; the cost rises by eps · C
        i = scaling.index("decomposed", name)
        free = np.arange(len(theta[0])) != i

        def residuals(rest, i=i, free=free):
            t = theta[0].copy()
            t[free], t[i] = rest, theta[0, i] + big[i]
            return scaling.log_residuals(t[None], pts.x, pts.loss)[0][0]

        rest = least_squares(residuals, theta[0][free], xtol=1e-15, ftol=1e-15, gtol=1e-15).x
        rise = (residuals(rest) ** 2).mean() * 100 / converged_fit.risk - 1
        assert rise == pytest.approx(eps, rel=0.05), name


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
    assert hub.se_method == "sandwich" and converged_fit.se_method == "gauss-newton"
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


def test_huber_standard_errors_are_the_sandwich_and_match_a_bootstrap(chinchilla_df):
    """Gauss–Newton SEs assume least squares; the Huber fit's are the sandwich estimator's. Before: Gauss–Newton
    (α_m 0.081, α_ℓ 0.269, α_D 0.0138, L0 0.0249); after: sandwich (0.068, 0.272, 0.0233, 0.0384)."""
    hub = scaling.fit_decomposed_law(chinchilla_df, objective="huber")
    pts, delta = hub.points, hub.extra["huber_delta"]
    gn = scaling.gauss_newton_se(hub.theta, pts)
    np.testing.assert_allclose(hub.se[3:], [0.0682, 0.2721, 0.0233, 0.0384], atol=0.001)
    rng = np.random.default_rng(0)
    boot = []
    for _ in range(100):                       # a bootstrap of Huber fits: the independent check
        idx = rng.integers(0, pts.n, pts.n)
        sub = scaling.Points("decomposed", pts.x[idx], pts.loss[idx], pts.frame.iloc[idx], 0)
        boot.append(law.huber_refine(hub.theta, sub, delta))
    spread = np.std(boot, axis=0, ddof=1)
    # α_D and L0: the sandwich matches the bootstrap; Gauss–Newton understates them by ~1.7x
    np.testing.assert_allclose(hub.se[5:], spread[5:], rtol=0.3)
    assert (gn[5:] < 0.75 * spread[5:]).all()
    table = scaling.fits_table({"converged": scaling.fit_decomposed_law(chinchilla_df), "huber": hub})
    assert list(table["SE method"]) == ["Gauss–Newton", "sandwich (Huber)", "Gauss–Newton"]
    assert table.loc["huber", "SE α_D"] == pytest.approx(hub.se[5])
    # least squares in log space is the δ → ∞ limit: the sandwich becomes the HC1 robust covariance
    conv = scaling.fit_decomposed_law(chinchilla_df)
    r, J = scaling.log_residuals(conv.theta[None], pts.x, pts.loss)
    bread = np.linalg.inv(J[0].T @ J[0])
    hc1 = pts.n / (pts.n - 7) * bread @ (J[0] * r[0][:, None] ** 2).T @ J[0] @ bread
    np.testing.assert_allclose(scaling.sandwich_se(conv.theta, pts, 1.0), np.sqrt(np.diag(hc1)), rtol=1e-6)


def test_width_depth_optimum_exponent_and_the_offset_2_constraint(chinchilla_df, converged_fit):
    """Figure 1.6: the converged optimum grows as ℓ^1.40 (not 'roughly linearly'); with depth offset 2 the
    constraint is N ∝ m²(ℓ − 2), which the note says is not the parameter count."""
    opt = scaling.width_depth_optimum(converged_fit)
    assert opt["m_vs_l_exponent"] == pytest.approx(1.401, abs=0.002)
    assert "parameter count" not in opt["note"]
    off = scaling.width_depth_optimum(scaling.fit_decomposed_law(chinchilla_df, depth_offset=2))
    assert "m²(ℓ − 2)" in off["note"] and "not the parameter count" in off["note"]


def test_bootstrap_subset_of_resamples_equals_the_full_draw(chinchilla_df):
    full = scaling.bootstrap(chinchilla_df, n_resamples=30, seed=5)
    part = scaling.bootstrap(chinchilla_df, n_resamples=30, seed=5, resamples=[0, 7, 29])
    np.testing.assert_array_equal(part.to_numpy(), full.iloc[[0, 7, 29]].to_numpy())
    with pytest.raises(InputError, match="resamples must be indices"):
        scaling.bootstrap(chinchilla_df, n_resamples=30, resamples=[30])


def test_chapter_profiles_run_and_replay(chinchilla_df, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DEPTHLIB_RESULTS_DIR", str(tmp_path / "committed"))   # no committed runs: compute
    assert set(chapter.PROFILES) == {"smoke", "cpu", "paper"}
    assert [chapter.PROFILES[p].n_bootstrap for p in ("smoke", "cpu", "paper")] == [200, 1000, 4000]
    assert not chapter.PROFILES["smoke"].paper_scan and chapter.PROFILES["cpu"].paper_scan
    run = chapter.runs("smoke")["fits"]
    assert run.complete and not run.stale and run.experiment == "scaling"
    assert run.tables() == ["bootstrap", "exclusion_scan", "held_out"]
    assert run.config["csv_sha256"] == chapter.csv_sha256() and len(run.config["csv_sha256"]) == 64
    assert run.manifest["code_modules"] == list(results.compute_modules(chapter.COMPUTE["scaling"]))
    assert {"depthlib.scaling.fits", "depthlib.scaling.solvers", "depthlib.data"} <= set(run.manifest["code_modules"])
    assert len(run.table("bootstrap")) == 200 and len(run.table("held_out")) == 10
    assert chapter.runs("smoke")["fits"].path == run.path                     # found again, not recomputed
    table = chapter.replay(run)
    assert list(table.columns[-2:]) == ["committed", "replayed"] and len(table) == 3 * 4 + 5
    # the same machine and process: bit for bit (another CPU needs the table's ``atol``, test_committed_runs.py)
    np.testing.assert_allclose(table["replayed"], table["committed"], rtol=1e-12)
    assert (table["atol"] > 0).all() and (table["atol"] < 1e-4 * table["committed"].abs()).all()
    # another CSV is another run: its sha256 is in the config
    other = tmp_path / "other.csv"
    chinchilla_df.iloc[:-1].to_csv(other, index=False)
    elsewhere = dataclasses.replace(chapter.PROFILES["smoke"], csv=str(other))
    assert elsewhere == chapter.PROFILES["smoke"] and elsewhere.to_dict() == chapter.PROFILES["smoke"].to_dict()
    assert chapter.chapter_config(elsewhere)["csv_sha256"] != run.config["csv_sha256"]
    with pytest.raises(InputError, match="unknown profile"):
        chapter.runs("huge")


def test_chapter_text_is_computed_from_the_fits(chinchilla_df, converged_fit, paper_fit):
    """Chapter 1's captions and paragraphs (depthlib.scaling.views) state what the fits and tables say: the fitted
    runs' error is the fit's own, and the interval's verdict on 1 and 3 follows the resamples (known answers)."""
    import pandas as pd

    from depthlib.scaling import views
    said = views.observed_caption(converged_fit, chinchilla_df)
    assert f"{100 * converged_fit.mean_rel_err:.2f} % off on average" in said and f"all {len(chinchilla_df)} runs" in said
    rng = np.random.default_rng(0)
    near_one = pd.DataFrame({p: rng.normal(m, 0.05, 400) for p, m in (("alpha_m", 1), ("alpha_l", 1), ("alpha_D", .3))})
    assert "includes 1 and excludes 3" in views.bootstrap_caption(near_one, 0)
    assert "excludes 1 and includes 3" in views.bootstrap_caption(near_one.assign(alpha_l=near_one["alpha_l"] + 2), 0)
    scan = pd.DataFrame({"exclude": [0, 10, 20], "depth_offset": 0, "preset": "converged", "alpha_l": [1.0, 1.1, 1.2],
                         "se_alpha_l": [0.1, 0.1, 0.5]})
    far = views.distance_from_three(scan)
    assert "at 20 excluded rows: α_ℓ = 1.20 ± 0.50, 3.6 SE below 3: 3 is excluded under every choice" in far
    assert "nearer 1 than 3 does not" in views.preset_paragraph(paper_fit, converged_fit)

"""The views chapters 6 and 7 show (:mod:`depthlib.lm.views`, :mod:`depthlib.compose.views`), built from the committed
runs: each table has the rows and numbers of the run it reads, each sentence states what the run's tables say (the
branches a run does not reach are checked on rows built here). Nothing is computed: a chapter that finds no committed
run skips instead of training one."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from depthlib import results


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """Run loader for the tests: ``committed(chapter_runs, "cpu", ...)`` with an empty local cache (so only committed
    runs are found) and without computing one that is missing (the test skips)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    real = results.chapter_run

    def no_compute(experiment, profile, compute, **kw):
        return real(experiment, profile, lambda: pytest.skip(f"no committed {experiment} run for {profile}"), **kw)

    mp.setattr(results, "chapter_run", no_compute)
    yield lambda runs, *a, **kw: runs(*a, **kw)
    mp.undo()


@pytest.fixture(scope="module")
def series(committed):
    from depthlib.lm import chapter
    run = committed(chapter.runs, "cpu")["series"]
    assert run.committed
    return run


@pytest.fixture(scope="module")
def compose_runs(committed):
    from depthlib.compose import chapter
    runs = committed(chapter.runs, "cpu")
    assert all(r.committed for r in runs.values())
    return runs


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+\.\d+", text)]


# ---- chapter 6 ------------------------------------------------------------------------------------------------------
def test_lm_settings_table_states_the_runs_config(series):
    from depthlib.lm import analysis, views
    t = views.settings_table(series, "cpu")["cpu profile"]
    cfg = series.config
    assert t["depths ℓ"] == ", ".join(map(str, cfg["depths"]))
    assert t["tokens per step"] == cfg["train"]["batch_size"] * cfg["model"]["context"]
    n = analysis.budget(series).n_params
    assert t["parameters, shallowest → deepest"] == f"{n.iloc[0]:,} → {n.iloc[-1]:,}" and n.iloc[0] < n.iloc[-1]


def test_lm_fit_text_gives_every_depths_loss_and_reads_the_interval_against_the_paper(series):
    from depthlib.lm import analysis, views
    text = views.fit_text(series, "cpu")
    final, alpha = analysis.final_losses(series), analysis.fit_row(series, "alpha")
    assert text.startswith(f"**Measured** (cpu profile, {len(final)} depths")
    for r in final.itertuples():
        assert f"ℓ = {r.depth}: {r.val_loss:.3f}" in text
    inside = alpha["lo"] <= analysis.PAPER_ALPHA_L[0] <= alpha["hi"]
    assert ("The 95 % interval contains" in text) == inside
    assert ("does not contain" in text) == (not inside)


def test_lm_leave_one_out_names_the_depths_that_move_the_exponent_most(series):
    from depthlib.lm import chapter, views
    loo = chapter.leave_one_depth_out(series)
    table = views.leave_one_out_table(loo)
    assert list(table.index) == list(series.config["depths"])
    text = views.leave_one_out_text(loo)
    lo, hi = loo.loc[loo["α_ℓ"].idxmin()], loo.loc[loo["α_ℓ"].idxmax()]
    assert f"from {lo['α_ℓ']:.2f} (without ℓ = {int(lo['left out'])})" in text
    assert f"to {hi['α_ℓ']:.2f} (without ℓ = {int(hi['left out'])})" in text


def test_lm_alpha_comparison_rows_and_chapter_one_text(series):
    from depthlib.lm import analysis, views
    rows = views.alpha_comparison_rows(series, "cpu", None)
    alpha = analysis.fit_row(series, "alpha")
    assert len(rows) == 2 and rows.iloc[0][["value", "lo", "hi"]].tolist() == [alpha["value"], alpha["lo"], alpha["hi"]]
    assert rows.iloc[1]["lo"] == pytest.approx(1.2 - 1.96 * 0.3) and rows.iloc[1]["hi"] == pytest.approx(1.2 + 1.96 * 0.3)
    ch1 = {"alpha_l": 1.0, "se": 0.1}
    rows = views.alpha_comparison_rows(series, "cpu", ch1)
    assert len(rows) == 3 and rows.iloc[2][["lo", "hi"]].tolist() == pytest.approx([0.804, 1.196])
    assert "α_ℓ = 1.00 ± 0.20 (1.96 SE)" in views.chinchilla_text(ch1)
    assert "DEPTHLIB_DATA_DIR" in views.chinchilla_text(None)


def test_lm_angle_text_gives_the_t_interval_of_the_angle_exponent(series):
    from depthlib import verdict
    from depthlib.lm import analysis, views
    text = views.angle_text(series, "cpu")
    a = analysis.fit_row(series, "alpha_theta")
    lo, hi = verdict.t_interval(a["value"], a["se"], int(a["n_depths"]) - 2)
    assert lo < a["value"] < hi
    assert f"95 % t interval is [{lo:.2f}, {hi:.2f}]" in text
    for r in analysis.angles(series).itertuples():
        assert f"ℓ = {r.depth}: {r.theta_middle_mean:.3f}" in text


def test_lm_cluster_text_covers_the_clustered_depths_and_says_when_there_are_none(series, monkeypatch):
    from depthlib.lm import analysis, views
    angles = analysis.angles(series)
    clustered = angles.dropna(subset=["cluster_evenly"])
    text = views.cluster_text(series)
    assert text.count("% of tokens near 'evenly'") == len(clustered) > 0
    monkeypatch.setattr(analysis, "angles", lambda run: angles.drop(columns=["cluster_evenly"]))
    assert views.cluster_text(series) == "**Measured.** No depth has enough middle blocks to cluster."


def test_lm_alpha_steps_text_lists_fitted_and_undefined_steps(series):
    from depthlib.lm import analysis, views
    steps = analysis.alpha_steps(series)
    text = views.alpha_steps_text(series)
    final, last = analysis.fit_row(series, "alpha"), steps["step"].max()
    for r in steps[steps.defined].itertuples():
        # the last step is the chapter's fit: its interval is the fit's (one value for one exponent on the page)
        lo, hi = (final["lo"], final["hi"]) if r.step == last else (r.lo, r.hi)
        assert f"step {r.step}: {r.alpha:.2f} [{lo:.2f}, {hi:.2f}]" in text
    undefined = steps[~steps.defined & (steps.step > 0)]
    assert (f"no exponent at step(s) {', '.join(map(str, undefined.step))}" in text) == bool(len(undefined))


def test_lm_budget_table_and_the_numbers_agree(series):
    from depthlib.lm import views
    t = views.budget_table(series)
    assert list(t.columns) == ["depth", "parameters", "non-embedding", "tokens seen", "tokens / param.",
                               "tokens / non-emb."]
    assert np.allclose(t["tokens / param."], (t["tokens seen"] / t["parameters"]).round(2))
    text = views.numbers_text(series)
    assert f"Tokens per parameter: {t['tokens / param.'].iloc[-1]:.2f} (deepest) to " \
           f"{t['tokens / param.'].iloc[0]:.2f} (shallowest)" in text


def test_lm_limits_and_throughput_text_state_the_profile_and_the_cost(series):
    from depthlib.lm import chapter, views
    text = views.limits_text(series)
    assert f"width {series.config['model']['d_model']} (Pythia" in text
    assert "This page shows the `cpu` profile" in text
    assert f"(width {chapter.PROFILES['paper'].series.model.d_model}, depths" in text
    assert ", not initialisation or data order" in text        # one seed: the bootstrap does not cover it
    cost = views.throughput_text(series)
    tp = series.manifest["throughput"]
    assert f"Training took {tp['train_seconds'] / 60:.1f} min" in cost
    assert f"summed over the {len(series.config['depths'])} depths" in cost


# ---- chapter 7: the grammar -----------------------------------------------------------------------------------------
def test_compose_settings_and_convergence(compose_runs):
    from depthlib.compose import analysis, views
    run = compose_runs["rhm"]
    t = views.settings_table(run, "cpu")["cpu profile"]
    losses = analysis.loss_table(run)
    assert t["Bayes loss of the held-out set (nats/symbol)"] == f"{losses.bayes.mean():.4f}"
    assert t["grammar (v, m, s, L)"].startswith("(8, 2, 2, 4)")
    conv = views.convergence_table(run)
    assert len(conv) == len(losses) and conv["converged (< 1 %, all)"].dtype == bool
    assert views.convergence_text(run).startswith(f"**Measured.** {int(losses.converged.sum())} of {len(losses)} ")


def test_compose_alpha_text_gives_every_excess_and_every_exponent(compose_runs):
    from depthlib.compose import analysis, views
    run = compose_runs["rhm"]
    text = views.alpha_text(run, "cpu")
    losses, alphas = analysis.loss_table(run), analysis.alpha_table(run)
    for r in losses.itertuples():
        assert f"ℓ = {r.depth}: {r.excess:.4f} [{r.excess_lo:.4f}, {r.excess_hi:.4f}]" in text
    for r in alphas.itertuples():
        assert views._alpha_phrase(r) in text


def test_alpha_phrase_says_why_there_is_no_exponent():
    from depthlib.compose import views
    row = dict(family="tied", law="excess", value=1.5, lo=1.0, hi=2.0, defined=True, depths="1, 2, 4, 8")
    assert views._alpha_phrase(SimpleNamespace(**row)) == "tied (excess, depths 1, 2, 4, 8): α = 1.50 [1.00, 2.00]"
    assert "no fit (too few depths)" in views._alpha_phrase(SimpleNamespace(**{**row, "value": np.nan}))
    assert "not every replicate" in views._alpha_phrase(SimpleNamespace(**{**row, "defined": False}))


def test_compose_slopes_and_equal_depth_tables(compose_runs):
    from depthlib.compose import analysis, views
    run = compose_runs["rhm"]
    slopes = views.slopes_table(run)
    assert len(slopes) == len(analysis.local_slopes(run)) and ("untied", "1 → 2") in slopes.index
    table = views.equal_depth_table(run)
    assert table.loc[1, "excess, looped"] == "—"                   # looped members start at ℓ = 3
    losses = analysis.loss_table(run).set_index(["family", "depth"])
    assert table.loc[3, "excess, untied"] == round(losses.loc[("untied", 3), "excess"], 4)
    assert f"the untied ℓ = 3 member (3 blocks, as every looped member) has excess {losses.loc[('untied', 3), 'excess']:.4f}" \
        in views.equal_parameters_text(run)


def test_diagnostic_clips_a_share_to_its_range_and_drops_a_missing_interval():
    from depthlib.compose import views
    d = pd.DataFrame([{"family": "untied", "depth": 8, "x": 0.99, "x_lo": 0.95, "x_hi": 1.03, "y": 0.5,
                       "y_lo": np.nan, "y_hi": np.nan}]).set_index(["family", "depth"])
    assert views._diagnostic(d, "x", "untied", 8, pct=True) == "99.0 % [95.0 %, 100.0 %]"
    assert views._diagnostic(d, "x", "untied", 8, 3) == "0.990 [0.950, 1.030]"
    assert views._diagnostic(d, "y", "untied", 8) == "0.50"


def test_compose_diagnostics_text_has_one_item_per_family(compose_runs):
    from depthlib.compose import views
    text = views.diagnostics_text(compose_runs["rhm"], "cpu")
    items = [ln for ln in text.splitlines() if ln.startswith("* **")]
    assert [ln.split(",")[0] for ln in items] == ["* **untied", "* **looped", "* **tied"]
    assert ["swapping two neighbours" in ln for ln in items] == [True, False, False]


def test_compose_diagnostics_reading_follows_its_stated_rule(compose_runs, monkeypatch):
    """The reading of the cluster diagnostic against the edits quotes the run's numbers, and its answer changes as its
    rule says when the untied members stop being all even, or stop being assembly lines."""
    from depthlib.compose import analysis, views
    run = compose_runs["rhm"]
    d = analysis.diagnostic_table(run)
    mid = d[(d["family"] == "untied") & d["delete_vs_ensemble"].notna()]
    even = d.loc[d["family"] == "untied", "cluster_evenly"].dropna()
    text = views.diagnostics_reading(run)
    assert (f"costs {mid['delete_vs_ensemble'].min():.0f}–{mid['delete_vs_ensemble'].max():.0f} times what an ensemble"
            in text)
    assembly, all_even = (mid["delete_vs_ensemble_lo"] > views.ASSEMBLY).all(), (even >= views.EVENLY).all()
    assert text.startswith("**No" if assembly and all_even else "**Yes" if assembly else "**The edits do not")

    def reading(**changes):
        t = d.copy()
        for col, value in changes.items():
            t.loc[t["family"] == "untied", col] = value
        monkeypatch.setattr(analysis, "diagnostic_table", lambda _run: t)
        return views.diagnostics_reading(run)
    assert reading(cluster_evenly=0.5).startswith("**Yes, at least in part.**")
    assert reading(delete_vs_ensemble_lo=1.0).startswith("**The edits do not call the untied members assembly lines")
    assert "these networks are not clearly assembly lines" in views.conclusion_text(run)    # the same table, one rule
    assert reading(delete_vs_ensemble_lo=5.0, cluster_evenly=1.0).startswith("**No — and the edits show why not.**")
    assert "these networks are assembly lines" in views.conclusion_text(run)
    shares_below = d.assign(cluster_evenly=np.where(d["family"] == "untied", 1.0, 0.5 * d["cluster_evenly"]))
    monkeypatch.setattr(analysis, "diagnostic_table", lambda _run: shares_below)
    assert "separates flows from non-flows" in views.diagnostics_reading(run)


# ---- chapter 7: limits and conclusion -------------------------------------------------------------------------------
def test_compose_limits_and_conclusion(compose_runs):
    from depthlib.compose import analysis, chapter, views
    run = compose_runs["rhm"]
    limits = views.limits_text(run, compose_runs["text_certified"])
    certified = chapter.describe_text_certified(compose_runs["text_certified"])
    assert "\n* **On text**, at chapter 6's certified budget (one seed, " in limits
    assert f"{certified['tokens_per_member'] / 1e6:.2f} M tokens a member" in limits
    assert "**On text**" not in views.limits_text(run)
    paper = chapter.PROFILES["paper"].run
    assert f"({paper.grammar.v}, {paper.grammar.m}, {paper.grammar.s}, {paper.grammar.L})" in limits
    assert f"at most {analysis.loss_table(run).n_params.max():,} parameters" in limits
    text = views.conclusion_text(run)
    ex = analysis.alpha_table(run).query("law == 'excess'").set_index("family")
    assert f"**α = {views._alpha_interval(ex, 'untied')}**" in text
    assert f"({views._versus_one(ex.loc['looped'])})" in text
    r = lambda lo, hi: SimpleNamespace(lo=lo, hi=hi)                                       # noqa: E731
    assert [views._versus_one(r(1.1, 1.4)), views._versus_one(r(0.5, 1.5))] == [
        "faster than ensemble averaging's 1", "consistent with ensemble averaging's 1"]
    assert _numbers(views._alpha_interval(ex, "untied")) == pytest.approx(
        [ex.loc["untied", c] for c in ("value", "lo", "hi")], abs=0.006)

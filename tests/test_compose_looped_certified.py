"""Chapter 7's looped toy students under chapter 3's certified protocol (depthlib.compose.looped_certified), at the
smoke size: the routes, the certificate, the tables chapter 3's fits read, the replay and the settings checks."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from depthlib.compose import chapter, looped_certified
from depthlib.compose.looped_certified import LoopedCertifiedConfig
from depthlib.errors import InputError
from depthlib.toy.certified import CertifiedConfig

CFG = chapter.PROFILES["smoke"].toy_certified


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("DEPTHLIB_RESULTS_DIR", str(tmp_path_factory.mktemp("none")))      # no committed runs
    try:
        yield chapter.runs("smoke", parts=("toy_certified",))["toy_certified"]
    finally:
        mp.undo()


def test_every_depth_has_its_routes_and_a_certificate(run):
    stages, cert = run.table("stages"), run.table("certified")
    p = CFG.protocol
    assert len(cert) == sum(n for _, _, n in p.cells) * len(p.depths)
    first, *deeper = sorted(p.depths)
    for (teacher, depth), g in stages.groupby(["teacher", "depth"]):
        routes = set(g["route"])
        assert routes >= ({"scratch"} if depth == first else {"halved"})
        assert ("euler" in routes) == (teacher == "tied")
        assert not ({"scratch"} if depth != first else {"halved"}) & routes
    for r in cert.itertuples():                       # the certificate: stop at the first gain below 2 %, else all
        gains = [float(g) for g in r.continuation_gains.split(", ")]        # printed to 4 decimals
        assert r.continuations == len(gains) and r.last_continuation_gain == pytest.approx(gains[-1], abs=5e-5)
        assert r.certified == (r.last_continuation_gain < p.gain_below)
        assert all(g >= p.gain_below for g in gains[:-1])
        assert len(gains) == p.max_continuations or r.certified
    # a looped student has one block: its parameters do not grow with depth
    assert cert["parameters"].nunique() == 1
    assert (cert["heldout_in_pool"] == 0).all()
    # every route trains the same steps at every depth, and a halved start carries its parent's steps
    routes = stages[~stages["stage"].str.contains("+", regex=False)]
    assert (routes["stage_steps"] == p.steps).all()
    halved = routes[routes["route"] == "halved"]
    assert (halved["steps"] > p.steps).all() and halved["start"].str.startswith("halved ").all()


def test_chapter_3s_fits_read_the_tables(run):
    summary = run.table("alpha_summary")
    assert {"envelope", "untrained euler"} <= set(summary["fit"])
    assert set(summary.loc[summary["fit"] == "envelope", "teacher"]) == {"tied", "independent"}
    assert not run.table("fragility").empty and not run.table("slopes").empty
    sig = run.table("signatures")
    assert set(sig["net"]) == {"looped student", "teacher"}
    assert set(sig.loc[sig["net"] == "looped student", "depth"]) == set(CFG.protocol.depths)


def test_the_euler_start_is_the_teachers_flow_in_l_steps():
    teacher = looped_certified.unit_teacher(CFG, {"rho": 1.0, "temperature": 1.0, "replicate": 0})
    block = looped_certified.euler_block(teacher, 4)
    torch.testing.assert_close(block.W_down[0] * 4, teacher.W_down[0] * teacher.depth)


def test_the_replay_recomputes_the_first_interval(run):
    replayed = chapter.replay(run)
    assert len(replayed) == 2
    # same code, same machine, same thread count: the same float32 operations in the same order
    np.testing.assert_allclose(replayed["replayed"], replayed["committed"], rtol=1e-6)


def test_bad_settings_are_one_line_errors():
    base = CFG.protocol
    with pytest.raises(InputError, match="must double"):
        LoopedCertifiedConfig("custom", dataclasses.replace(base, depths=(2, 3, 8))).validate()
    with pytest.raises(InputError, match="stay below"):
        LoopedCertifiedConfig("custom", dataclasses.replace(base, depths=(4, 8, 16))).validate()
    assert LoopedCertifiedConfig.from_dict(CFG.to_dict()) == CFG
    assert isinstance(LoopedCertifiedConfig("x").protocol, CertifiedConfig)


# ---- the notebook's views of the run (depthlib.compose.looped_views) -------------------------------------------------
# Chapter 3's untied students are stood in for by tables made from the looped run's own, with known answers: the same
# replicates, depths and teachers, the losses changed by a known factor (so the ratios and exponents are known) and
# the certificate set as each test needs. The real pair is read by the notebook (.notes/nb07_toy_certified.py).
def _tables(run, certified_flags=None, loss=None) -> dict:
    """The run's tables as a mapping, with the envelope's ``certified`` flags replaced (a function of the table's
    rows) and its held-out losses replaced (``loss``: a function of the table), and every fit chapter 3's merge makes
    recomputed from them (:func:`depthlib.compose.chapter.merge_looped_certified`)."""
    cert = run.table("certified").copy()
    if loss is not None:
        cert["test_loss"] = loss(cert)
    if certified_flags is not None:
        cert["certified"] = certified_flags(cert)
    merged = chapter.merge_looped_certified(CFG, {"stages": run.table("stages"), "curves": run.table("curves"),
                                                  "certified": cert, "signatures": run.table("signatures"),
                                                  "lags": run.table("lags")})
    return {**merged, "config": run.config, "manifest": run.manifest}


def _untied(run, factor, certified_flags=lambda c: True) -> dict:
    """Stand-in untied tables: the looped envelope's losses × ``factor(table)``, chapter 3's config (the protocol)."""
    t = _tables(run, certified_flags=certified_flags, loss=lambda c: c["test_loss"] * factor(c))
    return {**t, "config": run.config["protocol"]}


def _iv(r, digits=2, sign=False):
    f = (lambda x: f"{x:+.{digits}f}") if sign else (lambda x: f"{x:.{digits}f}")
    return f"{f(r['alpha'] if 'alpha' in r else r['diff'])} [{f(r['lo'])}, {f(r['hi'])}]"


def test_the_loss_ratio_is_the_paired_ratio_of_the_two_tables(run):
    from depthlib.compose import looped_views as lv
    untied = _untied(run, lambda c: c["replicate"].map({0: 2.0, 1: 2.2}))
    t = lv.loss_table(run, untied)
    assert len(t) == len(run.table("certified")) // CFG.protocol.cells[0][2]
    # the ratio's geometric mean over replicates: 1/√(2·2.2), and the ratio of the two columns' geometric means
    np.testing.assert_allclose(t["ratio"], 1 / np.sqrt(4.4), rtol=1e-12)
    np.testing.assert_allclose(t["ratio"], t["looped"] / t["untied"], rtol=1e-12)
    cert = run.table("certified")
    for r in t.itertuples():
        g = cert[(cert["teacher"] == r.teacher) & (cert["depth"] == r.depth)]
        assert r.looped == pytest.approx(float(np.exp(np.log(g["test_loss"]).mean())), rel=1e-12)
        assert r.looped_certified == int(g["certified"].sum())
        assert r.status == ("not certified" if r.looped_certified < r.looped_students else "looped lower")
    shown = lv.loss_display(run, untied)
    assert shown["looped ÷ untied (paired) [95 % t]"].str.startswith(f"{1 / np.sqrt(4.4):.2f} [").all()
    # with more spread between replicates the interval includes 1: undecided where every student is certified
    spread = _untied(run, lambda c: c["replicate"].map({0: 2.0, 1: 0.4}))
    t = lv.loss_table(_tables(run, certified_flags=lambda c: True), spread)
    assert (t["status"] == "undecided").all() and (t["position"] == "includes 1").all()


def test_an_uncertified_fit_is_labelled_not_certified_and_a_straddling_one_undecided(run):
    from depthlib.compose import looped_views as lv
    same = _untied(run, lambda c: 3.0)                     # the same exponents: the difference is 0 exactly
    open_ = _tables(run, certified_flags=lambda c: c["teacher"] != "tied")
    e = lv.exponent_table(open_, same).set_index(["teacher", "fit"])
    n_tied = int((open_["certified"]["teacher"] == "tied").sum())
    assert e.loc[("tied", "looped envelope"), "certificate"] == f"not certified (0 of {n_tied})"
    assert e.loc[("independent", "looped envelope"), "certificate"] == "certified"
    assert e.loc[("tied", "looped route euler"), "certificate"] == "before any continuation"
    assert e.loc[("tied", "looped untrained euler"), "certificate"] == "untrained"
    d = lv.difference_table(open_, same).set_index(["teacher", "fit"])
    assert d.loc[("tied", "looped envelope"), "status"] == "not certified"
    assert d.loc[("independent", "looped envelope"), "status"] == "undecided"
    assert d.loc[("independent", "looped envelope"), "position"] == "includes 0"
    text = lv.answer(open_, same)
    assert "steeper α_ℓ than untied students?** **Not certified**" in text
    # certified everywhere, and untied losses × ℓ^0.5: untied α is 0.5 lower, the looped one decidedly steeper
    done = _tables(run, certified_flags=lambda c: True)
    steeper = _untied(run, lambda c: c["depth"] ** 0.5)
    d = lv.difference_table(done, steeper).set_index(["teacher", "fit"])
    assert d.loc[("tied", "looped envelope"), "diff"] == pytest.approx(0.5, abs=1e-9)
    assert d.loc[("tied", "looped envelope"), "status"] == "steeper"
    assert "steeper α_ℓ than untied students?** **Yes**" in lv.answer(done, steeper)


def test_the_plateau_is_read_from_the_deepest_slope_and_the_certificate(run):
    from depthlib.compose import looped_views as lv
    flat = _tables(run, certified_flags=lambda c: True,          # independent: the same loss at every depth
                   loss=lambda c: np.where(c["teacher"] == "independent", 0.01 * (1 + c["replicate"]), c["test_loss"]))
    p = lv.plateau_table(flat).set_index("teacher")
    assert p.loc["independent", "slope"] == pytest.approx(0.0, abs=1e-12)
    assert p.loc["independent", "status"] == "plateau"
    assert "plateau on the independent teacher (an ensemble)?** **Yes**" in lv.answer(flat, _untied(run, lambda c: 1.0))
    falling = _tables(run, certified_flags=lambda c: True,        # independent: loss ∝ 1/ℓ
                      loss=lambda c: np.where(c["teacher"] == "independent", 0.01 / c["depth"], c["test_loss"]))
    assert lv.plateau_table(falling).set_index("teacher").loc["independent", "status"] == "still falling"
    uncertain = _tables(run, certified_flags=lambda c: c["depth"] != max(CFG.protocol.depths),
                        loss=lambda c: np.where(c["teacher"] == "independent", 0.01 * (1 + c["replicate"]),
                                                c["test_loss"]))
    p = lv.plateau_table(uncertain).set_index("teacher")
    assert p.loc["independent", "status"] == "not certified" and p.loc["independent", "position"] == "plateau"



def test_the_verdict_rows_read_the_plateau_and_the_tied_envelope(run):
    """The two verdict rows of this part: the independent teacher's deepest local exponent against the plateau
    region (holds when flat, contradicted when falling as 1/ℓ, undecided when a student is not certified) and the
    tied teacher's envelope α_ℓ, as the run's summary gives it."""
    from depthlib import verdict
    from depthlib.compose import looped_views as lv

    def row(tables, claim):
        (m,) = lv.measurements(tables)[claim]
        c = next(c for c in verdict.CLAIMS if c.key == claim)
        return m, verdict.Row(c, [verdict.Measurement("m", m["value"], m["lo"], m["hi"],
                                                      converged=m["certified"])]).status

    const = dict(certified_flags=lambda c: True)
    flat = _tables(run, **const, loss=lambda c: np.where(c["teacher"] == "independent", 0.01 * (1 + c["replicate"]),
                                                         c["test_loss"]))
    m, status = row(flat, "looped_toy_plateau")
    assert m["value"] == pytest.approx(0.0, abs=1e-12) and m["certified"] and status == "holds"
    falling = _tables(run, **const, loss=lambda c: np.where(c["teacher"] == "independent", 0.01 / c["depth"],
                                                            c["test_loss"]))
    m, status = row(falling, "looped_toy_plateau")
    assert m["value"] == pytest.approx(1.0, rel=1e-9) and status == "contradicted"
    open_ = _tables(run, certified_flags=lambda c: c["depth"] != max(CFG.protocol.depths),
                    loss=lambda c: np.where(c["teacher"] == "independent", 0.01 * (1 + c["replicate"]),
                                            c["test_loss"]))
    assert row(open_, "looped_toy_plateau")[1] == "undecided"
    m, _ = row(flat, "looped_toy_flow")
    env = flat["alpha_summary"].query("teacher == 'tied' and fit == 'envelope'").iloc[0]
    assert (m["value"], m["lo"], m["hi"]) == (env["alpha"], env["lo"], env["hi"]) and m["certified"]

def test_the_exponents_are_chapter_3s_fits_of_the_run(run):
    from depthlib.compose import looped_views as lv
    untied = _untied(run, lambda c: 1.0)
    e = lv.exponent_table(run, untied).set_index(["teacher", "fit"])
    summary, frag = run.table("alpha_summary"), run.table("fragility")
    for teacher in ("tied", "independent"):
        env = summary[(summary["fit"] == "envelope") & (summary["teacher"] == teacher)].iloc[0]
        row = e.loc[(teacher, "looped envelope")]
        assert row["alpha"] == env["alpha"] and row["lo"] == env["lo"] and row["hi"] == env["hi"]
        drop = frag[(frag["teacher"] == teacher) & frag["fit"].str.startswith("without ℓ = ")]["alpha"]
        assert (row["drop_one_min"], row["drop_one_max"]) == (drop.min(), drop.max())
        # the untied fit, recomputed here on the same losses, is the envelope's own fit
        assert e.loc[(teacher, "untied envelope (chapter 3)"), "alpha"] == pytest.approx(env["alpha"], rel=1e-12)
    # the chain only where there is an Euler route; no fit on one depth (the scratch route)
    assert ("tied", lv.CHAIN) in e.index and ("independent", lv.CHAIN) not in e.index
    assert not any(f.endswith("route scratch") for _, f in e.index)
    chain = e.loc[("tied", lv.CHAIN)]
    stages = run.table("stages")
    tied_chain = stages[(stages["teacher"] == "tied") & stages["route"].isin(lv.CHAIN_ROUTES)]
    assert chain["n_students"] == tied_chain.groupby(["replicate", "depth"]).ngroups


def test_generated_text_states_the_tables_numbers(run):
    from depthlib.compose import looped_views as lv
    untied = _untied(run, lambda c: c["depth"] ** 0.25 * c["replicate"].map({0: 1.1, 1: 0.9}))
    e = lv.exponent_table(run, untied).set_index(["teacher", "fit"])
    d = lv.difference_table(run, untied).set_index(["teacher", "fit"])
    p = lv.plateau_table(run).set_index("teacher")
    text = lv.answer(run, untied)
    for key in (("tied", "looped envelope"), ("tied", "untied envelope (chapter 3)"), ("tied", lv.CHAIN),
                ("independent", "looped envelope")):
        assert _iv(e.loc[key]) in text
    assert _iv(d.loc[("tied", "looped envelope")], sign=True) in text
    assert f"{p.loc['independent', 'slope']:.2f} [{p.loc['independent', 'lo']:.2f}, " in text
    cert = run.table("certified")
    assert f"{int(cert['certified'].sum())} of {len(cert)} looped students" in text
    conclusion = lv.conclusion_text(run, untied)
    lt = lv.loss_table(run, untied)
    for r in lt[lt["depth"].isin([min(CFG.protocol.depths), max(CFG.protocol.depths)])].itertuples():
        assert f"{r.ratio:.2f} [{r.ratio_lo:.2f}, {r.ratio_hi:.2f}] at ℓ = {r.depth}" in conclusion
    assert f"{int(cert['parameters'].iloc[0]):,} trained parameters" in conclusion
    sig = lv.signature_means(run).set_index(["net", "teacher", "depth"])
    deep = max(CFG.protocol.depths)
    theta = sig.loc[("looped student", "tied", deep)]
    assert f"{theta['theta_update']:.2f} [{theta['theta_update_lo']:.2f}, " in lv.signatures_text(run)
    limits = lv.limits_text(run, untied)
    assert f"{CFG.protocol.steps:,} steps" in limits and f"{int(cert['certified'].sum())} of {len(cert)} looped" in limits


def test_the_reader_tables_match_the_run(run):
    from depthlib.compose import looped_views as lv
    untied = _untied(run, lambda c: 2.0, certified_flags=lambda c: c["depth"] > min(CFG.protocol.depths))
    cert = run.table("certified")
    ct = lv.certification_table(run, untied)
    assert len(ct) == cert.groupby(["teacher", "depth"]).ngroups
    for (teacher, _, depth), r in ct.iterrows():
        g = cert[(cert["teacher"] == teacher) & (cert["depth"] == depth)]
        assert r[("looped", "certified")] == f"{int(g['certified'].sum())} of {len(g)}"
        assert r[("untied (chapter 3)", "certified")] == f"{0 if depth == min(CFG.protocol.depths) else len(g)} of {len(g)}"
    settings = lv.settings_table(run, untied)["value"]
    assert settings["looped students certified"] == f"{int(cert['certified'].sum())} of {len(cert)}"
    assert settings["trained parameters per looped student"] == f"{int(cert['parameters'].iloc[0]):,} at every depth"
    slopes = lv.slopes_table(run, untied)
    own = run.table("slopes")
    own = own[own["replicate"] == -1].set_index(["teacher", "depth_from"])["slope"]
    for r in slopes.itertuples():
        assert r.slope == own.loc[(r.teacher, r.depth_from)]
        assert r.slope_untied == pytest.approx(r.slope, abs=1e-12)       # losses × 2: the same slopes
    assert len(lv.signatures_table(run)) == run.table("signatures")[["net", "teacher", "depth"]].drop_duplicates().shape[0]
    for table in (lv.loss_display(run, untied), lv.exponent_display(run, untied), lv.difference_display(run, untied),
                  lv.slopes_display(run, untied)):
        assert len(table) and not table.isna().any().any()


def test_the_views_refuse_untied_students_of_other_teachers(run):
    from depthlib.compose import looped_views as lv
    other = _untied(run, lambda c: 1.0)
    other["config"] = {**other["config"], "seed": 1}
    with pytest.raises(InputError, match="do not share their teachers"):
        lv.loss_table(run, other)


def test_the_figures_can_be_read(run):
    from depthlib import plots
    from depthlib.compose import looped_views as lv
    from depthlib.plots import compose as figs
    from depthlib.plots import toy as toy_figs
    untied = _untied(run, lambda c: 2.0, certified_flags=lambda c: c["depth"] > min(CFG.protocol.depths))
    lines = lv.loss_lines(run, untied)
    assert set(lines["kind"]) == {"looped", lv.CHAIN, "untied", "untrained Euler start"}
    assert lines.loc[lines["kind"] == "untrained Euler start", "certified"].isna().all()
    loss = figs.looped_loss_vs_depth(lines)
    forest = figs.looped_alpha_forest(lv.exponent_table(run, untied))
    for fig in (loss, forest, toy_figs.continuation_gains(run.table("stages"), CFG.protocol.gain_below),
                toy_figs.alpha_by_round(run.table("alpha_rounds"))):
        assert plots.figure_problems(fig) == []
        for axis in (fig.layout.xaxis, fig.layout.yaxis):
            title = axis.title.text or ""
            assert not title or "(" in title, f"axis title without a unit: {title!r}"
    # open markers exactly where not every replicate's student is certified
    untied_lines = lines[lines["kind"] == "untied"].sort_values(["teacher", "depth"])
    for trace in loss.data:
        if trace.name and trace.name.startswith("untied"):
            teacher = trace.name.rsplit(", ", 1)[1].split()[0]
            want = untied_lines[untied_lines["teacher"] == teacher]
            assert [s.endswith("-open") for s in trace.marker.symbol] == list(want["certified"] < want["n"])


@pytest.mark.browser
def test_the_sections_figures_pass_the_books_legibility_checks(run, tmp_path):
    """The section's four figures, drawn as :func:`depthlib.plots.show` draws them at the book's column width, pass
    every check the browser test runs on the built book (:mod:`tests.figure_checks`)."""
    import shutil

    from depthlib import plots
    from depthlib.compose import looped_views as lv
    from depthlib.plots import compose as figs
    from depthlib.plots import toy as toy_figs
    from tests import figure_checks as fc
    from tests.test_figure_checks import _show
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (pip) drives Chromium")
    untied = _untied(run, lambda c: 2.0 * c["depth"] ** 0.1, certified_flags=lambda c: c["depth"] > 2)
    figures = [figs.looped_loss_vs_depth(lv.loss_lines(run, untied)),
               figs.looped_alpha_forest(lv.exponent_table(run, untied)),
               toy_figs.continuation_gains(run.table("stages"), CFG.protocol.gain_below),
               toy_figs.alpha_by_round(run.table("alpha_rounds"))]
    for fig in figures:                                   # what plots.show does before it shows a figure
        plots.decade_ticks(fig)
        plots.write_subscripts(fig)
        plots.fit_axis_titles(fig)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            _show(page, tmp_path, *figures)
            problems = {name: found for name, found in fc.run_checks(page).items() if found}
        finally:
            browser.close()
    assert not problems

"""The verdict table: its written status rule on synthetic numbers, its small computations, the converged toy run
it prefers when one exists, that it reads exactly the runs the chapters' notebooks show (found, never computed), and
one row per claim from the committed runs."""
import math
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from depthlib import claims, results, selection, verdict
from depthlib.chapters import CHAPTERS, by_name
from depthlib.errors import InputError
from depthlib.probes import views as probes_views
from depthlib.scaling import views as scaling_views
from depthlib.toy import chapter as toy_chapter

REGION = (0.0, 2.0)   # e.g. α_ℓ < 2


@pytest.mark.parametrize("value, lo, hi, expected", [
    (None, None, None, "not tested here"),
    (math.nan, None, None, "not tested here"),
    (2.5, 2.2, 2.9, "contradicted"),          # wholly outside the region
    (1.6, 1.1, 2.4, "undecided"),             # straddles the region's edge: the run cannot decide
    (1.3, 0.9, 1.7, "reproduced"),            # inside, contains the paper's 1.2
    (0.8, 0.7, 0.95, "differs"),              # inside, misses 1.2: the direction holds, the number does not
    (1.2, None, None, "reproduced"),          # a point equal to the paper's value
    (1.0, None, None, "differs"),             # a point inside the region
])
def test_status_rule(value, lo, hi, expected):
    assert verdict.status(1.2, REGION, value, lo, hi) == expected


def test_status_without_paper_value_holds_inside_the_region():
    assert verdict.status(None, (0.0, 1.0), 0.4, 0.3, 0.5) == "holds"
    assert verdict.status(None, (0.0, 1.0), 4.2) == "contradicted"


def test_status_rejects_an_inverted_interval():
    with pytest.raises(InputError):
        verdict.status(1.2, REGION, 1.0, 1.5, 0.5)


def test_row_takes_the_weakest_status_of_its_models():
    claim = verdict.CLAIMS[0]
    good = verdict.Measurement("a", 1.2, 1.0, 1.4)
    bad = verdict.Measurement("b", 3.0, 2.5, 3.5)
    assert verdict.Row(claim, [good]).status == "reproduced"
    assert verdict.Row(claim, [good, bad]).status == "contradicted"
    assert verdict.Row(claim, []).status == "not tested here"


def test_every_claim_has_a_section_and_a_region_containing_its_paper_value():
    assert len({c.key for c in verdict.CLAIMS}) == len(verdict.CLAIMS)
    for c in verdict.CLAIMS:
        assert c.section in verdict.SECTIONS and verdict.SECTIONS[c.section] == c.chapter
        assert by_name(str(c.chapter)).number == c.chapter and callable(by_name(str(c.chapter)).views_module.measurements)
        assert c.region[0] < c.region[1]
        if c.paper is not None:
            assert c.region[0] <= c.paper <= c.region[1], c.key


def test_wilson_interval():
    lo, hi = claims.wilson_interval(0.5, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    lo, hi = claims.wilson_interval(1.0, 20)
    assert hi == 1.0 and 0.8 < lo < 0.9
    with pytest.raises(InputError):
        claims.wilson_interval(0.5, 0)


def test_percentile_interval_ignores_nan_and_is_nan_without_values():
    lo, hi = claims.percentile_interval([*range(101), math.nan])
    assert (lo, hi) == pytest.approx((2.5, 97.5))
    assert all(math.isnan(x) for x in claims.percentile_interval([math.nan]))


def test_t_interval_widens_with_few_degrees_of_freedom():
    lo1, hi1 = verdict.t_interval(1.0, 0.1, 1)
    lo30, hi30 = verdict.t_interval(1.0, 0.1, 30)
    assert hi1 - lo1 == pytest.approx(2 * 12.706 * 0.1, rel=1e-3)
    assert hi30 - lo30 < 0.5
    assert all(math.isnan(x) for x in verdict.t_interval(1.0, 0.1, 0))


def test_optimum_exponents_match_the_law():
    x, y = scaling_views.optimum_exponents(np.array([1.0, 0.9]), np.array([1.0, 1.35]))
    assert x[0] == pytest.approx(1.0) and y[0] == pytest.approx(1 / 3)
    assert x[1] == pytest.approx(1.5) and y[1] == pytest.approx(0.9 * 1.35 / (2 * 1.35 + 0.9))


def test_middle_angle_per_doc_uses_the_middle_blocks():
    docs = pd.DataFrame({"theta_0": [1.0, 1.0], "theta_1": [0.2, 0.4], "theta_2": [0.4, 0.6], "theta_3": [2.0, 2.0]})
    assert probes_views.middle_angle_per_doc(docs) == pytest.approx([0.3, 0.5])


def test_middle_update_angle():
    layers = pd.DataFrame({"metric": ["theta_dh"] * 4 + ["theta"], "layer": [0, 1, 2, 3, 0],
                           "mean": [0.1, 1.4, 1.6, 0.1, 9.0], "std": [0.0, 0.4, 0.4, 0.0, 0.0],
                           "count": [100] * 5})
    mean, se = probes_views.middle_update_angle(layers)      # 5 blocks: middle pairs are layers 1 and 2
    assert mean == pytest.approx(1.5) and se == pytest.approx(0.04)


def _protocol_config(protocol: str, profile: str = "cpu") -> dict:
    """The settings chapter 3's ``protocol`` run has under ``profile`` (what its notebook selects on)."""
    return toy_chapter.protocol_config(protocol, profile).to_dict()


def _converged_run(root, rows, unconverged=(), config=None):
    """A synthetic converged-protocol run with the cpu profile's settings (or ``config``): its α table and a ``best``
    table of 3 students per cell, every one converged except in the (teacher, temperature) cells listed in
    ``unconverged``."""
    run = results.open_run(toy_chapter.CONVERGED_EXPERIMENT, config or _protocol_config("converged"), root=root)
    run.path.mkdir(parents=True, exist_ok=True)
    run.write_table("alpha_summary", pd.DataFrame(rows))
    run.write_table("best", pd.DataFrame([dict(teacher=r["teacher"], temperature=r["temperature"], depth=d,
                                               converged=(r["teacher"], r["temperature"]) not in unconverged)
                                          for r in rows for d in (6, 12, 24)]))
    run.finish(profile="cpu", seed=0, wall_time_s=1.0, code=["depthlib.measures"])
    return run


def _showing(monkeypatch, protocol: str) -> None:
    """Chapter 3 as it would be if it showed ``protocol`` ("converged" or "certified") as its protocol part."""
    monkeypatch.setattr(toy_chapter, "SHOWN_PARTS", ("sweep", "calibration", protocol))


def test_chapter3_prefers_a_converged_run_whose_1_percent_rule_decides_nothing(tmp_path, monkeypatch):
    """The converged protocol's rows come from its run, but its 1 % rule is one a schedule can meet: every row it
    gives is undecided, whatever its interval says, and the note says why."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    _showing(monkeypatch, "converged")
    rows = [dict(teacher="tied", temperature=0.01, alpha=2.6, lo=2.3, hi=2.9, replicates=3),
            dict(teacher="tied", temperature=1.0, alpha=2.9, lo=2.7, hi=3.1, replicates=3),
            dict(teacher="independent", temperature=1.0, alpha=1.05, lo=0.9, hi=1.2, replicates=3)]
    _converged_run(results.paths.local_results_dir(), rows)
    found = verdict.measurements(3, "cpu", rerun=True)      # rerun: look only at the (synthetic) local runs
    assert found["tied_alpha"][0].value == 2.9 and "not a certificate" in found["tied_alpha"][0].note
    assert found["low_t_incomplete"][0].value == 2.6
    assert found["independent_alpha"][0].lo == 0.9
    rows_out = {r.claim.key: r for r in verdict.verdict("cpu", rerun=True, chapters=[3])}
    assert rows_out["tied_alpha"].status == "undecided" and rows_out["low_t_incomplete"].status == "undecided"


def test_a_number_without_an_interval_decides_nothing():
    claim = verdict.CLAIMS[0]
    assert verdict.Row(claim, [verdict.Measurement("a", 5.0)]).status == "undecided"     # would be contradicted
    assert verdict.Row(claim, [verdict.Measurement("a", 1.2, 1.0, 1.4)]).status == "reproduced"


def test_a_run_without_a_number_it_can_stand_behind_is_undecided_not_untested():
    claim = verdict.CLAIMS[0]
    row = verdict.Row(claim, [verdict.Measurement("a", math.nan, None, None, "cpu", "no exponent: no fit",
                                                  converged=False)])
    assert row.status == "undecided"
    assert "no result" in verdict.table([row]).iloc[0].to_string()
    assert verdict.Row(claim, []).status == "not tested here"


def test_unconverged_students_decide_nothing(tmp_path, monkeypatch):
    """A value from students that are not certified is 'undecided', whatever its interval says."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    _showing(monkeypatch, "converged")
    rows = [dict(teacher="tied", temperature=0.01, alpha=1.4, lo=1.0, hi=1.8, replicates=1),
            dict(teacher="tied", temperature=1.0, alpha=2.9, lo=2.7, hi=3.1, replicates=3),
            dict(teacher="independent", temperature=1.0, alpha=1.05, lo=0.9, hi=1.2, replicates=3)]
    _converged_run(results.paths.local_results_dir(), rows, unconverged=[("tied", 0.01)])
    rows_out = {r.claim.key: r for r in verdict.verdict("cpu", rerun=True, chapters=[3])}
    assert rows_out["low_t_incomplete"].status == "undecided"       # the interval alone says "contradicted"
    assert "0 of 3 students met its 1 % rule" in rows_out["low_t_incomplete"].measurements[0].note
    assert rows_out["tied_alpha"].status == "undecided"


def test_without_runs_every_row_is_not_tested(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    rows = verdict.verdict("cpu", rerun=True, chapters=[3, 4, 6, 7])
    assert rows and all(r.status == "not tested here" for r in rows)
    text = verdict.markdown(rows)
    assert text.count("**not tested here**") == len(rows)


def test_committed_runs_give_a_row_per_claim_with_a_status():
    rows = verdict.verdict("cpu")
    assert [r.claim.key for r in rows] == [c.key for c in verdict.CLAIMS]
    assert all(r.status in verdict.STATUSES for r in rows)
    tested = [r for r in rows if r.status != "not tested here"]
    assert len(tested) >= 10                                  # chapters 1-6 have committed cpu runs
    shown = verdict.table(rows)
    assert not shown.isna().any().any() and "nan" not in shown.to_string().lower()
    md = verdict.markdown(rows)
    assert md.count("**") // 2 == len(rows) and all(c.claim in md for c in verdict.CLAIMS)


def test_chapter3_reads_only_a_protocol_run_its_notebook_shows(tmp_path, monkeypatch):
    """A converged run with settings other than the profile's is not what the notebook shows, so the verdict does
    not read it either (its rows stay untested); nor a certified run while the chapter does not show that part."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    root = results.paths.local_results_dir()
    _showing(monkeypatch, "converged")
    row = dict(teacher="tied", temperature=1.0, alpha=2.9, lo=2.7, hi=3.1, replicates=3)
    _converged_run(root, [row], config={**_protocol_config("converged"), "steps_deepest": 1})
    assert "tied_alpha" not in verdict.measurements(3, "cpu", rerun=True)
    _certified_run(root, [dict(fit="envelope", **row)])
    assert "tied_alpha" not in verdict.measurements(3, "cpu", rerun=True)
    _converged_run(root, [{**row, "alpha": 2.5}])
    assert verdict.measurements(3, "cpu", rerun=True)["tied_alpha"][0].value == 2.5


def _certified_run(root, rows, uncertified=()):
    """A synthetic certified-protocol run with the cpu profile's settings: its α table and a ``certified`` table of 3
    students per teacher at T = 1, each certified except the (teacher, depth) students in ``uncertified``, whose
    last continuation gained depth %."""
    run = results.open_run(toy_chapter.CERTIFIED_EXPERIMENT, _protocol_config("certified"), root=root)
    run.path.mkdir(parents=True, exist_ok=True)
    run.write_table("alpha_summary", pd.DataFrame(rows))
    run.write_table("certified", pd.DataFrame([dict(teacher=t, temperature=1.0, depth=d,
                                                    certified=(t, d) not in uncertified,
                                                    last_continuation_gain=0.01 * d if (t, d) in uncertified else 0.01)
                                               for t in ("tied", "independent") for d in (6, 12, 24)]))
    run.finish(profile="cpu", seed=0, wall_time_s=1.0, code=["depthlib.measures"])
    return run


def test_chapter3_prefers_a_certified_run_and_an_uncertified_student_decides_nothing(tmp_path, monkeypatch):
    """Once the chapter shows its certified part, with a certified run beside a converged one, chapter 3's rows come
    from the certified run's envelope, and a cell with a student the continuations did not certify is 'not
    reproduced' (it cannot decide)."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    _showing(monkeypatch, "certified")
    root = results.paths.local_results_dir()
    _converged_run(root, [dict(teacher="tied", temperature=1.0, alpha=9.0, lo=8.0, hi=10.0, replicates=3)])
    _certified_run(root, [
        dict(fit="envelope", teacher="tied", temperature=1.0, alpha=2.9, lo=2.7, hi=3.1, replicates=3),
        dict(fit="route scratch", teacher="tied", temperature=1.0, alpha=0.5, lo=0.4, hi=0.6, replicates=3),
        dict(fit="envelope", teacher="independent", temperature=1.0, alpha=1.0, lo=0.9, hi=1.1, replicates=3)],
        uncertified=[("independent", 24)])
    rows_out = {r.claim.key: r for r in verdict.verdict("cpu", rerun=True, chapters=[3])}
    tied = rows_out["tied_alpha"]
    assert tied.measurements[0].value == 2.9 and "certified protocol" in tied.measurements[0].note
    assert tied.status == "reproduced"
    assert rows_out["independent_alpha"].status == "undecided"
    assert "2 of 3 students certified" in rows_out["independent_alpha"].measurements[0].note
    # and says why: how many are certified, and what the other's last continuation still gained
    assert rows_out["independent_alpha"].why == "2 of 3 certified; the others' last continuations still gained 24.0–24.0 %"
    assert verdict.substitutions(list(rows_out.values()))["independent_alpha_gains"] == "24.0–24.0 %"
    assert "(2 of 3 certified;" in verdict.table(list(rows_out.values())).set_index("claim")["status"].iloc[1]


def test_looking_up_a_chapters_runs_computes_nothing(roots, monkeypatch):
    """With no run anywhere, every chapter's shown parts look up as None and nothing is computed or opened (chapter
    3's calibration part, whose missing runs go to an executor, asks :func:`selection.looking_up` first)."""
    from depthlib import interventions
    from depthlib.probes import chapter as probes
    for module in (probes, interventions):          # the offline models' fingerprints, without converting them
        monkeypatch.setattr(module, "model_fingerprint", lambda model: f"test:{model}")
    _, local = roots
    for chapter in CHAPTERS:                        # the book's chapters (chapter 1 without its CSV too: None)
        found = selection.shown_runs(chapter.module.runs, "cpu")
        assert found and all(run is None for run in found.values()), chapter.name
    assert not local.exists() or not any(local.iterdir())
    with pytest.raises(InputError):                 # custom settings are computed directly: never looked up
        selection.shown_runs(by_name("lm").module.runs, by_name("lm").module.PROFILES["smoke"])
    rows = verdict.verdict("cpu")
    assert all(r.status == "not tested here" and not r.note.startswith("its run") for r in rows)


def test_the_book_page_reads_the_runs_the_notebooks_show(monkeypatch):
    """The intro's verdict (what the book build renders) on the committed runs: every chapter's runs come from its own
    ``runs``, looked up, and are the runs that call returns when it may compute; one table row per claim."""
    read = []

    def recording(runs, profile, **kwargs):
        found = selection.shown_runs(runs, profile, **kwargs)
        read.append((runs, profile, kwargs, found))
        return found

    monkeypatch.setattr(verdict, "shown_runs", recording)
    page = verdict.book_page("cpu")
    expected = {c.module.__name__ for c in CHAPTERS}
    if "DEPTHLIB_DATA_DIR" not in os.environ:       # chapter 1's rows need the Chinchilla CSV (its sha256 is its key)
        expected.discard("depthlib.scaling.chapter")
    assert {runs.__module__ for runs, *_ in read} >= expected
    for runs, profile, kwargs, found in read:
        if runs.__module__ not in expected:         # chapter 1 without its CSV: no run to show
            assert found == {"fits": None}
            continue
        assert all(run is not None for run in found.values()), (runs.__module__, found)
        shown = runs(profile, **kwargs)             # every part exists: this computes nothing
        assert {k: r.path for k, r in shown.items()} == {k: r.path for k, r in found.items()}
    table_rows = [line for line in page.splitlines() if line.startswith("| ") and "**" in line]
    assert len(table_rows) == len(verdict.CLAIMS)
    assert all(c.claim in page for c in verdict.CLAIMS) and "could not be read" not in page


def test_a_row_that_differs_says_by_how_much_and_the_calibration_difference_is_a_row(tmp_path, monkeypatch):
    """'differs': the direction holds, the number does not, and the row says how far the paper's value is from the
    interval. The tied − independent difference (the calibration's step) is a row of its own, read from the
    certified run's paired ``separation`` and undecided while any student of the two teachers is not certified."""
    step = next(c for c in verdict.CLAIMS if c.key == "tied_minus_independent")
    row = verdict.Row(step, [verdict.Measurement("toy", 1.6, 1.3, 1.9)])
    assert row.status == "differs" and row.how_much == "the paper's value is 0.10 above the interval"
    assert "differs (the paper's value is 0.10 above the interval)" in verdict.table([row])["status"].iloc[0]
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path))
    _showing(monkeypatch, "certified")
    root = results.paths.local_results_dir()
    envelope = [dict(fit="envelope", teacher=t, temperature=1.0, alpha=a, lo=a - 0.2, hi=a + 0.2, replicates=3)
                for t, a in (("tied", 2.9), ("independent", 1.0))]
    for uncertified, expected in (((), "reproduced"), ((("independent", 24),), "undecided")):
        run = _certified_run(root, envelope, uncertified=uncertified)
        run.write_table("separation", pd.DataFrame([dict(fit="all depths", temperature=1.0, diff=1.9, lo=1.6, hi=2.2,
                                                         n=3)]))
        got = {r.claim.key: r for r in verdict.verdict("cpu", rerun=True, chapters=[3])}["tied_minus_independent"]
        assert got.measurements[0].value == 1.9 and got.status == expected
        shutil.rmtree(run.path)


def test_an_undecided_row_says_why():
    """'undecided' is one word for several situations; the row names which: an interval across the region's edge
    (which edge), no interval, no result, or students not certified (how many are)."""
    alpha = next(c for c in verdict.CLAIMS if c.key == "tied_alpha")            # holds if α_ℓ > 2
    edge = alpha.region[0]
    assert verdict.Row(alpha, [verdict.Measurement("toy", 2.1, 1.9, 2.3)]).why == \
        f"the interval reaches across the region's edge {edge:.2f}"
    assert verdict.Row(alpha, [verdict.Measurement("toy", 2.5)]).why == "no interval"
    assert verdict.Row(alpha, [verdict.Measurement("toy", float("nan"), note="fit at a bound",
                                                   certified=(0, 3))]).why == "no result (0 of 3 certified)"
    two = verdict.Row(alpha, [verdict.Measurement("a", 2.5, 2.4, 2.6, converged=False, certified=(1, 4),
                                                  gaining=(0.031, 0.2)),
                              verdict.Measurement("b", 2.5, 2.4, 2.6)])
    assert two.status == "undecided" and two.why == "a: 1 of 4 certified; the others' last continuations still " \
                                                    "gained 3.1–20.0 %"
    assert verdict.Row(alpha, [verdict.Measurement("toy", 3.0, 2.9, 3.1)]).why == ""           # it decides


def test_substitutions_quote_the_table_and_exist_for_every_claim():
    """What the intro quotes ({{ name }}) is the table's own text, and every name exists even without a run."""
    by_key = {c.key: c for c in verdict.CLAIMS}
    rows = [verdict.Row(by_key["tied_alpha"], [verdict.Measurement("toy", 2.5, 2.4, 2.6, "cpu", certified=(2, 18))]),
            verdict.Row(by_key["middle_angle"], [verdict.Measurement("a", 0.31, 0.30, 0.32),
                                                 verdict.Measurement("b", 0.29, 0.28, 0.30)]),
            verdict.Row(by_key["series_alpha"], [])]
    subs = verdict.substitutions(rows)
    assert subs["tied_alpha_value"] == "2.50 [2.40, 2.60]" and subs["tied_alpha_certified"] == "2 of 18"
    assert subs["tied_alpha_status"] == rows[0].status == "differs"
    assert subs["middle_angle_value"] == "a: 0.31 [0.30, 0.32]; b: 0.29 [0.28, 0.30]"
    assert subs["middle_angle_certified"] == "no certificate"
    rows[1] = verdict.Row(by_key["middle_angle"], [verdict.Measurement("a", 0.3, certified=(1, 2)),
                                                   verdict.Measurement("b", 0.3, certified=(0, 3))])
    assert verdict.substitutions(rows)["middle_angle_certified"] == "a: 1 of 2; b: 0 of 3"   # per model, never summed
    assert (subs["series_alpha_value"], subs["series_alpha_status"]) == ("no run", "not tested here")
    assert subs["tally"] == "3 claims: 2 differs, 1 not tested here" and subs["n_differs"] == "2"
    assert subs["n_reproduced"] == "0"


def test_several_models_are_labelled_as_short_as_still_tells_them_apart():
    """A row's cells name each model; where a row has several, "untied, effective depths 1, 2 (unseen RHM; root
    error)" is cut to what tells it from the others, and one model keeps its whole label."""
    leaf, root = ("untied, effective depths 1, 2 (unseen RHM; next-leaf excess)",
                  "untied, effective depths 1, 2 (unseen RHM; root error)")
    assert verdict.short_labels([leaf, root]) == ["untied (next-leaf excess)", "untied (root error)"]
    assert verdict.short_labels(["looped, ℓ = 3, 4", "tied, ℓ = 1, 2"]) == ["looped", "tied"]
    assert verdict.short_labels([leaf]) == [leaf]
    assert verdict.short_labels(["x, a", "x, b"]) == ["x, a", "x, b"]          # nothing shorter tells them apart
    assert verdict.short_labels(["x, a (p)", "x, b"]) == ["x, a (p)", "x, b"]  # one has no parenthesis of its own
    claim = next(c for c in verdict.CLAIMS if c.key == "hierarchical")
    row = verdict.Row(claim, [verdict.Measurement(leaf, 1.5, 1.0, 2.5), verdict.Measurement(root, 1.2, 1.1, 1.3)])
    assert verdict.table([row])["this book (95 % interval)"].iloc[0] == \
        "untied (next-leaf excess): 1.50 [1.00, 2.50]; untied (root error): 1.20 [1.10, 1.30]"
    assert verdict.substitutions([row])["hierarchical_value"].startswith("untied (next-leaf excess): 1.50")


def test_a_rows_further_numbers_are_substitutions_and_exist_without_a_run():
    by_key = {c.key: c for c in verdict.CLAIMS}
    row = verdict.Row(by_key["low_t_incomplete"], [verdict.Measurement("toy", 1.7, 1.5, 1.9,
                                                                       facts={"far_from_pool": "11 of 18"})])
    assert verdict.substitutions([row])["low_t_incomplete_far_from_pool"] == "11 of 18"
    assert verdict.substitutions([verdict.Row(by_key["low_t_incomplete"], [])])[
        "low_t_incomplete_far_from_pool"] == "not measured"

"""The generated answers of chapters 1, 2, 4 and 7 (scaling, probes, tracing and compose views.answer) on
verdict rows whose statuses are known by construction: the numbers they quote are the verdict table's, and their
first words follow the status."""
from __future__ import annotations

import pandas as pd

from depthlib import verdict

CLAIMS = {c.key: c for c in verdict.CLAIMS}


def _row(key, *measurements):
    return verdict.Row(CLAIMS[key], [verdict.Measurement(m, v, lo, hi, "cpu") for m, v, lo, hi in measurements])


def test_chapter1_answer_follows_the_alpha_row():
    from depthlib.scaling import views
    df = pd.DataFrame({"n_layers": [9, 20, 47]})
    yes = views.answer([_row("chinchilla_alpha", ("Chinchilla", 1.33, 0.98, 1.79)),
                        _row("n_exponent", ("Chinchilla", 0.348, 0.314, 0.380))], df)
    assert yes.startswith("**Yes, roughly.**") and "1.33 [0.98, 1.79]" in yes and "**reproduced**" in yes
    assert "near ensemble averaging's 1" in yes and "9–47 blocks" in yes
    straddles = views.answer([_row("chinchilla_alpha", ("Chinchilla", 1.8, 1.4, 2.6))], df)
    assert straddles.startswith("**Undecided.**") and "not separated from a smooth flow's 3" in straddles
    assert views.answer([], df).startswith("**Not tested here")


def test_chapter2_answer_names_which_models_are_near_orthogonal():
    from depthlib.probes import views
    rows = [_row("tokens_evenly", ("a", 0.994, 0.993, 0.995), ("b", 0.996, 0.995, 0.997)),
            _row("middle_angle", ("a", 0.31, 0.30, 0.32), ("b", 0.29, 0.28, 0.30)),
            _row("update_angle", ("a", 1.19, 1.18, 1.20), ("b", 1.52, 1.51, 1.53))]
    text = views.answer(rows)
    assert text.startswith("**Yes in direction, not in the paper's values")            # every row differs
    assert "nearly orthogonal in b" in text and "not orthogonal in a" in text
    assert "a 0.31 [0.30, 0.32] rad" in text and "a 99.4 [99.3, 99.5] %" in text
    flow = views.answer(rows[:2] + [_row("update_angle", ("a", 0.3, 0.2, 0.4))])
    assert flow.startswith("**Partly") and "smooth flow's parallel steps in a" in flow


def test_chapter4_answer_quotes_the_crossover_and_the_one_block_step(monkeypatch):
    from depthlib.tracing import views
    groups = pd.DataFrame({"model": ["a", "b"], "n_facts": [30, 30], "late_step_from": [0.02, 0.4],
                           "late_step_to": [0.92, 0.6]})
    monkeypatch.setattr(views, "functional_groups", lambda facts, kind, baseline: groups)
    text = views.answer([_row("functional_groups", ("a", 0.67, 0.64, 0.69), ("b", 0.77, 0.75, 0.78))],
                        {"facts": None, "baseline": None})
    assert text.startswith("**Yes in outline, not at the paper's depth.**")               # 0.6 outside both
    assert "averaged over 30 facts" in text and "a 0.67 [0.64, 0.69]" in text
    assert "a: 0.02 → 0.92" in text and "b: 0.40" not in text                                # b's step is 0.2 < 0.5


def test_chapter7_answer_says_why_each_row_is_undecided():
    from depthlib.compose import views

    def row(key, *ms):
        return verdict.Row(CLAIMS[key], [verdict.Measurement(m, v, lo, hi, "cpu", note, converged=ok)
                                         for m, v, lo, hi, note, ok in ms])
    open_ = [row("hierarchical", ("untied (excess)", 1.48, 1.32, 1.64, "95 % t interval; members not certified",
                                  False)),
             row("looped_text", ("looped (text)", float("nan"), None, None, "no exponent: loss does not fall with "
                                 "depth", False))]
    text = views.answer(open_)
    assert text.startswith("**Undecided at this scale.**") and "untied (excess): 1.48 [1.32, 1.64]" in text
    assert "**undecided** because members not certified" in text and "because no exponent" in text
    assert "`paper` profile" in text                                    # what would decide it
    done = views.answer([row("hierarchical", ("untied", 1.1, 0.9, 1.3, "certified", True))])
    assert done.startswith("**Decided.**") and "**holds**" in done and "--part hierarchy" not in done
    assert views.answer([]).startswith("**Not tested here")

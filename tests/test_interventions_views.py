"""Chapter 5's worded answer and conclusion (depthlib.interventions.views) on prediction tables whose answers are
known by construction: the numbers it quotes are the table's, the controls' gap and the LMs' distance beyond them are
computed exactly, and each clause appears only when its condition holds."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from depthlib.interventions import views


def _row(statistic, k, model, v, lo, hi, scope="middle", held=True, separates=True):
    return dict(prediction=statistic, statistic=statistic, scope=scope, k=k, model=model, value=v, lo=lo, hi=hi,
                held_on_control=held, separates_controls=separates, threshold=np.nan, reading="")


def _preds(order_flow=(0.05, 0.04, 0.06), plateau_separates=False, deletion_held=False):
    rows = [
        _row("order_ratio", 4, "toy independent", 0.02, 0.019, 0.021),
        _row("order_ratio", 4, "toy tied", *order_flow),
        _row("order_ratio", 4, "lm-a", 2.0, 1.9, 2.1),
        _row("parallel_ratio", 4, "toy independent", 0.005, 0.004, 0.006, scope=""),
        _row("parallel_ratio", 4, "toy tied", 0.08, 0.07, 0.09, scope=""),
        _row("parallel_ratio", 4, "lm-a", 0.6, 0.54, 0.66, scope=""),
        _row("order_ratio", 4, "toy independent", 0.02, 0.01, 0.03, scope="plateau", separates=plateau_separates),
        _row("order_ratio", 4, "toy tied", 0.025, 0.015, 0.035, scope="plateau", separates=plateau_separates),
        _row("order_ratio", 4, "lm-a", 1.3, 1.2, 1.4, scope="plateau", separates=plateau_separates),
        _row("alpha_del", 4, "toy independent", 11.0, 10.5, 11.5, scope="", held=deletion_held),
        _row("alpha_del", 4, "toy tied", 13.0, 12.5, 13.5, scope="", held=deletion_held),
        _row("theta_update", 0, "toy independent", 1.54, 1.53, 1.55, scope=""),
        _row("theta_update", 0, "toy tied", 0.17, 0.16, 0.18, scope=""),
        _row("theta_update", 0, "lm-a", 1.2, 1.19, 1.21, scope=""),
        _row("long_lag", 0, "toy independent", 0.03, 0.02, 0.04, scope=""),
        _row("long_lag", 0, "toy tied", 0.75, 0.74, 0.76, scope=""),
        _row("long_lag", 0, "lm-a", 0.137, 0.13, 0.14, scope=""),
    ]
    return pd.DataFrame(rows)


def test_coupling_summary_gap_and_distance_beyond_both_controls_are_exact():
    c = views.coupling_summary(_preds()).set_index("statistic")
    # order: controls [0.019, 0.021] and [0.04, 0.06] are 0.019 apart; the LM's lower bound 1.9 over the larger
    # control's upper bound 0.06
    assert c.loc["order_ratio", "controls_gap"] == pytest.approx(0.04 - 0.021)
    assert c.loc["order_ratio", "beyond"] == pytest.approx(1.9 / 0.06)
    assert c.loc["parallel_ratio", "beyond"] == pytest.approx(0.54 / 0.09)
    overlapping = views.coupling_summary(_preds(order_flow=(0.03, 0.02, 0.05))).set_index("statistic")
    assert overlapping.loc["order_ratio", "controls_gap"] < 0


def test_answer_quotes_the_table_and_says_what_it_cannot_decide():
    text = views.answer(_preds())
    assert "lm-a 2.00 [1.90, 2.10]" in text and "lm-a 0.60 [0.54, 0.66]" in text
    assert "cannot decide" in text
    assert f"{0.54 / 0.09:.0f}–{1.9 / 0.06:.0f} times beyond both" in text
    assert "0.0190 apart" in text
    assert "fails on its own control" in text
    # a deletion law that held on its control is not said to fail
    assert "fails on its own control" not in views.answer(_preds(deletion_held=True))
    # controls whose reordering intervals overlap get no gap
    assert "apart" not in views.answer(_preds(order_flow=(0.03, 0.02, 0.05)))


def test_conclusion_clauses_follow_their_conditions():
    text = views.conclusion(_preds())
    assert "lm-a 1.30 [1.20, 1.40]" in text and "shown but not read" in text       # plateau: controls overlap
    assert "(k = 4)" in text and "(g = 4)" in text
    assert "fails chapter 3's fixed rule" in text                                   # long-lag 0.14 > 0.1
    assert "shown but not read" not in views.conclusion(_preds(plateau_separates=True))
    assert "chapter 7" not in text                                                  # no grammar table given


def test_grammar_order_reads_the_deepest_untied_member_with_both_edits():
    d = pd.DataFrame({"family": ["untied", "untied", "untied", "looped"], "depth": [4, 8, 12, 16],
                      "swap_delta": [1.0, 0.44, np.nan, 0.1], "swap_delta_lo": [0.5, 0.34, np.nan, 0.0],
                      "swap_delta_hi": [1.5, 0.54, np.nan, 0.2], "delete_middle_delta": [0.7, 0.19, 0.1, 0.1],
                      "delete_middle_delta_lo": [0.5, 0.06, 0.0, 0.0], "delete_middle_delta_hi": [0.9, 0.33, 0.2, 0.2]})
    text = views.grammar_order(d)
    assert "(ℓ = 8)" in text and "0.44 [0.34, 0.54]" in text and "0.19 [0.06, 0.33]" in text
    assert "Chapter 7's untied" in views.conclusion(_preds(), d).replace("In chapter 7's", "Chapter 7's")
    assert views.grammar_order(d[d["family"] == "looped"]) == ""

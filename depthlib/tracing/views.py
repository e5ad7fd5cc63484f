"""Chapter 4's answer, worded from its verdict row and its functional-groups table by stated rules, so that the prose
follows the run (no compute entry imports this module)."""
from __future__ import annotations

import pandas as pd

from depthlib import results
from depthlib.claims import Measurement
from depthlib.tracing.analysis import functional_groups

__all__ = ["ONE_BLOCK", "answer", "measurements"]

#: a late group "arrives in one block" when a single block's step carries at least this share of its rise
ONE_BLOCK = 0.5


def _facts(groups: pd.DataFrame) -> str:
    lo, hi = int(groups["n_facts"].min()), int(groups["n_facts"].max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def answer(rows, tables: dict[str, pd.DataFrame]) -> str:
    """Chapter 4's answer (Markdown): where the early (subject) group ends in each model, as the verdict table prints
    it and with its status against the paper's l/ℓ ≈ 0.6, and whether the late (last-token) group's effect arrives in
    one block (the step from ``late_step_from`` to ``late_step_to`` of :func:`~depthlib.tracing.analysis.
    functional_groups` on block restorations), which a single attention transfer would also produce."""
    from depthlib import verdict
    row = next((r for r in rows if r.claim.key == "functional_groups"), None)
    if row is None or not row.measurements:
        return "**Not tested here:** no tracing run of this profile is available."
    groups = functional_groups(tables["facts"], "block", tables["baseline"])
    numbers = verdict.numbers(row)
    lead = {"reproduced": "Yes", "differs": "Yes in outline, not at the paper's depth"}.get(row.status, "Undecided")
    text = (f"**{lead}.** Restoring the subject recovers the fact over a broad early group of blocks, restoring the "
            "last token over the late blocks, on " + ", ".join(groups["model"]) + ", averaged over "
            + _facts(groups) + " facts. The early group ends at l/ℓ = "
            + ", ".join(f"{m} {v}" for m, v in numbers.items())
            + f" (± half a block; the paper: ≈ 0.6 in Pythia-12b; **{row.status}**).")
    jumps = groups[(groups["late_step_to"] - groups["late_step_from"]) >= ONE_BLOCK]
    if len(jumps):
        text += (" But the late group's effect arrives in one block (" + ", ".join(
            f"{r.model}: {r.late_step_from:.2f} → {r.late_step_to:.2f}" for r in jumps.itertuples())
            + "), which any single attention layer that moves the fact to the last token would produce: the trace "
              "cannot tell that step from a compositional site.")
    return text


def measurements(parts: dict[str, results.Run | None]) -> dict[str, list]:
    """Chapter 4's numbers for the verdict's claims: per model, where the early (subject) group of block
    restorations ends, l/ℓ, known to ± half a block."""
    from depthlib.tracing.chapter import chapter_tables
    run = parts.get("trace")
    if run is None:
        return {}
    tables = chapter_tables(run)
    groups = functional_groups(tables["facts"], "block", tables["baseline"])
    out = []
    for _, g in groups.iterrows():
        half = 1 / (2 * g["n_layers"])      # the crossover is known to one block
        out.append(Measurement(g["model"], float(g["early_to"]), float(g["early_to"]) - half,
                               float(g["early_to"]) + half, run.profile,
                               f"{int(g['n_facts'])} facts; ± half a block; the late group's effect arrives at one "
                               f"block ({g['late_step_from']:.2f} → {g['late_step_to']:.2f})"))
    return {"functional_groups": out}

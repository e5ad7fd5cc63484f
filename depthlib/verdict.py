"""The book's verdict: one row per claim of the paper, generated from the runs the chapters show.

Each row states a claim of Liu et al. (arXiv 2602.05970), the paper's value, the book's number with its 95 %
interval, the model and profile it comes from, a status and the section that shows it. The numbers are read from
the runs each chapter's notebook shows: its own ``runs`` looked up without computing
(:func:`depthlib.selection.shown_runs`), so recomputing a chapter's run changes its rows the next time the book is
built, and a missing run leaves its rows *not tested here*.

The claims, their regions and **the status rule** are :mod:`depthlib.claims`'s.

Each chapter states its own numbers: ``measurements(parts)`` of its views module (its readers of finished runs)
turns the parts its notebook shows into one :class:`~depthlib.claims.Measurement` per claim and model. The verdict
only looks the parts up (:func:`measurements`), applies the rule and prints the rows.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pandas as pd

from depthlib import chapters as registry
from depthlib import results
from depthlib.claims import (  # noqa: F401 - the verdict's one namespace: claims, the rule and the t interval
    CLAIMS,
    PI,
    SECTIONS,
    STATUSES,
    Claim,
    Measurement,
    fmt,
    gain_range,
    region_status,
    status,
    t_interval,
)
from depthlib.errors import InputError
from depthlib.selection import shown_runs

#: how a row covering several models is summarised: the weakest status wins
_WEAKNESS = {"not tested here": 5, "contradicted": 4, "undecided": 3, "differs": 2, "holds": 0, "reproduced": 0}


@dataclass
class Row:
    claim: Claim
    measurements: list[Measurement] = field(default_factory=list)
    note: str = ""

    @property
    def status(self) -> str:
        if not self.measurements:
            return "not tested here"
        each = [status(self.claim.paper, self.claim.region, m.value, m.lo, m.hi)
                if m.converged and m.lo is not None and m.hi is not None else "undecided"
                for m in self.measurements]
        return max(each, key=_WEAKNESS.__getitem__)

    @property
    def how_much(self) -> str:
        """For a row that *differs*: how far the paper's value lies outside each interval that misses it."""
        c, out = self.claim, []
        for m in self.measurements:
            if (c.paper is None or m.lo is None or m.hi is None or not m.converged
                    or status(c.paper, c.region, m.value, m.lo, m.hi) != "differs"):
                continue
            k = 100.0 if c.percent else 1.0
            gap, side = (c.paper - m.hi, "above") if c.paper > m.hi else (m.lo - c.paper, "below")
            out.append(f"the paper's value is {fmt(k * gap, c.digits)}{' points' if c.percent else ''} {side} "
                       + (f"{m.model}'s interval" if len(self.measurements) > 1 else "the interval"))
        return "; ".join(out)

    @property
    def why(self) -> str:
        """What the status alone does not say: for a row that *differs*, by how much (:attr:`how_much`); for an
        *undecided* one, what keeps each of its undecided measurements from deciding."""
        if self.status == "differs":
            return self.how_much
        if self.status != "undecided":
            return ""
        labels = short_labels([m.model for m in self.measurements])
        reasons = [(label, undecided_because(self.claim, m)) for label, m in zip(labels, self.measurements)]
        return "; ".join(why if len(self.measurements) == 1 else f"{label}: {why}" for label, why in reasons if why)


def short_labels(models: Sequence[str]) -> list[str]:
    """The labels of a row's several models, as short as still tells them apart: the text before the first comma
    ("looped, effective depths 3, 4 (unseen RHM; root error)" → "looped"), and where that is not unique, with what
    its parenthesis says that the others' do not ("untied (root error)"); else the whole labels. One model keeps its
    whole label (its depths or teacher are then what the cell says)."""
    if len(models) < 2:
        return list(models)
    heads = [m.split(",")[0] for m in models]
    if len(set(heads)) == len(heads):
        return heads
    notes = [m[m.rfind("(") + 1:m.rfind(")")].split("; ") if m.endswith(")") else [] for m in models]
    shared = set.intersection(*map(set, notes))
    own = [[x for x in n if x not in shared] for n in notes]
    out = [f"{h} ({'; '.join(o)})" for h, o in zip(heads, own)]
    return out if all(own) and len(set(out)) == len(out) else list(models)


def undecided_because(claim: Claim, m: Measurement) -> str:
    """Why ``m`` cannot decide ``claim`` ("" where it decides): no number (the row's note says why; how many students
    are certified); students or models not certified (how many are, and what the others' last continuations still
    gained); no interval; or an interval across an edge of the claim's region."""
    if not math.isfinite(m.value):
        return "no result" + (f" ({m.certified[0]} of {m.certified[1]} certified)" if m.certified else "")
    if not m.converged:
        if m.certified is None:
            return "not certified"
        text = f"{m.certified[0]} of {m.certified[1]} certified"
        if m.gaining is not None:
            text += f"; the others' last continuations still gained {gain_range(m.gaining)}"
        return text
    if m.lo is None or m.hi is None or not (math.isfinite(m.lo) and math.isfinite(m.hi)):
        return "no interval"
    if status(claim.paper, claim.region, m.value, m.lo, m.hi) != "undecided":
        return ""
    k, (r_lo, r_hi) = (100.0 if claim.percent else 1.0), claim.region
    edges = [e for e, crossed in ((r_lo, m.lo < r_lo <= m.hi), (r_hi, m.lo <= r_hi < m.hi)) if crossed]
    return "the interval reaches across the region's edge " + " and ".join(fmt(k * e, claim.digits) for e in edges)


# ---- the numbers: each chapter's own ``measurements`` of the runs its notebook shows ---------------------------
def measurements(chapter: int, profile: str = "cpu", *, rerun: bool = False) -> dict[str, list[Measurement]]:
    """{claim key: measurements} of chapter ``chapter`` for ``profile``: ``measurements(parts)`` of its views module
    (:attr:`depthlib.chapters.Chapter.views_module`) on the runs its notebook shows, by part (its own ``runs``, looked
    up without computing: :func:`depthlib.selection.shown_runs`; a part without a run is None). Every key must be a
    claim of that chapter."""
    c = registry.by_name(str(chapter))
    module = c.module
    parts = shown_runs(module.runs, profile, rerun=rerun,
                       **({"parts": module.SHOWN_PARTS} if hasattr(module, "SHOWN_PARTS") else {}))
    found = c.views_module.measurements(parts)
    stray = set(found) - {claim.key for claim in CLAIMS if claim.chapter == c.number}
    if stray:
        raise ValueError(f"{c.views_module.__name__}.measurements gives numbers for no claim of chapter {c.number}: "
                         f"{', '.join(sorted(stray))}")
    return found


NOTES = {
    "tokens_evenly": "the two-cluster split tests only \"does not stop early\"; the small cluster is about the "
                     "position-0 share (one first token per document)",
    "angle_depth": "both ensemble averaging and procedural assembly predict 1/ℓ: this row cannot tell them apart",
    "functional_groups": "with window-1 restoration any single attention transfer makes a one-block step, so the "
                         "trace cannot tell a compositional site from an ensemble",
    "order_matters_little": "not a claim of the paper; a prediction of the ensemble reading",
    "hierarchical": "the untied family on the grammar (the first grammar: two laws, the excess over the exact "
                    "Bayes loss and the paper's form with a free floor; the unseen control: the certified quantity of "
                    "each task)",
    "looped": "one row for the looped and the fully tied family (the weakest status wins)",
    "looped_toy_flow": "with the next row, a calibration of reuse on a known target: chapter 3's tied teacher is one "
                       "block reused, and a looped student starting from that block follows it",
    "looped_toy_plateau": "where the untied students of the same teacher keep gaining with depth, the looped "
                          "students' loss stops falling: one block reused does not stand in for 128 different ones",
    "looped_text": "one seed (the interval is over held-out documents); where the loss does not fall "
                   "with effective depth, or one depth moves the fit to a bound, no exponent is given: the run "
                   "cannot decide",
}


def verdict(profile: str = "cpu", *, rerun: bool = False, chapters: Sequence[int] | None = None) -> list[Row]:
    """One :class:`Row` per claim (in :data:`CLAIMS` order), from the runs the chapters show for ``profile``."""
    results.check_profile(profile)
    claimed = [c.number for c in registry.CHAPTERS if any(claim.chapter == c.number for claim in CLAIMS)]
    wanted = set(claimed) if chapters is None else set(chapters)
    found: dict[str, list[Measurement]] = {}
    failed: dict[int, str] = {}
    for number in claimed:
        if number in wanted:
            try:
                found.update(measurements(number, profile, rerun=rerun))
            except Exception as err:  # noqa: BLE001 - one unreadable chapter must not hide the others' rows
                failed[number] = f"{type(err).__name__}: {err}"
                print(f"[depthlib verdict] chapter {number}: {failed[number]}", file=sys.stderr)
    rows = []
    for c in CLAIMS:
        if c.chapter not in wanted:
            continue
        # a run without a number it can stand behind (value NaN) leaves its row undecided, never untested
        ms = [m for m in found.get(c.key, []) if m.value is not None
              and (math.isfinite(m.value) or not m.converged)]
        # a number from students that are still improving decides nothing: say how many were not converged
        note = "; ".join(n for n in (NOTES.get(c.key, ""),
                                     *(m.note for m in ms if not m.converged and m.note)) if n)
        if c.chapter in failed:
            note = f"its run could not be read ({failed[c.chapter]})"
        rows.append(Row(c, ms, note))
    return rows


# ---- how the book prints it ------------------------------------------------------------------------------
def numbers(row: Row) -> dict[str, str]:
    """{model: "value [lo, hi]"} of a row, printed as the verdict table prints them (a chapter's answer quotes these,
    so its numbers are the table's); several models by their :func:`short_labels`."""
    c = row.claim
    return {label: m.text(c.digits, c.percent)
            for label, m in zip(short_labels([m.model for m in row.measurements]), row.measurements)}


def table(rows: Sequence[Row]) -> pd.DataFrame:
    """The verdict as a reader's table: one row per claim, numbers formatted, no NaN cells."""
    out = []
    for r in rows:
        c = r.claim
        ms = r.measurements
        out.append({
            "chapter": c.chapter, "claim": c.claim, "paper": c.paper_text,
            "this book (95 % interval)": "; ".join(f"{label}: {text}" for label, text in numbers(r).items()) or "—",
            "profile": ", ".join(sorted({m.profile or "?" for m in ms})) or "—",
            "status": r.status + (f" ({r.why})" if r.why else ""), "holds if": c.region_text})
    return pd.DataFrame(out)


def markdown(rows: Sequence[Row], link: Callable[[Claim], str] | None = None) -> str:
    """A MyST markdown table of the rows; ``link`` gives each row's section link (default: a ``{ref}`` role)."""
    link = link or (lambda c: f"{{ref}}`ch. {c.chapter} <{c.section}>`")
    lines = ["| claim | paper | holds if | this book: value [95 % interval] · model | profile | status | section |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.claim
        numbers = "<br>".join(f"{m.text(c.digits, c.percent)} · {m.model}" for m in r.measurements) or "—"
        note = f" <br><small>{r.note}</small>" if r.note else ""
        profile = ", ".join(sorted({m.profile or "?" for m in r.measurements})) or "—"
        much = f" <br><small>{r.why}</small>" if r.why else ""
        lines.append(f"| {c.claim}{note} | {c.paper_text} | {c.region_text} | {numbers} | {profile} | "
                     f"**{r.status}**{much} | {link(c)} |")
    return "\n".join(lines) + "\n"


RULE_TEXT = ("**How a status is decided.** Each claim holds *qualitatively* in a region of values bounded half-way "
             "between the paper's value and what the rival mechanism predicts (column *holds if*). A 95 % interval "
             "wholly outside the region: **contradicted**; reaching outside it: **undecided** (the run cannot "
             "decide, and the row says why); inside it and containing the paper's value: **reproduced**; inside it "
             "but missing the paper's value: **differs** (the direction holds, the number does not); for the book's "
             "own predictions (no paper value), inside it: **holds**; no run: **not tested here**. A number from "
             "students or models that are still improving (not certified), or a number without an interval, is "
             "**undecided**. A row over several models shows the weakest status.")


def chapter_table(chapter: int, profile: str = "cpu", *, rerun: bool = False) -> pd.DataFrame:
    """The compact verdict table of one chapter, for its conclusion: one row per claim, indexed by the claim."""
    rows = verdict(profile, rerun=rerun, chapters=[chapter])
    cols = ["claim", "paper", "holds if", "this book (95 % interval)", "profile", "status"]
    return table(rows)[cols].set_index("claim")


def chapter_summary(chapter: int, profile: str = "cpu", *, rerun: bool = False) -> str:
    """One markdown bullet per claim of a chapter: the book's number and the status (a chapter's opening answer)."""
    lines = []
    for r in verdict(profile, rerun=rerun, chapters=[chapter]):
        c = r.claim
        numbers = "; ".join(f"{m.model}: {m.text(c.digits, c.percent)}" for m in r.measurements) or "no run"
        lines.append(f"- {c.claim} (paper: {c.paper_text}; holds if {c.region_text}) — {numbers} → **{r.status}**"
                     + (f" ({r.measurements[0].note})" if r.measurements and r.measurements[0].note else ""))
    return "\n".join(lines)


def reductions(profile: str = "cpu") -> list[str]:
    """One line per chapter (:data:`depthlib.chapters.CHAPTERS`): how the ``profile``'s runs are reduced against the
    paper's (steps, tokens, models, replicates), each chapter's own ``reduction``, read from its ``PROFILES``."""
    results.check_profile(profile)
    return [f"**{c.number}.** {c.module.reduction(profile)}" for c in registry.CHAPTERS]


#: the box every page built from ``smoke`` runs carries
PLACEHOLDER_BOX = ("```{warning}\n**Placeholder numbers.** This page was built from `smoke` runs, which only prove that "
                   "the code runs end to end: their numbers mean nothing. Build with `make book` (profile `cpu`) for "
                   "the book's results.\n```")


def tally(rows: Sequence[Row]) -> str:
    """How many claims have each status: "20 claims: 2 reproduced, …, 1 contradicted"."""
    counts = pd.Series([r.status for r in rows]).value_counts()
    return f"{len(rows)} claims: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if s in counts)


#: the further numbers (:attr:`Measurement.facts`) each claim's row offers the prose, ``<key>_<name>``
FACTS = {"tied_alpha": ("without_shallowest", "rounds"), "independent_alpha": ("without_shallowest", "rounds"),
         "low_t_incomplete": ("far_from_pool",), "looped_toy_flow": ("scratch",),
         "hierarchical": ("ngram_ratio", "signs", "edits")}


def substitutions(rows: Sequence[Row]) -> dict[str, str]:
    """What the hand-written pages quote from the verdict, by name, for MyST's ``{{ name }}`` substitutions (the book build
    puts them in the staged ``_config.yml``): ``tally`` (:func:`tally`), ``n_<status>`` (spaces as ``_``), and for each
    claim ``<key>_status``, ``<key>_value`` (its numbers as the table prints them, "; "-joined with the model where a
    row has several; "no run" without one) and ``<key>_certified`` ("2 of 18" students or members certified where a
    continuation certifies them, per model as the values; else "no certificate") and ``<key>_gains`` ("4.3–11.7 %":
    what the last continuations of the others still gained; else "not measured") and ``<key>_<fact>`` for the
    further numbers of :data:`FACTS` ("not measured" where a run has none). Every name exists for every profile.
    So a recomputed run changes the prose that quotes it, as it changes the table."""
    out = {"tally": tally(rows)}
    out |= {f"n_{s.replace(' ', '_')}": str(sum(r.status == s for r in rows)) for s in STATUSES}
    for r in rows:
        k, shown = r.claim.key, numbers(r)
        out[f"{k}_status"] = r.status
        out[f"{k}_value"] = _per_model(shown, "no run")
        labels = list(zip(short_labels([m.model for m in r.measurements]), r.measurements))
        out[f"{k}_certified"] = _per_model({label: f"{m.certified[0]} of {m.certified[1]}" for label, m in labels
                                            if m.certified is not None}, "no certificate")
        out[f"{k}_gains"] = _per_model({label: gain_range(m.gaining) for label, m in labels
                                        if m.gaining is not None}, "not measured")
        for name in FACTS.get(k, ()):
            out[f"{k}_{name}"] = _per_model({label: m.facts[name] for label, m in labels if name in m.facts},
                                            "not measured")
    return out


def _per_model(texts: dict[str, str], none: str) -> str:
    """One model's text as it is; several models' "; "-joined, each with its model; ``none`` without any."""
    if len(texts) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"{model}: {text}" for model, text in texts.items()) or none


def book_page(profile: str = "cpu", *, rerun: bool = False, rows: Sequence[Row] | None = None) -> str:
    """The verdict as the book's intro includes it: the count of each status, the table, how a status is decided, and
    how reduced the runs are. Regenerated at every build, so a recomputed run changes it. ``rows``: the verdict of
    ``profile`` if already computed."""
    rows = verdict(profile, rerun=rerun) if rows is None else rows
    lines = [PLACEHOLDER_BOX, ""] if profile == "smoke" else []
    lines += [f"**{tally(rows)}.**", "", "```{container} verdict", markdown(rows), "```", "", RULE_TEXT,
              "",
             f"**How reduced these runs are** (profile `{profile}`; every number above can change at the paper's "
             "scale):", ""]
    lines += [f"- {line}" for line in reductions(profile)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m depthlib.verdict [--profile cpu] [--markdown]`` prints the verdict of the runs found."""
    parser = argparse.ArgumentParser(prog="python -m depthlib.verdict", description=main.__doc__)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--markdown", action="store_true", help="print the book's markdown (the intro's verdict)")
    args = parser.parse_args(argv)
    try:
        rows = verdict(args.profile)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.markdown:
        print(book_page(args.profile))
    else:
        with pd.option_context("display.max_colwidth", 90, "display.width", 250):
            print(table(rows).drop(columns="holds if").to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The book's hand-written pages state only numbers its chapters print.

The intro's summary ("What the book concludes today") and the theory page are prose written by hand; the chapters'
answers, tables and conclusions are generated from the committed runs. Every interval ("2.59 [2.57, 2.60]"), count
("2 of 18") and range of per cent ("4.3–11.7 %") the hand-written pages state must therefore appear in a committed
notebook's outputs, so that a recomputed run whose numbers move makes this test fail until the prose is mended.
What the pages quote from the verdict is not written by hand: ``{{ name }}`` is a MyST substitution the build fills in
from the verdict (:func:`depthlib.verdict.substitutions`); the pages are checked as rendered from the committed runs.
(The verdict table the intro includes is generated at build time: tests/test_verdict.py.)
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "book" / "intro.md", ROOT / "book" / "theory.md"]
_NUM = r"[−+-]?\d+(?:\.\d+)?"
#: what a page states that a chapter must print: an interval, a count, a range of per cent
STATED = re.compile(rf"{_NUM} \[{_NUM}, {_NUM}\]|\d+ of (?:the )?\d+|\d+(?:\.\d+)?–\d+(?:\.\d+)? %")


def _flat(text: str) -> str:
    """Text as a reader sees it: HTML tags and entities gone, whitespace single, "N of the M" read as "N of M"."""
    text = re.sub(r"<[^>]+>", " ", html.unescape(text))
    return re.sub(r"\s+", " ", text).replace(" of the ", " of ")


def printed(notebooks: list[Path]) -> str:
    """Everything the committed notebooks print (their outputs: text, Markdown, HTML tables), flattened."""
    out = []
    for path in notebooks:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            for o in cell.get("outputs", []):
                data = o.get("data", {})
                out += ["".join(data[k]) for k in ("text/plain", "text/markdown", "text/html") if k in data]
                out.append("".join(o.get("text", "")))
    return _flat("\n".join(out))


SUBSTITUTION = re.compile(r"{{\s*(\w+)\s*}}")


def rendered(page: str, substitutions: dict[str, str]) -> str:
    """``page`` as the book shows it: every ``{{ name }}`` replaced by its substitution."""
    return SUBSTITUTION.sub(lambda m: substitutions[m.group(1)], page)


@pytest.fixture(scope="module")
def substitutions() -> dict[str, str]:
    """What the book build substitutes (:func:`depthlib.book.write_verdict`), from the committed ``cpu`` runs."""
    from depthlib import verdict
    return verdict.substitutions(verdict.verdict("cpu"))


def unprinted(page: str, chapters: str) -> list[str]:
    """The intervals, counts and ranges ``page`` states that ``chapters`` (:func:`printed`) does not print."""
    stated = dict.fromkeys(STATED.findall(_flat(page)))
    return [n for n in stated if n not in chapters]


def test_a_number_the_chapters_do_not_print_is_found():
    chapters = _flat("<p>α_ℓ = 2.59 [2.57, 2.60]; 2 of 18 students certified; gains 4.3–11.7 %</p>")
    page = "gives 2.59 [2.57, 2.60], and 2 of the 18 are certified (4.3–11.7 %); at T = 0.01, 1.70 [1.55, 1.86], 3 of 4"
    assert unprinted(page, chapters) == ["1.70 [1.55, 1.86]", "3 of 4"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_substitution_a_page_quotes_is_one_the_verdict_gives(page, substitutions):
    quoted = set(SUBSTITUTION.findall(page.read_text(encoding="utf-8")))
    assert quoted <= set(substitutions), f"{page.name} quotes unknown substitutions {sorted(quoted - set(substitutions))}"


def test_the_intro_quotes_its_calibration_numbers_and_statuses_from_the_verdict():
    """The numbers and statuses the intro's summary rests on are generated, not typed: the tally, the calibration's
    three rows, the looped toy's two and the hierarchy control's reading."""
    quoted = set(SUBSTITUTION.findall((ROOT / "book" / "intro.md").read_text(encoding="utf-8")))
    assert {"tally", "tied_alpha_value", "independent_alpha_value", "tied_minus_independent_value",
            "tied_minus_independent_status", "tied_alpha_certified", "tied_alpha_gains", "independent_alpha_gains",
            "looped_toy_flow_value", "tied_alpha_without_shallowest", "independent_alpha_rounds",
            "low_t_incomplete_far_from_pool", "hierarchical_certified", "hierarchical_gains",
            "looped_toy_flow_scratch", "hierarchical_ngram_ratio", "hierarchical_signs", "hierarchical_edits"} <= quoted


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_hand_written_pages_type_no_interval_count_or_range(page):
    """An interval, count or range of per cent on a hand-written page is quoted from the verdict ({{ name }}), never
    typed: a typed one goes stale silently when a run is recomputed (the next test only notices if no chapter prints
    it any more)."""
    assert not STATED.findall(_flat(page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_hand_written_pages_state_only_numbers_the_chapters_print(page, substitutions):
    chapters = printed(sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    text = rendered(page.read_text(encoding="utf-8"), substitutions)
    assert not unprinted(text, chapters), (
        f"{page.name} states numbers no committed chapter prints (a run moved, or the prose is wrong): "
        f"{unprinted(text, chapters)}")

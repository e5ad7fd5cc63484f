"""The built book as a reader meets it: every page of ``_toc.yml`` opened in headless Chromium, from file://.

Builds the book on the smoke profile (HTML in ``_build/browser-test/html``; :data:`PROFILE` names another), then fails
if any page logs a console error or a request fails (the book must work with no network), if a plotly figure draws no
mark (an empty axis), if a chapter's figures are missing, if anything in a chapter's main column is wider than its box
at a 1280 x 900 window (clipped, or sticking out over the margin), if the intro does not name every chapter of
``_toc.yml``, or if its verdict table lacks a row with a status for a claim. Full-page screenshots go to
``_build/browser/`` (:data:`SHOTS`) for a human look.

Every page is also read as a reader reads its figures and tables (``tests/figure_checks.py``, each check proven able to
fail in ``tests/test_figure_checks.py``): no axis title over the figure's title or another axis title, at least two
tick labels on every axis, no label printed over another, data filling at least a quarter of every axis, every colour
that distinguishes data named, and no table cell cut short.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests import figure_checks

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Console errors that are known and harmless (none: sphinx-thebe's doubled config script is removed by
#: book/_ext/book_chrome.py).
HARMLESS_CONSOLE: tuple[str, ...] = ()
#: The profile the book is built on: ``smoke`` by default (minutes, as in ``make test``);
#: ``DEPTHLIB_BROWSER_PROFILE=cpu`` checks the book as readers get it (the committed runs, as ``make book`` builds it).
PROFILE = os.environ.get("DEPTHLIB_BROWSER_PROFILE", "smoke")
#: where the full-page screenshots go
SHOTS = ROOT / "_build" / ("browser" if PROFILE == "smoke" else f"browser-{PROFILE}")
#: The reader's window (a laptop screen).
VIEWPORT = {"width": 1280, "height": 900}
#: Elements that may scroll sideways on purpose: only what a page marks so (book/depthlib.css gives the class
#: ``depthlib-scroll`` a scroll bar). Code and text outputs wrap (book/depthlib.css), so anything else in the main
#: column that is wider than its box (code, tables, figures, math, provenance lines) fails.
SCROLLABLE = ".depthlib-scroll"
#: Elements not checked at all: MathJax's internals (glyph boxes; the formula's own box is checked), plotly's internals
#: (the figure's box is checked) and widget internals (the widget's box is checked).
IGNORED = "mjx-container *, .js-plotly-plot *, .jupyter-widgets *"
#: Elements only checked for staying inside the main column: inline math is a few px wider than its box (italic
#: overhangs of MathJax glyphs), which clips nothing.
INLINE = "span.math, mjx-container:not([display='true'])"
#: For every element of the main column that is wider than its box (scrollWidth > clientWidth) or sticks out of the
#: main column, one line saying what it is; intentionally scrollable elements are skipped.
OVERFLOW_JS = """([scrollable, ignored, inline]) => {
  const main = document.querySelector('article.bd-article') || document.querySelector('main');
  const column = main.getBoundingClientRect();
  const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    ((typeof el.className === 'string' && el.className.trim()) ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
  const bad = [], flagged = [];
  const pageWide = document.documentElement.scrollWidth - document.documentElement.clientWidth;
  if (pageWide > 1) bad.push(`the page scrolls sideways by ${pageWide} px`);
  for (const el of main.querySelectorAll('*')) {
    if (el.matches(ignored) || el.closest(scrollable) || flagged.some(f => f.contains(el))) continue;
    const cs = getComputedStyle(el);
    if (cs.display === 'none' || cs.display === 'inline' || cs.visibility === 'hidden') continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if (el.scrollWidth > el.clientWidth + 1 && !el.matches(inline)) {
      flagged.push(el);   // report the outermost box only, not everything inside it
      bad.push(`${name(el)}: content ${el.scrollWidth} px wide in a ${el.clientWidth} px box (overflow-x ${cs.overflowX})`);
    } else if (r.right > column.right + 1 || r.left < column.left - 1) {
      flagged.push(el);
      bad.push(`${name(el)}: spans ${Math.round(r.left)}-${Math.round(r.right)} px, the main column ` +
               `${Math.round(column.left)}-${Math.round(column.right)} px`);
    }
  }
  return bad;
}"""


def _plotly_outputs(notebook: Path) -> int:
    nb = json.loads(notebook.read_text())
    return sum("Plotly.newPlot" in "".join(out.get("data", {}).get("text/html", ""))
               for cell in nb["cells"] for out in cell.get("outputs", []))


@pytest.fixture(scope="module")
def built_book():
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    pytest.importorskip("playwright.sync_api", reason="playwright (pip) drives Chromium")
    from depthlib import book
    out = ROOT / "_build" / ("browser-test" if PROFILE == "smoke" else f"browser-test-{PROFILE}")
    html = book.build_book(profile=PROFILE, out=out)
    return html, out / "stage"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                                    "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def _open(browser, url: str, shot: Path | None):
    page = browser.new_page(viewport=VIEWPORT)
    failed, errors = [], []
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="load")
    page.wait_for_timeout(1500)
    if shot is not None:
        _screenshot(page, shot)
    return page, failed, [e for e in errors if not any(h in e for h in HARMLESS_CONSOLE)]


def _screenshot(page, shot: Path) -> None:
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)


CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _toc_files() -> list[str]:
    """Every page of the book as ``_toc.yml`` lists it (root first), e.g. 'book/intro', 'notebooks/01_scaling'."""
    import yaml
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part.get("chapters", [])]
    return files


#: For every plotly figure on a page: how many marks it draws (points, line and fill paths with real coordinates,
#: bars, heat-map images, text). A figure with traces but no mark is an empty axis (e.g. category strings on a
#: linear axis).
MARKS_JS = """() => { const TRACE_LAYERS = ['scatterlayer', 'barlayer', 'boxlayer', 'violinlayer', 'heatmaplayer',
      'contourlayer', 'imagelayer', 'funnellayer', 'waterfalllayer'].map(c => '.cartesianlayer .' + c + ' *')
      .concat(['.polarlayer .trace *', '.ternarylayer .trace *']).join(', ');
  return [...document.querySelectorAll('.js-plotly-plot')].map(gd => {
  const marks = [...gd.querySelectorAll(TRACE_LAYERS)].filter(el => {
    const tag = el.tagName.toLowerCase();
    if (tag === 'path') { const d = el.getAttribute('d') || ''; return d.length > 2 && !d.includes('NaN'); }
    if (tag === 'image' || tag === 'text' || tag === 'rect') {
      const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0;
    }
    return false;
  });
  return marks.length;
}); }"""


def test_intro_page(built_book, browser):
    html, _ = built_book
    page, failed, errors = _open(browser, (html / "index.html").as_uri(), SHOTS / "index.png")
    assert not failed, f"requests failed: {failed}"
    assert not errors, f"console errors: {errors}"
    # MathJax is vendored and typesets the law
    assert page.locator("mjx-container").count() > 0, "MathJax did not typeset the intro"
    page.close()


def test_intro_names_every_chapter_of_the_toc(built_book, browser):
    html, _ = built_book
    page, _, _ = _open(browser, (html / "index.html").as_uri(), None)
    links = page.evaluate("() => [...document.querySelectorAll('article.bd-article a')].map(a => a.href)")
    chapters = [f for f in _toc_files() if f.startswith("notebooks/")]
    assert chapters, "_toc.yml lists no chapter"
    missing = [f for f in chapters if not any(link.split("#")[0].endswith(f + ".html") for link in links)]
    assert not missing, f"the intro does not link to {missing}"
    page.close()


def test_intro_verdict_has_a_row_per_claim_with_a_status(built_book, browser):
    from depthlib import verdict
    html, _ = built_book
    page, _, _ = _open(browser, (html / "index.html").as_uri(), None)
    rows = page.evaluate("""() => [...document.querySelectorAll('div.verdict table tbody tr')]
        .map(tr => [...tr.querySelectorAll('td')].map(td => td.innerText.trim()))""")
    header = page.evaluate("""() => [...document.querySelectorAll('div.verdict table thead th')]
        .map(th => th.innerText.trim())""")
    assert "holds if" in header, header                 # the region each status is decided against
    at = header.index("status")
    assert len(rows) == len(verdict.CLAIMS), f"{len(rows)} verdict rows for {len(verdict.CLAIMS)} claims"
    for claim, row in zip(verdict.CLAIMS, rows):
        shown = row[0].replace("\u2019", "'")          # Sphinx's smart quotes turn ' into ’ in the page
        assert shown.startswith(claim.claim), (claim.claim, row[0])
        status = row[at].splitlines()[0].strip()        # a 'differs' cell says by how much on its next line
        assert status in verdict.STATUSES, f"row {claim.key} has status {row[at]!r}"
    # the first screen shows the verdict, and a smoke build says its numbers are placeholders
    top = page.evaluate("() => document.querySelector('div.verdict').getBoundingClientRect().top")
    assert top < 2 * VIEWPORT["height"], f"the verdict starts {top:.0f} px down the intro"
    if PROFILE == "smoke":
        assert page.get_by_text("Placeholder numbers").count() > 0, "a smoke build must say its numbers are placeholders"
    page.close()


@pytest.mark.parametrize("file", _toc_files())
def test_every_page_has_no_console_error_and_every_figure_draws_a_mark(built_book, browser, file):
    html, _ = built_book
    url = (html / "index.html").as_uri() if file == _toc_files()[0] else (html / f"{file}.html").as_uri()
    page, failed, errors = _open(browser, url, None)
    assert not failed, f"{file}: requests failed: {failed}"
    assert not errors, f"{file}: console errors: {errors}"
    marks = page.evaluate(MARKS_JS)
    empty = [i for i, n in enumerate(marks) if n == 0]
    assert not empty, f"{file}: plotly figure(s) {empty} draw no mark"
    # page titles carry no raw LaTeX (the sidebar and the search index show them as text)
    titles = page.evaluate("() => [...document.querySelectorAll('nav.bd-links a, h1')].map(a => a.innerText)")
    assert not [t for t in titles if "\\(" in t or "$" in t], f"{file}: raw LaTeX in titles {titles}"
    page.close()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_figures_are_drawn(built_book, browser, chapter):
    html, stage = built_book
    expected = _plotly_outputs(stage / "notebooks" / f"{chapter}.ipynb")
    assert expected > 0, f"{chapter} has no plotly figure in its executed outputs"
    page, failed, errors = _open(browser, (html / "notebooks" / f"{chapter}.html").as_uri(),
                                 SHOTS / f"{chapter}.png")
    assert not failed, f"requests failed: {failed}"
    assert not errors, f"console errors: {errors}"
    plots = page.locator(".js-plotly-plot")
    assert plots.count() == expected, f"{plots.count()} plotly figures on the page, {expected} in the notebook"
    drawn = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .map(gd => gd.querySelectorAll('.main-svg').length > 0 && (gd.data || []).length > 0)""")
    assert all(drawn), f"figures not drawn: {[i for i, d in enumerate(drawn) if not d]}"
    page.close()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_nothing_is_clipped_at_1280px(built_book, browser, chapter):
    html, _ = built_book
    page, _, _ = _open(browser, (html / "notebooks" / f"{chapter}.html").as_uri(), None)
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")   # math typeset
    too_wide = page.evaluate(OVERFLOW_JS, [SCROLLABLE, IGNORED, INLINE])   # before a full-page shot resizes the page
    _screenshot(page, SHOTS / f"{chapter}-layout.png")
    assert not too_wide, f"{chapter} at 1280 px: " + "; ".join(too_wide[:12])
    page.close()


def test_chapter1_slider_works_without_a_kernel(built_book, browser):
    html, _ = built_book
    page, failed, _ = _open(browser, (html / "notebooks" / "01_scaling.html").as_uri(),
                            SHOTS / "01_slider_before.png")
    gd = page.locator(".js-plotly-plot").first
    gd.scroll_into_view_if_needed()
    title_before = page.evaluate("() => document.querySelector('.js-plotly-plot').layout.title.text")
    visible_before = page.evaluate("() => document.querySelector('.js-plotly-plot').data.map(t => t.visible)")
    rail = gd.locator(".slider-rail-rect").first
    box = rail.bounding_box()
    page.mouse.click(box["x"] + 0.05 * box["width"], box["y"] + box["height"] / 2)
    page.wait_for_timeout(500)
    title_after = page.evaluate("() => document.querySelector('.js-plotly-plot').layout.title.text")
    visible_after = page.evaluate("() => document.querySelector('.js-plotly-plot').data.map(t => t.visible)")
    page.screenshot(path=str(SHOTS / "01_slider_after.png"))
    assert title_after != title_before and title_after, "the slider did not change the title"
    assert visible_after != visible_before, "the slider did not switch the visible fit"
    assert not failed
    page.close()


@pytest.fixture(scope="module")
def legibility(built_book, browser):
    """page -> check -> problems, for every page of ``_toc.yml`` (:func:`figure_checks.run_checks`)."""
    html, _ = built_book
    report = {}
    for file in _toc_files():
        url = (html / "index.html").as_uri() if file == _toc_files()[0] else (html / f"{file}.html").as_uri()
        page, _, _ = _open(browser, url, None)
        report[file] = figure_checks.run_checks(page)
        page.close()
    return report


def _problems(report: dict, check: str) -> list[str]:
    return [f"{file}: {p}" for file, checks in report.items() for p in checks[check]]


#: each defect class the reader met, the legibility report's key for it and what it asserts
LEGIBILITY_CHECKS = {
    "axis_titles": "axis titles clear the figure title and each other",
    "tick_labels": "every axis shows at least two tick labels",
    "labels_overlap": "no label is printed over another",
    "data_span": "data fill at least a quarter of every axis",
    "colours_named": "every colour that distinguishes data is named",
    "table_cells": "no table cell is cut short",
}


@pytest.mark.parametrize("check", LEGIBILITY_CHECKS)
def test_figures_and_tables_are_legible(legibility, check):
    bad = _problems(legibility, check)
    assert not bad, f"{LEGIBILITY_CHECKS[check]}:\n" + "\n".join(bad)


def test_search_from_file_finds_pages_without_console_errors(built_book, browser):
    """Sphinx's search fetches each result page for a summary, which a browser refuses from file:// (CORS): the book
    switches the summaries off there (book/_ext/book_chrome.py), so a reader searching a local build sees results and
    the console stays clean."""
    html, _ = built_book
    page, failed, errors = _open(browser, (html / "search.html").as_uri() + "?q=depth", None)
    page.wait_for_timeout(2500)
    found = page.evaluate("() => document.querySelectorAll('#search-results li').length")
    assert found > 0, "the search found no page for 'depth'"
    assert not failed, f"requests failed: {failed}"
    assert not errors, f"console errors: {errors}"
    page.close()

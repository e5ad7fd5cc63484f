"""The built book as a reader meets it: every chapter page opened in headless Chromium, from file://.

Builds the book on the smoke profile, then fails if a chapter's plotly figures are not drawn, if any request
fails (the book must work with no network), or if a page logs an unexpected console error. Screenshots go to
``_build/browser/`` for a human look.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Console errors that are known and harmless: sphinx-thebe 0.3.1 emits its config script twice under Sphinx 7.4.
HARMLESS_CONSOLE = ("THEBE_JS_URL",)


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
    out = ROOT / "_build" / "browser-test"
    html = book.build_book(profile="smoke", out=out)
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


def _open(browser, url: str, shot: Path):
    page = browser.new_page(viewport={"width": 1280, "height": 1800})
    failed, errors = [], []
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="load")
    page.wait_for_timeout(1500)
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=False)
    return page, failed, [e for e in errors if not any(h in e for h in HARMLESS_CONSOLE)]


CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_intro_page(built_book, browser):
    html, _ = built_book
    page, failed, errors = _open(browser, (html / "index.html").as_uri(), ROOT / "_build" / "browser" / "index.png")
    assert not failed, f"requests failed: {failed}"
    assert not errors, f"console errors: {errors}"
    # MathJax is vendored and typesets the law
    assert page.locator("mjx-container").count() > 0, "MathJax did not typeset the intro"
    page.close()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_figures_are_drawn(built_book, browser, chapter):
    html, stage = built_book
    expected = _plotly_outputs(stage / "notebooks" / f"{chapter}.ipynb")
    assert expected > 0, f"{chapter} has no plotly figure in its executed outputs"
    page, failed, errors = _open(browser, (html / "notebooks" / f"{chapter}.html").as_uri(),
                                 ROOT / "_build" / "browser" / f"{chapter}.png")
    assert not failed, f"requests failed: {failed}"
    assert not errors, f"console errors: {errors}"
    plots = page.locator(".js-plotly-plot")
    assert plots.count() == expected, f"{plots.count()} plotly figures on the page, {expected} in the notebook"
    drawn = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .map(gd => gd.querySelectorAll('.main-svg').length > 0 && (gd.data || []).length > 0)""")
    assert all(drawn), f"figures not drawn: {[i for i, d in enumerate(drawn) if not d]}"
    page.close()


def test_chapter1_slider_works_without_a_kernel(built_book, browser):
    html, _ = built_book
    page, failed, _ = _open(browser, (html / "notebooks" / "01_chinchilla_fit.html").as_uri(),
                            ROOT / "_build" / "browser" / "01_slider_before.png")
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
    page.screenshot(path=str(ROOT / "_build" / "browser" / "01_slider_after.png"))
    assert title_after != title_before and title_after, "the slider did not change the title"
    assert visible_after != visible_before, "the slider did not switch the visible fit"
    assert not failed
    page.close()

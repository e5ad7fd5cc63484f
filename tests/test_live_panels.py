"""The live re-fit panels as a researcher uses them: a chapter notebook opened in a running JupyterLab, in headless
Chromium, Run All, then a widget changed — the panel's output must change with it.

The static book cannot run these panels (they need a kernel); this is the only check that they work. The notebooks
run on their default profile (cpu) from the committed runs, as a reader's "Run All" does.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "depthlib-live-panels"
#: Run All of a chapter on its committed runs takes about a minute on 2 busy cores; the limit leaves room for a
#: slower machine without letting a hung kernel stall the suite.
RUN_ALL_MS = 600_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on the chapter notebooks (copied, so Run All leaves the committed ones untouched), with
    the app exposed to the page's scripts so the test can run its commands; yields its base URL."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    pytest.importorskip("playwright.sync_api", reason="playwright (pip) drives Chromium")
    pytest.importorskip("jupyterlab", reason="JupyterLab serves the notebooks")
    root = tmp_path_factory.mktemp("lab")
    for nb in ("01_scaling.ipynb", "03_toy.ipynb"):
        shutil.copy(ROOT / "notebooks" / nb, root / nb)
    port = _free_port()
    log = (root / "server.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JUPYTER_CONFIG_DIR": str(root / ".jupyter")}
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                               f"--ServerApp.port={port}", f"--IdentityProvider.token={TOKEN}",
                               f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
                               "--allow-root"], stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"JupyterLab exited: {(root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not answer within 60 s")
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def _run_all(browser, base: str, notebook: str):
    """Open ``notebook`` in JupyterLab, Run All, and wait until every cell has run; returns the page."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a workspace of its own, reset: JupyterLab would otherwise reopen the notebooks of earlier tests beside it
    page.goto(f"{base}/lab/workspaces/{Path(notebook).stem}/tree/{notebook}?reset&token={TOKEN}", wait_until="load")
    page.wait_for_function("(nb) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                           " return w && w.context && w.context.path === nb && w.sessionContext"
                           " && w.sessionContext.session && w.sessionContext.session.kernel; }",
                           arg=notebook, timeout=120_000)
    ok = page.evaluate("""async () => {
        const app = window.jupyterapp, nb = app.shell.currentWidget;
        await nb.sessionContext.ready;
        return await app.commands.execute('notebook:run-all-cells'); }""")
    assert ok is not False, f"{notebook}: a cell failed under Run All"
    # a cell that is still queued or running shows "[*]" (textContent: JupyterLab does not render cells out of view,
    # so their innerText is empty)
    page.wait_for_function("() => ![...document.querySelectorAll('.jp-InputPrompt')]"
                           ".some(p => p.textContent.includes('*'))", timeout=RUN_ALL_MS)
    assert not errors, f"{notebook}: page errors {errors}"
    return page


#: the live panel's output (textContent: it is there whether or not the cell is scrolled into view)
PANEL_JS = "() => { const o = document.querySelector('.widget-interact .jp-OutputArea'); return o ? o.textContent : ''; }"


def _panel_text(page) -> str:
    return page.evaluate(PANEL_JS)


def _refit(page, button, expect: str) -> str:
    """Press the panel's Run Interact button and wait until its output changes and contains ``expect``."""
    previous = _panel_text(page)
    button.click()
    page.wait_for_function("([b, e]) => { const o = document.querySelector('.widget-interact .jp-OutputArea');"
                           " return o && o.textContent.includes(e) && o.textContent !== b; }",
                           arg=[previous, expect], timeout=120_000)
    return _panel_text(page)


def test_chapter3_refit_panel_follows_the_depth_selection(lab, browser):
    page = _run_all(browser, lab, "03_toy.ipynb")
    select = page.locator(".widget-interact .widget-select-multiple select").first
    select.wait_for(timeout=60_000)
    select.scroll_into_view_if_needed()
    button = page.locator(".widget-interact button", has_text="Run Interact").first
    every_depth = _refit(page, button, "step")
    n_options = select.locator("option").count()
    assert n_options >= 3, f"the depth selector offers {n_options} depths"
    select.select_option(index=[0, 1])              # the two shallowest depths: a different fit
    two_depths = _refit(page, button, "step")
    assert two_depths != every_depth
    select.select_option(index=[0])                 # one depth: the panel says it cannot fit, no traceback
    assert "Traceback" not in _refit(page, button, "cannot fit")
    page.close()


def test_chapter1_refit_panel_refits_with_the_chosen_objective(lab, browser):
    page = _run_all(browser, lab, "01_scaling.ipynb")
    button = page.locator(".widget-interact button", has_text="Run Interact").first
    button.wait_for(timeout=60_000)
    button.scroll_into_view_if_needed()
    mse = _refit(page, button, "alpha_l")
    page.locator(".widget-interact .widget-dropdown", has_text="objective").locator("select").select_option("huber")
    huber = _refit(page, button, "alpha_l")
    assert mse != huber, "changing the objective did not change the fit"
    assert "Traceback" not in huber
    page.close()

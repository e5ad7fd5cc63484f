"""A committed notebook opened in a real JupyterLab, as a reader of a fresh clone opens it: untrusted, not run.

It must show its figures (static PNGs) and its question-and-answer box (HTML, not a MyST fence shown as code), and
opening it must not modify it (the kernelspec and language_info JupyterLab writes are the ones it carries): the tab
is not marked dirty, and saving it rewrites the same bytes. The JupyterLab server and Chromium are
tests/test_live_panels.py's.
"""
from __future__ import annotations

import json
import platform
import urllib.request
from pathlib import Path

import pytest

from tests.test_live_panels import TOKEN, browser, lab  # noqa: F401 - pytest fixtures

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = "03_toy.ipynb"


def _open_without_running(browser, base: str, notebook: str):  # noqa: F811 - the fixture's name
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/lab/workspaces/view-{Path(notebook).stem}/tree/{notebook}?reset&token={TOKEN}",
              wait_until="load")
    page.wait_for_function("(nb) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                           " return w && w.context && w.context.path === nb && w.context.isReady && w.sessionContext"
                           " && w.sessionContext.session && w.sessionContext.session.kernel; }",
                           arg=notebook, timeout=120_000)
    # the kernel's info reply is what JupyterLab writes into the metadata (kernelspec, language_info)
    page.evaluate("async () => { const nb = window.jupyterapp.shell.currentWidget; await nb.sessionContext.ready;"
                  " await nb.sessionContext.session.kernel.info; }")
    page.wait_for_timeout(3000)
    return page, errors


def _contents(base: str, path: str, text: str | None = None) -> tuple[str, str]:
    """The file ``path`` as the Jupyter server holds it (raw text) and when it was last written, after writing
    ``text`` to it if given."""
    url = f"{base}/api/contents/{path}?token={TOKEN}"
    if text is not None:
        body = json.dumps({"type": "file", "format": "text", "content": text}).encode()
        urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"), timeout=30)
    with urllib.request.urlopen(f"{url}&type=file&format=text&content=1", timeout=30) as r:
        model = json.loads(r.read())
    return model["content"], model["last_modified"]


def test_a_committed_notebook_opens_unmodified_with_its_figures_and_boxes(lab, browser):  # noqa: F811
    text, written = _contents(lab, NOTEBOOK)
    nb = json.loads(text)
    if nb["metadata"]["language_info"]["version"] != platform.python_version():
        # another Python here: JupyterLab would (rightly) write this kernel's version; that is not what is tested
        nb["metadata"]["language_info"]["version"] = platform.python_version()
        text, written = _contents(lab, NOTEBOOK, json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    images = sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
    assert images > 0, f"{NOTEBOOK} carries no static figure: run python -m depthlib.book refresh"

    page, errors = _open_without_running(browser, lab, NOTEBOOK)
    state = page.evaluate("""() => { const nb = window.jupyterapp.shell.currentWidget, m = nb.context.model;
        const md = [...document.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown')].map(e => e.textContent);
        return {dirty: m.dirty, tabDirty: document.querySelector('.lm-TabBar-tab.jp-mod-dirty') !== null,
                kernelspec: m.getMetadata('kernelspec'),
                trusted: nb.content.widgets.some(c => c.model.type === 'code' && c.model.trusted),
                images: document.querySelectorAll('.jp-OutputArea-output img').length,
                boxes: [...document.querySelectorAll('.jp-RenderedMarkdown div.admonition')].map(e => e.textContent),
                literal: md.filter(t => t.includes('{admonition}') || /^\\s*\\([\\w-]+\\)=/m.test(t)).length}; }""")
    assert not state["trusted"], "the notebook opened trusted: the check is for a fresh clone's untrusted notebook"
    assert not state["dirty"] and not state["tabDirty"], f"opening {NOTEBOOK} modified it: {state['kernelspec']}"
    assert state["images"] == images, f"{state['images']} of {images} static figures shown"
    assert state["boxes"] and "Question" in state["boxes"][0], "no question-and-answer box rendered"
    assert state["literal"] == 0, "MyST syntax shown as text"
    page.evaluate("() => { const i = document.querySelector('.jp-OutputArea-output img'); i.scrollIntoView(); }")
    page.wait_for_function("() => { const i = document.querySelector('.jp-OutputArea-output img');"
                           " return i.complete && i.naturalWidth > 0; }", timeout=30_000)
    # saving writes what JupyterLab holds: the same bytes
    page.evaluate("async () => { await window.jupyterapp.commands.execute('docmanager:save'); }")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
    page.wait_for_timeout(1500)
    saved, rewritten = _contents(lab, NOTEBOOK)
    assert rewritten != written, "JupyterLab did not save the notebook"
    assert saved == text, "JupyterLab saved the notebook differently from the committed text"
    assert not errors, f"page errors {errors}"
    page.close()

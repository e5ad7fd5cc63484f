"""The committed notebooks as a reader who opens them without running them sees them (JupyterLab, a fresh clone, so
untrusted; GitHub), and the book's copies of them.

``python -m depthlib.book refresh`` keeps every figure as a static PNG with its caption, writes Markdown both
CommonMark (JupyterLab, GitHub) and MyST (the book) render, and the kernelspec JupyterLab writes; the book's copies
drop the static figures (the book shows the interactive ones) and get their MyST targets back. Opening a committed
notebook in a real JupyterLab is tests/test_lab_view.py.
"""
from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest

from depthlib import book

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: what the static images of all committed notebooks may weigh together (base64 in the JSON)
IMAGE_BUDGET = 3_000_000


def _nb(cells: list[dict]) -> dict:
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                      "name": "python3"},
                                         "papermill": {"input_path": "/x/in.ipynb", "output_path": "/x/out.ipynb"}},
            "nbformat": 4, "nbformat_minor": 5}


def _code(tags: list[str], outputs: list[dict], source: str = "x") -> dict:
    return {"cell_type": "code", "metadata": {"tags": tags}, "source": source, "outputs": outputs,
            "execution_count": 1, "id": "c"}


def _markdown(source: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": source, "id": "m"}


def _figure(title: str = "Loss against depth") -> dict:
    fig = {"data": [{"type": "scatter", "x": [1, 2, 4], "y": [3.0, 1.6, 0.9], "mode": "lines+markers"}],
           "layout": {"title": {"text": title}, "height": 300, "xaxis": {"title": {"text": "depth ℓ"}}}}
    return {"output_type": "display_data", "metadata": {},
            "data": {book.PLOTLY_MIME: fig, "text/html": "<div id='fig'></div><script>Plotly.newPlot('fig')</script>"}}


CAPTION = {"output_type": "display_data", "metadata": {},
           "data": {"text/markdown": "<p class='depthlib-caption'><b>Fig. 1.1</b> — what to see</p>",
                    "text/plain": "<IPython.core.display.Markdown object>"}}
PROVENANCE = {"output_type": "display_data", "metadata": {}, "data": {"text/html": "<div>computed at commit abc</div>"}}
NUMBERS = {"output_type": "stream", "name": "stdout", "text": "alpha 1.2\n"}
QUESTION = ("```{admonition} Question and answer\n**Does the loss fall as 1/depth?** Roughly, yes: $\\alpha_\\ell"
            " \\approx 1.3$ ([the numbers](ch1-alpha)).\n```")
SECTION = "(ch1-alpha)=\n## How certain is the depth exponent?\n\nText."


def _tiny(figures: int = 2) -> dict:
    return _nb([_markdown(QUESTION), _markdown(SECTION),
                _code(["nbval-ignore-output", "hide-input"],
                      [PROVENANCE] + [o for i in range(figures) for o in (_figure(f"figure {i}"), CAPTION)]),
                _code(["nbval-check-output"], [NUMBERS]),
                _code(["nbval-ignore-output", "remove-output"], [_figure("a live panel's")])])


def _fake_pngs(figures, width):
    return [PNG_MAGIC + f"{width} {fig['layout']['title']['text']}".encode() for fig in figures]


def test_committed_view_keeps_each_figure_as_a_png_beside_its_caption(monkeypatch):
    monkeypatch.setattr(book, "_render_pngs", _fake_pngs)
    monkeypatch.setattr(book, "_small_png", lambda png: png)
    nb = _tiny()
    assert book.committed_view(nb) == (2, 2)
    shown, checked, panel = nb["cells"][2]["outputs"], nb["cells"][3]["outputs"], nb["cells"][4]["outputs"]
    assert [o["metadata"][book.STATIC_KEY] for o in shown] == [book.STATIC_FIGURE, book.STATIC_CAPTION] * 2
    for i, out in enumerate(shown[::2]):
        # only the PNG and a text/plain: a text/html (plotly's div) would win over the PNG in JupyterLab and on
        # GitHub and show an empty box; the plotly JSON would weigh up to ~0.4 MB
        assert set(out["data"]) == {"image/png", "text/plain"}
        assert base64.b64decode(out["data"]["image/png"]) == PNG_MAGIC + f"{book.STATIC_WIDTH} figure {i}".encode()
        assert f"figure {i}" in "".join(out["data"]["text/plain"])
    assert shown[1]["data"] == CAPTION["data"]
    assert checked == [NUMBERS]                      # what nbval compares is untouched
    assert panel == []                               # a cell the book removes keeps nothing
    assert nb["metadata"]["kernelspec"] == book.lab_kernelspec()
    assert not {"input_path", "output_path"} & set(nb["metadata"]["papermill"])
    markdown = "".join(nb["cells"][0]["source"]) + "".join(nb["cells"][1]["source"])
    assert "```{" not in markdown and "(ch1-alpha)=" not in markdown
    json.dumps(nb)                                   # still a notebook that serialises


def test_the_book_copy_has_no_static_figure_and_its_targets_back(monkeypatch, tmp_path):
    monkeypatch.setattr(book, "_render_pngs", _fake_pngs)
    monkeypatch.setattr(book, "_small_png", lambda png: png)
    nb = _tiny()
    book.committed_view(nb)
    path = tmp_path / "01_tiny.ipynb"
    book._write_nb(path, nb)
    staged = book._read_nb(book.book_view(path))
    outputs = [o for c in staged["cells"] for o in c.get("outputs", [])]
    assert outputs == [NUMBERS]                      # no image, no caption without its figure
    assert "(ch1-alpha)=\n## How certain" in "".join(staged["cells"][1]["source"])
    assert '<div class="admonition">' in "".join(staged["cells"][0]["source"])


def test_stage_notebooks_gives_the_book_no_static_figure(monkeypatch, tmp_path):
    """The chapters the book does not execute are copied from the committed notebooks: without their images."""
    monkeypatch.setattr(book, "prepare_models", lambda notebooks: [])

    def fake_execute(src, dst, parameters=None):      # papermill's copy keeps no output of the committed one; a
        dst.parent.mkdir(parents=True, exist_ok=True)  # plain copy is the harder case
        shutil.copy(src, dst)
        return dst
    monkeypatch.setattr(book, "execute_notebook", fake_execute)
    staged = book.stage_notebooks(tmp_path / "stage", "cpu", only=[NOTEBOOKS[0].stem])
    for path in staged:
        nb = json.loads(path.read_text(encoding="utf-8"))
        static = [o for c in nb["cells"] for o in c.get("outputs", []) if book.STATIC_KEY in o.get("metadata", {})
                  or "image/png" in o.get("data", {})]
        assert not static, f"{path.name}: {len(static)} static figure output(s) in the book's copy"


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None
                    and shutil.which("google-chrome") is None, reason="kaleido draws with Chrome/Chromium")
def test_add_static_figures_draws_a_small_png():
    pytest.importorskip("kaleido", reason="kaleido (the book extra) draws the static figures")
    pytest.importorskip("PIL", reason="Pillow (the book extra) reduces the static figures' palette")
    nb = _nb([_code(["nbval-ignore-output"], [_figure(), CAPTION])])
    book.strip_ignored_outputs(nb, keep_figures=True)
    assert book.add_static_figures(nb) == 1
    png = base64.b64decode(nb["cells"][0]["outputs"][0]["data"]["image/png"])
    assert png.startswith(PNG_MAGIC)
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (book.STATIC_WIDTH, 300)    # the figure's own height
    assert png[25] == 3, "not a palette PNG"             # colour type 3: indexed
    assert len(png) < 40_000


# ---- the Markdown of the notebooks ------------------------------------------------------------------------------
def test_portable_markdown_turns_myst_blocks_into_commonmark():
    portable = book.portable_markdown(QUESTION + "\n\n" + SECTION)
    assert portable.startswith('<div class="admonition">\n<p class="admonition-title">Question and answer</p>\n\n'
                               "**Does the loss fall as 1/depth?**")
    assert "([the numbers](#ch1-alpha))" in portable           # MyST resolves #label to the target
    assert "\n\n</div>\n\n" in portable                         # the body is Markdown: blank lines around it
    assert '<div id="ch1-alpha"></div>\n\n## How certain' in portable
    assert book.portable_markdown(portable) == portable         # idempotent
    assert book.book_markdown(portable).endswith(SECTION)
    note = book.portable_markdown(":::{note}\n:class: dropdown\nSee *this*.\n:::")
    assert note == '<div class="admonition note dropdown">\n<p class="admonition-title">Note</p>\n\nSee *this*.\n\n</div>'


#: MyST syntax JupyterLab and GitHub show as literal text: directive fences, targets, roles (``{ref}`x```)
MYST_ONLY = {"directive fence": re.compile(r"^(```+|:::+)\{", re.M), "target": re.compile(r"^\([\w.:-]+\)=", re.M),
             "role": re.compile(r"\{[a-z][\w:-]*\}`")}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_markdown_renders_in_jupyterlab(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = [f"cell {i}: {kind} {m.group(0)!r}" for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "markdown"
             for kind, pattern in MYST_ONLY.items() for m in pattern.finditer("".join(cell["source"]))]
    assert not found, f"{path.name} has MyST-only Markdown (convert it with depthlib.book.portable_markdown): {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_carries_the_kernelspec_jupyterlab_writes(path):
    kernelspec = json.loads(path.read_text(encoding="utf-8"))["metadata"]["kernelspec"]
    assert kernelspec == {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    assert kernelspec == book.lab_kernelspec()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_shows_every_figure_as_an_image(path):
    """Every figure a chapter shows (``plots.show``) is in its committed notebook as a static PNG: nothing else
    a reader without a kernel could not see (plotly's div or JSON)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code" or "remove-output" in book._tags(cell):
            continue
        outputs = cell.get("outputs", [])
        assert not [o for o in outputs if book.PLOTLY_MIME in o.get("data", {})], f"{path.name} cell {i}: plotly JSON"
        images = [o for o in outputs if "image/png" in o.get("data", {})]
        assert all(set(o["data"]) == {"image/png", "text/plain"} for o in images), f"{path.name} cell {i}"
        shows = re.findall(r"^\s*plots\.show\(", "".join(cell["source"]), re.M)
        if shows and "for " not in "".join(cell["source"]) and "if " not in "".join(cell["source"]):
            assert len(images) == len(shows), f"{path.name} cell {i}: {len(images)} image(s) for {len(shows)} figure(s)"


def test_committed_static_figures_stay_small():
    sizes = {p.stem: sum(len(o["data"]["image/png"]) for c in json.loads(p.read_text(encoding="utf-8"))["cells"]
                         for o in c.get("outputs", []) if "image/png" in o.get("data", {})) for p in NOTEBOOKS}
    assert sum(sizes.values()) < IMAGE_BUDGET, sizes

"""Build the executable book: vendor the JS assets, execute the notebooks with papermill, run Jupyter Book.

The committed notebooks hold the outputs of their default profile, ``cpu``, drawn from the committed runs under
``data/results`` (what ``pytest --nbval notebooks`` compares against; deterministic, since nothing is recomputed),
and each figure as a static PNG, so that JupyterLab and GitHub show it to a reader who has not run the notebook
(:func:`committed_view`; the book's pages show the interactive figures instead, :func:`book_view`).
Building never rewrites them: executed copies go to the git-ignored staging folder ``<out>/stage`` (Jupyter
Book's own build files land there too) and the HTML to ``<out>/html``
(``_build/html`` by default). The book is self-contained and works from ``file://`` with no network:
plotly.js comes from the plotly wheel, the ipywidgets embed bundle and MathJax 3 from the npm registry.
``publish`` puts the HTML on a ``gh-pages`` branch with ghp-import (Jupyter Book's documented route).

Progress bars stay out of the pages: the offline models are converted once, before any notebook runs and
outside them (progress on stderr), the kernels run with ``TQDM_DISABLE=1``, and any progress bar that still
reaches a cell output is removed from the executed copy.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from depthlib import chapters
from depthlib.errors import InputError
from depthlib.paths import REPO_ROOT

NOTEBOOKS = REPO_ROOT / "notebooks"
ASSETS = REPO_ROOT / "book_assets"
#: npm packages vendored into the book (pinned: the versions verified offline).
WIDGETS_NPM = "@jupyter-widgets/html-manager@1.0.15"
MATHJAX_NPM = "mathjax@3.2.2"
MATHJAX_PARTS = ("es5/tex-mml-chtml.js", "es5/output/chtml/fonts", "es5/input/tex/extensions", "es5/a11y", "es5/ui",
                 "es5/sre", "es5/adaptors")


def _npm_pack(spec: str, workdir: Path) -> Path:
    """Download one npm package tarball (no node_modules) and unpack it; returns the package folder."""
    if shutil.which("npm") is None:
        raise InputError("npm is needed to vendor the book's JS assets: install Node.js with npm "
                         "(NodeSource; Debian's npm package conflicts with it)")
    out = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination", str(workdir)],
                         capture_output=True, text=True, cwd=workdir)
    if out.returncode != 0:
        raise InputError(f"npm pack {spec} failed: {out.stderr.strip().splitlines()[-1:]}")
    tgz = workdir / out.stdout.strip().splitlines()[-1]
    dest = workdir / tgz.stem
    with tarfile.open(tgz) as tar:
        tar.extractall(dest, filter="data")
    return dest / "package"


def vendor_assets(dest: Path = ASSETS, force: bool = False) -> Path:
    """Put plotly.js, the widgets embed bundle and MathJax into ``dest`` (not ``_static``: JB1 would
    inject every .js found there into every page)."""
    marker = dest / ".complete"
    if marker.exists() and not force:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        try:
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)   # a second builder (e.g. another pytest worker) waits for the first
        except ImportError:                    # Windows: no lock
            pass
        if marker.exists() and not force:
            return dest
        return _vendor(dest, marker)


def _vendor(dest: Path, marker: Path) -> Path:
    import plotly
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", dest / "plotly.min.js")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        widgets = _npm_pack(WIDGETS_NPM, tmp)
        shutil.copy(widgets / "dist" / "embed.js", dest / "widgets-embed.js")
        for font in (widgets / "dist").glob("*.woff*"):
            shutil.copy(font, dest / font.name)
        mathjax = _npm_pack(MATHJAX_NPM, tmp)
        for part in MATHJAX_PARTS:
            src = mathjax / part
            target = dest / "mathjax" / Path(part).relative_to("es5")
            if src.is_dir():
                shutil.copytree(src, target, dirs_exist_ok=True)
            elif src.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, target)
    marker.write_text("ok\n")
    return dest


def notebook_paths(only: list[str] | None = None) -> list[Path]:
    """The chapters' notebooks in the book's order (:data:`depthlib.chapters.CHAPTERS`, a registered chapter's
    included), or those named in ``only`` (paths, names or stems, a prefix such as ``03`` is enough)."""
    paths = [c.notebook_path for c in chapters.CHAPTERS]
    if only:
        wanted = [Path(o).name.removesuffix(".ipynb") for o in only]
        chosen = [p for p in paths if any(p.stem == w or p.stem.startswith(w) for w in wanted)]
        unknown = [w for w in wanted if not any(p.stem == w or p.stem.startswith(w) for p in paths)]
        if unknown:
            raise InputError(f"no notebook named {', '.join(unknown)} (have {', '.join(p.stem for p in paths)})")
        return chosen
    return paths


def model_chapters() -> tuple[str, ...]:
    """The notebooks (stems) of the chapters that load the offline language models (converted before they run, see
    :func:`prepare_models`)."""
    return tuple(c.notebook for c in chapters.CHAPTERS if c.offline_models)


#: the table of contents the book is built with: the repository's, its chapters the registry's (table_of_contents)
TOC = REPO_ROOT / "_toc.yml"
#: Environment of the notebook kernels: tqdm bars created without an explicit ``disable=`` stay silent, and the
#: Hugging Face libraries draw none (they would be ipywidgets or stderr text inside the executed notebooks).
QUIET_KERNEL_ENV = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
#: A tqdm meter: "desc:  40%|####      | 2/5 [00:01<00:02, 1.2it/s]" (text, or the text/plain of a tqdm widget).
_TQDM_METER = re.compile(r"\d+%\||\[\d+:\d{2}(?::\d{2})?(?:<[\d:?]+)?,\s")
IGNORE_TAG, IGNORE_COMMENT = "nbval-ignore-output", "# NBVAL_IGNORE_OUTPUT"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _read_nb(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _write_nb(path: Path, nb: dict) -> None:
    """Write like nbformat does (sorted keys, indent 1, UTF-8, trailing newline), so diffs stay small."""
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _hide_injected_parameters(nb: dict) -> None:
    """Tag papermill's injected-parameters cell ``remove-cell`` so the book does not show it."""
    for cell in nb["cells"]:
        tags = _tags(cell)
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")


def strip_progress_bars(nb: dict) -> int:
    """Remove tqdm progress bars from the outputs (stderr text and tqdm widgets); returns how many were removed.

    A stderr stream keeps its other lines (warnings); a stream left empty and a tqdm widget view are dropped.
    """
    removed = 0
    for cell in nb["cells"]:
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                text = "".join(out.get("text", ""))
                lines = re.split(r"\r\n|\r|\n", text)
                clean = [ln for ln in lines if not _TQDM_METER.search(ln)]
                if len(clean) != len(lines):
                    removed += 1
                    text = "\n".join(ln for ln in clean if ln.strip())
                    if not text:
                        continue
                    out["text"] = text + "\n"
            elif WIDGET_VIEW in out.get("data", {}):
                if _TQDM_METER.search("".join(out["data"].get("text/plain", ""))):
                    removed += 1
                    continue
            kept.append(out)
        if "outputs" in cell:
            cell["outputs"] = kept
    return removed


#: the plotly figure mimetype (``depthlib.plots``' renderer emits it beside a small ``text/html``)
PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: output metadata that marks what :func:`refresh_committed` keeps of an nbval-ignored figure cell for readers who open
#: the committed notebook without running it: the figure's static image and its caption. The book drops both.
STATIC_KEY, STATIC_FIGURE, STATIC_CAPTION = "depthlib", "static-figure", "static-figure-caption"
#: the static image of a committed figure: PNG (JupyterLab draws it in an untrusted notebook, where it does not draw
#: SVG, and GitHub draws it), this many CSS pixels wide (plotly figures are responsive; the book's column is about
#: 790 px at 1280 px), reduced to a palette of this many colours (plotly's flat colours and antialiasing survive it;
#: a figure's PNG is about a quarter of its full-colour size)
STATIC_WIDTH, STATIC_COLORS = 800, 64
_CAPTION_MARK = "depthlib-caption"


def _is_figure(out: dict) -> bool:
    return PLOTLY_MIME in out.get("data", {})


def _is_caption(out: dict) -> bool:
    return _CAPTION_MARK in "".join(out.get("data", {}).get("text/markdown", ""))


def strip_ignored_outputs(nb: dict, keep_figures: bool = False) -> int:
    """Empty the outputs of cells nbval never compares (tag ``nbval-ignore-output`` or the comment
    ``# NBVAL_IGNORE_OUTPUT``); returns how many cells were emptied. ``nbval-check-output`` and untagged cells
    keep theirs. Saved widget state goes too once no output shows a widget.

    With ``keep_figures``, an ignored cell keeps its plotly figures and the caption that follows each
    (:func:`depthlib.plots.show`), marked for :func:`add_static_figures` (which replaces each figure by its image)
    and :func:`strip_static_figures` (which drops both from the book's copy); not in a cell the book removes
    (``remove-output``, ``remove-cell``: the live panels)."""
    emptied = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or not cell.get("outputs"):
            continue
        source = "".join(cell.get("source", ""))
        if IGNORE_TAG in _tags(cell) or source.lstrip().startswith(IGNORE_COMMENT):
            kept = []
            if keep_figures and not {"remove-output", "remove-cell"} & set(_tags(cell)):
                for out in cell["outputs"]:
                    if _is_figure(out):
                        kept.append({**out, "metadata": {STATIC_KEY: STATIC_FIGURE}})
                    elif kept and _is_caption(out) and kept[-1]["metadata"][STATIC_KEY] == STATIC_FIGURE:
                        kept.append({**out, "metadata": {STATIC_KEY: STATIC_CAPTION}})
            cell["outputs"] = kept
            emptied += 1
    widgets_shown = any(WIDGET_VIEW in out.get("data", {}) for cell in nb["cells"] for out in cell.get("outputs", []))
    if not widgets_shown:
        nb.get("metadata", {}).pop("widgets", None)
    return emptied


def _static_outputs(nb: dict, kind: str) -> list[dict]:
    return [out for cell in nb["cells"] for out in cell.get("outputs", [])
            if out.get("metadata", {}).get(STATIC_KEY) == kind]


def _render_pngs(figures: list[dict], width: int, attempts: int = 3) -> list[bytes]:
    """PNG bytes of plotly figure dicts, drawn by kaleido (headless Chrome/Chromium) in one browser session; a
    session that fails is tried again in a new one (on a busy machine kaleido's page is sometimes not ready in time:
    "kaleido_scopes is not defined")."""
    import asyncio
    try:
        import kaleido
    except ImportError:
        raise InputError("kaleido draws the committed notebooks' static figures: pip install 'depthlib[book]'") from None

    async def draw() -> list[bytes]:
        # mathjax=False: no figure uses LaTeX, and kaleido would fetch MathJax from a CDN
        async with kaleido.Kaleido(n=1, mathjax=False) as k:
            return [await k.calc_fig(fig, opts={"format": "png", "width": width,
                                                "height": fig.get("layout", {}).get("height") or 430, "scale": 1})
                    for fig in figures]
    for attempt in range(1, attempts + 1):
        try:
            return asyncio.run(draw())
        except Exception as err:   # noqa: BLE001 - kaleido's own errors (no browser found, a page not ready)
            if type(err).__name__ == "ChromeNotFoundError":
                raise InputError("kaleido needs Chrome or Chromium to draw the static figures: apt-get install "
                                 "chromium (or set BROWSER_PATH to a Chrome binary)") from None
            if attempt == attempts:
                raise
            print(f"[depthlib book] drawing the static figures failed ({type(err).__name__}); again",
                  file=sys.stderr)


def _small_png(png: bytes, colors: int = STATIC_COLORS) -> bytes:
    """``png`` reduced to a palette of ``colors`` colours (no dithering: plotly draws flat colours)."""
    import io
    try:
        from PIL import Image
    except ImportError:
        raise InputError("Pillow makes the committed notebooks' static figures small: pip install 'depthlib[book]'") \
            from None
    image = Image.open(io.BytesIO(png)).convert("RGB")
    small = image.quantize(colors=colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    small.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def add_static_figures(nb: dict, width: int = STATIC_WIDTH) -> int:
    """Replace every figure kept by :func:`strip_ignored_outputs` with its static image; returns how many.

    The output becomes ``image/png`` (and a ``text/plain`` naming the figure): JupyterLab draws a PNG in an
    untrusted notebook (a fresh clone; an SVG it would not) and GitHub draws it, while the figure's ``text/html``
    (plotly's div, whose script neither runs) would win over it and show an empty box. The interactive figure is
    the book's: its pages are executed afresh (:func:`stage_notebooks`). The plotly JSON is not kept either: it is
    the bulk of a figure (up to ~0.4 MB), and the PNG alone costs ~15 kB."""
    import base64
    outs = _static_outputs(nb, STATIC_FIGURE)
    todo = [out for out in outs if _is_figure(out)]
    pngs = _render_pngs([out["data"][PLOTLY_MIME] for out in todo], width) if todo else []
    for out, png in zip(todo, pngs):
        small = _small_png(png)
        title = (out["data"][PLOTLY_MIME].get("layout", {}).get("title") or {}).get("text") or "a figure"
        title = " ".join(re.sub(r"<[^>]*>", " ", title).split())     # plotly's <br>, <sup> ...
        out["data"] = {"image/png": base64.b64encode(small).decode("ascii"),
                       "text/plain": [f"<static image of the interactive figure '{title}': run the notebook for it>"]}
        out["metadata"] = {STATIC_KEY: STATIC_FIGURE}
    return len(todo)


def strip_static_figures(nb: dict) -> int:
    """Drop the static figures and their captions (:func:`add_static_figures`) from a copy of a committed notebook
    (the book's pages show the interactive figures of an executed notebook, or none); returns how many outputs."""
    removed = 0
    for cell in nb["cells"]:
        if "outputs" in cell:
            kept = [o for o in cell["outputs"] if o.get("metadata", {}).get(STATIC_KEY) not in (STATIC_FIGURE,
                                                                                             STATIC_CAPTION)]
            removed += len(cell["outputs"]) - len(kept)
            cell["outputs"] = kept
    return removed


def lab_kernelspec(name: str = "python3") -> dict:
    """The kernelspec metadata JupyterLab writes into a notebook it opens with kernel ``name``: that kernel's spec as
    the Jupyter server lists it (``display_name`` "Python 3 (ipykernel)" for ipykernel's ``python3``), not papermill's
    "Python 3"; a notebook that carries another is marked modified as soon as Lab opens it."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
        spec = KernelSpecManager().get_kernel_spec(name)
        return {"display_name": spec.display_name, "language": spec.language, "name": name}
    except Exception:   # noqa: BLE001 - no such kernel here: ipykernel's own spec
        from ipykernel.kernelspec import get_kernel_dict
        spec = get_kernel_dict()
        return {"display_name": spec["display_name"], "language": spec["language"], "name": name}


# ---- Markdown both JupyterLab (CommonMark) and the book (MyST) render ----------------------------------------------
#: a MyST admonition fence (```{admonition} Title, ```{note}, :::{tip} ...) spanning a whole block, no nesting
_MYST_ADMONITION = re.compile(r"^(?P<fence>```+|:::+)\{(?P<kind>admonition|note|tip|hint|important|warning|caution|"
                              r"attention|danger|error|seealso)\}[ \t]*(?P<title>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                              re.M | re.S)
_MYST_TARGET = re.compile(r"^\((?P<label>[A-Za-z0-9][\w.:-]*)\)=[ \t]*\n", re.M)
_HTML_TARGET = re.compile(r'^<div id="(?P<label>[A-Za-z0-9][\w.:-]*)"></div>[ \t]*\n\n', re.M)
#: a link to a MyST target by its bare name, ``[text](label)`` (CommonMark: a file of that name)
_LABEL_LINK = re.compile(r"\]\((?P<label>[A-Za-z][\w-]*-[\w-]*)\)")


def _html_admonition(match: re.Match) -> str:
    import html
    kind, body = match["kind"], match["body"]
    title = match["title"].strip() or kind.capitalize()
    options = re.match(r"((?::[\w-]+:[^\n]*\n)*)", body)
    classes = ["admonition"] + ([kind] if kind != "admonition" else [])
    for line in options.group(1).splitlines():
        key, _, value = line[1:].partition(":")
        if key == "class":
            classes += value.split()
    body = body[options.end():].strip("\n")
    return (f'<div class="{" ".join(classes)}">\n<p class="admonition-title">{html.escape(title)}</p>\n\n'
            f"{body}\n\n</div>")


def portable_markdown(source: str) -> str:
    """A markdown cell's source with its MyST-only blocks in a form CommonMark renders the same in JupyterLab, on
    GitHub and in the book: an admonition fence becomes ``<div class="admonition">`` with a title paragraph and the
    body as Markdown between blank lines (the theme styles it as an admonition; math and links inside still
    render), a target ``(label)=`` becomes an empty ``<div id="label"></div>`` (which :func:`book_markdown`
    turns back into the target the book's ``{ref}`` links need) and a link to a target by its bare name,
    ``[text](label)``, the in-page link ``[text](#label)`` (MyST resolves it to the target). Idempotent."""
    source = _MYST_ADMONITION.sub(_html_admonition, source)
    source = _LABEL_LINK.sub(lambda m: f"](#{m['label']})", source)
    return _MYST_TARGET.sub(lambda m: f'<div id="{m["label"]}"></div>\n\n', source)


def book_markdown(source: str) -> str:
    """The book's copy of a markdown cell: each ``<div id="label"></div>`` of :func:`portable_markdown` back to the
    MyST target ``(label)=`` (Sphinx labels the section after it)."""
    return _HTML_TARGET.sub(lambda m: f"({m['label']})=\n", source)


def _map_markdown(nb: dict, convert) -> int:
    changed = 0
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"])
            new = convert(source)
            if new != source:
                cell["source"] = new.splitlines(keepends=True)
                changed += 1
    return changed


@contextlib.contextmanager
def _quiet_kernels():
    """Kernels inherit this process's environment: set QUIET_KERNEL_ENV while notebooks execute."""
    saved = {k: os.environ.get(k) for k in QUIET_KERNEL_ENV}
    os.environ.update(QUIET_KERNEL_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def execute_notebook(src: Path, dst: Path, parameters: dict | None = None) -> Path:
    """Execute one notebook with papermill, from the notebooks folder (as nbval and JupyterLab do).

    Progress bars are kept out of the outputs (quiet kernel environment, then :func:`strip_progress_bars`)."""
    import papermill as pm
    dst.parent.mkdir(parents=True, exist_ok=True)
    print(f"[depthlib book] executing {src.name} {parameters or ''}", file=sys.stderr, flush=True)
    with _quiet_kernels():
        pm.execute_notebook(str(src), str(dst), parameters=parameters or None, kernel_name="python3",
                            cwd=str(NOTEBOOKS), progress_bar=False, log_output=False)
    nb = _read_nb(dst)
    removed = strip_progress_bars(nb)
    if removed:
        print(f"[depthlib book] removed {removed} progress bar output(s) from {dst.name}", file=sys.stderr)
    if parameters:
        _hide_injected_parameters(nb)
    _write_nb(dst, nb)
    return dst


def _offline_models():
    """The module that converts the offline models (``depthlib.models.loading``; ``depthlib.data`` before)."""
    try:
        from depthlib.models import loading
        return loading
    except ImportError:
        from depthlib import data
        return data


def prepare_models(notebooks: list[Path]) -> list[str]:
    """Convert the installed offline models once, here and not inside a notebook, if a chapter that loads them
    is about to run: the GGUF conversion draws a progress bar that would otherwise land in the page.
    Progress and problems go to stderr; a model that cannot be converted is left to the notebook (which may
    not need it: committed runs load no model). Returns the models ready."""
    if not any(p.stem in model_chapters() for p in notebooks):
        return []
    try:
        loading = _offline_models()
        names = loading.available_offline_models()
    except Exception as err:  # noqa: BLE001 - the models extra may be missing; the notebooks then say so
        print(f"[depthlib book] offline models unavailable ({err}); chapters use their committed runs",
              file=sys.stderr)
        return []
    ready = []
    for name in names:
        done = (loading.converted_model_dir(name) / "config.json").exists() if hasattr(
            loading, "converted_model_dir") else False
        if not done:
            print(f"[depthlib book] converting offline model {name} (once; cached)", file=sys.stderr, flush=True)
        try:
            loading.ensure_converted(name)
            ready.append(name)
        except Exception as err:  # noqa: BLE001 - reported, not fatal
            print(f"[depthlib book] could not convert {name}: {err}", file=sys.stderr)
    return ready


def refresh_committed(only: list[str] | None = None) -> list[Path]:
    """Re-execute the committed notebooks in place with their own parameters (``PROFILE = "cpu"``: the committed runs).

    This is how the outputs that ``pytest --nbval notebooks`` compares against are made; a missing or stale committed
    run would be recomputed here, so refresh only when ``tests/test_committed_runs.py`` passes. The outputs
    of ``nbval-ignore-output`` cells (provenance, timings) are then dropped: nbval never compares them, and the
    book is built from freshly executed copies; their figures stay, as static images (:func:`committed_view`).
    """
    done = []
    paths = notebook_paths(only)
    prepare_models(paths)
    for path in paths:
        with tempfile.TemporaryDirectory() as tmp:       # the committed notebook is replaced only once all went well
            nb = _read_nb(execute_notebook(path, Path(tmp) / path.name, parameters=None))
        emptied, drawn = committed_view(nb)
        _write_nb(path, nb)
        print(f"[depthlib book] {path.name}: outputs of {emptied} nbval-ignore-output cell(s) stripped, "
              f"{drawn} figure(s) kept as static images", file=sys.stderr)
        done.append(path)
    return done


def committed_view(nb: dict) -> tuple[int, int]:
    """What an executed notebook keeps for the repository (:func:`refresh_committed`), in place: the outputs nbval
    compares, each figure as a static image with its caption (:func:`strip_ignored_outputs`,
    :func:`add_static_figures`: a reader who opens the notebook in JupyterLab or on GitHub sees the figures
    without running it), Markdown that JupyterLab renders (:func:`portable_markdown`), the kernelspec JupyterLab
    writes (:func:`lab_kernelspec`: opening the notebook does not modify it), and no machine paths. Returns
    (cells whose outputs were stripped, figures drawn)."""
    emptied = strip_ignored_outputs(nb, keep_figures=True)
    drawn = add_static_figures(nb)
    _map_markdown(nb, portable_markdown)
    meta = nb.setdefault("metadata", {})
    meta["kernelspec"] = lab_kernelspec(meta.get("kernelspec", {}).get("name", "python3"))
    # papermill records this machine's absolute input/output paths: not for the repository
    for key in ("input_path", "output_path"):
        meta.get("papermill", {}).pop(key, None)
    return emptied, drawn


#: the generated verdict the intro includes (``book/intro.md``); written into the stage only, never committed
VERDICT_PAGE = "verdict.md"


def table_of_contents() -> dict:
    """The book's table of contents (Jupyter Book's ``_toc.yml``): the repository's, whose part of chapters (the part
    that lists notebooks) is the registry's notebooks in the registry's order (:data:`depthlib.chapters.CHAPTERS`: a
    registered chapter gets its page without editing ``_toc.yml``)."""
    import yaml
    toc = yaml.safe_load(TOC.read_text(encoding="utf-8"))
    entries = [{"file": f"notebooks/{c.notebook}"} for c in chapters.CHAPTERS]
    parts = [p for p in toc["parts"] if any(e.get("file", "").startswith("notebooks/") for e in p["chapters"])]
    if len(parts) != 1:
        raise InputError(f"{TOC} must have one part listing the chapters' notebooks, found {len(parts)}")
    parts[0]["chapters"] = entries
    return toc


def stage_notebooks(stage: Path, profile: str, only: list[str] | None = None, rerun: bool = False) -> list[Path]:
    """The chapters' pages in ``stage``: every chapter's notebook (:func:`notebook_paths`) under ``stage/notebooks``,
    those named in ``only`` executed on ``profile`` (papermill parameters ``PROFILE`` and ``RERUN``; True:
    recompute instead of showing committed runs), the others copied as committed; and the table of contents
    ``stage/_toc.yml`` that lists them (:func:`table_of_contents`); each as the book shows it (:func:`book_view`).
    Returns the staged notebooks, in order."""
    import yaml
    stage.mkdir(parents=True, exist_ok=True)
    (stage / "_toc.yml").write_text(yaml.safe_dump(table_of_contents(), sort_keys=False), encoding="utf-8")
    chosen = notebook_paths(only)
    prepare_models(chosen)
    staged = []
    for path in notebook_paths():
        dst = stage / "notebooks" / path.name
        if path in chosen:
            execute_notebook(path, dst, parameters={"PROFILE": profile, "RERUN": bool(rerun)})
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dst)
        book_view(dst)
        staged.append(dst)
    return staged


def book_view(path: Path) -> Path:
    """The book's copy of a notebook, in place: no static figure or its caption (a committed notebook's, see
    :func:`committed_view`; the book shows the interactive figures of the executed notebooks) and the MyST targets
    its ``{ref}`` links need (:func:`book_markdown`)."""
    nb = _read_nb(path)
    if strip_static_figures(nb) + _map_markdown(nb, book_markdown):
        _write_nb(path, nb)
    return path


def stage_book(profile: str, stage: Path, only: list[str] | None = None, rerun: bool = False) -> Path:
    """Lay out the book's sources in ``stage`` with every notebook executed on ``profile``.

    The notebooks get the papermill parameters ``PROFILE`` and ``RERUN`` (True: recompute every chapter instead
    of showing committed runs)."""
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "_config.yml", stage / "_config.yml")
    shutil.copytree(REPO_ROOT / "book", stage / "book")
    shutil.copytree(vendor_assets(), stage / "book_assets")
    for name in ("depthlib.css", "mathjax2-shim.js"):   # the book's own small assets
        shutil.copy(REPO_ROOT / "book" / name, stage / "book_assets" / name)
    stage_notebooks(stage, profile, only, rerun)
    write_verdict(stage, profile, rerun)
    return stage


def write_verdict(stage: Path, profile: str, rerun: bool = False) -> None:
    """The verdict of the runs the staged chapters showed (:func:`depthlib.verdict.verdict`), generated after they
    ran: the page the intro includes (``book/verdict.md``) and the substitutions the hand-written pages quote
    (:func:`depthlib.verdict.substitutions`: ``{{ tied_alpha_value }}`` …), added to the staged ``_config.yml``."""
    import yaml

    from depthlib import verdict
    rows = verdict.verdict(profile, rerun=rerun)
    (stage / "book" / VERDICT_PAGE).write_text(verdict.book_page(profile, rows=rows), encoding="utf-8")
    config_file = stage / "_config.yml"
    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    config.setdefault("parse", {})["myst_substitutions"] = verdict.substitutions(rows)
    config_file.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")


def _check_writable(out: Path) -> None:
    """InputError naming the build folder (``--out``) if it cannot be written, before any notebook is executed."""
    probe = out / f".write-test{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise InputError(f"cannot write the book's build folder --out {out}: {err.strerror or err}; "
                         "choose a writable folder with --out") from None


def build_book(profile: str = "cpu", out: str | Path = "_build", only: list[str] | None = None,
               rerun: bool = False) -> Path:
    """Execute the notebooks on ``profile`` and build the HTML book; returns the HTML folder ``<out>/html``.

    Everything is written under ``out`` (git-ignored ``_build`` by default): the executed notebooks and Jupyter
    Book's build files in ``<out>/stage``, the HTML in ``<out>/html`` (replaced only when a build succeeds)."""
    out = Path(out)
    if not out.is_absolute():
        out = REPO_ROOT / out
    _check_writable(out)
    stage = stage_book(profile, out / "stage", only, rerun=rerun)
    jb = shutil.which("jupyter-book", path=str(Path(sys.executable).parent))
    cmd = [jb] if jb else [sys.executable, "-m", "jupyter_book"]
    cmd += ["build", str(stage), "--path-output", str(stage)]   # JB writes <stage>/_build/{html,.doctrees,...}
    result = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"jupyter-book build failed with status {result.returncode}")
    built = stage / "_build" / "html"
    if not (built / "index.html").exists():
        raise RuntimeError(f"jupyter-book did not write {built / 'index.html'}")
    html = out / "html"
    if html.exists():
        shutil.rmtree(html)
    shutil.move(str(built), str(html))
    return html


def publish(html: str | Path = "_build/html", *, repo: str | Path | None = None, push: bool = False,
            remote: str = "origin", branch: str = "gh-pages", message: str | None = None) -> str:
    """Put the built HTML on the ``gh-pages`` branch of the git repository ``repo`` (default: the current
    directory) with ghp-import, adding ``.nojekyll`` (Sphinx's ``_static``/``_images`` folders would otherwise be
    hidden by GitHub Pages); with ``push``, force-push that branch to ``remote``. This is Jupyter Book's documented
    route, ``ghp-import -n -p -f _build/html``. The working tree and the current branch are not touched.
    Returns the commit of the new ``gh-pages``."""
    repo = Path.cwd() if repo is None else Path(repo)
    html = Path(html)
    if not html.is_absolute():
        html = repo / html
    if not (html / "index.html").exists():
        raise InputError(f"no built book at {html} (build it first: make book, or depthlib book --profile smoke)")
    if shutil.which("git") is None:
        raise InputError("git is needed to publish the book")
    ghp = shutil.which("ghp-import", path=str(Path(sys.executable).parent))
    cmd = [ghp] if ghp else [sys.executable, "-m", "ghp_import"]
    cmd += ["--no-jekyll", "--remote", remote, "--branch", branch,
            "--message", message or f"Publish the book ({html.name})"]
    if push:
        cmd += ["--push", "--force"]
    result = subprocess.run(cmd + [str(html)], cwd=repo, capture_output=True, text=True)
    if result.returncode != 0:
        if "No module named ghp_import" in result.stderr:
            raise InputError("ghp-import is not installed: pip install 'depthlib[book]'")
        raise InputError(f"ghp-import failed: {(result.stderr or result.stdout).strip().splitlines()[-1:]}")
    sys.stderr.write(result.stderr)
    head = subprocess.run(["git", "rev-parse", branch], cwd=repo, capture_output=True, text=True, check=True)
    return head.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """``python -m depthlib.book refresh [NOTEBOOK ...]`` re-executes the committed notebooks (cpu, committed runs);
    ``assets`` re-vendors the JS; ``publish [--push] [--html DIR]`` writes (and pushes) the gh-pages branch."""
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m depthlib.book refresh [NOTEBOOK ...] | assets | publish [--push] [--html DIR]"
    if not argv or argv[0] not in ("refresh", "assets", "publish"):
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "assets":
        print(vendor_assets(force=True))
        return 0
    if argv[0] == "publish":
        import argparse
        parser = argparse.ArgumentParser(prog="python -m depthlib.book publish")
        parser.add_argument("--push", action="store_true", help="also force-push gh-pages to the remote")
        parser.add_argument("--html", default=str(REPO_ROOT / "_build" / "html"), help="the built book")
        parser.add_argument("--remote", default="origin")
        parser.add_argument("--branch", default="gh-pages")
        args = parser.parse_args(argv[1:])
        try:
            commit = publish(args.html, push=args.push, remote=args.remote, branch=args.branch)
        except InputError as err:
            print(f"depthlib book publish: error: {err}", file=sys.stderr)
            return 2
        print(f"{args.branch} is at {commit}" + (f" (pushed to {args.remote})" if args.push else " (not pushed)"))
        return 0
    try:
        for path in refresh_committed(argv[1:] or None):
            print(path)
    except InputError as err:
        print(f"depthlib book refresh: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

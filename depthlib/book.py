"""Build the executable book: vendor the JS assets, execute the notebooks with papermill, run Jupyter Book.

The committed notebooks hold the outputs of a seeded ``smoke`` run (what ``pytest --nbval notebooks``
compares against). Building never rewrites them: executed copies go to ``<out>/stage/notebooks`` and the
HTML to ``<out>/_build/html``. The book is self-contained and works from ``file://`` with no network:
plotly.js comes from the plotly wheel, the ipywidgets embed bundle and MathJax 3 from the npm registry.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from depthlib.errors import InputError
from depthlib.results import REPO_ROOT

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
        raise InputError("npm is needed to vendor the book's JS assets (apt-get install npm)")
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
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        wanted = [o.removesuffix(".ipynb") for o in only]
        chosen = [p for p in paths if any(p.stem == w or p.stem.startswith(w) for w in wanted)]
        unknown = [w for w in wanted if not any(p.stem == w or p.stem.startswith(w) for p in paths)]
        if unknown:
            raise InputError(f"no notebook named {', '.join(unknown)} (have {', '.join(p.stem for p in paths)})")
        return chosen
    return paths


def _hide_injected_parameters(path: Path) -> None:
    """Tag papermill's injected-parameters cell ``remove-cell`` so the book does not show it."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def execute_notebook(src: Path, dst: Path, parameters: dict | None = None) -> Path:
    """Execute one notebook with papermill, from the notebooks folder (as nbval and JupyterLab do)."""
    import papermill as pm
    dst.parent.mkdir(parents=True, exist_ok=True)
    print(f"[depthlib book] executing {src.name} {parameters or ''}", file=sys.stderr, flush=True)
    pm.execute_notebook(str(src), str(dst), parameters=parameters or None, kernel_name="python3",
                        cwd=str(NOTEBOOKS), progress_bar=False, log_output=False)
    if parameters:
        _hide_injected_parameters(dst)
    return dst


def refresh_committed(only: list[str] | None = None) -> list[Path]:
    """Re-execute the committed notebooks in place with their own (smoke) parameters.

    This is how the seeded smoke outputs that ``pytest --nbval notebooks`` compares against are made.
    """
    done = []
    for path in notebook_paths(only):
        execute_notebook(path, path, parameters=None)
        done.append(path)
    return done


def stage_book(profile: str, stage: Path, only: list[str] | None = None) -> Path:
    """Lay out the book's sources in ``stage`` with every notebook executed on ``profile``."""
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(REPO_ROOT / name, stage / name)
    shutil.copytree(REPO_ROOT / "book", stage / "book")
    shutil.copytree(vendor_assets(), stage / "book_assets")
    for name in ("depthlib.css", "mathjax2-shim.js"):   # the book's own small assets
        shutil.copy(REPO_ROOT / "book" / name, stage / "book_assets" / name)
    chosen = set(notebook_paths(only))
    for path in notebook_paths():
        dst = stage / "notebooks" / path.name
        if path in chosen:
            execute_notebook(path, dst, parameters={"PROFILE": profile})
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dst)
    return stage


def build_book(profile: str = "cpu", out: str | Path = "_build", only: list[str] | None = None) -> Path:
    """Execute the notebooks on ``profile`` and build the HTML book; returns the HTML folder."""
    out = Path(out)
    if not out.is_absolute():
        out = REPO_ROOT / out
    stage = stage_book(profile, out / "stage", only)
    cmd = [sys.executable, "-m", "jupyter_book", "build", str(stage), "--path-output", str(out)]
    jb = shutil.which("jupyter-book", path=str(Path(sys.executable).parent))
    if jb:
        cmd = [jb, "build", str(stage), "--path-output", str(out)]
    result = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"jupyter-book build failed with status {result.returncode}")
    html = out / "_build" / "html"
    if not (html / "index.html").exists():
        raise RuntimeError(f"jupyter-book did not write {html / 'index.html'}")
    return html


def main(argv: list[str] | None = None) -> int:
    """``python -m depthlib.book refresh [NOTEBOOK ...]`` re-executes the committed smoke notebooks."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("refresh", "assets"):
        print("usage: python -m depthlib.book refresh [NOTEBOOK ...] | assets", file=sys.stderr)
        return 2
    if argv[0] == "assets":
        print(vendor_assets(force=True))
        return 0
    for path in refresh_committed(argv[1:] or None):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

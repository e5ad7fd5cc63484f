"""What the book build ships to readers, without building it.

`make publish`: the built HTML goes on a gh-pages branch with ghp-import, and is pushed only when asked. Runs
against a temporary bare repository and a `git clone` of it (no network): a tiny fake ``_build/html`` stands in
for the book. Then, with the kernel and Jupyter Book stubbed: where ``build_book`` writes (HTML in ``<out>/html``,
the committed notebooks untouched), the ``PROFILE``/``RERUN`` parameters, and what ``refresh`` and the executed
copies keep of the outputs (no nbval-ignored figures in the committed notebooks, no progress bars anywhere).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from depthlib import book
from depthlib.errors import InputError

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is needed to publish")
pytest.importorskip("ghp_import", reason="ghp-import (the book extra) publishes the book")


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _files(repo: Path, ref: str) -> set[str]:
    return set(_git("ls-tree", "-r", "--name-only", ref, cwd=repo).split())


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """A clone of a bare 'origin' with one commit on main, and a fake built book in its git-ignored _build."""
    monkeypatch.setenv("HOME", str(tmp_path))                     # no user git config leaks in
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "depthlib test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.invalid")
    origin = tmp_path / "origin.git"
    _git("init", "--bare", "--initial-branch=main", str(origin), cwd=tmp_path)
    _git("clone", str(origin), "work", cwd=tmp_path)
    work = tmp_path / "work"
    _git("config", "user.name", "depthlib test", cwd=work)
    _git("config", "user.email", "test@example.invalid", cwd=work)
    (work / ".gitignore").write_text("_build/\n")
    (work / "README.md").write_text("a project\n")
    _git("symbolic-ref", "HEAD", "refs/heads/main", cwd=work)   # whatever init.defaultBranch says
    _git("add", ".", cwd=work)
    _git("commit", "-m", "initial", cwd=work)
    _git("push", "origin", "main", cwd=work)
    html = work / "_build" / "html"
    (html / "_static").mkdir(parents=True)
    (html / "index.html").write_text("<!doctype html><title>the book</title><p>hello</p>\n")
    (html / "_static" / "style.css").write_text("p { color: black }\n")
    return work, origin, html


def test_publish_writes_local_gh_pages_only(clone):
    work, origin, html = clone
    commit = book.publish(html, repo=work)
    files = _files(work, "gh-pages")
    assert {"index.html", ".nojekyll", "_static/style.css"} <= files
    assert commit == _git("rev-parse", "gh-pages", cwd=work).strip()
    # not pushed: the remote has no gh-pages
    assert "gh-pages" not in _git("branch", "--list", cwd=origin)
    # the working tree and the current branch are untouched
    assert _git("status", "--porcelain", cwd=work) == ""
    assert _git("rev-parse", "--abbrev-ref", "HEAD", cwd=work).strip() == "main"
    assert _files(work, "main") == {".gitignore", "README.md"}


def test_publish_pushes_to_the_remote(clone, monkeypatch, capsys):
    work, origin, html = clone
    monkeypatch.chdir(work)                                      # as `make publish PUSH=1` runs it
    assert book.main(["publish", "--push", "--html", str(html)]) == 0
    assert "pushed to origin" in capsys.readouterr().out
    assert {"index.html", ".nojekyll"} <= _files(origin, "gh-pages")
    assert _git("rev-parse", "gh-pages", cwd=origin) == _git("rev-parse", "gh-pages", cwd=work)
    # a second publish of a changed book replaces the branch's content on the remote
    (html / "index.html").write_text("<!doctype html><title>the book</title><p>v2</p>\n")
    (html / "_static" / "style.css").unlink()
    book.publish(html, repo=work, push=True)
    assert _files(origin, "gh-pages") == {"index.html", ".nojekyll"}
    assert "v2" in _git("show", "gh-pages:index.html", cwd=origin)


def test_publish_without_a_built_book_says_so(clone):
    work, _, _ = clone
    with pytest.raises(InputError, match="no built book"):
        book.publish(work / "_build" / "nothing", repo=work)
    assert book.main(["publish", "--html", str(work / "_build" / "nothing")]) == 2


# ---- what building and refreshing write (no kernel, no Jupyter Book: both are stubbed) --------------------------
def _nb(cells: list[dict]) -> dict:
    return {"cells": cells, "metadata": {"widgets": {"state": {}}}, "nbformat": 4, "nbformat_minor": 5}


def _code(tags: list[str], outputs: list[dict], source: str = "x") -> dict:
    return {"cell_type": "code", "metadata": {"tags": tags}, "source": source, "outputs": outputs,
            "execution_count": 1}


FIGURE = {"output_type": "display_data", "data": {"text/html": "<div>plot</div>"}, "metadata": {}}
NUMBERS = {"output_type": "stream", "name": "stdout", "text": "alpha 1.2\n"}
WIDGET = {"output_type": "display_data", "metadata": {},
          "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "a"}, "text/plain": "interactive(...)"}}


def test_refresh_strips_only_the_outputs_nbval_ignores():
    nb = _nb([_code(["nbval-ignore-output"], [FIGURE, WIDGET]), _code(["nbval-check-output"], [NUMBERS]),
              _code([], [NUMBERS]), _code([], [FIGURE], source="# NBVAL_IGNORE_OUTPUT\nshow()")])
    assert book.strip_ignored_outputs(nb) == 2
    assert [c["outputs"] for c in nb["cells"]] == [[], [NUMBERS], [NUMBERS], []]
    assert "widgets" not in nb["metadata"]          # no output shows a widget any more
    kept = _nb([_code([], [WIDGET])])
    book.strip_ignored_outputs(kept)
    assert "widgets" in kept["metadata"]


def test_progress_bars_are_removed_from_outputs():
    bar = "Converting and de-quantizing GGUF tensors...: 100%|██████████| 236/236 [00:02<00:00, 90.1it/s]"
    tqdm_widget = {"output_type": "display_data", "metadata": {},
                   "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "b"},
                            "text/plain": "probe gemma-3-270m:  50%|#####     | 1/2 [00:01<00:01,  1.0s/doc]"}}
    nb = _nb([_code([], [{"output_type": "stream", "name": "stderr", "text": f"  0%| | 0/236 [00:00<?, ?it/s]\r{bar}\n"},
                         {"output_type": "stream", "name": "stderr", "text": f"UserWarning: careful\n{bar}\n"},
                         tqdm_widget, WIDGET, NUMBERS])])
    assert book.strip_progress_bars(nb) == 3
    assert nb["cells"][0]["outputs"] == [{"output_type": "stream", "name": "stderr", "text": "UserWarning: careful\n"},
                                         WIDGET, NUMBERS]


def test_build_writes_html_under_out_and_passes_profile_and_rerun(tmp_path, monkeypatch):
    """``build_book`` puts the HTML in <out>/html and everything else in <out>/stage; the notebooks get PROFILE and
    RERUN; the committed notebooks are not touched."""
    executed = {}

    def fake_execute(src, dst, parameters=None):
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(src.read_text())
        executed[src.stem] = parameters
        return dst

    def fake_jupyter_book(cmd, **kwargs):
        stage = Path(cmd[cmd.index("build") + 1])
        assert Path(cmd[cmd.index("--path-output") + 1]) == stage
        (stage / "_build" / "html").mkdir(parents=True)
        (stage / "_build" / "html" / "index.html").write_text("<p>book</p>")
        return subprocess.CompletedProcess(cmd, 0)

    assets = tmp_path / "assets"
    assets.mkdir()
    monkeypatch.setattr(book, "execute_notebook", fake_execute)
    monkeypatch.setattr(book, "vendor_assets", lambda: assets)
    monkeypatch.setattr(book, "prepare_models", lambda notebooks: [])
    monkeypatch.setattr(book.subprocess, "run", fake_jupyter_book)
    committed = {p: p.stat().st_mtime_ns for p in book.notebook_paths()}
    html = book.build_book(profile="smoke", out=tmp_path / "out", rerun=True, only=["03"])
    assert html == tmp_path / "out" / "html" and (html / "index.html").exists()
    assert not (tmp_path / "out" / "stage" / "_build" / "html").exists()
    assert executed == {"03_toy": {"PROFILE": "smoke", "RERUN": True}}
    assert sorted(p.name for p in (tmp_path / "out" / "stage" / "notebooks").iterdir()) == \
        sorted(p.name for p in committed)
    assert {p: p.stat().st_mtime_ns for p in book.notebook_paths()} == committed
    # the staged configuration is the repository's plus the substitutions the intro quotes from the verdict
    import yaml
    staged = yaml.safe_load((tmp_path / "out" / "stage" / "_config.yml").read_text(encoding="utf-8"))
    own = yaml.safe_load((book.REPO_ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert staged["execute"] == own["execute"] and staged["sphinx"] == own["sphinx"]
    quoted = set(re.findall(r"{{\s*(\w+)\s*}}", (book.REPO_ROOT / "book" / "intro.md").read_text(encoding="utf-8")))
    assert quoted and quoted <= set(staged["parse"]["myst_substitutions"])


def test_book_command_has_rerun():
    from depthlib import cli
    args = cli.build_parser().parse_args(["book", "--profile", "smoke", "--rerun"])
    assert args.rerun is True and args.profile == "smoke"
    assert cli.build_parser().parse_args(["book"]).rerun is False


def test_committed_notebooks_hold_no_machine_paths():
    """The committed notebooks carry no absolute path of the machine that executed them (papermill records its
    input/output paths; ``depthlib.book refresh`` drops them)."""
    import json
    from pathlib import Path
    for path in sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb")):
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("papermill", {})
        assert not {"input_path", "output_path"} & set(meta), path.name


def test_refresh_takes_a_notebooks_path_and_refuses_an_unknown_one_in_a_line(capsys):
    from depthlib import book
    assert book.notebook_paths(["notebooks/07_compose.ipynb"]) == book.notebook_paths(["07"])
    assert book.main(["refresh", "notebooks/99_nothing.ipynb"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("depthlib book refresh: error: no notebook named 99_nothing") and len(err.splitlines()) == 1

"""Adding a chapter is one package and one notebook: the README's tiny chapter (its two files are read from the README's
"Add a chapter" section, so the README cannot drift from what works), registered, gets its command (through
``depthlib.cli.main``) and its page in the book (the notebook list, the table of contents, its notebook executed by
the book's own staging step)."""
from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from depthlib import book, chapters, cli, verdict
from depthlib.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
NAME = "tinychapter"


def _readme_file(first_line: str) -> str:
    """The README's Python block that starts with ``first_line`` (a comment naming the file)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"the README has no block starting {first_line!r}"
    return found[0]


def _notebook() -> dict:
    """The tiny chapter's notebook: the parameters cell, then its runs and their summary (as every chapter's)."""
    def code(source: str, tags=()) -> dict:
        return {"cell_type": "code", "execution_count": None, "id": f"code{len(tags)}", "metadata": {"tags": list(tags)},
                "outputs": [], "source": source}
    return {"cells": [{"cell_type": "markdown", "id": "title", "metadata": {}, "source": "# 8. A tiny chapter"},
                      code('PROFILE = "cpu"\nRERUN = False', tags=("parameters",)),
                      code("from tinychapter import chapter\n\nruns = chapter.runs(PROFILE, rerun=RERUN)\n"
                           "print('total', chapter.summary(runs['numbers'])['total'])")],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """The README's tiny chapter as a package (on this process's path and the notebook kernels'), its notebook, and
    its registration (taken out again afterwards)."""
    package = tmp_path / "plugins" / NAME
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("numbers", "chapter"):
        (package / f"{name}.py").write_text(_readme_file(f"# {NAME}/{name}.py"))
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    number = len(chapters.CHAPTERS) + 1
    (notebooks / f"{number:02d}_{NAME}.ipynb").write_text(json.dumps(_notebook()))
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(package.parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    chapter = chapters.register(chapters.Chapter(number, NAME, "A tiny chapter", (NAME,), package=NAME,
                                                 notebook_dir=str(notebooks)))
    import depthlib
    assert depthlib.CHAPTERS[-1] is chapter          # the package's name for the registry sees it too
    try:
        yield chapter
    finally:
        chapters.unregister(NAME)
        for module in [m for m in sys.modules if m.split(".")[0] in (NAME, "halfchapter")]:
            del sys.modules[module]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_a_registered_chapter_gets_its_command(tiny, capsys):
    assert chapters.by_name(NAME) is tiny and chapters.CHAPTERS[-1] is tiny
    from tests.test_contract import COMPUTE_SHAPE
    shape = [(p.name, p.kind, p.default) for p in inspect.signature(tiny.module.compute).parameters.values()]
    assert shape == COMPUTE_SHAPE                    # the README's compute has every chapter's shape
    assert NAME in cli.build_parser().format_usage()
    assert cli.main([NAME, "--profile", "smoke", "--json"]) == 0
    out = _json(capsys)
    assert (out["part"], out["profile"], out["n"], out["total"]) == ("numbers", "smoke", 3, 3.0)
    assert Path(out["run"]).parent.name == NAME and not out["loaded_from_cache"]
    assert cli.main([NAME, "--profile", "smoke", "--json"]) == 0                     # the second time: the cache
    assert _json(capsys)["loaded_from_cache"]
    assert cli.main([NAME, "--profile", "smoke", "--set", "n=5", "--set", "scale=0.5", "--json"]) == 0
    out = _json(capsys)
    assert (out["profile"], out["n"], out["total"]) == ("custom", 5, 5.0)           # 0.5 · (0 + 1 + 2 + 3 + 4)
    from depthlib import results
    assert results.Run.load(Path(out["run"])).manifest["profile"] == "custom"
    for argv, message in (([NAME, "--profile", "smoke", "--set", "n=many"], "--set n: n takes an integer, got 'many'"),
                          ([NAME, "--set", "n=0"], "n must be >= 1, got 0"),
                          ([NAME, "--set", "size=3"], "TinyProfile (chapter tinychapter) has no field 'size'")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"depthlib {NAME}: error: ") and message in err[0], err


def test_the_book_build_follows_the_registry(tiny, tmp_path):
    """The notebook list and the table of contents end with the registered chapter, and the book's staging step
    executes its notebook (the others are copied as committed)."""
    assert book.notebook_paths()[-1] == tiny.notebook_path and book.notebook_paths([tiny.notebook]) == [tiny.notebook_path]
    staged = book.stage_notebooks(tmp_path / "stage", "smoke", only=[tiny.notebook])
    assert [p.stem for p in staged] == [c.notebook for c in chapters.CHAPTERS]
    toc = yaml.safe_load((tmp_path / "stage" / "_toc.yml").read_text())
    files = [e["file"] for part in toc["parts"] for e in part["chapters"]]
    assert [f for f in files if f.startswith("notebooks/")] == [f"notebooks/{c.notebook}" for c in chapters.CHAPTERS]
    executed = json.loads(staged[-1].read_text())
    text = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    assert "total 3.0" in text                                         # PROFILE = "smoke", injected by papermill
    # not executed: the committed copy, as the book shows it (book.book_view: no static figures, MyST targets)
    committed = tmp_path / "committed.ipynb"
    shutil.copy(book.notebook_paths()[0], committed)
    assert staged[0].read_bytes() == book.book_view(committed).read_bytes()


def test_the_verdicts_list_of_reductions_follows_the_registry(tiny):
    """The verdict's "how reduced" list has one line per chapter, the registered one's from its own ``reduction``."""
    lines = verdict.reductions("smoke")
    assert [line.split("**")[1] for line in lines] == [f"{c.number}." for c in chapters.CHAPTERS]
    assert lines[-1] == f"**{tiny.number}.** 3 numbers (the paper profile: 1000)"


def test_the_table_of_contents_lists_exactly_the_registrys_notebooks():
    """``_toc.yml`` is the table of contents the book is built with (``book.table_of_contents``): its chapters are
    the registry's notebooks, in order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert book.table_of_contents() == toc
    files = [e["file"] for part in toc["parts"] for e in part["chapters"]]
    assert [f for f in files if f.startswith("notebooks/")] == [f"notebooks/{c.notebook}" for c in chapters.CHAPTERS]


def test_register_refuses_what_is_not_a_chapter_of_its_own(tiny, tmp_path, monkeypatch):
    with pytest.raises(InputError, match="taken"):
        chapters.register(chapters.Chapter(99, "toy", "again", ("toy-again",)))
    with pytest.raises(InputError, match="number 3"):
        chapters.register(chapters.Chapter(3, "other", "other", ("other",), package=NAME))
    with pytest.raises(InputError, match="experiments of its own"):
        chapters.register(chapters.Chapter(99, "other", "other", ("lm",), package=NAME))
    half = tmp_path / "plugins" / "halfchapter"
    half.mkdir()
    (half / "__init__.py").write_text("")
    (half / "chapter.py").write_text("PROFILES = {}\n")
    with pytest.raises(InputError, match="lacks runs, compute, replay, describe, summary, reduction, COMPUTE"):
        chapters.register(chapters.Chapter(99, "halfchapter", "half", ("halfchapter",), package="halfchapter"))
    before = chapters.CHAPTERS
    chapters.unregister("toy")                                          # the book's own chapters stay
    assert chapters.CHAPTERS == before

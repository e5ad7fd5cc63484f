"""The smoke end-to-end path: every chapter notebook executes with papermill on ``PROFILE = "smoke"`` (computing its
own seconds-long runs where none is cached) and says on the page that its numbers are placeholders.

The committed notebooks default to ``PROFILE = "cpu"`` and hold outputs drawn from the committed runs (what
``pytest --nbval notebooks`` compares); this test keeps the path that computes everything from scratch working.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _parameters(path: Path) -> str:
    nb = json.loads(path.read_text())
    return next("".join(c["source"]) for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_defaults_to_the_cpu_profile(path):
    assert 'PROFILE = "cpu"' in _parameters(path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_on_smoke_and_shows_the_placeholder_box(path, tmp_path):
    pytest.importorskip("papermill")
    from depthlib import book
    out = book.execute_notebook(path, tmp_path / path.name, parameters={"PROFILE": "smoke"})
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    html = "".join("".join(o.get("data", {}).get("text/html", "")) for c in nb["cells"] for o in c.get("outputs", []))
    assert "Placeholder numbers" in html, f"{path.name} shows smoke numbers without the placeholder box"

"""Shared test set-up: the Chinchilla CSV comes from ../shared/data (CI) or DEPTHLIB_DATA_DIR."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_CHINCHILLA = ROOT.parent / "shared" / "data" / "chinchilla"

if "DEPTHLIB_DATA_DIR" not in os.environ and SHARED_CHINCHILLA.exists():
    os.environ["DEPTHLIB_DATA_DIR"] = str(SHARED_CHINCHILLA)


@pytest.fixture(scope="session")
def chinchilla_df():
    from depthlib import data
    if "DEPTHLIB_DATA_DIR" not in os.environ:
        pytest.skip("no local Chinchilla CSV: set DEPTHLIB_DATA_DIR")
    return data.chinchilla()


#: Test files whose tests share no expensive fixture, so ``make test``'s workers (pytest-xdist, ``--dist loadgroup``)
#: may spread them one test at a time: the committed-run replays and the notebooks' smoke runs are the longest tests.
SPREAD = frozenset({"test_committed_runs.py", "test_notebooks_smoke.py"})


#: Files that must share one worker: both build the book into the checkout (vendored assets, ``_build``).
TOGETHER = {"test_book_browser.py": "book", "test_book_publish.py": "book"}


def pytest_collection_modifyitems(config, items):
    """Keep every other file on one worker (its module fixtures are built once; a notebook's cells share a kernel)."""
    for item in items:
        if item.path.name not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(TOGETHER.get(item.path.name, item.path.name)))

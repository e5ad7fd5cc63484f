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


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The local results cache of one test (``DEPTHLIB_CACHE_DIR``), empty: its path."""
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test (tiny models: more threads only add overhead), restored afterwards."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Separate committed and local roots (``DEPTHLIB_RESULTS_DIR``, ``DEPTHLIB_CACHE_DIR``) for one test:
    (committed root, local results root)."""
    committed, cache = tmp_path / "committed", tmp_path / "cache"
    monkeypatch.setenv("DEPTHLIB_RESULTS_DIR", str(committed))
    monkeypatch.setenv("DEPTHLIB_CACHE_DIR", str(cache))
    return committed, cache / "results"

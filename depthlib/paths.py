"""Where things live: a source checkout or an installed wheel, and the user's cache (design: Layout).

In a checkout (``pyproject.toml`` beside the package) caches go to ``<repo>/data/cache`` and committed runs are
read from ``<repo>/data/results``. Installed from a wheel, caches go to the user cache directory
(``$XDG_CACHE_HOME/depthlib`` or ``~/.cache/depthlib``) and there are no committed runs unless
``DEPTHLIB_RESULTS_DIR`` points at a folder of them. ``DEPTHLIB_CACHE_DIR`` overrides the cache location.
Files the library reads at run time (the fact set) ship inside the package: :func:`package_file`.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent


def in_checkout() -> bool:
    """True when running from a source checkout (editable install or ``PYTHONPATH``), not a wheel."""
    return (REPO_ROOT / "pyproject.toml").exists() and (REPO_ROOT / "notebooks").is_dir()


def cache_dir() -> Path:
    """Git-ignored cache for downloads, converted models and local runs."""
    env = os.environ.get("DEPTHLIB_CACHE_DIR")
    if env:
        return Path(env)
    if in_checkout():
        return REPO_ROOT / "data" / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "depthlib"


def committed_results_dir() -> Path | None:
    """Committed runs (``data/results`` of a checkout); ``DEPTHLIB_RESULTS_DIR`` overrides; None in a wheel."""
    env = os.environ.get("DEPTHLIB_RESULTS_DIR")
    if env:
        return Path(env)
    return REPO_ROOT / "data" / "results" if in_checkout() else None


def local_results_dir() -> Path:
    return cache_dir() / "results"


def package_file(*parts: str) -> Path:
    """A data file shipped inside the package, e.g. ``package_file("tracing", "facts", "facts.jsonl")``."""
    path = Path(str(resources.files("depthlib").joinpath(*parts)))
    if not path.exists():
        raise FileNotFoundError(f"depthlib package data {'/'.join(parts)} is missing (a broken install?)")
    return path

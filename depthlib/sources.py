"""What a view reads: a finished run, or a mapping of its tables.

Every chapter's views (``*_views``) take either a :class:`depthlib.results.Run` or a plain mapping — table name →
DataFrame, ``"config"`` → the run's config, ``"manifest"`` → its manifest — so that their rules can be tested on
tables with known answers. These three readers are the one place that tells the two apart.
"""
from __future__ import annotations

import pandas as pd

__all__ = ["config", "manifest", "table"]


def table(source, name: str) -> pd.DataFrame:
    """The table ``name`` of a run or a mapping."""
    return source.table(name) if hasattr(source, "table") else source[name]


def config(source) -> dict:
    """The run's config (a mapping's ``"config"``, empty when it has none)."""
    return dict(source.config) if hasattr(source, "table") else dict(source.get("config", {}))


def manifest(source) -> dict:
    """The run's manifest (a mapping's ``"manifest"``, empty when it has none)."""
    return dict(source.manifest) if hasattr(source, "table") else dict(source.get("manifest", {}))

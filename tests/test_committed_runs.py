"""Every committed run under data/results is computed by the current code (issue 8: provenance that cannot lie).

For each committed run: its manifest's code fingerprint equals the current code's, its tables pass their
checksums, and a cheap prefix replayed with the current code (the first evaluation interval of a toy student,
one batch of a probe run's documents, one prompt's restoration grid, the first bootstrap resamples) reproduces
the committed numbers. A change to the numerics that breaks this means recomputing that run
(``make book RERUN=1``, then ``python -m depthlib.results commit <run folder>``).
"""
from __future__ import annotations

import numpy as np
import pytest

from depthlib import paths, results
from depthlib.chapters import CHAPTERS, chapter_of, compute_entry

ROOT = paths.committed_results_dir()

#: replay tolerances (relative), by experiment (a name ending in "-" is a prefix): the toy and the fits are
#: deterministic on one CPU; models in fp32 differ only by the order of floating-point sums when batches are composed
#: differently
RTOL = {"chinchilla": 1e-9, "toy": 1e-4, "toy-calibration": 1e-4,
        "causal_tracing": 1e-4, "probes-": 1e-4, "lm-depth": 1e-4, "interventions-": 1e-4}


def _rtol(experiment: str) -> float:
    for prefix in RTOL:
        if experiment == prefix or (prefix.endswith("-") and experiment.startswith(prefix)):
            return RTOL[prefix]
    raise AssertionError(f"no replay tolerance for experiment {experiment!r}: add it to RTOL")


COMMITTED = sorted(ROOT.glob("*/*/manifest.json")) if ROOT is not None else []


def test_every_chapter_has_a_committed_run():
    experiments = {p.parent.parent.name for p in COMMITTED}
    for chapter in CHAPTERS:
        assert any(chapter.owns(e) for e in experiments), chapter.name


@pytest.mark.parametrize("manifest", COMMITTED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_committed_run_records_its_derived_code(manifest):
    """The manifest lists the modules derived from its chapter's compute entry (results.compute_modules), not a
    hand-kept list that may miss one (a run recorded otherwise was re-stamped where that hid nothing, or must be
    recomputed: ``python -m depthlib.results restamp`` says which)."""
    experiment = manifest.parent.parent.name
    run = results.Run(experiment, {}, manifest.parent)
    derived = list(results.compute_modules(compute_entry(experiment)))
    assert run.manifest.get("code_modules") == derived, (
        f"{run.path} records {run.manifest.get('code_modules')}, its compute entry derives {derived}: recompute it")


@pytest.mark.parametrize("manifest", COMMITTED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_committed_run_is_fresh_and_intact(manifest):
    run = results.Run(manifest.parent.parent.name, {}, manifest.parent)
    m = run.manifest
    assert m.get("status") == "complete"
    assert not run.stale, (f"{run.path} was computed by code {m.get('code_fingerprint')}; the current code differs: "
                           "recompute it (make book RERUN=1) and commit the new run")
    run.validate()
    assert sum(p.stat().st_size for p in run.path.iterdir()) < 4_000_000, "a committed run should be a few MB at most"


@pytest.mark.slow
@pytest.mark.parametrize("manifest", COMMITTED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_committed_run_replays(manifest):
    experiment = manifest.parent.parent.name
    run = results.Run(experiment, {}, manifest.parent)
    run.config = run.manifest["config"]
    table = chapter_of(experiment).module.replay(run)
    assert len(table) > 0 and table["committed"].notna().all(), "the replay found nothing to compare"
    np.testing.assert_allclose(table["replayed"].to_numpy(float), table["committed"].to_numpy(float),
                               rtol=_rtol(experiment), atol=1e-9)

"""Every committed run under data/results is computed by the current code: provenance that cannot lie.

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

#: Replay tolerances, relative to the committed value (``|replayed − committed| <= rtol · |committed| + atol``, with
#: ``atol`` the replay's own column where it has one). Each says what another CPU may change; the replays below were
#: measured on an AMD EPYC (AVX-512, no AMX) against runs committed from an Intel (AVX-512, AMX) machine:
#: - scaling (chapter 1): 0 relative; the replay's ``atol`` is its minimiser's convergence tolerance. Levenberg–Marquardt
#:   stops when a step lowers the cost by < 1e-12 of it, which fixes the parameters only to ≈ sqrt(2e-12 · C ·
#:   (H⁻¹)_ii) in the objective's flat (c_ℓ, α_ℓ) valley (scaling.solvers.parameter_tolerance: 8.8e-7 for α_m,
#:   2.8e-6 for α_ℓ at k = 40). Measured: α_ℓ 1.7e-7 apart, α_m 4.8e-8 (0.9454793422 committed): 6 % of theirs.
#: - fp32 models (probes, causal tracing, interventions, the depth series): 1e-4 ≈ d_model · eps32, the bound on
#:   a float32 dot product over the residual width (576 or 640 terms × 1.19e-7 = 6.9e-5 or 7.6e-5) when a CPU's
#:   kernels sum it in another order. Measured at most 2.6e-5 (a causal-tracing probability), 1.1e-6 for probe
#:   angles, 3.3e-7 for interventions' summed document losses, 1.2e-8 for the depth series' held-out losses. The AMD
#:   failure of an interventions replay (a document's summed KL, 81.3008 against 81.2852: 1.9e-4) came from computing
#:   KL as Σ p log p − Σ p log q, two large sums over the vocabulary that cancel; KL is now summed term by term
#:   (identical distributions give exactly 0, ``interventions.execute.LMBatch.score``) and takes the same 1e-4. Not yet
#:   re-measured on an Intel machine since.
#: - the toy (fp32 students, small matmuls): 1e-4, by the same bound over its widths; measured below 2.3e-6.
#: - chapter 6's converged series (lm-converged: the same family at width 32, its first evaluation replayed): 1e-4,
#:   the bound of the depth series; not yet measured across CPUs.
#: - chapter 7 (fp32 transformers of width 32 on 8-symbol sequences, 100 Adam steps replayed): 1e-4, the same bound
#:   (32 terms × 1.19e-7 = 3.8e-6 per dot product, amplified by the steps replayed); not yet measured across CPUs.
#: - chapter 7's looped toy students (compose-toy-certified): 1e-4. Its longest float32 sums are the MLP's 128-term dot
#:   products (128 × 1.19e-7 = 1.5e-5) and the ℓ = 6 per-layer gradients summed into the shared block (6 terms,
#:   7e-7); the first 5 % of steps replayed (Adam on one block, sign-like first steps) keep the held-out loss within
#:   a few such units; not yet measured across CPUs.
RTOL = {"scaling": 0.0, "toy": 1e-4, "toy-calibration": 1e-4, "toy-converged": 1e-4,
        "toy-certified": 1e-4, "toy-certified-units": 1e-4,
        "tracing": 1e-4, "probes-": 1e-4, "lm": 1e-4, "lm-": 1e-4, "interventions-": 1e-4, "compose-toy": 1e-4,
        "compose-": 1e-4}
#: float round-off of numbers that are 0 (a KL of the identity, an exactly-fitted point)
ATOL = 1e-9


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
    hand-kept list that may miss one (a run recorded otherwise must be recomputed, or re-stamped by a bit-identical
    smoke replay: ``python -m depthlib.purity``)."""
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


@pytest.mark.parametrize("manifest", COMMITTED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_committed_run_made_with_local_edits_names_the_commit_holding_its_code(manifest):
    """A run computed from a tree with uncommitted edits carries ``code_commit`` (``python -m depthlib.results
    locate``): a commit whose code of the run's computing modules has the run's fingerprint, so the provenance line
    points a reader at the exact code instead of "uncommitted changes"."""
    run = results.Run.load(manifest.parent)
    if not run.manifest.get("git_dirty"):
        pytest.skip("computed from a clean tree: its commit holds its code")
    recorded = run.manifest.get("code_commit")
    assert recorded, f"{manifest.parent}: run `python -m depthlib.results locate {manifest.parent}`"
    found = results.code_commit(run)
    if found is None and not paths.in_checkout():
        pytest.skip("no git history here to check the recorded commit against")
    assert found == recorded
    assert f"computing code is commit {recorded[:7]}'s" in results.provenance(run)


@pytest.mark.slow
@pytest.mark.parametrize("manifest", COMMITTED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_committed_run_replays(manifest):
    experiment = manifest.parent.parent.name
    run = results.Run(experiment, {}, manifest.parent)
    run.config = run.manifest["config"]
    from depthlib.errors import ReplayUnavailable
    try:
        table = chapter_of(experiment).module.replay(run)
    except ReplayUnavailable as err:                  # weights a fresh clone never has (chapter 5's toy controls)
        pytest.skip(str(err))
    assert len(table) > 0 and table["committed"].notna().all(), "the replay found nothing to compare"
    committed, replayed = table["committed"].to_numpy(float), table["replayed"].to_numpy(float)
    allowed = _rtol(experiment) * np.abs(committed) + (table["atol"].to_numpy(float) if "atol" in table else 0.0) + ATOL
    apart = np.abs(replayed - committed)
    assert np.all(apart <= allowed), (f"{int((apart > allowed).sum())} of {len(table)} replayed numbers lie outside "
                                      f"their tolerance:\n{table[apart > allowed].assign(allowed=allowed[apart > allowed])}")

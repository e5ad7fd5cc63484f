"""Chapter 1's glue: the profiles of the Chinchilla chapter, the run it shows, and its replay check.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (one part, ``fits``),
``compute``, ``replay``, ``describe``, ``summary`` and ``COMPUTE``.

A run holds the chapter's expensive tables: ``bootstrap`` (one converged fit per resample), ``held_out`` (one row per
80/20 split), ``exclusion_scan`` (converged fits for every number of excluded rows, depth ℓ and ℓ − 2) and, where the
profile asks for it, ``paper_scan`` (the paper's 50k-step Adam at k = 1, 10, …, 100, as ``scanignore.py``). The
single fits (paper preset, converged, ℓ − 2, Huber, the classic form) stay live in the notebook: they take seconds.
The config holds the sha256 of the CSV the run was computed from, so another CSV is another run.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from depthlib import data, results, selection
from depthlib.contract import Profile
from depthlib.errors import InputError
from depthlib.scaling import law

EXPERIMENT = "scaling"
#: The compute entry of each experiment's runs: the modules a run's numbers depend on are derived from its imports
#: (:func:`depthlib.results.compute_modules`: here scaling.law and data, not this glue).
COMPUTE = {EXPERIMENT: "depthlib.scaling.chapter:compute"}


@dataclass(frozen=True)
class ScalingProfile(Profile):
    """What the chapter computes under one profile (design: Profiles)."""

    name: str
    n_bootstrap: int                   # converged bootstrap resamples (the paper's bootstrap.py: 200 under-converged)
    paper_scan: bool                   # also rerun the paper's Adam over the exclusion counts (≈ 1 min on 2 cores)
    exclude: int = law.N_EXCLUDED_PAPER  # the paper's "drop the 40 highest losses" (strict rule: 42 rows)
    seed: int = 0                      # seeds the bootstrap draws and the held-out splits
    n_splits: int = 10                 # held-out 80/20 splits, as held_out_validation.py
    scan_excludes: tuple[int, ...] = tuple(range(0, 101))          # converged scan: every k up to 100
    scan_offsets: tuple[int, ...] = (0, 2)                          # depth ℓ and ℓ − 2 (fit-8)
    paper_scan_excludes: tuple[int, ...] = (1,) + tuple(range(10, 101, 10))   # scanignore.py's k
    adam_steps: int = 50_000           # the paper's run length (fit-5, scanignore.py)
    # where the Chinchilla CSV is (None: data.chinchilla_path's default): where, not what, so neither a run's config
    # (it holds the CSV's sha256) nor which profile the settings are depends on it
    csv: str | None = field(default=None, compare=False)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.pop("csv")
        return out


PROFILES: dict[str, ScalingProfile] = {
    # seconds: a 200-resample bootstrap (the committed notebook, CI)
    "smoke": ScalingProfile("smoke", n_bootstrap=200, paper_scan=False),
    # a minute or two on 2 CPU cores: 1000 resamples and the paper's Adam scan
    "cpu": ScalingProfile("cpu", n_bootstrap=1000, paper_scan=True),
    # the same on any machine, with a tighter bootstrap (the fits are CPU work; no GPU needed)
    "paper": ScalingProfile("paper", n_bootstrap=4000, paper_scan=True),
}


def csv_sha256(path: str | Path | None = None) -> str:
    """sha256 of the Chinchilla CSV the chapter reads (:func:`depthlib.data.chinchilla_path`)."""
    h = hashlib.sha256()
    with open(data.chinchilla_path(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def settings(profile: str | ScalingProfile) -> ScalingProfile:
    """The settings of ``profile``: a profile's name, or a :class:`ScalingProfile` itself (custom settings, e.g.
    ``depthlib scaling --set``: named ``custom`` unless they are a profile's own, so that their run is labelled so)."""
    return results.profile_settings(profile, PROFILES)


def chapter_config(profile: str | ScalingProfile) -> dict:
    """The results-cache config of a chapter run: the profile's settings and the sha256 of its CSV."""
    prof = settings(profile)
    return {**prof.to_dict(), "csv_sha256": csv_sha256(prof.csv)}


def _tables(prof: ScalingProfile, df: pd.DataFrame) -> dict:
    """Name -> how to compute it, in the order they are written (cheapest first)."""
    tables = {
        "held_out": lambda: law.held_out(df, n_splits=prof.n_splits, seed=prof.seed, exclude=prof.exclude),
        "exclusion_scan": lambda: law.exclusion_scan(df, excludes=prof.scan_excludes, depth_offsets=prof.scan_offsets),
        "bootstrap": lambda: law.bootstrap(df, n_resamples=prof.n_bootstrap, seed=prof.seed, exclude=prof.exclude),
    }
    if prof.paper_scan:
        tables["paper_scan"] = lambda: law.exclusion_scan(df, excludes=prof.paper_scan_excludes, depth_offsets=(0,),
                                                          preset="paper", steps=prof.adam_steps)
    return tables


def compute(cfg: str | ScalingProfile, device: str = "cpu", *, force: bool = False, progress: bool = True,
            executor=None) -> results.Run:
    """Compute (or resume, or load) the chapter's tables for ``cfg`` (a profile's name, or settings: labelled
    ``custom`` unless they are a profile's own) in the local results cache; returns the Run (the lifecycle of
    :func:`depthlib.results.computing`: tables already written are kept, so an interrupted run resumes; a complete
    run computed by other code is recomputed). The fits are NumPy work in this process: ``device``, ``progress``
    and ``executor`` change nothing."""
    prof = settings(cfg)
    config = chapter_config(prof)
    with results.computing(EXPERIMENT, config, profile=prof.name, seed=prof.seed, code=COMPUTE.values(),
                           force=force) as job:
        if job.complete:
            return job.run
        df = data.chinchilla(prof.csv)
        for name, table in _tables(prof, df).items():
            if not job.run.has(name):
                job.run.write_table(name, table())
                job.save_progress()
        job.record(n_runs=len(df), n_fitted=int((~law.excluded_mask(df["loss"].to_numpy(), prof.exclude)).sum()))
    return job.run


def check_bootstrap_memory(n_rows: int, n_resamples: int, law_name: str = "decomposed") -> None:
    """InputError, before any fit, if a bootstrap of ``n_resamples`` resamples of ``n_rows`` rows would not fit in
    memory (:func:`depthlib.validate.fits_in_memory`). Each resample holds its row draws and counts and, in the
    batched Levenberg–Marquardt solve, its residuals and Jacobian (rows × p parameters) several times over (current,
    trial, weighted): 8 · (8 + 7p) bytes per row bounds what tracemalloc measured on the 245-row CSV (355 bytes per row
    for the decomposed law, p = 7; 268 for the classic form, p = 5)."""
    from depthlib import validate
    per = 8 * (8 + 7 * len(law.parameter_names(law_name))) * n_rows
    validate.fits_in_memory(f"--bootstrap {n_resamples}", per * n_resamples,
                            fix=f"each resample needs about {per / 1024:.0f} KiB; lower --bootstrap")


def runs(profile: str | ScalingProfile = "smoke", *, rerun: bool = False, executor=None, device: str = "cpu",
         progress: bool = False, data_path: str | Path | None = None) -> dict[str, results.Run]:
    """``{"fits": run}``: the run chapter 1 shows for ``profile`` (the one rule: :func:`depthlib.results.select_run`,
    among runs whose config is a profile's current settings on this CSV); computed now if there is none. The fits
    are CPU work in this process (``executor``, ``device`` and ``progress`` change nothing). Custom settings (a
    :class:`ScalingProfile`) are computed, or loaded from the local cache, never chosen among committed runs."""
    if not isinstance(profile, str):
        return {"fits": compute(dataclasses.replace(profile, csv=data_path or profile.csv))}
    results.check_profile(profile)
    try:
        sha = csv_sha256(data_path)
    except InputError:
        if selection.looking_up():      # no CSV here: no run to show (the verdict's rows are then not tested here)
            return {"fits": None}
        raise

    def expected(prof: str) -> dict | None:
        return {**PROFILES[prof].to_dict(), "csv_sha256": sha} if prof in PROFILES else None

    return {"fits": results.chapter_run(EXPERIMENT, profile,
                                        lambda: compute(dataclasses.replace(PROFILES[profile], csv=data_path)),
                                        expected_config=expected, rerun=rerun)}


#: What :func:`replay` compares, per replayed fit.
REPLAYED = ("alpha_m", "alpha_l", "alpha_D", "L0")


def replay(run: results.Run, n_resamples: int = 3, data_path: str | Path | None = None) -> pd.DataFrame:
    """Recompute, with the current code, the first ``n_resamples`` bootstrap resamples of a run (the same draws:
    same seed and resample count) and its exclusion-scan row at the profile's exclusion, depth ℓ.

    Returns one row per number, with the committed and the recomputed value side by side (columns ``committed``,
    ``replayed``) and ``atol``, how far apart the two may lie: a converged minimiser is reproducible only to its
    solver's stopping rule, which on another CPU (another order of float sums) lands elsewhere in the objective's
    flat valley (:func:`depthlib.scaling.solvers.parameter_tolerance`; the standard error's tolerance follows from
    the parameters' to first order). Takes about a second.
    """
    config = run.config
    if config.get("csv_sha256") != csv_sha256(data_path):
        raise InputError(f"run {run.experiment}/{run.key} was computed from another CSV (sha256 "
                         f"{config.get('csv_sha256')}); point DEPTHLIB_DATA_DIR at that file to replay it")
    df = data.chinchilla(data_path)
    first = list(range(min(n_resamples, config["n_bootstrap"])))
    points = law.select_points(df, config["exclude"])
    weights = law.bootstrap_counts(points.n, config["n_bootstrap"], config["seed"])
    replayed = law.bootstrap(df, n_resamples=config["n_bootstrap"], seed=config["seed"], exclude=config["exclude"],
                             resamples=first).set_index("resample")
    committed = run.table("bootstrap").set_index("resample")
    names = law.parameter_names("decomposed")
    rows = []
    for i in first:
        theta = committed.loc[i, names].to_numpy(float)
        tol = law.parameter_tolerance(theta, points.x, points.loss, weights[i])[0]
        rows += [{"table": "bootstrap", "row": f"resample {i}", "quantity": q, "atol": tol[law.index("decomposed", q)],
                  "committed": float(committed.loc[i, q]), "replayed": float(replayed.loc[i, q])} for q in REPLAYED]
    k, offset = config["exclude"], config["scan_offsets"][0]
    scan = run.table("exclusion_scan")
    row = scan[(scan["exclude"] == k) & (scan["depth_offset"] == offset)]
    if row.empty:
        raise InputError(f"run {run.experiment}/{run.key} has no exclusion-scan row at k = {k}, offset {offset}")
    again = law.exclusion_scan(df, excludes=[k], depth_offsets=[offset]).iloc[0]
    kept = law.select_points(df, k, offset)
    theta = row.iloc[0][names].to_numpy(float)
    tol = law.parameter_tolerance(theta, kept.x, kept.loss)[0]
    atol = {q: tol[law.index("decomposed", q)] for q in REPLAYED}
    i_se = law.index("decomposed", "alpha_l")
    se = law.gauss_newton_se(theta, kept)[i_se]
    atol["se_alpha_l"] = sum(abs(law.gauss_newton_se(theta + np.eye(len(theta))[j] * tol[j], kept)[i_se] - se)
                             for j in range(len(theta)))
    rows += [{"table": "exclusion_scan", "row": f"exclude {k}, offset {offset}", "quantity": q, "atol": atol[q],
              "committed": float(row.iloc[0][q]), "replayed": float(again[q])} for q in REPLAYED + ("se_alpha_l",)]
    return pd.DataFrame(rows)


def reduction(profile: str) -> str:
    """How ``profile``'s runs are reduced against the paper's: one line of the verdict's "how reduced" list."""
    p = PROFILES[profile]
    return ("Not reduced: the paper's data (245 Chinchilla runs) and objective; "
            f"{p.n_bootstrap:,} converged bootstrap resamples (the paper's bootstrap ran 10,000 Adam steps).")


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    c = run.manifest.get("config", {})
    return {**results.run_info(run), **{k: c.get(k) for k in ("n_bootstrap", "paper_scan", "exclude", "seed", "n_splits")}}


def summary(run: results.Run) -> dict:
    """The key numbers of a run: the bootstrap's α's with their 95 % intervals and the held-out error."""
    boot = run.table("bootstrap")
    out = {"run": str(run.path), **describe(run)}
    for q in REPLAYED:
        if q in boot:
            lo, hi = boot[q].quantile([0.025, 0.975])
            out[q] = {"median": float(boot[q].median()), "lo": float(lo), "hi": float(hi)}
    return out

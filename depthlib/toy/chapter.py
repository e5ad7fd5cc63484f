"""Chapter 3's glue: the profiles of the toy runs, the runs the chapter shows, and their replay check.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (parts ``sweep``, the phase
diagram, and ``calibration-tied`` / ``calibration-independent``, its two long edge-cell runs), ``compute``,
``replay``, ``describe``, ``summary`` and ``COMPUTE``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib import results, units
from depthlib.contract import Profile, from_dict
from depthlib.errors import InputError
from depthlib.toy import certified, converged
from depthlib.toy.sweep import (
    EXPERIMENT,
    PAPER_TEMPERATURES,
    SweepConfig,
    build_engine,
    grid,
    run_sweep,
)
from depthlib.units import UnitProtocol

#: The calibration (paper §4, Fig. 4a,b): the two edge cells at T = 1, the paper's unnormalised teachers, one run
#: each (so they train side by side as two 1-thread processes). Both in the exp-9-3 form (the student is given
#: the teacher's fixed head; lr 2.4e-3/√ℓ, final 20 % linear decay to 10 %), so only the teacher differs.
CALIBRATION_EXPERIMENT = "toy-calibration"
CALIBRATION_KINDS = {1.0: "tied", 0.0: "independent"}
#: The compute entry of each experiment's runs (their code modules are derived from its imports,
#: :func:`depthlib.results.compute_modules`). The converged protocol's runs get their own entry here.
#: The converged-loss protocol (ours, :mod:`depthlib.toy.converged`): one run per (teacher, T, replicate) unit, merged.
CONVERGED_EXPERIMENT = "toy-converged"
CONVERGED_UNITS = "toy-converged-units"
#: The certified protocol (ours, :mod:`depthlib.toy.certified`): the same shape, a certificate no schedule can fake.
CERTIFIED_EXPERIMENT = "toy-certified"
CERTIFIED_UNITS = "toy-certified-units"
COMPUTE = {EXPERIMENT: "depthlib.toy.sweep:run_sweep", CALIBRATION_EXPERIMENT: "depthlib.toy.sweep:run_sweep",
           CONVERGED_EXPERIMENT: "depthlib.toy.converged:train_unit",
           CONVERGED_UNITS: "depthlib.toy.converged:train_unit",
           CERTIFIED_EXPERIMENT: "depthlib.toy.certified:train_unit",
           CERTIFIED_UNITS: "depthlib.toy.certified:train_unit"}
#: The chapter's parts, in the order :func:`runs` returns them
PARTS = ("sweep", "calibration", "converged", "certified")
#: The parts the chapter shows by default: ``certified`` joins them (replacing ``converged``) once its cpu run is
#: committed (it takes hours).
SHOWN_PARTS = ("sweep", "calibration", "certified")


@dataclass(frozen=True)
class CalibrationSweep(SweepConfig):
    """A calibration run's sweep (one edge cell, trained long): a :class:`SweepConfig` whose run is kept under
    :data:`CALIBRATION_EXPERIMENT`, apart from the phase diagram's (:func:`compute` reads which from the type)."""


@dataclass(frozen=True)
class ToyProfile(Profile):
    """What chapter 3 trains under one profile: the phase-diagram sweep, the two calibration runs and the
    converged-loss protocol."""

    name: str
    sweep: SweepConfig
    calibration: tuple[CalibrationSweep, ...]   # one per CALIBRATION_KINDS teacher, tied first
    converged: converged.ConvergedConfig
    certified: certified.CertifiedConfig


def _calibration(profile: str, **settings) -> tuple[CalibrationSweep, ...]:
    return tuple(CalibrationSweep(profile, variant="exp-9-3", cells=grid((rho,), (1.0,)), **settings)
                 for rho in CALIBRATION_KINDS)


#: The phase diagram. smoke: seconds, proves the code path (numbers meaningless). cpu: teachers of five ρ, all
#: normalised to the ρ = 0 teacher's displacement (so ρ changes how smooth the teacher is, not how far it goes),
#: × 3 temperatures, 3 depths over two octaves, batch 256, final lr decay: 10.6 GFLOP per step × 6k steps. paper:
#: exp-9 + exp-9-1 (ρ ∈ {0, 1}, 16 T, 3 replicates, 6 depths, 40k × 1024) plus a ρ grid at three temperatures.
#: The calibration: cpu: 4 depths over three octaves, batch 1024, 24k steps (6.65 GFLOP per step and run). paper:
#: 80k steps, the paper's six depths, 3 replicates (common random numbers: one teacher per replicate).
PROFILES: dict[str, ToyProfile] = {
    "smoke": ToyProfile(
        "smoke",
        SweepConfig("smoke", variant="exp-9-decay", cells=grid((0.0, 0.5, 1.0), (0.1, 1.0)), depths=(2, 4, 8),
                    replicates=1, steps=60, batch=64, eval_every=20, eval_batches=2, eval_batch_size=256,
                    teacher_depth=16, signature_inputs=128, teacher_norm="displacement"),
        _calibration("smoke", depths=(2, 4, 8), replicates=1, steps=80, batch=64, eval_every=20,
                     eval_batches=2, eval_batch_size=256, teacher_depth=16, signature_inputs=128),
        converged.ConvergedConfig("smoke", cells=((1.0, 1.0, 2), (0.0, 1.0, 2), (1.0, 0.01, 1)), depths=(2, 4, 8),
                                  steps_deepest=40, batch=32, pool_batches=8, evals=5, eval_batches=2,
                                  eval_batch_size=128, teacher_depth=16),
        certified.CertifiedConfig("smoke", cells=((1.0, 1.0, 2), (0.0, 1.0, 2), (1.0, 0.01, 2)), depths=(2, 4, 8),
                                  steps=40, batch=32, pool_batches=40, evals=5, eval_batches=2, eval_batch_size=128,
                                  teacher_depth=16, distill_inputs=512, distill_steps=20)),
    "cpu": ToyProfile(
        "cpu",
        SweepConfig("cpu", variant="exp-9-decay",
                    cells=grid((0.0, 0.25, 0.5, 0.75, 1.0), [PAPER_TEMPERATURES[i] for i in (0, 8, 15)]),
                    depths=(6, 12, 24), replicates=1, steps=6_000, batch=256, eval_every=500,
                    teacher_norm="displacement"),
        _calibration("cpu", depths=(6, 12, 24, 48), replicates=1, steps=24_000, batch=1024, eval_every=500),
        converged.ConvergedConfig("cpu", steps_deepest=4_000),
        certified.CertifiedConfig("cpu")),
    "paper": ToyProfile(
        "paper",
        SweepConfig("paper", variant="exp-9",
                    cells=grid((0.0, 1.0), PAPER_TEMPERATURES)
                    + grid((0.25, 0.5, 0.75, 0.9), [PAPER_TEMPERATURES[i] for i in (0, 8, 15)]),  # 0.01, 0.117, 1
                    replicates=3, steps=40_000, batch=1024, eval_every=500),
        _calibration("paper", depths=(6, 12, 16, 24, 32, 48), replicates=3, steps=80_000, batch=1024,
                     eval_every=500),
        converged.ConvergedConfig("paper", steps_deepest=40_000, batch=1024, pool_batches=4_096),
        certified.CertifiedConfig("paper", steps=40_000, batch=1024, pool_batches=40_000)),
}


def profile_config(profile: str = "smoke", *, rhos=None, temperatures=None, depths=None, steps=None,
                   replicates=None, **overrides) -> SweepConfig:
    """A profile's sweep config, optionally overridden (then labelled ``custom``: never shown by the book)."""
    if profile not in PROFILES:
        raise InputError(f"unknown profile {profile!r} (have {', '.join(PROFILES)})")
    cfg = PROFILES[profile].sweep
    changes = dict(overrides)
    if rhos is not None or temperatures is not None:
        r = rhos if rhos is not None else sorted({c[0] for c in cfg.cells})
        t = temperatures if temperatures is not None else sorted({c[1] for c in cfg.cells})
        changes["cells"] = grid(r, t)
    if depths is not None:
        changes["depths"] = tuple(int(d) for d in depths)
    if steps is not None:
        changes["steps"] = int(steps)
        changes["eval_every"] = min(cfg.eval_every, max(1, int(steps)))
    if replicates is not None:
        changes["replicates"] = int(replicates)
    if changes:
        cfg = dataclasses.replace(cfg, profile="custom", **changes)
    return cfg.validate()


def calibration_config(profile: str, kind: str) -> CalibrationSweep:
    """The calibration run ``kind`` (tied | independent) of ``profile``."""
    results.check_profile(profile)
    return next(c for c in PROFILES[profile].calibration if CALIBRATION_KINDS[c.cells[0][0]] == kind)


def compute(cfg: SweepConfig, device: str = "cpu", *, force: bool = False, progress: bool = True,
            executor=None) -> results.Run:
    """Train (or resume, or load) a sweep (:func:`depthlib.toy.sweep.run_sweep`, through the one run lifecycle: a
    damaged folder is repaired, losing only what is unreadable; ``force`` deletes the run first). With an
    :class:`~depthlib.executors.ExecutorConfig` other than serial, the phase-diagram sweep is trained as one shard
    per ρ (:mod:`depthlib.toy.shards`); a calibration run (a :class:`CalibrationSweep`) is trained in this
    process."""
    from depthlib.validate import resolve_device
    if cfg.tf32 and resolve_device(device).type != "cuda":
        raise InputError(f"--tf32 allows TF32 matmuls on CUDA, but this run is on {device} (--device {device}): "
                         "drop --tf32, or run on a GPU with --device cuda")
    experiment = _experiment(cfg)
    if executor is not None and executor.kind != "serial" and experiment == EXPERIMENT:
        if force or cfg.tf32:
            raise InputError("--force and --tf32 work with --executor serial only")
        from depthlib.toy import shards
        _check_memory(cfg, device, executor)
        return shards.run_sharded(cfg, executor, device)
    _check_memory(cfg, device)
    return run_sweep(cfg, device, progress=progress, force=force, experiment=experiment)


def _experiment(cfg: SweepConfig) -> str:
    """The experiment a sweep's run is kept under: the calibration's, or the phase diagram's."""
    return CALIBRATION_EXPERIMENT if isinstance(cfg, CalibrationSweep) else EXPERIMENT


def sweep_memory(cfg: SweepConfig, device: str = "cpu") -> float:
    """Bytes a sweep's engine (:class:`depthlib.toy.engine.BatchedStudents`) allocates while it trains, about: every
    student's parameters with their gradients and Adam moments (4 copies), a fixed head per student, the teachers,
    the held-out batches and their targets, and the activations one training step keeps for its backward pass (4
    students at a time on the CPU, all of them on a GPU)."""
    from depthlib.toy.models import variant
    shape, train = cfg.shape(), variant(cfg.variant)
    d, hidden, vocab = shape.d_model, shape.d_mlp, shape.vocab
    unit = 2 * d * hidden + hidden                                 # W_up, b_up, W_down of one MLP unit
    per_block = 2 if train.block == "rk2" else 1
    students = cfg.n_students
    teachers = cfg.replicates * len({c[0] for c in cfg.cells})
    head = students * d * vocab
    params = per_block * len(cfg.cells) * cfg.replicates * sum(cfg.depths) * unit + head * (train.head == "trained")
    floats = 4 * params + head * (train.head == "fixed")
    floats += 2 * teachers * (shape.teacher_depth * unit + d * vocab)            # built, then stacked
    floats += cfg.replicates * cfg.eval_batches * cfg.eval_batch_size * d + teachers * cfg.eval_batches \
        * cfg.eval_batch_size * vocab                                               # held-out inputs, targets
    chunk = min(students, 4 if str(device) == "cpu" else students)                # build_engine's chunk
    deepest = sorted(cfg.depths, reverse=True) * (len(cfg.cells) * cfg.replicates)
    deepest = sorted(deepest, reverse=True)[:chunk]                 # the first chunk (deepest first) keeps the most
    floats += cfg.batch * (per_block * sum(deepest) * (2 * hidden + 2 * d + 1) + 3 * chunk * vocab
                           + teachers * vocab)                                      # one step's activations
    return 4.0 * floats


def _check_memory(cfg: SweepConfig, device: str, executor=None) -> None:
    """InputError, before any run is opened or any teacher built, if the sweep (with a joblib ``executor``: the
    shards that run at once, one per ρ) would need more memory than ``device`` has (:func:`sweep_memory`); a
    finished run in the cache (where :func:`depthlib.toy.sweep.open_sweep_run` looks) needs none."""
    from depthlib import validate
    from depthlib.toy.sweep import open_sweep_run
    try:
        if open_sweep_run(cfg, experiment=_experiment(cfg)).complete:
            return
    except results.CorruptRunError:
        pass                                     # a damaged run: the lifecycle repairs it, and resumes (or recomputes)
    need = sweep_memory(cfg, device)
    if executor is not None and executor.kind == "joblib":
        from depthlib.toy.shards import shard_configs
        parts = sorted((sweep_memory(s, device) for s in shard_configs(cfg)), reverse=True)
        need = sum(parts[: max(1, executor.jobs)])
    elif executor is not None and executor.kind == "submitit":
        return                                   # jobs on other machines (a SLURM node has its own memory)
    validate.fits_in_memory(
        f"a toy sweep of {cfg.n_students:,} students (depths up to {max(cfg.depths)}, {len(cfg.cells)} (ρ, T) cells "
        f"× {cfg.replicates} replicates)", need, str(device),
        fix="use fewer or shallower --depths, fewer --replicates, or fewer --rho / --temperature values")


def sweep_run(profile: str = "smoke", device: str = "cpu", *, rerun: bool = False, executor=None,
              progress: bool = False) -> results.Run:
    """The sweep chapter 3 shows for ``profile`` (the one rule: :func:`depthlib.results.select_run`); if there is
    none, the profile is trained now (cached, resumable), in this process or, with an
    :class:`~depthlib.executors.ExecutorConfig`, as one shard per ρ (:mod:`depthlib.toy.shards`)."""
    results.check_profile(profile)

    def make() -> results.Run:
        return compute(PROFILES[profile].sweep, device, progress=progress, executor=executor)

    return results.chapter_run(EXPERIMENT, profile, make, rerun=rerun,
                               expected_config=lambda p: PROFILES[p].sweep.to_dict() if p in PROFILES else None)


def train_calibration(profile: str, kind: str, device: str = "cpu") -> str:
    """Train (or resume, or load) one calibration run (``kind``: tied | independent); returns its folder.
    Module-level, so an executor can run the two side by side."""
    return str(compute(calibration_config(profile, kind), device, progress=False).path)


def calibration_runs(profile: str = "smoke", device: str = "cpu", *, rerun: bool = False,
                     executor=None) -> dict[str, results.Run]:
    """The calibration runs chapter 3 shows for ``profile``, by kind (``tied``, ``independent``): the same rule
    as every chapter (:func:`depthlib.results.shown_run`, matched on each run's own config). Missing ones are
    trained now, in this process or, with an :class:`~depthlib.executors.ExecutorConfig`, as units of it (None
    instead inside :func:`depthlib.selection.shown_runs`)."""
    from depthlib import executors, selection
    results.check_profile(profile)
    kinds = [CALIBRATION_KINDS[c.cells[0][0]] for c in PROFILES[profile].calibration]
    found = {}
    for i, kind in enumerate(kinds):
        def expected(prof, i=i):
            return PROFILES[prof].calibration[i].to_dict() if prof in PROFILES else None
        found[kind] = results.shown_run(CALIBRATION_EXPERIMENT, profile, expected_config=expected, rerun=rerun)
    missing = [kind for kind in kinds if found[kind] is None]
    if missing and not selection.looking_up():
        units = [executors.Unit(f"calibration-{kind}", "depthlib.toy.chapter:train_calibration",
                                {"profile": profile, "kind": kind, "device": device}) for kind in missing]
        computed = executors.finished_runs(units, executor or executors.ExecutorConfig(), f"calibration ({profile})")
        found.update(zip(missing, computed))
    return {kind: found[kind] for kind in kinds}


def runs(profile: str = "smoke", *, rerun: bool = False, executor=None, device: str = "cpu", progress: bool = False,
         parts: tuple[str, ...] = SHOWN_PARTS) -> dict[str, results.Run]:
    """The runs chapter 3 shows for ``profile``, by part: ``sweep`` (the phase diagram) and
    ``calibration-tied``, ``calibration-independent``; each found by the one rule or computed now (``progress``: the
    sweep's progress bar, where it is trained in this process)."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise InputError(f"chapter 3 has no part(s) {', '.join(sorted(unknown))} (have {', '.join(PARTS)})")
    out = {}
    if "sweep" in parts:
        out["sweep"] = sweep_run(profile, device, rerun=rerun, executor=executor, progress=progress)
    if "calibration" in parts:
        out.update({f"calibration-{k}": r for k, r in
                    calibration_runs(profile, device, rerun=rerun, executor=executor).items()})
    for protocol in PROTOCOLS:
        if protocol in parts:
            out[protocol] = protocol_run(protocol, profile, device, rerun=rerun, executor=executor)
    return out


def calibration_parts(runs: dict[str, results.Run]) -> dict[str, results.Run]:
    """The calibration runs among a :func:`runs` result, by kind (tied, independent)."""
    return {k.removeprefix("calibration-"): r for k, r in runs.items() if k.startswith("calibration-")}


def calibration_tables(runs: dict[str, results.Run]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The calibration runs' curves and α_ℓ-per-step tables, stacked, with a ``teacher`` column (tied | independent)."""
    curves = pd.concat([r.table("curves").assign(teacher=k) for k, r in runs.items()], ignore_index=True)
    steps = pd.concat([r.table("alpha_steps").assign(teacher=k) for k, r in runs.items()], ignore_index=True)
    return curves, steps


def calibration_summary(runs: dict[str, results.Run]) -> pd.DataFrame:
    """One row per calibration run: its final α_ℓ with interval, how fast α_ℓ still moved (per 1,000 steps, a
    least-squares slope) over the last 20 % of training (the lr decay) and the 20 % before, the final test
    loss of every depth and the local slopes −Δlog L/Δlog ℓ between neighbouring depths."""
    rows = []
    for kind, run in runs.items():
        cfg = config_of(run)
        steps = run.table("alpha_steps").sort_values("step")
        curves = run.table("curves")
        last = curves[curves["step"] == curves["step"].max()].groupby("depth")["test_loss"].mean().sort_index()
        final = steps.iloc[-1]
        row = {"teacher": kind, "rho": cfg.cells[0][0], "temperature": cfg.cells[0][1], "variant": cfg.variant,
               "steps": cfg.steps, "batch": cfg.batch, "alpha": final["alpha"], "lo": final["lo"], "hi": final["hi"],
               "interval": final["interval"]}
        for name, (a, b) in {"decay": (0.8, 1.0), "before_decay": (0.6, 0.8)}.items():
            win = steps[(steps["step"] > a * cfg.steps) & (steps["step"] <= b * cfg.steps)]
            rate = np.polyfit(win["step"] / 1000, win["alpha"], 1)[0] if len(win) >= 2 else np.nan
            row[f"alpha_per_1k_steps_{name}"] = float(rate)
        for d, loss in last.items():
            row[f"loss_depth_{int(d)}"] = float(loss)
        depths = last.index.to_numpy(float)
        for (d0, d1), (l0, l1) in zip(zip(depths[:-1], depths[1:]), zip(last.values[:-1], last.values[1:])):
            row[f"slope_{int(d0)}_{int(d1)}"] = float(-np.log(l1 / l0) / np.log(d1 / d0))
        rows.append(row)
    return pd.DataFrame(rows)


def calibration_findings(summary: pd.DataFrame) -> list[str]:
    """The chapter's sentences about the calibration, generated from :func:`calibration_summary`: no number in
    them is typed by hand."""
    lines = []
    for r in summary.itertuples():
        slopes = [c for c in summary.columns if c.startswith("slope_")]
        local = ", ".join(f"{c[6:].replace('_', '→')}: {getattr(r, c):.2f}" for c in slopes)
        rates = [f"{rate:+.3f} per 1,000 steps {when}" for rate, when in
                 ((r.alpha_per_1k_steps_decay, "during the final decay"),
                  (r.alpha_per_1k_steps_before_decay, "in the 20 % of steps before it")) if np.isfinite(rate)]
        moved = f"; α_ℓ moved {' and '.join(rates)}" if rates else ""
        lines.append(f"{r.teacher} teacher (ρ = {r.rho:g}, T = {r.temperature:g}, {r.variant}, {r.steps:,} steps × "
                     f"{r.batch}): α_ℓ = {r.alpha:.2f} [{r.lo:.2f}, {r.hi:.2f}] — {r.interval}; local slopes {local}"
                     f"{moved}.")
    if {"tied", "independent"} <= set(summary["teacher"]):
        t, i = (summary[summary["teacher"] == k].iloc[0] for k in ("tied", "independent"))
        apart = t["lo"] > i["hi"]
        lines.append(f"Tied minus independent: Δα_ℓ = {t['alpha'] - i['alpha']:+.2f}; the 95 % intervals "
                     + ("do not overlap." if apart else "overlap."))
    return lines


def replay(run: results.Run, n_students: int = 1) -> pd.DataFrame:
    """Retrain the ``n_students`` shallowest students of the first cell up to the run's first evaluation with the
    current code; returns their committed and recomputed test losses (columns ``committed``, ``replayed``).
    A converged-protocol run is replayed by :func:`replay_converged`."""
    if run.experiment == CONVERGED_EXPERIMENT:
        return replay_converged(run)
    if run.experiment in (CERTIFIED_EXPERIMENT, CERTIFIED_UNITS):
        return replay_certified(run)
    cfg = config_of(run)
    first_cell, depths = cfg.cells[0], sorted(cfg.depths)[:n_students]
    def keep(row):
        return ((row["rho"], row["temperature"]) == first_cell and row["replicate"] == 0
                and row["depth"] in depths)
    eng, students, _ = build_engine(cfg, "cpu", keep=keep)
    first_eval = min(cfg.eval_every, cfg.steps)
    for _ in range(first_eval):
        eng.step()
    replayed = students.assign(step=first_eval, replayed=eng.evaluate().cpu().numpy())
    curves = run.table("curves").rename(columns={"test_loss": "committed"})
    return replayed.merge(curves[["rho", "temperature", "replicate", "depth", "step", "committed"]],
                          on=["rho", "temperature", "replicate", "depth", "step"], how="left")


def config_of(run: results.Run) -> SweepConfig:
    """The :class:`SweepConfig` a run was trained with."""
    return from_dict(SweepConfig, run.config)


def reduction(profile: str) -> str:
    """How ``profile``'s runs are reduced against the paper's: one line of the verdict's "how reduced" list."""
    p, paper = PROFILES[profile], PROFILES["paper"]
    cal, cal_paper = p.calibration[0], paper.calibration[0]
    conv, cert = p.converged, p.certified
    return (f"Calibration: {cal.steps:,} steps (paper {cal_paper.steps:,}), depths {list(cal.depths)} (paper "
            f"{list(cal_paper.depths)}), {cal.replicates} replicate(s) (paper {cal_paper.replicates}), T = 1 only; the "
            f"phase diagram {p.sweep.steps:,} steps × batch {p.sweep.batch}, {p.sweep.replicates} replicate(s). " + (
                f"The certified protocol: {len(cert.depths)} depths, every route {cert.steps:,} steps × batch "
                f"{cert.batch} at every depth, continued by half its steps so far until a continuation gains < "
                f"{100 * cert.gain_below:g} % (at most {cert.max_continuations} times), "
                f"{max(int(c[2]) for c in cert.cells)} replicate(s) per cell (paper profile: "
                f"{paper.certified.steps:,} steps × {paper.certified.batch})."
                if "certified" in SHOWN_PARTS else
                f"The converged protocol: {len(conv.depths)} depths, the deepest student {conv.steps_deepest:,} steps × "
                f"batch {conv.batch} (a depth-ℓ one up to {conv.max_step_factor:g}× more), several routes per student, "
                f"{max(int(c[2]) for c in conv.cells)} replicate(s) at T = 1."))


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    m = run.manifest
    c = m.get("config", {})
    return {**results.run_info(run), **{k: c.get(k) for k in ("variant", "steps", "batch", "depths", "replicates",
                                                             "teacher_depth")},
            "rhos": sorted({cell[0] for cell in c.get("cells", [])}),
            "temperatures": sorted({cell[1] for cell in c.get("cells", [])}), "flop": m.get("flop_total")}


def summary(run: results.Run) -> dict:
    """The key numbers of a run: α_ℓ with its interval per (ρ, T) cell, and what the run cost (for a converged-protocol
    run: α_ℓ per teacher and T across replicates, the paired tied − independent difference, how many converged)."""
    if run.experiment == CONVERGED_EXPERIMENT:
        table, sep, best = run.table("alpha_summary"), run.table("separation").iloc[0], run.table("best")
        return {"run": str(run.path), **converged_wall_times(run),
                "alpha": [{"teacher": r.teacher, "temperature": r.temperature, "alpha": _rounded(r.alpha),
                           "lo": _rounded(r.lo), "hi": _rounded(r.hi), "replicates": int(r.replicates)}
                          for r in table.itertuples()],
                "tied_minus_independent": {k: _rounded(sep[k]) for k in ("diff", "lo", "hi")},
                "students_converged": f"{int(best['converged'].sum())} of {len(best)}"}
    if run.experiment == CERTIFIED_EXPERIMENT:
        table, sep, cert = run.table("alpha_summary"), run.table("separation"), run.table("certified")
        env = table[table["fit"] == "envelope"]
        every = sep[sep["fit"] == "all depths"]
        return {"run": str(run.path), **converged_wall_times(run),
                "alpha": [{"teacher": r.teacher, "temperature": r.temperature, "alpha": _rounded(r.alpha),
                           "lo": _rounded(r.lo), "hi": _rounded(r.hi), "replicates": int(r.replicates)}
                          for r in env.itertuples()],
                "tied_minus_independent": ({k: _rounded(every.iloc[0][k]) for k in ("diff", "lo", "hi")}
                                           if len(every) else None),
                "students_certified": f"{int(cert['certified'].sum())} of {len(cert)}",
                "students_within_gap": f"{int(cert['within_gap'].sum())} of {len(cert)}",
                "heldout_in_pool": int(cert["heldout_in_pool"].max())}
    m, alpha = run.manifest, run.table("alpha")
    return {"run": str(run.path), **describe(run), "device": m.get("device"),
            "students": m.get("n_students"),
            "alpha": [{"rho": r.rho, "temperature": r.temperature, "alpha": _rounded(r.alpha), "lo": _rounded(r.lo),
                       "hi": _rounded(r.hi)} for r in alpha.itertuples()],
            "interval": str(alpha["interval"].iloc[0]) if len(alpha) else None,
            "throughput": {"model_steps_per_s": m.get("model_steps_per_s"), "gflop_per_s": m.get("gflop_per_s"),
                           "wall_time_s": m.get("wall_time_s")}}


def converged_wall_times(run: results.Run) -> dict:
    """The wall times of a converged-protocol run, in seconds: ``wall_time_s`` the whole run (units and merge, as its
    manifest records it), ``unit_wall_time_s`` its units' added up, ``merge_wall_time_s`` the merge (None where not
    recorded: runs merged before it was). A run merged by code that timed only the merge recorded less than its
    longest unit as its wall time: that is its merge, and the units are added to it."""
    m = run.manifest
    total, merge = m.get("wall_time_s"), m.get("merge_wall_time_s")
    walls = [float(u.get("wall_time_s") or 0.0) for u in m.get("units", {}).values()]
    units = m.get("unit_wall_time_s", sum(walls))
    if merge is None and total is not None and walls and total < max(walls):
        merge, total = total, round(units + total, 3)
    return {"wall_time_s": total, "unit_wall_time_s": units, "merge_wall_time_s": merge}


def calibration_pair_summary(runs: dict[str, results.Run]) -> dict:
    """The key numbers of the calibration runs (what ``depthlib toy --calibration both`` prints): α_ℓ with its
    interval and the steps per teacher, the runs' folders and wall times."""
    table = calibration_summary(runs)
    return {"alpha": [{"teacher": r.teacher, "rho": r.rho, "alpha": _rounded(r.alpha), "lo": _rounded(r.lo),
                       "hi": _rounded(r.hi), "steps": int(r.steps)} for r in table.itertuples()],
            "interval": str(table["interval"].iloc[0]),
            "runs": {kind: str(run.path) for kind, run in runs.items()},
            "wall_time_s": {kind: run.manifest.get("wall_time_s") for kind, run in runs.items()}}


def _rounded(x, digits: int = 3):
    """Rounded float, or None (JSON null) where a fit is undefined (e.g. no interval from two depths)."""
    return None if x is None or not np.isfinite(float(x)) else round(float(x), digits)


# ---- the protocols (ours): converged (depthlib.toy.converged) and certified (depthlib.toy.certified) ----------
#: Profiles (``ToyProfile.converged``). smoke: seconds (numbers meaningless). cpu: tied and independent teachers at
#: T = 1 with 3 replicates each and the tied teacher at T = 0.01 (1 replicate), the paper's six depths, every route;
#: the deepest student trains 4,000 steps × 256 from a pool of 524k inputs, a depth-ℓ one 4,000·min(48/ℓ, 8) (7 units,
#: about an hour on 2 one-thread workers). paper: the same cells at batch 1024 and 10× the steps, for a GPU.
#: ``ToyProfile.certified``: cpu: both teachers at T = 1 and the tied one at T = 0.01, 3 replicates each, every route
#: 12,000 steps × 256 at every depth, continuations of 6,000 steps until a gain below 2 % (at most 3); 9 units, about
#: 4 hours on 2 one-thread workers, resumable stage by stage. paper: 40,000 steps × 1,024 per route, for a GPU.


#: Chapter 3's two protocols, each a run made of units (:class:`depthlib.units.UnitProtocol`), trained and merged
#: by the one units runner (:mod:`depthlib.units`)
PROTOCOLS = {
    "converged": UnitProtocol("converged", CONVERGED_EXPERIMENT, CONVERGED_UNITS, COMPUTE[CONVERGED_UNITS],
                              "depthlib.toy.converged:ConvergedConfig", ("converged", "curves"),
                              "depthlib.toy.chapter:merge_converged", stage_format="triple"),
    "certified": UnitProtocol("certified", CERTIFIED_EXPERIMENT, CERTIFIED_UNITS, COMPUTE[CERTIFIED_UNITS],
                              "depthlib.toy.certified:CertifiedConfig", ("stages", "curves", "certified"),
                              "depthlib.toy.chapter:merge_certified")}


def protocol_config(protocol: str, profile: str):
    """The settings of ``protocol`` (converged | certified) under ``profile`` (``ToyProfile.<protocol>``)."""
    return getattr(PROFILES[profile], protocol)


def merge_converged(cfg: converged.ConvergedConfig, t: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The converged protocol's run from its units' tables: every student (``converged``: one row per student and
    route), their curves, the best route per student (``best``), α_ℓ per replicate and across replicates (``alpha``,
    ``alpha_summary``), local slopes and the paired tied − independent difference at T = 1 (``separation``)."""
    rows = t["converged"]
    best = converged.best_routes(rows)
    per, alpha_summary = converged.alpha_tables(best)
    return {"converged": rows, "curves": t["curves"], "best": best, "alpha": per, "alpha_summary": alpha_summary,
            "slopes": converged.local_slopes(best), "separation": pd.DataFrame([converged.separation(per)])}


def merge_certified(cfg: certified.CertifiedConfig, t: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The certified protocol's run from its units' tables: every stage (``stages``), curves, the certified students
    (``certified``: one per teacher, T, replicate and depth, with the held-out / pool gap), α_ℓ per replicate for the
    envelope, every route and the untrained warm starts (``alpha``) and across replicates (``alpha_summary``), the
    drop-one-depth refits (``fragility``), local slopes with intervals (``slopes``), the paired difference on all
    depths and without each (``separation``), each replicate's power-law residuals (``power_law``) and α_ℓ after each
    round of continuations (``alpha_rounds``)."""
    stages, cert = t["stages"], certified.with_gap(t["certified"])
    per = certified.alpha_tables(cert, stages)
    return {"stages": stages, "curves": t["curves"], "certified": cert, "alpha": per,
            "alpha_summary": certified.alpha_summary(per), "fragility": certified.fragility(cert),
            "slopes": certified.local_slopes(cert), "separation": certified.separation(cert),
            "power_law": certified.power_law_check(cert),
            "alpha_rounds": certified.alpha_by_round(stages, cfg.max_continuations)}


def committed_unit(protocol: str, config: dict, cell: dict) -> results.Run | None:
    """The committed unit of ``protocol`` for these settings and cell, if fresh (:func:`depthlib.units.committed_unit`)."""
    return units.committed_unit(PROTOCOLS[protocol], config, cell)


def train_protocol_unit(protocol: str, config: dict, cell: dict, device: str = "cpu", progress: bool = False,
                        committed: bool = True) -> str:
    """Every route of every depth of one (teacher, T, replicate) of a protocol, resumable student by student; its
    run folder (:func:`depthlib.units.train_unit`)."""
    return units.train_unit(dataclasses.asdict(PROTOCOLS[protocol]), config, cell, device, progress, committed)


def train_protocol_units(protocol: str, cfg, cells: list[dict], device: str = "cpu", *, committed: bool = True,
                         executor=None) -> list[results.Run]:
    """The finished runs of a protocol's units ``cells`` (:func:`depthlib.units.train_units`)."""
    return units.train_units(PROTOCOLS[protocol], cfg, cells, device, committed=committed, executor=executor)


def protocol_run(protocol: str, profile: str = "smoke", device: str = "cpu", *, rerun: bool = False,
                 executor=None) -> results.Run:
    """A protocol's run chapter 3 shows for ``profile`` (:func:`depthlib.units.protocol_run`); its units run tied
    ones first (they take longest) — for the certified protocol T = 1 first, a replicate of each teacher at a time, so
    that early units answer. A unit committed by an earlier stretch is not retrained, unless ``rerun``."""
    def order(cfg) -> list[dict]:
        if protocol == "certified":
            return sorted(cfg.units(), key=lambda c: (-c["temperature"], c["replicate"], -c["rho"]))
        return sorted(cfg.units(), key=lambda c: (-c["rho"], -c["temperature"], c["replicate"]))
    return units.protocol_run(PROTOCOLS[protocol], profile,
                              lambda q: protocol_config(protocol, q) if q in PROFILES else None, order, device,
                              rerun=rerun, executor=executor)


def converged_run(profile: str = "smoke", device: str = "cpu", *, rerun: bool = False, executor=None) -> results.Run:
    """The converged protocol's run (:func:`protocol_run`)."""
    return protocol_run("converged", profile, device, rerun=rerun, executor=executor)


def certified_run(profile: str = "smoke", device: str = "cpu", *, rerun: bool = False, executor=None) -> results.Run:
    """The certified protocol's run (:func:`protocol_run`)."""
    return protocol_run("certified", profile, device, rerun=rerun, executor=executor)


def paper_route(runs: dict[str, results.Run]) -> pd.DataFrame:
    """The committed from-scratch calibration students (the paper's exp-9-3 recipe at the committed budget) as rows of
    the protocol's ``converged`` table (route ``paper``; same teachers and held-out inputs as the protocol's replicate
    0). Their improvement over the last 20 % of steps is measured from the evaluation at or before 80 % of the steps;
    unlike the protocol's routes, those steps are the paper's decay, not a constant final lr."""
    rows = []
    for kind, run in runs.items():
        cfg = config_of(run)
        curves = run.table("curves")
        for (rho, temp, rep, depth), g in curves.groupby(["rho", "temperature", "replicate", "depth"]):
            g = g.sort_values("step")
            before = float(g.loc[g["step"] <= 0.8 * cfg.steps, "test_loss"].iloc[-1])
            final = float(g["test_loss"].iloc[-1])
            rel = (before - final) / before
            rows.append({"teacher": kind, "rho": rho, "temperature": temp, "replicate": int(rep), "depth": int(depth),
                         "route": "paper", "start": "exp-9-3 init", "steps": cfg.steps, "batch": cfg.batch,
                         "test_loss": final, "rel_improvement_last20": rel,
                         "converged": bool(rel < converged.CONVERGED_BELOW)})
    return pd.DataFrame(rows)


def converged_findings(run: results.Run, paper: pd.DataFrame | None = None) -> list[str]:
    """The chapter's sentences about the converged protocol, generated from its tables (no number typed by hand):
    α_ℓ per teacher and temperature with its interval, the local slopes, whether tied and independent separate
    (the interval of their paired difference), the convergence of the students the fit uses, the Euler check and
    the committed from-scratch students where they are lower."""
    summary, per, best = run.table("alpha_summary"), run.table("alpha"), run.table("best")
    slopes, sep, rows = run.table("slopes"), run.table("separation").iloc[0], run.table("converged")
    lines = []
    for r in summary.itertuples():
        reps = per[(per["teacher"] == r.teacher) & (per["temperature"] == r.temperature)]["alpha"]
        s = slopes[(slopes["teacher"] == r.teacher) & (slopes["temperature"] == r.temperature)]
        local = s.groupby(["depth_from", "depth_to"])["slope"].mean()
        b = best[(best["teacher"] == r.teacher) & (best["temperature"] == r.temperature)]
        lines.append(
            f"{r.teacher} teacher, T = {r.temperature:g}: converged α_ℓ = {r.alpha:.2f} [{r.lo:.2f}, {r.hi:.2f}] "
            f"({r.interval}); per replicate {', '.join(f'{a:.2f}' for a in reps)}; local slopes "
            + ", ".join(f"{a}→{b_}: {v:.2f}" for (a, b_), v in local.items())
            + f". {int(b['converged'].sum())} of {len(b)} fitted students are converged (held-out loss improved < 1 % "
            f"over their last 20 % of steps; worst {b['rel_improvement_last20'].max():.1%})."
        )
    if np.isfinite(sep["diff"]):
        verdict = ("the tied exponent is larger: the interval excludes 0" if sep["lo"] > 0 else
                   "the interval includes 0: at this budget the two teachers do not separate" if sep["hi"] >= 0 else
                   "the independent exponent is larger")
        lines.append(f"Tied minus independent at T = 1, paired by replicate: Δα_ℓ = {sep['diff']:+.2f} "
                     f"[{sep['lo']:+.2f}, {sep['hi']:+.2f}] (95 % t over {int(sep['n'])} replicates): {verdict}.")
    euler = rows[(rows["route"] == "euler") & (rows["temperature"] == 1.0)]
    if len(euler):
        tb = best[(best["teacher"] == "tied") & (best["temperature"] == 1.0)].merge(
            euler[["replicate", "depth", "initial_loss"]], on=["replicate", "depth"], suffixes=("", "_euler"))
        beat = int((tb["test_loss"] < tb["initial_loss_euler"]).sum())
        lines.append(f"Tied students beat the untrained Euler discretisation of the same depth in {beat} of {len(tb)} "
                     f"cases (by {np.median(tb['initial_loss_euler'] / tb['test_loss']):.1f}× in the median).")
    trained = rows[rows["steps"] > 0]
    keys = ["teacher", "temperature", "replicate", "depth"]
    ratio = trained[trained["converged"]].groupby(keys)["test_loss"].apply(
        lambda v: float(np.sort(v.to_numpy())[1] / v.min()) if len(v) > 1 else np.nan).dropna()
    if len(ratio):
        worst = ratio.idxmax()
        lines.append(f"Converged routes disagree: where two routes of a student both pass the 1 % rule, the runner-up's "
                     f"loss is {ratio.median():.2f}× the best one's in the median ({len(ratio)} students) and up to "
                     f"{ratio.max():.1f}× ({worst[0]}, T = {worst[1]:g}, "
                     f"replicate {worst[2]}, ℓ = {worst[3]}). The 1 % rule says a student stopped improving, not that it "
                     "reached the lowest loss its depth allows; depths with fewer warm-start routes (ℓ = 16 has no "
                     "trained ℓ/2 to split) can sit higher, which shows as alternating local slopes.")
    wins = best.groupby("route").size()
    lines.append("The best route: " + ", ".join(f"{k} {v}" for k, v in wins.sort_values(ascending=False).items())
                 + f" of {len(best)} students.")
    if paper is not None and len(paper):
        m = paper.merge(best[["teacher", "temperature", "replicate", "depth", "test_loss"]],
                        on=["teacher", "temperature", "replicate", "depth"], suffixes=("_paper", ""))
        lower = m[m["test_loss_paper"] < m["test_loss"]]
        lines.append("The committed from-scratch students (24,000 × 1,024 steps, replicate 0) are "
                     + ("higher than the protocol's best at every depth they share." if lower.empty else
                        "lower than the protocol's best at " + ", ".join(
                            f"{r.teacher} ℓ = {r.depth} ({r.test_loss_paper:.2e} vs {r.test_loss:.2e})"
                            for r in lower.itertuples())
                        + ": there the protocol's students are not at the converged loss."))
    return lines


def replay_converged(run: results.Run) -> pd.DataFrame:
    """Recompute the first evaluation interval (5 % of its steps) of the first replicate's deepest tied student on the
    Euler route at T = 1 — built exactly as :func:`depthlib.toy.converged.train_student` builds it — and return its
    committed and recomputed held-out losses at step 0 (the untrained discretisation) and at that step."""
    from depthlib.toy.engine import StudentSpec
    from depthlib.toy.models import derive_seed, make_teacher
    cfg = from_dict(converged.ConvergedConfig, run.config)
    depth, route, r, temp = max(cfg.depths), "euler", 0, 1.0
    teacher = make_teacher(1.0, derive_seed(cfg.seed, "teacher", r), cfg.shape())
    pool = converged.make_pool(cfg, teacher, r)
    train, steps = converged.training(route, cfg.lr_warm), cfg.steps(depth)
    spec = StudentSpec(0, temp, depth, derive_seed(cfg.seed, "converged-student", r, depth, route))
    eng = converged.PooledStudents(*pool, derive_seed(cfg.seed, "converged-order", r, depth, route), [teacher], [spec],
                                   train, steps, data_seeds=[0], test_seeds=[derive_seed(cfg.seed, "test", r)],
                                   batch=cfg.batch, eval_batches=cfg.eval_batches, eval_batch_size=cfg.eval_batch_size,
                                   shape=cfg.shape(), device="cpu", chunk=1)
    eng.load_student(0, converged.euler_student(teacher, depth))
    replayed = [(0, float(eng.evaluate()[0]))]
    for _ in range(steps // cfg.evals):
        eng.step()
    replayed.append((steps // cfg.evals, float(eng.evaluate()[0])))
    curves = run.table("curves")
    mine = curves[(curves["teacher"] == "tied") & (curves["temperature"] == temp) & (curves["replicate"] == r)
                  & (curves["depth"] == depth) & (curves["route"] == route)]
    out = pd.DataFrame(replayed, columns=["step", "replayed"])
    return out.merge(mine[["step", "test_loss"]].rename(columns={"test_loss": "committed"}), on="step", how="left")


def replay_certified(run: results.Run) -> pd.DataFrame:
    """Recompute the first evaluation interval of one student — built exactly as
    :func:`depthlib.toy.certified.train_unit` builds it — and return its committed and recomputed held-out losses at
    step 0 and at that step: the shallowest student of the first replicate of the tied teacher at T = 1 (a merged
    run), or of the unit's own teacher, temperature and replicate (a committed unit), on the Euler route for the tied
    teacher (step 0: the untrained discretisation) and from scratch for the independent one."""
    from depthlib.toy.engine import StudentSpec
    from depthlib.toy.models import derive_seed, make_teacher
    config = dict(run.config)
    cell = config.pop("cell", None) or {"rho": 1.0, "temperature": 1.0, "replicate": 0}
    cfg = from_dict(certified.CertifiedConfig, config)
    depth, r = min(cfg.depths), int(cell["replicate"])
    route, lr_scale = ("euler", cfg.lr_warm) if cell["rho"] == 1.0 else ("scratch", 1.0)
    teacher = make_teacher(cell["rho"], derive_seed(cfg.seed, "teacher", r), cfg.shape())
    spec = StudentSpec(0, cell["temperature"], depth, derive_seed(cfg.seed, "certified-student", r, depth, route))
    every = cfg.steps // cfg.evals
    eng = certified.PoolStudents(certified.make_pool(cfg, teacher, r),
                                 derive_seed(cfg.seed, "certified-order", r, depth, route), [teacher], [spec],
                                 certified.stage_training(lr_scale, cfg.decay_to), cfg.steps, data_seeds=[0],
                                 test_seeds=[derive_seed(cfg.seed, "test", r)], batch=cfg.batch,
                                 eval_batches=cfg.eval_batches, eval_batch_size=cfg.eval_batch_size,
                                 shape=cfg.shape(), device="cpu", chunk=1)
    if route == "euler":
        eng.load_student(converged.euler_student(teacher, depth))
    replayed = [(0, float(eng.evaluate()[0]))]
    for _ in range(every):
        eng.step()
    replayed.append((every, float(eng.evaluate()[0])))
    curves = run.table("curves")
    mine = curves[(curves["rho"] == cell["rho"]) & (curves["temperature"] == cell["temperature"])
                  & (curves["replicate"] == r) & (curves["depth"] == depth) & (curves["stage"] == route)]
    out = pd.DataFrame(replayed, columns=["step", "replayed"])
    return out.merge(mine[["step", "test_loss"]].rename(columns={"test_loss": "committed"}), on="step", how="left")


def phase_diagram_caveats(alpha: pd.DataFrame) -> list[str]:
    """What the phase diagram's intervals can and cannot resolve, generated from its ``alpha`` table: the widest
    interval, whether the ρ = 0 and ρ = 1 intervals of each temperature overlap, and the direction α_ℓ moves along ρ
    at each temperature (compared with the paper's rise towards 3 at ρ = 1 and high T)."""
    lines = []
    widest = alpha.loc[(alpha["hi"] - alpha["lo"]).idxmax()]
    lines.append(f"Intervals: {alpha['interval'].iloc[0]}; the widest is [{widest['lo']:.2f}, {widest['hi']:.2f}] "
                 f"(ρ = {widest['rho']:g}, T = {widest['temperature']:g}).")
    for temp, g in alpha.groupby("temperature"):
        g = g.sort_values("rho")
        first, last = g.iloc[0], g.iloc[-1]
        apart = first["hi"] < last["lo"] or last["hi"] < first["lo"]
        way = "rises" if last["alpha"] > first["alpha"] else "falls"
        lines.append(f"T = {temp:g}: α_ℓ {way} from {first['alpha']:.2f} (ρ = {first['rho']:g}) to {last['alpha']:.2f} "
                     f"(ρ = {last['rho']:g}); the two intervals " + ("do not overlap." if apart else
                                                                    "overlap: no direction is resolved."))
    return lines

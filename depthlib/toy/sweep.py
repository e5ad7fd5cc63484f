"""Profiles and resumable, cached toy sweeps (paper §4, App. C).

A sweep trains every (ρ, T) cell × replicate × depth in one :class:`~depthlib.toy.engine.BatchedStudents`
and writes, as it goes, one tidy table per evaluation step (``curve_0001000`` ...: rho, temperature,
replicate, depth, step, train_loss, test_loss) plus a checkpoint. Re-running the same config resumes from
the last checkpoint without redoing finished steps; a complete run is simply loaded from the cache.
At the end it writes ``curves`` (all steps), ``alpha`` (final α_ℓ per cell), ``alpha_steps`` (α_ℓ per
step) and ``signatures`` (hidden-state signatures of the trained students and of the teachers).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from depthlib import results
from depthlib.contract import to_dict
from depthlib.errors import InputError
from depthlib.toy import analysis
from depthlib.toy.engine import BatchedStudents, StudentSpec
from depthlib.toy.models import (
    ResidualNet,
    ToyShape,
    derive_seed,
    displacement,
    displacement_inputs,
    make_teacher,
    teacher_module,
    variant,
)
from depthlib.validate import distinct, finite, int_in_range, resolve_device

EXPERIMENT = "toy"
#: Deepest student or teacher accepted (the paper goes to 128; memory grows linearly with depth).
MAX_DEPTH = 4096
TEACHER_NORMS = ("paper", "displacement")
PAPER_TEMPERATURES = tuple(float(f"{t:.4g}") for t in np.logspace(-2, 0, 16))  # paper App. C


def grid(rhos, temperatures) -> tuple[tuple[float, float], ...]:
    return tuple((float(r), float(t)) for r in rhos for t in temperatures)


@dataclass(frozen=True)
class SweepConfig:
    """One sweep. Everything here enters the results-cache key; ``chunk``/device do not change numbers."""

    profile: str
    variant: str = "exp-9"                     # training variant (models.VARIANTS)
    cells: tuple = grid((0.0, 1.0), (1.0,))    # (ρ, T) pairs trained
    depths: tuple = (6, 12, 16, 24, 32, 48)    # student depths ℓ (the paper's)
    replicates: int = 3                        # independent teachers per ρ (paper: 3)
    steps: int = 40_000                        # optimiser steps (paper: 40k for exp-9/9-1)
    batch: int = 1024                          # fresh Gaussian inputs per step (paper: 1024)
    eval_every: int = 500                      # test-loss interval (paper: 500 in the curve variants)
    eval_batches: int = 10                     # held-out batches per evaluation (paper: 10 × 1024)
    eval_batch_size: int = 1024
    teacher_depth: int = 128                   # ℓ* (paper: 128)
    d_model: int = 32                          # toy width m (paper: 32)
    signature_inputs: int = 512                # inputs used for the hidden-state signatures
    seed: int = 0
    teacher_norm: str = "paper"                # "paper" | "displacement": every teacher scaled to the ρ = 0
                                               # teacher's mean ‖h_ℓ* − h_0‖ (models.normalise_displacement)
    tf32: bool = False                         # allow TF32 matmuls on CUDA (changes the numbers: in the key when set)

    def shape(self) -> ToyShape:
        return ToyShape(d_model=self.d_model, d_mlp=4 * self.d_model, teacher_depth=self.teacher_depth)

    def to_dict(self) -> dict:
        out = to_dict(self)
        if not self.tf32:
            out.pop("tf32")                    # fp32 runs keep the keys they had before the field existed
        return out

    @property
    def n_students(self) -> int:
        return len(self.cells) * self.replicates * len(self.depths)

    def validate(self) -> "SweepConfig":
        for rho, t in self.cells:
            if not 0.0 <= finite("rho", rho) <= 1.0:
                raise InputError(f"rho must be in [0, 1], got {rho:g}")
            if not finite("temperature", t) > 0:
                raise InputError(f"temperature must be > 0, got {t:g}")
        for depth in self.depths:
            int_in_range("student depth", depth, 1, MAX_DEPTH)
        distinct("depths", self.depths, at_least=2)   # α_ℓ needs two depths at least
        int_in_range("steps", self.steps, 1, 10_000_000)
        int_in_range("batch", self.batch, 1, 1 << 20)
        int_in_range("replicates", self.replicates, 1, 1000)
        int_in_range("eval_every", self.eval_every, 1)
        int_in_range("teacher depth", self.teacher_depth, 1, MAX_DEPTH)
        if self.teacher_norm not in TEACHER_NORMS:
            raise InputError(f"unknown teacher_norm {self.teacher_norm!r} (have {', '.join(TEACHER_NORMS)})")
        variant(self.variant)
        return self


# ---- building the engine -------------------------------------------------------------------------------
def build_engine(cfg: SweepConfig, device: str = "cpu", chunk: int | None = None,
                 keep=None) -> tuple[BatchedStudents, pd.DataFrame, list]:
    """The engine for a sweep, the table of its students (caller's order) and its teachers.

    ``keep(row) -> bool`` trains only some students (row: rho, temperature, replicate, depth); each student's
    trajectory does not depend on who else is trained, so a subset replays its part of a full sweep."""
    shape, train = cfg.shape(), variant(cfg.variant)
    rhos = sorted({c[0] for c in cfg.cells})
    teachers, streams, t_index = [], [], {}
    for r in range(cfg.replicates):
        for rho in rhos:
            t_index[(r, rho)] = len(teachers)
            teachers.append(make_teacher(rho, derive_seed(cfg.seed, "teacher", r), shape,
                                         normalise=cfg.teacher_norm == "displacement"))
            streams.append(r)
    specs, rows = [], []
    for rho, temp in cfg.cells:
        for r in range(cfg.replicates):
            for depth in cfg.depths:
                if keep is not None and not keep({"rho": rho, "temperature": temp, "replicate": r, "depth": int(depth)}):
                    continue
                specs.append(StudentSpec(t_index[(r, rho)], temp, int(depth),
                                         derive_seed(cfg.seed, "student", r, int(depth))))
                rows.append({"rho": rho, "temperature": temp, "replicate": r, "depth": int(depth)})
    dev = resolve_device(device)
    if chunk is None:
        chunk = 4 if dev.type == "cpu" else 0      # CPU: cache blocking (measured fastest here); GPU: all at once
    eng = BatchedStudents(teachers, specs, train, cfg.steps, streams=streams,
                          data_seeds=[derive_seed(cfg.seed, "data", r) for r in range(cfg.replicates)],
                          test_seeds=[derive_seed(cfg.seed, "test", r) for r in range(cfg.replicates)],
                          batch=cfg.batch, eval_batches=cfg.eval_batches, eval_batch_size=cfg.eval_batch_size,
                          shape=shape, device=str(dev), chunk=chunk, allow_tf32=cfg.tf32)
    return eng, pd.DataFrame(rows), teachers


def _save_checkpoint(run: results.Run, eng: BatchedStudents, train_sum: torch.Tensor, n_sum: int) -> None:
    results.atomic_torch_save(run.path / "checkpoint.pt",
                              {"engine": eng.state_dict(), "train_sum": train_sum.cpu(), "n_sum": n_sum})


def open_sweep_run(cfg: SweepConfig, root=None, experiment: str = EXPERIMENT) -> results.Run:
    """The results-cache folder of a sweep (complete or not); ``experiment`` names its family of runs
    (``toy`` for chapter 3's sweep, ``toy-calibration`` for its long edge-cell runs)."""
    return results.open_run(experiment, cfg.validate().to_dict(), root=root)


def run_sweep(cfg: SweepConfig, device: str = "cpu", *, progress: bool = True, chunk: int | None = None,
              stop_at_step: int | None = None, checkpoint_every: int | None = None,
              root=None, experiment: str = EXPERIMENT, force: bool = False) -> results.Run | None:
    """Run (or resume, or load) a sweep; returns the complete run. Its lifecycle (opening, repairing a damaged
    folder, ``force``, timing across resumes, the manifest, Ctrl-C) is :func:`depthlib.results.computing`'s.

    A checkpoint (weights, Adam moments, generator states) is saved every ``checkpoint_every`` steps (default:
    every evaluation on the CPU; every 10th on CUDA, where a checkpoint of a paper sweep is ~2 GB); a resumed
    run restarts from the last one, and recomputes identically the few evaluations after it, if any.
    ``stop_at_step`` interrupts the run after the evaluation at that step (for tests) and returns None."""
    config = cfg.validate().to_dict()
    with results.computing(experiment, config, profile=cfg.profile, code=(f"{__name__}:run_sweep",), seed=cfg.seed,
                           device=str(resolve_device(device)), force=force, root=root, checkpoints=("checkpoint.pt",),
                           saves="the sweep's last checkpoint (every evaluation on the CPU) is in {folder}") as job:
        if job.complete:
            return job.run
        run = job.run
        eng, students, teachers = build_engine(cfg, device, chunk)
        if checkpoint_every is None:
            checkpoint_every = cfg.eval_every * (1 if eng.device.type == "cpu" else 10)
        train_sum, n_sum = torch.zeros(eng.K, dtype=torch.float64, device=eng.device), 0
        ckpt = run.path / "checkpoint.pt"
        start = 0
        if ckpt.exists():
            state = torch.load(ckpt, weights_only=False)
            eng.load_state_dict(state["engine"])
            train_sum, n_sum = state["train_sum"].to(eng.device), state["n_sum"]
            start = eng.step_count
            lost = [s for s in range(cfg.eval_every, start + 1, cfg.eval_every) if not run.has(f"curve_{s:07d}")]
            if lost:       # an evaluation before the checkpoint is gone (e.g. removed as unreadable): start again
                print(f"[depthlib] {run.path}: the evaluation at step {lost[0]} is missing, so the checkpoint at step "
                      f"{start} cannot complete the curves; training again from step 0", file=sys.stderr)
                ckpt.unlink()
                for name in run.tables("curve_"):
                    run.table_path(name).unlink()
                eng, students, teachers = build_engine(cfg, device, chunk)
                train_sum, n_sum, start = torch.zeros(eng.K, dtype=torch.float64, device=eng.device), 0, 0
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=cfg.steps, initial=start, desc=f"toy {cfg.profile} ({eng.K} students)", unit="step",
                       file=sys.stderr, dynamic_ncols=True)
        t_loop = time.perf_counter()
        for step in range(start, cfg.steps):
            train_sum += eng.step().double()
            n_sum += 1
            done = step + 1
            if done % cfg.eval_every == 0 or done == cfg.steps:
                test = eng.evaluate().cpu().numpy()
                table = students.assign(step=done, train_loss=(train_sum / n_sum).cpu().numpy(), test_loss=test)
                run.write_table(f"curve_{done:07d}", table)
                train_sum.zero_()
                n_sum = 0
                if done % checkpoint_every == 0 or done == cfg.steps or done == stop_at_step:
                    _save_checkpoint(run, eng, train_sum, n_sum)
                    job.save_progress()
                if stop_at_step is not None and done >= stop_at_step:
                    if bar is not None:
                        bar.close()
                    job.stop()
                    return None
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        loop_s = time.perf_counter() - t_loop
        trained = cfg.steps - start
        curves = pd.concat([run.table(n) for n in run.tables("curve_")], ignore_index=True)
        run.write_table("curves", curves)
        run.write_table("alpha", analysis.final_alpha(curves))
        run.write_table("alpha_steps", analysis.alpha_table(curves))
        sig, lag = student_signatures(eng, students, teachers, cfg)
        run.write_table("signatures", sig)
        run.write_table("lag_cos", lag)
        run.write_table("teachers", teacher_table(teachers, eng.streams, cfg))
        for name in run.tables("curve_"):              # per-evaluation scratch, now all in ``curves``
            run.table_path(name).unlink()
        job.record(n_students=eng.K, steps_trained_this_call=trained, resumed_from_step=start,
                   model_steps_per_s=round(eng.K * trained / loop_s, 3) if trained else None,
                   gflop_per_s=round(eng.flops_per_step() * trained / loop_s / 1e9, 2) if trained else None,
                   flop_total=eng.flops_per_step() * cfg.steps, torch_threads=torch.get_num_threads())
    return job.run


def student_signatures(eng: BatchedStudents, students: pd.DataFrame, teachers: list, cfg: SweepConfig
                       ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-layer signatures and long-lag cosines (two tidy tables) of every trained student of replicate 0 and
    of replicate 0's teachers."""
    shape, train = cfg.shape(), variant(cfg.variant)
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "signature"))
    x = torch.randn((cfg.signature_inputs, shape.d_model), generator=g)
    head = "none" if train.head == "none" else train.head
    sigs, lags = [], []

    def add(states, **labels):
        sigs.append(analysis.signatures(states).assign(**labels))
        lags.append(analysis.lag_cosines(states).assign(**labels))

    with torch.no_grad():
        for k, row in students.iterrows():
            if row["replicate"] != 0:
                continue
            net = ResidualNet.from_weights(eng.export_student(k), shape, train.block, head)
            add(net.hidden(x, all_states=True), net="student", rho=row["rho"], temperature=row["temperature"],
                replicate=0, depth=row["depth"])
        for i, t in enumerate(teachers):
            if eng.streams[i] != 0:
                continue
            add(teacher_module(t, shape).hidden(x, all_states=True), net="teacher", rho=t.rho,
                temperature=np.nan, replicate=0, depth=t.depth)
    return pd.concat(sigs, ignore_index=True), pd.concat(lags, ignore_index=True)


def teacher_table(teachers: list, streams: list[int], cfg: SweepConfig) -> pd.DataFrame:
    """One row per teacher: ρ, replicate, the W_down scale of its normalisation and its mean displacement
    ‖h_ℓ* − h_0‖ on the fixed displacement inputs (models.displacement_inputs)."""
    x = displacement_inputs(cfg.shape())
    return pd.DataFrame([{"rho": t.rho, "replicate": r, "scale": t.scale, "displacement": displacement(t, x),
                          "teacher_norm": cfg.teacher_norm} for t, r in zip(teachers, streams)])

"""Looped students in chapter 3's toy, trained and certified by chapter 3's certified protocol.

A looped student of depth ℓ is one residual block applied ℓ times with step 1/ℓ (:mod:`depthlib.compose.looped`:
ℓ explicit-Euler steps of one autonomous flow; its parameter count does not depend on ℓ). This module trains such
students exactly as chapter 3's certified protocol (:mod:`depthlib.toy.certified`) trains its untied students, so
that the two can be compared depth by depth:

* the same teachers, training pool (the teacher's output states of ``pool_batches × batch`` inputs, visited without
  replacement), held-out inputs and stage schedule (warm-up, constant, linear decay to ``decay_to``), every route
  ``steps`` at every depth;
* the same **certificate**: the depth's lowest-loss route is continued — a fresh schedule of half its steps so far,
  re-warmed and decayed again — until a continuation gains less than 2 % (*certified*) or ``max_continuations`` are
  spent (:mod:`depthlib.certificate`);
* the same tables (``stages``, ``curves``, ``certified``), so chapter 3's fits apply unchanged: α_ℓ per replicate for
  the envelope, per route and for the untrained warm start, its drop-one-depth range and local slopes.

**Routes.** ``scratch`` (exp-9-3's init of one block: W_down = 0, the teacher's fixed head) at the smallest depth;
``halved`` at every deeper depth (each twice the previous): the block of depth ℓ/2 reached by training alone
(scratch or halved, with its continuations — never one started at the teacher) with its down-projection halved, the
same flow with half the step; ``euler`` (tied teacher only) at every depth: the teacher's one block with
W_down × ℓ*/ℓ, the teacher's own flow integrated in ℓ steps, then trained. **Learning rate**: the student is a flow
over unit time whatever ℓ, so its rate does not depend on ℓ — exp-9-3's rate at the smallest depth, × ``lr_warm``
for the warm starts.

Each unit (teacher, T, replicate) also measures the hidden-state signatures of its certified-envelope students and of
its teacher (chapter 3's :func:`depthlib.toy.analysis.signatures` and :func:`~depthlib.toy.analysis.lag_cosines`, on
``SIGNATURE_INPUTS`` seeded Gaussian inputs). The units are trained and merged by the one units runner
(:mod:`depthlib.units`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd
import torch

from depthlib.certificate import gain
from depthlib.compose.looped import SIGNATURE_INPUTS, SharedBlock, euler_block, halve, looped_weights, n_parameters
from depthlib.contract import Profile
from depthlib.errors import InputError
from depthlib.toy import analysis
from depthlib.toy.certified import (
    CertifiedConfig,
    PoolStudents,
    StageTraining,
    Student,
    UnitData,
    UnitStages,
)
from depthlib.toy.converged import TEACHER_KINDS
from depthlib.toy.engine import StudentSpec
from depthlib.toy.models import (
    ResidualNet,
    StudentWeights,
    TeacherWeights,
    derive_seed,
    init_student,
    make_teacher,
    teacher_module,
    variant,
)

EXPERIMENT = "compose-toy-certified"
UNITS = "compose-toy-certified-units"
ROUTES = ("scratch", "halved", "euler")


@dataclass(frozen=True)
class LoopedCertifiedConfig(Profile):
    """One run: chapter 3's certified-protocol settings (``protocol``: its ``cells`` are (ρ, T, replicates), its
    depths the looped students', each twice the previous) and whether the tied teacher's students get the Euler
    route."""

    profile: str
    protocol: CertifiedConfig = field(default_factory=lambda: CertifiedConfig(
        "cpu", cells=((1.0, 1.0, 3), (0.0, 1.0, 3)), depths=(6, 12, 24, 48)))
    euler: bool = True

    @property
    def seed(self) -> int:
        return self.protocol.seed

    def flow_lr(self) -> float:
        """The looped student's base rate (scratch): exp-9-3's rate at the smallest depth."""
        return variant("exp-9-3").base_lr(min(self.protocol.depths))

    def training(self, lr_scale: float) -> StageTraining:
        """Chapter 3's stage training (its schedule, Adam, KL on tempered logits with the teacher's fixed head) with a
        depth-independent rate: ``flow_lr`` × ``lr_scale``."""
        base = {**dataclasses.asdict(variant("exp-9-3")), "lr": self.flow_lr(), "lr_depth_factor": None,
                "decay_to": self.protocol.decay_to}
        return StageTraining(**base, lr_scale=lr_scale)

    def units(self) -> list[dict]:
        return self.protocol.units()

    def validate(self) -> "LoopedCertifiedConfig":
        self.protocol.validate()
        ds = sorted(self.protocol.depths)
        if any(b != 2 * a for a, b in zip(ds[:-1], ds[1:])):
            raise InputError(f"looped depths must double (the halved route halves the step), got {ds}")
        if self.euler and ds[-1] >= self.protocol.teacher_depth:
            raise InputError(f"the Euler start at depth >= the teacher's ({self.protocol.teacher_depth}) is the teacher "
                             f"itself (loss 0, nothing to train): looped depths must stay below it, got {ds}")
        return self


class LoopedPoolStudents(SharedBlock, PoolStudents):
    """Chapter 3's certified protocol's pooled engine (:class:`depthlib.toy.certified.PoolStudents`) with one looped
    student (:class:`depthlib.compose.looped.SharedBlock`)."""


def train_stage(cfg: LoopedCertifiedConfig, teacher: TeacherWeights, pool, test_targets, cell: dict, depth: int,
                name: str, start: StudentWeights | None, lr_scale: float, steps: int, parent_steps: int = 0,
                start_from: str = "exp-9-3 init (one block)", device: str = "cpu", depth_steps_before: int = 0,
                stop_at: int | None = None) -> Student:
    """Train one looped student for ``steps`` from the block ``start`` (None: exp-9-3's init of one block) on one fresh
    schedule, as :func:`depthlib.toy.certified.train_stage` trains an untied one. ``stop_at`` stops after that many
    steps (the replay check). Returns the block (per-application W_down for this depth), its row and its curve."""
    p, r = cfg.protocol, cell["replicate"]
    spec = StudentSpec(0, cell["temperature"], depth, derive_seed(p.seed, "looped-certified-student", r, depth, name))
    train = cfg.training(lr_scale)
    eng = LoopedPoolStudents(pool, derive_seed(p.seed, "looped-certified-order", r, depth, name), [teacher], [spec],
                             train, steps, data_seeds=[0], test_seeds=[derive_seed(p.seed, "test", r)], batch=p.batch,
                             eval_batches=p.eval_batches, eval_batch_size=p.eval_batch_size, shape=p.shape(),
                             device=device, chunk=1, test_targets=test_targets)
    if start is None:
        start = init_student(1, spec.seed, train, p.shape(), fixed_head=teacher.fixed_head)
    eng.load_block(start)
    every = steps // p.evals
    curve = [(0, float(eng.evaluate()[0]))]
    for step in range(steps if stop_at is None else min(stop_at, steps)):
        eng.step()
        if (step + 1) % every == 0:
            curve.append((step + 1, float(eng.evaluate()[0])))
    kind = TEACHER_KINDS[cell["rho"]]
    df = pd.DataFrame(curve, columns=["step", "test_loss"]).assign(
        teacher=kind, rho=cell["rho"], temperature=cell["temperature"], replicate=r, depth=depth, stage=name)
    block = eng.export_block()
    initial, final = curve[0][1], curve[-1][1]
    pool_loss = eng.pool_loss(min(p.eval_batches * p.eval_batch_size // p.batch, p.pool_batches) or 1)
    row = {"teacher": kind, "rho": cell["rho"], "temperature": cell["temperature"], "replicate": r, "depth": depth,
           "stage": name, "route": name.split("+")[0], "start": start_from, "stage_steps": steps,
           "steps": parent_steps + steps, "depth_steps": depth_steps_before + steps, "batch": p.batch,
           "lr_scale": lr_scale, "base_lr": train.base_lr(depth), "parameters": n_parameters(block),
           "initial_loss": initial, "test_loss": final, "pool_loss": pool_loss, "gain": gain(initial, final)}
    return Student(block, row, df)


def unit_teacher(cfg: LoopedCertifiedConfig, cell: dict) -> TeacherWeights:
    """Chapter 3's teacher of this cell's replicate (the certified protocol's seeds)."""
    p = cfg.protocol
    return make_teacher(cell["rho"], derive_seed(p.seed, "teacher", cell["replicate"]), p.shape())


@torch.no_grad()
def unit_signatures(cfg: LoopedCertifiedConfig, cell: dict, teacher: TeacherWeights,
                    students: dict[int, Student]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(signatures, lags) of each depth's envelope student (``net`` = looped student) and of the teacher, on
    ``SIGNATURE_INPUTS`` seeded Gaussian inputs (:data:`depthlib.compose.looped.SIGNATURE_INPUTS`)."""
    p = cfg.protocol
    x = torch.randn((SIGNATURE_INPUTS, p.d_model), generator=torch.Generator().manual_seed(derive_seed(p.seed,
                                                                                                        "signature")))
    labels = {"teacher": TEACHER_KINDS[cell["rho"]], "rho": cell["rho"], "temperature": cell["temperature"],
              "replicate": cell["replicate"]}
    sigs, lags = [], []

    def add(states, **more):
        sigs.append(analysis.signatures(states).assign(**labels, **more))
        lags.append(analysis.lag_cosines(states).assign(**labels, **more))

    for depth, s in sorted(students.items()):
        net = ResidualNet.from_weights(looped_weights(s.weights, depth), p.shape(), "euler", "fixed")
        add(net.hidden(x, all_states=True), net="looped student", depth=depth, stage=s.row["stage"])
    add(teacher_module(teacher, p.shape()).hidden(x, all_states=True), net="teacher", depth=teacher.depth, stage="")
    return pd.concat(sigs, ignore_index=True), pd.concat(lags, ignore_index=True)


def train_unit(cfg: LoopedCertifiedConfig, cell: dict, load: Callable[[str, int], Student | None],
               save: Callable[[str, int, Student], None], progress: Callable[[str], None] = lambda _: None,
               device: str = "cpu") -> tuple[pd.DataFrame, ...]:
    """Every route of every depth of one (ρ, T, replicate), shallowest first (the halved route needs depth ℓ/2), then
    the continuations that certify each depth's best student; ``load`` / ``save`` resume stage by stage (the units
    runner's, :mod:`depthlib.units`). Returns (stages, curves, certified: one row per depth, signatures, lags)."""
    p = cfg.protocol
    rho, r = cell["rho"], cell["replicate"]
    teacher = unit_teacher(cfg, cell)
    data = UnitData(p, teacher, cell, cfg.training(1.0), device)

    def train(depth, name, start, lr_scale, steps, parent_steps, start_from, at_depth) -> Student:
        return train_stage(cfg, teacher, *data.get(), cell, depth, name, start, lr_scale, steps, parent_steps,
                           start_from, device, at_depth)

    stages = UnitStages(p, train, load, save, progress, f"{TEACHER_KINDS[rho]} T={cell['temperature']:g} r{r} (looped)")
    table = []
    envelope: dict[int, Student] = {}              # each depth's certified (or last-continued) best student
    trained_alone: dict[int, Student] = {}         # each depth's best student whose lineage never saw the teacher
    depths = sorted(p.depths)
    for i, depth in enumerate(depths):
        routes = []
        if i == 0:
            routes.append(stages.stage(depth, "scratch", None, 1.0, 0, "exp-9-3 init (one block)"))
        else:
            prev = trained_alone[depths[i - 1]]
            routes.append(stages.stage(depth, "halved", halve(prev.weights), p.lr_warm, prev.row["steps"],
                                       f"halved {prev.row['stage']} ℓ={depths[i - 1]}"))
        if cfg.euler and rho == 1.0:
            routes.append(stages.stage(depth, "euler", euler_block(teacher, depth), p.lr_warm, 0,
                                       "Euler discretisation (teacher's block)"))
        cert = stages.certify(depth, min(routes, key=lambda s: s.row["test_loss"]))
        best = envelope[depth] = cert.best
        alone = [s for s in routes if s.row["route"] != "euler"]
        if best.row["route"] != "euler":
            alone.append(best)
        trained_alone[depth] = min(alone, key=lambda s: s.row["test_loss"])
        table.append(cert.row(parameters=best.row["parameters"]))
    overlap = data.overlap                       # the exact held-out check, also when every stage was resumed
    sigs, lags = unit_signatures(cfg, cell, teacher, envelope)
    return (pd.DataFrame(stages.rows), pd.concat(stages.curves, ignore_index=True),
            pd.DataFrame(table).assign(heldout_in_pool=overlap), sigs, lags)


__all__ = ["EXPERIMENT", "ROUTES", "UNITS", "LoopedCertifiedConfig", "LoopedPoolStudents", "train_stage",
           "train_unit", "unit_signatures", "unit_teacher"]

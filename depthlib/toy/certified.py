"""The certified converged-loss protocol (ours) behind chapter 3's calibration (paper §4, Fig. 4a,b; App. C).

The calibration compares the **converged** held-out loss L*(ℓ) of depth-ℓ students of a tied teacher (a smooth flow:
α_ℓ → 3, procedural) and of an independent one (an ensemble: α_ℓ ≈ 1). Any trained student bounds L*(ℓ) from
above, so the route to it is free; what must be shown is that the student is *at* L*(ℓ). A rule a schedule can meet
("little change while the rate is decayed") does not show it. This protocol's rule does:

**Certificate.** A student is *certified* when a **continuation** from its final weights — a fresh schedule of
``continuation`` (half) of the steps it has trained at its depth so far, re-warmed to the base rate of its route and
decayed again — lowers its held-out loss by less than ``gain_below`` (2 %). Otherwise the continued student replaces
it and is continued again, up to ``max_continuations`` times; a student still gaining then is reported *not
certified*, with every gain. Each continuation is half the student's steps *so far* (6,000, then 9,000, then 13,500
steps after a 12,000-step route), so a loss that keeps falling as a power of the steps never passes by the student
growing old: a fixed-length continuation would shrink relative to the student and pass any slow tail.

The threshold and the gain are the book's one certificate (:mod:`depthlib.certificate`, which says why 2 %).

**Routes** (every depth, both teachers unless said):

* ``scratch``      the paper's exp-9-3 initialisation (W_down = 0, the teacher's fixed head), the paper's lr 2.4e-3/√ℓ;
* ``euler``        (tied teacher only) every block is the shared teacher block with W_down × ℓ*/ℓ: the teacher's flow
                   integrated with ℓ Euler steps instead of ℓ*;
* ``distilled``    group distillation, for both teachers: the ℓ* teacher blocks are cut into ℓ consecutive groups of
                   ℓ*/ℓ blocks (sizes differing by at most one), and student block j is fitted to its group's state
                   map h ↦ h_out − h_in by a local regression on the teacher's own residual-stream states (W_up, b_up
                   from the group's middle block, W_down by ridge least squares, then ``distill_steps`` Adam steps on
                   all three; each block alone, so the fit is local and cheap);
* ``progressive``  the certified student of depth ℓ/2, every block split into two half-step blocks (W_down / 2).

The warm starts train at ``lr_warm`` (0.1) × the paper's lr. **Schedule** (every stage, route or continuation):
Adam (the paper's betas, ε), linear warm-up over 2 % of the steps, constant to 50 %, linear decay to ``decay_to``
(1 %) of the base rate at the end. **Every route gets the same ``steps`` at every depth**, so no deeper student gets
fewer optimiser steps than a shallower one. The student a depth's exponent uses is the lowest-loss route
(the envelope), then certified.

**Data.** Inputs are Gaussian as in the paper. A training pool of ``pool_batches × batch`` inputs and the teacher's
output state RMSNorm(h_ℓ*) is computed once per (teacher, T, replicate) (the 128-block teacher forward otherwise
costs 3–6× a shallow student's step). Each stage visits the pool in a fresh random order without replacement, so
with ``pool_batches ≥ steps`` no input repeats within a stage. Every student's loss on the inputs it trained on
(``pool_loss``) is recorded beside its held-out loss (the paper's 10 × 1024 fresh inputs, those of the committed
calibration runs) and the gap is checked (``gap_below``, 10 %); that no held-out input occurs in the pool is checked
exactly, row by row.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import torch

from depthlib.certificate import GAIN_BELOW, gain
from depthlib.contract import Profile
from depthlib.errors import InputError
from depthlib.measures import fit_power_law
from depthlib.toy import analysis
from depthlib.toy.converged import TEACHER_KINDS, euler_student, split_student
from depthlib.toy.engine import BatchedStudents, StudentSpec, _rms
from depthlib.toy.models import StudentTraining, StudentWeights, TeacherWeights, ToyShape, derive_seed, make_teacher, variant

ROUTES = ("scratch", "euler", "distilled", "progressive")
#: A student's held-out loss should lie within this fraction of its training-pool loss.
GAP_BELOW = 0.10
#: Minibatch of the group regressions' Adam refinement.
DISTILL_BATCH = 2048
KEYS = ["teacher", "rho", "temperature", "replicate", "depth"]


# ---- the schedule ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageTraining(StudentTraining):
    """exp-9-3's training (KL on tempered logits, the teacher's fixed head, lr 6e-4·4/√ℓ) with a stage's lr scale and
    schedule: warm-up to the base rate, constant, then a linear decay to ``decay_to`` of it at the last step."""

    lr_scale: float = 1.0
    warmup_frac: float = 0.02
    decay_start: float = 0.5

    def base_lr(self, depth: int) -> float:
        return super().base_lr(depth) * self.lr_scale

    def schedule(self, step: int, total_steps: int) -> float:
        warm = max(1, round(self.warmup_frac * total_steps))
        if step < warm:
            return (step + 1) / warm
        t = step / total_steps
        if t < self.decay_start:
            return 1.0
        return 1.0 - (1.0 - self.decay_to) * (t - self.decay_start) / (1.0 - self.decay_start)


def stage_training(lr_scale: float, decay_to: float) -> StageTraining:
    return StageTraining(**{**dataclasses.asdict(variant("exp-9-3")), "decay_to": decay_to}, lr_scale=lr_scale)


# ---- the protocol's settings --------------------------------------------------------------------------
@dataclass(frozen=True)
class CertifiedConfig(Profile):
    """One run of the protocol. ``cells`` are (ρ, T, replicates); the teacher and held-out inputs of replicate r are
    the committed calibration's (``derive_seed(seed, 'teacher', r)``, ``derive_seed(seed, 'test', r)``). To and from
    a run's JSON by the one (de)serialiser, :class:`depthlib.contract.Profile`."""

    profile: str
    cells: tuple = ((1.0, 1.0, 3), (0.0, 1.0, 3), (1.0, 0.01, 3))
    depths: tuple = (6, 12, 16, 24, 32, 48)      # the paper's student depths
    steps: int = 12_000                          # every route's steps, at every depth
    continuation: float = 0.5                    # a continuation's steps: this fraction of the student's so far
    max_continuations: int = 3
    gain_below: float = GAIN_BELOW
    batch: int = 256
    pool_batches: int = 12_000                   # training pool: pool_batches × batch inputs
    lr_warm: float = 0.1                         # lr scale of the warm-started routes
    decay_to: float = 0.01                       # final rate of every stage, as a fraction of its base rate
    distill_inputs: int = 16_384                 # teacher states the group regressions are fitted on
    distill_steps: int = 200
    evals: int = 10                              # held-out evaluations per stage
    eval_batches: int = 10                       # the paper's test set: 10 × 1024 fresh inputs
    eval_batch_size: int = 1024
    teacher_depth: int = 128
    d_model: int = 32
    seed: int = 0

    def shape(self) -> ToyShape:
        return ToyShape(d_model=self.d_model, d_mlp=4 * self.d_model, teacher_depth=self.teacher_depth)

    def continuation_steps(self, trained: int) -> int:
        """Steps of a continuation of a student trained ``trained`` steps at its depth (a multiple of ``evals``)."""
        return max(self.evals, math.ceil(self.continuation * trained / self.evals) * self.evals)

    def routes(self, rho: float) -> tuple[str, ...]:
        return ROUTES if rho == 1.0 else tuple(r for r in ROUTES if r != "euler")

    def validate(self) -> "CertifiedConfig":
        if len(set(self.depths)) < 3 or min(self.depths) < 1:
            raise InputError(f"the protocol needs at least 3 distinct depths >= 1, got {self.depths}")
        if max(self.depths) > self.teacher_depth:
            raise InputError(f"group distillation needs depths <= the teacher's {self.teacher_depth}")
        for rho, t, reps in self.cells:
            if rho not in TEACHER_KINDS:
                raise InputError(f"the protocol's teachers are tied (rho 1) or independent (rho 0), got rho={rho}")
            if not (t > 0 and math.isfinite(t)) or int(reps) < 1:
                raise InputError(f"bad cell (rho={rho}, T={t}, replicates={reps})")
        if self.steps < self.evals or self.steps % self.evals or self.batch < 1 or self.pool_batches < 1:
            raise InputError("steps must be a multiple of evals; batch and pool_batches >= 1")
        if not 0 < self.continuation <= 1 or self.max_continuations < 1 or not 0 < self.gain_below < 1:
            raise InputError("continuation must be in (0, 1], max_continuations >= 1, gain_below in (0, 1)")
        if not 0 < self.decay_to <= 1:
            raise InputError(f"decay_to must be in (0, 1], got {self.decay_to}")
        return self

    def units(self) -> list[dict]:
        """One unit of work per (ρ, T, replicate): its students share one teacher and one pool."""
        return [{"rho": float(rho), "temperature": float(t), "replicate": r}
                for rho, t, reps in self.cells for r in range(int(reps))]


# ---- the teacher's states, the pool, group distillation -----------------------------------------------
def teacher_states(teacher: TeacherWeights, x: torch.Tensor, at: list[int]) -> list[torch.Tensor]:
    """The teacher's residual stream h_l (N, d) for every l in ``at`` (0 = RMSNorm(x), ℓ* = the last state), with
    the engine's arithmetic (float32)."""
    eps = torch.finfo(torch.float32).eps
    h, _ = _rms(x, eps)
    want, out = set(at), {}
    for l in range(teacher.depth + 1):
        if l in want:
            out[l] = h
        if l == teacher.depth:
            break
        u, _ = _rms(h, eps)
        z = torch.relu(u @ teacher.W_up[l].T + teacher.b_up[l])
        h = h + (z * z) @ teacher.W_down[l].T
    return [out[l] for l in at]


def make_pool(cfg: CertifiedConfig, teacher: TeacherWeights, replicate: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training pool of one replicate: inputs x (P, B, d) ~ N(0, I) and the teacher's output state
    y = RMSNorm(h_ℓ*) (P, B, d), from which the engine makes the logits y·W_head (64 batches per teacher forward)."""
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "certified-pool", replicate))
    x = torch.randn((cfg.pool_batches, cfg.batch, cfg.d_model), generator=g)
    eps = torch.finfo(torch.float32).eps
    with torch.no_grad():
        y = torch.cat([_rms(teacher_states(teacher, x[i:i + 64].reshape(-1, cfg.d_model), [teacher.depth])[0], eps)[0]
                       .reshape(-1, cfg.batch, cfg.d_model) for i in range(0, cfg.pool_batches, 64)])
    return x, y


def heldout_in_pool(pool_x: torch.Tensor, test_x: torch.Tensor) -> int:
    """How many held-out inputs (rows of ``test_x``, (..., d)) occur exactly, bit for bit, among the pool's inputs."""
    def rows(t: torch.Tensor) -> np.ndarray:
        a = np.ascontiguousarray(t.reshape(-1, t.shape[-1]).cpu().numpy())
        return a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).ravel()
    return int(np.isin(rows(test_x), rows(pool_x)).sum())   # exact: byte-equal rows


def distilled_student(teacher: TeacherWeights, depth: int, cfg: CertifiedConfig, seed: int
                      ) -> tuple[StudentWeights, float]:
    """Group distillation: student block j fitted alone to the teacher's map over group j of ℓ*/ℓ consecutive blocks,
    on the teacher's states of ``distill_inputs`` fresh inputs. W_up, b_up start as the group's middle teacher block,
    W_down as the ridge least-squares fit of the group's state change on that block's features ReLU(·)², then
    ``distill_steps`` full-batch Adam steps refine all three on the relative squared error. Returns the student (the
    teacher's fixed head) and its blocks' mean R² of the state change."""
    groups = np.array_split(np.arange(teacher.depth), depth)
    bounds = [int(g[0]) for g in groups] + [teacher.depth]
    x = torch.randn((cfg.distill_inputs, cfg.d_model), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        states = teacher_states(teacher, x, bounds)
    eps = torch.finfo(torch.float32).eps
    gen = torch.Generator().manual_seed(seed + 1)
    W_up, b_up, W_down, r2 = [], [], [], []
    for j, grp in enumerate(groups):
        h_in, delta = states[j], states[j + 1] - states[j]
        mid = int(grp[len(grp) // 2])
        wu, b = teacher.W_up[mid].clone(), teacher.b_up[mid].clone()
        u, _ = _rms(h_in, eps)
        f = torch.relu(u @ wu.T + b).double() ** 2                                 # (N, H)
        gram = f.T @ f
        ridge = 1e-6 * float(torch.trace(gram)) / gram.shape[0]
        wd = torch.linalg.solve(gram + ridge * torch.eye(gram.shape[0], dtype=gram.dtype), f.T @ delta.double())
        params = [wu.requires_grad_(), b.requires_grad_(), wd.T.float().contiguous().requires_grad_()]
        opt = torch.optim.Adam(params, lr=1e-3)
        scale = float(delta.pow(2).sum(-1).mean())

        def loss_of(p, rows=slice(None)):
            z = torch.relu(u[rows] @ p[0].T + p[1])
            return ((z * z) @ p[2].T - delta[rows]).pow(2).sum(-1).mean() / scale

        for _ in range(cfg.distill_steps):
            opt.zero_grad()
            loss = loss_of(params, torch.randint(len(u), (DISTILL_BATCH,), generator=gen))
            loss.backward()
            opt.step()
        with torch.no_grad():
            r2.append(1.0 - float(loss_of(params)))
        W_up.append(params[0].detach())
        b_up.append(params[1].detach())
        W_down.append(params[2].detach())
    return (StudentWeights(torch.stack(W_up), torch.stack(b_up), torch.stack(W_down), teacher.fixed_head.clone()),
            float(np.mean(r2)))


# ---- the pooled engine --------------------------------------------------------------------------------------
class PoolStudents(BatchedStudents):
    """:class:`BatchedStudents` (one student, one stream) whose training batches are the pool's, visited in a
    random order without replacement (a new order each pass), with the teacher's logits made from the pool's output
    states; held-out targets can be handed in (``test_targets``: the same teacher and test inputs)."""

    def __init__(self, pool: tuple[torch.Tensor, torch.Tensor], order_seed: int, *args,
                 test_targets: list[torch.Tensor] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool_x, self.pool_y = pool                                            # (P, B, d), (P, B, d)
        self.order_gen = torch.Generator().manual_seed(int(order_seed))
        self.order, self.cursor = torch.randperm(self.pool_x.shape[0], generator=self.order_gen), 0
        self._pending: int | None = None
        self._test_targets = test_targets

    def draw_batch(self) -> torch.Tensor:
        if self.cursor == len(self.order):
            self.order, self.cursor = torch.randperm(self.pool_x.shape[0], generator=self.order_gen), 0
        self._pending = int(self.order[self.cursor])
        self.cursor += 1
        return self.pool_x[self._pending][None]                                   # (1, B, d)

    def teacher_outputs(self, x: torch.Tensor) -> torch.Tensor:
        if self._pending is not None:
            i, self._pending = self._pending, None
            return torch.bmm(self.pool_y[i][None], self.t_head)                   # (1, B, V)
        return super().teacher_outputs(x)

    @property
    def test_targets(self) -> list[torch.Tensor]:
        if self._test_targets is None:
            self.evaluate()
        return self._test_targets

    def load_student(self, w: StudentWeights) -> None:
        """Overwrite the student with weights ``w`` (a warm start)."""
        for j in range(w.W_up.shape[0]):
            self.Wu[j][0].copy_(w.W_up[j].T)
            self.b[j][0, 0].copy_(w.b_up[j])
            self.Wd[j][0].copy_(w.W_down[j].T)

    def pool_loss(self, n_batches: int) -> float:
        """Mean loss (no update) over the first ``n_batches`` pool batches: the inputs every stage trained on."""
        total = 0.0
        with torch.no_grad():
            for i in range(n_batches):
                h0, _ = _rms(self.pool_x[i][None], self.eps)
                hL, _ = self._forward(0, 1, h0, save=False)
                logits = torch.bmm(self.pool_y[i][None], self.t_head)
                loss, _ = self._loss_and_grad(0, 1, hL, self._targets(logits, 0, 1), grad=False)
                total += float(loss.double().mean())
        return total / n_batches


# ---- one stage: one student trained on one schedule ---------------------------------------------------------
@dataclass
class Student:
    """A trained student: weights, its summary row (the last stage's) and the stages' curves."""

    weights: StudentWeights
    row: dict
    curve: pd.DataFrame


def train_stage(cfg: CertifiedConfig, teacher: TeacherWeights, pool, test_targets, cell: dict, depth: int, name: str,
                start: StudentWeights | None, lr_scale: float, steps: int, parent_steps: int = 0,
                start_from: str = "exp-9-3 init", device: str = "cpu", depth_steps_before: int = 0) -> Student:
    """Train one student for ``steps`` from ``start`` (None: exp-9-3's initialisation) on one fresh schedule.
    ``name`` labels the stage (a route, or ``<route>+c<k>`` for a continuation); ``parent_steps`` are the steps its
    start already received, ``depth_steps_before`` those of them at this depth (a continuation's earlier stages)."""
    r = cell["replicate"]
    spec = StudentSpec(0, cell["temperature"], depth, derive_seed(cfg.seed, "certified-student", r, depth, name))
    train = stage_training(lr_scale, cfg.decay_to)
    eng = PoolStudents(pool, derive_seed(cfg.seed, "certified-order", r, depth, name), [teacher], [spec], train,
                       steps, data_seeds=[0], test_seeds=[derive_seed(cfg.seed, "test", r)], batch=cfg.batch,
                       eval_batches=cfg.eval_batches, eval_batch_size=cfg.eval_batch_size, shape=cfg.shape(),
                       device=device, chunk=1, test_targets=test_targets)
    if start is not None:
        eng.load_student(start)
    every = steps // cfg.evals
    curve = [(0, float(eng.evaluate()[0]))]
    for step in range(steps):
        eng.step()
        if (step + 1) % every == 0:
            curve.append((step + 1, float(eng.evaluate()[0])))
    kind = TEACHER_KINDS[cell["rho"]]
    df = pd.DataFrame(curve, columns=["step", "test_loss"]).assign(
        teacher=kind, rho=cell["rho"], temperature=cell["temperature"], replicate=r, depth=depth, stage=name)
    initial, final = curve[0][1], curve[-1][1]
    pool_loss = eng.pool_loss(min(cfg.eval_batches * cfg.eval_batch_size // cfg.batch, cfg.pool_batches) or 1)
    row = {"teacher": kind, "rho": cell["rho"], "temperature": cell["temperature"], "replicate": r, "depth": depth,
           "stage": name, "route": name.split("+")[0], "start": start_from, "stage_steps": steps,
           "steps": parent_steps + steps, "depth_steps": depth_steps_before + steps, "batch": cfg.batch,
           "lr_scale": lr_scale, "base_lr": train.base_lr(depth),
           "initial_loss": initial, "test_loss": final, "pool_loss": pool_loss,
           "gain": gain(initial, final)}
    return Student(eng.export_student(0), row, df)



# ---- one unit's data, stages and certificates (shared with chapter 7's looped students) ------------------------
class UnitData:
    """One unit's training pool and held-out targets, built once and only when a stage trains; ``overlap`` is the
    exact held-out check (how many held-out inputs occur in the pool), built also when every stage was resumed.
    ``training`` is the protocol's stage training (it sets how the probe engine makes the held-out targets)."""

    def __init__(self, cfg: CertifiedConfig, teacher: TeacherWeights, cell: dict, training: StageTraining,
                 device: str = "cpu"):
        self.cfg, self.teacher, self.cell, self.training, self.device = cfg, teacher, cell, training, device
        self._built: tuple | None = None

    def get(self) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """(pool, held-out targets)."""
        if self._built is None:
            cfg, r = self.cfg, self.cell["replicate"]
            pool = tuple(t.to(self.device) for t in make_pool(cfg, self.teacher, r))
            probe = PoolStudents(pool, 0, [self.teacher], [StudentSpec(0, self.cell["temperature"], 1, 0)],
                                 self.training, 1, data_seeds=[0], test_seeds=[derive_seed(cfg.seed, "test", r)],
                                 batch=cfg.batch, eval_batches=cfg.eval_batches,
                                 eval_batch_size=cfg.eval_batch_size, shape=cfg.shape(), device=self.device)
            self._built = (pool, probe.test_targets, heldout_in_pool(pool[0], probe.x_test))
        return self._built[0], self._built[1]

    @property
    def overlap(self) -> int:
        self.get()
        return self._built[2]


@dataclass
class Certificate:
    """A depth's certificate: its best student after the continuations, every continuation's gain, and whether the
    last one gained less than the threshold."""

    best: Student
    gains: list[float]
    certified: bool

    def row(self, **extra) -> dict:
        """The depth's row of the ``certified`` table; ``extra`` columns follow ``pool_loss``."""
        b = self.best.row
        return {**{k: b[k] for k in KEYS}, "route": b["route"], "stage": b["stage"], "steps": b["steps"],
                "test_loss": b["test_loss"], "pool_loss": b["pool_loss"], **extra, "certified": self.certified,
                "last_continuation_gain": self.gains[-1], "continuations": len(self.gains),
                "continuation_gains": ", ".join(f"{g:+.4f}" for g in self.gains)}


class UnitStages:
    """The stages of one unit in the order they are asked for — each loaded when an earlier, interrupted call finished
    it (``load(stage, depth)``), else trained and saved (``save``: the units runner's, :mod:`depthlib.units`) — and the
    continuations that certify a depth's best student. ``train(depth, name, start, lr_scale, steps, parent_steps,
    start_from, depth_steps_before)`` trains one stage; a route gets ``cfg.steps``, a continuation
    ``cfg.continuation_steps`` of the steps its student has at its depth."""

    def __init__(self, cfg: CertifiedConfig, train: Callable[..., Student], load: Callable[[str, int], Student | None],
                 save: Callable[[str, int, Student], None], progress: Callable[[str], None], label: str):
        self.cfg, self.train, self.load, self.save, self.progress, self.label = cfg, train, load, save, progress, label
        self.rows: list[dict] = []
        self.curves: list[pd.DataFrame] = []

    def stage(self, depth: int, name: str, start: StudentWeights | None, lr_scale: float, parent_steps: int,
              start_from: str, extra: dict | None = None, before: Student | None = None) -> Student:
        """One stage: a route (``before`` None) or a continuation of ``before``."""
        done = self.load(name, depth)
        if done is None:
            self.progress(f"{self.label} ℓ={depth} {name}")
            at_depth = 0 if before is None else before.row["depth_steps"]
            steps = self.cfg.steps if before is None else self.cfg.continuation_steps(at_depth)
            done = self.train(depth, name, start, lr_scale, steps, parent_steps, start_from, at_depth)
            done.row.update(extra or {})
            self.save(name, depth, done)
        self.rows.append(done.row)
        self.curves.append(done.curve)
        return done

    def certify(self, depth: int, best: Student) -> Certificate:
        """Continue ``best`` — each time a fresh schedule of half its steps so far, re-warmed to its route's rate —
        until a continuation gains less than ``gain_below`` or ``max_continuations`` are spent; the lower-loss student
        is kept at each step."""
        gains = []
        for k in range(1, self.cfg.max_continuations + 1):
            cont = self.stage(depth, f"{best.row['route']}+c{k}", best.weights, best.row["lr_scale"], best.row["steps"],
                              best.row["stage"], before=best)
            gains.append(cont.row["gain"])
            if cont.row["test_loss"] < best.row["test_loss"]:
                best = cont
            if cont.row["gain"] < self.cfg.gain_below:
                return Certificate(best, gains, True)
        return Certificate(best, gains, False)


# ---- one unit: every route of every depth, then the certificate ----------------------------------------------
def train_unit(cfg: CertifiedConfig, cell: dict, load: Callable[[str, int], Student | None],
               save: Callable[[str, int, Student], None], progress: Callable[[str], None] = lambda _: None,
               device: str = "cpu") -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every route of every depth of one (ρ, T, replicate), shallowest first (progressive depth needs the certified
    student of depth ℓ/2), then the continuations that certify each depth's best student. ``load(stage, depth)``
    returns a stage finished by an earlier, interrupted call (a unit resumes stage by stage); ``save`` stores each
    stage as it finishes. Returns (stages: one row per stage, curves, certified: one row per depth)."""
    rho, r = cell["rho"], cell["replicate"]
    teacher = make_teacher(rho, derive_seed(cfg.seed, "teacher", r), cfg.shape())
    data = UnitData(cfg, teacher, cell, stage_training(1.0, cfg.decay_to), device)

    def train(depth, name, start, lr_scale, steps, parent_steps, start_from, at_depth) -> Student:
        return train_stage(cfg, teacher, *data.get(), cell, depth, name, start, lr_scale, steps, parent_steps,
                           start_from, device, at_depth)

    stages = UnitStages(cfg, train, load, save, progress, f"{TEACHER_KINDS[rho]} T={cell['temperature']:g} r{r}")
    certified, table = {}, []
    for depth in sorted(cfg.depths):
        trained = []
        for route in cfg.routes(rho):
            extra, parent = {}, 0
            if route == "scratch":
                start, named, lr = None, "exp-9-3 init", 1.0
            elif route == "euler":
                start, named, lr = euler_student(teacher, depth), "Euler discretisation", cfg.lr_warm
            elif route == "distilled":
                if load(route, depth) is None:
                    start, fit = distilled_student(teacher, depth, cfg, derive_seed(cfg.seed, "distill", r, depth))
                else:
                    start, fit = None, float("nan")
                named, lr, extra = "group distillation", cfg.lr_warm, {"distill_r2": fit}
            else:
                if depth % 2 or depth // 2 not in certified:
                    continue                                       # no certified student of depth ℓ/2 to split
                half = certified[depth // 2]
                start, lr, parent = split_student(half.weights), cfg.lr_warm, half.row["steps"]
                named = f"split {half.row['stage']} ℓ={depth // 2}"
            trained.append(stages.stage(depth, route, start, lr, parent, named, extra))
        cert = stages.certify(depth, min(trained, key=lambda s: s.row["test_loss"]))
        certified[depth] = cert.best
        table.append(cert.row())
    return (pd.DataFrame(stages.rows), pd.concat(stages.curves, ignore_index=True),
            pd.DataFrame(table).assign(heldout_in_pool=data.overlap))


# ---- tables --------------------------------------------------------------------------------------------------
def with_gap(certified: pd.DataFrame) -> pd.DataFrame:
    """``certified`` with the held-out / pool loss ratio and whether it is within :data:`GAP_BELOW`."""
    ratio = certified["test_loss"] / certified["pool_loss"]
    return certified.assign(gap=ratio - 1.0, within_gap=(ratio - 1.0).abs() <= GAP_BELOW)


def alpha_tables(certified: pd.DataFrame, stages: pd.DataFrame) -> pd.DataFrame:
    """α_ℓ per (teacher, T, replicate) for the envelope (the certified students; ``certified_share`` says how many
    are), for every route's own trained student (before any continuation: not certified) and for the untrained warm
    starts (``euler``, ``distilled`` at step 0)."""
    by = ["teacher", "temperature", "replicate"]
    env = analysis.alpha_per_replicate(certified, by=by).assign(fit="envelope")
    share = certified.groupby(by)["certified"].mean().rename("certified_share").reset_index()
    env = env.merge(share, on=by)
    routes = stages[~stages["stage"].str.contains("+", regex=False)]
    per_route = analysis.alpha_per_replicate(routes, by=by + ["route"]).assign(certified_share=0.0)
    per_route["fit"] = "route " + per_route.pop("route")
    warm = routes[routes["route"].isin(["euler", "distilled"])].drop(columns="test_loss").rename(
        columns={"initial_loss": "test_loss"})
    untrained = analysis.alpha_per_replicate(warm, by=by + ["route"]).assign(certified_share=0.0)
    untrained["fit"] = "untrained " + untrained.pop("route")
    return pd.concat([env, per_route, untrained], ignore_index=True)


def alpha_summary(per: pd.DataFrame) -> pd.DataFrame:
    """Mean α_ℓ over replicates with its 95 % t interval (the fit's own with one replicate), per fit."""
    return analysis.summarize_alpha(per, by=("fit", "teacher", "temperature")).rename(
        columns={"n_replicates": "replicates"})


def fragility(certified: pd.DataFrame) -> pd.DataFrame:
    """The envelope's α_ℓ (mean over replicates) refitted without each depth in turn and without the two shallowest:
    one row per (teacher, T, left out), with the range a reader should read the exponent against."""
    rows = []
    depths = sorted(certified["depth"].unique())
    drops = [(f"without ℓ = {d}", [x for x in depths if x != d]) for d in depths] + [
        ("all depths", depths)] + ([(f"without ℓ ≤ {depths[1]}", depths[2:])] if len(depths) > 3 else [])
    for label, keep in drops:
        per = analysis.alpha_per_replicate(certified[certified["depth"].isin(keep)],
                                           by=["teacher", "temperature", "replicate"])
        for (teacher, temp), g in analysis.summarize_alpha(per, by=("teacher", "temperature")).groupby(
                ["teacher", "temperature"]):
            r = g.iloc[0]
            rows.append({"teacher": teacher, "temperature": temp, "fit": label, "depths": len(keep),
                         "alpha": r["alpha"], "lo": r["lo"], "hi": r["hi"]})
    return pd.DataFrame(rows)


def local_slopes(certified: pd.DataFrame) -> pd.DataFrame:
    """−Δlog L/Δlog ℓ between neighbouring depths per replicate, and their mean with a 95 % t interval over
    replicates (rows with ``replicate`` −1)."""
    from scipy import stats
    rows = []
    for key, g in certified.groupby(["teacher", "temperature", "replicate"]):
        g = g.sort_values("depth")
        d, loss = g["depth"].to_numpy(float), g["test_loss"].to_numpy(float)
        for i in range(len(d) - 1):
            rows.append({"teacher": key[0], "temperature": key[1], "replicate": key[2], "depth_from": int(d[i]),
                         "depth_to": int(d[i + 1]),
                         "slope": float(-np.log(loss[i + 1] / loss[i]) / np.log(d[i + 1] / d[i]))})
    per = pd.DataFrame(rows)
    means = []
    for key, g in per.groupby(["teacher", "temperature", "depth_from", "depth_to"]):
        s = g["slope"].to_numpy(float)
        half = float(stats.t.ppf(0.975, len(s) - 1) * s.std(ddof=1) / math.sqrt(len(s))) if len(s) > 1 else np.nan
        means.append({"teacher": key[0], "temperature": key[1], "replicate": -1, "depth_from": key[2],
                      "depth_to": key[3], "slope": float(s.mean()), "lo": float(s.mean() - half),
                      "hi": float(s.mean() + half)})
    return pd.concat([per, pd.DataFrame(means)], ignore_index=True)


def separation(certified: pd.DataFrame, temperature: float = 1.0) -> pd.DataFrame:
    """Tied minus independent α_ℓ of the envelope at ``temperature``, paired by replicate (the two teachers of a
    replicate share their random draws), with its 95 % t interval: on all depths and without each depth in turn."""
    from scipy import stats
    depths = sorted(certified["depth"].unique())
    rows = []
    for label, keep in [("all depths", depths)] + [(f"without ℓ = {d}", [x for x in depths if x != d])
                                                     for d in depths]:
        c = certified[(certified["temperature"] == temperature) & certified["depth"].isin(keep)]
        per = analysis.alpha_per_replicate(c, by=["teacher", "replicate"])
        if per.empty or not {"tied", "independent"} <= set(per["teacher"]):
            continue
        p = per.pivot(index="replicate", columns="teacher", values="alpha").dropna()
        diff = (p["tied"] - p["independent"]).to_numpy(float)
        half = (float(stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff)))
                if len(diff) > 1 else np.nan)
        rows.append({"fit": label, "temperature": temperature, "diff": float(diff.mean()),
                     "lo": float(diff.mean() - half), "hi": float(diff.mean() + half), "n": len(diff)})
    return pd.DataFrame(rows)


def power_law_check(certified: pd.DataFrame) -> pd.DataFrame:
    """Per (teacher, T, replicate): the envelope's fit and its residual scatter (a curved log–log line shows here)."""
    rows = []
    for key, g in certified.groupby(["teacher", "temperature", "replicate"]):
        fit = fit_power_law(g["depth"], g["test_loss"])
        resid = np.log(g["test_loss"].to_numpy(float)) - np.log(fit["c"] * g["depth"].to_numpy(float) ** -fit["alpha"])
        rows.append({"teacher": key[0], "temperature": key[1], "replicate": key[2], "alpha": fit["alpha"],
                     "max_abs_log_residual": float(np.abs(resid).max())})
    return pd.DataFrame(rows)


def alpha_by_round(stages: pd.DataFrame, max_continuations: int) -> pd.DataFrame:
    """α_ℓ along the certificate's continuations: at round k, each depth's loss is its best route's after k
    continuations (a chain that stopped earlier — certified, or continued from a better stage — keeps the best loss
    it reached), fitted over depth per replicate and summarised over replicates (mean, 95 % t interval). Round 0 is
    the routes alone. Whether α_ℓ still moves while the losses do is what a reader needs when students are not
    certified: the exponent can settle before the losses do, or not."""
    by = ["teacher", "temperature", "replicate"]
    rows = []
    for key, g in stages.groupby(by + ["depth"]):
        routes = g[~g["stage"].str.contains("+", regex=False)]
        best = float(routes["test_loss"].min())
        conts = g[g["stage"].str.contains("+", regex=False)].copy()
        conts["round"] = conts["stage"].str.split("+c", regex=False).str[1].astype(int)
        for k in range(max_continuations + 1):
            done = conts[conts["round"] <= k]
            loss = min([best, *done["test_loss"].astype(float)])
            rows.append({**dict(zip(by + ["depth"], key)), "round": k, "test_loss": loss})
    per = analysis.alpha_per_replicate(pd.DataFrame(rows), by=by + ["round"])
    return analysis.summarize_alpha(per, by=("teacher", "temperature", "round")).rename(
        columns={"n_replicates": "replicates"})

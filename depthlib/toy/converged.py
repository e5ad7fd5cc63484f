"""The converged-loss protocol (ours) behind chapter 3's calibration (paper §4, Fig. 4a,b; App. C).

The calibration asks for the **converged** test loss L*(ℓ) of a depth-ℓ student: the lowest held-out loss any
training route reaches. Any trained student bounds L*(ℓ) from above, so the route is free as long as convergence is
shown. For every (teacher, temperature, replicate, depth) the protocol trains the student by several routes and
keeps the lowest held-out loss, naming the route:

* ``scratch``      the paper's exp-9-3 initialisation (W_down = 0, the teacher's fixed head), the paper's
                   lr 2.4e-3/√ℓ, on the schedule below;
* ``euler``        (tied teacher only) a warm start at the teacher's coarse Euler discretisation: each of the
                   student's ℓ blocks is the shared teacher block with W_down × ℓ*/ℓ (a smooth flow integrated
                   with ℓ steps instead of ℓ*), trained at 0.1× the paper's lr;
* ``progressive``  a warm start from the best student of depth ℓ/2 (any route), every block split into two
                   half-step blocks (W_down / 2 each; the state moves by the same amount to first order), trained
                   at 0.1× the paper's lr;
* ``continued<k>`` when the best student of a depth is not converged after these routes, it is trained again from
                   its own weights (0.1× the paper's lr, the same schedule), up to ``continuations`` times.

**Schedule** (every route): Adam (the paper's betas, ε), linear warm-up over the first 2 % of steps, constant to
50 %, linear decay to 10 % of the base lr at 80 %, then the last 20 % of steps **at that final lr**. A student is
**converged** when its held-out loss improved by less than 1 % over those last 20 % of steps
(:func:`relative_improvement`). Shallow students are cheap and slow to converge, so a depth-ℓ student trains
``steps_deepest · min(ℓ_max/ℓ, 8)`` steps (equal compute per student).

**Data.** Inputs are Gaussian as in the paper, but drawn from a fixed pool of ``pool_batches × batch`` inputs whose
teacher logits are computed once (the 128-block teacher forward otherwise costs 3–6× a shallow student's step).
A fixed pool could let a student fit the pool and not the teacher, so every student's loss on the pool is recorded
beside its held-out loss (fresh inputs, never trained on: the paper's 10 × 1024) and the gap is reported.

The held-out inputs and the teachers are those of the committed from-scratch calibration runs (same seeds), so their
students are a fourth route (``paper``: the exp-9-3 recipe at the committed budget).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import torch

from depthlib.contract import from_dict, to_dict
from depthlib.errors import InputError
from depthlib.toy import analysis
from depthlib.toy.engine import BatchedStudents, StudentSpec, _rms
from depthlib.toy.models import (
    StudentTraining,
    StudentWeights,
    TeacherWeights,
    ToyShape,
    derive_seed,
    make_teacher,
    variant,
)

ROUTES = ("scratch", "euler", "progressive")
TEACHER_KINDS = {1.0: "tied", 0.0: "independent"}
#: The convergence rule: held-out loss improved by less than this fraction over the last 20 % of steps.
CONVERGED_BELOW = 0.01
LAST_FRACTION = 0.2


# ---- the schedule ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvergedTraining(StudentTraining):
    """exp-9-3's training (KL on tempered logits, the teacher's fixed head, lr 6e-4·4/√ℓ) with the protocol's lr
    scale and schedule: warm-up, constant, linear decay to ``decay_to`` between ``decay_start`` and ``decay_end``,
    then constant at the final lr (so the convergence test runs at one learning rate)."""

    lr_scale: float = 1.0          # 1 for scratch, 0.1 for warm starts (they start near a good solution)
    warmup_frac: float = 0.02
    decay_start: float = 0.5
    decay_end: float = 1.0 - LAST_FRACTION

    def base_lr(self, depth: int) -> float:
        return super().base_lr(depth) * self.lr_scale

    def schedule(self, step: int, total_steps: int) -> float:
        t = step / total_steps
        warm = max(1, round(self.warmup_frac * total_steps))
        if step < warm:
            return (step + 1) / warm
        if t < self.decay_start:
            return 1.0
        if t < self.decay_end:
            return 1.0 - (1.0 - self.decay_to) * (t - self.decay_start) / (self.decay_end - self.decay_start)
        return self.decay_to


def training(route: str, lr_warm: float) -> ConvergedTraining:
    base = dataclasses.asdict(variant("exp-9-3"))
    return ConvergedTraining(**base, lr_scale=1.0 if route == "scratch" else lr_warm)


# ---- the protocol's settings --------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvergedConfig:
    """One run of the protocol. ``cells`` are (ρ, T, replicates); the teacher of replicate r is the committed
    calibration's teacher of replicate r (``derive_seed(seed, 'teacher', r)``), tied (ρ = 1) or independent (ρ = 0),
    with the paper's scaling (no displacement normalisation)."""

    profile: str
    cells: tuple = ((1.0, 1.0, 3), (0.0, 1.0, 3), (1.0, 0.01, 1))
    depths: tuple = (6, 12, 16, 24, 32, 48)      # the paper's student depths
    steps_deepest: int = 3_000                   # steps of the deepest student; shallower ones train more
    max_step_factor: float = 8.0                 # a depth-ℓ student trains steps·min(ℓ_max/ℓ, this)
    batch: int = 256
    pool_batches: int = 2_048                    # fixed training pool: pool_batches × batch inputs
    lr_warm: float = 0.1                         # lr scale of the warm-started routes
    continuations: int = 2                       # extra rounds for a depth whose best student is not converged
    evals: int = 20                              # held-out evaluations per student (every 5 % of its steps)
    eval_batches: int = 10                       # the paper's test set: 10 × 1024 fresh inputs
    eval_batch_size: int = 1024
    teacher_depth: int = 128
    d_model: int = 32
    seed: int = 0

    def shape(self) -> ToyShape:
        return ToyShape(d_model=self.d_model, d_mlp=4 * self.d_model, teacher_depth=self.teacher_depth)

    def steps(self, depth: int) -> int:
        """Steps of a depth-``depth`` student, a multiple of ``evals`` (so 80 % of it is an evaluation step)."""
        raw = self.steps_deepest * min(max(self.depths) / depth, self.max_step_factor)
        return max(self.evals, int(round(raw / self.evals)) * self.evals)

    def routes(self, rho: float) -> tuple[str, ...]:
        return ROUTES if rho == 1.0 else tuple(r for r in ROUTES if r != "euler")

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ConvergedConfig":
        return from_dict(cls, d)

    def validate(self) -> "ConvergedConfig":
        if len(set(self.depths)) < 3 or min(self.depths) < 1:
            raise InputError(f"the protocol needs at least 3 distinct depths >= 1, got {self.depths}")
        for rho, t, reps in self.cells:
            if rho not in TEACHER_KINDS:
                raise InputError(f"the protocol's teachers are tied (rho 1) or independent (rho 0), got rho={rho}")
            if not (t > 0 and math.isfinite(t)) or int(reps) < 1:
                raise InputError(f"bad cell (rho={rho}, T={t}, replicates={reps})")
        if self.steps_deepest < self.evals or self.batch < 1 or self.pool_batches < 1:
            raise InputError("steps_deepest must be >= evals, batch and pool_batches >= 1")
        if round(self.evals * (1 - LAST_FRACTION), 9) % 1:
            raise InputError(f"evals must make {1 - LAST_FRACTION:g} of the steps an evaluation step (a multiple of "
                             f"{round(1 / LAST_FRACTION)}), got {self.evals}")
        return self

    def units(self) -> list[dict]:
        """One unit of work per (ρ, T, replicate): its students share one teacher and one pool."""
        return [{"rho": float(rho), "temperature": float(t), "replicate": r}
                for rho, t, reps in self.cells for r in range(int(reps))]


# ---- warm starts ------------------------------------------------------------------------------------------
def euler_student(teacher: TeacherWeights, depth: int) -> StudentWeights:
    """The tied teacher's coarse Euler discretisation with ``depth`` steps: every block is the shared teacher block
    with W_down × ℓ*/ℓ (the teacher takes ℓ* steps of the flow dh/dt = f(h), this student ℓ steps of ℓ*/ℓ each)."""
    if teacher.rho != 1.0:
        raise InputError("the Euler warm start needs the tied teacher (rho = 1)")
    k = teacher.depth / depth
    return StudentWeights(teacher.W_up[:1].repeat(depth, 1, 1).clone(), teacher.b_up[:1].repeat(depth, 1).clone(),
                          teacher.W_down[:1].repeat(depth, 1, 1) * k, teacher.fixed_head.clone())


def split_student(w: StudentWeights) -> StudentWeights:
    """Progressive depth: every block becomes two half-step blocks (W_up, b_up copied, W_down / 2): h + f(h) becomes
    h + f(h)/2 + f(h + f(h)/2)/2, equal to first order (the difference is O(f·f'), i.e. O(step²))."""
    return StudentWeights(w.W_up.repeat_interleave(2, 0).clone(), w.b_up.repeat_interleave(2, 0).clone(),
                          w.W_down.repeat_interleave(2, 0) / 2, None if w.head is None else w.head.clone())


# ---- the pooled engine --------------------------------------------------------------------------------------
class PooledStudents(BatchedStudents):
    """:class:`BatchedStudents` whose training batches come from a fixed pool of inputs with precomputed teacher
    logits (one stream); the held-out test batches are computed by the live teacher as before."""

    def __init__(self, pool_x: torch.Tensor, pool_logits: torch.Tensor, pool_seed: int, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool_x, self.pool_logits = pool_x, pool_logits        # (P, B, d), (P, B, V)
        self.pool_gen = torch.Generator().manual_seed(int(pool_seed))    # the batch order, on the CPU
        self._pending: int | None = None

    def draw_batch(self) -> torch.Tensor:
        i = int(torch.randint(self.pool_x.shape[0], (), generator=self.pool_gen))
        self._pending = i
        return self.pool_x[i][None]                                    # (1, B, d)

    def teacher_outputs(self, x: torch.Tensor) -> torch.Tensor:
        if self._pending is not None:
            i, self._pending = self._pending, None
            return self.pool_logits[i][None]                           # (1, B, V)
        return super().teacher_outputs(x)

    def load_student(self, pos: int, w: StudentWeights) -> None:
        """Overwrite student ``pos`` (sorted order) with weights ``w`` (a warm start)."""
        for j in range(w.W_up.shape[0]):
            self.Wu[j][pos].copy_(w.W_up[j].T)
            self.b[j][pos, 0].copy_(w.b_up[j])
            self.Wd[j][pos].copy_(w.W_down[j].T)

    def pool_loss(self, n_batches: int) -> float:
        """Mean training loss (no update) over the first ``n_batches`` pool batches."""
        total = 0.0
        with torch.no_grad():
            for i in range(n_batches):
                x = self.pool_x[i][None]
                h0, _ = _rms(x[self.s_stream], self.eps)
                hL, _ = self._forward(0, self.K, h0, save=False)
                loss, _ = self._loss_and_grad(0, self.K, hL, self._targets(self.pool_logits[i][None], 0, self.K),
                                              grad=False)
                total += float(loss.double().mean())
        return total / n_batches


def make_pool(cfg: ConvergedConfig, teacher: TeacherWeights, replicate: int, device: str = "cpu"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed training pool of one replicate: inputs (P, B, d) ~ N(0, I) (drawn on the CPU, so every device
    trains on the same pool) and the teacher's raw logits (P, B, V), on ``device``."""
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "converged-pool", replicate))
    x = torch.randn((cfg.pool_batches, cfg.batch, cfg.d_model), generator=g).to(device)
    probe = BatchedStudents([teacher], [StudentSpec(0, 1.0, 1, 0)], variant("exp-9-3"), 1, batch=cfg.batch,
                            eval_batches=1, eval_batch_size=1, shape=cfg.shape(), device=device)
    vocab = teacher.fixed_head.shape[0]
    with torch.no_grad():                      # 64 batches per teacher forward: (1, 64·B, d) -> (64, B, V)
        logits = torch.cat([probe.teacher_outputs(x[i:i + 64].reshape(1, -1, cfg.d_model)).reshape(-1, cfg.batch, vocab)
                            for i in range(0, cfg.pool_batches, 64)])
    return x, logits


# ---- one student, one route ---------------------------------------------------------------------------------
def relative_improvement(curve: pd.DataFrame) -> float:
    """(L(0.8·N) − L(N)) / L(0.8·N) from a student's held-out curve (columns step, test_loss): the improvement over
    the last 20 % of its steps, all taken at its final learning rate."""
    c = curve.sort_values("step")
    n = int(c["step"].max())
    at = c.loc[c["step"] == round((1 - LAST_FRACTION) * n), "test_loss"]
    if at.empty:
        raise InputError(f"no evaluation at step {round((1 - LAST_FRACTION) * n)} of {n}")
    before, final = float(at.iloc[0]), float(c["test_loss"].iloc[-1])
    return (before - final) / before


def train_student(cfg: ConvergedConfig, teacher: TeacherWeights, pool: tuple[torch.Tensor, torch.Tensor],
                  cell: dict, depth: int, route: str, start: StudentWeights | None, device: str = "cpu",
                  start_from: str = "exp-9-3 init") -> tuple[StudentWeights, pd.DataFrame, dict]:
    """Train one student by ``route`` from ``start`` (None: the exp-9-3 initialisation; ``start_from`` names it).
    Returns its weights, its held-out curve (step 0 and every 5 % of its steps) and its summary row."""
    r = cell["replicate"]
    steps = cfg.steps(depth)
    train = training(route, cfg.lr_warm)
    spec = StudentSpec(0, cell["temperature"], depth, derive_seed(cfg.seed, "converged-student", r, depth, route))
    eng = PooledStudents(*pool, derive_seed(cfg.seed, "converged-order", r, depth, route), [teacher], [spec], train,
                         steps, data_seeds=[0], test_seeds=[derive_seed(cfg.seed, "test", r)], batch=cfg.batch,
                         eval_batches=cfg.eval_batches, eval_batch_size=cfg.eval_batch_size, shape=cfg.shape(),
                         device=device, chunk=1)
    if start is not None:
        eng.load_student(0, start)
    every = steps // cfg.evals
    curve = [(0, float(eng.evaluate()[0]))]
    for step in range(steps):
        eng.step()
        if (step + 1) % every == 0:
            curve.append((step + 1, float(eng.evaluate()[0])))
    df = pd.DataFrame(curve, columns=["step", "test_loss"]).assign(
        teacher=TEACHER_KINDS[cell["rho"]], rho=cell["rho"], temperature=cell["temperature"], replicate=r,
        depth=depth, route=route)
    final = float(df["test_loss"].iloc[-1])
    rel = relative_improvement(df)
    row = {"teacher": TEACHER_KINDS[cell["rho"]], "rho": cell["rho"], "temperature": cell["temperature"],
           "replicate": r, "depth": depth, "route": route, "start": start_from, "steps": steps, "batch": cfg.batch,
           "base_lr": train.base_lr(depth), "initial_loss": curve[0][1], "test_loss": final,
           "pool_loss": eng.pool_loss(min(cfg.eval_batches * cfg.eval_batch_size // cfg.batch, cfg.pool_batches)),
           "rel_improvement_last20": rel, "converged": bool(rel < CONVERGED_BELOW)}
    return eng.export_student(0), df, row


def train_unit(cfg: ConvergedConfig, cell: dict,
               load: Callable[[str, int], tuple[StudentWeights, pd.DataFrame, dict] | None],
               save: Callable[[str, int, StudentWeights, pd.DataFrame, dict], None],
               progress: Callable[[str], None] = lambda _: None, device: str = "cpu"
               ) -> tuple[list[dict], list[pd.DataFrame]]:
    """Every route of every depth of one (ρ, T, replicate), shallowest first (progressive depth needs the best
    student of depth ℓ/2). ``load(route, depth)`` returns a finished student saved by an earlier, interrupted call
    (so a unit resumes student by student); ``save`` stores each one as it finishes. Returns the students' summary
    rows and held-out curves."""
    rho, r = cell["rho"], cell["replicate"]
    teacher = make_teacher(rho, derive_seed(cfg.seed, "teacher", r), cfg.shape())
    pool = None
    rows, curves, best = [], [], {}

    def step(depth: int, route: str, start: StudentWeights | None, named: str) -> None:
        nonlocal pool
        done = load(route, depth)
        if done is None:
            if pool is None:
                pool = make_pool(cfg, teacher, r, device)
            progress(f"{TEACHER_KINDS[rho]} T={cell['temperature']:g} r{r} ℓ={depth} {route}")
            done = train_student(cfg, teacher, pool, cell, depth, route, start, device, named)
            save(route, depth, *done)
        w, curve, row = done
        rows.append(row)
        curves.append(curve)
        if depth not in best or row["test_loss"] < best[depth][1]["test_loss"]:
            best[depth] = (w, row)

    for depth in sorted(cfg.depths):
        for route in cfg.routes(rho):
            if route == "progressive" and (depth % 2 or depth // 2 not in best):
                continue                                   # no student of depth ℓ/2 to split
            if route == "scratch":
                start, named = None, "exp-9-3 init"
            elif route == "euler":
                start, named = euler_student(teacher, depth), "Euler discretisation"
            else:
                start, named = split_student(best[depth // 2][0]), f"split {best[depth // 2][1]['route']} ℓ={depth // 2}"
            step(depth, route, start, named)
        for k in range(1, cfg.continuations + 1):
            w, row = best[depth]
            if row["converged"]:
                break
            step(depth, f"continued{k}", w, row["route"])
    return rows, curves


# ---- tables --------------------------------------------------------------------------------------------------
def best_routes(converged: pd.DataFrame) -> pd.DataFrame:
    """The lowest held-out loss per (teacher, T, replicate, depth) over trained routes, with its route."""
    keys = ["teacher", "rho", "temperature", "replicate", "depth"]
    trained = converged[converged["steps"] > 0]
    idx = trained.groupby(keys)["test_loss"].idxmin()
    return trained.loc[idx].sort_values(keys).reset_index(drop=True)


def alpha_tables(best: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """α_ℓ per replicate (log–log fit of the converged losses over depth) and across replicates (mean, 95 % t
    interval over replicates; the fit's own t interval when there is one replicate)."""
    per = analysis.alpha_per_replicate(best, by=("teacher", "temperature", "replicate"))
    summary = analysis.summarize_alpha(per, by=("teacher", "temperature"))
    return per, summary.rename(columns={"n_replicates": "replicates"})


def local_slopes(best: pd.DataFrame) -> pd.DataFrame:
    """−Δlog L/Δlog ℓ between neighbouring depths, per replicate: a curved log–log line shows here, not in α_ℓ."""
    rows = []
    for key, g in best.groupby(["teacher", "temperature", "replicate"]):
        g = g.sort_values("depth")
        d, loss = g["depth"].to_numpy(float), g["test_loss"].to_numpy(float)
        for i in range(len(d) - 1):
            rows.append({"teacher": key[0], "temperature": key[1], "replicate": key[2], "depth_from": int(d[i]),
                         "depth_to": int(d[i + 1]), "slope": float(-np.log(loss[i + 1] / loss[i]) / np.log(d[i + 1] / d[i]))})
    return pd.DataFrame(rows)


def separation(per_replicate: pd.DataFrame, temperature: float = 1.0) -> dict:
    """Tied minus independent α_ℓ at ``temperature``, paired by replicate (the two teachers of a replicate share
    their random draws): mean difference and its 95 % t interval over replicates."""
    from scipy import stats
    p = per_replicate[per_replicate["temperature"] == temperature].pivot(index="replicate", columns="teacher",
                                                                           values="alpha").dropna()
    if not {"tied", "independent"} <= set(p.columns) or len(p) < 2:
        return {"diff": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": len(p)}
    diff = (p["tied"] - p["independent"]).to_numpy(float)
    half = float(stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff)))
    return {"diff": float(diff.mean()), "lo": float(diff.mean() - half), "hi": float(diff.mean() + half),
            "n": len(diff)}

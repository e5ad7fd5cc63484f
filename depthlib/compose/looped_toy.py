"""Looped students in chapter 3's toy: one residual block applied ℓ times with step 1/ℓ.

A looped student of depth ℓ is the toy's residual MLP block (:mod:`depthlib.toy.models`) with **one** set of weights
(W_up, b_up and a vector-field down-projection V), applied ℓ times::

    h_{k+1} = h_k + (1/ℓ) · V · ReLU(W_up · RMSNorm(h_k) + b_up)²,   k = 0 … ℓ−1

i.e. ℓ explicit-Euler steps of the autonomous flow dh/dt = f_V(h) over unit time. Its parameter count does not depend
on ℓ. The per-application down-projection is W_down = V/ℓ, so the depth-2ℓ student with W_down halved integrates
the same flow with half the step (the warm start of this experiment, ``halved``).

Training reuses chapter 3's converged protocol (:mod:`depthlib.toy.converged`) unchanged: the committed
calibration's teachers (tied ρ = 1 and independent ρ = 0, same seeds), its fixed training pool of teacher logits, its
held-out set, its schedule (warm-up, constant, decay to 10 %, last 20 % at the final lr), its step budget
(``steps_deepest · min(ℓ_max/ℓ, 8)``) and its convergence rule (held-out loss improved by < 1 % over the last 20 %).
The looped student runs in chapter 3's batched engine with every layer holding the shared block: the gradient of the
shared weights is the sum of the per-application gradients (exact for tied weights) and one Adam update is applied
to (W_up, b_up, V) and written back into every layer.

**Learning rate.** The student is a flow over unit time whatever ℓ, so its lr does not depend on ℓ: the protocol's
exp-9-3 lr at the smallest depth (2.4e-3/√ℓ_min), 0.1× that for warm starts (the protocol's ``lr_warm``).

**Routes.** ``scratch`` (exp-9-3 init: W_down = 0, the teacher's fixed head) at the smallest depth; at every deeper
depth (each twice the previous) ``halved`` from the best looped student of depth ℓ/2 found by training (scratch,
halved or continued: never one started at the teacher); with ``euler`` and the tied teacher, at every depth ``euler``:
the protocol's Euler warm start, which for a looped student is exact in form — the teacher's one block with
W_down × ℓ*/ℓ, the teacher's own flow integrated with ℓ steps instead of ℓ* — then trained; then up to
``continuations`` ``continued<k>`` rounds for a depth whose best student (any route) is not converged (as the
protocol). The halved chain shows what training from scratch finds; the Euler route what a looped student can reach
near the teacher's flow.

Run tables (experiment ``compose-toy``): ``looped`` (one row per trained student), ``curves`` (held-out loss every 5 %
of its steps), ``best`` (lowest held-out loss per teacher, replicate and depth), ``alpha`` (α_ℓ per replicate, the
log–log fit of the converged losses over depth) and ``alpha_summary`` (mean and 95 % t interval over replicates),
``signatures`` and ``lags``: the hidden-state signatures of every best student and of its teacher, as chapter 3
measures them (:func:`depthlib.toy.analysis.signatures`, :func:`depthlib.toy.analysis.lag_cosines`: θ(h_l, h_{l+1}),
θ(Δh_l, Δh_{l+1}) and cos(Δh_l, Δh_{l+k}) on ``SIGNATURE_INPUTS`` fixed Gaussian inputs).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import pandas as pd
import torch

from depthlib import results
from depthlib.errors import InputError
from depthlib.toy import analysis, converged
from depthlib.toy.converged import ConvergedConfig, ConvergedTraining, PooledStudents
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

EXPERIMENT = "compose-toy"
UNITS = "units"
#: inputs of the signature measurements (chapter 3's students are measured on fixed Gaussian inputs too)
SIGNATURE_INPUTS = 2048


# ---- settings --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoopedToyConfig:
    """One run: the converged protocol's settings (``protocol``; its ``cells`` are (ρ, T, replicates), its depths the
    looped students' depths, each twice the previous) and the number of continuation rounds."""

    profile: str
    protocol: ConvergedConfig = field(default_factory=lambda: ConvergedConfig(
        "cpu", cells=((1.0, 1.0, 2), (0.0, 1.0, 2)), depths=(6, 12, 24, 48), steps_deepest=4_000))
    continuations: int = 0
    euler: bool = True             # the Euler route (tied teacher only) at every depth

    def flow_lr(self) -> float:
        """The looped student's base lr (scratch): the protocol's exp-9-3 lr at the smallest depth."""
        return variant("exp-9-3").base_lr(min(self.protocol.depths))

    def training(self, route: str) -> ConvergedTraining:
        """The protocol's training (schedule, Adam, KL on tempered logits with the teacher's fixed head) with a
        depth-independent lr: ``flow_lr`` for scratch, × ``lr_warm`` for warm starts."""
        base = {**dataclasses.asdict(variant("exp-9-3")), "lr": self.flow_lr(), "lr_depth_factor": None}
        return ConvergedTraining(**base, lr_scale=1.0 if route == "scratch" else self.protocol.lr_warm)

    def units(self) -> list[dict]:
        return self.protocol.units()

    def to_dict(self) -> dict:
        return {"profile": self.profile, "protocol": self.protocol.to_dict(), "continuations": self.continuations,
                "euler": self.euler}

    @classmethod
    def from_dict(cls, d: dict) -> "LoopedToyConfig":
        return cls(d["profile"], ConvergedConfig.from_dict(d["protocol"]), int(d["continuations"]), bool(d["euler"]))

    def validate(self) -> "LoopedToyConfig":
        self.protocol.validate()
        ds = sorted(self.protocol.depths)
        if any(b != 2 * a for a, b in zip(ds[:-1], ds[1:])):
            raise InputError(f"looped depths must double (the warm start halves the step), got {ds}")
        if self.euler and ds[-1] >= self.protocol.teacher_depth:
            raise InputError(f"the Euler start at depth >= the teacher's ({self.protocol.teacher_depth}) is the teacher "
                             f"itself (loss 0, nothing to train): looped depths must stay below it, got {ds}")
        if self.continuations < 0:
            raise InputError(f"continuations must be >= 0, got {self.continuations}")
        return self


# ---- the looped student ---------------------------------------------------------------------------------
def looped_weights(block: StudentWeights, depth: int) -> StudentWeights:
    """The depth-``depth`` network of a looped student: the one block (W_up, b_up, per-application W_down) in every
    layer."""
    if block.W_up.shape[0] != 1:
        raise InputError(f"a looped student has one block, got {block.W_up.shape[0]}")
    return StudentWeights(block.W_up.repeat(depth, 1, 1), block.b_up.repeat(depth, 1), block.W_down.repeat(depth, 1, 1),
                          None if block.head is None else block.head.clone())


def halve(block: StudentWeights) -> StudentWeights:
    """The warm start of depth 2ℓ from a looped student of depth ℓ: the same block with its down-projection halved
    (the same flow, half the step)."""
    return StudentWeights(block.W_up.clone(), block.b_up.clone(), block.W_down / 2,
                          None if block.head is None else block.head.clone())


def euler_block(teacher: TeacherWeights, depth: int) -> StudentWeights:
    """The tied teacher's flow as a looped student of ``depth`` steps: its one block with W_down × ℓ*/ℓ and its fixed
    head (:func:`depthlib.toy.converged.euler_student`, one block of it)."""
    w = converged.euler_student(teacher, depth)
    return StudentWeights(w.W_up[:1].clone(), w.b_up[:1].clone(), w.W_down[:1].clone(), w.head)


def n_parameters(block: StudentWeights) -> int:
    """Trained parameters of a looped student (the teacher's fixed head is given, not trained): one block."""
    return int(block.W_up.numel() + block.b_up.numel() + block.W_down.numel())


class SharedBlock:
    """One student of depth ℓ whose ℓ layers share one block, mixed into one of chapter 3's engines (a subclass of
    :class:`depthlib.toy.engine.BatchedStudents`, after this class in the bases).

    The forward and backward passes are the engine's (ℓ layers, each holding the shared block); :meth:`_adam` sums
    the layers' gradients into the shared weights' gradient, takes one Adam step on (W_up, b_up, V = ℓ·W_down) with
    the engine's fused kernel, and writes the block back into every layer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.K != 1 or self.per_block != 1 or self.head is not None:
            raise InputError("the looped engine trains one Euler student with the teacher's fixed head")
        self.depth = int(self.specs[0].depth)
        self._shared = [self.Wu[0].contiguous().clone(), self.b[0].contiguous().clone(),
                        self.Wd[0].contiguous() * self.depth]
        self._m = [torch.zeros_like(p) for p in self._shared]
        self._v = [torch.zeros_like(p) for p in self._shared]
        self._step = torch.zeros((), dtype=self.dtype, device=self.device)
        self._broadcast()

    def _broadcast(self) -> None:
        Wu, b, V = self._shared
        for j in range(self.depth):
            self.Wu[j].copy_(Wu)
            self.b[j].copy_(b)
            self.Wd[j].copy_(V / self.depth)

    def _adam(self) -> None:
        # the fused kernel walks params and grads as flat memory: both are contiguous (a transposed clone is not)
        grads = [torch.stack([g[j] for j in range(self.depth)]).sum(0) for g in (self.gWu, self.gb, self.gWd)]
        grads[2].div_(self.depth)                       # dL/dV = Σ_j dL/dW_down_j · (1/ℓ)
        beta1, beta2 = self.train.betas
        lr = self.train.base_lr(self.depth) * self.train.schedule(self.step_count, self.total_steps)
        self._step.add_(1)
        torch._fused_adam_(self._shared, grads, self._m, self._v, [], [self._step] * 3, lr=lr, beta1=beta1,
                           beta2=beta2, weight_decay=0.0, eps=self.train.eps, amsgrad=False, maximize=False)
        self._broadcast()

    def load_block(self, block: StudentWeights) -> None:
        """Start from a looped student's block (per-application W_down for this depth)."""
        self._shared = [t.to(self.device).contiguous().clone() for t in
                        (block.W_up[0].T[None], block.b_up[0][None, None], block.W_down[0].T[None] * self.depth)]
        self._broadcast()

    def export_block(self) -> StudentWeights:
        """The block (per-application W_down = V/ℓ) with the fixed head, in ``nn.Linear`` layout, on the CPU."""
        Wu, b, V = (t.cpu() for t in self._shared)
        return StudentWeights(Wu[0].T[None].clone(), b[0, 0][None].clone(), (V[0] / self.depth).T[None].clone(),
                              self.fixed_head[0].T.cpu().clone())


class LoopedStudents(SharedBlock, PooledStudents):
    """Chapter 3's converged protocol's pooled engine (:class:`depthlib.toy.converged.PooledStudents`) with one
    looped student (:class:`SharedBlock`)."""


# ---- one student -----------------------------------------------------------------------------------------
def train_looped(cfg: LoopedToyConfig, teacher: TeacherWeights, pool, cell: dict, depth: int, route: str,
                 start: StudentWeights | None, start_from: str, stop_at: int | None = None
                 ) -> tuple[StudentWeights, pd.DataFrame, dict]:
    """Train one looped student by ``route`` from ``start`` (None: the exp-9-3 init of one block). Returns its block,
    its held-out curve (step 0 and every 5 % of its steps) and its summary row. ``stop_at`` stops after that many
    steps (the replay check); the row is then None."""
    p, r = cfg.protocol, cell["replicate"]
    steps = p.steps(depth)
    train = cfg.training(route)
    spec = StudentSpec(0, cell["temperature"], depth, derive_seed(p.seed, "looped-student", r, depth, route))
    eng = LoopedStudents(*pool, derive_seed(p.seed, "looped-order", r, depth, route), [teacher], [spec], train, steps,
                         data_seeds=[0], test_seeds=[derive_seed(p.seed, "test", r)], batch=p.batch,
                         eval_batches=p.eval_batches, eval_batch_size=p.eval_batch_size, shape=p.shape(), chunk=1)
    if start is None:
        start = init_student(1, spec.seed, train, p.shape(), fixed_head=teacher.fixed_head)
    eng.load_block(start)
    every = steps // p.evals
    curve = [(0, float(eng.evaluate()[0]))]
    for step in range(steps if stop_at is None else min(stop_at, steps)):
        eng.step()
        if (step + 1) % every == 0:
            curve.append((step + 1, float(eng.evaluate()[0])))
    kind = converged.TEACHER_KINDS[cell["rho"]]
    df = pd.DataFrame(curve, columns=["step", "test_loss"]).assign(
        teacher=kind, rho=cell["rho"], temperature=cell["temperature"], replicate=r, depth=depth, route=route)
    if stop_at is not None:
        return eng.export_block(), df, None
    rel = converged.relative_improvement(df)
    block = eng.export_block()
    row = {"teacher": kind, "rho": cell["rho"], "temperature": cell["temperature"], "replicate": r, "depth": depth,
           "route": route, "start": start_from, "steps": steps, "batch": p.batch, "base_lr": train.base_lr(depth),
           "parameters": n_parameters(block), "initial_loss": curve[0][1], "test_loss": curve[-1][1],
           "pool_loss": eng.pool_loss(min(p.eval_batches * p.eval_batch_size // p.batch, p.pool_batches)),
           "rel_improvement_last20": rel, "converged": bool(rel < converged.CONVERGED_BELOW)}
    return block, df, row


def unit_teacher(cfg: LoopedToyConfig, cell: dict) -> TeacherWeights:
    """The committed calibration's teacher of this cell's replicate (the converged protocol's seeds)."""
    p = cfg.protocol
    return make_teacher(cell["rho"], derive_seed(p.seed, "teacher", cell["replicate"]), p.shape())


def unit_name(cell: dict, depth: int, route: str) -> str:
    return (f"{converged.TEACHER_KINDS[cell['rho']]}_T{cell['temperature']:g}_r{cell['replicate']}"
            f"_d{depth:03d}_{route}")


def train_unit(cfg: LoopedToyConfig, cell: dict, store: results.Run, say=lambda _: None) -> None:
    """Every looped student of one (teacher, T, replicate), shallowest first; each saved to ``store`` (its block,
    curve and row) as it finishes, so an interrupted run resumes student by student."""
    p = cfg.protocol
    teacher = unit_teacher(cfg, cell)
    pool = None
    best: dict[int, tuple[StudentWeights, dict]] = {}      # any route
    trained: dict[int, tuple[StudentWeights, dict]] = {}   # routes that did not start at the teacher

    def one(depth: int, route: str, start, named: str) -> None:
        nonlocal pool
        name = unit_name(cell, depth, route)
        if store.has(f"{name}_row"):
            row = store.table(f"{name}_row").iloc[0].to_dict()
            block = torch.load(store.path / f"{name}.pt", weights_only=False)
        else:
            if pool is None:
                pool = converged.make_pool(p, teacher, cell["replicate"])
            say(name)
            block, curve, row = train_looped(cfg, teacher, pool, cell, depth, route, start, named)
            torch.save(block, store.path / f"{name}.pt")
            store.write_table(f"{name}_curve", curve)
            store.write_table(f"{name}_row", pd.DataFrame([row]))           # last: a student counts once it exists
        if depth not in best or row["test_loss"] < best[depth][1]["test_loss"]:
            best[depth] = (block, row)
        from_teacher = route == "euler" or (route.startswith("continued") and named == "euler")
        if not from_teacher and (depth not in trained or row["test_loss"] < trained[depth][1]["test_loss"]):
            trained[depth] = (block, row)

    depths = sorted(p.depths)
    for i, depth in enumerate(depths):
        if i == 0:
            one(depth, "scratch", None, "exp-9-3 init (one block)")
        else:
            prev = trained[depths[i - 1]]
            one(depth, "halved", halve(prev[0]), f"halved {prev[1]['route']} ℓ={depths[i - 1]}")
        if cfg.euler and cell["rho"] == 1.0:
            one(depth, "euler", euler_block(teacher, depth), "Euler discretisation (teacher's block)")
        for k in range(1, cfg.continuations + 1):
            block, row = best[depth]
            if row["converged"]:
                break
            one(depth, f"continued{k}", block, row["route"])


@torch.no_grad()
def signatures(cfg: LoopedToyConfig, best: pd.DataFrame, store: results.Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(signatures, lags) of every best looped student (its block from ``store``, applied ℓ times) and of each
    replicate's teacher (``net`` = student or teacher), on ``SIGNATURE_INPUTS`` seeded Gaussian inputs."""
    p = cfg.protocol
    x = torch.randn((SIGNATURE_INPUTS, p.d_model), generator=torch.Generator().manual_seed(derive_seed(p.seed, "signature")))
    sigs, lags = [], []

    def add(states, **labels):
        sigs.append(analysis.signatures(states).assign(**labels))
        lags.append(analysis.lag_cosines(states).assign(**labels))

    for r in best.itertuples():
        cell = {"rho": r.rho, "temperature": r.temperature, "replicate": r.replicate}
        block = torch.load(store.path / f"{unit_name(cell, r.depth, r.route)}.pt", weights_only=False)
        net = ResidualNet.from_weights(looped_weights(block, r.depth), p.shape(), "euler", "fixed")
        add(net.hidden(x, all_states=True), net="looped student", teacher=r.teacher, rho=r.rho,
            temperature=r.temperature, replicate=r.replicate, depth=r.depth, route=r.route)
    for cell in cfg.units():
        t = unit_teacher(cfg, cell)
        add(teacher_module(t, p.shape()).hidden(x, all_states=True), net="teacher",
            teacher=converged.TEACHER_KINDS[cell["rho"]], rho=cell["rho"], temperature=cell["temperature"],
            replicate=cell["replicate"], depth=t.depth, route="")
    return pd.concat(sigs, ignore_index=True), pd.concat(lags, ignore_index=True)


def run_looped_toy(cfg: LoopedToyConfig, *, force: bool = False, progress: bool = True) -> results.Run:
    """Compute (or resume, or load) the run of ``cfg`` in the local results cache (one process, one thread)."""
    cfg.validate()
    torch.set_num_threads(1)
    with results.computing(EXPERIMENT, cfg.to_dict(), profile=cfg.profile, code=(f"{__name__}:run_looped_toy",),
                           seed=int(cfg.protocol.seed), device="cpu", force=force,
                           saves="every finished student is in {folder}/units", unit_marker="row") as job:
        if job.complete:
            return job.run
        run = job.run
        store = results.Run(EXPERIMENT, run.config, run.path / UNITS)
        store.path.mkdir(parents=True, exist_ok=True)

        def say(msg: str) -> None:
            if progress:
                print(f"[{EXPERIMENT} {cfg.profile}] training {msg}", file=sys.stderr, flush=True)

        for cell in cfg.units():
            train_unit(cfg, cell, store, say)
            job.save_progress()
        names = sorted(n[:-len("_row")] for n in store.tables() if n.endswith("_row"))
        rows = pd.concat([store.table(f"{n}_row") for n in names], ignore_index=True)
        curves = pd.concat([store.table(f"{n}_curve") for n in names], ignore_index=True)
        best = converged.best_routes(rows)
        per, summary = converged.alpha_tables(best)
        sig, lag = signatures(cfg, best, store)
        for name, df in (("looped", rows), ("curves", curves), ("best", best), ("alpha", per),
                         ("alpha_summary", summary), ("signatures", sig), ("lags", lag)):
            run.write_table(name, df)
        job.record(summary={"n_students": int(len(rows)), "all_converged": bool(best["converged"].all()),
                            "max_rel_improvement": float(best["rel_improvement_last20"].max()),
                            "alpha": {r.teacher: [float(r.alpha), float(r.lo), float(r.hi)]
                                      for r in summary.itertuples()}})
    return results.Run.load(run.path)


__all__ = ["EXPERIMENT", "SIGNATURE_INPUTS", "LoopedStudents", "SharedBlock", "LoopedToyConfig", "euler_block", "halve",
           "looped_weights", "n_parameters", "run_looped_toy", "signatures", "train_looped", "train_unit",
           "unit_teacher"]

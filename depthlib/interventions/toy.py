"""The interventions on chapter 3's toy students: the calibration of chapter 5 (paper §4).

Students of an **independent** teacher (ρ = 0) and of a **tied** teacher (ρ = 1) are trained with the chapter-3
engine (:func:`depthlib.toy.sweep.build_engine`), then the same plan suite runs on their blocks
(h ← h + MLP_i(h)). Their "loss" is the toy's own, KL(p_teacher ‖ p_student) per input; the "documents" are
equal slices of held-out Gaussian inputs. Which student's response to deletion, reordering and parallel sums
looks like the LLMs'?
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F

from depthlib import results
from depthlib.errors import InputError
from depthlib.interventions.evaluate import score_plans
from depthlib.interventions.execute import SCORES
from depthlib.interventions.rankings import BlockSimilarity
from depthlib.interventions.suite import SuiteConfig, build_plans
from depthlib.toy.models import ResidualNet, derive_seed, rms_norm, teacher_module, teacher_targets
from depthlib.toy.sweep import SweepConfig, build_engine, grid
from depthlib.validate import finite, int_in_range

EXPERIMENT = "interventions-toy"
#: The modules whose code computes a toy intervention run (their fingerprint marks a committed run stale).
CODE = ("depthlib.interventions.toy", "depthlib.interventions.plan", "depthlib.interventions.execute",
        "depthlib.interventions.rankings", "depthlib.interventions.suite", "depthlib.interventions.evaluate",
        "depthlib.toy.models", "depthlib.toy.engine", "depthlib.toy.sweep", "depthlib.measures")
TABLES = ("plans", "scores", "distances", "influence", "students", "training")


@dataclass(frozen=True)
class ToyInterventionConfig:
    """Which toy students to train and edit. Defaults are the ``cpu`` profile's (minutes on 2 cores)."""

    variant: str = "exp-9-decay"     # chapter 3's cpu variant: exp-9 with the final lr decay
    rhos: tuple[float, ...] = (0.0, 1.0)   # independent and tied teachers
    temperature: float = 1.0         # the top of the paper's grid, where the regimes differ most
    depth: int = 24                  # student blocks ℓ
    steps: int = 3000                # Adam steps (chapter 3's cpu run: 10k; sized to the chapter's 20-minute budget)
    batch: int = 256
    test_inputs: int = 4096          # held-out inputs scored by every plan ...
    docs: int = 8                    # ... in this many equal "documents" (the unit of the bootstrap)
    teacher_depth: int = 128
    seed: int = 0
    suite: SuiteConfig = field(default_factory=SuiteConfig)

    def validate(self) -> "ToyInterventionConfig":
        for rho in self.rhos:
            if not 0.0 <= finite("rho", rho) <= 1.0:
                raise InputError(f"rho must be in [0, 1], got {rho:g}")
        int_in_range("student depth", self.depth, 3)
        int_in_range("steps", self.steps, 1)
        int_in_range("docs", self.docs, 1, self.test_inputs)
        self.suite.validate()
        return self

    def sweep(self) -> SweepConfig:
        return SweepConfig("custom", variant=self.variant, cells=grid(self.rhos, (self.temperature,)),
                           depths=(self.depth,), replicates=1, steps=self.steps, batch=self.batch,
                           eval_every=self.steps, teacher_depth=self.teacher_depth, seed=self.seed)


@dataclass
class ToyBatch:
    """One slice of held-out inputs through one unedited student (the adapter of :mod:`~.evaluate`)."""

    student: ResidualNet
    states: list[torch.Tensor]       # depth+1 tensors (inputs, d_model)
    teacher_logp: torch.Tensor       # (inputs, vocab) log p_teacher
    ref_logp: torch.Tensor           # (inputs, vocab) log p_student, unedited
    temperature: float
    docs: int

    def block(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return h + self.student.mlps[i](h)

    def logprobs(self, h: torch.Tensor) -> torch.Tensor:
        y = rms_norm(h)
        logits = self.student.head(y) if self.student.head_kind == "trained" else y @ self.student.head_w.T / self.temperature
        return F.log_softmax(logits, -1)

    def score(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-"document" sums: KL(teacher ‖ edited) (the toy's loss), KL(unedited ‖ edited), top-1 agreement."""
        lp = self.logprobs(h)
        per = {"loss": (self.teacher_logp.exp() * (self.teacher_logp - lp)).sum(-1),
               "kl": (self.ref_logp.exp() * (self.ref_logp - lp)).sum(-1),
               "agree": (lp.argmax(-1) == self.ref_logp.argmax(-1)).float()}
        out = {k: per[k].double().view(self.docs, -1).sum(1).float() for k in SCORES}
        out["n"] = torch.full((self.docs,), h.shape[0] // self.docs)
        return out


def _train(cfg: ToyInterventionConfig, ckpt, progress: bool, stop_at: int | None = None):
    """The trained students (one per ρ, the engine's order) with their test-loss curve every 500 steps, and the
    teachers (sorted by ρ). Resumes from ``ckpt`` (the engine's state and the curve, saved every 500 steps);
    ``stop_at`` stops after that many steps (the replay check)."""
    eng, students, teachers = build_engine(cfg.sweep())
    curve: list[pd.DataFrame] = []
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        eng.load_state_dict(state["engine"])
        curve = state["curve"]
    steps = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
    from tqdm.auto import tqdm
    bar = tqdm(total=steps, initial=eng.step_count, desc=f"toy students ({eng.K})", unit="step",
               disable=not progress, file=sys.stderr)
    while eng.step_count < steps:
        eng.step()
        bar.update(1)
        if eng.step_count % 500 == 0 or eng.step_count == cfg.steps:
            curve.append(students.assign(step=eng.step_count, test_loss=eng.evaluate().numpy()))
            if ckpt is not None:
                tmp = ckpt.with_name(f"{ckpt.name}.tmp{os.getpid()}")
                torch.save({"engine": eng.state_dict(), "curve": curve}, tmp)
                os.replace(tmp, ckpt)
    bar.close()
    curves = pd.concat(curve, ignore_index=True) if curve else students.assign(step=0, test_loss=float("nan"))
    return eng, curves, teachers


def run_toy_interventions(config: ToyInterventionConfig | None = None, *, profile: str = "custom",
                          progress: bool = True, force: bool = False) -> results.Run:
    """Train the toy students, then score the plan suite on each (tables as :func:`run_interventions`, with a
    ``model`` column naming the student, e.g. ``toy ρ=0``, and ``students`` with their test losses)."""
    cfg = (config or ToyInterventionConfig()).validate()
    run = results.prepare_run(results.open_run(EXPERIMENT, asdict(cfg)), force=force, tables=TABLES,
                              checkpoints=("students.pt",))
    if run.complete and all(run.has(t) for t in TABLES):
        return run
    t0 = time.perf_counter()
    run.path.mkdir(parents=True, exist_ok=True)
    eng, curves, teachers = _train(cfg, run.path / "students.pt", progress)
    students = curves[curves["step"] == curves["step"].max()].reset_index(drop=True)
    shape = cfg.sweep().shape()
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "interventions", "test"))
    x = torch.randn((cfg.test_inputs - cfg.test_inputs % cfg.docs, shape.d_model), generator=g)   # (inputs, d)
    tables: dict[str, list[pd.DataFrame]] = {t: [] for t in ("plans", "scores", "distances", "influence")}
    seconds = 0.0
    with torch.no_grad():
        for k, row in students.iterrows():
            name = f"toy ρ={row['rho']:g}"
            w = eng.export_student(k)
            net = ResidualNet.from_weights(w, shape, "euler", eng.train.head).eval()
            teacher = teacher_module(teachers[sorted(set(cfg.rhos)).index(row["rho"])], shape,
                                     "fixed" if eng.train.head == "fixed" else "trained")
            states = list(net.hidden(x, all_states=True).unbind(0))
            sim = BlockSimilarity(cfg.depth)
            sim.update(states)
            distances, influence = sim.distances(), sim.influence()
            plans, meta = build_plans(cfg.depth, cfg.suite, distances, influence)
            batch = ToyBatch(net, states, teacher_targets(teacher, x, cfg.temperature, "kl"), None, cfg.temperature, cfg.docs)
            batch.ref_logp = batch.logprobs(states[-1])
            scores, s = score_plans(plans, [(list(range(cfg.docs)), lambda b=batch: b)], progress=progress,
                                    desc=f"interventions {name}")
            seconds += s
            for t, df in (("plans", meta), ("scores", scores), ("distances", distances), ("influence", influence)):
                tables[t].append(df.assign(model=name))
    for t, dfs in tables.items():
        run.write_table(t, pd.concat(dfs, ignore_index=True))
    run.write_table("students", students.assign(model=[f"toy ρ={r:g}" for r in students["rho"]]))
    run.write_table("training", curves.assign(model=[f"toy ρ={r:g}" for r in curves["rho"]]))
    run.finish(profile=profile, seed=cfg.seed, wall_time_s=time.perf_counter() - t0, device="cpu",
               code=CODE,
               summary=dict(n_blocks=cfg.depth, students=students[["rho", "test_loss"]].to_dict("records")))
    (run.path / "students.pt").unlink(missing_ok=True)
    return run

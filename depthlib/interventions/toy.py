"""The interventions on the toy students of chapter 3's **certified protocol**: the controls of chapter 5 (paper §4).

Students of an **independent** teacher (ρ = 0, the ensemble's control) and of a **tied** teacher (ρ = 1, a smooth
flow's control) at T = 1, ``replicates`` of each, are loaded from chapter 3's certified protocol
(:mod:`depthlib.toy.certified`): each is the student chapter 3's exponent uses at this depth (the lowest-loss route,
continued until certified or out of continuations; its table ``certified`` names the stage), read from the unit's
folder in the local cache (``toy-certified-units``). A unit whose weights the cache lacks — a committed unit has only
its tables — is trained first, by chapter 3's own code (:func:`depthlib.toy.chapter.train_protocol_units`), on the
depths its student depends on only (:meth:`ToyInterventionConfig.units_protocol`: the same student, a third of the
cost), so on a fresh machine the controls cost about a third of chapter 3's training of their units.

The same plan suite then runs on their blocks (h ← h + MLP_i(h)). Their "loss" is the toy's own,
KL(p_teacher ‖ p_student) per input, whose floor is 0 (the teacher is realisable), so prediction 1 is tested with
L_ex = L_0; the "documents" are equal slices of fresh held-out Gaussian inputs; the rankings, the plateau, the norms
and the long-lag signature use separate ranking inputs.

The weights are never committed (a fresh clone has none): the run's tables are, and the replay
(:func:`depthlib.interventions.chapter.replay`) says why it cannot run without the weights
(:class:`depthlib.errors.ReplayUnavailable`) rather than train for an hour.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F

from depthlib import results
from depthlib.errors import InputError, ReplayUnavailable
from depthlib.interventions.evaluate import score_plans
from depthlib.interventions.execute import SCORES
from depthlib.interventions.predictions import plateau as plateau_blocks
from depthlib.interventions.rankings import BlockSimilarity
from depthlib.interventions.suite import SuiteConfig, build_plans
from depthlib.measures import update_signature
from depthlib.toy.certified import CertifiedConfig
from depthlib.toy.converged import TEACHER_KINDS
from depthlib.toy.models import ResidualNet, StudentWeights, derive_seed, make_teacher, rms_norm, teacher_module, teacher_targets
from depthlib.validate import int_in_range

EXPERIMENT = "interventions-toy"
#: chapter 3's experiment whose unit folders hold the certified students' weights
UNITS = "toy-certified-units"
TABLES = ("plans", "scores", "distances", "influence", "students", "signature")


@dataclass(frozen=True)
class ToyInterventionConfig:
    """Which of chapter 3's certified-protocol students to edit, on how many inputs. Defaults are the ``cpu``
    profile's (minutes on one core, once chapter 3's units are in the local cache)."""

    profile: str = "cpu"             # chapter 3's profile whose certified students are loaded
    depth: int = 24                  # student blocks ℓ: between Gemma's 18 and SmolLM2's 30, so k/ℓ and the
                                     # permutation distances are on the LMs' scale
    rhos: tuple[float, ...] = (0.0, 1.0)   # independent and tied teachers
    temperature: float = 1.0
    replicates: int = 3
    docs: int = 32                   # held-out "documents" (the unit of the bootstrap) ...
    inputs_per_doc: int = 128        # ... of this many fresh inputs each
    rank_docs: int = 16              # ranking "documents" (rankings, plateau, norms, signature), other inputs
    plateau_tol: float = 1.5
    seed: int = 0
    suite: SuiteConfig = field(default_factory=SuiteConfig)

    def validate(self) -> "ToyInterventionConfig":
        for rho in self.rhos:
            if rho not in TEACHER_KINDS:
                raise InputError(f"the certified students have tied (rho 1) or independent (rho 0) teachers, got {rho}")
        int_in_range("student depth", self.depth, 3)
        protocol = self.protocol()
        if self.depth not in protocol.depths:
            raise InputError(f"chapter 3's {self.profile} students have depths {', '.join(map(str, protocol.depths))}, "
                             f"not {self.depth}")
        cells = {(c[0], c[1]): c[2] for c in protocol.cells}
        for rho in self.rhos:
            if cells.get((rho, self.temperature), 0) < self.replicates:
                raise InputError(f"chapter 3's {self.profile} protocol has {cells.get((rho, self.temperature), 0)} "
                                 f"replicate(s) of the {TEACHER_KINDS[rho]} teacher at T = {self.temperature:g}, "
                                 f"not {self.replicates}")
        int_in_range("replicates", self.replicates, 1)
        int_in_range("docs", self.docs, 2)
        int_in_range("inputs per doc", self.inputs_per_doc, 1)
        int_in_range("rank docs", self.rank_docs, 2)
        self.suite.validate()
        return self

    def protocol(self) -> CertifiedConfig:
        """Chapter 3's certified-protocol settings of ``profile`` (its students are loaded)."""
        from depthlib.toy.chapter import PROFILES
        if self.profile not in PROFILES:
            raise InputError(f"chapter 3 has no profile {self.profile!r}")
        return PROFILES[self.profile].certified

    def units_protocol(self) -> CertifiedConfig:
        """The certified protocol restricted to the depths its depth-``depth`` students depend on: ``depth`` and the
        halving chain below it that progressive depth splits from (cpu: 24, 12, 6), or, where that chain is shorter
        than the protocol's minimum of three depths, every depth up to ``depth``. A student's stages are seeded by
        (replicate, depth, stage) and its warm starts come from shallower depths of that chain only, so these units
        train exactly chapter 3's depth-``depth`` students, for a third of a whole unit's cost."""
        p = self.protocol()
        chain = [self.depth]
        while chain[-1] % 2 == 0 and chain[-1] // 2 in p.depths:
            chain.append(chain[-1] // 2)
        if len(chain) < 3:
            chain = [d for d in p.depths if d <= self.depth]
        return dataclasses.replace(p, depths=tuple(sorted(chain)))

    def key(self) -> dict:
        """The run's results-cache config: these settings and the certified protocol's units it trains and edits."""
        return {**asdict(self), "certified": self.units_protocol().to_dict()}


def model_name(rho: float, replicate: int) -> str:
    return f"toy {TEACHER_KINDS[rho]} r{replicate}"


def _cell(cfg: ToyInterventionConfig, rho: float, replicate: int) -> dict:
    return {"rho": float(rho), "temperature": float(cfg.temperature), "replicate": int(replicate)}


def train_units(cfg: ToyInterventionConfig) -> None:
    """Chapter 3's units of the students ``cfg`` edits (:meth:`ToyInterventionConfig.units_protocol`), in the local
    cache with their weights: those the cache lacks are trained now by chapter 3's code, one process per core (a
    committed unit has no weights, so it is not used)."""
    from depthlib.toy.chapter import train_protocol_units
    train_protocol_units("certified", cfg.units_protocol(), [_cell(cfg, rho, r) for rho in cfg.rhos
                                                             for r in range(cfg.replicates)], committed=False)


def load_student(cfg: ToyInterventionConfig, rho: float, replicate: int) -> tuple[ResidualNet, ResidualNet, dict]:
    """(student, teacher, its row of chapter 3's table ``certified``) of one certified student: the one chapter 3's
    exponent uses at ``cfg.depth``, read from its unit in the local cache."""
    protocol = cfg.units_protocol()
    unit = results.open_run(UNITS, {**protocol.to_dict(), "cell": _cell(cfg, rho, replicate)})
    what = f"the certified {TEACHER_KINDS[rho]}-teacher student r{replicate} (ℓ = {cfg.depth})"
    if not unit.has("certified"):
        raise ReplayUnavailable(f"{what} is not in the local cache ({unit.path}): its weights are never committed; "
                                f"train it with `depthlib toy --protocol certified --profile {cfg.profile} --rerun`")
    row = unit.table("certified")
    row = row[row["depth"] == cfg.depth].iloc[0].to_dict()
    path = unit.path / f"student_{row['stage']}_{cfg.depth:03d}.pt"
    if not path.exists():
        raise ReplayUnavailable(f"{what}: weights {path} missing (never committed; retrain with chapter 3)")
    w = StudentWeights(**torch.load(path, weights_only=False)["weights"])
    shape = protocol.shape()
    student = ResidualNet.from_weights(w, shape, "euler", "fixed").eval()
    teacher = teacher_module(make_teacher(rho, derive_seed(protocol.seed, "teacher", replicate), shape), shape,
                             "fixed")
    return student, teacher, {**row, "unit": unit.path.name}


@dataclass
class ToyBatch:
    """Held-out inputs through one unedited student (the adapter of :mod:`~.evaluate`), in ``docs`` equal slices."""

    student: ResidualNet
    states: list[torch.Tensor]       # depth+1 tensors (inputs, d_model)
    teacher_logp: torch.Tensor       # (inputs, vocab) log p_teacher
    ref_logp: torch.Tensor | None    # (inputs, vocab) log p_student, unedited
    temperature: float
    docs: int

    def block(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return h + self.student.mlps[i](h)

    def logprobs(self, h: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(rms_norm(h) @ self.student.head_w.T / self.temperature, -1)

    def score(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-"document" sums: KL(teacher ‖ edited) (the toy's loss), KL(unedited ‖ edited), top-1 agreement."""
        lp = self.logprobs(h)
        per = {"loss": (self.teacher_logp.exp() * (self.teacher_logp - lp)).sum(-1),
               "kl": (self.ref_logp.exp() * (self.ref_logp - lp)).sum(-1),
               "agree": (lp.argmax(-1) == self.ref_logp.argmax(-1)).float()}
        out = {k: per[k].double().view(self.docs, -1).sum(1).float() for k in SCORES}
        out["n"] = torch.full((self.docs,), h.shape[0] // self.docs)
        return out


def inputs(cfg: ToyInterventionConfig, what: str, n_docs: int) -> torch.Tensor:
    """Fresh Gaussian inputs (n_docs · inputs_per_doc, d), keyed by the seed and ``what`` (test | rank)."""
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "interventions", what))
    return torch.randn((n_docs * cfg.inputs_per_doc, cfg.protocol().d_model), generator=g)


def edit_student(cfg: ToyInterventionConfig, rho: float, replicate: int, progress: bool = False,
                 n_docs: int | None = None, plans: dict | None = None) -> dict[str, pd.DataFrame]:
    """Every table of one student (rows named :func:`model_name`); ``n_docs`` / ``plans`` restrict it (replay)."""
    student, teacher, row = load_student(cfg, rho, replicate)
    name = model_name(rho, replicate)
    with torch.no_grad():
        xr = inputs(cfg, "rank", cfg.rank_docs)
        rstates = list(student.hidden(xr, all_states=True).unbind(0))
        sim = BlockSimilarity(cfg.depth)
        sim.update(rstates)
        distances, influence = sim.distances(), sim.influence()
        plateau = plateau_blocks(influence["theta"].to_numpy(), cfg.depth, cfg.plateau_tol)
        influence["plateau"] = influence["block"].isin(plateau)
        signature = update_signature([s.view(cfg.rank_docs, cfg.inputs_per_doc, -1) for s in rstates])
        plan_set, meta = build_plans(cfg.depth, cfg.suite, influence["norm"].to_numpy(), plateau)
        if plans is not None:
            plan_set = {t: plan_set[t] for t in plans}
        docs = cfg.docs if n_docs is None else n_docs
        x = inputs(cfg, "test", cfg.docs)[: docs * cfg.inputs_per_doc]
        states = list(student.hidden(x, all_states=True).unbind(0))
        batch = ToyBatch(student, states, teacher_targets(teacher, x, cfg.temperature, "kl"), None, cfg.temperature, docs)
        batch.ref_logp = batch.logprobs(states[-1])
        scores, seconds = score_plans(plan_set, [(list(range(docs)), lambda: batch)], progress=progress,
                                      desc=f"interventions {name}")
    ident = scores[scores["plan"] == meta.loc[meta["family"] == "identity", "plan"].iloc[0]]
    student_row = {**{k: row[k] for k in ("teacher", "rho", "temperature", "replicate", "depth", "route",
                                          "stage", "test_loss", "certified", "last_continuation_gain", "unit")},
                   "loss_here": float(ident["loss"].sum() / ident["n"].sum()), "plateau": " ".join(map(str, plateau)),
                   "seconds": seconds}
    out = {"plans": meta, "scores": scores, "distances": distances, "influence": influence,
           "signature": signature, "students": pd.DataFrame([student_row])}
    return {t: df.assign(model=name) for t, df in out.items()}


def run_toy_interventions(config: ToyInterventionConfig | None = None, *, profile: str = "custom",
                          progress: bool = True, force: bool = False) -> results.Run:
    """Edit every student of ``config`` (tables as :func:`depthlib.interventions.run_interventions`, with a ``model``
    column naming the student, e.g. ``toy independent r0``, and ``students``: which student, its route and stage,
    whether chapter 3 certified it, its held-out loss there and the unedited loss on this run's inputs). Chapter 3's
    units the local cache lacks are trained first (:func:`train_units`)."""
    cfg = (config or ToyInterventionConfig()).validate()
    with results.computing(EXPERIMENT, cfg.key(), profile=profile, code=("depthlib.interventions.toy:run_toy_interventions",),
                           seed=cfg.seed, device="cpu", force=force, tables=TABLES) as job:
        if job.complete:
            return job.run
        train_units(cfg)
        t0 = time.perf_counter()
        parts = [edit_student(cfg, rho, r, progress) for rho in cfg.rhos for r in range(cfg.replicates)]
        for t in TABLES:
            job.run.write_table(t, pd.concat([p[t] for p in parts], ignore_index=True))
        job.save_progress()
        students = pd.concat([p["students"] for p in parts], ignore_index=True)
        job.record(summary=dict(n_blocks=cfg.depth, students=students[["model", "route", "test_loss", "loss_here"]]
                                .to_dict("records")))
        print(f"[depthlib] toy controls edited in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return job.run

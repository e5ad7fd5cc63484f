"""Chapter 7's glue: the profiles, the run the chapter shows, its replay check, what the text states about it.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (four parts shown: ``rhm``,
the hierarchical positive control and looped depth on the grammar; ``hierarchy``, the positive control on an unseen,
deeper grammar with both of its tasks, certified, :mod:`depthlib.compose.hierarchy`; ``text_certified``, the three
families on chapter 6's text at chapter 6's certified budget, :mod:`depthlib.compose.text_certified`; and
``toy_certified``, the looped toy students trained and certified by chapter 3's certified protocol,
:mod:`depthlib.compose.looped_certified`),
``compute``, ``replay`` (retrain the run's first member up to its first evaluation with the current code),
``describe``, ``summary`` and ``COMPUTE``.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib import results, runtime, units
from depthlib.compose import hierarchy, looped_certified, text_certified
from depthlib.compose.certify import Certificate
from depthlib.compose.experiment import EXPERIMENT, ComposeConfig, run_compose, train_member
from depthlib.compose.hierarchy import MEMBER_TABLES, HierarchyConfig
from depthlib.compose.looped_certified import LoopedCertifiedConfig
from depthlib.compose.network import GrammarModelConfig
from depthlib.compose.rhm import RHMConfig
from depthlib.compose.text_certified import TextCertifiedConfig
from depthlib.compose.train import GrammarTrainConfig
from depthlib.contract import Profile, from_dict
from depthlib.errors import InputError
from depthlib.lm import chapter as lm_chapter
from depthlib.toy import certified
from depthlib.toy.certified import CertifiedConfig
from depthlib.toy.converged import TEACHER_KINDS

#: The compute entry of the chapter's runs: their code modules are derived from its imports
#: (:func:`depthlib.results.compute_modules`: the compose package, the angle measures and the trajectory clusters).
COMPUTE = {EXPERIMENT: "depthlib.compose.experiment:run_compose",
           text_certified.EXPERIMENT: "depthlib.compose.text_certified:run_text_certified",
           looped_certified.EXPERIMENT: "depthlib.compose.looped_certified:train_unit",
           looped_certified.UNITS: "depthlib.compose.looped_certified:train_unit",
           hierarchy.EXPERIMENT: "depthlib.compose.hierarchy:train_unit",
           hierarchy.UNITS: "depthlib.compose.hierarchy:train_unit"}
HIERARCHY_EXPERIMENT = hierarchy.EXPERIMENT
TEXT_CERTIFIED_EXPERIMENT = text_certified.EXPERIMENT
TOY_CERTIFIED_EXPERIMENT = looped_certified.EXPERIMENT
#: The chapter's parts, in the order :func:`runs` returns them
PARTS = ("rhm", "hierarchy", "text_certified", "toy_certified")
#: The parts the chapter shows by default: all of them
SHOWN_PARTS = PARTS
#: The field of :class:`ComposeProfile` that holds each part's settings (``depthlib compose --part P --set ...``)
PART_FIELDS = {"rhm": "run", "hierarchy": "hierarchy", "text_certified": "text_certified",
               "toy_certified": "toy_certified"}
#: The looped students under chapter 3's certified protocol: a run made of units (:mod:`depthlib.units`)
LOOPED_PROTOCOL = units.UnitProtocol("looped", looped_certified.EXPERIMENT, looped_certified.UNITS,
                                     COMPUTE[looped_certified.UNITS],
                                     "depthlib.compose.looped_certified:LoopedCertifiedConfig",
                                     ("stages", "curves", "certified", "signatures", "lags"),
                                     "depthlib.compose.chapter:merge_looped_certified")
#: The hierarchy control: a run made of units, one per replicate, task and family (:mod:`depthlib.compose.hierarchy`)
HIERARCHY_PROTOCOL = units.UnitProtocol("hierarchy", hierarchy.EXPERIMENT, hierarchy.UNITS,
                                           COMPUTE[hierarchy.UNITS],
                                           "depthlib.compose.hierarchy:HierarchyConfig", MEMBER_TABLES,
                                           "depthlib.compose.hierarchy:merge", stage_format="tables")

__all__ = ["COMPUTE", "EXPERIMENT", "HIERARCHY_EXPERIMENT", "LOOPED_PROTOCOL", "PARTS", "PART_FIELDS", "PROFILES",
           "SHOWN_PARTS", "TEXT_CERTIFIED_EXPERIMENT", "TOY_CERTIFIED_EXPERIMENT", "ComposeProfile", "compute", "describe",
           "describe_hierarchy", "describe_text_certified", "describe_toy_certified", "labelled", "looped_units",
           "merge_looped_certified", "profile_config", "replay", "replay_hierarchy", "replay_text_certified",
           "replay_toy_certified", "runs", "summary", "summary_hierarchy", "summary_text_certified",
           "summary_toy_certified"]


@dataclass(frozen=True)
class ComposeProfile(Profile):
    """What chapter 7 trains under one profile: one run of every family at every depth on the grammar (``run``),
    the hierarchy control on an unseen grammar, both tasks, certified (``hierarchy``), the three families on chapter
    6's text at chapter 6's certified budget (``text_certified``) and the looped toy students under chapter 3's
    certified protocol (``toy_certified``)."""

    name: str
    run: ComposeConfig
    hierarchy: HierarchyConfig
    text_certified: TextCertifiedConfig
    toy_certified: LoopedCertifiedConfig


#: smoke: seconds (numbers meaningless). cpu: sized to one core for about an hour on this project's shared 2-core
#: machine (the committed run on chapter 6's model: 2,710 s in one process, 48 members): the grammar
#: (v, m, s, L) = (8, 2, 2, 4) — 16 leaves, 16 of the 64 symbol pairs used per level — width 32, effective depths 1–8
#: (below and above L = 4), three families, three replicates, 2000 steps × 64 fresh sequences per member.
#: paper: a GPU; a deeper grammar (L = 5, 32 leaves, v = 16, m = 4), width 128, depths to 24, five replicates.
#: The hierarchy part (:mod:`depthlib.compose.hierarchy`; why this grammar: that module's measurement): cpu:
#: the grammar (4, 2, 2, 5) — 32 leaves, Ω = 8.6·10⁹ sequences — both tasks, three families at effective depths 1, 2,
#: 3, 4, 6, 8 (looped from 3; below and above L = 5), three replicates, width 32, 1000 steps × 64 fresh sequences per
#: main stage, then at most **3** continuations, each half the member's steps so far (500, 750, 1120 steps): at most
#: 3370 steps and 215 680 sequences a member (the n-gram tables get as many), 96 members.
#: *Why this design and not fewer members with more steps* (measured on chapter 7's first transformer, since retired for
#: chapter 6's model, whose tied next-leaf members of replicate 0 land within 0.003 nats of its excess at ℓ = 4–8; this
#: 2-core machine while a 2-process job ran, one process, one thread, about 9 CPU minutes in all): at this budget no
#: next-leaf member certifies, and more steps per member do not change that. The next-leaf excess falls as a power of
#: the sequences seen, about N^−0.7 from 64 000 to 288 000 (untied ℓ = 4: 0.0358 at 64 k, 0.0248 at 96 k, 0.0185 at
#: 144 k; a main stage of 3000 steps, 192 k: 0.0165, then 0.0125 at 288 k), whether the sequences come in one schedule
#: or in continuations, so a continuation of half the steps so far (1.5× the sequences) gains 1 − 1.5^−0.7 ≈ 25 % at any
#: length: measured 31 % and 25 % after a 1000-step main stage and still 24 % after a 3000-step one (tied ℓ = 3: 29, 21,
#: 25 %; even the untied ℓ = 1 member, near its capacity, gains 3.6, 3.5, 3.6 %: N^−0.09). Certifying (< 2 % a
#: continuation) needs a local exponent below 0.05 — a floor no member is near — so tripling the steps of fewer members
#: (e.g. depths 2, 4, 6, 8) would buy lower losses, not certificates, and would lose the looped family's fits (they need
#: four depths ≥ 3) or ℓ = 1. The root task certifies its error (:mod:`depthlib.compose.certify`): untied root members
#: measured 0.276 → 0.243 → 0.205 → 0.185 (ℓ = 1; gains 12, 16, 10 %: not certified), 0.043 → 0.027 → 0.014 → 0.009
#: (ℓ = 2: 37, 49, 36 %), 0.053 → 0.022 → 0 (ℓ = 4: no error left, certified) and 0.187 → 0.096 → 0.019 → 0.020 (ℓ = 8:
#: the third continuation fixed nothing, certified). So the run keeps the whole grid and spends its time on a third
#: continuation: α_ℓ is then measured after every round, at 64 000, 96 000, 144 000 and 215 680 sequences a member
#: (``fit_rounds``), which says whether the exponent still moves with training when the losses are not certified — the
#: report this budget can honestly make (members *not certified*, with their gains).
#: *Wall time* (``benchmarks/bench_compose_hierarchy.py``: 200-step slices through the run's code, CPU seconds of one
#: thread; load average 6 on the 2 cores while it ran): a step costs 0.8 ms + 6.2 ms per block application (next
#: leaf; root 0.6 + 6.0), a held-out evaluation (2 048 sequences) 0.08 s at ℓ = 1 and 0.45–0.56 s at ℓ = 8, the
#: diagnostics 2.3 s and the root edits 1.3 s at ℓ = 8, the held-out draw 1.6 s and the grammar's unit (n-gram tables
#: on 215 680 sequences) 19 s. Scheduled deepest first on two one-thread workers: **84 min** if every member runs all
#: three continuations (74 min if the root members from ℓ = 4 stop one earlier, as measured), against 57 min for the
#: same run with two continuations; that needs two cores of its own — while another 2-process job shares them each
#: worker gets about 40 % of a core (measured), and the run takes about 3.4 h. Resumable member by member.
#: The certified text part (:mod:`depthlib.compose.text_certified`): chapter 6's converged series (its profile's
#: ``converged``) is its untied family and sets its budget, data order and certificate. cpu: looped (effective depths
#: 3, 4, 6, 8, 12: five, so that a refit without one depth keeps a degree of freedom) and tied (1, 2, 3, 4, 6, 8, 12),
#: seed 0 — twelve members of 3300 steps × 2048 tokens = 6.76 M tokens, then continuations of half the steps so far (at
#: most 2). From chapter 6's timed slice (0.076 + 0.0094·ℓ s per step on an idle core) one step of all twelve members
#: costs 1.56 s: 2.1 CPU hours with one continuation each, 3.2 with two, so 1.1–1.6 h on two one-thread workers, after
#: chapter 6's series (1.6–2.1 h), which it needs. paper: chapter 6's paper series, depths to 16, three seeds.
#: The certified toy part (:mod:`depthlib.compose.looped_certified`): chapter 3's certified protocol (its pool, held-out
#: inputs, 12,000 steps per route at every depth, continuations of half the steps so far until one gains < 2 %, at most
#: 3) on looped students: cpu: the tied and independent teachers at T = 1, replicates 0–2 (chapter 3's own), looped
#: depths 6, 12, 24, 48 (chapter 3's untied students exist at each), routes scratch → halved on both teachers and Euler
#: on the tied one; six units on two one-thread workers, resumable stage by stage. paper: depths to 96, 40,000 steps ×
#: 1,024 per route.
#: paper (a GPU; not measured: no GPU in this session; ``compute(PROFILES["paper"].hierarchy, device="cuda")``): the
#: grammar (8, 4, 2, 5) — m/v = 1/2 at v = 8, whose top level needs far more samples than the cpu budget; Ω = 3.7·10¹⁹,
#: so five replicates' 58 M draws would share about 10⁻⁸ sequences with the 8 192 held-out ones — width 128, depths
#: 1–16 (5 and 10 among them), five replicates, 20 000 steps × 256 (continuations of half the steps so far, at most 2:
#: 10 000 + 15 000, ≤ 11.5 M sequences per member; the n-gram tables on as many, tens of CPU minutes): 28 members per
#: task and replicate, Σℓ = 198; at an assumed 1 ms per block application per step (launch-bound at width 128) about
#: 25 h if every member runs both continuations, less with several workers sharing the GPU (``jobs``).
PROFILES: dict[str, ComposeProfile] = {
    "smoke": ComposeProfile("smoke", ComposeConfig(
        "smoke", grammar=RHMConfig(v=8, m=2, s=2, L=2), depths=(1, 2, 3, 4), seeds=(0,),
        model=GrammarModelConfig(d_model=16, n_heads=2),
        train=GrammarTrainConfig(steps=40, batch_size=16, evals=20, n_held_out=64), n_probe=32, n_permutations=2),
        HierarchyConfig("smoke", grammar=RHMConfig(v=4, m=2, s=2, L=3), depths=(1, 2, 3, 4), seeds=(0, 1),
                        model=GrammarModelConfig(d_model=16, n_heads=2),
                        train=GrammarTrainConfig(steps=20, batch_size=8, evals=5, n_held_out=64),
                        certificate=Certificate(max_continuations=1), n_probe=32, n_permutations=2, n_bootstrap=50),
        TextCertifiedConfig("smoke", series=lm_chapter.PROFILES["smoke"].converged, depths=(1, 2, 4, 8),
                            n_bootstrap=50),
        LoopedCertifiedConfig("smoke", CertifiedConfig(
            "smoke", cells=((1.0, 1.0, 2), (0.0, 1.0, 2)), depths=(2, 4, 8), steps=40, batch=32, pool_batches=40,
            evals=5, eval_batches=2, eval_batch_size=128, teacher_depth=16))),
    "cpu": ComposeProfile("cpu", ComposeConfig("cpu", grammar=RHMConfig(v=8, m=2, s=2, L=4)),
                          HierarchyConfig("cpu", certificate=Certificate(max_continuations=3)),
                          TextCertifiedConfig("cpu", series=lm_chapter.PROFILES["cpu"].converged,
                                              depths=(1, 2, 3, 4, 6, 8, 12)),
                          LoopedCertifiedConfig("cpu")),
    "paper": ComposeProfile("paper", ComposeConfig(
        "paper", grammar=RHMConfig(v=16, m=4, s=2, L=5), depths=(1, 2, 3, 4, 5, 6, 8, 12, 16, 24),
        seeds=(0, 1, 2, 3, 4), model=GrammarModelConfig(d_model=128, n_heads=4),
        train=GrammarTrainConfig(steps=20_000, batch_size=256, lr=1e-3, n_held_out=8192), n_probe=2048,
        n_permutations=8),
        HierarchyConfig("paper", grammar=RHMConfig(v=8, m=4, s=2, L=5), depths=(1, 2, 3, 4, 5, 6, 8, 10, 12, 16),
                        seeds=(0, 1, 2, 3, 4),
                        model=GrammarModelConfig(d_model=128, n_heads=4),
                        train=GrammarTrainConfig(steps=20_000, batch_size=256, lr=1e-3, evals=20, n_held_out=8192),
                        n_probe=2048, n_permutations=8, n_bootstrap=2000),
        TextCertifiedConfig("paper", series=lm_chapter.PROFILES["paper"].converged,
                            depths=(1, 2, 3, 4, 6, 8, 12, 16), seeds=(0, 1, 2)),
        LoopedCertifiedConfig("paper", CertifiedConfig(
            "paper", cells=((1.0, 1.0, 3), (0.0, 1.0, 3)), depths=(6, 12, 24, 48, 96), steps=40_000, batch=1024,
            pool_batches=40_000))),
}


def profile_config(profile: str = "smoke") -> ComposeConfig:
    results.check_profile(profile)
    return PROFILES[profile].run.validate()


def compute(cfg: ComposeConfig | HierarchyConfig | TextCertifiedConfig | LoopedCertifiedConfig, device: str = "cpu", *,
            force: bool = False, progress: bool = True, executor=None) -> results.Run:
    """Train (or resume, or load) a run of ``cfg``, as chapters 3 and 6 do (its lifecycle is
    :func:`depthlib.compose.experiment.run_compose`'s and for the certified text part
    :func:`depthlib.compose.text_certified.run_text_certified`'s; the units of the certified toy part and of the
    hierarchy control are the units runner's, :func:`depthlib.units.train_units`, one process per core). The text part
    trains its members on local processes: one per core without an ``executor``, one at a time in this process with
    ``ExecutorConfig("serial")``, the joblib executor's ``jobs`` at a time with it.
    ``device``: the hierarchy part's members may train on an accelerator; the other parts train on the CPU."""
    jobs = _jobs(executor)
    runtime.configure_process(1)
    if isinstance(cfg, HierarchyConfig):
        if force:
            raise InputError("--force does not apply to the hierarchy control on chapter 6's model (its units resume; "
                             "--rerun recomputes what the local cache lacks)")
        started = time.time()
        done = units.train_units(HIERARCHY_PROTOCOL, cfg, cfg.cells(), device, executor=executor)
        return units.merge_units(HIERARCHY_PROTOCOL, cfg, done, started)
    if isinstance(cfg, TextCertifiedConfig):
        return text_certified.run_text_certified(cfg, device, jobs=jobs or os.cpu_count() or 1, force=force,
                                                 progress=progress)
    if device != "cpu":
        raise InputError(f"this part of chapter 7 trains on the CPU, got device {device!r}")
    if isinstance(cfg, LoopedCertifiedConfig):
        if force:
            raise InputError("--force does not apply to the certified toy part (its units resume; --rerun "
                             "recomputes what the local cache lacks)")
        started = time.time()
        done = units.train_units(LOOPED_PROTOCOL, cfg, looped_units(cfg), device)
        return units.merge_units(LOOPED_PROTOCOL, cfg, done, started)
    return run_compose(cfg, force=force, progress=progress)


def _jobs(executor) -> int | None:
    """How many members of a part train at a time under ``executor`` (None: the part's default, one per core)."""
    if executor is None:
        return None
    if executor.kind == "serial":
        return 1
    if executor.kind == "joblib":
        return executor.jobs
    raise InputError(f"chapter 7 trains its members on local processes: --executor serial or joblib, not "
                     f"{executor.kind}")


def looped_units(cfg: LoopedCertifiedConfig) -> list[dict]:
    """The certified toy part's units in the order they run: a replicate of each teacher at a time, tied first (the
    Euler route makes its units the longest)."""
    return sorted(cfg.units(), key=lambda c: (c["replicate"], -c["rho"]))


def merge_looped_certified(cfg: LoopedCertifiedConfig, t: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The certified toy part's run from its units' tables, fitted as chapter 3 fits its certified students
    (:mod:`depthlib.toy.certified`): every stage, curves, the envelope (``certified``, with the held-out / pool gap),
    α_ℓ per replicate (envelope, each route, the untrained Euler start) and across replicates, the drop-one-depth
    refits, local slopes, each replicate's power-law residuals, α_ℓ after each round of continuations, and the
    signatures and long-lag cosines of the envelope's students and their teachers."""
    stages, cert = t["stages"], certified.with_gap(t["certified"])
    per = certified.alpha_tables(cert, stages)
    return {"stages": stages, "curves": t["curves"], "certified": cert, "alpha": per,
            "alpha_summary": certified.alpha_summary(per), "fragility": certified.fragility(cert),
            "slopes": certified.local_slopes(cert), "power_law": certified.power_law_check(cert),
            "alpha_rounds": certified.alpha_by_round(stages, cfg.protocol.max_continuations),
            "signatures": t["signatures"], "lags": t["lags"]}


def labelled(cfg, field: str):
    """A part's settings ``cfg`` (``field`` of :class:`ComposeProfile`) as they are if they are a profile's own, else
    labelled ``custom``."""
    return results.named_settings(cfg, PROFILES, field, label="profile")


def runs(profile: str | ComposeProfile = "smoke", *, rerun: bool = False, executor=None, device: str | None = None,
         progress: bool = False, parts: tuple[str, ...] = SHOWN_PARTS) -> dict[str, results.Run]:
    """``{"rhm": run, "hierarchy": run, "text_certified": run, "toy_certified": run}``: the runs chapter 7 shows for ``profile``
    (the one rule: :func:`depthlib.results.select_run`), each trained now (resumable) if there is none; ``parts``
    chooses among them (:data:`PARTS`; default every part). Members train on the CPU, as :func:`compute` says for
    ``executor`` (serial or joblib; ``device`` must be left at its default). Custom settings (a
    :class:`ComposeProfile`, e.g. ``depthlib compose --set``) are trained, or loaded from the local cache, never chosen
    among committed runs; each run is labelled as its config says."""
    if not isinstance(profile, ComposeProfile):
        results.check_profile(profile)
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise InputError(f"chapter 7 has no part(s) {', '.join(sorted(unknown))} (have {', '.join(PARTS)})")
    _jobs(executor)                         # an executor chapter 7 cannot use is refused before anything trains
    if device not in (None, "cpu"):
        raise InputError(f"chapter 7 trains on the CPU, got device {device!r}")
    if isinstance(profile, ComposeProfile):
        return {part: compute(labelled(getattr(profile, PART_FIELDS[part]), PART_FIELDS[part]).validate(),
                              progress=progress, executor=executor)
                for part in PARTS if part in parts}
    experiments = {"rhm": EXPERIMENT, "text_certified": TEXT_CERTIFIED_EXPERIMENT}
    configs = {part: (experiments[part], PART_FIELDS[part]) for part in PARTS if part in experiments}
    out = {part: results.chapter_run(
        experiment, profile, lambda a=attr: compute(getattr(PROFILES[profile], a), progress=progress, executor=executor),
        expected_config=lambda p, a=attr: getattr(PROFILES[p], a).to_dict() if p in PROFILES else None, rerun=rerun)
        for part, (experiment, attr) in configs.items() if part in parts}
    if "toy_certified" in parts:
        out["toy_certified"] = units.protocol_run(
            LOOPED_PROTOCOL, profile, lambda q: PROFILES[q].toy_certified if q in PROFILES else None, looped_units,
            rerun=rerun)
    if "hierarchy" in parts:
        out["hierarchy"] = units.protocol_run(
            HIERARCHY_PROTOCOL, profile, lambda q: PROFILES[q].hierarchy if q in PROFILES else None,
            lambda c: c.cells(), rerun=rerun, executor=executor)
    return {part: out[part] for part in PARTS if part in out}


def _replayed_losses(run: results.Run, committed: pd.DataFrame, curve: pd.DataFrame, steps, key: dict) -> pd.DataFrame:
    """The committed and recomputed held-out and training losses of one member at ``steps`` (columns ``committed``,
    ``replayed``; a loss the committed curve lacks or holds as NaN is skipped)."""
    rows = []
    for step in steps:
        for col in ("val_loss", "train_loss"):
            c = committed.loc[committed["step"] == step, col]
            r = curve.loc[curve["step"] == step, col]
            if len(c) and len(r) and np.isfinite(c.iloc[0]):
                rows.append({**key, "step": step, "quantity": col, "committed": float(c.iloc[0]),
                             "replayed": float(r.iloc[0])})
    if not rows:
        raise InputError(f"run {run.experiment}/{run.key} has no losses at steps {list(steps)} to replay")
    return pd.DataFrame(rows)


def replay_toy_certified(run: results.Run) -> pd.DataFrame:
    """Retrain the first stage of the certified toy part (the merged run's or the unit's first unit, smallest depth,
    scratch) up to its first held-out evaluation with the current code, built as
    :func:`depthlib.compose.looped_certified.train_unit` builds it; its committed and recomputed held-out losses at
    step 0 and there."""
    import torch
    config = dict(run.config)
    cell = config.pop("cell", None)
    cfg = LoopedCertifiedConfig.from_dict(config)
    cell = cell or looped_units(cfg)[0]
    p, depth = cfg.protocol, min(cfg.protocol.depths)
    teacher = looped_certified.unit_teacher(cfg, cell)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pool = certified.make_pool(p, teacher, cell["replicate"])
        done = looped_certified.train_stage(cfg, teacher, pool, None, cell, depth, "scratch", None, 1.0, p.steps,
                                            stop_at=p.steps // p.evals)
    finally:
        torch.set_num_threads(threads)
    c = run.table("curves")
    mine = c[(c["rho"] == cell["rho"]) & (c["temperature"] == cell["temperature"])
             & (c["replicate"] == cell["replicate"]) & (c["depth"] == depth) & (c["stage"] == "scratch")]
    out = done.curve[["step", "test_loss"]].rename(columns={"test_loss": "replayed"})
    return out.merge(mine[["step", "test_loss"]].rename(columns={"test_loss": "committed"}), on="step", how="inner")


def replay(run: results.Run) -> pd.DataFrame:
    """Retrain the run's first member (first replicate, first family, shallowest depth) up to its first held-out
    evaluation with the current code; its committed and recomputed held-out and training losses there (columns
    ``committed``, ``replayed``). The other parts are replayed by their own ``replay_*``."""
    import torch
    if run.experiment in (looped_certified.EXPERIMENT, looped_certified.UNITS):
        return replay_toy_certified(run)
    if run.experiment in (hierarchy.EXPERIMENT, hierarchy.UNITS):
        return replay_hierarchy(run)
    if run.experiment == TEXT_CERTIFIED_EXPERIMENT:
        return replay_text_certified(run)

    from depthlib.compose import rhm
    from depthlib.compose.train import held_out
    cfg = from_dict(ComposeConfig, run.config)
    seed, family, depth = cfg.units()[0]
    first = cfg.train.eval_steps()[1]
    grammar = rhm.make_grammar(cfg.grammar)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        curve = train_member(cfg, grammar, seed, family, depth, held_out(grammar, cfg.train.n_held_out), None,
                             stop_at=first)["curves"]
    finally:
        torch.set_num_threads(threads)
    committed = run.table("curves")
    mine = committed[(committed["family"] == family) & (committed["depth"] == depth) & (committed["seed"] == seed)]
    return _replayed_losses(run, mine, curve, (0, first), {"family": family, "depth": depth, "seed": seed})


def replay_hierarchy(run: results.Run) -> pd.DataFrame:
    """Retrain the shallowest member of the hierarchy run's first unit (or of the unit's) up to its main stage's first
    held-out evaluation with the current code; its committed and recomputed losses there."""
    import torch
    config = dict(run.config)
    cell = config.pop("cell", None)
    cfg = HierarchyConfig.from_dict(config)
    first = cfg.train.eval_steps()[1]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        curve = hierarchy.first_curve(cfg, cell or cfg.cells()[0], first)
    finally:
        torch.set_num_threads(threads)
    seed, task, family, depth = (int(curve[k].iloc[0]) if k in ("seed", "depth") else curve[k].iloc[0]
                                 for k in ("seed", "task", "family", "depth"))
    c = run.table("curves")
    mine = c[(c["task"] == task) & (c["family"] == family) & (c["depth"] == depth) & (c["seed"] == seed)
             & (c["stage"] == "main")]
    return _replayed_losses(run, mine, curve, (0, first), {"task": task, "family": family, "depth": depth,
                                                           "seed": seed})


def describe_hierarchy(run: results.Run) -> dict:
    """Provenance and settings of a hierarchy run (the positive control), with its exact held-out check."""
    c = HierarchyConfig.from_dict(run.config)
    g, m = c.grammar, run.manifest
    return {**results.run_info(run), "grammar": {"v": g.v, "m": g.m, "s": g.s, "L": g.L, "seed": g.seed},
            "length": g.length, "n_sequences": m.get("n_sequences"), "tasks": list(c.tasks),
            "families": list(c.families), "depths": {f: c.family_depths(f) for f in c.families},
            "seeds": list(c.seeds), "replicates": m.get("replicates"), "d_model": c.model.d_model,
            "n_heads": c.model.n_heads, "steps": c.train.steps, "batch_size": c.train.batch_size, "lr": c.train.lr,
            "continuation_steps": c.certificate.continuation_config(c.train).steps,
            "max_continuations": c.certificate.max_continuations, "gain_below": c.certificate.gain_below,
            "max_sequences_per_member": c.span, "n_held_out": c.train.n_held_out,
            "held_out_overlap": m.get("held_out_overlap"), "training_sequences": m.get("training_sequences"),
            "expected_overlap": m.get("expected_overlap"), "n_members": len(c.units())}


def summary_hierarchy(run: results.Run) -> dict:
    """The key numbers of a hierarchy run: the held-out check, the best n-gram's excess, per task and family the
    mean over replicates per depth (next-leaf excess; root cross-entropy and accuracy), the shown exponents (else why
    not), the slope-change tests, certification and the wall time."""
    d = describe_hierarchy(run)
    members, ngram = run.table("members"), run.table("ngram")
    best = ngram.loc[ngram["excess"].idxmin()]
    losses = {}
    for (task, family), g in members.groupby(["task", "family"], sort=False):
        cols = ["excess"] + (["accuracy"] if task == "root" else [])
        losses.setdefault(task, {})[family] = {int(k): {c: float(v[c]) for c in cols}
                                               for k, v in g.groupby("depth")[cols].mean().iterrows()}
    stab = run.table("fit_stability")
    brk = run.table("fit_break")
    return {"run": str(run.path), **{k: d[k] for k in ("profile", "grammar", "length", "n_sequences", "depths",
                                                        "replicates", "steps", "max_sequences_per_member",
                                                        "held_out_overlap", "training_sequences")},
            "bayes_loss": float(ngram["bayes"].iloc[0]),
            "best_ngram": {"context": int(best["context"]), "excess": float(best["excess"])},
            "losses": losses,
            "alpha": {f"{r.family} ({r.quantity})": ({"value": r.alpha, "lo": r.lo, "hi": r.hi,
                                                      "without_1": r.alpha_without_1,
                                                      "drop_one": [r.drop_one_min, r.drop_one_max]} if r.shown
                                                     else {"value": None, "reason": r.why_not})
                      for r in stab.itertuples()},
            "slope_change": {f"{r.family} ({r.quantity})": {"break": r["break"], "change": r.change,
                                                           "lo": r.change_lo, "hi": r.change_hi,
                                                           "changes": bool(r.changes), "break_at_L": bool(r.break_at_L)}
                             for _, r in brk.iterrows()} if len(brk) else {},
            "n_certified": int(members["certified"].sum()), "n_members": int(len(members)),
            "wall_time_s": run.manifest.get("wall_time_s")}


def describe_toy_certified(run: results.Run) -> dict:
    """Provenance and settings of a certified toy run (looped students under chapter 3's certified protocol)."""
    c = LoopedCertifiedConfig.from_dict(run.config)
    p = c.protocol
    return {**results.run_info(run), "teachers": [TEACHER_KINDS[r] for r, _, _ in p.cells],
            "temperatures": sorted({float(t) for _, t, _ in p.cells}),
            "replicates": max(int(n) for _, _, n in p.cells), "depths": list(p.depths), "steps": p.steps,
            "batch": p.batch, "pool_batches": p.pool_batches, "flow_lr": c.flow_lr(), "lr_warm": p.lr_warm,
            "max_continuations": p.max_continuations, "gain_below": p.gain_below, "euler": c.euler,
            "teacher_depth": p.teacher_depth, "d_model": p.d_model, "units": len(c.units())}


def summary_toy_certified(run: results.Run) -> dict:
    """The key numbers of a certified toy run: per teacher the envelope's loss by depth (mean over replicates), α_ℓ
    per fit with its interval, how many students are certified, the wall time."""
    cert, alpha = run.table("certified"), run.table("alpha_summary")
    return {"run": str(run.path), **{k: v for k, v in describe_toy_certified(run).items()
                                     if k in ("profile", "depths", "replicates", "steps")},
            "losses": {t: {int(d): float(x) for d, x in g.groupby("depth")["test_loss"].mean().items()}
                       for t, g in cert.groupby("teacher")},
            "alpha": {f"{r.teacher} ({r.fit})": {"value": float(r.alpha), "lo": float(r.lo), "hi": float(r.hi)}
                      for r in alpha.itertuples()},
            "n_certified": int(cert["certified"].sum()), "n_students": int(len(cert)),
            "wall_time_s": run.manifest.get("wall_time_s")}


def describe_text_certified(run: results.Run) -> dict:
    """Provenance and settings of a text run at chapter 6's certified budget (the reused families beside chapter 6's
    untied members)."""
    c = TextCertifiedConfig.from_dict(run.config)
    m, series = run.manifest, c.series
    return {**results.run_info(run), "series_run": m.get("series_run"), "families": ["untied", *c.families],
            "depths": {f: c.family_depths(f) for f in ("untied", *c.families)}, "seeds": list(c.seeds),
            "d_model": series.model.d_model, "n_heads": series.model.n_heads, "vocab_size": series.vocab_size,
            "context": series.model.context, "steps": series.train.steps, "batch_size": series.train.batch_size,
            "lr": series.train.lr, "tokens_per_member": series.tokens_per_member(),
            "continuation": series.continuation, "max_continuations": series.max_continuations,
            "gain_below": series.gain_below, "n_bootstrap": c.n_bootstrap, "tokenizer": m.get("tokenizer"),
            "n_held_out_documents": len(m.get("held_out_documents", [])), "n_members_trained": len(c.units())}


def summary_text_certified(run: results.Run) -> dict:
    """The key numbers of a certified text run: per family the final held-out loss per effective depth and whether it
    is certified, α_ℓ with its interval where defined, each reused family's difference from untied, the wall time."""
    members = run.table("members")
    return {"run": str(run.path), **{k: v for k, v in describe_text_certified(run).items()
                                     if k in ("profile", "series_run", "depths", "tokens_per_member")},
            "losses": {f: {int(r.depth): {"val_loss": float(r.val_loss), "certified": bool(r.certified)}
                           for r in g.itertuples()} for f, g in members.groupby("family", sort=False)},
            **run.manifest.get("summary", {}), "wall_time_s": run.manifest.get("wall_time_s")}


def replay_text_certified(run: results.Run) -> pd.DataFrame:
    """Retrain the run's first member trained here (deepest first) up to its first held-out evaluation with the current
    code; its committed and recomputed losses at step 0 and there (:func:`_replayed_losses`)."""
    import tempfile
    from pathlib import Path

    import torch

    from depthlib.lm import series as lm_series
    from depthlib.lm.families import build_family_model
    from depthlib.lm.train import train_model
    cfg = TextCertifiedConfig.from_dict(run.config)
    family, depth, seed = cfg.units()[0]
    first = min(cfg.series.train.eval_every, cfg.series.train.steps)
    tok, data, _, _ = lm_series.prepare_data(cfg.series.series())     # the tokenizer trained again: the same one
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:     # the checkpoint written at that evaluation holds the curve
            ckpt = Path(tmp) / "checkpoint.pt"
            model = build_family_model(cfg.series.model, depth, len(tok), seed, tok.eos_token_id,
                                       text_certified.schedule(family, depth)[1])
            train_model(model, data, cfg.series.train, seed=seed, checkpoint=ckpt, stop_at_step=first)
            curve = pd.DataFrame(torch.load(ckpt, weights_only=False)["curve"])
    finally:
        torch.set_num_threads(threads)
    c = run.table("curves")
    mine = c[(c["family"] == family) & (c["depth"] == depth) & (c["seed"] == seed) & (c["stage"] == "main")]
    return _replayed_losses(run, mine, curve, (0, first), {"family": family, "depth": depth, "seed": seed})


def reduction(profile: str) -> str:
    """How ``profile``'s runs are reduced against the paper's: one line of the verdict's "how reduced" list."""
    p = PROFILES[profile]
    g, tc, toy = p.run.grammar, p.text_certified, p.toy_certified
    return (f"The grammar (v, m, s, L) = ({g.v}, {g.m}, {g.s}, {g.L}) at width {p.run.model.d_model}, effective depths "
            f"{min(p.run.depths)}–{max(p.run.depths)}, {len(p.run.seeds)} replicate(s), {p.run.train.steps:,} steps × "
            f"{p.run.train.batch_size} sequences per member; on text chapter 6's converged series with its blocks "
            f"looped and tied (width {tc.series.model.d_model}, effective depths {min(tc.depths)}–{max(tc.depths)}, "
            f"{len(tc.seeds)} seed(s), {tc.series.train.steps:,} steps × {tc.series.train.batch_size} × "
            f"{tc.series.model.context} tokens per member and up to {tc.series.max_continuations} continuations); "
            f"looped toy students at depths {min(toy.protocol.depths)}–{max(toy.protocol.depths)}, "
            f"{max(int(c[2]) for c in toy.protocol.cells)} replicate(s) (not in the paper).")


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    if run.experiment == TOY_CERTIFIED_EXPERIMENT:
        return describe_toy_certified(run)
    if run.experiment == HIERARCHY_EXPERIMENT:
        return describe_hierarchy(run)
    if run.experiment == TEXT_CERTIFIED_EXPERIMENT:
        return describe_text_certified(run)
    c = from_dict(ComposeConfig, run.config)
    g = c.grammar
    return {**results.run_info(run), "grammar": {"v": g.v, "m": g.m, "s": g.s, "L": g.L, "seed": g.seed},
            "length": g.length, "families": list(c.families),
            "depths": {f: c.family_depths(f) for f in c.families}, "seeds": list(c.seeds),
            "d_model": c.model.d_model, "n_heads": c.model.n_heads, "steps": c.train.steps,
            "batch_size": c.train.batch_size, "lr": c.train.lr, "sequences_per_member": c.train.steps * c.train.batch_size,
            "n_held_out": c.train.n_held_out, "n_probe": c.n_probe, "n_members": len(c.units())}


def _why_undefined(fits: pd.DataFrame, family: str, law: str) -> str:
    """Why a family's exponent under ``law`` is not defined over replicates (``fits``:
    :func:`depthlib.compose.analysis.fit_laws`, whose ``defined`` and ``at_bound`` decide it): too few depths for the
    law, replicates without a fit inside the searched range, or fewer than two replicates for an interval."""
    from depthlib.compose.analysis import MIN_POINTS
    g = fits[(fits["family"] == family) & (fits["law"] == law)]
    n_depths, ok, at_bound = int(g["n"].min()), int(g["defined"].sum()), int(g["at_bound"].sum())
    if n_depths < MIN_POINTS[law]:
        return f"{n_depths} depths (the {law.replace(' ', '-')} law needs {MIN_POINTS[law]})"
    if ok < len(g):
        return (f"{len(g) - ok} of {len(g)} replicates have no fit"
                + (f" ({at_bound} at a search bound)" if at_bound else ""))
    return f"{ok} replicate (an interval over replicates needs 2)"


def summary(run: results.Run) -> dict:
    """The key numbers of a run: per family the held-out loss and excess per depth (mean over replicates), the depth
    exponents with their intervals over replicates, convergence, and what the run cost (the other parts: their own
    ``summary_*``)."""
    from depthlib.compose import analysis
    if run.experiment == TOY_CERTIFIED_EXPERIMENT:
        return summary_toy_certified(run)
    if run.experiment == HIERARCHY_EXPERIMENT:
        return summary_hierarchy(run)
    if run.experiment == TEXT_CERTIFIED_EXPERIMENT:
        return summary_text_certified(run)
    d = describe(run)
    alphas = analysis.alpha_table(run)
    losses = analysis.loss_table(run)
    members = run.table("members")
    fits = analysis.fit_laws(members)
    return {"run": str(run.path), **{k: d[k] for k in ("profile", "device", "grammar", "length", "families", "depths",
                                                        "seeds", "d_model", "steps", "sequences_per_member")},
            "bayes_loss": float(members["bayes"].mean()),
            "losses": {f: {int(r.depth): {"val_loss": r.val_loss, "excess": r.excess, "lo": r.excess_lo,
                                          "hi": r.excess_hi} for r in g.itertuples()}
                       for f, g in losses.groupby("family")},
            # what is a result is the chapter's ``defined`` (:func:`depthlib.compose.analysis.alpha_table`): an
            # exponent that is not defined is printed as null, with the reason, never as a number
            "alpha": {f"{r.family} ({r.law})": ({"value": r.value, "lo": r.lo, "hi": r.hi, "n_seeds": r.n_seeds,
                                                 "defined": True} if r.defined else
                                                {"value": None, "lo": None, "hi": None, "n_seeds": r.n_seeds,
                                                 "defined": False, "reason": _why_undefined(fits, r.family, r.law)})
                      for r in alphas.itertuples()},
            "all_converged": bool(members["converged"].all()),
            "max_rel_improvement": float(members["rel_improvement"].max()),
            "wall_time_s": run.manifest.get("wall_time_s")}

"""Chapter 7's glue: the profiles, the run the chapter shows, its replay check, what the text states about it.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (one part, ``rhm``),
``compute``, ``replay`` (retrain the run's first member up to its first evaluation with the current code),
``describe``, ``summary`` and ``COMPUTE``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib import results, runtime
from depthlib.compose.experiment import EXPERIMENT, ComposeConfig, run_compose, train_member
from depthlib.compose.model import ModelConfig
from depthlib.compose.rhm import RHMConfig
from depthlib.compose.train import TrainConfig
from depthlib.contract import Profile, from_dict
from depthlib.errors import InputError

#: The compute entry of the chapter's runs: their code modules are derived from its imports
#: (:func:`depthlib.results.compute_modules`: the compose package, the angle measures and the trajectory clusters).
COMPUTE = {EXPERIMENT: "depthlib.compose.experiment:run_compose"}

__all__ = ["COMPUTE", "EXPERIMENT", "PROFILES", "ComposeProfile", "compute", "describe", "profile_config", "replay",
           "runs", "summary"]


@dataclass(frozen=True)
class ComposeProfile(Profile):
    """What chapter 7 trains under one profile: one run of every family at every depth."""

    name: str
    run: ComposeConfig


#: smoke: seconds (numbers meaningless). cpu: sized to one core for about an hour on this project's shared 2-core
#: machine (measured 4–10 ms per block application per step at batch 64 while other jobs ran): the grammar
#: (v, m, s, L) = (8, 2, 2, 4) — 16 leaves, 16 of the 64 symbol pairs used per level — width 32, effective depths 1–8
#: (below and above L = 4), three families, three replicates, 2000 steps × 64 fresh sequences per member.
#: paper: a GPU; a deeper grammar (L = 5, 32 leaves, v = 16, m = 4), width 128, depths to 24, five replicates.
PROFILES: dict[str, ComposeProfile] = {
    "smoke": ComposeProfile("smoke", ComposeConfig(
        "smoke", grammar=RHMConfig(v=8, m=2, s=2, L=2), depths=(1, 2, 3, 4), seeds=(0,),
        model=ModelConfig(d_model=16, n_heads=2),
        train=TrainConfig(steps=40, batch_size=16, evals=20, n_held_out=64), n_probe=32, n_permutations=2)),
    "cpu": ComposeProfile("cpu", ComposeConfig("cpu", grammar=RHMConfig(v=8, m=2, s=2, L=4))),
    "paper": ComposeProfile("paper", ComposeConfig(
        "paper", grammar=RHMConfig(v=16, m=4, s=2, L=5), depths=(1, 2, 3, 4, 5, 6, 8, 12, 16, 24),
        seeds=(0, 1, 2, 3, 4), model=ModelConfig(d_model=128, n_heads=4),
        train=TrainConfig(steps=20_000, batch_size=256, lr=1e-3, n_held_out=8192), n_probe=2048,
        n_permutations=8)),
}


def profile_config(profile: str = "smoke") -> ComposeConfig:
    results.check_profile(profile)
    return PROFILES[profile].run.validate()


def compute(cfg: ComposeConfig, *, force: bool = False, progress: bool = True) -> results.Run:
    """Train (or resume, or load) a run of ``cfg`` (its lifecycle is :func:`depthlib.compose.experiment.run_compose`'s)."""
    runtime.configure_process(1)
    return run_compose(cfg, force=force, progress=progress)


def runs(profile: str = "smoke", *, rerun: bool = False, executor=None, device: str | None = None,
         progress: bool = False) -> dict[str, results.Run]:
    """``{"rhm": run}``: the run chapter 7 shows for ``profile`` (the one rule: :func:`depthlib.results.select_run`),
    trained now (resumable) if there is none. Members train in this process on the CPU (``executor`` and ``device``
    are accepted for the contract and must be left at their defaults)."""
    results.check_profile(profile)
    if executor is not None and getattr(executor, "kind", "serial") != "serial":
        raise InputError("chapter 7 trains its members in this process: no executor")
    if device not in (None, "cpu"):
        raise InputError(f"chapter 7 trains on the CPU, got device {device!r}")
    return {"rhm": results.chapter_run(
        EXPERIMENT, profile, lambda: compute(PROFILES[profile].run, progress=progress),
        expected_config=lambda p: PROFILES[p].run.to_dict() if p in PROFILES else None, rerun=rerun)}


def replay(run: results.Run) -> pd.DataFrame:
    """Retrain the run's first member (first replicate, first family, shallowest depth) up to its first held-out
    evaluation with the current code; its committed and recomputed held-out and training losses there (columns
    ``committed``, ``replayed``)."""
    import torch

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
    rows = []
    for step in (0, first):
        for col in ("val_loss", "train_loss"):
            c = mine.loc[mine["step"] == step, col]
            r = curve.loc[curve["step"] == step, col]
            if len(c) and len(r) and np.isfinite(c.iloc[0]):
                rows.append({"family": family, "depth": depth, "seed": seed, "step": step, "quantity": col,
                             "committed": float(c.iloc[0]), "replayed": float(r.iloc[0])})
    if not rows:
        raise InputError(f"run {run.experiment}/{run.key} has no losses at step {first} to replay")
    return pd.DataFrame(rows)


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    c = from_dict(ComposeConfig, run.config)
    g = c.grammar
    return {**results.run_info(run), "grammar": {"v": g.v, "m": g.m, "s": g.s, "L": g.L, "seed": g.seed},
            "length": g.length, "families": list(c.families),
            "depths": {f: c.family_depths(f) for f in c.families}, "seeds": list(c.seeds),
            "d_model": c.model.d_model, "n_heads": c.model.n_heads, "steps": c.train.steps,
            "batch_size": c.train.batch_size, "lr": c.train.lr, "sequences_per_member": c.train.steps * c.train.batch_size,
            "n_held_out": c.train.n_held_out, "n_probe": c.n_probe, "n_members": len(c.units())}


def summary(run: results.Run) -> dict:
    """The key numbers of a run: per family the held-out loss and excess per depth (mean over replicates), the depth
    exponents with their intervals over replicates, convergence, and what the run cost."""
    from depthlib.compose import analysis
    d = describe(run)
    alphas = analysis.alpha_table(run)
    losses = analysis.loss_table(run)
    members = run.table("members")
    return {"run": str(run.path), **{k: d[k] for k in ("profile", "device", "grammar", "length", "families", "depths",
                                                        "seeds", "d_model", "steps", "sequences_per_member")},
            "bayes_loss": float(members["bayes"].mean()),
            "losses": {f: {int(r.depth): {"val_loss": r.val_loss, "excess": r.excess, "lo": r.excess_lo,
                                          "hi": r.excess_hi} for r in g.itertuples()}
                       for f, g in losses.groupby("family")},
            "alpha": {f"{r.family} ({r.law})": {"value": r.value, "lo": r.lo, "hi": r.hi, "n_seeds": r.n_seeds,
                                                "defined": r.defined} for r in alphas.itertuples()},
            "all_converged": bool(members["converged"].all()),
            "max_rel_improvement": float(members["rel_improvement"].max()),
            "wall_time_s": run.manifest.get("wall_time_s")}

"""One run of chapter 7: every (replicate, family, depth) member trained to convergence on the grammar, diagnosed.

A run is one results-cache run (experiment ``compose-rhm``). Each member is a unit of work whose tables are written to
``units/`` of the run folder as soon as it is done, so an interrupted run resumes at the next member. When every
member is done the run's tables are written (tidy, one row per measurement):

================  ===================================================================================================
table             rows
================  ===================================================================================================
``members``       family, depth, seed, parameters, final held-out loss, Bayes loss, excess, relative improvements,
                  converged, seconds, and the diagnostics' summary (:func:`depthlib.compose.diagnostics.diagnose`)
``curves``        family, depth, seed, step, lr, train_loss, val_loss, excess
``layers``        family, depth, seed, metric (theta, theta_dh), layer, mean, std
``lags``          family, depth, seed, k, cos: the long-lag cosine
``clusters``      family, depth, seed, cluster, kind, fraction, block, theta
``edits``         family, depth, seed, edit (delete, swap, permute), position, loss, delta
================  ===================================================================================================

The depth laws are fitted from ``members`` when the chapter is built (:mod:`depthlib.compose.analysis`), not stored.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pandas as pd
import torch

from depthlib import results
from depthlib.compose import rhm
from depthlib.compose.diagnostics import diagnose
from depthlib.compose.network import FAMILIES, MIN_DEPTH, GrammarModelConfig, build_model, parameter_counts
from depthlib.compose.train import PROBE_STREAM, GrammarTrainConfig, held_out, train
from depthlib.contract import from_dict, to_dict
from depthlib.errors import InputError
from depthlib.validate import distinct, int_in_range

EXPERIMENT = "compose-rhm"
UNITS = "units"
UNIT_TABLES = ("members", "curves", "layers", "lags", "clusters", "edits")


@dataclass(frozen=True)
class ComposeConfig:
    """A run: the grammar, the families and depths, the replicates, the model width and the training."""

    profile: str
    grammar: rhm.RHMConfig = field(default_factory=rhm.RHMConfig)
    families: tuple = FAMILIES
    depths: tuple = (1, 2, 3, 4, 6, 8)       # effective depths; a family trains those ≥ its minimum (looped: 3)
    seeds: tuple = (0, 1, 2)
    model: GrammarModelConfig = field(default_factory=GrammarModelConfig)
    train: GrammarTrainConfig = field(default_factory=GrammarTrainConfig)
    n_probe: int = 512                        # probe sequences (stream 2) for the diagnostics
    n_permutations: int = 4

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ComposeConfig":
        return from_dict(cls, d)

    def validate(self) -> "ComposeConfig":
        self.grammar.validate()
        self.model.validate()
        self.train.validate()
        distinct("families", self.families, at_least=1)
        for f in self.families:
            if f not in FAMILIES:
                raise InputError(f"family must be one of {', '.join(FAMILIES)}, got {f!r}")
        distinct("depths", self.depths, at_least=1)
        for d in self.depths:
            int_in_range("depth", d, 1, 256)
        distinct("seeds", self.seeds, at_least=1)
        for s in self.seeds:
            int_in_range("seed", s, 0, 2**20)
        int_in_range("n_probe", self.n_probe, 8, 1 << 20)
        int_in_range("n_permutations", self.n_permutations, 1, 1000)
        if not self.units():
            raise InputError("no family has a depth to train (looped members need depth ≥ 3)")
        return self

    def family_depths(self, family: str) -> list[int]:
        return sorted(int(d) for d in self.depths if d >= MIN_DEPTH[family])

    def units(self) -> list[tuple[int, str, int]]:
        """(seed, family, depth) of every member: each replicate's families in turn, shallowest first."""
        return [(int(s), f, d) for s in self.seeds for f in self.families for d in self.family_depths(f)]


def unit_name(seed: int, family: str, depth: int) -> str:
    return f"s{seed}_{family}_d{depth:03d}"


def init_seed(seed: int, family: str, depth: int) -> int:
    """The initialisation seed of a member: distinct per (replicate, family, depth), fixed per config."""
    return int(seed) * 1_000_003 + FAMILIES.index(family) * 10_007 + int(depth)


def train_member(cfg: ComposeConfig, grammar: rhm.Grammar, seed: int, family: str, depth: int, data, probe,
                 on_step=None, stop_at: int | None = None) -> dict:
    """Train and diagnose one member; its unit tables (or, with ``stop_at``, the curve up to that step)."""
    g = cfg.grammar
    model = build_model(cfg.model, family, depth, g.v, g.length, init_seed(seed, family, depth))
    rec = train(model, grammar, cfg.train, seed=seed, data=data, on_step=on_step, stop_at=stop_at)
    key = {"family": family, "depth": depth, "seed": seed}
    if stop_at is not None:
        return {"curves": rec["curve"].assign(**key)}
    diag = diagnose(model, probe[0], float(probe[1].mean()), n_permutations=cfg.n_permutations, seed=seed)
    member = {**key, **parameter_counts(model), "val_loss": float(rec["val_per_seq"].mean()),
              "bayes": float(rec["bayes_per_seq"].mean()),
              "excess": float(rec["val_per_seq"].mean() - rec["bayes_per_seq"].mean()),
              "rel_improvement": rec["rel_improvement"], "rel_improvement_excess": rec["rel_improvement_excess"],
              "converged": rec["converged"], "seconds": rec["seconds"], **diag["summary"]}
    return {"members": pd.DataFrame([member]), "curves": rec["curve"].assign(**key),
            **{name: diag[name].assign(**key) for name in ("layers", "lags", "clusters", "edits")}}


def open_compose_run(cfg: ComposeConfig) -> results.Run:
    return results.open_run(EXPERIMENT, cfg.validate().to_dict())


def run_compose(cfg: ComposeConfig, *, force: bool = False, progress: bool = True) -> results.Run:
    """Compute (or resume, or load) the run of ``cfg`` in the local results cache: every member in turn, its tables
    saved as it finishes, then the merged tables and the fits."""
    from tqdm.auto import tqdm

    cfg.validate()
    torch.set_num_threads(1)
    with results.computing(EXPERIMENT, cfg.to_dict(), profile=cfg.profile, code=(f"{__name__}:run_compose",),
                           seed=int(cfg.seeds[0]), device="cpu", force=force,
                           saves="every finished member's tables are in {folder}/units", unit_marker="members") as job:
        if job.complete:
            return job.run
        run = job.run
        store = results.Run(EXPERIMENT, run.config, run.path / UNITS)
        store.path.mkdir(parents=True, exist_ok=True)
        grammar = rhm.make_grammar(cfg.grammar)
        data = held_out(grammar, cfg.train.n_held_out)
        probe = held_out(grammar, cfg.n_probe, PROBE_STREAM)
        todo = [u for u in cfg.units() if not store.has(f"{unit_name(*u)}_members")]
        total = sum(d * cfg.train.steps for _, _, d in todo)
        bar = tqdm(total=total, unit="block-step", desc=f"{EXPERIMENT} {cfg.profile} ({len(todo)} members to train)",
                   disable=not progress, file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 30)
        for seed, family, depth in todo:
            name = unit_name(seed, family, depth)
            bar.set_postfix_str(name)
            tables = train_member(cfg, grammar, seed, family, depth, data, probe,
                                  on_step=lambda _s, _loss, d=depth: bar.update(d))
            for table in UNIT_TABLES[1:] + ("members",):          # members last: a member counts once it exists
                store.write_table(f"{name}_{table}", tables[table])
            job.save_progress()
        bar.close()
        merged = {t: pd.concat([store.table(f"{unit_name(*u)}_{t}") for u in cfg.units()], ignore_index=True)
                  for t in UNIT_TABLES}
        for t, df in merged.items():
            run.write_table(t, df)
        m = merged["members"]
        job.record(summary={"n_members": int(len(m)), "all_converged": bool(m["converged"].all()),
                            "max_rel_improvement": float(m["rel_improvement"].max()),
                            "bayes_loss": float(m["bayes"].mean()),
                            "train_seconds": float(m["seconds"].sum())})
    return results.Run.load(run.path)


__all__ = ["EXPERIMENT", "ComposeConfig", "init_seed", "open_compose_run", "run_compose",
           "train_member", "unit_name"]

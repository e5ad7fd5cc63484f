"""The hierarchy control's first run, on chapter 7's own transformer (:mod:`depthlib.compose.model`).

The control of :mod:`depthlib.compose.hierarchy` — the same grammar, tasks, families, depths, replicates, schedule,
certificate, diagnostics and fits — computed as one run whose members are chapter 7's own transformer (learned
positions, no rotary embedding) rather than chapter 6's model, the book's one stack. Kept while the run on chapter 6's
model is computed unit by unit; the chapter shows this one until then.

A member is a unit of work whose tables are written to ``units/`` as soon as it is done (``jobs`` worker processes,
one torch thread each), so an interrupted run resumes at the next member; the grammar's own tables are one more unit.
When every unit is done, the tables of :mod:`depthlib.compose.hierarchy` are written and the manifest records the
same checks.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from depthlib import results
from depthlib.compose import hierarchy, rhm, unseen
from depthlib.compose.certify import HeldOut, certify_member, train_stage
from depthlib.compose.diagnostics import diagnose
from depthlib.compose.hierarchy import MEMBER_TABLES, HierarchyConfig, held_out_sets, member_seed
from depthlib.compose.model import GrammarModelConfig, build_model, parameter_counts
from depthlib.compose.roots import root_edits
from depthlib.compose.train import TRAIN_STREAM
from depthlib.validate import int_in_range

EXPERIMENT = "compose-hierarchy"
UNITS = "units"
GRAMMAR_UNIT = "grammar"
GRAMMAR_TABLES = ("ngram", "root_bayes", "grammar")


@dataclass(frozen=True)
class OwnHierarchyConfig(HierarchyConfig):
    """:class:`depthlib.compose.hierarchy.HierarchyConfig` with chapter 7's own transformer."""

    model: GrammarModelConfig = field(default_factory=GrammarModelConfig)


def unit_name(seed: int, task: str, family: str, depth: int) -> str:
    return f"s{seed}_{task}_{family}_d{depth:03d}"



def build_member(cfg: OwnHierarchyConfig, seed: int, task: str, family: str, depth: int):
    """A member's transformer, initialised: a root classifier reads one position more (the last, which sees every
    leaf: :func:`depthlib.compose.roots.root_logits`)."""
    g = cfg.grammar
    return build_model(cfg.model, family, depth, g.v, g.length + (task == "root"), member_seed(seed, task, family, depth))



def train_member(cfg: OwnHierarchyConfig, held: HeldOut, probe: HeldOut, seed: int, task: str, family: str, depth: int,
                 *, device: str = "cpu", on_step=None) -> dict[str, pd.DataFrame]:
    """Train, certify and diagnose one member; its unit tables."""
    grammar = rhm.make_grammar(cfg.grammar)
    model = build_member(cfg, seed, task, family, depth).to(device)
    rec = certify_member(task, model, grammar, cfg.train, cfg.certificate, cfg.base(seed), held, on_step=on_step)
    model = rec["model"].cpu()
    key = {"task": task, "family": family, "depth": depth, "seed": seed}
    stages, final = rec["stages"], rec["final"]
    member = {**key, **parameter_counts(model), "val_loss": final["val_loss"],
              "bayes": float(held.bayes.mean()) if task == "leaf" else 0.0, "excess": final["excess"],
              "accuracy": final["accuracy"], "error": 1.0 - final["accuracy"] if task == "root" else np.nan,
              "certified_quantity": "excess" if task == "leaf" else "error", "certified": rec["certified"],
              "continuations": len(rec["gains"]), "last_gain": rec["gains"][-1] if rec["gains"] else np.nan,
              "gains": ", ".join(f"{x:+.4f}" for x in rec["gains"]),
              "best_stage": rec["best_stage"], "steps": rec["steps"],
              "samples": int((stages["sample_stop"] - stages["sample_start"]).sum()),
              "seconds": float(stages["seconds"].sum())}
    empty = pd.DataFrame()
    if task == "leaf":
        diag = diagnose(model, probe.leaves, float(probe.bayes.mean()), n_permutations=cfg.n_permutations, seed=seed)
        member.update(diag["summary"])
        extra = {name: diag[name] for name in ("layers", "lags", "clusters", "edits")}
    else:
        extra = {"layers": empty, "lags": empty, "clusters": empty,
                 "edits": root_edits(model, probe.leaves, probe.roots)}
    return {"members": pd.DataFrame([member]), "stages": stages.assign(**key), "curves": rec["curves"].assign(**key),
            **{name: (t.assign(**key) if len(t) else pd.DataFrame(columns=list(key))) for name, t in extra.items()}}



def _member_unit(cfg_dict: dict, held: HeldOut, probe: HeldOut, unit: tuple, store_path: str, device: str) -> str:
    """One member in a worker process (one torch thread): trained, its tables written to the store."""
    torch.set_num_threads(1)
    cfg = OwnHierarchyConfig.from_dict(cfg_dict)
    store = results.Run(EXPERIMENT, cfg_dict, Path(store_path))
    tables = train_member(cfg, held, probe, *unit, device=device)
    name = unit_name(*unit)
    for table in MEMBER_TABLES:                                 # members last: a member counts once it exists
        store.write_table(f"{name}_{table}", tables[table])
    return name



def first_curve(cfg: OwnHierarchyConfig, stop_at: int) -> pd.DataFrame:
    """The main stage of the run's first member up to the evaluation at ``stop_at`` (a replay)."""
    seed, task, family, depth = cfg.units()[0]
    held, _ = held_out_sets(cfg)
    model = build_member(cfg, seed, task, family, depth)
    curve, _ = train_stage(task, model, rhm.make_grammar(cfg.grammar), cfg.train, cfg.base(seed), held,
                           stop_at=stop_at)
    return curve.assign(task=task, family=family, depth=depth, seed=seed, stage="main")



def run_hierarchy(cfg: OwnHierarchyConfig, *, jobs: int = 1, device: str = "cpu", force: bool = False,
                  progress: bool = True) -> results.Run:
    """Compute (or resume, or load) the run of ``cfg`` in the local results cache: the grammar's tables, then the
    members (``jobs`` at a time, deepest first so that the workers finish together), each saved as it finishes, then
    the merged tables, the exact held-out check and the fits."""
    from tqdm.auto import tqdm

    cfg.validate()
    int_in_range("jobs", jobs, 1, 256)
    torch.set_num_threads(1)
    with results.computing(EXPERIMENT, cfg.to_dict(), profile=cfg.profile, code=(f"{__name__}:run_hierarchy",),
                           seed=int(cfg.seeds[0]), device=device, force=force,
                           saves="every finished member's tables are in {folder}/units", unit_marker="members") as job:
        if job.complete:
            return job.run
        run = job.run
        store = results.Run(EXPERIMENT, run.config, run.path / UNITS)
        store.path.mkdir(parents=True, exist_ok=True)
        held, probe = held_out_sets(cfg)
        if not store.has(f"{GRAMMAR_UNIT}_grammar"):
            tables = hierarchy.grammar_tables(cfg, held)
            for table in GRAMMAR_TABLES:                        # ``grammar`` last: the unit's marker
                store.write_table(f"{GRAMMAR_UNIT}_{table}", tables[table])
            job.save_progress()
        todo = sorted((u for u in cfg.units() if not store.has(f"{unit_name(*u)}_members")),
                      key=lambda u: (-u[3], u[0], u[1], u[2]))
        bar = tqdm(total=len(todo), unit="member", desc=f"{EXPERIMENT} {cfg.profile}", disable=not progress,
                   file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 30)
        args = (cfg.to_dict(), held, probe)
        if jobs == 1 or len(todo) <= 1:
            for unit in todo:
                bar.set_postfix_str(unit_name(*unit))
                _member_unit(*args, unit, str(store.path), device)
                job.save_progress()
                bar.update()
        else:
            from joblib import Parallel, delayed
            for name in Parallel(n_jobs=min(jobs, len(todo)), backend="loky", batch_size=1,
                                 return_as="generator_unordered")(
                    delayed(_member_unit)(*args, u, str(store.path), device) for u in todo):
                bar.set_postfix_str(name)
                job.save_progress()
                bar.update()
        bar.close()
        merged = {t: hierarchy.concat_tables([store.table(f"{unit_name(*u)}_{t}") for u in cfg.units()])
                  for t in MEMBER_TABLES}
        merged.update({t: store.table(f"{GRAMMAR_UNIT}_{t}") for t in GRAMMAR_TABLES})
        members = merged["members"]
        merged["root_members"] = members[members["task"] == "root"].assign(ce=lambda m: m["excess"])[
            ["family", "depth", "seed", "n_params", "n_blocks", "accuracy", "error", "ce", "certified",
             "continuations", "gains", "steps", "samples"]].reset_index(drop=True)
        merged.update(hierarchy.fit_tables(cfg, members, merged["stages"]))
        grammar = rhm.make_grammar(cfg.grammar)
        check = unseen.held_out_overlap(grammar, held.leaves.numpy(),
                                        zip(merged["stages"]["sample_start"], merged["stages"]["sample_stop"]),
                                        TRAIN_STREAM)
        for t, df in merged.items():
            run.write_table(t, df)
        leaf = members[members["task"] == "leaf"]
        root = members[members["task"] == "root"]
        job.record(held_out_overlap=check["found"], held_out_replaced=int(held.replaced),
                   training_sequences=check["training_sequences"],
                   replicates=len(cfg.seeds), n_sequences=str(unseen.n_sequences(cfg.grammar)),
                   expected_overlap=unseen.expected_overlap(cfg.grammar, check["training_sequences"],
                                                            cfg.train.n_held_out),
                   ngram_samples=int(cfg.span), jobs=int(jobs),
                   summary={"n_members": int(len(members)), "n_certified": int(members["certified"].sum()),
                            "all_certified": bool(members["certified"].all()),
                            "bayes_loss": float(held.bayes.mean()),
                            "best_ngram_excess": float(merged["ngram"]["excess"].min()),
                            "min_leaf_excess": float(leaf["excess"].min()) if len(leaf) else None,
                            "max_root_accuracy": float(root["accuracy"].max()) if len(root) else None,
                            "train_seconds": float(members["seconds"].sum())})
    return results.Run.load(run.path)



def default_jobs() -> int:
    """One worker per core."""
    return os.cpu_count() or 1



__all__ = ["EXPERIMENT", "GRAMMAR_TABLES", "OwnHierarchyConfig", "build_member", "default_jobs", "first_curve",
           "run_hierarchy", "train_member", "unit_name"]

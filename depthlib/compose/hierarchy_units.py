"""Chapter 7's hierarchy control on chapter 6's language model, as a run made of committed units.

The control of :mod:`depthlib.compose.hierarchy` — the grammar whose held-out sequences are unseen and whose target
local statistics cannot solve, both tasks, the untied, looped and tied families at depths below and above L, every
member certified by the book's continuation rule — with every member built on **chapter 6's model**
(:mod:`depthlib.compose.network`: GPT-NeoX's parallel block, rotary positions, Pythia's initialisation), the one
transformer stack of the book, instead of chapter 7's own (:mod:`depthlib.compose.model`). The settings, the
grammar, the held-out and probe sets, the member seeds, the certificate, the diagnostics and the fits are
:mod:`depthlib.compose.hierarchy`'s; only the member's network differs (``model.arch`` in the settings).

It is computed by the book's units runner (:mod:`depthlib.units`): a **unit** is one replicate's members of one task
and family (:meth:`HierarchyLMConfig.cells`, the longest first), trained in its own resumable run — every finished
member's tables are one file in the unit's folder — and committed on its own, so that the run can be computed over
several sittings. The merge (:func:`merge`) adds the grammar's tables (n-gram baselines, the Bayes root classifier),
the fits after every round of continuations and the exact held-out check, and records in the manifest what
:func:`depthlib.compose.hierarchy.run_hierarchy` records: the same tables, the same numbers, another network.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from depthlib.compose import hierarchy, rhm, unseen
from depthlib.compose.certify import certify_member, train_stage
from depthlib.compose.diagnostics import diagnose
from depthlib.compose.hierarchy import MEMBER_TABLES, HierarchyConfig, held_out_sets, member_seed
from depthlib.compose.network import GrammarModelConfig, build_model, parameter_counts
from depthlib.compose.roots import root_edits
from depthlib.compose.train import TRAIN_STREAM

EXPERIMENT = "compose-hierarchy-lm"
UNITS = "compose-hierarchy-lm-units"
#: the order in which a unit's cells run: the longest first (measured on chapter 7's own network: a replicate's
#: next-leaf looped and tied members take about twice its untied ones, and the root members half as long)
_LONGEST_FIRST = {("leaf", "tied"): 0, ("leaf", "looped"): 1, ("leaf", "untied"): 2, ("root", "looped"): 3,
                  ("root", "tied"): 4, ("root", "untied"): 5}


@dataclass(frozen=True)
class HierarchyLMConfig(HierarchyConfig):
    """:class:`depthlib.compose.hierarchy.HierarchyConfig` with chapter 6's network (``model.arch``)."""

    model: GrammarModelConfig = field(default_factory=GrammarModelConfig)

    @property
    def seed(self) -> int:
        """The first replicate (the units runner records it)."""
        return int(self.seeds[0])

    def cells(self) -> list[dict]:
        """One unit per (replicate, task, family), the longest first."""
        cells = [{"seed": int(s), "task": t, "family": f} for s in self.seeds for t in self.tasks
                 for f in self.families if self.family_depths(f)]
        return sorted(cells, key=lambda c: (_LONGEST_FIRST[(c["task"], c["family"])], c["seed"]))


def build_member(cfg: HierarchyLMConfig, seed: int, task: str, family: str, depth: int):
    """A member's network, initialised: a root classifier reads one position more (the last, which sees every leaf:
    :func:`depthlib.compose.roots.root_logits`)."""
    g = cfg.grammar
    return build_model(cfg.model, family, depth, g.v, g.length + (task == "root"), member_seed(seed, task, family, depth))


def train_member(cfg: HierarchyLMConfig, held, probe, seed: int, task: str, family: str, depth: int, *,
                 device: str = "cpu") -> dict[str, pd.DataFrame]:
    """Train, certify and diagnose one member (as :func:`depthlib.compose.hierarchy.train_member`); its tables."""
    grammar = rhm.make_grammar(cfg.grammar)
    model = build_member(cfg, seed, task, family, depth).to(device)
    rec = certify_member(task, model, grammar, cfg.train, cfg.certificate, cfg.base(seed), held)
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
    empty = pd.DataFrame(columns=list(key))
    if task == "leaf":
        diag = diagnose(model, probe.leaves, float(probe.bayes.mean()), n_permutations=cfg.n_permutations, seed=seed)
        member.update(diag["summary"])
        extra = {name: diag[name] for name in ("layers", "lags", "clusters", "edits")}
    else:
        extra = {"layers": empty, "lags": empty, "clusters": empty,
                 "edits": root_edits(model, probe.leaves, probe.roots)}
    return {"members": pd.DataFrame([member]), "stages": stages.assign(**key), "curves": rec["curves"].assign(**key),
            **{name: (t.assign(**key) if len(t) else empty) for name, t in extra.items()}}


def train_unit(cfg: HierarchyLMConfig, cell: dict, load, save, say, device: str = "cpu") -> tuple[pd.DataFrame, ...]:
    """Every member of one unit (a replicate's members of one task and family), deepest first, each saved as it
    finishes (``load``/``save``: the units runner's, :mod:`depthlib.units`); its tables in :data:`MEMBER_TABLES`
    order."""
    held, probe = held_out_sets(cfg)
    done = {}
    for depth in sorted(cfg.family_depths(cell["family"]), reverse=True):
        tables = load("member", depth)
        if tables is None:
            say(f"depth {depth}")
            tables = train_member(cfg, held, probe, cell["seed"], cell["task"], cell["family"], depth, device=device)
            save("member", depth, tables)
        done[depth] = tables
    return tuple(_concat([done[d][name] for d in sorted(done)]) for name in MEMBER_TABLES)


def first_curve(cfg: HierarchyLMConfig, cell: dict, stop_at: int) -> pd.DataFrame:
    """The main stage of a unit's shallowest member up to the evaluation at ``stop_at`` (a replay)."""
    seed, task, family = cell["seed"], cell["task"], cell["family"]
    depth = min(cfg.family_depths(family))
    held, _ = held_out_sets(cfg)
    curve, _ = train_stage(task, build_member(cfg, seed, task, family, depth), rhm.make_grammar(cfg.grammar),
                           cfg.train, cfg.base(seed), held, stop_at=stop_at)
    return curve.assign(task=task, family=family, depth=depth, seed=seed, stage="main")


def merge(cfg: HierarchyLMConfig, t: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], dict]:
    """The run from its units' tables: the members' tables, the grammar's, ``root_members``, the fits
    (:func:`depthlib.compose.hierarchy.fit_tables`), and the manifest's checks (the exact held-out overlap, the
    replaced draws, the sequences drawn, the summary), as :func:`depthlib.compose.hierarchy.run_hierarchy` records
    them."""
    held, _ = held_out_sets(cfg)
    order = ["task", "family", "depth", "seed"]
    merged = {name: (t[name].sort_values(order, kind="stable").reset_index(drop=True) if len(t[name]) else t[name])
              for name in MEMBER_TABLES}
    merged.update(hierarchy.grammar_tables(cfg, held))
    members = merged["members"]
    merged["root_members"] = members[members["task"] == "root"].assign(ce=lambda m: m["excess"])[
        ["family", "depth", "seed", "n_params", "n_blocks", "accuracy", "error", "ce", "certified",
         "continuations", "gains", "steps", "samples"]].reset_index(drop=True)
    merged.update(hierarchy.fit_tables(cfg, members, merged["stages"]))
    check = unseen.held_out_overlap(rhm.make_grammar(cfg.grammar), held.leaves.numpy(),
                                    zip(merged["stages"]["sample_start"], merged["stages"]["sample_stop"]),
                                    TRAIN_STREAM)
    leaf, root = members[members["task"] == "leaf"], members[members["task"] == "root"]
    checks = dict(held_out_overlap=check["found"], held_out_replaced=int(held.replaced),
                  training_sequences=check["training_sequences"], replicates=len(cfg.seeds),
                  n_sequences=str(unseen.n_sequences(cfg.grammar)),
                  expected_overlap=unseen.expected_overlap(cfg.grammar, check["training_sequences"],
                                                           cfg.train.n_held_out),
                  ngram_samples=int(cfg.span),
                  summary={"n_members": int(len(members)), "n_certified": int(members["certified"].sum()),
                           "all_certified": bool(members["certified"].all()),
                           "bayes_loss": float(held.bayes.mean()),
                           "best_ngram_excess": float(merged["ngram"]["excess"].min()),
                           "min_leaf_excess": float(leaf["excess"].min()) if len(leaf) else None,
                           "max_root_accuracy": float(root["accuracy"].max()) if len(root) else None,
                           "train_seconds": float(members["seconds"].sum())})
    return merged, checks


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


__all__ = ["EXPERIMENT", "UNITS", "HierarchyLMConfig", "build_member", "first_curve", "merge", "train_member",
           "train_unit"]

"""The plans chapter 5 runs on every model: delete, reorder and parallelise blocks (predictions 1–4 of
:mod:`depthlib.interventions.predictions`).

(i) deletion: every block alone (the cost by position); k random middle blocks, ``draws`` times per k, plain and
    with the remaining middle updates rescaled by ℓ_m/(ℓ_m − k);
(ii) order, like with like: every deleted set of k blocks is also *reordered* in place (each block of the set moves
    to the next slot of the set, cyclically shifted by a random r: all k blocks move), so a reordering is compared
    with deleting exactly the blocks it moves; the same on sets drawn from the plateau of similar middle blocks
    (:func:`~depthlib.interventions.predictions.plateau`, chosen on the ranking documents); optionally the
    largest-k reorderings again with each moved block's update scaled by the stream norm at its new slot over the
    norm at its own (norm-matched), random permutations of the whole middle and its reversal;
(iii) parallel: g consecutive middle blocks on one input, updates summed, and the same groups averaged
    ("Transformer Layers as Painters"), at ``group_positions`` positions spread over the middle.

Every plan gets one row of metadata; identical plans reached by two rules are evaluated once (keyed by their text).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib.interventions import plan as P
from depthlib.interventions.predictions import mean_displacement, third
from depthlib.validate import distinct, int_in_range


@dataclass(frozen=True)
class SuiteConfig:
    """Which plans to run. Defaults are the toy controls' (cheap); the LM profiles are in chapter.PROFILES."""

    ks: tuple[int, ...] = (2, 4, 8)           # blocks deleted (and moved by the paired reorderings)
    draws: int = 10                           # random middle sets per k (the minimum)
    rescale: bool = True                      # also the rescaled deletions (prediction 1)
    reorder: bool = True                      # the paired reordering of every deleted set (prediction 3)
    each_block: bool = True                   # delete every block alone (the cost by position)
    plateau_k: int = 4                        # size of the sets reordered inside the plateau (0: none)
    plateau_draws: int = 10                   # ... and how many
    norm_matched: int = 10                    # largest-k reorderings also run norm-matched (0: none)
    permutations: int = 10                    # random orders of the whole middle (cost at large distance)
    reverse: bool = True                      # the whole middle reversed
    group_sizes: tuple[int, ...] = (2, 4, 8)  # parallel group sizes g (prediction 4)
    group_positions: int = 3                  # group positions per g, spread over the middle
    seed: int = 0                             # random sets, shifts and permutations

    def validate(self) -> "SuiteConfig":
        for k in distinct("ks", self.ks):
            int_in_range("k (blocks deleted)", k, 1)
        for g in distinct("group sizes", self.group_sizes):
            int_in_range("parallel group size", g, 2)
        for name in ("draws", "plateau_k", "plateau_draws", "norm_matched", "permutations", "group_positions"):
            int_in_range(name.replace("_", " "), getattr(self, name), 0)
        int_in_range("seed", self.seed, 0, 2**63 - 1)
        return self


def build_plans(n_blocks: int, cfg: SuiteConfig, norms: np.ndarray | None = None, plateau: list[int] | None = None
                ) -> tuple[dict[str, P.Plan], pd.DataFrame]:
    """({plan text: plan}, metadata) for a model of ``n_blocks`` blocks. ``norms``: the mean stream norm ‖h_i‖ at
    each block's input (ranking documents; needed for norm-matched plans); ``plateau``: its blocks ([]: none).

    Metadata columns: family (identity | delete | order | parallel), rule, scope (middle | plateau | block), k
    (blocks deleted or moved, or group size), start (first block), draw, rescale, blocks (the set, space-separated),
    distance (mean |π(i) − i| of a reordering), third (of the middle the set's mean falls in), pair (a deleted set's
    id, shared with its reordering), plan (its text)."""
    rng = np.random.default_rng(cfg.seed)
    mid = P.middle(n_blocks)
    plateau = list(plateau or [])
    plans: dict[str, P.Plan] = {}
    rows: list[dict] = []

    def add(plan: P.Plan, family: str, rule: str, blocks, *, scope: str = "middle", k: int | None = None, draw: int = 0,
            rescale: bool = False, distance: float = 0.0, pair: str = ""):
        text = plan.text()
        plans.setdefault(text, plan)
        blocks = [int(b) for b in blocks]
        rows.append(dict(family=family, rule=rule, scope=scope, k=len(blocks) if k is None else k, start=min(blocks, default=-1),
                         draw=draw, rescale=rescale, blocks=" ".join(map(str, blocks)), distance=float(distance),
                         third=third(blocks, n_blocks) if blocks and n_blocks > 2 else "", pair=pair, plan=text))

    def shifted(chosen: list[int]) -> list[int]:
        r = int(rng.integers(1, len(chosen)))                      # every block of the set moves
        return chosen[r:] + chosen[:r]

    def reordered(chosen: list[int], new: list[int], scales: dict[int, float] | None = None) -> P.Plan:
        where = dict(zip(chosen, new))
        return P.sequence(n_blocks, [where.get(b, b) for b in range(n_blocks)], scales)

    add(P.identity(n_blocks), "identity", "identity", [], k=0)
    if cfg.each_block and n_blocks > 1:
        for b in range(n_blocks):
            add(P.delete(n_blocks, [b]), "delete", "each", [b], scope="block")
    largest = max((k for k in cfg.ks if k < len(mid)), default=None)
    matched = 0
    for k in (k for k in cfg.ks if k < len(mid)):
        for d in range(cfg.draws):
            chosen = sorted(int(b) for b in rng.choice(mid, size=k, replace=False))
            pair = f"middle-{k}-{d}"
            add(P.delete(n_blocks, chosen), "delete", "random", chosen, draw=d, pair=pair)
            if cfg.rescale:
                add(P.delete(n_blocks, chosen, rescale=True), "delete", "random", chosen, draw=d, rescale=True, pair=pair)
            if cfg.reorder and k >= 2:
                new = shifted(chosen)
                dist = mean_displacement(new)
                add(reordered(chosen, new), "order", "shift", chosen, draw=d, distance=dist, pair=pair)
                if k == largest and matched < cfg.norm_matched and norms is not None:
                    scales = {b: float(norms[s] / norms[b]) for s, b in zip(chosen, new)}
                    add(reordered(chosen, new, scales), "order", "shift-norm", chosen, draw=d, distance=dist, pair=pair)
                    matched += 1
    if cfg.plateau_k >= 2 and len(plateau) > cfg.plateau_k:
        for d in range(cfg.plateau_draws):
            chosen = sorted(int(b) for b in rng.choice(plateau, size=cfg.plateau_k, replace=False))
            new, pair = shifted(chosen), f"plateau-{cfg.plateau_k}-{d}"
            add(P.delete(n_blocks, chosen), "delete", "random", chosen, scope="plateau", draw=d, pair=pair)
            add(reordered(chosen, new), "order", "shift", chosen, scope="plateau", draw=d,
                distance=mean_displacement(new), pair=pair)
    if len(mid) >= 2:
        if cfg.reverse:
            add(P.reorder(n_blocks, mid, mid[::-1]), "order", "reverse", mid, distance=mean_displacement(mid[::-1]))
        for d in range(cfg.permutations):
            new = [int(b) for b in rng.permutation(mid)]
            add(P.reorder(n_blocks, mid, new), "order", "permutation", mid, draw=d, distance=mean_displacement(new))
    for g in (g for g in cfg.group_sizes if g <= len(mid)):
        starts = sorted({int(round(s)) for s in np.linspace(mid[0], mid[-1] - g + 1, max(cfg.group_positions, 1))})
        for start in starts if cfg.group_positions else []:
            group = list(range(start, start + g))
            add(P.parallel(n_blocks, group, "sum"), "parallel", "sum", group)
            add(P.parallel(n_blocks, group, "mean"), "parallel", "mean", group)
    return plans, pd.DataFrame(rows)

"""The plans chapter 5 runs on every model: delete, reorder and parallelise blocks (ensemble predictions (i)–(iii)).

(i) deletion: every block alone; k blocks by Gromov et al.'s rule, by ShortGPT's order, as random middle subsets
    (several draws), the first k and the last k; the middle rules also with the remaining middle updates rescaled
    by ℓ_m/(ℓ_m − k);
(ii) order: the middle blocks reversed, random permutations of them, adjacent swaps spread over the middle;
(iii) parallel: g consecutive middle blocks on one input, updates summed, at non-overlapping positions across the
    middle; and the same groups averaged ("Transformer Layers as Painters").

Every plan gets one row of metadata; identical plans reached by two rules are evaluated once (keyed by their text).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib.interventions import plan as P
from depthlib.interventions.rankings import gromov_blocks, shortgpt_blocks
from depthlib.validate import distinct, int_in_range


@dataclass(frozen=True)
class SuiteConfig:
    """Which plans to run. Defaults are the ``cpu`` profile's (sized for 2 cores, see chapter.PROFILES)."""

    ks: tuple[int, ...] = (1, 2, 4, 8)        # numbers of blocks deleted (kept below the number of middle blocks)
    draws: int = 3                            # random middle subsets per k (a band, not one lucky draw)
    rescale: bool = True                      # also the rescaled deletions (keep the total middle step)
    each_block: bool = True                   # delete every block alone (the per-block cost profile)
    permutations: int = 10                    # random orders of all middle blocks (a distribution)
    swaps: int = 6                            # adjacent swaps, spread evenly over the middle
    group_sizes: tuple[int, ...] = (2, 4, 8)  # parallel group sizes g
    seed: int = 0                             # random subsets and permutations

    def validate(self) -> "SuiteConfig":
        for k in distinct("ks", self.ks):
            int_in_range("k (blocks deleted)", k, 1)
        for g in distinct("group sizes", self.group_sizes):
            int_in_range("parallel group size", g, 2)
        int_in_range("draws", self.draws, 0)
        int_in_range("permutations", self.permutations, 0)
        int_in_range("swaps", self.swaps, 0)
        int_in_range("seed", self.seed, 0, 2**63 - 1)
        return self


def build_plans(n_blocks: int, cfg: SuiteConfig, distances: pd.DataFrame, influence: pd.DataFrame
                ) -> tuple[dict[str, P.Plan], pd.DataFrame]:
    """({plan text: plan}, metadata) for a model of ``n_blocks`` blocks. Metadata columns: family (identity |
    delete | order | parallel), rule, k (blocks deleted or group size), start, draw, rescale, plan (its text)."""
    rng = np.random.default_rng(cfg.seed)
    mid = P.middle(n_blocks)
    plans: dict[str, P.Plan] = {}
    rows: list[dict] = []

    def add(plan: P.Plan, family: str, rule: str, k: int = 0, start: int = -1, draw: int = 0, rescale: bool = False):
        text = plan.text()
        plans.setdefault(text, plan)
        rows.append(dict(family=family, rule=rule, k=k, start=start, draw=draw, rescale=rescale, plan=text))

    add(P.identity(n_blocks), "identity", "identity")
    if cfg.each_block and n_blocks > 1:
        for b in range(n_blocks):
            add(P.delete(n_blocks, [b]), "delete", "each", 1, b)
    for k in (k for k in cfg.ks if k < len(mid)):
        chosen = {"gromov": gromov_blocks(distances, k), "shortgpt": shortgpt_blocks(influence, k),
                  "first": list(range(k)), "last": list(range(n_blocks - k, n_blocks))}
        for rule, blocks in chosen.items():
            add(P.delete(n_blocks, blocks), "delete", rule, k, blocks[0])
        subsets = [sorted(rng.choice(mid, size=k, replace=False).tolist()) for _ in range(cfg.draws)]
        for d, blocks in enumerate(subsets):
            add(P.delete(n_blocks, blocks), "delete", "random", k, blocks[0], d)
        if cfg.rescale:
            for rule in ("gromov", "shortgpt"):
                add(P.delete(n_blocks, chosen[rule], rescale=True), "delete", rule, k, chosen[rule][0], rescale=True)
            for d, blocks in enumerate(subsets):
                add(P.delete(n_blocks, blocks, rescale=True), "delete", "random", k, blocks[0], d, rescale=True)
    if len(mid) >= 2:
        add(P.reorder(n_blocks, mid, mid[::-1]), "order", "reverse", len(mid), mid[0])
        for d in range(cfg.permutations):
            add(P.reorder(n_blocks, mid, rng.permutation(mid).tolist()), "order", "permutation", len(mid), mid[0], d)
        starts = mid[:-1]
        for i in sorted({starts[int(j)] for j in np.linspace(0, len(starts) - 1, min(cfg.swaps, len(starts)))}
                        if cfg.swaps else []):
            add(P.reorder(n_blocks, [i, i + 1], [i + 1, i]), "order", "swap", 2, i)
    for g in (g for g in cfg.group_sizes if g <= len(mid)):
        for start in range(mid[0], mid[-1] - g + 2, g):
            group = list(range(start, start + g))
            add(P.parallel(n_blocks, group, "sum"), "parallel", "sum", g, start)
            add(P.parallel(n_blocks, group, "mean"), "parallel", "mean", g, start)
    return plans, pd.DataFrame(rows)

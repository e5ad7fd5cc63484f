"""What a depth series costs and how much data each member gets: parameters, tokens per parameter, epochs, time.

Chinchilla's compute-optimal ratio (Hoffmann et al. 2022) is about 20 training tokens per parameter, parameters
counted with the embeddings (as Chinchilla counts them; Kaplan et al. 2020 leave them out, and both counts are
given here). A member trained on fewer tokens per parameter than that is far from its converged loss, which the
paper's α_ℓ (§3, fitted to converged Chinchilla runs) assumes; the converged series takes 20 at the deepest member (the largest,
so the one with the fewest tokens per parameter) as a floor to check.

* :func:`member_budget` — per depth: parameters (counted on the built model, :func:`depthlib.lm.model.parameter_counts`),
  tokens of the main training, tokens per parameter (all, non-embedding), epochs of the training stream, FLOPs;
* :func:`floor` — whether the deepest member meets the ratio;
* :func:`estimate_wall` — wall time of the members on ``workers`` one-thread processes from measured seconds per
  optimiser step (a line a + b·ℓ through timed slices), scheduled deepest first as the run schedules them.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
import pandas as pd

from depthlib.errors import InputError
from depthlib.lm.model import ModelConfig, build_model, flops_per_token, parameter_counts

#: Chinchilla's compute-optimal training tokens per parameter (Hoffmann et al. 2022), the floor the converged series checks.
CHINCHILLA_TOKENS_PER_PARAMETER = 20.0


def member_budget(model: ModelConfig, depths, vocab_size: int, tokens: int,
                  train_tokens: int | None = None) -> pd.DataFrame:
    """One row per depth: depth, n_params, n_embedding, n_non_embedding (counted on the model built at
    ``vocab_size``), tokens (of the main training), tokens_per_parameter (all parameters, as Chinchilla),
    tokens_per_non_embedding (as Kaplan), epochs (tokens / ``train_tokens`` of the training stream, NaN when not
    given) and flop (training FLOPs, :func:`depthlib.lm.model.flops_per_token` × tokens)."""
    rows = []
    for depth in sorted(int(d) for d in depths):
        counts = parameter_counts(build_model(model, depth, vocab_size, seed=0))
        rows.append({"depth": depth, **counts, "tokens": int(tokens),
                     "tokens_per_parameter": tokens / counts["n_params"],
                     "tokens_per_non_embedding": tokens / counts["n_non_embedding"],
                     "epochs": tokens / train_tokens if train_tokens else np.nan,
                     "flop": flops_per_token(model, depth, vocab_size) * tokens})
    return pd.DataFrame(rows)


def floor(budget: pd.DataFrame, ratio: float = CHINCHILLA_TOKENS_PER_PARAMETER) -> dict:
    """Whether the deepest member gets at least ``ratio`` tokens per parameter: depth, tokens_per_parameter, met."""
    deepest = budget.loc[budget["depth"].idxmax()]
    value = float(deepest["tokens_per_parameter"])
    return {"depth": int(deepest["depth"]), "tokens_per_parameter": value, "floor": ratio, "met": bool(value >= ratio)}


def step_seconds(timed: dict[int, float]) -> tuple[float, float]:
    """(a, b) of seconds per optimiser step ≈ a + b·ℓ, the least-squares line through measured {depth: s/step}
    (a member's step is its head and embedding, a, plus ℓ blocks at b each)."""
    if len(timed) < 2:
        raise InputError(f"a line through the timings needs two depths, got {sorted(timed)}")
    d = np.array(sorted(timed), dtype=float)
    s = np.array([timed[int(k)] for k in d])
    b, a = np.polyfit(d, s, 1)
    return float(a), float(b)


def estimate_wall(depths, seeds, steps: int, a: float, b: float, *, workers: int = 2,
                  eval_share: float = 0.0) -> dict:
    """Wall time (s) of training every (depth, seed) member for ``steps`` optimiser steps at a + b·ℓ seconds per
    step (× 1 + ``eval_share`` for evaluations), the members handed out deepest first to ``workers`` one-thread
    processes (an idle worker takes the next): wall_s, member_s (summed over members), per_member ({depth: s})."""
    if workers < 1:
        raise InputError(f"workers must be >= 1, got {workers}")
    per = {int(d): (a + b * d) * steps * (1.0 + eval_share) for d in depths}
    jobs = sorted(((per[int(d)], int(d)) for d in depths for _ in seeds), reverse=True)
    finish = [0.0] * min(workers, max(len(jobs), 1))
    heapq.heapify(finish)
    for cost, _ in jobs:
        heapq.heappush(finish, heapq.heappop(finish) + cost)
    return {"wall_s": max(finish) if jobs else 0.0, "member_s": sum(c for c, _ in jobs), "per_member": per,
            "workers": workers, "steps": int(steps)}


def steps_for(tokens_per_parameter: float, n_params: int, tokens_per_step: int) -> int:
    """Optimiser steps that give a member of ``n_params`` parameters ``tokens_per_parameter`` tokens each."""
    return math.ceil(tokens_per_parameter * n_params / tokens_per_step)


__all__ = ["CHINCHILLA_TOKENS_PER_PARAMETER", "estimate_wall", "floor", "member_budget", "step_seconds", "steps_for"]

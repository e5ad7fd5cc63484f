"""Position-specific n-gram baselines: what local statistics alone achieve on the random hierarchy model's next leaf.

Cagnetta, Petrini, Tomasini, Favero & Wyart (Phys. Rev. X 14, 031001, 2024) show that the random hierarchy model's
leaves carry its hierarchy in their correlations, and that the correlations a few leaves wide weaken as the number m
of synonymous rules grows against the number v of symbols. Chapter 7's positive control needs a target that local
statistics do **not** solve, or a shallow network's low loss says nothing about composition. This module measures it:

At every leaf position t a table of the next leaf's frequencies given the ``c`` leaves before it (``c`` = 0 … T − 1,
fewer at the first positions: the **position-specific n-gram** of order c + 1), counted on the training sequences and
evaluated on the held-out set as excess loss over the exact Bayes loss (:func:`depthlib.compose.rhm.bayes_nll`). With
unlimited samples the table of the whole prefix (c = T − 1) *is* the Bayes predictor (every sequence is equally
likely); with the samples a network sees, long contexts are mostly unseen and the table falls back on shorter ones.

**Smoothing**: interpolated back-off (a hierarchical Dirichlet prior; shapes ``(n, v)`` per position)::

    P_c(x | x_{t−c} … x_{t−1}) = (n(context, x) + β · P_{c−1}(x | x_{t−c+1} … x_{t−1})) / (n(context) + β),
    P_{−1}(x) = 1 / v,

one β per order, chosen from :data:`BETAS` on a validation split (tables from the first nine tenths of the training
sequences, loss on the last tenth: the held-out set is never used to tune), then the tables are counted again on all
of them. The baseline is thus as strong as a table of that width can be made without seeing the held-out set.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib.errors import InputError

#: the back-off weights tried on the validation split
BETAS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: the share of the training sequences held back to choose β
VALIDATION_FRACTION = 0.1


def _context_ids(x: np.ndarray, t: int, depth: int) -> list[np.ndarray]:
    """Dense ids (n,) of the contexts x[:, t−c : t] for c = 0 … min(depth, t), shared by every row of ``x`` (n, T):
    two rows get the same id at order c exactly when their c leaves before t are equal."""
    ids = [np.zeros(len(x), dtype=np.int64)]
    for c in range(1, min(depth, t) + 1):
        key = x[:, t - c] * (int(ids[-1].max()) + 1) + ids[-1]          # (leaf t−c, context of order c − 1)
        ids.append(np.unique(key, return_inverse=True)[1].reshape(-1))
    return ids


def position_nll(x: np.ndarray, n_train: int, v: int, depth: int, betas) -> np.ndarray:
    """(len(betas), depth + 1, n_eval): the mean over positions t of −log P_c(x_t | its c previous leaves) of every row
    ``x[n_train:]``, tables counted on the rows ``x[:n_train]``, for every β and context size c = 0 … ``depth`` (at
    position t the context is min(c, t) leaves: the whole prefix)."""
    x = np.asarray(x, dtype=np.int64)
    n, T = x.shape
    b = np.asarray(betas, dtype=float)[:, None, None]                     # (nβ, 1, 1)
    out = np.zeros((len(b), depth + 1, n - n_train))
    for t in range(T):
        target, seen = x[n_train:, t], x[:n_train, t]
        probs = np.full((len(b), n - n_train, v), 1.0 / v)                # P_{−1}: uniform
        ids = _context_ids(x, t, depth)
        for c, cid in enumerate(ids):
            k = int(cid.max()) + 1
            counts = np.bincount(cid[:n_train] * v + seen, minlength=k * v).reshape(k, v)[cid[n_train:]]  # (n_eval, v)
            probs = (counts[None] + b * probs) / (counts.sum(1)[None, :, None] + b)
            nll = -np.log(np.take_along_axis(probs, np.broadcast_to(target[None, :, None], (len(b), len(target), 1)),
                                             2)[..., 0])                  # (nβ, n_eval)
            out[:, c:c + 1 if c < len(ids) - 1 else None] += nll[:, None]   # beyond the prefix: the whole prefix
    return out / T


def ngram_table(train: np.ndarray, held_out: np.ndarray, bayes: np.ndarray, v: int, contexts=None,
                betas=BETAS, validation: float = VALIDATION_FRACTION) -> pd.DataFrame:
    """One row per context size c (previous leaves; default 0 … T − 1): the β chosen on the validation split, the
    held-out loss of the table counted on every training sequence, the Bayes loss, the excess (nats per leaf) and its
    standard error over held-out sequences (paired with the Bayes loss of the same sequences). ``train`` (N, T),
    ``held_out`` (n, T) leaves; ``bayes`` (n, T) their exact −log P(x_t | x_<t)."""
    train, held_out = np.asarray(train, dtype=np.int64), np.asarray(held_out, dtype=np.int64)
    bayes = np.asarray(bayes, dtype=float)
    if train.ndim != 2 or held_out.ndim != 2 or train.shape[1] != held_out.shape[1] or bayes.shape != held_out.shape:
        raise InputError("n-gram tables need training and held-out leaves of one length and the held-out Bayes losses")
    T = train.shape[1]
    contexts = list(range(T)) if contexts is None else sorted({int(c) for c in contexts})
    if not contexts or min(contexts) < 0 or max(contexts) > T - 1:
        raise InputError(f"n-gram contexts must lie in 0 … {T - 1}, got {contexts}")
    n_fit = int(round(len(train) * (1.0 - validation)))
    if not 0 < n_fit < len(train) or not betas:
        raise InputError(f"{len(train)} training sequences cannot be split for validation ({validation:g})")
    depth = max(contexts)
    val = position_nll(train, n_fit, v, depth, betas).mean(axis=2)                    # (nβ, depth + 1)
    test = position_nll(np.concatenate([train, held_out]), len(train), v, depth, betas)   # (nβ, depth + 1, n)
    rows = []
    for c in contexts:
        i = int(np.argmin(val[:, c]))
        diff = test[i, c] - bayes.mean(1)                                     # (n,) per-sequence excess
        rows.append({"context": c, "order": c + 1, "beta": float(betas[i]), "validation_loss": float(val[i, c]),
                     "loss": float(test[i, c].mean()), "bayes": float(bayes.mean()), "excess": float(diff.mean()),
                     "excess_se": float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else np.nan,
                     "n_train": int(len(train)), "n_held_out": int(len(held_out))})
    return pd.DataFrame(rows)


__all__ = ["BETAS", "VALIDATION_FRACTION", "ngram_table", "position_nll"]

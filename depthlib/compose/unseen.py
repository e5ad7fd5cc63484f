"""Held-out sequences that are unseen: how many distinct sequences a grammar has, and an exact count of the held-out
sequences that occur in the training stream.

A random hierarchy model (Cagnetta et al., Phys. Rev. X 14, 031001, 2024; :mod:`depthlib.compose.rhm`) with
unambiguous rules derives every sequence from exactly one tree, and every tree has the same probability: a root among
v, one of m rules at each of the Σ_{k<L} s^k internal nodes. So it has exactly

    Ω = v · m^((s^L − 1)/(s − 1))

distinct sequences, all equally likely, and N training draws and n held-out draws share about n·N/Ω sequences. With
(v, m, s, L) = (8, 2, 2, 4) (chapter 7's first grammar) Ω = 262 144: a member's 128 000 draws cover 39 % of it and so
do the held-out set's. The held-out check here is **exact**: every training sequence any member saw (sample indices
of the training stream, regenerated from their index) is compared byte for byte with the held-out set. And since a
run knows in advance every training index any member may draw, its held-out set is drawn among the sequences none of
them is (:func:`unseen_indices`): with Ω ≫ the draws that replaces a fraction of a sequence in expectation, and the
check after training confirms 0 instead of leaving it to chance.
"""
from __future__ import annotations

import itertools

import numpy as np

from depthlib.compose import rhm
from depthlib.errors import InputError


def n_sequences(cfg: rhm.RHMConfig) -> int:
    """Ω, the number of distinct sequences of grammar ``cfg`` (an exact integer)."""
    nodes = sum(cfg.s ** k for k in range(cfg.L))                      # internal nodes, each with m rules
    return int(cfg.v) * int(cfg.m) ** nodes


def expected_overlap(cfg: rhm.RHMConfig, n_train: int, n_held_out: int) -> float:
    """Expected number of held-out sequences found among ``n_train`` independent uniform draws: n·(1 − (1 − 1/Ω)^N)."""
    omega = n_sequences(cfg)
    return float(n_held_out * -np.expm1(n_train * np.log1p(-1.0 / omega)))


def _rows(a: np.ndarray) -> np.ndarray:
    """Each row of ``a`` (n, T) as one opaque value (its bytes), for exact comparison."""
    a = np.ascontiguousarray(a, dtype=np.int64)
    return a.view(np.dtype((np.void, a.itemsize * a.shape[1]))).ravel()


def merge_ranges(ranges) -> list[tuple[int, int]]:
    """The union of half-open index ranges [start, stop), as sorted disjoint ranges."""
    out: list[list[int]] = []
    for start, stop in sorted((int(a), int(b)) for a, b in ranges if int(b) > int(a)):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], stop)
        else:
            out.append([start, stop])
    return [(a, b) for a, b in out]


def seen(grammar: rhm.Grammar, held_out: np.ndarray, ranges, stream: int = 0, chunk: int = 65_536) -> tuple[np.ndarray, int]:
    """(n,) whether each row of ``held_out`` (n, T) occurs among the training sequences of ``stream`` at the sample
    indices in ``ranges`` ([start, stop) pairs; overlapping ranges count once), compared exactly, and the number of
    training draws compared."""
    held = _rows(held_out)
    if held.size == 0:
        raise InputError("the held-out set is empty")
    found = np.zeros(len(held), dtype=bool)
    n_seen = 0
    for start, stop in merge_ranges(ranges):
        for a in range(start, stop, chunk):
            b = min(a + chunk, stop)
            found |= np.isin(held, _rows(rhm.sample(grammar, np.arange(a, b), stream)))
            n_seen += b - a
    return found, n_seen


def held_out_overlap(grammar: rhm.Grammar, held_out: np.ndarray, ranges, stream: int = 0,
                     chunk: int = 65_536) -> dict:
    """How many held-out sequences (rows of ``held_out``, (n, T)) occur among the training sequences of ``stream``
    at the sample indices in ``ranges`` ([start, stop) pairs; overlapping ranges count once), compared exactly.
    Returns ``found`` (distinct held-out rows seen in training: a held-out sequence drawn twice counts once) and
    ``training_sequences`` (the draws compared)."""
    held = _rows(held_out)
    found, n_seen = seen(grammar, held_out, ranges, stream, chunk)
    return {"found": int(len(np.unique(held[found]))), "training_sequences": int(n_seen)}


def unseen_indices(grammar: rhm.Grammar, n: int, held_stream: int, ranges, train_stream: int = 0,
                   max_rounds: int = 100) -> tuple[np.ndarray, int]:
    """(n,) sample indices of ``held_stream`` whose sequences occur nowhere in the training draws ``ranges`` of
    ``train_stream``, and how many draws were replaced: the first n indices, each one whose sequence some member
    may train on replaced by the next unused index, checked again, until none is. The held-out set is then a uniform
    draw from the sequences no member trains on, so the exact check after training finds none by construction (a
    grammar with Ω ≫ the draws replaces about n·N/Ω of them, :func:`expected_overlap`)."""
    idx = np.arange(int(n))
    nxt, replaced = int(n), 0
    todo = np.ones(len(idx), dtype=bool)
    for _ in range(max_rounds):
        found, _ = seen(grammar, rhm.sample(grammar, idx[todo], held_stream), ranges, train_stream)
        if not found.any():
            return idx, replaced
        rows = np.flatnonzero(todo)[found]
        idx[rows] = np.arange(nxt, nxt + len(rows))
        nxt, replaced = nxt + len(rows), replaced + len(rows)
        todo[:] = False
        todo[rows] = True
    raise InputError(f"after {max_rounds} rounds some held-out draws still occur in training: the grammar has too "
                     "few sequences for a held-out set that no member trains on")


def all_sequences(grammar: rhm.Grammar, limit: int = 1_000_000) -> tuple[np.ndarray, np.ndarray]:
    """Every derivation of a small grammar, once: (leaves (Ω, T), roots (Ω,)), all equally likely. Refused when
    Ω exceeds ``limit``."""
    cfg = grammar.cfg
    if n_sequences(cfg) > limit:
        raise InputError(f"the grammar has {n_sequences(cfg)} sequences, more than {limit} to enumerate")
    symbols = np.arange(cfg.v)[:, None]                                # (n, width) level-k symbols
    roots = np.arange(cfg.v)
    for k in range(cfg.L):
        width = symbols.shape[1]
        picks = np.array(list(itertools.product(range(cfg.m), repeat=width)), dtype=np.int64)   # (m^width, width)
        children = grammar.rules[k][symbols[:, None, :], picks[None, :, :]]                  # (n, m^width, width, s)
        symbols = children.reshape(-1, width * cfg.s)
        roots = np.repeat(roots, len(picks))
    return symbols, roots


__all__ = ["all_sequences", "expected_overlap", "held_out_overlap", "merge_ranges", "n_sequences", "seen",
           "unseen_indices"]

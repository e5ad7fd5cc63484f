"""The random hierarchy model (Cagnetta, Petrini, Tomasini, Favero & Wyart, Phys. Rev. X 14, 031001, 2024).

A target with known hierarchy and unlimited fresh samples, the positive control of chapter 7 for the paper's claim
(§2.7, §5) that language models do not assemble their output compositionally.

**The grammar.** ``L`` levels, ``v`` symbols at every level, branching ``s``: each symbol of level k has ``m``
synonymous production rules, each an s-tuple of level-(k+1) symbols. The ``v·m`` right-hand sides of a level are
distinct s-tuples drawn without replacement from the ``v^s`` possible ones, so the rules are *unambiguous*: every
s-tuple is produced by at most one symbol (needs ``v·m ≤ v^s``), and a sequence of leaves parses to one tree.
**A sample** is drawn top-down: a root symbol uniformly among ``v``, then at every node one of its ``m`` rules
uniformly; the ``s^L`` leaves of level L are the sequence.

**Seeding by sample index.** Every random choice of sample ``i`` of stream ``stream`` is a hash (splitmix64) of
(grammar seed, stream, i, node), so a sample does not depend on which batch, worker or order produced it: training
draws indices ``step·batch … step·batch + batch − 1`` of stream 0, held-out sets come from other streams.

**The exact conditional loss.** Because the grammar is known, the Bayes-optimal next-leaf loss
−log P(x_t | x_<t) is computed exactly by the inside algorithm (:func:`bayes_nll`): the floor of any model's
next-token loss on these data, so a model's *excess* loss over it is measured directly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from depthlib.errors import InputError
from depthlib.validate import int_in_range

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class RHMConfig:
    """The grammar's parameters (v symbols per level, m rules per symbol, branching s, L levels) and its seed."""

    v: int = 8
    m: int = 2
    s: int = 2
    L: int = 4
    seed: int = 0

    def validate(self) -> "RHMConfig":
        int_in_range("v", self.v, 2, 1024)
        int_in_range("m", self.m, 1, 1024)
        int_in_range("s", self.s, 2, 16)
        int_in_range("L", self.L, 1, 12)
        int_in_range("seed", self.seed, 0, 2**31 - 1)
        if self.v * self.m > self.v ** self.s:
            raise InputError(f"unambiguous rules need v·m ≤ v^s, got v = {self.v}, m = {self.m}, s = {self.s}")
        if self.s ** self.L > 4096:
            raise InputError(f"sequences of s^L = {self.s ** self.L} leaves are too long (at most 4096)")
        return self

    @property
    def length(self) -> int:
        """Leaves per sequence, s^L."""
        return self.s ** self.L


@dataclass(frozen=True)
class Grammar:
    """The rules of one grammar: ``rules[k]`` (v, m, s) holds the children of every (symbol, rule) of level k
    (level 0 is the root); ``parent[k]`` (v^s,) maps an s-tuple's index (base v) to the symbol of level k that
    produces it (−1: none) and ``choice[k]`` to which of its m rules it is."""

    cfg: RHMConfig
    rules: tuple
    parent: tuple
    choice: tuple


def make_grammar(cfg: RHMConfig) -> Grammar:
    """The rules of grammar ``cfg``: at every level, v·m distinct s-tuples drawn without replacement."""
    cfg.validate()
    rng = np.random.default_rng([cfg.seed, 0x5A17])
    v, m, s = cfg.v, cfg.m, cfg.s
    rules, parents, choices = [], [], []
    weights = v ** np.arange(s - 1, -1, -1)
    for _ in range(cfg.L):
        picked = rng.choice(v ** s, size=v * m, replace=False)          # distinct right-hand sides
        tuples = (picked[:, None] // weights[None, :]) % v               # (v·m, s) digits base v
        rules.append(tuples.reshape(v, m, s).astype(np.int64))
        parent = np.full(v ** s, -1, dtype=np.int64)
        choice = np.full(v ** s, -1, dtype=np.int64)
        parent[picked] = np.repeat(np.arange(v), m)
        choice[picked] = np.tile(np.arange(m), v)
        parents.append(parent)
        choices.append(choice)
    return Grammar(cfg, tuple(rules), tuple(parents), tuple(choices))


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return x ^ (x >> np.uint64(31))


def _draws(seed: int, stream: int, index: np.ndarray, node: np.ndarray, n: int) -> np.ndarray:
    """Uniform integers in [0, n) for every (sample index, node): a hash of (seed, stream, index, node)."""
    with np.errstate(over="ignore"):
        key = _splitmix(np.uint64(seed) * np.uint64(0x100000001B3) + np.uint64(stream) + np.uint64(1))
        h = _splitmix(key ^ index.astype(np.uint64)[:, None])
        h = _splitmix(h ^ (node.astype(np.uint64)[None, :] * np.uint64(0x9E3779B97F4A7C15)))
    return (h % np.uint64(n)).astype(np.int64)


def sample(grammar: Grammar, index, stream: int = 0, *, with_tree: bool = False):
    """Samples ``index`` (an int array) of ``stream``: the leaves (n, s^L) as int64 symbols in [0, v); with
    ``with_tree`` also the list of every level's symbols (level 0: the root, (n, 1)) and the rule chosen at every
    node of levels 0 … L−1."""
    cfg = grammar.cfg
    index = np.asarray(index, dtype=np.int64).reshape(-1)
    symbols = _draws(cfg.seed, stream, index, np.array([0]), cfg.v)       # (n, 1) roots
    levels, chosen = [symbols], []
    offset = 1
    for k in range(cfg.L):
        width = symbols.shape[1]
        pick = _draws(cfg.seed, stream, index, np.arange(offset, offset + width), cfg.m)   # (n, width)
        offset += width
        symbols = grammar.rules[k][symbols, pick].reshape(len(index), width * cfg.s)
        levels.append(symbols)
        chosen.append(pick)
    return (symbols, levels, chosen) if with_tree else symbols


def parse(grammar: Grammar, leaves: np.ndarray):
    """Bottom-up parse of sequences of leaves (n, s^L): (levels, choices) as :func:`sample` returns them, with −1
    where a tuple has no producing rule (a sequence the grammar cannot derive)."""
    cfg = grammar.cfg
    symbols = np.asarray(leaves, dtype=np.int64)
    weights = cfg.v ** np.arange(cfg.s - 1, -1, -1)
    levels, choices = [symbols], []
    for k in reversed(range(cfg.L)):
        n, width = symbols.shape
        groups = symbols.reshape(n, width // cfg.s, cfg.s)
        bad = (groups < 0).any(-1)
        code = (np.where(groups < 0, 0, groups) * weights).sum(-1)
        symbols = np.where(bad, -1, grammar.parent[k][code])
        choices.insert(0, np.where(bad | (symbols < 0), -1, grammar.choice[k][code]))
        levels.insert(0, symbols)
    return levels, choices


def bayes_nll(grammar: Grammar, leaves: np.ndarray) -> np.ndarray:
    """Exact −log P(x_t | x_<t) (nats) of every leaf of every sequence (n, s^L), by the inside algorithm: the
    probability of an observed prefix sums the grammar over every completion (an unobserved leaf's message is 1 for
    every symbol). Scaled per level so that long sequences do not underflow."""
    cfg = grammar.cfg
    x = np.asarray(leaves, dtype=np.int64)
    n, T = x.shape
    log_z = np.zeros((n, T + 1))
    for t in range(T + 1):                          # prefix of t observed leaves
        msg = np.ones((n, T, cfg.v))
        if t:
            msg[:, :t] = 0.0
            np.put_along_axis(msg[:, :t], x[:, :t, None], 1.0, axis=-1)
        node_log = np.zeros((n, T))                 # log of the factor each node's message was divided by
        for k in reversed(range(cfg.L)):
            width = msg.shape[1] // cfg.s
            groups = msg.reshape(n, width, cfg.s, cfg.v)
            r = grammar.rules[k]                                    # (v, m, s)
            prod = np.ones((n, width, cfg.v, cfg.m))
            for j in range(cfg.s):
                prod = prod * groups[:, :, j][:, :, r[:, :, j]]     # (n, width, v, m)
            msg = prod.mean(-1)                                      # (n, width, v)
            scale = msg.max(axis=2, keepdims=True)
            msg = msg / scale
            node_log = node_log.reshape(n, width, cfg.s).sum(-1) + np.log(scale[:, :, 0])
        log_scale = node_log[:, 0]
        log_z[:, t] = np.log(msg[:, 0].mean(-1)) + log_scale
    return -(log_z[:, 1:] - log_z[:, :-1])


__all__ = ["Grammar", "RHMConfig", "bayes_nll", "make_grammar", "parse", "sample"]

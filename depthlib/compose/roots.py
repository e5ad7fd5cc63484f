"""Root classification, the random hierarchy model's own task (Cagnetta, Petrini, Tomasini, Favero & Wyart, Phys.
Rev. X 14, 031001, 2024): predict the root symbol of a sequence from its leaves.

**The Bayes classifier.** The rules are unambiguous (:mod:`depthlib.compose.rhm`), so the whole sequence parses to
one tree and fixes its root: the Bayes accuracy from every leaf is 1 and the Bayes cross-entropy 0, and a member's
cross-entropy is its excess. From the first ``t`` leaves only, the posterior P(root | x_<t) comes from the inside
algorithm (:func:`root_log_likelihood`, an unobserved leaf's message is 1 for every symbol): how much of the sequence
the root needs (``root_bayes`` in a run) — none of it is local when the rules have many synonyms.

**The member.** A classifier is a grammar member (:class:`depthlib.compose.network.GrammarNet`, any family and
effective depth, unchanged) over T + 1 positions: its input is the start symbol and every leaf (the leaves followed by
one filler, which the model's shift drops), and its head's v outputs at the last position, whose causal attention
sees every leaf, are the root's logits (:func:`root_logits`). Chapter 5's edits are schedules here too
(:func:`root_edits`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy.special import logsumexp
from torch.nn import functional as F

from depthlib.compose import rhm
from depthlib.compose.network import GrammarNet
from depthlib.errors import InputError


def root_log_likelihood(grammar: rhm.Grammar, leaves: np.ndarray, observed: int | None = None) -> np.ndarray:
    """(n, v) log P(x_0 … x_{observed−1} | root = r) of sequences ``leaves`` (n, T), by the inside algorithm in log
    space (default ``observed``: every leaf). −inf where no derivation from r yields the observed leaves."""
    cfg = grammar.cfg
    x = np.asarray(leaves, dtype=np.int64)
    n, T = x.shape
    observed = T if observed is None else int(observed)
    if not 0 <= observed <= T:
        raise InputError(f"observed leaves must lie in 0 … {T}, got {observed}")
    log_msg = np.zeros((n, T, cfg.v))                                   # unobserved: log 1 for every symbol
    with np.errstate(divide="ignore"):
        log_msg[:, :observed] = np.log(np.eye(cfg.v)[x[:, :observed]])  # observed: log one-hot
    for k in reversed(range(cfg.L)):                                    # level k's symbols from their children
        width = log_msg.shape[1] // cfg.s
        children = log_msg.reshape(n, width, cfg.s, cfg.v)
        r = grammar.rules[k]                                            # (v, m, s)
        per_rule = sum(children[:, :, j][:, :, r[:, :, j]] for j in range(cfg.s))   # (n, width, v, m)
        log_msg = logsumexp(per_rule, axis=-1) - np.log(cfg.m)          # (n, width, v): uniform over the m rules
    return log_msg[:, 0]


def bayes_root(grammar: rhm.Grammar, leaves: np.ndarray, roots: np.ndarray, observed: int | None = None) -> dict:
    """The Bayes classifier of the root from the first ``observed`` leaves (uniform prior over the v roots): its
    accuracy (the MAP rule, ties broken at random: 1/|argmax| when the root is among them) and cross-entropy (nats),
    means over the sequences, and the per-sequence arrays ``correct`` and ``nll``."""
    ll = root_log_likelihood(grammar, leaves, observed)
    post = ll - logsumexp(ll, axis=1, keepdims=True)                    # log P(root | observed leaves)
    roots = np.asarray(roots, dtype=np.int64).reshape(-1)
    best = post >= post.max(axis=1, keepdims=True) - 1e-12
    correct = best[np.arange(len(roots)), roots] / best.sum(1)
    nll = -post[np.arange(len(roots)), roots]
    return {"accuracy": float(correct.mean()), "ce": float(nll.mean()), "correct": correct, "nll": nll}


def root_bayes_table(grammar: rhm.Grammar, leaves: np.ndarray, roots: np.ndarray) -> pd.DataFrame:
    """The Bayes classifier from the first t leaves, t = 0 … T: observed, accuracy, ce (chance: 1/v and log v)."""
    T = np.asarray(leaves).shape[1]
    rows = []
    for t in range(T + 1):
        b = bayes_root(grammar, leaves, roots, t)
        rows.append({"observed": t, "accuracy": b["accuracy"], "ce": b["ce"]})
    return pd.DataFrame(rows)


def root_logits(model: GrammarNet, leaves: torch.Tensor, order: list[int] | None = None) -> torch.Tensor:
    """(batch, v) root logits of a member built over T + 1 positions: the leaves (batch, T) and one filler go in,
    the last position (start symbol and every leaf in its causal view) is read out; ``order``: another schedule."""
    filled = torch.cat([leaves, leaves[:, :1]], 1)                      # the filler is never an input
    return model(filled, order)[:, -1]


def root_nll(model: GrammarNet, leaves: torch.Tensor, roots: torch.Tensor,
             order: list[int] | None = None) -> torch.Tensor:
    """(batch,) cross-entropy of the root, nats."""
    return F.cross_entropy(root_logits(model, leaves, order), roots, reduction="none")


@torch.no_grad()
def evaluate_root(model: GrammarNet, leaves: torch.Tensor, roots: torch.Tensor, order=None,
                  batch: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Per-sequence cross-entropy (nats) and correctness (argmax = root) on a held-out set."""
    was = model.training
    model.eval()
    nll, correct = [], []
    for i in range(0, len(leaves), batch):
        logits = root_logits(model, leaves[i:i + batch], order)
        nll.append(F.cross_entropy(logits, roots[i:i + batch], reduction="none").double())
        correct.append((logits.argmax(-1) == roots[i:i + batch]).double())
    model.train(was)
    return torch.cat(nll).cpu().numpy(), torch.cat(correct).cpu().numpy()


@torch.no_grad()
def root_edits(model: GrammarNet, leaves: torch.Tensor, roots: torch.Tensor) -> pd.DataFrame:
    """Chapter 5's edits on a root classifier (as :func:`depthlib.compose.diagnostics.diagnose` makes them on a
    next-leaf member): delete the application at every position j, and in an untied member swap the applications at
    j and j + 1. Columns edit, position, loss (cross-entropy), accuracy, delta, delta_accuracy (against the member
    unedited)."""
    schedule = list(model.schedule)
    depth = len(schedule)
    orders = [("delete", j, schedule[:j] + schedule[j + 1:]) for j in range(depth) if depth > 1]
    if len(set(schedule)) == depth:
        for j in range(depth - 1):
            order = list(schedule)
            order[j], order[j + 1] = order[j + 1], order[j]
            orders.append(("swap", j, order))
    base_nll, base_correct = evaluate_root(model, leaves, roots)
    rows = []
    for edit, j, order in orders:
        nll, correct = evaluate_root(model, leaves, roots, order)
        rows.append({"edit": edit, "position": j, "loss": float(nll.mean()), "accuracy": float(correct.mean()),
                     "delta": float(nll.mean() - base_nll.mean()),
                     "delta_accuracy": float(correct.mean() - base_correct.mean())})
    return pd.DataFrame(rows, columns=["edit", "position", "loss", "accuracy", "delta", "delta_accuracy"])


__all__ = ["bayes_root", "evaluate_root", "root_bayes_table", "root_edits", "root_log_likelihood", "root_logits",
           "root_nll"]

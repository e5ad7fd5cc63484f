"""Training one member of chapter 7's hierarchy control to a **certified** loss, on either task.

**Tasks** (:data:`TASKS`), one grammar member each (:mod:`depthlib.compose.network`, chapter 6's model):

* ``leaf``: next-leaf prediction, the loss of :func:`depthlib.compose.network.token_nll`; its *excess* is the held-out
  loss minus the exact Bayes loss (:func:`depthlib.compose.rhm.bayes_nll`);
* ``root``: root classification, the random hierarchy model's own task (Cagnetta et al., Phys. Rev. X 14, 031001,
  2024), read out at the last of T + 1 positions (:func:`depthlib.compose.roots.root_logits`); the Bayes
  cross-entropy from every leaf is 0 (unambiguous rules), so the held-out cross-entropy is the excess, and the
  accuracy is recorded beside it.

**A stage** (:func:`train_stage`) is one fresh schedule, chapter 3's converged schedule of
:class:`depthlib.compose.train.GrammarTrainConfig` (warm-up, constant, linear decay to 10 % at 80 %, held there), AdamW with
GPT-NeoX's betas and no weight decay, a global gradient-norm clip, one fresh batch per step: the sample indices
``start … start + steps·batch − 1`` of the training stream (:func:`depthlib.compose.rhm.sample`), so a member's
training sequences are known exactly and can be checked against the held-out set (:mod:`depthlib.compose.unseen`).
Its optimiser steps are the book's one loop (:func:`depthlib.training.optimise`), as are
:func:`depthlib.compose.train.train`'s; this stage takes a task and a device.

**The certificate** is the book's (:mod:`depthlib.certificate`, :data:`~depthlib.certificate.GAIN_BELOW`): after
the main stage, a **continuation** from the member's final weights — a fresh schedule of ``continuation`` × its
steps so far, on fresh samples, re-warmed to the base rate and decayed again — must lower the member's **certified
quantity** (:func:`certified_value`) by less than ``gain_below`` (2 %) of it, or by less than the held-out set can
resolve (:meth:`Certificate.floor`). Otherwise the better of the two is continued again, up to
``max_continuations`` times; a member still gaining then is reported *not certified*, with every gain.

**What is certified, per task.**

* ``leaf``: the held-out **excess** over the exact Bayes loss (nats per leaf). Its floor 0 is the Bayes loss, which
  no member reaches, so the relative 2 % test applies as in chapters 3 and 6; ``resolution`` (10⁻⁴ nats) only
  matters for an excess below resolution / gain_below = 0.005 nats, under every excess the cpu run measures.
* ``root``: the held-out **error** 1 − accuracy, not the cross-entropy. The root's Bayes cross-entropy is exactly 0
  and is reached (every root classified): from there the cross-entropy keeps falling only because the logits grow
  (a measured member: 0.140 → 0.069 → 0.0002 nats at accuracy 0.947 → 0.978 → 1.000), so a relative test on it can
  never pass, and what it would certify is the softmax's confidence, not what the member learned about the grammar.
  The error is a count of misclassified held-out sequences, k of n: the floor is ``resolution_sequences`` (3) of
  them — a continuation that classifies fewer than 3 more held-out roots correctly is below what n sequences resolve
  (3/n is the 95 % upper bound on an error rate of which none is seen in n: the rule of three) — and a member with
  no error left (k = 0) is certified without a continuation, since none can lower it. The cross-entropy is still
  recorded beside the error at every stage.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from depthlib.certificate import GAIN_BELOW
from depthlib.compose import rhm
from depthlib.compose.network import GrammarNet, token_nll
from depthlib.compose.roots import evaluate_root, root_nll
from depthlib.compose.train import TRAIN_STREAM, GrammarTrainConfig, evaluate
from depthlib.errors import InputError
from depthlib.training import optimise

TASKS = ("leaf", "root")


@dataclass(frozen=True)
class Certificate:
    """Chapter 3's continuation rule: a continuation's steps as a fraction of the member's steps so far, how many may
    run, the relative gain below which a member is certified, and the absolute floors of the two tasks' certified
    quantities (:meth:`floor`): ``resolution`` nats of next-leaf excess, ``resolution_sequences`` held-out roots."""

    continuation: float = 0.5
    max_continuations: int = 2
    gain_below: float = GAIN_BELOW
    resolution: float = 1e-4
    resolution_sequences: int = 3

    def validate(self) -> "Certificate":
        if not 0 < self.continuation <= 1:
            raise InputError(f"continuation must be in (0, 1], got {self.continuation:g}")
        if not 1 <= int(self.max_continuations) <= 10:
            raise InputError(f"max_continuations must be in 1 … 10, got {self.max_continuations}")
        if not 0 < self.gain_below < 1 or not 0 <= self.resolution < 1:
            raise InputError("gain_below must be in (0, 1) and resolution in [0, 1)")
        if not 0 <= int(self.resolution_sequences) <= 1000:
            raise InputError(f"resolution_sequences must be in 0 … 1000, got {self.resolution_sequences}")
        return self

    def floor(self, task: str, n_held_out: int) -> float:
        """The smallest drop of ``task``'s certified quantity that counts as a gain: ``resolution`` nats (leaf), or
        ``resolution_sequences`` of the ``n_held_out`` held-out roots (root: an error rate)."""
        return self.resolution if task == "leaf" else self.resolution_sequences / max(int(n_held_out), 1)

    def continuation_config(self, train: GrammarTrainConfig, trained: int | None = None) -> GrammarTrainConfig:
        """The schedule of a continuation of a member trained ``trained`` steps (default: the main stage's):
        ``continuation × trained`` steps (a multiple of the evaluations) — half its steps *so far*, so a slow tail
        cannot pass by the member growing old — the same base rate and shape."""
        so_far = train.steps if trained is None else int(trained)
        steps = int(round(self.continuation * so_far / train.evals)) * train.evals
        return dataclasses.replace(train, steps=max(train.evals, steps))

    def span(self, train: GrammarTrainConfig) -> int:
        """Training sequences one replicate may draw: the main stage and every continuation, each as long as it
        can be (every earlier continuation having lowered the loss)."""
        total = train.steps
        for _ in range(self.max_continuations):
            total += self.continuation_config(train, total).steps
        return total * train.batch_size


@dataclass(frozen=True)
class HeldOut:
    """A held-out set: leaves (n, T), roots (n,), the exact Bayes next-leaf losses (n, T), and how many of its draws
    were replaced by later ones of its stream (:func:`depthlib.compose.unseen.unseen_indices`)."""

    leaves: torch.Tensor
    roots: torch.Tensor
    bayes: np.ndarray
    replaced: int = 0           # draws replaced because some member may train on their sequence

    @classmethod
    def draw(cls, grammar: rhm.Grammar, n: int, stream: int, indices: np.ndarray | None = None,
             replaced: int = 0) -> "HeldOut":
        """The sequences of ``stream`` at ``indices`` (default the first ``n``)."""
        idx = np.arange(n) if indices is None else np.asarray(indices, dtype=np.int64)
        leaves, levels, _ = rhm.sample(grammar, idx, stream, with_tree=True)
        return cls(torch.from_numpy(leaves), torch.from_numpy(levels[0][:, 0].copy()), rhm.bayes_nll(grammar, leaves),
                   int(replaced))


def certified_value(task: str, m: dict) -> float:
    """The quantity the certificate tests, from a measurement (:func:`measure`): the next-leaf excess (leaf) or the
    held-out error 1 − accuracy (root)."""
    return float(m["excess"]) if task == "leaf" else 1.0 - float(m["accuracy"])


def batch_loss(task: str, model: GrammarNet, leaves: torch.Tensor, roots: torch.Tensor) -> torch.Tensor:
    """The training loss of one batch (a scalar)."""
    if task == "leaf":
        return token_nll(model, leaves).mean()
    return root_nll(model, leaves, roots).mean()


def measure(task: str, model: GrammarNet, held: HeldOut) -> dict:
    """Held-out ``val_loss`` (nats per leaf, or per sequence for the root), ``excess`` over the Bayes loss (the
    certified quantity) and ``accuracy`` (root; NaN for the leaf task), with the per-sequence losses ``per_seq``."""
    device = next(model.parameters()).device
    if task == "leaf":
        per_seq = evaluate(model, held.leaves) if device.type == "cpu" else _evaluate_on(model, held)
        val = float(per_seq.mean())
        return {"val_loss": val, "excess": val - float(held.bayes.mean()), "accuracy": np.nan, "per_seq": per_seq}
    nll, correct = evaluate_root(model, held.leaves.to(device), held.roots.to(device))
    return {"val_loss": float(nll.mean()), "excess": float(nll.mean()), "accuracy": float(correct.mean()),
            "per_seq": nll}


def _evaluate_on(model: GrammarNet, held: HeldOut) -> np.ndarray:
    """:func:`depthlib.compose.train.evaluate` on a model that lives on an accelerator (it returns CPU numbers)."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    with torch.no_grad():
        out = torch.cat([token_nll(model, held.leaves[i:i + 1024].to(device)).double().mean(1).cpu()
                         for i in range(0, len(held.leaves), 1024)])
    model.train(was)
    return out.numpy()


def train_stage(task: str, model: GrammarNet, grammar: rhm.Grammar, cfg: GrammarTrainConfig, start: int, held: HeldOut,
                *, on_step=None, stop_at: int | None = None) -> tuple[pd.DataFrame, dict]:
    """One fresh schedule of ``cfg`` from the model's current weights, on the training samples ``start …
    start + steps·batch − 1``. Returns the curve (step, lr, train_loss, val_loss, excess, accuracy) and the final
    measurement (:func:`measure`) with ``seconds``. ``on_step(done, batch_loss)``: after every step. ``stop_at``: stop
    after the evaluation at that step."""
    cfg.validate()
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, weight_decay=0.0)
    t0 = time.perf_counter()
    m = measure(task, model, held)
    rows = [{"step": 0, "lr": 0.0, "train_loss": np.nan, **{k: m[k] for k in ("val_loss", "excess", "accuracy")}}]

    def loss(step: int) -> torch.Tensor:
        a = start + step * cfg.batch_size
        leaves, levels, _ = rhm.sample(grammar, np.arange(a, a + cfg.batch_size), TRAIN_STREAM, with_tree=True)
        return batch_loss(task, model, torch.from_numpy(leaves).to(device),
                          torch.from_numpy(levels[0][:, 0].copy()).to(device))

    for interval in optimise(model, opt, first=0, last=cfg.steps, rate=cfg.rate, loss=loss, grad_clip=cfg.grad_clip,
                             evals=set(cfg.eval_steps()),
                             on_step=on_step):
        m = measure(task, model, held)
        rows.append({"step": interval.step, "lr": interval.lr, "train_loss": interval.train_loss,
                     **{k: m[k] for k in ("val_loss", "excess", "accuracy")}})
        if stop_at is not None and interval.step >= stop_at:
            break
    return pd.DataFrame(rows), {**m, "seconds": time.perf_counter() - t0}


def certify_member(task: str, model: GrammarNet, grammar: rhm.Grammar, cfg: GrammarTrainConfig, cert: Certificate,
                   base: int, held: HeldOut, *, on_step=None) -> dict:
    """Train ``model`` (main stage on samples ``base …``), then continue it until a continuation lowers the certified
    quantity (:func:`certified_value`) by less than the certificate allows (each continuation on the next fresh samples
    of the replicate's span, from the best weights so far); a member whose certified quantity is already 0 (a root
    classifier with no held-out error) is certified without one. Returns the best ``model``, ``stages`` (one row per
    stage: its sample range, initial and final loss, excess, error and certified value, gain), ``curves`` (every
    stage's, with a ``stage`` column), ``final`` (the best stage's measurement), ``certified``, ``gains`` and ``steps``
    (optimiser steps the best model received)."""
    cert.validate()
    stages, curves = [], []
    start = base
    floor = cert.floor(task, len(held.leaves)) if held is not None else cert.resolution

    def run(name: str, net: GrammarNet, schedule: GrammarTrainConfig, parent_steps: int) -> dict:
        nonlocal start
        curve, final = train_stage(task, net, grammar, schedule, start, held, on_step=on_step)
        first = curve.iloc[0]
        before, after = certified_value(task, first), certified_value(task, final)
        row = {"stage": name, "stage_steps": schedule.steps, "steps": parent_steps + schedule.steps,
               "sample_start": start, "sample_stop": start + schedule.steps * schedule.batch_size,
               "initial_loss": float(first["val_loss"]), "val_loss": final["val_loss"],
               "initial_excess": float(first["excess"]), "excess": final["excess"], "accuracy": final["accuracy"],
               "error": 1.0 - final["accuracy"] if task == "root" else np.nan,
               "certified_quantity": "excess" if task == "leaf" else "error",
               "initial_value": before, "value": after,
               "gain": (before - after) / before if before > 0 else np.nan, "seconds": final["seconds"]}
        start += schedule.steps * schedule.batch_size
        stages.append(row)
        curves.append(curve.assign(stage=name))
        return {"model": net, "row": row, "final": final}

    best = run("main", model, cfg, 0)
    gains, certified = [], False
    for k in range(1, cert.max_continuations + 1):
        if best["row"]["value"] <= 0:                       # nothing left that a continuation could lower
            certified = True
            break
        trial = run(f"c{k}", copy.deepcopy(best["model"]), cert.continuation_config(cfg, best["row"]["steps"]),
                    best["row"]["steps"])
        initial = trial["row"]["initial_value"]
        drop = initial - trial["row"]["value"]
        gains.append(trial["row"]["gain"])
        if trial["row"]["value"] < best["row"]["value"]:
            best = trial
        if initial <= 0 or drop < cert.gain_below * initial or drop < floor:
            certified = True
            break
    else:
        certified = certified or best["row"]["value"] <= 0
    return {"model": best["model"], "stages": pd.DataFrame(stages), "curves": pd.concat(curves, ignore_index=True),
            "final": best["final"], "best_stage": best["row"]["stage"], "certified": certified, "gains": gains,
            "steps": best["row"]["steps"]}


__all__ = ["TASKS", "Certificate", "HeldOut", "batch_loss", "certified_value", "certify_member", "measure",
           "train_stage"]

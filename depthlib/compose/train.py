"""Training one member to convergence on fresh samples of the grammar, with chapter 3's converged protocol.

The schedule and the convergence rule are those of :mod:`depthlib.toy.converged` (ours, behind the paper's §4
calibration): linear warm-up over the first 2 % of steps, constant to 50 %, linear decay to 10 % of the peak at 80 %,
then the last 20 % of steps **at that final rate**; a member is **converged** when its held-out loss improved by less
than 1 % over those last 20 % (:func:`depthlib.toy.converged.relative_improvement`). Every step draws a fresh batch
(samples ``step·batch …`` of stream 0, :func:`depthlib.compose.rhm.sample`), so no sample is seen twice and the
held-out set (stream 1) is never trained on. AdamW (GPT-NeoX's betas), no weight decay (a decay term would act once
on a tied block and ℓ times on untied ones), global gradient-norm clip 1.

Because the Bayes-optimal loss of the held-out set is known exactly (:func:`depthlib.compose.rhm.bayes_nll`), the
record also holds the relative improvement of the *excess* loss over it, a stricter measure of how far training has
come than the 1 % rule on the total loss (whose floor is far above zero).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from depthlib.compose import rhm
from depthlib.compose.network import GrammarNet, token_nll
from depthlib.errors import InputError
from depthlib.training import optimise
from depthlib.validate import finite, int_in_range

#: chapter 3's convergence rule (:data:`depthlib.toy.converged.CONVERGED_BELOW`, ``LAST_FRACTION``; a test checks
#: they agree): held-out loss improved by less than 1 % over the last 20 % of steps. Written here, not imported, so
#: that a run's code fingerprint does not depend on the toy's engine.
CONVERGED_BELOW = 0.01
LAST_FRACTION = 0.2
TRAIN_STREAM, HELD_OUT_STREAM, PROBE_STREAM = 0, 1, 2


@dataclass(frozen=True)
class GrammarTrainConfig:
    """Optimiser and schedule, the same for every family and depth."""

    steps: int = 2000
    batch_size: int = 64
    lr: float = 3e-3
    warmup_frac: float = 0.02
    decay_start: float = 0.5
    decay_end: float = 1.0 - LAST_FRACTION
    decay_to: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    evals: int = 20                 # held-out evaluations (every 5 %: 80 % of the steps is one of them)
    n_held_out: int = 2048          # held-out sequences (stream 1)

    def validate(self) -> "GrammarTrainConfig":
        int_in_range("evals", self.evals, 5, 10_000)
        int_in_range("steps", self.steps, self.evals, 10_000_000)
        if self.steps % self.evals:
            raise InputError(f"steps ({self.steps}) must be a multiple of evals ({self.evals})")
        if round(self.evals * self.decay_end) != self.evals * self.decay_end:
            raise InputError("the end of the decay must fall on an evaluation step")
        int_in_range("batch_size", self.batch_size, 1, 1 << 16)
        int_in_range("n_held_out", self.n_held_out, 1, 1 << 22)
        if not finite("lr", self.lr) > 0:
            raise InputError(f"lr must be > 0, got {self.lr:g}")
        if not 0 <= self.warmup_frac < self.decay_start <= self.decay_end <= 1:
            raise InputError("need 0 ≤ warmup_frac < decay_start ≤ decay_end ≤ 1")
        if not 0 < finite("decay_to", self.decay_to) <= 1:
            raise InputError(f"decay_to must be in (0, 1], got {self.decay_to:g}")
        if finite("grad_clip", self.grad_clip) < 0:
            raise InputError(f"grad_clip must be >= 0, got {self.grad_clip:g}")
        return self

    def rate(self, step: int) -> float:
        """The learning rate of optimiser step ``step`` (0-based), chapter 3's converged schedule."""
        t = step / self.steps
        warm = max(1, round(self.warmup_frac * self.steps))
        if step < warm:
            return self.lr * (step + 1) / warm
        if t < self.decay_start:
            return self.lr
        if t < self.decay_end:
            return self.lr * (1.0 - (1.0 - self.decay_to) * (t - self.decay_start) / (self.decay_end - self.decay_start))
        return self.lr * self.decay_to

    def eval_steps(self) -> list[int]:
        return [round(k * self.steps / self.evals) for k in range(self.evals + 1)]


def held_out(grammar: rhm.Grammar, n: int, stream: int = HELD_OUT_STREAM) -> tuple[torch.Tensor, np.ndarray]:
    """The first ``n`` sequences of a held-out stream and their exact Bayes losses (n, length)."""
    leaves = rhm.sample(grammar, np.arange(n), stream)
    return torch.from_numpy(leaves), rhm.bayes_nll(grammar, leaves)


@torch.no_grad()
def evaluate(model: GrammarNet, leaves: torch.Tensor, batch: int = 1024, order=None) -> np.ndarray:
    """Per-sequence mean next-leaf loss (nats/token) on ``leaves``; ``order`` as in the model's forward."""
    was = model.training
    model.eval()
    out = torch.cat([token_nll(model, leaves[i:i + batch], order).double().mean(1)
                     for i in range(0, len(leaves), batch)])
    model.train(was)
    return out.numpy()


def relative_improvement(curve: pd.DataFrame, column: str) -> float:
    """(x(0.8·N) − x(N)) / x(0.8·N) of a held-out curve's ``column``: the improvement over the last 20 %."""
    c = curve.sort_values("step")
    n = int(c["step"].max())
    at = c.loc[c["step"] == round((1 - LAST_FRACTION) * n), column]
    if at.empty:
        raise InputError(f"no evaluation at step {round((1 - LAST_FRACTION) * n)} of {n}")
    before, final = float(at.iloc[0]), float(c[column].iloc[-1])
    return (before - final) / before


def train(model: GrammarNet, grammar: rhm.Grammar, cfg: GrammarTrainConfig, *, seed: int,
          data: tuple[torch.Tensor, np.ndarray] | None = None, on_step=None, stop_at: int | None = None) -> dict:
    """Train ``model`` on fresh samples (the batch order is the sample index, the same for every member; ``seed``
    shifts the stream so replicates see different samples); returns ``curve`` (step, lr, train_loss, val_loss,
    excess), ``rel_improvement`` (total loss, the 1 % rule), ``rel_improvement_excess``, ``converged``, ``seconds``
    and the final per-sequence held-out losses ``val_per_seq``. ``on_step(done, batch_loss)``: after every step.
    ``stop_at``: return ``{"curve": …}`` alone after the
    evaluation at that step (a replay of a run's first interval)."""
    cfg.validate()
    leaves, bayes = data if data is not None else held_out(grammar, cfg.n_held_out)
    bayes_mean = float(bayes.mean())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8,
                            weight_decay=0.0)
    offset = int(seed) * cfg.steps * cfg.batch_size
    t0 = time.perf_counter()
    per_seq = evaluate(model, leaves)
    rows = [{"step": 0, "lr": 0.0, "train_loss": np.nan, "val_loss": float(per_seq.mean()),
             "excess": float(per_seq.mean()) - bayes_mean}]

    def batch_loss(step: int) -> torch.Tensor:
        start = offset + step * cfg.batch_size
        x = torch.from_numpy(rhm.sample(grammar, np.arange(start, start + cfg.batch_size), TRAIN_STREAM))
        return token_nll(model, x).mean()

    for interval in optimise(model, opt, first=0, last=cfg.steps, rate=cfg.rate, loss=batch_loss,
                             grad_clip=cfg.grad_clip, evals=set(cfg.eval_steps()),
                             on_step=on_step):
        per_seq = evaluate(model, leaves)
        rows.append({"step": interval.step, "lr": interval.lr, "train_loss": interval.train_loss,
                     "val_loss": float(per_seq.mean()), "excess": float(per_seq.mean()) - bayes_mean})
        if stop_at is not None and interval.step >= stop_at:
            return {"curve": pd.DataFrame(rows)}
    curve = pd.DataFrame(rows)
    rel = relative_improvement(curve, "val_loss")
    return {"curve": curve, "rel_improvement": rel, "rel_improvement_excess": relative_improvement(curve, "excess"),
            "converged": bool(rel < CONVERGED_BELOW), "seconds": time.perf_counter() - t0, "val_per_seq": per_seq,
            "bayes_per_seq": bayes.mean(1)}


__all__ = ["CONVERGED_BELOW", "HELD_OUT_STREAM", "LAST_FRACTION", "PROBE_STREAM", "TRAIN_STREAM", "GrammarTrainConfig",
           "evaluate", "held_out",
           "relative_improvement", "train"]

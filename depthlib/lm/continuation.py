"""Chapter 3's certificate applied to a language model: is a trained member of the depth series at its loss floor?

The paper's α_ℓ (§3, eq. 3) is fitted to converged losses; a member trained for a fixed budget bounds its own
converged loss from above only. Chapter 3's certified protocol (:mod:`depthlib.toy.certified`) asks each student for
a certificate that no schedule can fake, and this module asks the same of each member (depth ℓ, seed) of a series:

**Certificate.** A member is *certified* when a **continuation** from its final weights — a fresh schedule of
``fraction`` (half) of its steps so far, re-warmed to its base learning rate and decayed again
(:func:`continuation_schedule`: the member's own warm-up and cosine, scaled to the shorter length; fresh AdamW
moments) — lowers its held-out loss by less than :data:`depthlib.certificate.GAIN_BELOW` (2 %, the book's one
certificate). Otherwise the
continued member replaces it and is continued again, up to ``max_continuations`` times; a member still gaining then
is reported *not certified*, with every gain (:func:`certify`). The gain of a continuation is
(L_start − L_end)/L_start, its held-out loss before and after (:func:`gain`).

**Data.** A continuation trains on the windows the member's own data order (:func:`depthlib.lm.corpus.batch_windows`)
would have given it next — the stream continued, steps S … S + C − 1 after the S it has taken — in a seeded order of
its own (:func:`continued_stream`), so it sees no window more often than a member trained S + C steps would.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from depthlib.certificate import GAIN_BELOW, gain
from depthlib.lm.corpus import TokenData, batch_windows
from depthlib.lm.train import TrainConfig, train_model


def continuation_schedule(train: TrainConfig, fraction: float, trained: int | None = None) -> TrainConfig:
    """The schedule of a continuation of a member that has taken ``trained`` optimiser steps (default: its main
    training's): ⌈fraction · trained⌉ steps — half the member's steps *so far*, so a loss still falling as a power of
    the steps cannot pass by the member growing old — the member's warm-up scaled to that length, the same base
    rate, cosine decay to the same floor, evaluations every ``eval_every`` steps (at most its length)."""
    steps = max(1, math.ceil(fraction * (train.steps if trained is None else trained)))
    warmup = min(steps, round(train.warmup * steps / train.steps))
    return dataclasses.replace(train, steps=steps, warmup=warmup, eval_every=min(train.eval_every, steps))


def continuation_seed(seed: int, k: int) -> int:
    """The data-order seed of continuation ``k`` of a member trained with data-order ``seed`` (a 32-bit draw of
    ``numpy.random.SeedSequence([seed, k])``: fixed per (seed, k), different from the member's own order)."""
    return int(np.random.SeedSequence([int(seed), int(k), 0xC0]).generate_state(1)[0])


def continued_stream(data: TokenData, start_step: int, steps: int, batch_size: int, seed: int) -> TokenData:
    """``data`` whose training windows are those of optimiser steps ``start_step`` … ``start_step + steps − 1`` of
    the data order of ``seed`` (the stream a member that took ``start_step`` steps would continue with), in that
    order: (steps · batch_size, context) windows; the held-out windows are ``data``'s."""
    idx = np.concatenate([batch_windows(s, batch_size, data.n_windows, seed)
                          for s in range(int(start_step), int(start_step) + int(steps))])   # (steps · batch,)
    return dataclasses.replace(data, train=data.train[torch.from_numpy(idx)])


@dataclass
class Stage:
    """One stage of a member: its main training (``name`` "main") or continuation k ("c<k>"). ``state``: the weights
    at its end (CPU tensors); ``curve`` and ``doc_losses``: :func:`depthlib.lm.train.train_model`'s record (steps
    counted from the stage's start); ``start_step``: the stream position (optimiser steps the member had taken)."""

    name: str
    state: dict
    curve: pd.DataFrame
    doc_losses: pd.DataFrame
    start_step: int
    steps: int
    seconds: float = 0.0
    eval_seconds: float = 0.0

    @property
    def initial_loss(self) -> float:
        return float(self.curve["val_loss"].iloc[0])

    @property
    def final_loss(self) -> float:
        return float(self.curve["val_loss"].iloc[-1])

    @property
    def end_step(self) -> int:
        return self.start_step + self.steps

    def to_dict(self) -> dict:
        return {"name": self.name, "state": self.state, "curve": self.curve.to_dict("list"),
                "doc_losses": self.doc_losses.to_dict("list"), "start_step": self.start_step, "steps": self.steps,
                "seconds": self.seconds, "eval_seconds": self.eval_seconds}

    @classmethod
    def from_dict(cls, d: dict) -> "Stage":
        return cls(d["name"], d["state"], pd.DataFrame(d["curve"]), pd.DataFrame(d["doc_losses"]), int(d["start_step"]),
                   int(d["steps"]), float(d["seconds"]), float(d["eval_seconds"]))


def stage_from_record(name: str, model, rec: dict, start_step: int, steps: int) -> Stage:
    """A finished stage from :func:`depthlib.lm.train.train_model`'s record and the trained model."""
    return Stage(name, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, rec["curve"],
                 rec["doc_losses"], int(start_step), int(steps), float(rec["seconds"]), float(rec["eval_seconds"]))


def continue_member(model, data: TokenData, train: TrainConfig, best: Stage, k: int, *, seed: int, fraction: float,
                    checkpoint: Path | None = None, on_step: Callable[[int, float], None] | None = None) -> Stage:
    """Continuation ``k`` of a member: ``model`` (the member's architecture, on its device) is loaded with ``best``'s
    weights and trained on :func:`continuation_schedule` from stream step ``best.end_step`` on
    (:func:`continued_stream`, order :func:`continuation_seed`). Resumable from ``checkpoint`` (saved at every
    evaluation), bit for bit."""
    schedule = continuation_schedule(train, fraction, best.end_step)
    model.load_state_dict(best.state)
    stream = continued_stream(data, best.end_step, schedule.steps, train.batch_size, seed)
    rec = train_model(model, stream, schedule, seed=continuation_seed(seed, k), checkpoint=checkpoint,
                      on_step=on_step)
    return stage_from_record(f"c{k}", model, rec, best.end_step, schedule.steps)


def certify(main: Stage, continue_from: Callable[[Stage, int], Stage], max_continuations: int,
            gain_below: float = GAIN_BELOW) -> dict:
    """Chapter 3's rule on one member: continue ``main`` (``continue_from(best, k)`` trains continuation k from the
    best stage so far) until a continuation gains less than ``gain_below``, at most ``max_continuations`` times; a
    continuation whose loss is lower replaces the best stage. Returns best (the stage the member's loss is taken
    from), stages (every continuation, in order), gains, certified."""
    best, stages, gains, certified = main, [], [], False
    for k in range(1, int(max_continuations) + 1):
        cont = continue_from(best, k)
        stages.append(cont)
        gains.append(gain(cont.initial_loss, cont.final_loss))
        if cont.final_loss < best.final_loss:
            best = cont
        if gains[-1] < gain_below:
            certified = True
            break
    return {"best": best, "stages": stages, "gains": gains, "certified": certified}


__all__ = ["GAIN_BELOW", "Stage", "certify", "continuation_schedule", "continuation_seed", "continue_member",
           "continued_stream", "gain", "stage_from_record"]

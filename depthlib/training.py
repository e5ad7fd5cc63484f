"""The one training loop of the book's transformers: chapter 6's depth series and chapter 7's grammar models.

Every transformer the book trains (:func:`depthlib.lm.train.train_model`, :func:`depthlib.compose.train.train`,
:func:`depthlib.compose.certify.train_stage`) takes its optimiser steps here. One step is: set the step's learning
rate on every parameter group, compute the batch loss, back-propagate, clip the global gradient norm (Pythia's clip
1; 0: none), step the optimiser, drop the gradients. What differs between the callers stays with them and is passed
in: the optimiser (weight decay or not), the schedule (``rate``: chapter 6's cosine, chapter 3's converged schedule),
the batch and its loss (``loss``: token windows of a corpus, fresh grammar samples, root labels) and what an
evaluation measures. The loop yields at every evaluation step, and the caller evaluates, records and checkpoints
there; so a resumed run, started at the checkpoint's step, takes the same steps in the same order as an uninterrupted
one.

Shapes: ``loss(step)`` returns a 0-dim tensor (the mean over the step's batch).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch


@dataclass(frozen=True)
class Interval:
    """The optimiser steps since the previous evaluation, reported at an evaluation step."""

    step: int            # optimiser steps done (the evaluation follows step ``step``)
    lr: float            # the learning rate of the last of them
    train_loss: float    # mean batch loss over them (nats/token, or the caller's unit)
    seconds: float       # their wall time (the callers' evaluations excluded)


def optimise(model: torch.nn.Module, opt: torch.optim.Optimizer, *, first: int, last: int,
             rate: Callable[[int], float], loss: Callable[[int], torch.Tensor], grad_clip: float, evals: set[int],
             on_step: Callable[[int, float], None] | None = None) -> Iterator[Interval]:
    """Take optimiser steps ``first … last − 1`` (0-based) of ``model``; after each step ``s`` with ``s + 1`` in
    ``evals``, yield that :class:`Interval` (the caller evaluates before the loop goes on; breaking out stops it).
    ``on_step(done, batch_loss)`` is called after every step."""
    model.train()
    run_sum, run_n, seconds = 0.0, 0, 0.0
    for step in range(first, last):
        t0 = time.perf_counter()
        lr = rate(step)
        for group in opt.param_groups:
            group["lr"] = lr
        value = loss(step)                                               # 0-dim
        value.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        batch_loss = float(value.detach())
        run_sum, run_n = run_sum + batch_loss, run_n + 1
        seconds += time.perf_counter() - t0
        done = step + 1
        if on_step is not None:
            on_step(done, batch_loss)
        if done in evals:
            yield Interval(done, lr, run_sum / run_n, seconds)
            run_sum, run_n, seconds = 0.0, 0, 0.0


__all__ = ["Interval", "optimise"]

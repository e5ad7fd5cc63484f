"""Score many plans on the same batches, saving as it goes (chapter 5).

For each batch the unedited model runs once (recording its stream and its blocks' calls); then every plan runs on
that batch and is scored per document. After each batch the rows so far are saved to a checkpoint, so an
interrupted run resumes at the next batch with every finished batch kept.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from depthlib import results
from depthlib.interventions.execute import SCORES, run_plan
from depthlib.interventions.plan import Plan


class Batch(Protocol):
    """What a model adapter provides for one batch (:class:`depthlib.interventions.execute.LMBatch`, the toy's)."""

    states: list[torch.Tensor]

    def block(self, i: int, h: torch.Tensor) -> torch.Tensor: ...

    def score(self, h: torch.Tensor) -> dict[str, torch.Tensor]: ...


@torch.no_grad()
def score_plans(plans: dict[str, Plan], batches: Sequence[tuple[Sequence[int], Callable[[], Batch]]], *,
                checkpoint: Path | None = None, progress: bool = True, desc: str = "plans") -> tuple[pd.DataFrame, float]:
    """Rows (plan, doc_index, n, loss, kl, agree): per-document sums of every plan on every batch.

    ``batches`` lists (document indices, a function that captures that batch); a batch is captured only when it is
    scored, so a resumed run skips the finished ones without running the model. Returns the rows and the seconds
    spent (including earlier segments of a resumed run).
    """
    rows: list[dict] = []
    done, seconds = 0, 0.0
    if checkpoint is not None and checkpoint.exists():
        try:
            state = torch.load(checkpoint, weights_only=False)
            if state.get("plans") == sorted(plans):
                rows, done, seconds = state["rows"], state["next_batch"], state["seconds"]
                print(f"[depthlib] resuming at batch {done + 1} of {len(batches)} ({checkpoint})", file=sys.stderr)
        except Exception:  # noqa: BLE001 - an unreadable checkpoint is ignored: start again
            rows, done, seconds = [], 0, 0.0
    bar = tqdm(total=len(batches) * len(plans), initial=done * len(plans), desc=desc, unit="plan",
               disable=not progress, file=sys.stderr)
    for i_batch in range(done, len(batches)):
        t0 = time.perf_counter()
        doc_indices, capture = batches[i_batch]
        batch = capture()
        for text, plan in plans.items():
            s = batch.score(run_plan(plan, batch.block, batch.states))
            broken = _non_finite(s)
            if plan.is_identity and broken.any():
                from depthlib.finite import NonFiniteError
                docs = [int(doc_indices[j]) for j in broken.nonzero()[:, 0].tolist()]
                raise NonFiniteError(f"the unedited model's log-probabilities are not finite (NaN or inf) on "
                                     f"scored document(s) {docs}: check its weights and inputs")
            for j, doc in enumerate(doc_indices):
                nan = bool(broken[j])          # an edit that overflowed: its scores are undefined (NaN), never 0
                rows.append({"plan": text, "doc_index": int(doc), "n": int(s["n"][j]),
                             **{k: float("nan") if nan else float(s[k][j]) for k in SCORES}})
            bar.update(1)
        seconds += time.perf_counter() - t0
        if checkpoint is not None:
            results.atomic_torch_save(checkpoint, {"plans": sorted(plans), "rows": rows, "next_batch": i_batch + 1,
                                                   "seconds": seconds})
    bar.close()
    return pd.DataFrame(rows, columns=["plan", "doc_index", "n", *SCORES]), seconds


def _non_finite(s: dict[str, torch.Tensor]) -> torch.Tensor:
    """(batch,) bool: documents whose loss or KL is NaN or ±inf (an edited pass that overflowed fp32)."""
    return ~(torch.isfinite(s["loss"]) & torch.isfinite(s["kl"]))


def batched(items: Sequence, size: int) -> Iterable[tuple[int, Sequence]]:
    """(start index, slice) of consecutive chunks of ``size``."""
    for start in range(0, len(items), size):
        yield start, items[start:start + size]

"""Intervention plans: which block runs on which input (chapter 5; the paper's ensemble reading, §5).

A plan is a sequence of *steps* applied to the residual stream h, starting from h_0. A step is one block or a
group of blocks run **in parallel on the same input**, whose updates f_i(h) = block_i(h) − h are combined and
added back, optionally rescaled:

    h ← h + scale · Σ_i f_i(h)        (combine="sum": what an ensemble of weakly coupled updates predicts is harmless)
    h ← h + scale · mean_i f_i(h)     (combine="mean": "Transformer Layers as Painters", Sun et al. 2024)

A one-block step with scale 1 is the block itself. The unedited model is ``identity(L)``; deleting, reordering
and repeating blocks are shorter, permuted or longer sequences.

Text form (``depthlib interventions --plan``), blocks 0-indexed as in ``model.layers``::

    0-17            blocks 0..17 in order (the identity of an 18-block model); 17-0 runs them reversed
    0-4,6-17        block 5 deleted
    0-5,[6-9],10-17 blocks 6..9 in parallel, updates summed;  <6-9> averages them instead
    0,1-16*1.07,17  blocks 1..16 with their updates scaled by 1.07
    identity | delete:5,6 | reverse:2-15 | swap:7 | parallel:6-9 | average:6-9   shortcuts, relative to the model

Bad plans (an index out of range, an empty plan, a block twice in one group or in two groups) raise
:class:`depthlib.errors.InputError` with one line naming the problem.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from depthlib.errors import InputError

COMBINES = ("sum", "mean")


@dataclass(frozen=True)
class Step:
    """One step of a plan: a block, or blocks run in parallel on the same input (their updates combined)."""

    blocks: tuple[int, ...]     # 0-indexed blocks; one block = an ordinary sequential step
    scale: float = 1.0          # multiplies the step's (combined) update
    combine: str = "sum"        # "sum" (x + Σ f_i) or "mean" (x + mean f_i), for groups of two or more

    @property
    def is_plain(self) -> bool:
        """A single block with scale 1: exactly the block's own forward."""
        return len(self.blocks) == 1 and self.scale == 1.0

    def text(self) -> str:
        if len(self.blocks) == 1:
            body = str(self.blocks[0])
        else:
            inner = _compact(self.blocks, "+")
            body = f"[{inner}]" if self.combine == "sum" else f"<{inner}>"
        return body if self.scale == 1.0 else f"{body}*{self.scale!r}"


@dataclass(frozen=True)
class Plan:
    """A validated sequence of steps over the blocks of an ``n_blocks``-block model."""

    steps: tuple[Step, ...]
    n_blocks: int

    def __post_init__(self):
        _validate(self.steps, self.n_blocks)

    def text(self) -> str:
        """The plan in the text form above: consecutive single blocks with one scale are written as a range, and
        scales exactly (shortest round-trip form), so ``parse_plan(plan.text(), n)`` gives the same plan."""
        out, run, run_scale = [], [], 1.0
        for step in self.steps:
            single = len(step.blocks) == 1
            if single and run and step.blocks[0] == run[-1] + 1 and step.scale == run_scale:
                run.append(step.blocks[0])
                continue
            if run:
                out.append(_range_text(run, run_scale))
                run = []
            if single:
                run, run_scale = [step.blocks[0]], step.scale
            else:
                out.append(step.text())
        if run:
            out.append(_range_text(run, run_scale))
        return ",".join(out)

    def plain_prefix(self) -> int:
        """How many leading steps are blocks 0, 1, 2 … unedited: the plan can start from the unedited h_p."""
        p = 0
        for step in self.steps:
            if not (step.is_plain and step.blocks[0] == p):
                break
            p += 1
        return p

    @property
    def is_identity(self) -> bool:
        return self.plain_prefix() == self.n_blocks == len(self.steps)


def _range_text(run: list[int], scale: float = 1.0) -> str:
    body = str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
    return body if scale == 1.0 else f"{body}*{scale!r}"


def _compact(blocks: Sequence[int], sep: str) -> str:
    if len(blocks) > 2 and list(blocks) == list(range(blocks[0], blocks[-1] + 1)):
        return f"{blocks[0]}-{blocks[-1]}"
    return sep.join(map(str, blocks))


def _validate(steps: Sequence[Step], n_blocks: int) -> None:
    if n_blocks < 1:
        raise InputError(f"a plan needs a model with at least one block, got {n_blocks}")
    if not steps:
        raise InputError("empty plan: it must run at least one block")
    in_groups: dict[int, int] = {}
    for s_i, step in enumerate(steps):
        if not step.blocks:
            raise InputError(f"step {s_i} of the plan has no blocks")
        for b in step.blocks:
            if isinstance(b, bool) or int(b) != b:
                raise InputError(f"block index {b!r} is not an integer")
            if not 0 <= b < n_blocks:
                raise InputError(f"block {b} is out of range: the model has blocks 0..{n_blocks - 1}")
        if len(set(step.blocks)) != len(step.blocks):
            raise InputError(f"parallel group {step.text()} runs a block twice")
        if step.combine not in COMBINES:
            raise InputError(f"combine must be one of {', '.join(COMBINES)}, got {step.combine!r}")
        if not (step.scale == step.scale and abs(step.scale) != float("inf")):
            raise InputError(f"step {step.text()} has a non-finite scale")
        if len(step.blocks) > 1:
            for b in step.blocks:
                if b in in_groups:
                    raise InputError(f"parallel groups overlap: block {b} is in group {in_groups[b]} and group {s_i}")
                in_groups[b] = s_i


# ---- builders (the plans of chapter 5) ----------------------------------------------------------------------
def middle(n_blocks: int) -> list[int]:
    """The middle blocks: all but the first and the last (paper §2.7 item 3; as :func:`depthlib.measures.middle_blocks`)."""
    return list(range(1, n_blocks - 1)) if n_blocks > 2 else list(range(n_blocks))


def identity(n_blocks: int) -> Plan:
    """The unedited model."""
    return Plan(tuple(Step((i,)) for i in range(n_blocks)), n_blocks)


def sequence(n_blocks: int, order: Iterable[int], scales: dict[int, float] | None = None) -> Plan:
    """Blocks run one after another in ``order`` (shorter: deleted; permuted: reordered; repeats allowed)."""
    scales = scales or {}
    return Plan(tuple(Step((int(b),), float(scales.get(int(b), 1.0))) for b in order), n_blocks)


def delete(n_blocks: int, blocks: Iterable[int], rescale: bool = False) -> Plan:
    """The model without ``blocks``. With ``rescale``, the remaining middle blocks' updates are multiplied by
    ℓ_m / (ℓ_m − k), ℓ_m the number of middle blocks and k how many of them were deleted, to keep the total step."""
    gone = {int(b) for b in blocks}
    for b in gone:
        if not 0 <= b < n_blocks:
            raise InputError(f"block {b} is out of range: the model has blocks 0..{n_blocks - 1}")
    keep = [b for b in range(n_blocks) if b not in gone]
    if not keep:
        raise InputError("empty plan: deleting every block leaves nothing to run")
    scales = {}
    if rescale:
        mid = middle(n_blocks)
        k = len(gone.intersection(mid))
        if k and k < len(mid):
            scales = {b: len(mid) / (len(mid) - k) for b in mid if b not in gone}
    return sequence(n_blocks, keep, scales)


def reorder(n_blocks: int, blocks: Sequence[int], new_order: Sequence[int]) -> Plan:
    """The model with the consecutive ``blocks`` run in ``new_order`` (a permutation of them) instead."""
    blocks, new_order = list(blocks), list(new_order)
    if sorted(blocks) != sorted(new_order):
        raise InputError(f"{new_order} is not a permutation of blocks {blocks}")
    start = blocks[0]
    order = list(range(start)) + new_order + list(range(start + len(blocks), n_blocks))
    return sequence(n_blocks, order)


def parallel(n_blocks: int, blocks: Sequence[int], combine: str = "sum") -> Plan:
    """The model with the consecutive ``blocks`` run in parallel on one input, updates summed (or averaged)."""
    blocks = [int(b) for b in blocks]
    if blocks != list(range(blocks[0], blocks[0] + len(blocks))):
        raise InputError(f"a parallel group must be consecutive blocks, got {blocks}")
    steps = ([Step((i,)) for i in range(blocks[0])] + [Step(tuple(blocks), 1.0, combine)]
             + [Step((i,)) for i in range(blocks[-1] + 1, n_blocks)])
    return Plan(tuple(steps), n_blocks)


# ---- the text form -----------------------------------------------------------------------------------------
_ITEM = re.compile(r"^(?P<body>\[[^\]]*\]|<[^>]*>|[^*\[\]<>]+)(?:\*(?P<scale>[-+0-9.eE]+|[-+]?(?:inf|nan)))?$")


def _block(digits: str, n_blocks: int) -> int:
    """One block number (ASCII digits), checked against the model before any range is expanded."""
    if len(digits) > 9 or int(digits) >= n_blocks:
        raise InputError(f"block {digits} is out of range: the model has blocks 0..{n_blocks - 1}")
    return int(digits)


def _indices(text: str, what: str, n_blocks: int) -> list[int]:
    """'3' -> [3]; '2-5' -> [2, 3, 4, 5]; '5-2' -> [5, 4, 3, 2]; '1+4+7' -> [1, 4, 7]. Only ASCII digits (``٣`` is
    not read as 3), and both ends of a range are checked against ``n_blocks`` before it is expanded."""
    out: list[int] = []
    for part in text.split("+"):
        part = part.strip()
        m = re.fullmatch(r"([0-9]+)\s*-\s*([0-9]+)", part, flags=re.ASCII)
        if m:
            a, b = _block(m.group(1), n_blocks), _block(m.group(2), n_blocks)
            out.extend(range(a, b + 1) if a <= b else range(a, b - 1, -1))
        elif re.fullmatch(r"[0-9]+", part, flags=re.ASCII):
            out.append(_block(part, n_blocks))
        else:
            raise InputError(f"cannot read {what} {text!r}: use block numbers (ASCII digits) like 3, 2-5 or 1+4+7")
    return out


#: The largest |scale| a plan takes: an fp32 forward turns larger products into ±inf (its loss would be NaN)
MAX_SCALE = 1e6


def _scale(text: str | None, item: str) -> float:
    if text is None:
        return 1.0
    try:
        scale = float(text)
    except ValueError:
        raise InputError(f"cannot read the scale of plan item {item!r}") from None
    if not abs(scale) <= MAX_SCALE:
        raise InputError(f"the scale of plan item {item!r} must be a finite number in [-{MAX_SCALE:g}, "
                         f"{MAX_SCALE:g}] (the edited pass runs in fp32)")
    return scale


def parse_plan(text: str, n_blocks: int) -> Plan:
    """A plan from its text form (module docstring) for a model of ``n_blocks`` blocks."""
    text = (text or "").strip()
    if not text:
        raise InputError("empty plan: give blocks like 0-17, or identity, delete:5, reverse:2-15, parallel:6-9")
    if text == "identity":
        return identity(n_blocks)
    name, sep, arg = text.partition(":")
    if sep and name in ("delete", "reverse", "swap", "parallel", "average"):
        blocks = _indices(arg.replace(",", "+"), f"{name} blocks", n_blocks)
        if not blocks:
            raise InputError(f"{name}: needs blocks, e.g. {name}:5")
        for b in blocks:
            if not 0 <= b < n_blocks:
                raise InputError(f"block {b} is out of range: the model has blocks 0..{n_blocks - 1}")
        if name == "delete":
            return delete(n_blocks, blocks)
        if name == "swap":
            if len(blocks) != 1 or blocks[0] + 1 >= n_blocks:
                raise InputError(f"swap:I swaps blocks I and I+1; I must be in 0..{n_blocks - 2}")
            return reorder(n_blocks, [blocks[0], blocks[0] + 1], [blocks[0] + 1, blocks[0]])
        blocks = sorted(blocks)
        if name == "reverse":
            return reorder(n_blocks, blocks, blocks[::-1])
        return parallel(n_blocks, blocks, "sum" if name == "parallel" else "mean")
    steps = []
    for item in text.split(","):
        item = item.strip()
        m = _ITEM.match(item)
        if not m:
            raise InputError(f"cannot read plan item {item!r}: use 3, 2-5, [6-9], <6-9>, optionally with *1.5")
        body, scale = m.group("body"), _scale(m.group("scale"), item)
        if body[0] in "[<":
            blocks = _indices(body[1:-1], "parallel group", n_blocks)
            steps.append(Step(tuple(blocks), scale, "sum" if body[0] == "[" else "mean"))
        else:
            steps.extend(Step((b,), scale) for b in _indices(body, "blocks", n_blocks))
    return Plan(tuple(steps), n_blocks)

"""Non-finite numbers never pass as numbers: checks on a model's weights and activations, and on pooled scores.

A NaN weight, or a float16 forward that overflows (fp16's largest value is 65 504; Gemma's residual stream exceeds
it), makes every later number NaN. Sums that skip NaN (pandas' default) or comparisons with NaN (an angle's clip,
an argmax) would then report a broken model as a perfect one — a loss of 0.0, a KL of 0, a target token chosen from
NaN logits. Every chapter's measurement assumes finite hidden states h_0 … h_L (paper §2), so the entry points stop
with one line that says where the first non-finite value arose (:func:`check_weights`, :func:`guard`), and a score
that is undefined for one edit is carried as NaN (JSON null) with a warning (:func:`pool`), never as 0.

These checks only read tensors: they never change a number that a finite run computes.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from depthlib.errors import InputError


class NonFiniteError(InputError):
    """A model's weights or activations hold NaN or ±inf (one line: where, and what to do)."""


def _dtype_hint(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name in ("float16", "fp16", "half"):
        return ("; float16 overflowed (its largest value is 65504): use --dtype float32, or bfloat16 on a GPU")
    return "; check the model's weights and inputs"


def check_weights(model: torch.nn.Module, name: str) -> None:
    """NonFiniteError naming the first parameter or buffer of ``model`` that holds NaN or ±inf."""
    for kind, items in (("weight", model.named_parameters()), ("buffer", model.named_buffers())):
        for pname, t in items:
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise NonFiniteError(f"model {name!r} has {bad} non-finite value(s) (NaN or inf) in its {kind} "
                                     f"{pname}: every number computed from it would be NaN")


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return getattr(output, "logits", None)


@contextlib.contextmanager
def guard(model: torch.nn.Module, name: str, dtype=None) -> Iterator[None]:
    """Inside the block, a forward of ``model`` whose embedding, block, final-norm or head output holds NaN or ±inf
    raises :class:`NonFiniteError` naming that module (block i is 0-indexed, as ``model.layers``), with a hint for
    float16 overflow. Read-only forward hooks: the numbers of a finite forward are unchanged."""
    from depthlib.models.arch import arch_of
    from depthlib.models.hooks import hooks
    arch = arch_of(model)
    dtype = dtype if dtype is not None else next(model.parameters()).dtype
    where = [("the token embedding", arch.embed)] + [(f"block {i}", b) for i, b in enumerate(arch.layers)]
    where += [("the final norm", arch.final_norm), ("the unembedding (logits)", arch.lm_head)]

    def check(label):
        def hook(_module, _args, output):
            t = _first_tensor(output)
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise NonFiniteError(f"{name}: non-finite activations (NaN or inf) first arose in the output of "
                                     f"{label} ({str(dtype).replace('torch.', '')}){_dtype_hint(dtype)}")
        return hook

    with hooks([(module, check(label)) for label, module in where]):
        yield


def pool(df, keys: list[str], columns: list[str]):
    """``df.groupby(keys)[columns].sum()`` in which a group holding a NaN sums to NaN (pandas skips NaN: a plan
    whose edited pass overflowed would otherwise pool to a loss of 0 over its remaining documents)."""
    grouped = df.groupby(keys, sort=False)
    sums = grouped[columns].sum()
    return sums.mask(df[columns].isna().groupby([df[k] for k in keys], sort=False).any())

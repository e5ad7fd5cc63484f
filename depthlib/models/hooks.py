"""Forward hooks that are always removed: one context manager for every hook the probes and the tracer set.

PyTorch hooks stay on a module until their handle is removed, so a hook left behind by an exception silently
changes every later forward of that model. :func:`hooks` registers a list of hooks, runs the body and removes
them all, whatever happens in the body::

    with hooks([(arch.layers[0], grab_input)], kind="forward_pre", with_kwargs=True), \\
         hooks([(arch.layers[i], record(i)) for i in range(L)]):
        model(input_ids)

Hook signatures (PyTorch's): ``kind="forward"``: ``fn(module, args, output)`` (with ``with_kwargs``:
``fn(module, args, kwargs, output)``), returning a replacement output or None; ``kind="forward_pre"``:
``fn(module, args)`` (with ``with_kwargs``: ``fn(module, args, kwargs)``), returning replacement arguments or None.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

from torch import nn

KINDS = ("forward", "forward_pre")


@contextlib.contextmanager
def hooks(pairs: Iterable[tuple[nn.Module, Callable]], kind: str = "forward", *,
          with_kwargs: bool = False) -> Iterator[list]:
    """Register ``fn`` on ``module`` for every ``(module, fn)`` in ``pairs``; remove them all on exit.

    ``kind`` is ``"forward"`` (after the module's forward; may replace its output) or ``"forward_pre"`` (before
    it; may replace its arguments). Yields the handles. If registering one hook fails, the ones already
    registered are removed before the error propagates. Nest two ``with`` blocks to mix kinds.
    """
    if kind not in KINDS:
        raise ValueError(f"hook kind must be one of {', '.join(KINDS)}, got {kind!r}")
    handles = []
    try:
        for module, fn in pairs:
            if kind == "forward":
                handles.append(module.register_forward_hook(fn, with_kwargs=with_kwargs))
            else:
                handles.append(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs))
        yield handles
    finally:
        for handle in handles:
            handle.remove()

"""The three forwards of causal tracing (paper §6; Meng et al. 2022): clean, corrupted and restored.

1. **clean**: the prompt as is; :func:`clean_states` records every block's output (``"block"``), MLP output
   (``"mlp"``) or attention output (``"attn"``) and the last position's logits;
2. **corrupted**: noise added to the embedding output at the subject tokens; :func:`corrupted_run` also records
   what every block was called with, so a restored run can start from it;
3. **restored**: the corrupted run with the clean value of one kind of state put back at chosen (layer, token)
   sites: :func:`patched_probs` (one full forward, the reference) and :func:`restored_logits` (resumed from the
   corrupted run at the first restored block: the tracer's fast path, equal to the full forward).

Every hook is set with :func:`depthlib.models.hooks` (always removed). Shapes: a hooked output is viewed as
(rows, T, d) whatever the module returns; OPT's ``fc2`` (its MLP output) sees the states flattened to
(rows·T, d), so the view is taken there and the replacement is flattened back.
"""
from __future__ import annotations

from typing import Iterable

import torch

from depthlib.errors import InputError
from depthlib.models.arch import Arch, arch_of, block_input, block_output
from depthlib.models.hooks import hooks

#: What can be restored: the output of a whole block, of its MLP, or of its attention.
KINDS = ("block", "mlp", "attn")


def site_module(arch: Arch, kind: str, layer: int):
    """The module whose output is the ``kind`` state of block ``layer`` (0-indexed)."""
    if kind == "block":
        return arch.layers[layer]
    if kind == "mlp":
        return arch.mlp_of(layer)
    if kind == "attn":
        return arch.attn_of(layer)
    raise InputError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")


def _replace_output(output, new: torch.Tensor):
    if isinstance(output, tuple):
        return (new,) + output[1:]
    if isinstance(output, list):
        return [new] + output[1:]
    return new


def _as_rows_tokens(h: torch.Tensor, rows: int, tokens: int) -> torch.Tensor:
    """A hooked state as (rows, T, d): a no-op for (rows, T, d), the un-flattening of OPT's (rows·T, d)."""
    return h.reshape(rows, tokens, h.shape[-1])


def last_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits at the last position only, (rows, vocab)."""
    try:
        out = model(input_ids=input_ids, logits_to_keep=1, use_cache=False)
    except TypeError:  # models without logits_to_keep: compute all, keep the last
        out = model(input_ids=input_ids, use_cache=False)
    return out.logits[:, -1]


def _noise_adder(noise: torch.Tensor):
    """Forward hook on the embedding: add ``noise`` (rows, T, d) to its output."""
    def add_noise(module, args, output):
        return output + noise.to(device=output.device, dtype=output.dtype)
    return add_noise


def _restorer(mask: torch.Tensor, clean: torch.Tensor):
    """Forward hook putting the clean state (T, d) back where ``mask`` (rows, T) is True."""
    sel = mask[:, :, None]  # (rows, T, 1)
    rows, tokens = mask.shape

    def restore(module, args, output):
        h = block_output(output)
        patched = torch.where(sel, clean.to(h.dtype)[None], _as_rows_tokens(h, rows, tokens))
        return _replace_output(output, patched.reshape(h.shape))
    return restore


def _restorers(arch: Arch, kind: str, restore: torch.Tensor, clean: torch.Tensor, start: int = 0) -> list:
    """(module, hook) pairs restoring ``clean`` (L, T, d) where ``restore`` (rows, L, T) is True, blocks >= start."""
    pairs = []
    for layer in range(start, arch.n_layers):
        mask_l = restore[:, layer]
        if bool(mask_l.any()):
            pairs.append((site_module(arch, kind, layer), _restorer(mask_l, clean[layer])))
    return pairs


@torch.no_grad()
def clean_states(model, input_ids: torch.Tensor, kinds: Iterable[str] = KINDS) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One clean forward: every block's {block, mlp, attn} output, ``{kind: (L, T, d)}``, and the last logits."""
    arch = arch_of(model)
    kinds = list(kinds)
    tokens = int(input_ids.shape[1])
    store: dict[str, list] = {k: [None] * arch.n_layers for k in kinds}

    def recorder(kind, layer):
        def record(module, args, output):
            store[kind][layer] = _as_rows_tokens(block_output(output), 1, tokens)[0].detach()
        return record

    pairs = [(site_module(arch, kind, layer), recorder(kind, layer)) for kind in kinds for layer in range(arch.n_layers)]
    with hooks(pairs):
        logits = last_logits(model, input_ids)
    return {k: torch.stack(v) for k, v in store.items()}, logits[0]


@torch.no_grad()
def patched_probs(model, input_ids: torch.Tensor, target_id: int, *, noise: torch.Tensor | None = None,
                  kind: str = "block", restore: torch.Tensor | None = None,
                  clean: torch.Tensor | None = None) -> torch.Tensor:
    """p(target) at the last position for a batch of corrupted-and-restored runs of one prompt (full forwards).

    - ``input_ids``: (1, T), the prompt (every row reads it);
    - ``noise``: (rows, T, d) added to the embedding output (zeros outside the subject), or None;
    - ``restore``: bool (rows, L, T): row r gets the clean ``kind`` output of block l at token t where True;
    - ``clean``: (L, T, d) clean outputs of ``kind`` (from :func:`clean_states`).
    Returns (rows,) probabilities in float32.
    """
    arch = arch_of(model)
    if noise is None and restore is None:
        raise ValueError("give noise and/or restore (the number of rows comes from them)")
    rows = (noise if noise is not None else restore).shape[0]
    ids = input_ids.expand(rows, -1)
    pairs = [] if noise is None else [(arch.embed, _noise_adder(noise))]
    if restore is not None:
        if clean is None:
            raise ValueError("restore needs the clean states")
        pairs += _restorers(arch, kind, restore.to(input_ids.device), clean)
    with hooks(pairs):
        logits = last_logits(model, ids)
    return torch.softmax(logits.float(), dim=-1)[:, target_id]


@torch.no_grad()
def corrupted_run(model, input_ids: torch.Tensor, noise: torch.Tensor):
    """The noisy forward of ``S`` rows, recording what every block was called with.

    Returns ``(inputs, calls, logits)``: ``inputs[i]`` the hidden state entering block i, (S, T, d);
    ``calls[i]`` the block's (args, kwargs) as the model passed them (masks, rotary embeddings ...);
    ``logits`` the last position's logits, (S, vocab). A restored run whose first restored block is ``a``
    equals this run below ``a``, so it can resume from ``inputs[a]`` (see :func:`resume_from`).
    """
    arch = arch_of(model)
    L = arch.n_layers
    inputs: list = [None] * L
    calls: list = [None] * L

    def recorder(i):
        def record(module, args, kwargs):
            inputs[i] = block_input(args, kwargs).detach()
            calls[i] = (args, kwargs)
        return record

    with hooks([(arch.embed, _noise_adder(noise))]), \
            hooks([(arch.layers[i], recorder(i)) for i in range(L)], kind="forward_pre", with_kwargs=True):
        logits = last_logits(model, input_ids.expand(noise.shape[0], -1))
    return inputs, calls, logits


def _select_rows(obj, index: torch.Tensor, n: int):
    """Pick rows ``index`` of every tensor whose batch dimension is ``n`` (> 1), inside tuples/lists/dicts."""
    if torch.is_tensor(obj):
        return obj.index_select(0, index.to(obj.device)) if obj.dim() > 0 and obj.shape[0] == n and n > 1 else obj
    if isinstance(obj, tuple):
        return tuple(_select_rows(o, index, n) for o in obj)
    if isinstance(obj, list):
        return [_select_rows(o, index, n) for o in obj]
    if isinstance(obj, dict):
        return {k: _select_rows(v, index, n) for k, v in obj.items()}
    return obj


@torch.no_grad()
def resume_from(model, start: int, inputs: list, calls: list, sample: torch.Tensor) -> torch.Tensor:
    """Run blocks ``start..L-1`` on rows drawn from a :func:`corrupted_run` and return the last logits.

    ``sample[r]`` is the noise sample whose corrupted state row r starts from. Forward hooks on the blocks
    and their sublayers (the restorers) fire as in a full forward.
    """
    arch = arch_of(model)
    n = inputs[start].shape[0]
    h = inputs[start].index_select(0, sample.to(inputs[start].device))
    for i in range(start, arch.n_layers):
        args, kwargs = calls[i]
        kwargs = _select_rows({k: v for k, v in kwargs.items() if k != "hidden_states"}, sample, n)
        if args:
            args = (h,) + _select_rows(tuple(args[1:]), sample, n)
        else:
            kwargs["hidden_states"] = h
        h = block_output(arch.layers[i](*args, **kwargs))
    return arch.unembed(h[:, -1])


@torch.no_grad()
def restored_logits(model, kind: str, restore: torch.Tensor, clean: torch.Tensor, start: int, inputs: list,
                    calls: list, sample: torch.Tensor) -> torch.Tensor:
    """Last logits of corrupted rows with clean ``kind`` outputs restored where ``restore`` (rows, L, T) is True.

    Resumes from the corrupted run at block ``start`` (no site below it may be restored); ``sample[r]`` is the
    noise sample of row r. Equal to :func:`patched_probs`'s full forward (tests check it).
    """
    arch = arch_of(model)
    with hooks(_restorers(arch, kind, restore.to(clean.device), clean, start)):
        return resume_from(model, start, inputs, calls, sample)

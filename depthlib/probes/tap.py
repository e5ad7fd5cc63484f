"""Capture the residual stream h_0 … h_L of a Hugging Face causal LM (paper §2.2).

HF's ``output_hidden_states=True`` returns h_L *after* the final norm (transformers PR #40994), so the
last "layer angle" of the paper's scripts includes the final LayerNorm. The tap reads the residual
stream with hooks instead:

* h_0 — the input of block 0 (a forward pre-hook), i.e. the embedding as the model uses it (Gemma's
  √d scaling and GPT-2/OPT position embeddings included);
* h_l, l = 1..L — the output of block l, so h_L is **before** the final norm;
* the arguments the model passed to its last block (mask, rotary cos/sin, position ids ...), so the
  "last-block lens" can re-run that block on another input with every other argument model-provided
  (anchors §E.2), instead of rebuilding masks and rotary by hand.

The forward runs the decoder without the head (``arch.base``), so no (tokens × vocab) logits are
materialised.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from depthlib.models.arch import Arch, arch_of, block_input, block_output, replace_block_input
from depthlib.models.hooks import hooks


@dataclass
class Tap:
    """The residual stream of one batch and the recorded call of the last block."""

    arch: Arch
    hidden: list[torch.Tensor]     # L+1 tensors (batch, seq, d_model) in the model's dtype; hidden[L] pre-norm
    last_block_args: tuple         # positional args of the last block's call (args[0] = h_{L-1})
    last_block_kwargs: dict        # keyword args of that call (attention mask, position embeddings ...)
    final_hidden: torch.Tensor     # the base model's output: final_norm(h_L) (HF's hidden_states[-1])

    @property
    def n_layers(self) -> int:
        return len(self.hidden) - 1

    def stacked(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """All states as one tensor (batch, L+1, seq, d_model)."""
        return torch.stack([h.to(dtype) for h in self.hidden], dim=1)

    def run_last_block(self, h: torch.Tensor) -> torch.Tensor:
        """Block L applied to ``h`` (batch, seq, d_model) with the model's own mask and positions (§2.5)."""
        args, kwargs = replace_block_input(self.last_block_args, self.last_block_kwargs, h)
        with torch.no_grad():
            return block_output(self.arch.layers[-1](*args, **kwargs))


@torch.no_grad()
def tap_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      arch: Arch | None = None) -> Tap:
    """Run the decoder once and capture h_0 … h_L (pre-final-norm) plus the last block's call."""
    arch = arch or arch_of(model)
    L = arch.n_layers
    hidden: list[torch.Tensor | None] = [None] * (L + 1)
    call: dict = {}

    def grab_input(_module, args, kwargs):
        hidden[0] = block_input(args, kwargs)

    def grab_last_call(_module, args, kwargs):
        call["args"], call["kwargs"] = args, dict(kwargs)

    def grab_output(index):
        def hook(_module, _args, output):
            hidden[index] = block_output(output)
        return hook

    pre = [(arch.layers[0], grab_input), (arch.layers[L - 1], grab_last_call)]
    post = [(arch.layers[i], grab_output(i + 1)) for i in range(L)]
    with hooks(pre, kind="forward_pre", with_kwargs=True), hooks(post):
        out = arch.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    if any(h is None for h in hidden):
        missing = [i for i, h in enumerate(hidden) if h is None]
        raise RuntimeError(f"hooks did not fire for hidden states {missing} ({arch.name})")
    return Tap(arch, hidden, call["args"], call["kwargs"], out.last_hidden_state)

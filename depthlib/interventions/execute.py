"""Run a plan on a model's own blocks, and score the result against the unedited model (chapter 5).

The plan executor (:func:`run_plan`) is model-agnostic: it needs the unedited residual stream h_0 … h_L of a batch
and a function ``block(i, h)`` that applies block i to h. Two adapters provide them:

* :func:`capture_lm` — a Hugging Face causal LM. One ordinary forward with hooks records every block's input
  h_i, output h_{i+1} and the exact arguments the model passed to it (attention mask, rotary cos/sin, Gemma's
  local/global choice per layer ...). ``block(i, h)`` re-runs block i on another input with those arguments, so an
  edited pass uses the model's own masks and positions and never copies a weight.
* :mod:`depthlib.interventions.toy` — the toy students of chapter 3 (h ← h + MLP_i(h)).

A plan whose first p steps are blocks 0 … p−1 unedited starts from the recorded h_p (exactly the same numbers,
p blocks cheaper). Both adapters score a final stream h_L' per document: the model's own loss and the KL
divergence KL(p_unedited ‖ p_edited) per predicted token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from depthlib.interventions.plan import Plan
from depthlib.models.arch import Arch, arch_of, block_input, block_output, replace_block_input
from depthlib.models.hooks import hooks

SCORES = ("loss", "kl", "agree")   # per-document sums; ``n`` counts the predicted tokens


def run_plan(plan: Plan, block: Callable[[int, torch.Tensor], torch.Tensor], states: list[torch.Tensor], *,
             reuse_prefix: bool = True) -> torch.Tensor:
    """The residual stream after ``plan`` (pre-final-norm), starting from the unedited ``states`` h_0 … h_L.

    A plain step is ``block(i, h)``; a group (or a scaled step) adds ``scale`` × the sum (or mean) of its blocks'
    updates block(i, h) − h, all computed on the same input h. ``reuse_prefix=False`` recomputes the unedited
    leading blocks from h_0 instead of starting from the recorded h_p (the same numbers; used by the tests).
    """
    if len(states) != plan.n_blocks + 1:
        raise ValueError(f"plan for {plan.n_blocks} blocks, but {len(states) - 1} blocks' states were given")
    p = plan.plain_prefix() if reuse_prefix else 0
    h = states[p]
    for step in plan.steps[p:]:
        if step.is_plain:
            h = block(step.blocks[0], h)
            continue
        update = block(step.blocks[0], h) - h
        for b in step.blocks[1:]:
            update = update + (block(b, h) - h)
        if step.combine == "mean":
            update = update / len(step.blocks)
        h = h + step.scale * update
    return h


# ---- Hugging Face causal LMs -------------------------------------------------------------------------------
@dataclass
class LMBatch:
    """One batch of documents through an unedited LM: its residual stream, every block's call and the targets."""

    arch: Arch
    states: list[torch.Tensor]          # L+1 tensors (batch, seq, d_model); states[L] before the final norm
    calls: list[tuple[tuple, dict]]     # (args, kwargs) the model passed to block i
    input_ids: torch.Tensor             # (batch, seq)
    mask: torch.Tensor                  # (batch, seq) bool: real tokens (not padding)
    ref_logp: list[torch.Tensor] | None = None   # per document (seq-1, vocab) fp32: log p_unedited(next token)
    ref_top: torch.Tensor | None = None        # (batch, scored): its top-1 token
    score_from: int = 0                        # first position whose next token is scored (the last ones only)

    @property
    def n_blocks(self) -> int:
        return len(self.states) - 1

    def block(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Block i applied to ``h`` with the mask, positions and rotary embeddings the model gave it."""
        args, kwargs = replace_block_input(*self.calls[i], h)
        return block_output(self.arch.layers[i](*args, **kwargs))

    def next_token_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at the scored positions ``score_from`` … seq−2 from a final stream h (batch, seq,
        d): the model's own norm, head, soft-cap, computed only where scored (the unembedding dominates the cost)."""
        return self.arch.unembed(h[:, self.score_from:-1]).float()          # (batch, scored, vocab)

    def logprobs(self, h: torch.Tensor) -> torch.Tensor:
        """log p(next token) (batch, seq-1, vocab)."""
        return torch.log_softmax(self.next_token_logits(h), dim=-1)

    def doc_logprobs(self, h: torch.Tensor, d: int) -> torch.Tensor:
        """log p(next token) of document ``d`` alone (seq-1, vocab): the reference and every plan are computed by
        this one function on one document, so a plan that reproduces the unedited stream gives the same bits."""
        return torch.log_softmax(self.next_token_logits(h[d:d + 1])[0], dim=-1)

    def set_reference(self) -> None:
        """Record the unedited model's next-token distribution (once per batch; every plan is compared to it)."""
        self.ref_logp = [self.doc_logprobs(self.states[-1], d) for d in range(self.states[-1].shape[0])]
        self.ref_top = torch.stack([lp.argmax(-1) for lp in self.ref_logp])

    def score(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-document sums over predicted tokens: cross-entropy (nats), KL(unedited ‖ edited), top-1 agreement.

        With p, q the unedited and edited distributions, KL = Σ_v p_v (log p_v − log q_v) per token, summed term by
        term: identical distributions give exactly 0 (the form Σ p log p − Σ p log q cancels two large sums and
        leaves a round-off floor of either sign). A token's KL is clipped at 0 from below, where round-off of
        nearly equal distributions would make it negative (KL ≥ 0 exactly).
        """
        s = self.score_from
        valid = (self.mask[:, s:-1] & self.mask[:, s + 1:]).float()         # (batch, scored) predicted real tokens
        targets = self.input_ids[:, s + 1:]
        out = {k: torch.zeros(h.shape[0]) for k in SCORES}
        for d in range(h.shape[0]):                                           # one document at a time: bounded memory
            lq = self.doc_logprobs(h, d)                                     # (seq-1, vocab)
            lp = self.ref_logp[d]
            ce = -lq.gather(-1, targets[d, :, None])[:, 0]
            kl = torch.einsum("tv,tv->t", lp.exp(), lp - lq).clamp_min(0.0)
            agree = (lq.argmax(-1) == self.ref_top[d]).float()
            for name, v in (("loss", ce), ("kl", kl), ("agree", agree)):
                out[name][d] = (v.double() * valid[d]).sum().float()
        out["n"] = valid.sum(1)
        return out


@torch.no_grad()
def capture_lm(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               arch: Arch | None = None, score_last: int | None = None) -> LMBatch:
    """Run the unedited model once and record h_0 … h_L, every block's call and the reference log-probabilities.
    ``score_last``: score only the next-token predictions of the last ``score_last`` positions (None: all)."""
    arch = arch or arch_of(model)
    L = arch.n_layers
    states: list[torch.Tensor | None] = [None] * (L + 1)
    calls: list[tuple | None] = [None] * L

    def grab_call(index):
        def hook(_module, args, kwargs):
            calls[index] = (tuple(args), dict(kwargs))
            if index == 0:
                states[0] = block_input(args, kwargs)
        return hook

    def grab_output(index):
        def hook(_module, _args, output):
            states[index + 1] = block_output(output)
        return hook

    with hooks([(arch.layers[i], grab_call(i)) for i in range(L)], kind="forward_pre", with_kwargs=True), \
            hooks([(arch.layers[i], grab_output(i)) for i in range(L)]):
        arch.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    if any(s is None for s in states) or any(c is None for c in calls):
        raise RuntimeError(f"hooks did not fire on every block of {arch.name}")
    mask = (attention_mask if attention_mask is not None else torch.ones_like(input_ids)).bool()
    seq = input_ids.shape[1]
    score_from = 0 if score_last is None else max(0, seq - 1 - int(score_last))
    batch = LMBatch(arch, states, calls, input_ids, mask, score_from=score_from)
    batch.set_reference()
    return batch

"""Where things live inside a Hugging Face causal LM: a small architecture table (paper §2.2).

The probes (chapter 2) and the causal tracer (paper Fig. 6, chapter 4) need the same handful of modules from
every model: the list of decoder blocks, the token embedding, the final norm, the unembedding and, inside
each block, the MLP and the attention. Each family names them differently, so :func:`arch_of` looks them up
in a table keyed on ``config.model_type``::

    >>> arch = arch_of(model)
    >>> arch.layers[arch.n_layers - 1]        # the last decoder block
    >>> arch.mlp_of(3), arch.attn_of(3)       # submodules whose outputs causal tracing restores
    >>> arch.unembed(h_L)                     # final norm (+ projection) + unembedding -> logits

What h_0 is. The residual stream *entering the first block* is h_0. For GPT-NeoX/Pythia, Llama/SmolLM2,
Qwen2 and Gemma 3 it is exactly the output of ``arch.embed`` (Gemma multiplies the embedding by √d
inside its ``embed_tokens`` module, so the scaled vector is h_0, as the model uses it). For GPT-2 and
OPT the learned position embedding is added after ``arch.embed``, so ``arch.embed`` is the *token* part
only; the probes therefore always read h_0 with a pre-hook on block 0 (:mod:`depthlib.probes.tap`),
and the tracer's noise, added to ``arch.embed``'s output, corrupts the token part (the position part is clean).
h_l (l ≥ 1) is the output of block l; h_L is taken *before* the final norm.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from depthlib.errors import InputError


def _get(obj, path: str):
    """Follow a dotted attribute path; ``None`` if any step is missing or None."""
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@dataclass(frozen=True)
class _Spec:
    """Attribute paths of one architecture family, relative to the ``*ForCausalLM`` module."""

    family: str            # human name shown in errors and reports
    base: str              # the decoder (``model.model``, ``model.gpt_neox`` ...)
    layers: str            # nn.ModuleList of decoder blocks, relative to base
    embed: str             # token embedding, relative to base
    final_norm: str        # final LayerNorm/RMSNorm, relative to base (may be absent: OPT-350m)
    lm_head: str           # unembedding, relative to the causal-LM module
    mlp: str               # MLP output inside a block (OPT has no MLP module: fc2 is its last linear)
    attn: str              # attention inside a block
    project_out: str | None = None  # OPT-350m projects after the final norm


_TABLE: dict[str, _Spec] = {}


def _register(model_types: tuple[str, ...], spec: _Spec) -> None:
    for t in model_types:
        _TABLE[t] = spec


_register(("gpt_neox",), _Spec("GPT-NeoX / Pythia", "gpt_neox", "layers", "embed_in", "final_layer_norm",
                              "embed_out", "mlp", "attention"))
_register(("llama", "mistral"), _Spec("Llama / SmolLM2 / Mistral", "model", "layers", "embed_tokens", "norm",
                                      "lm_head", "mlp", "self_attn"))
_register(("qwen2", "qwen3"), _Spec("Qwen2 / Qwen3", "model", "layers", "embed_tokens", "norm",
                                    "lm_head", "mlp", "self_attn"))
_register(("gemma3_text", "gemma2", "gemma"), _Spec("Gemma 3 (text)", "model", "layers", "embed_tokens", "norm",
                                                   "lm_head", "mlp", "self_attn"))
_register(("gpt2",), _Spec("GPT-2", "transformer", "h", "wte", "ln_f", "lm_head", "mlp", "attn"))
_register(("opt",), _Spec("OPT", "model.decoder", "layers", "embed_tokens", "final_layer_norm", "lm_head",
                          "fc2", "self_attn", project_out="project_out"))


def supported_architectures() -> list[str]:
    """``config.model_type`` values the table knows, e.g. ['gemma3_text', 'gpt2', 'gpt_neox', ...]."""
    return sorted(_TABLE)


@dataclass
class Arch:
    """The modules of one loaded causal LM that probes and tracing need.

    ``layers[i]`` is block i+1 in the paper's 1-indexed notation: its output is h_{i+1}.
    """

    name: str                      # family name, e.g. "Gemma 3 (text)"
    model_type: str                # config.model_type, e.g. "gemma3_text"
    model: nn.Module               # the *ForCausalLM module
    base: nn.Module                # the decoder stack without the head
    layers: nn.ModuleList          # decoder blocks, length L
    embed: nn.Module               # token embedding (its output is h_0 except GPT-2/OPT: see module doc)
    final_norm: nn.Module          # final norm (nn.Identity when the model has none)
    lm_head: nn.Module             # unembedding W_U
    mlp_attr: str                  # attribute of a block holding its MLP output module
    attn_attr: str                 # attribute of a block holding its attention module
    project_out: nn.Module | None = None
    logit_softcap: float | None = None   # Gemma 2 style final soft-capping (None for Gemma 3, Llama ...)
    extra: dict = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        """L, the number of decoder blocks."""
        return len(self.layers)

    @property
    def d_model(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    def mlp_of(self, i: int) -> nn.Module:
        """The MLP of block i (0-indexed); its output is the block's MLP contribution.

        OPT has no MLP module: this is its ``fc2``, which sees the hidden states flattened to (batch·seq, d), so a
        hook on it gets a 2-D output (the tracer's hooks view it as (batch, seq, d): :mod:`depthlib.tracing.patching`).
        """
        return _get(self.layers[i], self.mlp_attr)

    def attn_of(self, i: int) -> nn.Module:
        """The attention module of block i (0-indexed). Its forward returns a tuple; element 0 is the output."""
        return _get(self.layers[i], self.attn_attr)

    def normalize(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm (and OPT's projection) applied to a pre-norm residual stream h."""
        h = self.final_norm(h)
        if self.project_out is not None:
            h = self.project_out(h)
        return h

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from a pre-norm residual stream: W_U · norm(h) (+ soft-capping where the model has it)."""
        logits = self.lm_head(self.normalize(h))
        if self.logit_softcap is not None:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits


def arch_of(model: nn.Module) -> Arch:
    """Look up the blocks, embedding, final norm, head, MLP and attention of a HF causal LM.

    Raises :class:`InputError` for a model whose ``config.model_type`` is not in the table, listing the
    supported ones.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    spec = _TABLE.get(model_type)
    if spec is None:
        raise InputError(f"unsupported architecture {model_type!r} ({type(model).__name__}); supported "
                         f"model_type values: {', '.join(supported_architectures())}")
    base = _get(model, spec.base)
    layers = _get(base, spec.layers) if base is not None else None
    lm_head = _get(model, spec.lm_head)
    if lm_head is None:
        lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if base is None or layers is None or lm_head is None:
        raise InputError(f"{type(model).__name__} (model_type {model_type!r}) does not have the expected "
                         f"layout ({spec.base}.{spec.layers}, {spec.lm_head}); pass a *ForCausalLM model")
    final_norm = _get(base, spec.final_norm) or nn.Identity()
    project_out = _get(base, spec.project_out) if spec.project_out else None
    return Arch(name=spec.family, model_type=model_type, model=model, base=base, layers=layers,
                embed=_get(base, spec.embed), final_norm=final_norm, lm_head=lm_head,
                mlp_attr=spec.mlp, attn_attr=spec.attn, project_out=project_out,
                logit_softcap=getattr(config, "final_logit_softcapping", None))


def block_output(output) -> torch.Tensor:
    """The hidden state returned by a decoder block: a tensor in transformers 5, a tuple in 4.x."""
    return output[0] if isinstance(output, (tuple, list)) else output


def block_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden state passed to a decoder block (positional in every family, ``hidden_states=`` otherwise)."""
    return args[0] if args else kwargs["hidden_states"]


def replace_block_input(args: tuple, kwargs: dict, h: torch.Tensor) -> tuple[tuple, dict]:
    """(args, kwargs) of a block call with its hidden-state input replaced by ``h``."""
    if args:
        return (h,) + tuple(args[1:]), kwargs
    kwargs = dict(kwargs)
    kwargs["hidden_states"] = h
    return args, kwargs


"""The model family: decoder-only LMs that differ only in depth (the family the paper's §3 asks for).

Pythia's architecture (GPT-NeoX: parallel attention and MLP, rotary embeddings on a quarter of each head, untied
embedding and head) at one fixed width; Llama (RMSNorm, SwiGLU, rotary on every dimension) as an option. Every depth
of a series uses the same :class:`ModelConfig`; only ``num_hidden_layers`` changes, so width, vocabulary, context,
initialisation and (see :mod:`depthlib.lm.train`) optimiser and data are the same for every ℓ.
"""
from __future__ import annotations

from dataclasses import dataclass

from depthlib.errors import InputError
from depthlib.validate import finite, int_in_range

ARCHS = ("neox", "llama")
INITS = ("pythia", "normal")
#: Output projections of a block (GPT-NeoX / Llama names): wang_init in the "pythia" initialisation.
_OUTPUT_PROJECTIONS = ("attention.dense.weight", "mlp.dense_4h_to_h.weight", "self_attn.o_proj.weight",
                       "mlp.down_proj.weight")
#: Deepest model accepted (memory and time grow linearly with depth).
MAX_DEPTH = 256


@dataclass(frozen=True)
class ModelConfig:
    """One family of models: everything but the depth."""

    arch: str = "neox"          # GPT-NeoX, Pythia's architecture (the paper's probe family); "llama" as an option
    d_model: int = 64           # one fixed width m for every depth (Pythia-70m: 512; a 2-core CPU affords 64)
    n_heads: int = 2            # head dimension d_model / n_heads = 32
    mlp_ratio: int = 4          # d_mlp = 4 d (Pythia); Llama's SwiGLU gets (2/3)·4d, the same parameter count
    context: int = 64           # tokens per training window (Pythia: 2048); also the models' position limit
    init: str = "pythia"        # GPT-NeoX's small_init N(0, 2/(5d)) for every matrix and wang_init N(0, (2/(ℓ√d))²)
                                # for the blocks' output projections, as Pythia was trained; "normal": N(0, init_std²)
    init_std: float = 0.02      # the "normal" initialisation's std (transformers' default)

    def validate(self) -> "ModelConfig":
        if self.arch not in ARCHS:
            raise InputError(f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        int_in_range("d_model", self.d_model, 8, 1 << 16)
        int_in_range("n_heads", self.n_heads, 1, self.d_model)
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise InputError(f"d_model {self.d_model} must split into {self.n_heads} heads of even size")
        int_in_range("mlp_ratio", self.mlp_ratio, 1, 64)
        int_in_range("context", self.context, 4, 1 << 16)
        if self.init not in INITS:
            raise InputError(f"init must be one of {', '.join(INITS)}, got {self.init!r}")
        if not finite("init_std", self.init_std) > 0:
            raise InputError(f"init_std must be > 0, got {self.init_std:g}")
        return self

    @property
    def d_mlp(self) -> int:
        if self.arch == "llama":       # SwiGLU has three matrices: (2/3)·ratio·d keeps 2·ratio·d² parameters
            return int(8 * round(2 * self.mlp_ratio * self.d_model / 3 / 8))
        return self.mlp_ratio * self.d_model


def hf_config(cfg: ModelConfig, depth: int, vocab_size: int, eos_id: int = 0):
    """The ``transformers`` config of the family's member of depth ``depth`` (no dropout: training is deterministic)."""
    import transformers as tf
    cfg.validate()
    int_in_range("depth", depth, 1, MAX_DEPTH)
    common = dict(vocab_size=int(vocab_size), hidden_size=cfg.d_model, num_hidden_layers=int(depth),
                  num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_mlp, max_position_embeddings=cfg.context,
                  initializer_range=cfg.init_std, tie_word_embeddings=False, bos_token_id=eos_id, eos_token_id=eos_id,
                  pad_token_id=eos_id)
    if cfg.arch == "neox":
        return tf.GPTNeoXConfig(**common, rotary_pct=0.25, use_parallel_residual=True, hidden_dropout=0.0,
                                attention_dropout=0.0)
    return tf.LlamaConfig(**common, num_key_value_heads=cfg.n_heads, attention_dropout=0.0)


def build_model(cfg: ModelConfig, depth: int, vocab_size: int, seed: int, eos_id: int = 0):
    """A freshly initialised causal LM of depth ``depth``, seeded (the same seed and depth give the same weights)."""
    import torch
    import transformers as tf
    config = hf_config(cfg, depth, vocab_size, eos_id)
    cls = tf.GPTNeoXForCausalLM if cfg.arch == "neox" else tf.LlamaForCausalLM
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):     # seeding here leaves the caller's random state alone
        torch.manual_seed(init_seed(seed, depth))
        model = cls(config)
        if cfg.init == "pythia":
            pythia_init(model, depth, cfg.d_model)
    return model


def pythia_init(model, depth: int, d_model: int) -> None:
    """GPT-NeoX's initialisation as used for Pythia, in place: every matrix (embedding and head included) from
    N(0, 2/(5d)) ("small_init", Nguyen & Salazar 2019) except the blocks' output projections, from N(0, (2/(ℓ√d))²)
    ("wang_init"), which shrinks each block's initial update as 1/ℓ; biases 0 and norms 1 (transformers' own).
    Draws from torch's global generator in parameter order (seeded by the caller)."""
    import math

    import torch
    small, wang = math.sqrt(2.0 / (5.0 * d_model)), 2.0 / (depth * math.sqrt(d_model))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, wang if name.endswith(_OUTPUT_PROJECTIONS) else small)


def init_seed(seed: int, depth: int) -> int:
    """The initialisation seed of (replicate ``seed``, depth ``depth``): distinct per member, fixed per config."""
    return int(seed) * 1_000_003 + int(depth)


def parameter_counts(model) -> dict:
    """Parameters of a model: all, in the embedding and the head, and the rest (the ``N`` of scaling laws)."""
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight.numel()
    return {"n_params": int(total), "n_embedding": int(embed + head), "n_non_embedding": int(total - embed - head)}


def flops_per_token(cfg: ModelConfig, depth: int, vocab_size: int) -> float:
    """Training FLOPs per token, 6·N + 6·ℓ·T·d (Kaplan et al. 2020 eq. 2.1: N counts the blocks and the head, not the
    input embedding; the second term is attention over the T-token context)."""
    d, f = cfg.d_model, cfg.d_mlp
    mlp = (3 if cfg.arch == "llama" else 2) * d * f
    per_block = 4 * d * d + mlp                     # q, k, v, o projections and the MLP
    return 6.0 * (depth * per_block + d * vocab_size) + 6.0 * depth * cfg.context * d

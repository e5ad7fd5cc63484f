"""Tiny random models and tokenizers built in the tests (no downloads): one builder per architecture."""
from __future__ import annotations

from pathlib import Path

import torch

TEXTS = ["The Space Needle is in downtown Seattle, Washington.",
         "The Eiffel Tower is located in the city of Paris, in France.",
         "Steve Jobs was the co-founder of Apple, a company in California.",
         "State of the Union: the economy is strong, and the nation is at peace.",
         "Depth scaling: most layers are similar, and the loss falls as one over depth."]


def tokenizer(vocab_size: int = 300, texts=TEXTS):
    """A byte-level BPE tokenizer trained on ``texts`` (seconds), with <|endoftext|> as bos/eos/pad."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(list(texts) * 4, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


def model(arch: str, vocab_size: int, layers: int = 4, seed: int = 0, max_positions: int = 128):
    """A tiny random causal LM of ``arch`` in eval mode: neox | llama | gpt2 | opt | gemma3."""
    import transformers as tf
    if arch == "neox":
        cfg, cls = tf.GPTNeoXConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=layers,
                                    num_attention_heads=4, intermediate_size=128, max_position_embeddings=max_positions,
                                    rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False), \
            tf.GPTNeoXForCausalLM
    elif arch == "llama":
        cfg, cls = tf.LlamaConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=128,
                                  max_position_embeddings=max_positions), tf.LlamaForCausalLM
    elif arch == "gpt2":
        cfg, cls = tf.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=layers, n_head=4,
                                 n_positions=max_positions), tf.GPT2LMHeadModel
    elif arch == "opt":
        cfg, cls = tf.OPTConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                                ffn_dim=64, max_position_embeddings=max_positions, word_embed_proj_dim=32), \
            tf.OPTForCausalLM
    elif arch == "gemma3":   # √d-scaled embeddings, sliding-window + global layers, extra norms inside blocks
        cfg, cls = tf.Gemma3TextConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=layers,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64,
                                       max_position_embeddings=max_positions, sliding_window=4,
                                       layer_types=(["sliding_attention", "full_attention"] * layers)[:layers]), \
            tf.Gemma3ForCausalLM
    else:
        raise ValueError(f"no tiny builder for {arch!r}")
    torch.manual_seed(seed)
    return cls(cfg).eval()


ARCHS = ("neox", "llama", "gpt2", "opt", "gemma3")


def save_model(folder: Path, arch: str = "llama", layers: int = 4) -> Path:
    """A tiny model and its tokenizer saved as an ordinary Hugging Face folder (what ``--model PATH`` takes)."""
    tok = tokenizer()
    model(arch, len(tok), layers=layers).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder

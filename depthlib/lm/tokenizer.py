"""A byte-level BPE tokenizer trained here, on the training documents only (paper §3 trains on its own tokens).

Byte-level BPE (GPT-2/Pythia style): every string round-trips exactly, nothing is out of vocabulary, and one
special token ``<|endoftext|>`` separates documents (it is also bos, eos and pad). Training with ``tokenizers`` is
deterministic for a fixed list of texts, so the same documents always give the same vocabulary and merges.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

from depthlib.errors import InputError
from depthlib.validate import int_in_range

EOS = "<|endoftext|>"
#: Fewest tokens a vocabulary may have: the 256 bytes plus the special token and a few merges.
MIN_VOCAB = 260


def train_tokenizer(texts: Sequence[str], vocab_size: int = 4096, min_frequency: int = 2):
    """A ``PreTrainedTokenizerFast`` (byte-level BPE, ``vocab_size`` tokens incl. ``<|endoftext|>``) trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    int_in_range("vocab_size", vocab_size, MIN_VOCAB, 1 << 20)
    texts = [t for t in texts if t]
    if not texts:
        raise InputError("no text to train the tokenizer on")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer, length=len(texts))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, pad_token=EOS)
    tok.model_max_length = 1 << 30       # documents are cut into context windows by the caller, not here
    return tok


def tokenizer_digest(tokenizer) -> str:
    """12 hex digits identifying a tokenizer's vocabulary and merges (its serialised ``tokenizer.json``)."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:12]


def save_tokenizer(tokenizer, folder: str | Path) -> Path:
    """Save as an ordinary Hugging Face tokenizer folder (``tokenizer.json`` + config), loadable by AutoTokenizer."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    return folder


def load_tokenizer(folder: str | Path):
    from transformers import PreTrainedTokenizerFast
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise InputError(f"no tokenizer.json in {folder}")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token=EOS, eos_token=EOS, pad_token=EOS)
    tok.model_max_length = 1 << 30
    return tok

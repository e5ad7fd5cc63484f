"""Stream a corpus through a model with bounded memory (paper §2.1, §2.4–2.6; anchors §E.5).

The paper's scripts keep every per-token metric of 4800 documents × 1024 tokens in memory (~145 fp32
columns per token, 1.5–2.8 GB). Here only aggregates stream:

* per (metric, layer): count, mean and standard deviation (float64 running sums);
* per (angle metric, layer): a fixed-bin histogram over [0, π];
* per (lens, layer): the mean next-token loss;
* per token: the angle trajectory (θ_0 … θ_{L−1}) with doc id, position and token id, a uniform sample of at
  most ``reservoir_size`` tokens (for the PCA of §2.7).

So memory is flat in the number of documents. Everything is returned as tidy pandas tables.

Randomness is keyed, not sequential: every token gets uniform keys drawn from (seed, document index, position)
(:func:`token_keys`). The lenses score the ``lens_tokens_per_doc`` valid tokens of a document with the smallest
lens keys, and the sample keeps the ``reservoir_size`` tokens with the smallest sample keys (a bottom-k sample,
uniform without replacement). So no number depends on the batch size or on which other documents share a pass,
and a corpus probed as shards of documents (``doc_offset``) merges into exactly the tables of one pass
(:func:`depthlib.probes.chapter.run_sharded`; sums to float round-off).
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from depthlib import results
from depthlib.errors import InputError
from depthlib.models.arch import arch_of
from depthlib.probes.lenses import LENSES, MAX_LOGIT_ELEMENTS, lens_losses
from depthlib.probes.metrics import METRICS, middle_mean, middle_update_mean, token_metrics, valid_mask
from depthlib.probes.tap import tap_hidden_states
from depthlib.validate import finite, int_in_range, resolve_device

ANGLE_METRICS = ("theta", "theta_dh", "angle_to_end")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ProbeConfig:
    """How to stream a corpus through a model. Defaults suit a 2-core CPU; the paper's are in comments."""

    max_length: int = 256            # tokens per document (paper 1024); longer documents are truncated
    batch_size: int = 8              # documents per forward (paper 48); memory ~ batch × L × T × d
    dtype: str = "auto"              # auto: bf16 on CUDA, fp32 on CPU (bf16 matmuls are ~6x SLOWER than fp32
                                     # on CPUs without avx512_bf16/AMX, measured here); metrics always fp32
    device: str = "cpu"              # "cuda" on a GPU
    lenses: bool = True              # per-layer losses cost ~1 extra forward + 2L unembeddings per token
    lens_tokens_per_doc: int | None = 16  # valid tokens per document scored by the lenses (None: all, paper)
    lens_docs: int | None = None     # only the first N documents get lenses (None: all); the last-block
                                     # lens re-runs one block L-1 times per batch, i.e. ~1 extra forward
    reservoir_size: int = 20_000     # per-token angle trajectories kept for the PCA (uniform sample)
    histogram_bins: int = 90         # bins over [0, π] (2° wide)
    seed: int = 0                    # reservoir and lens-token sampling
    add_special_tokens: bool = True  # Gemma adds <bos>, Pythia/SmolLM2 add nothing (§2.1)
    max_logit_elements: int = MAX_LOGIT_ELEMENTS  # fp32 logits alive at once in the lenses
    skip_special_tokens: bool = False  # drop special tokens (Gemma's <bos>) from every per-token statistic
    weight_noise: float = 0.0        # ε > 0 adds N(0, (ε·std W)²) to every weight matrix (seeded): the sensitivity
                                     # of the numbers to a second quantisation-sized perturbation

    def validate(self) -> "ProbeConfig":
        if self.max_length < 2:
            raise InputError(f"max_length must be >= 2 tokens, got {self.max_length}")
        if self.batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise InputError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        resolve_device(self.device)
        if not finite("weight_noise", self.weight_noise) >= 0:
            raise InputError(f"weight_noise must be >= 0, got {self.weight_noise:g}")
        if self.lens_tokens_per_doc is not None and self.lens_tokens_per_doc < 1:
            raise InputError(f"lens tokens per document must be >= 1 (or all), got {self.lens_tokens_per_doc}")
        if self.lens_docs is not None and self.lens_docs < 1:
            raise InputError(f"lens documents must be >= 1 (or all), got {self.lens_docs}")
        int_in_range("seed", self.seed, 0, 2**63 - 1)
        int_in_range("reservoir size", self.reservoir_size, 1)
        int_in_range("histogram bins", self.histogram_bins, 1, 100_000)
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        return DTYPES[self.dtype]


@dataclass
class ProbeResult:
    """Tidy tables of one probe run (see :func:`probe_documents`)."""

    layers: pd.DataFrame       # metric, layer, mean, std, count  (metrics of §2.4 + lens losses)
    histograms: pd.DataFrame   # metric, layer, bin_lo, bin_hi, count
    tokens: pd.DataFrame       # reservoir: doc_index, doc_id, position, token, theta_0 .. theta_{L-1}
    docs: pd.DataFrame         # doc_index, doc_id, n_tokens, n_valid
    info: dict = field(default_factory=dict)

    def profile(self, metric: str) -> np.ndarray:
        t = self.layers[self.layers.metric == metric].sort_values("layer")
        return t["mean"].to_numpy()

    def summary(self) -> dict:
        return summarize(self.layers, self.info)


class _Moments:
    """Running count / sum / sum of squares per layer, in float64."""

    def __init__(self, n: int):
        self.count = np.zeros(n)
        self.sum = np.zeros(n)
        self.sumsq = np.zeros(n)

    def add(self, x: torch.Tensor) -> None:  # x: (N, n)
        x = x.double()
        self.count += x.shape[0]
        self.sum += x.sum(0).cpu().numpy()
        self.sumsq += x.pow(2).sum(0).cpu().numpy()

    def rows(self, metric: str) -> list[dict]:
        out = []
        for layer, (c, s, q) in enumerate(zip(self.count, self.sum, self.sumsq)):
            mean = s / c if c else np.nan
            var = max(q / c - mean ** 2, 0.0) * c / (c - 1) if c > 1 else np.nan
            out.append(dict(metric=metric, layer=layer, mean=mean, std=np.sqrt(var), count=int(c)))
        return out


#: independent key streams of one document (numpy SeedSequence words)
LENS_STREAM, SAMPLE_STREAM = 0, 1


def token_keys(seed: int, doc_index: int, stream: int, n: int) -> np.ndarray:
    """(n,) uniform keys of positions 0 … n−1 of document ``doc_index`` in key ``stream``: a pure function of its
    arguments (a longer n extends the same sequence), so a token's key does not depend on its batch."""
    return np.random.default_rng([int(seed), int(doc_index), int(stream)]).random(n)


class _Reservoir:
    """Bottom-k sample: the ``size`` rows with the smallest keys seen so far (ties by document, then position).

    With independent uniform keys this is a uniform sample without replacement; the union of several streams'
    samples, cut to its ``size`` smallest keys, is the sample of the whole stream (how shards merge)."""

    def __init__(self, size: int, width: int):
        self.size = int(size)
        self.values = np.zeros((0, width), dtype=np.float32)
        self.meta = np.zeros((0, 3), dtype=np.int64)      # doc_index, position, token
        self.keys = np.zeros(0)

    def add(self, values: np.ndarray, meta: np.ndarray, keys: np.ndarray) -> None:
        values, meta = np.concatenate([self.values, values]), np.concatenate([self.meta, meta])
        keys = np.concatenate([self.keys, keys])
        keep = np.lexsort((meta[:, 1], meta[:, 0], keys))[: self.size]
        self.values, self.meta, self.keys = values[keep], meta[keep], keys[keep]

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.values, self.meta, self.keys


def _release_freed_memory() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim``) so that CPU memory stays flat over long
    streams; glibc otherwise keeps the freed (N, L, d) temporaries of every batch as fragmented heap."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            import ctypes
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None


@torch.no_grad()
def perturb_weights(model, relative_std: float, seed: int = 0):
    """Add N(0, (ε·std W)²) noise to every weight matrix of ``model`` in place (ε = ``relative_std``; vectors such as
    norms and biases are left alone); returns the model. Models that share their embedding and head are perturbed
    once. Used to measure how much a second quantisation-sized perturbation moves the probes' numbers."""
    if relative_std <= 0:
        return model
    g = torch.Generator().manual_seed(seed)
    seen = set()
    for name, w in model.named_parameters():
        if w.ndim < 2 or w.data_ptr() in seen:
            continue
        seen.add(w.data_ptr())
        noise = torch.randn(w.shape, generator=g, dtype=torch.float32)
        w.add_((noise * (relative_std * w.float().std())).to(w.dtype))
    return model


def load_probed_model(name: str, config: "ProbeConfig"):
    """The model and tokenizer a probe run measures: loaded, and perturbed if ``config.weight_noise`` > 0."""
    from depthlib.models import load_model
    model, tok = load_model(name, dtype=config.torch_dtype, device=config.device)
    return perturb_weights(model, config.weight_noise, config.seed), tok


def _key_matrix(seed: int, first: int, lengths: list[int], stream: int) -> np.ndarray:
    """(B, max length) keys of a batch's documents first, first+1, … (inf beyond each document's length)."""
    out = np.full((len(lengths), max(lengths, default=0)), np.inf)
    for i, n in enumerate(lengths):
        out[i, :n] = token_keys(seed, first + i, stream, n)
    return out


def _batches(items: Sequence, size: int) -> Iterable[tuple[int, Sequence]]:
    for start in range(0, len(items), size):
        yield start, items[start:start + size]


class ProbeAccumulator:
    """The running aggregates of one probe pass (§2.4–2.6), fed one batch at a time, memory flat in the documents.

    Per metric and layer its moments (:class:`_Moments`), per angle metric a fixed-bin histogram over [0, π], per lens
    and layer the loss moments, the keyed token sample (:class:`_Reservoir`) and one row per document (its mean angle
    per block). :meth:`add` takes a batch's token metrics, :meth:`add_lenses` its lens losses, :meth:`tables` gives
    the tidy tables of :class:`ProbeResult`. A checkpoint saves the accumulator itself."""

    def __init__(self, config: ProbeConfig, n_layers: int):
        L = self.n_layers = n_layers
        self.bins = config.histogram_bins
        self.seed = config.seed
        widths = {"theta": L, "theta_dh": L - 1, "norms": L + 1, "angle_to_end": L, "progress": L + 1}
        self.moments = {m: _Moments(widths[m]) for m in METRICS}
        self.lens_moments = {lens: _Moments(L + 1 if lens == "logit" else L) for lens in LENSES}
        self.hist = {m: np.zeros((widths[m], self.bins), dtype=np.int64) for m in ANGLE_METRICS}
        self.reservoir = _Reservoir(config.reservoir_size, L)
        self.doc_rows: list[dict] = []
        self.n_tokens = 0

    def add(self, m, mask: torch.Tensor, doc_ids: Sequence[str], first: int) -> None:
        """One batch: its token metrics ``m`` (:func:`~depthlib.probes.metrics.token_metrics`, rows index the batch),
        its attention ``mask`` (B, T), the documents' ids and the corpus index ``first`` of its first document."""
        for name in METRICS:
            self.moments[name].add(m.get(name))
        for name in ANGLE_METRICS:
            x = m.get(name)                                               # (N, layers)
            idx = (x / np.pi * self.bins).long().clamp_(0, self.bins - 1)
            flat = idx + torch.arange(x.shape[1], device=x.device) * self.bins
            self.hist[name] += torch.bincount(flat.flatten(), minlength=x.shape[1] * self.bins
                                              ).view(-1, self.bins).cpu().numpy()
        lengths = mask.sum(1).tolist()
        sample_keys = _key_matrix(self.seed, first, lengths, SAMPLE_STREAM)  # (B, T)
        rows, pos = m.row.cpu().numpy(), m.position.cpu().numpy()
        meta = np.stack([rows + first, pos, m.token.cpu().numpy()], 1)
        self.reservoir.add(m.theta.cpu().numpy(), meta, sample_keys[rows, pos])
        n_valid = valid_mask(mask).sum(1).tolist()
        # per-document mean angle per block (replayable: a document's numbers do not depend on the others)
        doc_theta = torch.zeros(len(doc_ids), self.n_layers, dtype=torch.float64, device=m.theta.device)
        doc_theta.index_add_(0, m.row, m.theta.double())
        doc_theta = (doc_theta / torch.tensor(n_valid, device=doc_theta.device).clamp(min=1)[:, None]).cpu().numpy()
        for i, doc_id in enumerate(doc_ids):
            self.doc_rows.append(dict(doc_index=first + i, doc_id=doc_id, n_tokens=int(mask[i].sum()),
                                      n_valid=int(n_valid[i]),
                                      **{f"theta_{l}": doc_theta[i, l] for l in range(self.n_layers)}))
        self.n_tokens += len(m)

    def add_lenses(self, losses: dict[str, torch.Tensor]) -> None:
        """One batch's per-token lens losses (:func:`~depthlib.probes.lenses.lens_losses`)."""
        for lens in LENSES:
            self.lens_moments[lens].add(losses[lens])

    def tables(self, doc_ids: Sequence[str], doc_offset: int, lenses: bool
               ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(layers, histograms, tokens, docs) of :class:`ProbeResult`; ``doc_ids`` of the pass's documents, the first
        at corpus index ``doc_offset``; ``lenses``: whether the layers table has the lens losses."""
        rows = []
        for name in METRICS:
            rows += self.moments[name].rows(name)
        if lenses:
            for lens in LENSES:
                rows += self.lens_moments[lens].rows(f"ce_{lens}")
        edges = np.linspace(0, np.pi, self.bins + 1)
        histograms = pd.DataFrame([dict(metric=name, layer=layer, bin_lo=edges[b], bin_hi=edges[b + 1],
                                        count=int(self.hist[name][layer, b]))
                                   for name in ANGLE_METRICS for layer in range(self.hist[name].shape[0])
                                   for b in range(self.bins)])
        values, meta, keys = self.reservoir.table()
        ids = np.array(list(doc_ids), dtype=object)
        tokens = pd.DataFrame({"doc_index": meta[:, 0], "doc_id": ids[meta[:, 0] - doc_offset] if len(meta) else [],
                               "position": meta[:, 1], "token": meta[:, 2], "sample_key": keys})
        tokens = pd.concat([tokens, pd.DataFrame(values, columns=[f"theta_{l}" for l in range(self.n_layers)])], axis=1)
        tokens = tokens.sort_values(["doc_index", "position"]).reset_index(drop=True)
        return pd.DataFrame(rows), histograms, tokens, pd.DataFrame(self.doc_rows)


def _lens_selection(config: ProbeConfig, valid: torch.Tensor, lengths: list[int], first: int) -> torch.Tensor | None:
    """(B, T) bool: the tokens of a batch whose lens losses are computed, or None when none are: the valid tokens of
    the documents that get lenses (the first ``lens_docs`` of the corpus), at most ``lens_tokens_per_doc`` of each,
    those with the smallest lens keys."""
    n = valid.shape[0]
    lensed = torch.ones(n, dtype=torch.bool) if config.lens_docs is None else \
        torch.arange(first, first + n) < config.lens_docs              # documents that get lenses
    if not (config.lenses and bool(lensed.any())):
        return None
    select = valid & lensed.to(valid.device)[:, None]
    if config.lens_tokens_per_doc is not None:
        scores = torch.from_numpy(_key_matrix(config.seed, first, lengths, LENS_STREAM)).to(valid.device)
        scores = scores.masked_fill(~valid, np.inf)
        k = min(config.lens_tokens_per_doc, valid.shape[1])
        chosen = scores.topk(k, dim=1, largest=False).indices
        select &= torch.zeros_like(valid).scatter_(1, chosen, True)
    return select


@torch.no_grad()
def probe_documents(model, tokenizer, documents: Sequence, config: ProbeConfig | None = None,
                    *, progress: bool = True, model_name: str | None = None, doc_offset: int = 0,
                    checkpoint: Path | None = None, checkpoint_every: int = 4) -> ProbeResult:
    """Stream documents through ``model`` and aggregate the metrics of §2.4 and the lenses of §2.5
    (:class:`ProbeAccumulator`).

    ``documents`` are :class:`depthlib.data.Document` (or plain strings). Each is truncated to
    ``config.max_length`` tokens; batches are right-padded to their longest document. ``doc_offset`` is the index
    of ``documents[0]`` in its corpus (a shard of documents: indices and keyed randomness are the corpus's).
    With ``checkpoint`` (a file path), the accumulator is saved every ``checkpoint_every`` batches and a later call
    with the same documents and config resumes after the last saved batch, with identical results.
    """
    cfg = (config or ProbeConfig()).validate()
    if len(documents) == 0:
        raise InputError("no documents to probe")
    docs = [(getattr(d, "doc_id", str(i)), getattr(d, "text", d)) for i, d in enumerate(documents)]
    arch = arch_of(model)
    L = arch.n_layers
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if limit is not None and cfg.max_length > limit:
        raise InputError(f"max_length {cfg.max_length} exceeds the model's position limit of {limit} tokens")
    dtype = cfg.torch_dtype
    model.to(device=cfg.device, dtype=dtype)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    special_ids = sorted(set(getattr(tokenizer, "all_special_ids", []) or []))

    acc = ProbeAccumulator(cfg, L)
    t_start = time.perf_counter()
    from tqdm.auto import tqdm
    bar = tqdm(total=len(docs), desc=f"probe {model_name or arch.name}",
               unit="doc", disable=not progress, file=sys.stderr)
    resume_at = 0
    fingerprint = {"config": asdict(cfg), "docs": [d for d, _ in docs], "doc_offset": int(doc_offset),
                   "sampling": "keyed"}
    if checkpoint is not None and Path(checkpoint).exists():
        try:
            state = torch.load(checkpoint, weights_only=False)
        except Exception:  # noqa: BLE001 - a truncated checkpoint is ignored: start again
            state = None
        if state is not None and state.get("fingerprint") == fingerprint and "accumulator" in state:
            acc, resume_at = state["accumulator"], state["next_start"]
            t_start -= state["seconds"]
    for i_batch, (start, batch) in enumerate(_batches(docs, cfg.batch_size)):
        if start < resume_at:
            bar.update(len(batch))
            continue
        # cheap pre-truncation: long speeches need not be tokenised in full
        texts = [text[: cfg.max_length * 16] for _, text in batch]
        enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                        max_length=cfg.max_length, add_special_tokens=cfg.add_special_tokens)
        ids = enc["input_ids"].to(cfg.device)
        mask = enc["attention_mask"].to(cfg.device)
        tap = tap_hidden_states(model, ids, mask, arch=arch)
        m = token_metrics(tap.hidden, ids, mask)
        if cfg.skip_special_tokens and special_ids:
            m = m.select(~torch.isin(m.token, torch.tensor(special_ids, device=m.token.device)))
        first = doc_offset + start                                        # corpus index of batch[0]
        acc.add(m, mask, [doc_id for doc_id, _ in batch], first)
        select = _lens_selection(cfg, valid_mask(mask), mask.sum(1).tolist(), first)
        if select is not None:
            acc.add_lenses(lens_losses(tap, ids, mask, select=select, max_logit_elements=cfg.max_logit_elements))
        del tap, m
        if cfg.device == "cpu":
            _release_freed_memory()
        bar.update(len(batch))
        if checkpoint is not None and (i_batch + 1) % checkpoint_every == 0 and start + len(batch) < len(docs):
            results.atomic_torch_save(Path(checkpoint), dict(fingerprint=fingerprint, accumulator=acc,
                                                             next_start=start + len(batch),
                                                             seconds=time.perf_counter() - t_start))
    bar.close()

    layers, histograms, tokens, doc_table = acc.tables([d for d, _ in docs], doc_offset, cfg.lenses)
    info = dict(model=model_name or getattr(model.config, "_name_or_path", ""), architecture=arch.name,
                model_type=arch.model_type, n_layers=L, d_model=arch.d_model, vocab_size=arch.vocab_size,
                n_docs=len(docs), n_tokens=int(acc.n_tokens), dtype=str(dtype).replace("torch.", ""),
                special_token_ids=special_ids,
                probe_seconds=round(time.perf_counter() - t_start, 3),
                config=asdict(cfg))
    return ProbeResult(layers, histograms, tokens, doc_table, info)


def summarize(layers: pd.DataFrame, info: dict | None = None, digits: int = 4) -> dict:
    """Key numbers of a probe run: per-layer mean angles, middle-layer mean, update angle, lens losses."""
    def prof(metric):
        t = layers[layers.metric == metric].sort_values("layer")
        return t["mean"].to_numpy()

    theta = prof("theta")
    out = dict(info or {})
    out.pop("config", None)
    out["theta_by_layer"] = [round(float(x), digits) for x in theta]
    out["theta_middle_mean"] = round(middle_mean(theta), digits)
    out["theta_dh_mean"] = round(middle_update_mean(prof("theta_dh"), len(theta)), digits)   # same blocks as θ
    for lens in LENSES:
        ce = prof(f"ce_{lens}")
        if len(ce) and np.isfinite(ce).all():           # a run (or shard) whose documents got no lenses has none
            out[f"ce_{lens}_by_layer"] = [round(float(x), digits) for x in ce]
    return out

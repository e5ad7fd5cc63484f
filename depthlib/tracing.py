"""ROME-style causal tracing (paper §6, Fig. 6; Meng et al. 2022, "Locating and Editing Factual Associations").

A fact is a prompt, a subject inside it and a target continuation ("The Space Needle is in downtown",
"Space Needle", " Seattle"). Causal tracing runs the model three ways:

1. **clean**: the prompt as is; p_clean = p(target) at the last position;
2. **corrupted**: Gaussian noise ε ~ N(0, σ²) added to the embedding output h_0 at the subject tokens
   only; p_corrupt is the mean of p(target) over the noise samples;
3. **restored**: the corrupted run with the clean value of one state put back at one site (layer l,
   token t); p_restored(l, t) measures how much that one state carries the fact.

What is restored (``kind``): the block output h_{l+1} (``"block"``), the MLP output (``"mlp"``) or the
attention output (``"attn"``) of block l. For MLP and attention ROME restores a *window* of blocks
around l (10, clipped at the ends), because one block's sublayer alone barely moves the output.

The normalised indirect effect of a site is (p_restored − p_corrupt) / (p_clean − p_corrupt):
0 = no recovery, 1 = full recovery. The paper's reading of Fig. 6: recovery at the last subject token
in the early-to-middle layers (l/ℓ ≲ 0.6), at the last token in the later layers, fluctuating from
layer to layer inside each group: two functional groups of layers, with the work distributed inside each.

Noise presets (anchors §A2, spec §6):

- ``"rome"`` (default): σ = 3 × the std of the embedding outputs at the subject tokens of a fact set
  (ROME's ``collect_embedding_std`` idea, on our own fact set), 10 noise samples, window 10 for MLP/attn;
- ``"paper"``: σ = 3 × the std of the embedding matrix (as the model applies it: Gemma's √d scaling is
  included, so for Pythia it is exactly ``embed_in.weight.std()``), 1 sample, window 1, block output;
- a float: σ itself (absolute, as ROME's ``noise=`` argument).

Speed: the clean run and the corrupted run are done once per prompt; all restored sites of one layer
(tokens × samples) run in one batched forward, which starts from the corrupted run's state at the first
restored block (below it every restored run *is* the corrupted run) and computes only the last position's
logits; sites before the first subject token are not run at all: in a causal model their clean and
corrupted states are identical, so restoring them gives p_corrupt exactly. Tests check all of this against
a plain loop of one full forward per (layer, token, sample) (:func:`naive_grid`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from depthlib.errors import InputError
from depthlib.probes.arch import Arch, arch_of, block_input, block_output
from depthlib.results import REPO_ROOT

KINDS = ("block", "mlp", "attn")
#: Token roles of ROME's average-effect figure, in prompt order.
ROLES = ("before subject", "first subject", "middle subject", "last subject", "first subsequent",
         "further tokens", "last token")
NOISE_PRESETS = ("rome", "paper")
FACTS_DIR = REPO_ROOT / "data" / "facts"
CANDIDATES_PATH = FACTS_DIR / "candidates.jsonl"
FACTS_PATH = FACTS_DIR / "facts.jsonl"


@dataclass(frozen=True)
class TraceConfig:
    """How to trace. Defaults are ROME's (anchors §A2); :func:`paper_config` gives the paper's (spec §6)."""

    samples: int = 10            # ROME averages 10 noise draws; the paper uses 1 (noisier maps)
    noise: str | float = "rome"  # "rome" | "paper" | σ as a float; see the module docstring
    window: int | None = None    # None: 1 for block outputs, 10 for MLP/attention (ROME)
    seed: int = 1                # ROME seeds its noise with RandomState(1); the same draw serves every site
    max_batch: int = 512         # rows per forward; lower it for big models on small GPUs

    def window_for(self, kind: str) -> int:
        if self.window is not None:
            return self.window
        return 1 if kind == "block" else 10


def paper_config(**overrides) -> TraceConfig:
    """The paper's settings (spec §6): one noise draw of 3 × the embedding-matrix std, window 1."""
    return TraceConfig(**{"samples": 1, "noise": "paper", "window": 1, **overrides})


def window_layers(layer: int, n_layers: int, window: int) -> range:
    """Blocks restored for a site at ``layer``: ``window`` blocks centred on it, clipped at 0 and L.

    As ROME: [l − ⌊w/2⌋, l + ⌈w/2⌉) ∩ [0, L); window 1 is the block itself.
    """
    if window < 1:
        raise InputError(f"window must be >= 1, got {window}")
    return range(max(0, layer - window // 2), min(n_layers, layer + (window + 1) // 2))


# ---- locating subject and target by characters ---------------------------------------------------
@dataclass
class Located:
    """A prompt tokenised, with its subject tokens and target token found by character offsets."""

    text: str                      # what the model reads (the prompt without the target)
    subject: str
    target: str | None             # the target continuation text (None: the model's top-1, set later)
    input_ids: torch.Tensor        # (1, T)
    tokens: list[str]              # T decoded tokens
    subject_range: tuple[int, int]  # token indices [start, stop) overlapping the subject characters
    target_id: int | None

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def roles(self) -> list[str]:
        """ROME's token categories (``ROLES``) for every position; the last token wins ties."""
        a, b = self.subject_range
        out = []
        for t in range(self.n_tokens):
            if t == self.n_tokens - 1:
                out.append("last token")
            elif t < a:
                out.append("before subject")
            elif t == b - 1:
                out.append("last subject")
            elif t == a:
                out.append("first subject")
            elif t < b:
                out.append("middle subject")
            elif t == b:
                out.append("first subsequent")
            else:
                out.append("further tokens")
        return out


def _encode(tokenizer, text: str):
    try:
        enc = tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    except NotImplementedError:
        raise InputError(f"{type(tokenizer).__name__} cannot return character offsets; use a fast tokenizer") from None
    return enc["input_ids"], enc["offset_mapping"][0].tolist()


def locate(tokenizer, prompt: str, subject: str, target: str | None = None) -> Located:
    """Tokenise ``prompt`` and find the subject tokens and the target token by characters.

    - The subject must occur in the prompt (first occurrence; case-sensitive, else case-insensitive).
      Its tokens are those whose character span overlaps the subject's, so any tokenizer works
      (leading-space tokens, SentencePiece pieces, BOS with an empty span).
    - The target is either the continuation of the prompt (" Seattle" after "... downtown"), or the end
      of the prompt itself (the paper's form: "... downtown Seattle" with target "Seattle"); in both cases
      the model reads the text before the target and the target token is the first token of the target in
      the joint tokenisation. ``target=None`` leaves it to the clean run (the model's top-1).

    Raises :class:`InputError` if the subject is not found, the target is empty, or the target does not
    start at a token boundary of the joint text.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError("prompt is empty")
    if not isinstance(subject, str) or not subject.strip():
        raise InputError("subject is empty")
    text = prompt
    if target is not None:
        if not isinstance(target, str) or not target.strip():
            raise InputError("target is empty")
        stripped = prompt.rstrip()
        if stripped.endswith(target.strip()) and len(stripped) > len(target.strip()):
            cut = len(stripped) - len(target.strip())
            # keep the target's leading space with the target (" Seattle"), as tokenizers do
            while cut > 0 and stripped[cut - 1].isspace():
                cut -= 1
            text, target = stripped[:cut], stripped[cut:]
    start = text.find(subject)
    if start < 0:
        start = text.lower().find(subject.lower())
    if start < 0:
        where = "the prompt without its target" if text != prompt else "the prompt"
        raise InputError(f"subject {subject!r} not found in {where} {text!r}")
    stop = start + len(subject)
    ids, offsets = _encode(tokenizer, text)
    subj = [i for i, (s, e) in enumerate(offsets) if e > s and s < stop and e > start]
    if not subj:
        raise InputError(f"no token covers subject {subject!r} in {text!r}")
    target_id = None
    if target is not None:
        full_ids, _ = _encode(tokenizer, text + target)
        n = ids.shape[1]
        if full_ids.shape[1] <= n or not torch.equal(full_ids[0, :n], ids[0]):
            raise InputError(f"target {target!r} does not start at a token boundary after {text!r}; "
                             "put the separating space in the target (' Seattle')")
        target_id = int(full_ids[0, n])
    tokens = [tokenizer.decode([int(i)]) for i in ids[0]]
    return Located(text=text, subject=text[start:stop], target=target, input_ids=ids, tokens=tokens,
                   subject_range=(subj[0], subj[-1] + 1), target_id=target_id)


# ---- noise scale ---------------------------------------------------------------------------------
@torch.no_grad()
def embedding_matrix_std(model) -> float:
    """Std of all entries of the embedding matrix *as the model applies it* (the paper's σ, spec §6).

    Runs the embedding module over the whole vocabulary in chunks (Gemma's √d scale is inside the
    module), accumulating in float64.
    """
    arch = arch_of(model)
    vocab = arch.embed.weight.shape[0]
    device = arch.embed.weight.device
    total, total_sq, count = 0.0, 0.0, 0
    for lo in range(0, vocab, 16384):
        ids = torch.arange(lo, min(vocab, lo + 16384), device=device)
        e = arch.embed(ids).double()
        total += float(e.sum())
        total_sq += float((e * e).sum())
        count += e.numel()
    mean = total / count
    return math.sqrt(max(total_sq / count - mean * mean, 0.0) * count / (count - 1))


@torch.no_grad()
def subject_embedding_std(model, tokenizer, facts: Sequence["Fact"]) -> float:
    """Std of the embedding outputs at the subject tokens of ``facts`` (ROME's noise scale, anchors §A2)."""
    arch = arch_of(model)
    rows = []
    for fact in facts:
        loc = locate(tokenizer, fact.prompt, fact.subject)
        a, b = loc.subject_range
        ids = loc.input_ids[0, a:b].to(arch.embed.weight.device)
        rows.append(arch.embed(ids).double().flatten())
    if not rows:
        raise InputError("the fact set for the 'rome' noise scale is empty")
    return float(torch.cat(rows).std())


def noise_sigma(model, tokenizer, noise: str | float, facts: Sequence["Fact"] | None = None) -> float:
    """σ of the Gaussian noise for a preset ("rome": 3 × subject-embedding std; "paper": 3 × matrix std) or a float."""
    if isinstance(noise, str):
        if noise == "rome":
            return 3.0 * subject_embedding_std(model, tokenizer, load_facts() if facts is None else facts)
        if noise == "paper":
            return 3.0 * embedding_matrix_std(model)
        try:
            noise = float(noise)
        except ValueError:
            raise InputError(f"noise must be 'rome', 'paper' or a number, got {noise!r}") from None
    noise = float(noise)
    if not math.isfinite(noise) or noise < 0:
        raise InputError(f"noise σ must be a finite number >= 0, got {noise}")
    return noise


# ---- the patched forward -------------------------------------------------------------------------
def _module_for(arch: Arch, kind: str, layer: int):
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


def _last_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits at the last position only, (rows, vocab)."""
    try:
        out = model(input_ids=input_ids, logits_to_keep=1, use_cache=False)
    except TypeError:  # models without logits_to_keep: compute all, keep the last
        out = model(input_ids=input_ids, use_cache=False)
    return out.logits[:, -1]


@torch.no_grad()
def clean_states(model, input_ids: torch.Tensor, kinds: Iterable[str] = KINDS) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One clean forward: every block's {block, mlp, attn} output, ``{kind: (L, T, d)}``, and the last logits."""
    arch = arch_of(model)
    kinds = list(kinds)
    store: dict[str, list] = {k: [None] * arch.n_layers for k in kinds}
    handles = []

    def recorder(kind, layer):
        def hook(module, args, output):
            store[kind][layer] = block_output(output)[0].detach()
        return hook

    try:
        for kind in kinds:
            for layer in range(arch.n_layers):
                handles.append(_module_for(arch, kind, layer).register_forward_hook(recorder(kind, layer)))
        logits = _last_logits(model, input_ids)
    finally:
        for h in handles:
            h.remove()
    return {k: torch.stack(v) for k, v in store.items()}, logits[0]


@torch.no_grad()
def patched_probs(model, input_ids: torch.Tensor, target_id: int, *, noise: torch.Tensor | None = None,
                  kind: str = "block", restore: torch.Tensor | None = None,
                  clean: torch.Tensor | None = None) -> torch.Tensor:
    """p(target) at the last position for a batch of corrupted-and-restored runs of one prompt.

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
    handles = []

    def add_noise(module, args, output):
        return output + noise.to(device=output.device, dtype=output.dtype)

    def restorer(mask_l, clean_l):
        sel = mask_l[:, :, None]  # (rows, T, 1)

        def hook(module, args, output):
            h = block_output(output)
            return _replace_output(output, torch.where(sel, clean_l.to(h.dtype)[None], h))
        return hook

    try:
        if noise is not None:
            handles.append(arch.embed.register_forward_hook(add_noise))
        if restore is not None:
            if clean is None:
                raise ValueError("restore needs the clean states")
            restore = restore.to(input_ids.device)
            for layer in range(arch.n_layers):
                mask_l = restore[:, layer]
                if bool(mask_l.any()):
                    handles.append(_module_for(arch, kind, layer).register_forward_hook(
                        restorer(mask_l, clean[layer])))
        logits = _last_logits(model, ids)
    finally:
        for h in handles:
            h.remove()
    return torch.softmax(logits.float(), dim=-1)[:, target_id]


def subject_noise(located: Located, d_model: int, samples: int, sigma: float, seed: int) -> torch.Tensor:
    """Seeded Gaussian noise, (samples, T, d): N(0, σ²) at the subject tokens, zero elsewhere."""
    gen = torch.Generator().manual_seed(int(seed))
    a, b = located.subject_range
    noise = torch.zeros(samples, located.n_tokens, d_model)
    noise[:, a:b] = sigma * torch.randn(samples, b - a, d_model, generator=gen)
    return noise


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
        def hook(module, args, kwargs):
            inputs[i] = block_input(args, kwargs).detach()
            calls[i] = (args, kwargs)
        return hook

    def add_noise(module, args, output):
        return output + noise.to(device=output.device, dtype=output.dtype)

    handles = [arch.embed.register_forward_hook(add_noise)]
    try:
        for i in range(L):
            handles.append(arch.layers[i].register_forward_pre_hook(recorder(i), with_kwargs=True))
        logits = _last_logits(model, input_ids.expand(noise.shape[0], -1))
    finally:
        for h in handles:
            h.remove()
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


# ---- one prompt ----------------------------------------------------------------------------------
@torch.no_grad()
def _restored_logits(model, kind, restore, clean, start, inputs, calls, sample) -> torch.Tensor:
    """Last logits of corrupted rows with clean ``kind`` outputs restored where ``restore`` (rows, L, T) is True."""
    arch = arch_of(model)
    restore = restore.to(clean.device)
    handles = []
    try:
        for layer in range(start, arch.n_layers):
            mask_l = restore[:, layer]
            if bool(mask_l.any()):
                sel = mask_l[:, :, None]

                def hook(module, args, output, sel=sel, clean_l=clean[layer]):
                    h = block_output(output)
                    return _replace_output(output, torch.where(sel, clean_l.to(h.dtype)[None], h))
                handles.append(_module_for(arch, kind, layer).register_forward_hook(hook))
        return resume_from(model, start, inputs, calls, sample)
    finally:
        for h in handles:
            h.remove()


@dataclass
class Trace:
    """Causal trace of one prompt and one kind: restored p(target) over (layer, token)."""

    prompt: str
    subject: str
    target: str                    # the target token as text (e.g. " Seattle")
    tokens: list[str]
    roles: list[str]
    subject_range: tuple[int, int]
    kind: str
    window: int
    samples: int
    sigma: float
    p_clean: float
    p_corrupt: float
    grid: np.ndarray               # (L, T) mean restored p(target); NaN where not traced
    model: str = ""

    @property
    def n_layers(self) -> int:
        return int(self.grid.shape[0])

    @property
    def effect(self) -> np.ndarray:
        """Normalised indirect effect (p_restored − p_corrupt) / (p_clean − p_corrupt), (L, T)."""
        gap = self.p_clean - self.p_corrupt
        if abs(gap) < 1e-12:  # the noise changed nothing: the effect is undefined
            return np.full_like(self.grid, np.nan)
        return (self.grid - self.p_corrupt) / gap

    def table(self) -> pd.DataFrame:
        """Tidy: one row per (layer, token): layer (0-based block), depth (l+1)/L, token, role, p, effect."""
        L, T = self.grid.shape
        layer, tok = np.meshgrid(np.arange(L), np.arange(T), indexing="ij")
        df = pd.DataFrame({
            "model": self.model, "prompt": self.prompt, "subject": self.subject, "target": self.target,
            "kind": self.kind, "window": self.window, "samples": self.samples,
            "layer": layer.ravel(), "depth": (layer.ravel() + 1) / L,
            "token_index": tok.ravel(), "token": [self.tokens[t] for t in tok.ravel()],
            "role": [self.roles[t] for t in tok.ravel()],
            "p": self.grid.ravel(), "effect": self.effect.ravel(),
            "p_clean": self.p_clean, "p_corrupt": self.p_corrupt, "sigma": self.sigma,
        })
        return df.dropna(subset=["p"]).reset_index(drop=True)

    def summary(self, digits: int = 4) -> dict:
        """JSON-able key numbers and the grid (rows = layers, columns = tokens)."""
        r = lambda x: None if x is None or not np.isfinite(x) else round(float(x), digits)  # noqa: E731
        return {"prompt": self.prompt, "subject": self.subject, "target": self.target, "kind": self.kind,
                "window": self.window, "samples": self.samples, "sigma": r(self.sigma),
                "p_clean": r(self.p_clean), "p_corrupt": r(self.p_corrupt), "tokens": self.tokens,
                "subject_range": list(self.subject_range),
                "grid": [[r(v) for v in row] for row in self.grid]}


class CausalTracer:
    """Causal tracing of one model (paper §6): ``CausalTracer(model, tok).trace(prompt, subject, target)``.

    The noise σ is resolved once (the "rome" preset needs a fact set; by default ours, ``data/facts``).
    """

    def __init__(self, model, tokenizer, config: TraceConfig | None = None, *,
                 facts: Sequence["Fact"] | None = None, name: str = ""):
        self.model, self.tokenizer = model, tokenizer
        self.config = config or TraceConfig()
        if not isinstance(self.config.samples, int) or self.config.samples < 1:
            raise InputError(f"samples must be a positive integer, got {self.config.samples!r}")
        if self.config.max_batch < 1:
            raise InputError(f"max_batch must be >= 1, got {self.config.max_batch}")
        self.arch = arch_of(model)
        self.name = name or getattr(getattr(model, "config", None), "_name_or_path", "") or self.arch.name
        self.sigma = noise_sigma(model, tokenizer, self.config.noise, facts)
        self.device = next(model.parameters()).device

    def trace(self, prompt: str, subject: str, target: str | None = None, *, kinds: Sequence[str] = ("block",),
              positions: Sequence[int] | str | None = None, progress: bool = False) -> dict[str, Trace]:
        """Trace one prompt for each kind in ``kinds``; returns ``{kind: Trace}``.

        ``positions``: token indices to restore (None: all; negative indices count from the end),
        or role names joined by commas, e.g. ``"last subject,last token"``.
        """
        for kind in kinds:
            if kind not in KINDS:
                raise InputError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        loc = locate(self.tokenizer, prompt, subject, target)
        ids = loc.input_ids.to(self.device)
        clean, logits = clean_states(self.model, ids, kinds)
        target_id = int(logits.argmax()) if loc.target_id is None else loc.target_id
        p_clean = float(torch.softmax(logits.float(), -1)[target_id])
        cfg, L, T = self.config, self.arch.n_layers, loc.n_tokens
        S = cfg.samples
        noise = subject_noise(loc, self.arch.d_model, cfg.samples, self.sigma, cfg.seed).to(self.device)
        inputs, calls, corrupt_logits = corrupted_run(self.model, ids, noise)
        p_corrupt = float(torch.softmax(corrupt_logits.float(), -1)[:, target_id].mean())
        sites = self._positions(loc, positions)
        roles = loc.roles()
        out = {}
        for kind in kinds:
            window = cfg.window_for(kind)
            grid = np.full((L, T), np.nan)
            for t in sites:
                if t < loc.subject_range[0]:  # causal: clean == corrupted before the subject
                    grid[:, t] = p_corrupt
            run_sites = [t for t in sites if t >= loc.subject_range[0]]
            layers = range(L)
            if progress:
                from tqdm.auto import tqdm
                layers = tqdm(layers, desc=f"trace {kind}", leave=False)
            for layer in layers:
                if run_sites:
                    grid[layer, run_sites] = self._layer(target_id, (inputs, calls), S, clean[kind], kind,
                                                         window_layers(layer, L, window), run_sites)
            out[kind] = Trace(prompt=loc.text, subject=loc.subject, target=self.tokenizer.decode([target_id]),
                              tokens=loc.tokens, roles=roles, subject_range=loc.subject_range, kind=kind,
                              window=window, samples=cfg.samples, sigma=self.sigma, p_clean=p_clean,
                              p_corrupt=p_corrupt, grid=grid, model=self.name)
        return out

    def _layer(self, target_id, corrupted, S, clean, kind, layers: range, sites: list[int]) -> np.ndarray:
        """All sites of one layer in batched forwards: rows = sites × samples. Returns mean p per site."""
        inputs, calls = corrupted
        L, T = self.arch.n_layers, inputs[0].shape[1]
        rows = len(sites) * S
        restore = torch.zeros(rows, L, T, dtype=torch.bool)
        for i, t in enumerate(sites):
            restore[i * S:(i + 1) * S, layers.start:layers.stop, t] = True
        sample = torch.arange(S).repeat(len(sites))  # row i*S+s carries noise sample s
        probs = []
        for lo in range(0, rows, self.config.max_batch):
            hi = min(rows, lo + self.config.max_batch)
            # below the first restored block every row equals its corrupted run: resume from there
            logits = _restored_logits(self.model, kind, restore[lo:hi], clean, layers.start, inputs, calls,
                                      sample[lo:hi])
            probs.append(torch.softmax(logits.float(), dim=-1)[:, target_id])
        return torch.cat(probs).view(len(sites), S).mean(1).cpu().numpy()

    @staticmethod
    def _positions(loc: Located, positions) -> list[int]:
        T = loc.n_tokens
        if positions is None:
            return list(range(T))
        if isinstance(positions, str):
            wanted = [p.strip() for p in positions.split(",") if p.strip()]
            bad = [w for w in wanted if w not in ROLES]
            if bad:
                raise InputError(f"unknown token role(s) {', '.join(bad)}; use {', '.join(ROLES)}")
            roles = loc.roles()
            return [t for t in range(T) if roles[t] in wanted]
        out = []
        for p in positions:
            if not -T <= int(p) < T:
                raise InputError(f"token position {p} out of range for a {T}-token prompt")
            out.append(int(p) % T)
        return sorted(set(out))


def trace(model, tokenizer, prompt: str, subject: str, target: str | None = None, *,
          kinds: Sequence[str] = ("block",), config: TraceConfig | None = None, **kwargs) -> dict[str, Trace]:
    """Convenience: ``CausalTracer(model, tokenizer, config).trace(prompt, subject, target, kinds=kinds)``."""
    return CausalTracer(model, tokenizer, config).trace(prompt, subject, target, kinds=kinds, **kwargs)


def naive_grid(model, tokenizer, prompt: str, subject: str, target: str | None, *, kind: str = "block",
               config: TraceConfig | None = None, sigma: float | None = None) -> np.ndarray:
    """Reference implementation: one forward per (layer, token, sample). For tests and the benchmark only."""
    cfg = config or TraceConfig()
    arch = arch_of(model)
    loc = locate(tokenizer, prompt, subject, target)
    device = next(model.parameters()).device
    ids = loc.input_ids.to(device)
    clean, logits = clean_states(model, ids, (kind,))
    target_id = int(logits.argmax()) if loc.target_id is None else loc.target_id
    sigma = noise_sigma(model, tokenizer, cfg.noise) if sigma is None else sigma
    noise = subject_noise(loc, arch.d_model, cfg.samples, sigma, cfg.seed).to(device)
    L, T = arch.n_layers, loc.n_tokens
    grid = np.zeros((L, T))
    for layer in range(L):
        window = window_layers(layer, L, cfg.window_for(kind))
        for t in range(T):
            ps = []
            for s in range(cfg.samples):
                restore = torch.zeros(1, L, T, dtype=torch.bool)
                restore[0, window.start:window.stop, t] = True
                ps.append(float(patched_probs(model, ids, target_id, noise=noise[s:s + 1], kind=kind,
                                              restore=restore, clean=clean[kind])[0]))
            grid[layer, t] = np.mean(ps)
    return grid


# ---- the fact set --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fact:
    """One (prompt, subject, target) triple of our fact set (``data/facts``)."""

    id: str
    relation: str
    prompt: str
    subject: str
    target: str


def load_facts(path: str | Path | None = None) -> list[Fact]:
    """The fact set (default: ``data/facts/facts.jsonl``, the facts Gemma-3-270M gets right at top-1)."""
    path = FACTS_PATH if path is None else Path(path)
    if not path.exists():
        raise InputError(f"fact file not found: {path}")
    facts = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            facts.append(Fact(id=str(row["id"]), relation=str(row.get("relation", "")), prompt=row["prompt"],
                              subject=row["subject"], target=row["target"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InputError(f"{path}: line {i + 1} is not a fact (JSON with id, prompt, subject, target)") from None
    return facts


def save_facts(facts: Iterable[Fact], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(f), ensure_ascii=False) + "\n" for f in facts), encoding="utf-8")
    return path


@torch.no_grad()
def check_facts(model, tokenizer, facts: Sequence[Fact], *, progress: bool = False) -> pd.DataFrame:
    """Does the model know each fact? p and rank of the target's first token at the prediction position.

    One row per fact: id, relation, prompt, target, target_token, p_target, rank (1 = top-1), top1_token, correct.
    """
    device = next(model.parameters()).device
    rows = []
    it = facts
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(facts, desc="check facts", leave=False)
    for fact in it:
        loc = locate(tokenizer, fact.prompt, fact.subject, fact.target)
        logits = _last_logits(model, loc.input_ids.to(device))[0].float()
        probs = torch.softmax(logits, -1)
        p = float(probs[loc.target_id])
        rank = int((probs > probs[loc.target_id]).sum()) + 1
        top1 = int(probs.argmax())
        rows.append({"id": fact.id, "relation": fact.relation, "prompt": fact.prompt, "target": fact.target,
                     "target_token": tokenizer.decode([loc.target_id]), "p_target": p, "rank": rank,
                     "top1_token": tokenizer.decode([top1]), "correct": rank == 1})
    return pd.DataFrame(rows)


def known_facts(model, tokenizer, facts: Sequence[Fact]) -> list[Fact]:
    """The facts the model gets right at top-1 (how ``data/facts/facts.jsonl`` was made from the candidates)."""
    check = check_facts(model, tokenizer, facts)
    keep = set(check.loc[check["correct"], "id"])
    return [f for f in facts if f.id in keep]


def build_fact_set(model_name: str = "gemma-3-270m", *, dtype=torch.float32) -> tuple[list[Fact], pd.DataFrame]:
    """Re-make the committed fact set: check every candidate on ``model_name`` (fp32) and keep the top-1 ones.

    ``python -m depthlib.tracing facts`` runs this and rewrites ``data/facts/facts.jsonl``.
    """
    from depthlib.data import load_model
    model, tok = load_model(model_name, dtype=dtype)
    candidates = load_facts(CANDIDATES_PATH)
    check = check_facts(model, tok, candidates)
    keep = set(check.loc[check["correct"], "id"])
    return [f for f in candidates if f.id in keep], check


# ---- fact-set averages ---------------------------------------------------------------------------
def trace_facts(tracer: CausalTracer, facts: Sequence[Fact], *, kinds: Sequence[str] = KINDS,
                positions: str | None = "last subject,last token", progress: bool = False) -> pd.DataFrame:
    """Trace every fact; one tidy table (fact id, kind, layer, depth, token role, p, effect, p_clean, p_corrupt).

    By default only the last subject token and the last token are restored (the two sites of the
    paper's reading), which makes a fact-set average cheap.
    """
    frames = []
    it = facts
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(facts, desc="trace facts", leave=False)
    for fact in it:
        traces = tracer.trace(fact.prompt, fact.subject, fact.target, kinds=kinds, positions=positions)
        for tr in traces.values():
            df = tr.table()
            df.insert(0, "fact_id", fact.id)
            frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def average_effect(table: pd.DataFrame, *, min_gap: float = 0.0) -> pd.DataFrame:
    """Mean normalised indirect effect by (model, kind, role, layer) over facts (ROME's average figure).

    Facts with p_clean − p_corrupt <= ``min_gap`` (the noise did not remove the fact) are left out.
    Columns: model, kind, role, layer, depth, effect (mean), sem (standard error), p (mean), n_facts.
    """
    t = table[(table["p_clean"] - table["p_corrupt"]) > min_gap]
    g = t.groupby(["model", "kind", "role", "layer", "depth"], sort=True)
    out = g.agg(effect=("effect", "mean"), sd=("effect", "std"), p=("p", "mean"),
                n_facts=("effect", "size")).reset_index()
    out["sem"] = out["sd"] / np.sqrt(out["n_facts"])
    return out.drop(columns="sd")


# ---- the chapter (notebooks/04_causal_tracing.ipynb): profiles, cached runs, summaries --------------
EXPERIMENT = "causal_tracing"
#: The paper's prompt (spec §6: "The space needle is in downtown" -> " Seattle") and two classic ROME facts.
CHAPTER_PROMPTS = (
    ("The Space Needle is in downtown", "Space Needle", " Seattle"),
    ("The Eiffel Tower is located in the city of", "Eiffel Tower", " Paris"),
    ("Steve Jobs was the co-founder of", "Steve Jobs", " Apple"),
)


@dataclass(frozen=True)
class ChapterProfile:
    """What the chapter computes under one profile (design: Profiles)."""

    name: str
    models: tuple[str, ...]            # offline registry names (online ids can be added by the caller)
    n_prompts: int                     # how many of CHAPTER_PROMPTS get full heat maps
    kinds: tuple[str, ...]             # restored kinds for the heat maps and the fact-set average
    samples: int                       # noise samples (ROME 10)
    noise: str = "rome"
    window: int | None = None          # None: ROME's (1 block, 10 MLP/attn)
    n_facts: int | None = None         # facts averaged (None: the whole set the model knows)
    fact_samples: int | None = None    # noise samples for the fact-set average (None: samples)
    fact_positions: str | None = "last subject,last token"  # None: every token (ROME's 6 categories)
    fact_kinds: tuple[str, ...] | None = None  # kinds averaged over the fact set (None: kinds)
    n_check: int | None = None         # facts checked for top-1 knowledge (None: all; smoke checks a few)
    dtype: str = "float32"             # fp32: CPUs without avx512_bf16 run bf16 ~7x slower (measured here)
    seed: int = 1


CHAPTER_PROFILES = {
    # seconds: one prompt, two noise samples, block outputs, four facts
    "smoke": ChapterProfile("smoke", ("gemma-3-270m", "smollm2-135m"), 1, ("block",), 2, n_facts=4, n_check=8),
    # minutes on 2 CPU cores: ROME's settings (10 samples, windows) for the heat maps of two prompts;
    # the fact-set average on block outputs only, 3 samples, 30 facts per model (a CPU cannot afford more)
    "cpu": ChapterProfile("cpu", ("gemma-3-270m", "smollm2-135m"), 2, KINDS, 10, n_facts=30, fact_samples=3,
                          fact_kinds=("block",)),
    # a GPU: the paper's noise (3 x embedding-matrix std, 1 sample, window 1), every fact, every token
    "paper": ChapterProfile("paper", ("gemma-3-270m", "smollm2-135m"), 3, KINDS, 1, noise="paper", window=1,
                            fact_positions=None),
}


def _key(model: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in model)


def _facts_digest(facts: Sequence[Fact]) -> str:
    import hashlib
    return hashlib.sha256(json.dumps([asdict(f) for f in facts]).encode()).hexdigest()[:12]


def chapter_config(profile: str, extra_models: Sequence[str] = (), device: str = "cpu") -> dict:
    if profile not in CHAPTER_PROFILES:
        raise InputError(f"profile must be one of {', '.join(CHAPTER_PROFILES)}, got {profile!r}")
    prof = CHAPTER_PROFILES[profile]
    return {**asdict(prof), "models": list(prof.models) + list(extra_models), "device": device.split(":")[0],
            "prompts": [list(p) for p in CHAPTER_PROMPTS[: prof.n_prompts]], "facts": _facts_digest(load_facts())}


def compute_chapter(profile: str = "smoke", *, extra_models: Sequence[str] = (), device: str = "cpu",
                    progress: bool = False):
    """Compute (or resume) the chapter's tables for ``profile`` in the results cache; returns the Run.

    Tables per model M: ``check_M`` (does M know each fact and chapter prompt), ``prompts_M`` (heat maps of
    the chapter prompts M knows, every token, every kind) and ``facts_M`` (the fact-set traces).
    """
    import time

    from depthlib import results
    from depthlib.data import load_model
    config = chapter_config(profile, extra_models, device)
    run = results.open_run(EXPERIMENT, config)
    if run.complete:
        return run
    prof = CHAPTER_PROFILES[profile]
    facts = load_facts()
    start = time.time()
    for name in config["models"]:
        key = _key(name)
        if run.has(f"check_{key}") and run.has(f"prompts_{key}") and run.has(f"facts_{key}"):
            continue
        model, tok = load_model(name, dtype=prof.dtype, device=device)
        prompts = [Fact(f"p{i + 1}", "chapter prompt", *p) for i, p in enumerate(CHAPTER_PROMPTS[: prof.n_prompts])]
        check = check_facts(model, tok, prompts + list(facts)[: prof.n_check])
        check.insert(0, "model", name)
        run.write_table(f"check_{key}", check)
        known = set(check.loc[check["correct"], "id"])
        cfg = TraceConfig(samples=prof.samples, noise=prof.noise, window=prof.window, seed=prof.seed)
        tracer = CausalTracer(model, tok, cfg, facts=facts, name=name)
        frames = []
        for p in prompts:
            if p.id in known:
                for tr in tracer.trace(p.prompt, p.subject, p.target, kinds=prof.kinds, progress=progress).values():
                    frames.append(tr.table())
        run.write_table(f"prompts_{key}", pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
        chosen = [f for f in facts if f.id in known][: prof.n_facts]
        fcfg = TraceConfig(samples=prof.fact_samples or prof.samples, noise=prof.noise, window=prof.window,
                           seed=prof.seed)
        ftracer = CausalTracer(model, tok, fcfg, facts=facts, name=name)
        run.write_table(f"facts_{key}", trace_facts(ftracer, chosen, kinds=prof.fact_kinds or prof.kinds,
                                                    positions=prof.fact_positions, progress=progress))
        del model
    run.finish(profile=profile, seed=prof.seed, wall_time_s=time.time() - start, device=device,
               models=config["models"], n_facts_total=len(facts))
    return run


def chapter_run(profile: str = "smoke", *, compute: bool = True, **kwargs):
    """The run a notebook shows: for ``smoke`` the smoke run itself (so the committed outputs are stable);
    otherwise the best complete run at or above ``profile`` (results.best_run), computed if there is none."""
    from depthlib import results
    if profile not in CHAPTER_PROFILES:
        raise InputError(f"profile must be one of {', '.join(CHAPTER_PROFILES)}, got {profile!r}")
    ranks = results.PROFILE_RANK
    allowed = ("smoke",) if profile == "smoke" else ranks[: ranks.index(profile) + 1]
    best = results.best_run(EXPERIMENT, profiles=allowed)
    wanted = json.loads(json.dumps(chapter_config(profile, **kwargs)))
    if best is not None and (profile != "smoke" or best.config == wanted):
        return best
    if not compute:
        return None
    return compute_chapter(profile, **kwargs)


def chapter_tables(run) -> dict[str, pd.DataFrame]:
    """``{"check", "prompts", "facts"}`` tables of a chapter run, all models concatenated."""
    out = {}
    for name in ("check", "prompts", "facts"):
        frames = [run.table(t) for t in run.tables(f"{name}_")]
        frames = [f for f in frames if not f.empty]
        out[name] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return out


def functional_groups(facts_table: pd.DataFrame, kind: str = "block") -> pd.DataFrame:
    """The paper's reading of Fig. 6 made into numbers, one row per model.

    From the fact-set average of one kind: the *late group* = the blocks from the crossover on, where
    restoring the last token recovers at least as much as restoring the last subject token (for this block
    and every later one); the *early group* = the blocks below the crossover. Reports where each group
    sits (in l/ℓ), its peak mean effect, and how much recovery fluctuates from layer to layer inside it:
    ``jitter_fact`` = mean over facts of the mean |Δ effect| between neighbouring blocks (inside the group,
    at the group's token), ``jitter_mean`` = the same on the averaged curve. jitter_fact ≫ jitter_mean means
    the layer-to-layer fluctuations are fact-specific and average out.
    """
    rows = []
    avg = average_effect(facts_table[facts_table["kind"] == kind])
    for model, a in avg.groupby("model", sort=False):
        s = a[a["role"] == "last subject"].set_index("layer")["effect"]
        t = a[a["role"] == "last token"].set_index("layer")["effect"]
        L = int(a["layer"].max()) + 1
        # crossover: the first block from which restoring the last token beats the last subject token
        # for every later block; the early group is below it, the late group from it on (contiguous)
        cross = L
        for l in range(L - 1, -1, -1):
            if t.get(l, np.nan) >= s.get(l, np.nan):
                cross = l
            else:
                break
        early, late = list(range(cross)), list(range(cross, L))
        row = {"model": model, "kind": kind, "n_layers": L, "n_facts": int(a["n_facts"].max())}
        f = facts_table[(facts_table["model"] == model) & (facts_table["kind"] == kind)
                        & ((facts_table["p_clean"] - facts_table["p_corrupt"]) > 0)]
        for group, layers, role, curve in (("early", early, "last subject", s), ("late", late, "last token", t)):
            if not layers:
                continue
            row[f"{group}_from"] = (min(layers) + 1) / L
            row[f"{group}_to"] = (max(layers) + 1) / L
            row[f"{group}_peak_depth"] = (int(curve.loc[layers].idxmax()) + 1) / L
            row[f"{group}_peak_effect"] = float(curve.loc[layers].max())
            per = f[(f["role"] == role) & f["layer"].isin(layers)].sort_values("layer")
            jit = per.groupby("fact_id")["effect"].apply(lambda e: np.abs(np.diff(e.to_numpy())).mean()
                                                           if len(e) > 1 else np.nan)
            row[f"{group}_jitter_fact"] = float(jit.mean())
            half = [l for l in layers if curve.get(l, np.nan) >= 0.5]
            row[f"{group}_half_depth"] = (min(half) + 1) / L if half else float("nan")
            c = curve.loc[layers].to_numpy()
            row[f"{group}_jitter_mean"] = float(np.abs(np.diff(c)).mean()) if len(c) > 1 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def prompt_peaks(prompts_table: pd.DataFrame) -> pd.DataFrame:
    """Per (model, prompt, kind): p_clean, p_corrupt and where restoring recovers most, at the last subject
    token and at the last token (block l and l/ℓ, restored p), and the first block whose restoration at the
    last token recovers half of the fact (effect >= 0.5; for block outputs the peak there is trivially the
    last block, whose output *is* the clean prediction)."""
    rows = []
    for (model, prompt, kind), g in prompts_table.groupby(["model", "prompt", "kind"], sort=False):
        row = {"model": model, "prompt": prompt, "kind": kind, "target": g["target"].iloc[0],
               "p_clean": float(g["p_clean"].iloc[0]), "p_corrupt": float(g["p_corrupt"].iloc[0])}
        for role, tag in (("last subject", "subject"), ("last token", "last")):
            r = g[g["role"] == role].sort_values("layer")
            best = r.loc[r["p"].idxmax()]
            row[f"{tag}_peak_block"] = int(best["layer"]) + 1
            row[f"{tag}_peak_depth"] = float(best["depth"])
            row[f"{tag}_peak_p"] = float(best["p"])
        # where the late site takes over: the first block whose restoration at the last token recovers half
        half = g[(g["role"] == "last token") & (g["effect"] >= 0.5)]
        row["last_half_block"] = int(half["layer"].min()) + 1 if not half.empty else None
        row["last_half_depth"] = float(half["depth"].min()) if not half.empty else None
        rows.append(row)
    return pd.DataFrame(rows)


def closing_note(tables: dict[str, pd.DataFrame]) -> str:
    """The chapter's closing numbers as Markdown, read from a run's tables (:func:`chapter_tables`)."""
    lines = []
    peaks = prompt_peaks(tables["prompts"]) if not tables["prompts"].empty else pd.DataFrame()
    check = tables["check"]
    for model in dict.fromkeys(check["model"]):
        c = check[(check["model"] == model) & ~check["id"].str.startswith("p")]
        lines.append(f"**{model}** gets {int(c['correct'].sum())} of the {len(c)} facts checked right at top-1 "
                     f"(the fact set has {len(load_facts())}).")
        pk = peaks[peaks["model"] == model] if not peaks.empty else peaks
        for row in pk.itertuples():
            lines.append(
                f"- \"{row.prompt}\" → \"{row.target}\", {row.kind}: p_clean = {row.p_clean:.3f}, "
                f"p_corrupt = {row.p_corrupt:.3f}; best recovery at the last subject token at block "
                f"{row.subject_peak_block} (l/ℓ = {row.subject_peak_depth:.2f}, p = {row.subject_peak_p:.3f}), "
                f"at the last token at block {row.last_peak_block} (l/ℓ = {row.last_peak_depth:.2f}, "
                f"p = {row.last_peak_p:.3f})" + (
                    f"; the last token recovers half from block {int(row.last_half_block)} "
                    f"(l/ℓ = {row.last_half_depth:.2f})." if pd.notna(row.last_half_block) else "."))
        f = tables["facts"]
        if f.empty or model not in set(f["model"]):
            continue
        for kind in [k for k in KINDS if k in set(f["kind"])]:
            g = functional_groups(f[f["model"] == model], kind)
            if g.empty:
                continue
            g = g.iloc[0]
            parts = [f"- fact-set average ({int(g['n_facts'])} facts), {kind}:"]
            if "early_from" in g and pd.notna(g.get("early_from")):
                parts.append(f"early group l/ℓ {g['early_from']:.2f}–{g['early_to']:.2f} (peak effect "
                             f"{g['early_peak_effect']:.2f} at l/ℓ = {g['early_peak_depth']:.2f}; jitter per fact "
                             f"{g['early_jitter_fact']:.2f} vs {g['early_jitter_mean']:.2f} of the mean),")
            if "late_from" in g and pd.notna(g.get("late_from")):
                half = (f"mean effect ≥ 0.5 from l/ℓ = {g['late_half_depth']:.2f}"
                        if pd.notna(g.get("late_half_depth")) else "mean effect < 0.5 throughout")
                parts.append(f"late group l/ℓ {g['late_from']:.2f}–{g['late_to']:.2f} ({half}; jitter per fact "
                             f"{g['late_jitter_fact']:.2f} vs {g['late_jitter_mean']:.2f} of the mean).")
            lines.append(" ".join(parts))
        lines.append("")
    return "\n".join(lines).strip()


def _main(argv: list[str] | None = None) -> int:
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["facts"]:
        print("usage: python -m depthlib.tracing facts [MODEL]   (re-make data/facts/facts.jsonl)", file=sys.stderr)
        return 2
    model_name = argv[1] if len(argv) > 1 else "gemma-3-270m"
    kept, check = build_fact_set(model_name)
    save_facts(kept, FACTS_PATH)
    cols = ["id", "relation", "prompt", "target_token", "p_target", "rank", "top1_token", "correct"]
    check[cols].round({"p_target": 4}).to_csv(FACTS_DIR / f"check_{_key(model_name)}.csv", index=False)
    print(f"{model_name}: {len(kept)} of {len(check)} candidate facts correct at top-1 -> {FACTS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

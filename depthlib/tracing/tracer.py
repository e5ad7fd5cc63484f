"""The causal tracer (paper §6, Fig. 6; Meng et al. 2022): restored p(target) over (layer, token) for one model.

Causal tracing runs the model three ways (:mod:`depthlib.tracing.patching`): clean (p_clean = p(target) at
the last position), corrupted (noise at the subject tokens, :mod:`depthlib.tracing.noise`; p_corrupt is the
mean over noise samples) and restored: the corrupted run with the clean value of one state put back at one site
(layer l, token t). What is restored (``kind``): the block output h_{l+1} (``"block"``), the MLP output
(``"mlp"``) or the attention output (``"attn"``) of block l. For MLP and attention ROME restores a *window* of
blocks around l (10, clipped at the ends), because one block's sublayer alone barely moves the output.

The normalised indirect effect of a site is (p_restored − p_corrupt) / (p_clean − p_corrupt): 0 = no recovery,
1 = full recovery (:attr:`TraceResult.effect`).

Speed: the clean run and the corrupted run are done once per prompt; all restored sites of one layer
(tokens × samples) run in one batched forward, which starts from the corrupted run's state at the first
restored block (below it every restored run *is* the corrupted run) and computes only the last position's
logits; sites before the first subject token are not run at all: in a causal model their clean and
corrupted states are identical, so restoring them gives p_corrupt exactly. Tests check all of this against
a plain loop of one full forward per (layer, token, sample) (:func:`naive_grid`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from depthlib.errors import InputError
from depthlib.models.arch import arch_of
from depthlib.tracing.facts import Fact
from depthlib.tracing.locate import ROLES, Located, locate
from depthlib.tracing.noise import noise_sigma, subject_noise
from depthlib.tracing.patching import KINDS, clean_states, corrupted_run, patched_probs, restored_logits


@dataclass(frozen=True)
class TraceConfig:
    """How to trace. Defaults are ROME's (anchors §A2); :func:`paper_config` gives the paper's (paper Fig. 6)."""

    samples: int = 10            # ROME averages 10 noise draws; the paper uses 1 (noisier maps)
    noise: str | float = "rome"  # "rome" | "paper" | σ as a float; see depthlib.tracing.noise
    window: int | None = None    # None: 1 for block outputs, 10 for MLP/attention (ROME)
    seed: int = 1                # ROME seeds its noise with RandomState(1); the same draw serves every site
    max_batch: int = 512         # rows per forward; lower it for big models on small GPUs

    def window_for(self, kind: str) -> int:
        if self.window is not None:
            return self.window
        return 1 if kind == "block" else 10


def paper_config(**overrides) -> TraceConfig:
    """The paper's settings (paper Fig. 6): one noise draw of 3 × the embedding-matrix std, window 1."""
    return TraceConfig(**{"samples": 1, "noise": "paper", "window": 1, **overrides})


def window_layers(layer: int, n_layers: int, window: int) -> range:
    """Blocks restored for a site at ``layer``: ``window`` blocks centred on it, clipped at 0 and L.

    As ROME: [l − ⌊w/2⌋, l + ⌈w/2⌉) ∩ [0, L); window 1 is the block itself.
    """
    if window < 1:
        raise InputError(f"window must be >= 1, got {window}")
    return range(max(0, layer - window // 2), min(n_layers, layer + (window + 1) // 2))


def _embedding_width(arch) -> int:
    """Width of the embedding output the noise is added to (d_model, except OPT-350m's smaller word embedding)."""
    weight = getattr(arch.embed, "weight", None)
    return int(weight.shape[-1]) if weight is not None else arch.d_model


@dataclass
class TraceResult:
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


#: The former name of :class:`TraceResult` (``depthlib.plots.tracing``'s docs still say ``Trace.table``).
Trace = TraceResult


class CausalTracer:
    """Causal tracing of one model (paper §6): ``CausalTracer(model, tok).trace(prompt, subject, target)``.

    The noise σ is resolved once (the "rome" preset needs a fact set; by default ours, the packaged one).
    """

    def __init__(self, model, tokenizer, config: TraceConfig | None = None, *,
                 facts: Sequence[Fact] | None = None, name: str = ""):
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
              positions: Sequence[int] | str | None = None, progress: bool = False) -> dict[str, TraceResult]:
        """Trace one prompt for each kind in ``kinds``; returns ``{kind: TraceResult}``.

        ``positions``: token indices to restore (None: all; negative indices count from the end),
        or role names joined by commas, e.g. ``"last subject,last token"``.
        """
        for kind in kinds:
            if kind not in KINDS:
                raise InputError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        loc = locate(self.tokenizer, prompt, subject, target)
        check_length(self.model, loc.n_tokens + 1)
        ids = loc.input_ids.to(self.device)
        clean, logits = clean_states(self.model, ids, kinds)
        target_id = int(logits.argmax()) if loc.target_id is None else loc.target_id
        p_clean = float(torch.softmax(logits.float(), -1)[target_id])
        cfg, L, T = self.config, self.arch.n_layers, loc.n_tokens
        S = cfg.samples
        noise = subject_noise(loc, _embedding_width(self.arch), cfg.samples, self.sigma, cfg.seed).to(self.device)
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
            out[kind] = TraceResult(prompt=loc.text, subject=loc.subject, target=self.tokenizer.decode([target_id]),
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
            logits = restored_logits(self.model, kind, restore[lo:hi], clean, layers.start, inputs, calls,
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
          kinds: Sequence[str] = ("block",), config: TraceConfig | None = None, **kwargs) -> dict[str, TraceResult]:
    """Convenience: ``CausalTracer(model, tokenizer, config).trace(prompt, subject, target, kinds=kinds)``."""
    return CausalTracer(model, tokenizer, config).trace(prompt, subject, target, kinds=kinds, **kwargs)


def check_length(model, n_tokens: int) -> None:
    """InputError if ``n_tokens`` exceed the model's position limit (positions past it are silently wrong)."""
    cfg = model.config
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if limit is not None and n_tokens > limit:
        raise InputError(f"the prompt and target need {n_tokens} tokens, more than the model's limit of {limit}")


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
    noise = subject_noise(loc, _embedding_width(arch), cfg.samples, sigma, cfg.seed).to(device)
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

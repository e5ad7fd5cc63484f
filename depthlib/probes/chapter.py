"""Chapter 2's glue: the profiles of the hidden-state probes, the runs the chapter shows, and their replay check.

Same three names as every chapter (see :mod:`depthlib.toy.chapter`): ``PROFILES``, ``chapter_runs`` (one run per
model, each found by :func:`depthlib.results.chapter_run`, computed if there is none) and ``replay``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.errors import InputError
from depthlib.probes.stream import ProbeConfig, probe_documents


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


def _expected(model: str):
    """Config of ``model``'s run under each profile that probes it (None where the profile does not)."""
    from depthlib.probes import probe_key

    def expected(profile: str) -> dict | None:
        p = PROFILES.get(profile)
        return probe_key(model, p.corpus, p.n_docs, p.config) if p is not None and model in p.models else None
    return expected


def chapter_runs(profile: str = "smoke", *, extra_models: Sequence[str] = (), rerun: bool = False,
                 progress: bool = False) -> dict[str, results.Run]:
    """The run of every model chapter 2 shows for ``profile``: the profile's models (computed if missing, e.g.
    ``paper`` probes Pythia on FineWeb and never falls back to a ``cpu`` run) and ``extra_models``, whose runs
    must exist already (made by ``depthlib probe --model NAME ...``; the best one of that model is shown)."""
    from depthlib.probes import experiment_name, run_probe
    results.check_profile(profile)
    p = PROFILES[profile]
    runs = {}
    for model in p.models:
        runs[model] = results.chapter_run(
            experiment_name(model), profile, lambda m=model: run_probe(m, p.corpus, p.n_docs, p.config, profile=profile,
                                                                    progress=progress),
            expected_config=_expected(model), rerun=rerun)
    for model in extra_models:
        if model in runs:
            continue
        run = results.select_run(experiment_name(model), profile, rerun=rerun, include_custom=True,
                                 expected_config=_expected(model))
        if run is None:
            raise InputError(f"no probe run of {model!r} yet: run `depthlib probe --model {model} ...` first")
        runs[model] = run
    return runs


def replay(run: results.Run, n_batches: int = 1) -> pd.DataFrame:
    """Probe the first ``n_batches`` batches of documents of a run again with the current code; returns each
    document's per-block mean angle, committed and recomputed (columns ``committed``, ``replayed``)."""
    from depthlib import data
    from depthlib.models import load_model
    cfg_dict = dict(run.config)
    model, corpus, n_docs = cfg_dict.pop("model"), cfg_dict.pop("corpus"), cfg_dict.pop("n_docs")
    cfg_dict.pop("dtype")
    cfg = ProbeConfig(**{**cfg_dict, "device": "cpu"})
    docs = data.corpus(corpus, min(n_docs, n_batches * cfg.batch_size))
    m, tok = load_model(model, dtype=cfg.torch_dtype, device="cpu")
    fresh = probe_documents(m, tok, docs, cfg, progress=False, model_name=model).docs
    committed = run.table("docs")
    cols = [c for c in committed.columns if c.startswith("theta_")]
    merged = fresh.merge(committed, on=["doc_index", "doc_id"], suffixes=("_replayed", "_committed"))
    return pd.DataFrame({"doc_index": np.repeat(merged["doc_index"].to_numpy(), len(cols)),
                         "metric": np.tile(cols, len(merged)),
                         "committed": merged[[f"{c}_committed" for c in cols]].to_numpy().ravel(),
                         "replayed": merged[[f"{c}_replayed" for c in cols]].to_numpy().ravel()})

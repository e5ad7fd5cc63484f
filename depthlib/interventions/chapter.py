"""Chapter 5's glue: the profiles of the interventions, the runs the chapter shows, and their replay check.

Same names as every chapter (see :mod:`depthlib.toy.chapter`): ``PROFILES``, ``chapter_runs`` (one run per LM and
one for the toy students, each found by :func:`depthlib.results.chapter_run`, computed if there is none) and
``replay``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.interventions import InterventionConfig, experiment_name, intervention_key, run_interventions
from depthlib.interventions.suite import SuiteConfig
from depthlib.interventions.toy import EXPERIMENT as TOY_EXPERIMENT
from depthlib.interventions.toy import ToyInterventionConfig, run_toy_interventions


@dataclass(frozen=True)
class InterventionProfile:
    """The settings of one profile of the interventions chapter (design: profiles)."""

    models: tuple[str, ...]
    corpus: str
    n_docs: int                       # scored documents (the rankings use ``config.rank_docs`` others)
    config: InterventionConfig
    toy: ToyInterventionConfig


_SMOKE_SUITE = SuiteConfig(ks=(1, 2, 4), draws=1, permutations=2, swaps=2, group_sizes=(2, 4))
PROFILES = {
    # seconds: proves the code path on both offline models and a tiny toy
    "smoke": InterventionProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 2,
                                 InterventionConfig(max_length=16, batch_size=2, rank_docs=2, suite=_SMOKE_SUITE),
                                 ToyInterventionConfig(depth=8, steps=60, batch=64, test_inputs=256, docs=4,
                                                       teacher_depth=16, suite=_SMOKE_SUITE)),
    # minutes on 2 CPU cores (benchmarks/bench_interventions.py sizes it): 8 scored addresses × 128 tokens
    "cpu": InterventionProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 8, InterventionConfig(), ToyInterventionConfig()),
    # a GPU: the Pythia suite on FineWeb, 256 documents × 512 tokens (not run by us)
    "paper": InterventionProfile(tuple(f"EleutherAI/pythia-{s}" for s in ("160m", "410m", "1.4b")), "fineweb", 256,
                                 InterventionConfig(max_length=512, batch_size=16, rank_docs=64, device="cuda",
                                                    suite=SuiteConfig(ks=(1, 2, 4, 6, 8, 12), draws=8, permutations=32,
                                                                      swaps=16)),
                                 ToyInterventionConfig(steps=40_000, batch=1024, variant="exp-9")),
}


def _lm_run(profile: str, model: str, rerun: bool, progress: bool) -> results.Run:
    def expected(prof: str) -> dict | None:
        p = PROFILES.get(prof)
        if p is None or model not in p.models:
            return None
        return intervention_key(model, p.corpus, p.n_docs, p.config)
    p = PROFILES[profile]
    return results.chapter_run(experiment_name(model), profile,
                               lambda: run_interventions(model, p.corpus, p.n_docs, p.config, profile=profile,
                                                         progress=progress),
                               expected_config=expected, rerun=rerun)


def _toy_run(profile: str, rerun: bool, progress: bool) -> results.Run:
    def expected(prof: str) -> dict | None:
        return dataclasses.asdict(PROFILES[prof].toy) if prof in PROFILES else None
    return results.chapter_run(TOY_EXPERIMENT, profile,
                               lambda: run_toy_interventions(PROFILES[profile].toy, profile=profile, progress=progress),
                               expected_config=expected, rerun=rerun)


def chapter_runs(profile: str = "smoke", *, rerun: bool = False, progress: bool = False) -> dict[str, results.Run]:
    """{model name: run} for the profile's LMs and ``"toy"`` for the toy students."""
    results.check_profile(profile)
    runs = {model: _lm_run(profile, model, rerun, progress) for model in PROFILES[profile].models}
    runs["toy"] = _toy_run(profile, rerun, progress)
    return runs


def tables(runs: dict[str, results.Run]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(plans, scores, distances, influence) of all runs, each with a ``model`` column (toy rows: ``toy ρ=…``)."""
    out = []
    for name in ("plans", "scores", "distances", "influence"):
        parts = []
        for model, run in runs.items():
            df = run.table(name)
            parts.append(df if "model" in df else df.assign(model=model))
        out.append(pd.concat(parts, ignore_index=True))
    return tuple(out)


def replay(run: results.Run, n_plans: int = 3) -> pd.DataFrame:
    """Score the first batch of an LM run again with the current code, for the identity and a few other plans;
    returns per (plan, document) the committed and recomputed loss and KL (columns ``committed``, ``replayed``)."""
    cfg_dict = dict(run.config)
    model, corpus = cfg_dict["model"], cfg_dict["corpus"]
    suite = SuiteConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg_dict["suite"].items()})
    fields = {f.name for f in dataclasses.fields(InterventionConfig)} - {"suite", "device"}
    cfg = InterventionConfig(**{k: cfg_dict[k] for k in fields}, suite=suite)
    committed = run.table("scores")
    plans = list(dict.fromkeys(run.table("plans")["plan"]))
    chosen = [plans[0]] + [plans[i] for i in np.linspace(1, len(plans) - 1, n_plans - 1).astype(int)]
    fresh = run_interventions(model, corpus, cfg.batch_size, dataclasses.replace(cfg, suite=suite), plans=chosen[1:],
                              progress=False, force=True).table("scores")
    merged = fresh.merge(committed, on=["plan", "doc_index"], suffixes=("_replayed", "_committed"))
    return pd.DataFrame({"plan": np.repeat(merged["plan"].to_numpy(), 2),
                         "metric": np.tile(["loss", "kl"], len(merged)),
                         "committed": merged[["loss_committed", "kl_committed"]].to_numpy().ravel(),
                         "replayed": merged[["loss_replayed", "kl_replayed"]].to_numpy().ravel()})

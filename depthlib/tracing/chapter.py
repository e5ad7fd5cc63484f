"""Chapter 4's glue: the profiles of the causal-tracing chapter, the run it shows, and its replay check.

Every chapter has this module with the same names (design: "Every chapter has the same shape"): ``PROFILES``
(smoke | cpu | paper settings), ``chapter_run(profile, rerun=...)`` (the run found by
:func:`depthlib.results.chapter_run`, computed if there is none) and ``replay(run)`` (recompute a cheap part of a
run with the current code and return the committed and recomputed numbers side by side).

A run's tables, per model M (``M`` made file-safe): ``check_M`` (does M know each chapter prompt and fact; column
``kind`` is ``"prompt"`` or ``"fact"``), ``prompts_M`` (heat maps of the chapter prompts M knows, every token,
every kind of the profile) and ``facts_M`` (the fact-set traces at the profile's token positions).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import pandas as pd

from depthlib import results
from depthlib.errors import InputError
from depthlib.models.loading import load_model
from depthlib.tracing.facts import Fact, check_facts, load_facts, safe_name
from depthlib.tracing.patching import KINDS
from depthlib.tracing.tracer import CausalTracer, TraceConfig, trace_facts

EXPERIMENT = "causal_tracing"
#: The modules whose code decides a run's numbers (its manifest records their fingerprint; not this module).
CODE = ("depthlib.tracing.locate", "depthlib.tracing.noise", "depthlib.tracing.patching", "depthlib.tracing.tracer",
        "depthlib.tracing.facts", "depthlib.models.arch", "depthlib.models.loading", "depthlib.models.hooks")
#: The paper's prompt (paper Fig. 6: "The space needle is in downtown" -> " Seattle") and two classic ROME facts.
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


PROFILES = {
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


def _facts_digest(facts: Sequence[Fact]) -> str:
    return hashlib.sha256(json.dumps([asdict(f) for f in facts]).encode()).hexdigest()[:12]


def chapter_config(profile: str, extra_models: Sequence[str] = ()) -> dict:
    """The results-cache config of a chapter run: the profile's settings, its models and prompts, the fact set.

    The device is not part of it (it changes speed, not the numbers; the manifest records it)."""
    results.check_profile(profile)
    prof = PROFILES[profile]
    return {**asdict(prof), "models": list(prof.models) + list(extra_models),
            "prompts": [list(p) for p in CHAPTER_PROMPTS[: prof.n_prompts]], "facts": _facts_digest(load_facts())}


#: the noise-only baseline traces the same facts again with the noise seed shifted by this much
BASELINE_SEED_OFFSET = 1000


def _trace_config(config: dict, *, samples: int | None = None, seed_offset: int = 0) -> TraceConfig:
    """The TraceConfig of a run's heat maps (or, with ``samples``, of its fact-set traces; with ``seed_offset``, of
    the noise-only baseline: the same traces under independent noise)."""
    return TraceConfig(samples=samples or config["samples"], noise=config["noise"], window=config["window"],
                       seed=config["seed"] + seed_offset)


def _chapter_facts(profile: ChapterProfile) -> list[Fact]:
    return [Fact(f"p{i + 1}", "chapter prompt", *p) for i, p in enumerate(CHAPTER_PROMPTS[: profile.n_prompts])]


def profile_of(config: dict) -> ChapterProfile:
    """The :class:`ChapterProfile` a run's config holds (so that a job elsewhere needs the config alone)."""
    names = [f.name for f in dataclasses.fields(ChapterProfile)]
    return ChapterProfile(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in names})


def model_prompts(name: str, config: dict, device: str = "cpu",
                  progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(check, prompts) of one model: which chapter prompts and facts it knows at top-1, and the heat maps of the
    chapter prompts it knows."""
    prof = profile_of(config)
    facts = load_facts()
    prompts = _chapter_facts(prof)
    model, tok = load_model(name, dtype=prof.dtype, device=device)
    check = check_facts(model, tok, prompts + list(facts)[: prof.n_check])
    check.insert(0, "model", name)
    check.insert(1, "kind", ["prompt"] * len(prompts) + ["fact"] * (len(check) - len(prompts)))
    known = set(check.loc[check["correct"], "id"])
    tracer = CausalTracer(model, tok, _trace_config(config), facts=facts, name=name)
    frames = [tr.table() for p in prompts if p.id in known
              for tr in tracer.trace(p.prompt, p.subject, p.target, kinds=prof.kinds, progress=progress).values()]
    return check, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def chosen_facts(config: dict, check: pd.DataFrame) -> list[Fact]:
    """The facts a model's fact-set average traces: the first ``n_facts`` of the set that it knows."""
    known = set(check.loc[check["correct"] & (check["kind"] == "fact"), "id"])
    return [f for f in load_facts() if f.id in known][: config["n_facts"]]


def model_fact_traces(name: str, config: dict, facts: Sequence[Fact], device: str = "cpu",
                      progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(facts, baseline) of one model over ``facts``: the fact-set traces, and the same traces under independent
    noise (the noise-only baseline that analysis.functional_groups compares the layer-to-layer jitter with). Each
    fact's trace depends on that fact alone (its noise is seeded per trace), so slices of the set concatenate."""
    prof = profile_of(config)
    model, tok = load_model(name, dtype=prof.dtype, device=device)
    kinds = prof.fact_kinds or prof.kinds
    out = []
    for offset in (0, BASELINE_SEED_OFFSET):
        tracer = CausalTracer(model, tok, _trace_config(config, samples=prof.fact_samples, seed_offset=offset),
                              facts=load_facts(), name=name)
        out.append(trace_facts(tracer, facts, kinds=kinds, positions=prof.fact_positions, progress=progress))
    return out[0], out[1]


def write_model_tables(run: results.Run, name: str, check, prompts, facts, baseline) -> None:
    """A model's four tables; ``check`` last: a model counts as done once its check table exists."""
    key = safe_name(name)
    run.write_table(f"prompts_{key}", prompts)
    run.write_table(f"facts_{key}", facts)
    run.write_table(f"baseline_{key}", baseline)
    run.write_table(f"check_{key}", check)


def model_done(run: results.Run, name: str) -> bool:
    return all(run.has(f"{t}_{safe_name(name)}") for t in ("check", "prompts", "facts", "baseline"))


def compute_chapter(profile: str = "smoke", *, extra_models: Sequence[str] = (), device: str = "cpu",
                    progress: bool = False) -> results.Run:
    """Compute (or resume) the chapter's tables for ``profile`` in the local results cache; returns the Run.

    Models already done (all four tables written) are skipped, so an interrupted run resumes. A complete run
    computed by other code (stale fingerprint) is recomputed from scratch. (:mod:`depthlib.tracing.shards` computes
    the same run as jobs of an executor.)
    """
    config = chapter_config(profile, extra_models)
    run = results.fresh_run(EXPERIMENT, config)
    if run.complete:
        return run
    start, before = time.perf_counter(), run.elapsed_before()
    for name in config["models"]:
        if model_done(run, name):
            continue
        check, prompts = model_prompts(name, config, device, progress)
        facts, baseline = model_fact_traces(name, config, chosen_facts(config, check), device, progress)
        write_model_tables(run, name, check, prompts, facts, baseline)
        run.record_elapsed(before + time.perf_counter() - start)
    finish(run, wall_time_s=before + time.perf_counter() - start, device=device)
    return run


def finish(run: results.Run, *, wall_time_s: float, device: str, code: tuple = CODE, **extra) -> None:
    """Close a chapter run (its profile, seed and models are in its config)."""
    run.finish(profile=run.config["name"], seed=run.config["seed"], wall_time_s=wall_time_s, device=device, code=code,
               models=run.config["models"], n_facts_total=len(load_facts()), **extra)
    (run.path / "progress.json").unlink(missing_ok=True)


def chapter_run(profile: str = "smoke", *, extra_models: Sequence[str] = (), device: str = "cpu",
                rerun: bool = False, progress: bool = False) -> results.Run:
    """The run chapter 4 shows for ``profile`` (the one rule: :func:`depthlib.results.select_run`, among runs
    whose config is a profile's current one with these ``extra_models``); computed now if there is none."""
    results.check_profile(profile)
    extra = tuple(extra_models)

    def expected(prof: str) -> dict | None:
        return chapter_config(prof, extra) if prof in PROFILES else None

    return results.chapter_run(
        EXPERIMENT, profile,
        lambda: compute_chapter(profile, extra_models=extra, device=device, progress=progress),
        expected_config=expected, rerun=rerun)


def chapter_tables(run: results.Run) -> dict[str, pd.DataFrame]:
    """``{"check", "prompts", "facts", "baseline"}`` tables of a chapter run, all models concatenated (``baseline``:
    the fact-set traces again under independent noise)."""
    out = {}
    for name in ("check", "prompts", "facts", "baseline"):
        frames = [run.table(t) for t in run.tables(f"{name}_")]
        frames = [f for f in frames if not f.empty]
        out[name] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return out


def replay(run: results.Run) -> pd.DataFrame:
    """Recompute, with the current code on the CPU, the block-output heat map of the first chapter prompt the run
    traced for its first model (the run's samples, noise, window and seed).

    Returns one row per (layer, token) with the committed and the recomputed restored p(target) side by side
    (columns ``committed``, ``replayed``); they agree to float round-off when the code computes what it did.
    """
    config = run.config
    name = config["models"][0]
    committed = run.table(f"prompts_{safe_name(name)}")
    block = committed[committed["kind"] == "block"] if "kind" in committed else committed.iloc[0:0]
    if block.empty:
        raise InputError(f"run {run.experiment}/{run.key} has no block-output heat map of {name} to replay")
    text = block["prompt"].iloc[0]
    block = block[block["prompt"] == text]
    prompt = next((p for p in config["prompts"] if p[0].startswith(text)), None)
    if prompt is None:
        raise InputError(f"run {run.experiment}/{run.key}: prompt {text!r} is not among its chapter prompts")
    facts = load_facts()
    if config["noise"] == "rome" and config.get("facts") != _facts_digest(facts):
        raise InputError(f"run {run.experiment}/{run.key} used another fact set (its 'rome' noise scale differs)")
    model, tok = load_model(name, dtype=config["dtype"], device="cpu")
    tracer = CausalTracer(model, tok, _trace_config(config), facts=facts, name=name)
    replayed = tracer.trace(*prompt, kinds=("block",))["block"].table()
    keys = ["layer", "token_index"]
    out = block[["model", "prompt", *keys, "token", "role", "p"]].rename(columns={"p": "committed"})
    return out.merge(replayed[[*keys, "p"]].rename(columns={"p": "replayed"}), on=keys, how="left")

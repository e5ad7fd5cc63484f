"""Chapter 4's glue: the profiles of the causal-tracing chapter, the run it shows, and its replay check.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (one part, ``trace``),
``compute``, ``replay``, ``describe``, ``summary`` and ``COMPUTE``.

A run's tables, per model M (``M`` made file-safe): ``check_M`` (does M know each chapter prompt and fact; column
``kind`` is ``"prompt"`` or ``"fact"``), ``prompts_M`` (heat maps of the chapter prompts M knows, every token,
every kind of the profile) and ``facts_M`` (the fact-set traces at the profile's token positions).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

import pandas as pd

from depthlib import executors, finite, results
from depthlib.contract import Profile
from depthlib.errors import InputError
from depthlib.models.loading import load_model
from depthlib.tracing.facts import Fact, check_facts, load_facts, safe_name
from depthlib.tracing.patching import KINDS
from depthlib.tracing.tracer import CausalTracer, TraceConfig, trace_facts

EXPERIMENT = "tracing"
#: The compute entry of the chapter's runs: their code modules are derived from its imports
#: (:func:`depthlib.results.compute_modules`: locate, noise, patching, tracer, facts and the model adapters).
COMPUTE = {EXPERIMENT: "depthlib.tracing.chapter:compute"}
#: The paper's prompt (its Fig. 6: "The space needle is in downtown" -> " Seattle") and two classic ROME facts.
CHAPTER_PROMPTS = (
    ("The Space Needle is in downtown", "Space Needle", " Seattle"),
    ("The Eiffel Tower is located in the city of", "Eiffel Tower", " Paris"),
    ("Steve Jobs was the co-founder of", "Steve Jobs", " Apple"),
)


@dataclass(frozen=True)
class TracingProfile(Profile):
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
    # models traced beside ``models`` (e.g. ``depthlib tracing --profile cpu --model M``): they join the run's
    # ``models``, but settings with them are still the profile's (its name labels the run)
    extra_models: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.pop("extra_models")
        return out


PROFILES = {
    # seconds: one prompt, two noise samples, block outputs, four facts
    "smoke": TracingProfile("smoke", ("gemma-3-270m", "smollm2-135m"), 1, ("block",), 2, n_facts=4, n_check=8),
    # minutes on 2 CPU cores: ROME's settings (10 samples, windows) for the heat maps of two prompts;
    # the fact-set average on block outputs only, 3 samples, 30 facts per model (a CPU cannot afford more)
    "cpu": TracingProfile("cpu", ("gemma-3-270m", "smollm2-135m"), 2, KINDS, 10, n_facts=30, fact_samples=3,
                          fact_kinds=("block",)),
    # a GPU: the paper's noise (3 x embedding-matrix std, 1 sample, window 1), every fact, every token
    "paper": TracingProfile("paper", ("gemma-3-270m", "smollm2-135m"), 3, KINDS, 1, noise="paper", window=1,
                            fact_positions=None),
}


def _facts_digest(facts: Sequence[Fact]) -> str:
    return hashlib.sha256(json.dumps([asdict(f) for f in facts]).encode()).hexdigest()[:12]


def settings(profile: str | TracingProfile) -> TracingProfile:
    """The settings of ``profile``: a profile's name, or a :class:`TracingProfile` itself (custom settings, e.g.
    ``depthlib tracing --set``: named ``custom`` unless they are a profile's own, so that their runs are labelled so)."""
    return results.profile_settings(profile, PROFILES)


def chapter_config(profile: str | TracingProfile) -> dict:
    """The results-cache config of a chapter run: the profile's settings, its models (``extra_models`` last) and
    prompts, the fact set. The device is not part of it (it changes speed, not the numbers; the manifest records it)."""
    prof = settings(profile)
    return {**prof.to_dict(), "models": list(prof.models) + list(prof.extra_models),
            "prompts": [list(p) for p in CHAPTER_PROMPTS[: prof.n_prompts]], "facts": _facts_digest(load_facts())}


#: the noise-only baseline traces the same facts again with the noise seed shifted by this much
BASELINE_SEED_OFFSET = 1000


def _trace_config(config: dict, *, samples: int | None = None, seed_offset: int = 0) -> TraceConfig:
    """The TraceConfig of a run's heat maps (or, with ``samples``, of its fact-set traces; with ``seed_offset``, of
    the noise-only baseline: the same traces under independent noise)."""
    return TraceConfig(samples=samples or config["samples"], noise=config["noise"], window=config["window"],
                       seed=config["seed"] + seed_offset)


def _chapter_facts(profile: TracingProfile) -> list[Fact]:
    return [Fact(f"p{i + 1}", "chapter prompt", *p) for i, p in enumerate(CHAPTER_PROMPTS[: profile.n_prompts])]


def profile_of(config: dict) -> TracingProfile:
    """The :class:`TracingProfile` a run's config holds (so that a job elsewhere needs the config alone)."""
    return TracingProfile.from_dict(config)


def model_prompts(name: str, config: dict, device: str = "cpu",
                  progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(check, prompts) of one model: which chapter prompts and facts it knows at top-1, and the heat maps of the
    chapter prompts it knows."""
    prof = profile_of(config)
    facts = load_facts()
    prompts = _chapter_facts(prof)
    model, tok = _load_checked(name, prof.dtype, device)
    with finite.guard(model, name, prof.dtype):
        check = check_facts(model, tok, prompts + list(facts)[: prof.n_check])
        check.insert(0, "model", name)
        check.insert(1, "kind", ["prompt"] * len(prompts) + ["fact"] * (len(check) - len(prompts)))
        known = set(check.loc[check["correct"], "id"])
        tracer = CausalTracer(model, tok, _trace_config(config), facts=facts, name=name)
        frames = [tr.table() for p in prompts if p.id in known
                  for tr in tracer.trace(p.prompt, p.subject, p.target, kinds=prof.kinds, progress=progress).values()]
    return check, pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _load_checked(name: str, dtype, device: str):
    """The model and tokenizer, after checking its weights are finite (a NaN weight traces NaN logits)."""
    model, tok = load_model(name, dtype=dtype, device=device)
    finite.check_weights(model, name)
    return model, tok


#: The most noise samples one trace takes (``--samples``), checked before a model is loaded. ROME averages 10 draws
#: and the paper 1; beyond 1000 the mean p_corrupt moves by under 1/√1000 ≈ 3 % of its spread, while the memory grows
#: with every sample (:func:`check_samples_memory`: about 13 MB a sample for gemma-3-270m on a 10-token prompt, so
#: 13 GB at this cap), so more only costs memory and time.
MAX_SAMPLES = 1000


def check_samples_memory(model, tok, prompt: str, samples: int, device: str = "cpu") -> None:
    """InputError, before tracing, if ``samples`` noise samples of ``prompt`` would not fit in memory. Per sample, in
    fp32: the corrupted run's forward keeps every block's input and passes through the blocks' intermediates
    ((layers + 16) × tokens × d), and its last logits and the restored runs of one layer, one row per token, keep a
    softmax over the vocabulary each ((tokens + 1) × vocab; the tracer keeps each row's whole softmax while it
    reads one entry of it). Measured on a random 8-block, d = 512, 32k-vocabulary llama and a 15-token prompt:
    3.1 MB a sample (growth of the peak RSS from 100 to 300 samples), this estimate 3.0 MB."""
    from depthlib import validate
    from depthlib.models.arch import arch_of
    arch = arch_of(model)
    n_tokens = len(tok(prompt)["input_ids"]) + 1
    per_sample = 4 * ((arch.n_layers + 16) * n_tokens * arch.d_model + (n_tokens + 1) * arch.vocab_size)
    validate.fits_in_memory(f"--samples {samples}", samples * per_sample, device,
                            f"each sample needs about {per_sample / 2**20:.1f} MiB here; lower --samples")


def trace_one(model: str, prompt: str, subject: str, target: str | None = None, *, kind: str = "block",
              config: TraceConfig | None = None, dtype: str = "float32", device: str = "cpu",
              progress: bool = False) -> dict:
    """One causal trace (what ``depthlib tracing --model M --prompt P --subject S`` prints): restore ``kind`` outputs
    of the clean run into the corrupted one, layer by layer and token by token (paper §6, Fig. 6). Returns the trace's
    summary and the model and dtype; a NaN weight or a non-finite activation (fp16 overflow) is one line."""
    if not subject.strip() or subject.lower() not in prompt.lower():
        raise InputError(f"subject {subject!r} not found in the prompt {prompt!r}")
    m, tok = _load_checked(model, dtype, device)
    check_samples_memory(m, tok, prompt, (config or TraceConfig()).samples, device)
    tracer = CausalTracer(m, tok, config or TraceConfig(), name=model)
    with finite.guard(m, model, dtype):
        result = tracer.trace(prompt, subject, target, kinds=(kind,), progress=progress)[kind]
    return {"model": model, "dtype": dtype, **result.summary(),
            "grid_axes": "grid[layer][token]: mean restored p(target), layer 0 = first block"}


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
    model, tok = _load_checked(name, prof.dtype, device)
    kinds = prof.fact_kinds or prof.kinds
    out = []
    for offset in (0, BASELINE_SEED_OFFSET):
        tracer = CausalTracer(model, tok, _trace_config(config, samples=prof.fact_samples, seed_offset=offset),
                              facts=load_facts(), name=name)
        with finite.guard(model, name, prof.dtype):
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


def compute(cfg: str | TracingProfile, device: str = "cpu", *, force: bool = False, progress: bool = True,
            executor=None) -> results.Run:
    """Compute (or resume, or load) the chapter's tables for ``cfg`` (a profile's name, or its settings) in the
    local results cache; returns the Run (the lifecycle of :func:`depthlib.results.computing`). Models already done
    (all four tables written) are skipped, so an interrupted run resumes. With an
    :class:`depthlib.executors.ExecutorConfig` other than serial, the same run is computed as its jobs, each model's
    facts in its number of shards (:func:`run_sharded`). Custom settings (a :class:`TracingProfile` that is no
    profile's own) are traced in this process."""
    if executor is not None and executor.kind != "serial":
        if not isinstance(cfg, str) and settings(cfg).name == results.CUSTOM:
            raise InputError("custom settings (--set) are traced in this process: drop --executor")
        if force:
            raise InputError("--force works with --executor serial only")
        return run_sharded(cfg, executor, device)
    config = chapter_config(cfg)
    check_models(config["models"])
    with computing(config, device=device, force=force) as job:
        if job.complete:
            return job.run
        for name in config["models"]:
            if model_done(job.run, name):
                continue
            check, prompts = model_prompts(name, config, device, progress)
            facts, baseline = model_fact_traces(name, config, chosen_facts(config, check), device, progress)
            write_model_tables(job.run, name, check, prompts, facts, baseline)
            job.save_progress()
    return job.run


def check_models(models: Sequence[str]) -> None:
    """Every model of a run checked (:func:`depthlib.models.checks.model_files`) before the first is traced: a bad one
    would otherwise fail only when its turn came, after minutes (hours on the paper profile) of tracing the others."""
    from depthlib.models import checks
    for name in models:
        checks.model_files("--model", name)


@contextmanager
def computing(config: dict, *, device: str = "cpu", force: bool = False) -> Iterator[results.Computation]:
    """The lifecycle (:func:`depthlib.results.computing`) of the chapter run of ``config`` (its profile, seed and
    models are in the config); the manifest also records the models and the fact set's size."""
    with results.computing(EXPERIMENT, config, profile=config["name"], seed=config["seed"], code=COMPUTE.values(),
                           device=device, force=force, saves="finished models are kept in {folder}") as job:
        job.record(models=config["models"], n_facts_total=len(load_facts()))
        yield job


def runs(profile: str | TracingProfile = "smoke", *, rerun: bool = False, executor=None, device: str = "cpu",
         extra_models: Sequence[str] = (), progress: bool = False) -> dict[str, results.Run]:
    """``{"trace": run}``: the run chapter 4 shows for ``profile`` (the one rule: :func:`depthlib.results.select_run`,
    among runs whose config is a profile's current one with these ``extra_models``); computed now if there is none,
    in this process or, with an :class:`~depthlib.executors.ExecutorConfig`, as jobs of it (each model's facts in
    its number of shards). Custom settings (a :class:`TracingProfile`, e.g. ``depthlib tracing --set``) are traced
    in this process, or loaded from the local cache, never chosen among committed runs."""
    extra = tuple(extra_models)
    if not isinstance(profile, str):
        return {"trace": compute(dataclasses.replace(profile, extra_models=extra), device, progress=progress,
                                 executor=executor)}
    results.check_profile(profile)

    def expected(prof: str) -> dict | None:
        return chapter_config(dataclasses.replace(PROFILES[prof], extra_models=extra)) if prof in PROFILES else None

    cfg = dataclasses.replace(PROFILES[profile], extra_models=extra)
    return {"trace": results.chapter_run(EXPERIMENT, profile,
                                         lambda: compute(cfg, device, progress=progress, executor=executor),
                                         expected_config=expected, rerun=rerun)}


def facts_traced(models: Sequence[str], facts: pd.DataFrame) -> dict[str, int]:
    """How many facts of the set each model's fact-set average traced, with a warning for a model that knows none
    of them at top-1 (it is in the run, but its average is empty)."""
    counts = {m: int(g["fact_id"].nunique()) for m, g in facts.groupby("model")} if len(facts) else {}
    out = {m: counts.get(m, 0) for m in models}
    none = [m for m, n in out.items() if n == 0]
    if none:
        warnings.warn(f"{', '.join(none)} knew none of the fact set's facts at top-1: no fact-set trace of "
                      f"{'it' if len(none) == 1 else 'them'} (facts_traced 0)", stacklevel=2)
    return out


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


def reduction(profile: str) -> str:
    """How ``profile``'s runs are reduced against the paper's: one line of the verdict's "how reduced" list."""
    p = PROFILES[profile]
    return (f"{', '.join(p.models)}: the heat maps of {p.n_prompts} prompt(s) with {p.samples} noise samples, "
            f"the fact-set average over {p.n_facts} facts with {p.fact_samples or p.samples} noise samples; the "
            "paper: Pythia-12b, one prompt, one noise draw.")


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    c = run.config
    return {**results.run_info(run), **{k: c.get(k) for k in ("models", "samples", "noise", "window", "n_facts",
                                                             "fact_samples", "fact_positions", "dtype", "seed")},
            "prompts": [p[0] for p in c.get("prompts", [])], "executor": run.manifest.get("executor", "serial")}


def summary(run: results.Run) -> dict:
    """The key numbers of a run: per model, the chapter prompts and facts it knows and the facts traced."""
    tables = chapter_tables(run)
    check, facts = tables["check"], tables["facts"]
    known = ({m: {k: int(g.loc[g["kind"] == k, "correct"].sum()) for k in ("prompt", "fact")}
              for m, g in check.groupby("model")} if len(check) else {})
    return {"run": str(run.path), **describe(run), "known": known,
            "facts_traced": facts_traced(run.config["models"], facts)}

# ---- the same run as jobs of an executor, merged into the run one process would make ------------------------
# Two rounds of units, each its own resumable run under the experiment ``tracing-shards``: (1) per model, which
# chapter prompts and facts it knows (``check``) and the prompts' heat maps; (2) per model and slice of the facts it
# knows, the fact-set traces and their noise-only baseline. The merge is exact: a fact's trace depends on that fact
# alone (its noise is drawn from the trace's own seed, :func:`depthlib.tracing.noise.subject_noise`), so the slices,
# concatenated in order, are the one-process tables; ``tests/test_tracing.py`` checks this bit for bit with the
# serial, joblib and submitit executors.
SHARD_EXPERIMENT = "tracing-shards"
#: a shard's numbers are computed by the chapter's code (its code modules are derived from the chapter's entry; the
#: merge is tested to equal the one-process run bit for bit)
CODE = tuple(COMPUTE.values())


def prompts_unit(config: dict, model: str, device: str = "cpu") -> str:
    """Round 1 for ``model`` of the chapter run ``config``: its check and prompt heat maps; returns the shard's
    run folder."""
    with results.computing(SHARD_EXPERIMENT, {**config, "model": model, "part": "prompts"}, profile=config["name"],
                           seed=config["seed"], code=CODE, device=device) as job:
        if not job.complete:
            check, prompts = model_prompts(model, config, device)
            job.run.write_table("prompts", prompts)
            job.run.write_table("check", check)
    return str(job.run.path)


def facts_unit(config: dict, model: str, fact_ids: list, device: str = "cpu") -> str:
    """Round 2 for ``model``: the fact-set traces and baseline of the facts ``fact_ids`` (in that order)."""
    with results.computing(SHARD_EXPERIMENT, {**config, "model": model, "part": "facts", "fact_ids": list(fact_ids)},
                           profile=config["name"], seed=config["seed"], code=CODE, device=device) as job:
        if not job.complete:
            by_id = {f.id: f for f in load_facts()}
            facts, baseline = model_fact_traces(model, config, [by_id[i] for i in fact_ids], device)
            job.run.write_table("facts", facts)
            job.run.write_table("baseline", baseline)
            job.record(fact_ids=list(fact_ids))
    return str(job.run.path)


def _slices(items: list, n: int) -> list[list]:
    """``items`` cut into at most ``n`` contiguous, nearly equal, non-empty slices (none if there are no items)."""
    n = min(n, len(items))
    cuts = [round(i * len(items) / n) for i in range(n + 1)]
    return [items[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def _run_round(units: list[executors.Unit], executor: executors.ExecutorConfig) -> list[results.Run]:
    return executors.finished_runs(units, executor, "causal tracing")


def run_sharded(cfg: str | TracingProfile, executor: executors.ExecutorConfig, device: str = "cpu") -> results.Run:
    """Compute the chapter run of ``cfg`` (a profile's name or its settings) as jobs of ``executor`` (each model's
    facts in its number of shards) and merge them into the one-process run's cache key; a finished run is loaded."""
    fact_shards = executor.n_shards()
    if fact_shards < 1:
        raise InputError(f"--shards must be >= 1, got {fact_shards}")
    config = chapter_config(cfg)
    check_models(config["models"])
    with computing(config, device=device) as job:
        if job.complete:
            return job.run
        models = config["models"]
        first = _run_round([executors.Unit(f"trace-{safe_name(m)}-prompts", "depthlib.tracing.chapter:prompts_unit",
                                           dict(config=config, model=m, device=device)) for m in models], executor)
        plan = [(m, ids) for m, r in zip(models, first)
                for ids in _slices([f.id for f in chosen_facts(config, r.table("check"))], fact_shards)]
        second = _run_round([executors.Unit(f"trace-{safe_name(m)}-facts-{ids[0]}-{ids[-1]}",
                                            "depthlib.tracing.chapter:facts_unit",
                                            dict(config=config, model=m, fact_ids=ids, device=device))
                             for m, ids in plan], executor)
        for m, r in zip(models, first):
            parts = [s for (name, _), s in zip(plan, second) if name == m]

            def cat(table: str) -> pd.DataFrame:
                frames = [s.table(table) for s in parts]
                return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
            write_model_tables(job.run, m, r.table("check"), r.table("prompts"), cat("facts"), cat("baseline"))
        job.record(executor=executor.kind, shards=[f"{s.experiment}/{s.key}" for s in first + second],
                   shard_wall_time_s=[s.manifest.get("wall_time_s") for s in first + second])
    return job.run

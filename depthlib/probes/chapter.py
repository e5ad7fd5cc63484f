"""Chapter 2's glue: the cached probe run of one model, its sharding over documents, the profiles of the hidden-state
probes, the runs the chapter shows, and their replay check.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (one part per model, and one
per weight-noise level of the sensitivity check, ``sensitivity ε=<ε>``), ``compute``, ``replay``, ``describe``,
``summary`` and ``COMPUTE``; ``chapter_runs`` and ``sensitivity_runs`` are the two kinds of parts. :func:`run_probe`
is the cached entry point of one model's run; :func:`run_sharded` computes the same run as shards of documents.

**Sharding.** A probe run can be computed as shards of documents: each shard probes a contiguous range of the
corpus's documents as its own resumable run, and the shards merge into the run one pass would make, under the same
cache key.

Why the merge is exact: every random choice of the stream (which tokens the lenses score, which tokens the sample
keeps) is keyed by (seed, document index, position) (:func:`depthlib.probes.stream.token_keys`), and a shard is
given its documents' corpus indices (``doc_offset``). So

* histograms and per-document rows are those of one pass, bit for bit;
* per (metric, layer) counts, sums and sums of squares add up (means and standard deviations agree with one pass
  to float round-off, ~1e-15 relative: the float64 sums are added in another order);
* the token sample is the union's ``reservoir_size`` smallest sample keys, the sample one pass keeps.

``tests/test_probes.py`` checks a sharded run against one pass with the serial, joblib and submitit executors.
"""
from __future__ import annotations

import dataclasses
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from depthlib import executors, finite, results
from depthlib.contract import Profile, from_dict
from depthlib.errors import InputError
from depthlib.inputs import corpus_fingerprint, model_fingerprint, safe_name
from depthlib.probes.stream import ProbeConfig, ProbeResult, load_probed_model, probe_documents, summarize
from depthlib.validate import int_in_range

EXPERIMENT_PREFIX = "probes-"
#: the code a probe run's numbers depend on (its compute entries: chapter 2's ``COMPUTE``, the shards' code)
CODE = ("depthlib.probes.stream:probe_documents", "depthlib.data:corpus")
TABLES = ("layers", "histograms", "tokens", "docs")


def experiment_name(model: str) -> str:
    """Results-cache experiment of one model, e.g. 'probes-gemma-3-270m', 'probes-EleutherAI--pythia-410m'."""
    return EXPERIMENT_PREFIX + safe_name(model)


def probe_key(model: str, corpus: str, n_docs: int, config: ProbeConfig) -> dict:
    """The results-cache config of a probe run (what decides its numbers): the settings, and what the model and
    the corpus *are* (their fingerprints), so the same text naming other files never finds a stale run."""
    key = dict(model=model, corpus=corpus, n_docs=int(n_docs), **asdict(config))
    key.pop("device")  # the device changes speed, not the numbers (beyond bf16 noise) ...
    key["dtype"] = str(config.torch_dtype).replace("torch.", "")  # ... but "auto" means bf16 on CUDA, fp32 on CPU
    key["model_fingerprint"] = model_fingerprint(model)
    key["corpus_fingerprint"] = corpus_fingerprint(corpus)
    return key


#: runs of document shards (:func:`run_sharded`) live apart from the runs a chapter shows
SHARD_EXPERIMENT = "probe-shards"


def open_probe_run(model: str, corpus: str, n_docs: int, config: ProbeConfig,
                   doc_range: tuple[int, int] | None = None) -> results.Run:
    """The cache entry of a probe run, or of the shard ``doc_range`` = (start, stop) of its documents."""
    key = probe_key(model, corpus, n_docs, config)
    if doc_range is None:
        return results.open_run(experiment_name(model), key)
    return results.open_run(SHARD_EXPERIMENT, {**key, "doc_range": [int(doc_range[0]), int(doc_range[1])]})


def run_probe(model: str, corpus: str = "sotu", n_docs: int = 16, config: ProbeConfig | None = None, *,
              profile: str = "custom", progress: bool = True, force: bool = False,
              doc_range: tuple[int, int] | None = None) -> results.Run:
    """Probe ``model`` on ``n_docs`` documents of ``corpus``; cached in the results cache.

    Returns the :class:`depthlib.results.Run` (tables ``layers``, ``histograms``, ``tokens``, ``docs``
    and a manifest with the summary). A finished run with the same settings is reused. With ``doc_range`` =
    (start, stop), only documents start … stop−1 of the ``n_docs`` are probed (a shard, merged by
    :func:`run_sharded`).
    """
    from depthlib import data
    cfg = (config or ProbeConfig()).validate()
    int_in_range("n_docs", n_docs, 1)
    start, stop = doc_range if doc_range is not None else (0, n_docs)
    if not 0 <= start < stop <= n_docs:
        raise InputError(f"document range {start}..{stop} is not inside the {n_docs} documents")
    run = open_probe_run(model, corpus, n_docs, cfg, doc_range)
    with results.computing(run.experiment, run.config, profile=profile, code=CODE,
                           seed=cfg.seed, device=cfg.device, force=force, tables=TABLES,
                           checkpoints=("checkpoint.pt",),
                           saves="finished documents are checkpointed in {folder} (every 4 batches)") as job:
        if job.complete:
            print(f"[depthlib] loaded a finished run from the cache: {job.run.path}", file=sys.stderr)
            return job.run
        docs = data.corpus(corpus, n_docs)[start:stop]
        m, tok = load_probed_model(model, cfg)
        finite.check_weights(m, model)
        job.run.path.mkdir(parents=True, exist_ok=True)
        with finite.guard(m, model, cfg.torch_dtype):   # NaN/inf activations stop the run (a float16 overflow, say)
            res = probe_documents(m, tok, docs, cfg, progress=progress, model_name=model, doc_offset=start,
                                  checkpoint=job.run.path / "checkpoint.pt")    # saves as it goes; a rerun resumes
        for name in TABLES:
            job.run.write_table(name, getattr(res, name))
        job.record(summary=res.summary(), model=model, corpus=corpus)
        (job.run.path / "checkpoint.pt").unlink(missing_ok=True)
    return job.run


def load_result(run: results.Run) -> ProbeResult:
    """The tables of a finished run as a :class:`ProbeResult`."""
    return ProbeResult(*(run.table(t) for t in TABLES), info=run.manifest.get("summary", {}))


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


def shard_ranges(n_docs: int, n_shards: int, batch_size: int = 1) -> list[tuple[int, int]]:
    """``n_shards`` contiguous (start, stop) document ranges covering 0 … n_docs−1, as equal as whole batches allow."""
    if n_shards < 1:
        raise InputError(f"--shards must be >= 1, got {n_shards}")
    batches = -(-n_docs // batch_size)
    n_shards = min(n_shards, batches)
    cuts = [round(i * batches / n_shards) * batch_size for i in range(n_shards + 1)]
    return [(a, min(b, n_docs)) for a, b in zip(cuts[:-1], cuts[1:])]


def probe_shard(model: str, corpus: str, n_docs: int, config: dict, start: int, stop: int) -> str:
    """Probe (or resume, or load) documents start … stop−1; returns the shard's run folder (picklable for executors)."""
    return str(run_probe(model, corpus, n_docs, ProbeConfig(**config), profile="shard", progress=False,
                         doc_range=(start, stop)).path)


def _merge_layers(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Per (metric, layer) count, mean and std of the union from each part's count, mean and std."""
    rows = []
    keyed = [p.set_index(["metric", "layer"]) for p in parts]
    for key in parts[0].set_index(["metric", "layer"]).index:
        c = np.array([float(k.at[key, "count"]) for k in keyed])
        mean = np.array([float(k.at[key, "mean"]) for k in keyed])
        std = np.array([float(k.at[key, "std"]) for k in keyed])
        some, several = c > 0, c > 1                       # an empty part has mean NaN, a single one std NaN
        total = c.sum()
        s = (mean[some] * c[some]).sum()                   # Σ x
        q = (c[some] * mean[some] ** 2).sum() + (std[several] ** 2 * (c[several] - 1)).sum()   # Σ x²
        m = s / total if total else np.nan
        var = max(q / total - m ** 2, 0.0) * total / (total - 1) if total > 1 else np.nan
        rows.append(dict(metric=key[0], layer=int(key[1]), mean=m, std=np.sqrt(var), count=int(total)))
    return pd.DataFrame(rows)


def _merge_histograms(parts: list[pd.DataFrame]) -> pd.DataFrame:
    out = parts[0].copy()
    out["count"] = sum(p["count"].to_numpy() for p in parts)
    return out


def _merge_tokens(parts: list[pd.DataFrame], size: int) -> pd.DataFrame:
    """The ``size`` smallest sample keys of the union (ties by document, then position), in document order."""
    union = pd.concat(parts, ignore_index=True)
    kept = union.sort_values(["sample_key", "doc_index", "position"], kind="stable").head(size)
    return kept.sort_values(["doc_index", "position"]).reset_index(drop=True)


def _computing(model: str, corpus: str, n_docs: int, cfg: ProbeConfig, profile: str):
    """The lifecycle (:func:`depthlib.results.computing`) of the one-pass run of ``model``: the merge is tested to
    equal one pass, so it records the one pass's compute entries. An interrupted merge keeps its finished shards."""
    from depthlib import paths
    shards = paths.local_results_dir() / SHARD_EXPERIMENT
    return results.computing(experiment_name(model), probe_key(model, corpus, n_docs, cfg), profile=profile,
                             seed=cfg.seed, code=CODE, device=cfg.device, tables=TABLES, kept_in=shards,
                             saves=f"finished shards and their checkpoints are under {shards}")


def _write_merged(job: results.Computation, model: str, corpus: str, n_docs: int, cfg: ProbeConfig,
                  shard_runs: list[results.Run], executor: str) -> None:
    run = job.run
    tables = {name: [r.table(name) for r in shard_runs] for name in TABLES}
    layers = _merge_layers(tables["layers"])
    run.write_table("layers", layers)
    run.write_table("histograms", _merge_histograms(tables["histograms"]))
    run.write_table("tokens", _merge_tokens(tables["tokens"], cfg.reservoir_size))
    run.write_table("docs", pd.concat(tables["docs"], ignore_index=True))
    info = [r.manifest["summary"] for r in shard_runs]
    merged_info = {**{k: v for k, v in info[0].items() if not k.endswith("_by_layer") and not k.startswith("theta_")},
                   "n_docs": sum(i["n_docs"] for i in info), "n_tokens": sum(i["n_tokens"] for i in info),
                   "probe_seconds": round(sum(i["probe_seconds"] for i in info), 3)}
    job.record(summary=summarize(layers, merged_info), model=model, corpus=corpus, executor=executor,
               shards=[f"{r.experiment}/{r.key}" for r in shard_runs],
               shard_wall_time_s=[r.manifest.get("wall_time_s") for r in shard_runs])


def run_sharded(model: str, corpus: str, n_docs: int, cfg: ProbeConfig, executor: executors.ExecutorConfig,
                n_shards: int, *, profile: str = "custom") -> results.Run:
    """Probe ``model`` as ``n_shards`` document shards with ``executor`` and merge them; a finished run is loaded.
    A failed shard raises one :class:`InputError` line naming it and its log; finished shards stay cached."""
    cfg = cfg.validate()
    with _computing(model, corpus, n_docs, cfg, profile) as job:
        if job.complete:
            return job.run
        ranges = shard_ranges(n_docs, n_shards, cfg.batch_size)
        units = [executors.Unit(f"{experiment_name(Path(model).name)}-docs{a}-{b}",
                                "depthlib.probes.chapter:probe_shard",
                                dict(model=model, corpus=corpus, n_docs=n_docs, config=dataclasses.asdict(cfg),
                                     start=a, stop=b)) for a, b in ranges]
        shard_runs = executors.finished_runs(units, executor, f"probe of {model}")
        _write_merged(job, model, corpus, n_docs, cfg, shard_runs, executor.kind)
    return job.run


#: The compute entries of the chapter's runs (one experiment per model, ``probes-<model>``): their code modules are
#: derived from the imports of the functions that compute their numbers (:func:`depthlib.results.compute_modules`):
#: the documents (``data.corpus``) and the pass over them (``probes.stream.probe_documents``, which also summarises).
#: ``run_probe`` only orchestrates (opens the run, loads, calls these, writes the tables).
COMPUTE = {EXPERIMENT_PREFIX: CODE}


@dataclass(frozen=True)
class ProbeProfile(Profile):
    """The settings of one profile of the hidden-states chapter (design: profiles)."""

    models: tuple[str, ...]
    corpus: str
    n_docs: int
    config: ProbeConfig = field(default_factory=ProbeConfig)
    # sensitivity to a second quantisation-sized perturbation of the (4-bit GGUF) weights: which model, how many
    # documents, and the relative noise levels ε (0 is the unperturbed baseline on the same documents)
    sensitivity_model: str | None = None
    sensitivity_docs: int = 0
    sensitivity_noise: tuple[float, ...] = ()


PROFILES = {
    # seconds: proves the code path on both offline models
    "smoke": ProbeProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 2,
                          ProbeConfig(max_length=32, batch_size=2, lens_tokens_per_doc=8,
                                      reservoir_size=2000),
                          sensitivity_model="smollm2-135m", sensitivity_docs=2, sensitivity_noise=(0.0, 0.08)),
    # minutes on 2 CPU cores (fp32: faster than bf16 on AVX2): the 128 newest addresses, 256 tokens each
    "cpu": ProbeProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 128,
                        ProbeConfig(max_length=256, batch_size=8, lens_tokens_per_doc=4, lens_docs=32,
                                    reservoir_size=20_000),
                        sensitivity_model="smollm2-135m", sensitivity_docs=32,
                        sensitivity_noise=(0.0, 0.04, 0.08, 0.16)),
    # the paper (§2.1): Pythia suite on FineWeb, 4800 docs x 1024 tokens, on a GPU with hub access
    "paper": ProbeProfile(tuple(f"EleutherAI/pythia-{s}" for s in ("70m", "160m", "410m", "1b", "1.4b")),
                          "fineweb", 4800,
                          ProbeConfig(max_length=1024, batch_size=48, device="cuda", lens_tokens_per_doc=None,
                                      reservoir_size=200_000)),
}


def _custom(profile: str | ProbeProfile) -> bool:
    """Whether ``profile`` is custom settings (a :class:`ProbeProfile`, e.g. ``depthlib probes --set``) rather than
    a profile's name."""
    return isinstance(profile, ProbeProfile)


def _spec(profile: str | ProbeProfile, model: str, weight_noise: float | None = None):
    """(corpus, n_docs, config) of ``model``'s run under ``profile``: a main run, or a sensitivity run at ε =
    ``weight_noise``; None where the profile has no such run."""
    p = profile if _custom(profile) else PROFILES.get(profile)
    if p is None:
        return None
    if weight_noise is None:
        return (p.corpus, p.n_docs, p.config) if model in p.models else None
    if model != p.sensitivity_model or weight_noise not in p.sensitivity_noise:
        return None
    return p.corpus, p.sensitivity_docs, dataclasses.replace(p.config, weight_noise=float(weight_noise))


def _chapter_run(profile: str | ProbeProfile, model: str, weight_noise: float | None, rerun: bool,
                 progress: bool) -> results.Run:

    def expected(prof: str) -> dict | None:
        spec = _spec(prof, model, weight_noise)
        return probe_key(model, *spec) if spec else None
    corpus, n_docs, config = _spec(profile, model, weight_noise)
    if _custom(profile):                  # computed, or loaded from the local cache; a profile's own settings keep its name
        label = next((name for name in PROFILES if _spec(name, model, weight_noise) == (corpus, n_docs, config)),
                     results.CUSTOM)
        return compute(ProbeRun(model, corpus, n_docs, config, label), config.device, progress=progress)
    return results.chapter_run(
        experiment_name(model), profile,
        lambda: _checked(lambda: run_probe(model, corpus, n_docs, config, profile=profile, progress=progress)),
        expected_config=expected, rerun=rerun)


def chapter_runs(profile: str | ProbeProfile = "smoke", *, extra_models: Sequence[str] = (), rerun: bool = False,
                 progress: bool = False) -> dict[str, results.Run]:
    """The run of every model chapter 2 shows for ``profile``: the profile's models (computed if missing, e.g.
    ``paper`` probes Pythia on FineWeb and never falls back to a ``cpu`` run) and ``extra_models``, whose runs
    must exist already (made by ``depthlib probes --model NAME ...``; the best one of that model is shown).
    Custom settings (a :class:`ProbeProfile`) have their own models' runs only."""
    if _custom(profile):
        if extra_models:
            raise InputError("models probed on their own are shown beside a profile's runs, not beside custom settings")
        return {model: _chapter_run(profile, model, None, rerun, progress) for model in profile.models}
    results.check_profile(profile)
    runs = {model: _chapter_run(profile, model, None, rerun, progress) for model in PROFILES[profile].models}
    for model in extra_models:
        if model in runs:
            continue
        run = results.select_run(experiment_name(model), profile, rerun=rerun, include_custom=True,
                                 expected_config=lambda prof, m=model: _expected_main(prof, m))
        if run is None:
            raise InputError(f"no probe run of {model!r} yet: run `depthlib probes --model {model} ...` first")
        runs[model] = run
    return runs


def _expected_main(profile: str, model: str) -> dict | None:
    spec = _spec(profile, model)
    return probe_key(model, *spec) if spec else None


def sensitivity_runs(profile: str | ProbeProfile = "smoke", *, rerun: bool = False,
                     progress: bool = False) -> dict[float, results.Run]:
    """The profile's weight-noise sensitivity runs, {ε: run} (ε = 0 is the unperturbed baseline on the same
    documents), each found or computed like every chapter run."""
    if _custom(profile):
        p = profile
    else:
        results.check_profile(profile)
        p = PROFILES[profile]
    return {eps: _chapter_run(profile, p.sensitivity_model, eps, rerun, progress) for eps in p.sensitivity_noise}


def runs(profile: str | ProbeProfile = "smoke", *, rerun: bool = False, executor=None, device: str = "cpu",
         extra_models: Sequence[str] = (), progress: bool = False) -> dict[str, results.Run]:
    """The runs chapter 2 shows for ``profile``: one per model (:func:`chapter_runs`) and one per weight-noise level
    of the sensitivity check, ``sensitivity ε=<ε>`` (:func:`sensitivity_runs`). Each is computed in this process
    if missing (the profile's own settings decide the device; ``executor`` and ``device`` are for :func:`compute`).
    Custom settings (a :class:`ProbeProfile`, e.g. ``depthlib probes --set``) are computed, or loaded from the local
    cache, never chosen among committed runs, and labelled ``custom`` unless they are a profile's own settings."""
    out = dict(chapter_runs(profile, extra_models=extra_models, rerun=rerun, progress=progress))
    out.update({f"{SENSITIVITY}{eps!r}": run for eps, run in sensitivity_runs(profile, rerun=rerun,
                                                                              progress=progress).items()})
    return out


#: the part name of a sensitivity run is this prefix and its weight-noise level ε
SENSITIVITY = "sensitivity ε="


def model_runs(parts: dict[str, results.Run]) -> dict[str, results.Run]:
    """The per-model runs among a :func:`runs` result, {model: run}."""
    return {k: r for k, r in parts.items() if not k.startswith(SENSITIVITY)}


def sensitivity_parts(parts: dict[str, results.Run]) -> dict[float, results.Run]:
    """The weight-noise sensitivity runs among a :func:`runs` result, {ε: run}."""
    return {float(k.removeprefix(SENSITIVITY)): r for k, r in parts.items() if k.startswith(SENSITIVITY)}


@dataclass(frozen=True)
class ProbeRun:
    """One probe run: ``model`` on the first ``n_docs`` documents of ``corpus`` with ``config``, labelled
    ``profile`` (a profile's name where these are its settings, else ``custom``): what :func:`compute` takes."""

    model: str
    corpus: str = "sotu"
    n_docs: int = 16
    config: ProbeConfig = field(default_factory=ProbeConfig)
    profile: str = results.CUSTOM


def compute(cfg: ProbeRun, device: str = "cpu", *, force: bool = False, progress: bool = True,
            executor=None) -> results.Run:
    """Probe ``cfg.model`` on ``cfg.n_docs`` documents of ``cfg.corpus`` on ``device`` (cached, resumable): in this
    process (:func:`run_probe`) or, with an :class:`~depthlib.executors.ExecutorConfig` other than serial, as its
    number of document shards (:meth:`~depthlib.executors.ExecutorConfig.n_shards`) merged into the same run."""
    from depthlib import validate
    from depthlib.models import checks
    config = dataclasses.replace(cfg.config, device=device).validate()
    model, corpus, n_docs = cfg.model, cfg.corpus, cfg.n_docs

    def check() -> None:                     # before a run is opened (a --force deletes it) or a model is loaded
        checks.within_position_limit(model, config.max_length)
        checks.enough_documents(corpus, n_docs)
    if executor is None or executor.kind == "serial":
        check()
        return _checked(lambda: run_probe(model, corpus, n_docs, config, profile=cfg.profile, progress=progress,
                                          force=force))
    if force:
        raise InputError("--force works with --executor serial only")
    n = validate.int_in_range("--shards", executor.n_shards(), 1)
    check()
    return _checked(lambda: run_sharded(model, corpus, n_docs, config, executor, n, profile=cfg.profile))


def _checked(compute_run: Callable[[], results.Run]) -> results.Run:
    """``compute_run()`` passed through :func:`check_finite`. The warnings raised meanwhile are said once the run is
    found finite: a run whose hidden states overflow ends with its one error line, not with the warnings about NaN
    that follow from the overflow (a mean of inf − inf, a summary stored as null)."""
    from depthlib.finite import NonFiniteError
    said: list = []
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            run = compute_run()
        return check_finite(run)
    except NonFiniteError:
        said = []
        raise
    finally:
        for w in said:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def non_finite_from(run: results.Run) -> str | None:
    """Where a probe run's hidden states stop being finite, in words (``the token embedding``, ``block i``:
    0-indexed as ``model.layers``; ``""`` where the tables do not tell), or None when every number the chapter's
    analysis reads is finite: the mean angle θ(h_l, h_{l+1}) and norm |h_l| per layer (``layers``) and the angle
    trajectories of the token sample (``tokens``). Finite weights can still give hidden states whose squared norm
    overflows float32 (the metrics' precision): every angle from there on is NaN."""
    layers = run.table("layers")
    bad = layers[layers["metric"].isin(("norms", "theta")) & ~np.isfinite(layers["mean"].to_numpy(float))]
    tokens = run.table("tokens") if run.has("tokens") else pd.DataFrame()    # a sensitivity run keeps no tokens
    cols = sorted((c for c in tokens.columns if c.startswith("theta_")), key=lambda c: int(c.split("_")[1]))
    bad_cols = [c for c in cols if not np.isfinite(tokens[c].to_numpy(float)).all()]
    if bad.empty and not bad_cols:
        return None
    norms = bad.loc[bad["metric"] == "norms", "layer"]
    if len(norms):                                   # h_0 is the embedding, h_l (l ≥ 1) the output of block l − 1
        first = int(norms.min())
        return "the token embedding" if first == 0 else f"block {first - 1}"
    theta = [int(v) for v in bad.loc[bad["metric"] == "theta", "layer"]] + [int(c.split("_")[1]) for c in bad_cols]
    return f"block {min(theta)}" if theta else ""


def check_finite(run: results.Run, *, delete: bool = True) -> results.Run:
    """``run`` if :func:`non_finite_from` finds its tables finite; else :class:`depthlib.finite.NonFiniteError` (one
    line: the model, and the block whose output first overflows), after deleting the run's local folder and those of
    its shards (never a committed run) with ``delete``, so that no rerun loads it as complete."""
    import shutil

    from depthlib import paths
    from depthlib.finite import NonFiniteError
    where = non_finite_from(run)
    if where is None:
        return run
    model = run.config.get("model") or run.manifest.get("model")
    kept = "this committed run is kept"
    if delete and not run.committed:
        local = paths.local_results_dir()
        for folder in [run.path, *(local / s for s in run.manifest.get("shards", []))]:
            if folder.is_dir() and folder.resolve().is_relative_to(local.resolve()):
                shutil.rmtree(folder)
        kept = "nothing was cached"
    elif not run.committed:
        kept = f"the run is in {run.path}"
    raise NonFiniteError(f"model {model!r}: its hidden states overflow float32"
                         + (f" from the output of {where} on" if where else "")
                         + " (their squared norm is beyond float32's 3.4e38, so no angle between them is defined); "
                         + kept)


#: the corpora as the book's prose names them
CORPUS_NAMES = {"sotu": "State of the Union addresses", "fineweb": "FineWeb"}


def reduction(profile: str) -> str:
    """How ``profile``'s runs are reduced against the paper's: one line of the verdict's "how reduced" list."""
    p, paper = PROFILES[profile], PROFILES["paper"]
    return (f"{', '.join(p.models)} (offline 4-bit weights) on {p.n_docs} documents × ≤ {p.config.max_length} "
            f"tokens of {CORPUS_NAMES.get(p.corpus, p.corpus)}; the paper: {len(paper.models)} Pythia models on "
            f"{paper.n_docs:,} × {paper.config.max_length} tokens of FineWeb. Two unrelated models are not a depth "
            "series.")


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    c = run.config
    return {**results.run_info(run), **{k: c.get(k) for k in ("model", "corpus", "n_docs", "max_length", "dtype",
                                                             "lens_tokens_per_doc", "lens_docs", "weight_noise")},
            "executor": run.manifest.get("executor", "serial")}


def summary(run: results.Run) -> dict:
    """The key numbers of a probe run (its manifest's summary) and the trajectory clusters of its token sample (a
    weight-noise sensitivity run keeps none)."""
    from depthlib.probes import trajectory
    check_finite(run, delete=False)
    out = {k: v for k, v in run.manifest.get("summary", {}).items() if k not in ("probe_seconds", "vocab_size")}
    if run.has("tokens"):
        tokens = run.table("tokens")
        analysis = trajectory.analyze_trajectories(trajectory.theta_matrix(tokens))
        out["cluster_fractions"] = {k: round(v, 4) for k, v in analysis.fractions.items()}
        small = trajectory.small_cluster_tokens(tokens, analysis)
        out["small_cluster"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in small.items()}
    out["run"] = str(run.path)
    return out


def sensitivity_table(runs: dict[float, results.Run]) -> pd.DataFrame:
    """One row per noise level ε: middle-block mean angle and mean update angle (same middle range), model loss,
    and their change from ε = 0."""
    rows = []
    for eps, run in sorted(runs.items()):
        s = run.manifest["summary"]
        rows.append({"weight noise ε (× std W)": eps, "middle-block angle (rad)": s["theta_middle_mean"],
                     "update angle θ(Δh) (rad)": s["theta_dh_mean"],
                     "model loss (nats/token)": (s.get("ce_logit_by_layer") or [np.nan])[-1],
                     "documents": s["n_docs"], "tokens": s["n_tokens"]})
    table = pd.DataFrame(rows)
    if len(table) and 0.0 in runs:
        for col in ("middle-block angle (rad)", "update angle θ(Δh) (rad)", "model loss (nats/token)"):
            table[f"Δ {col.split(' (')[0]}"] = table[col] - table[col].iloc[0]
    return table


def lens_precision(layers: pd.DataFrame, lens: str = "ce_logit") -> dict:
    """How precise a run's lens curve is: tokens scored, the model's own loss (the lens at the last layer) with its
    standard error, and the largest standard error over layers (per-token losses through early layers are
    heavy-tailed, so a small token subsample leaves the early points loose)."""
    t = layers[layers["metric"] == lens].sort_values("layer")
    if t.empty or not (t["count"] > 1).all():
        return {}
    se = t["std"] / np.sqrt(t["count"])
    return {"tokens": int(t["count"].iloc[-1]), "model_loss": float(t["mean"].iloc[-1]),
            "model_loss_se": float(se.iloc[-1]), "max_se": float(se.max()),
            "max_se_layer": int(t["layer"].iloc[int(se.argmax())])}


def replay(run: results.Run, n_batches: int = 1) -> pd.DataFrame:
    """Probe the first ``n_batches`` batches of documents of a run again with the current code; returns each
    document's per-block mean angle, committed and recomputed (columns ``committed``, ``replayed``)."""
    from depthlib import data
    cfg_dict = dict(run.config)
    model, corpus, n_docs = cfg_dict.pop("model"), cfg_dict.pop("corpus"), cfg_dict.pop("n_docs")
    cfg_dict.pop("dtype", None)       # what the run's key adds to the config (from_dict drops the fingerprints)
    cfg = from_dict(ProbeConfig, {**cfg_dict, "device": "cpu"})
    docs = data.corpus(corpus, min(n_docs, n_batches * cfg.batch_size))
    m, tok = load_probed_model(model, cfg)
    fresh = probe_documents(m, tok, docs, cfg, progress=False, model_name=model).docs
    committed = run.table("docs")
    cols = [c for c in committed.columns if c.startswith("theta_")]
    merged = fresh.merge(committed, on=["doc_index", "doc_id"], suffixes=("_replayed", "_committed"))
    return pd.DataFrame({"doc_index": np.repeat(merged["doc_index"].to_numpy(), len(cols)),
                         "metric": np.tile(cols, len(merged)),
                         "committed": merged[[f"{c}_committed" for c in cols]].to_numpy().ravel(),
                         "replayed": merged[[f"{c}_replayed" for c in cols]].to_numpy().ravel()})


def angle_summary(layers: pd.DataFrame) -> dict:
    """What the chapter says about one model's angles (its ``layers`` table): the middle-block mean rotation, the
    largest middle-block rotation (``spike_block``, 1-based, and ``spike_angle``), the mean update angle over the
    middle pairs and the lowest one (``update_min_pair``: the 1-based block whose update is compared with the next)."""
    from depthlib.measures import middle_blocks, middle_update_pairs
    theta = layers[layers["metric"] == "theta"].sort_values("layer")["mean"].to_numpy(float)
    dh = layers[layers["metric"] == "theta_dh"].sort_values("layer")["mean"].to_numpy(float)
    if len(theta) == 0:
        raise InputError("the layers table has no 'theta' rows")
    mid = middle_blocks(len(theta))
    middle = theta[mid]
    k = int(np.argmax(middle))
    pairs = dh[middle_update_pairs(len(theta))] if len(dh) else np.array([np.nan])
    j = int(np.nanargmin(pairs)) if np.isfinite(pairs).any() else 0
    return {"middle_mean": float(middle.mean()), "spike_block": (mid.start or 0) + k + 1,
            "spike_angle": float(middle[k]), "update_mean": float(np.nanmean(pairs)),
            "update_min": float(pairs[j]), "update_min_pair": (middle_update_pairs(len(theta)).start or 0) + j + 1}


def ideal_distances(theta: np.ndarray, analysis) -> dict:
    """Median distance of a token's angle trajectory (rad, Euclidean over the blocks) to the 'evenly' ideal and to
    its own cluster's mean trajectory (:func:`depthlib.probes.trajectory.analyze_trajectories`): the two-cluster split
    only says which ideal a token is nearer to, not how near."""
    theta = np.asarray(theta, dtype=float)
    to_ideal = np.linalg.norm(theta - analysis.ideals["evenly"], axis=1)
    own = np.stack([analysis.cluster_means[label] for label in analysis.label])
    return {"to_evenly": float(np.median(to_ideal)), "to_own_mean": float(np.median(np.linalg.norm(theta - own, axis=1)))}

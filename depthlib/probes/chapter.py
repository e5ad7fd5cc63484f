"""Chapter 2's glue: the profiles of the hidden-state probes, the runs the chapter shows, and their replay check.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (one part per model, and one
per weight-noise level of the sensitivity check, ``sensitivity ε=<ε>``), ``compute``, ``replay``, ``describe``,
``summary`` and ``COMPUTE``; ``chapter_runs`` and ``sensitivity_runs`` are the two kinds of parts.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.contract import Profile, from_dict
from depthlib.errors import InputError
from depthlib.probes import CODE, EXPERIMENT_PREFIX
from depthlib.probes.stream import ProbeConfig, load_probed_model, probe_documents

#: The compute entries of the chapter's runs (one experiment per model, ``probes-<model>``): their code modules are
#: derived from the imports of the functions that compute their numbers (:func:`depthlib.results.compute_modules`):
#: the documents (``data.corpus``) and the pass over them (``probes.stream.probe_documents``, which also summarises).
#: ``depthlib.probes.run_probe`` only orchestrates (opens the run, loads, calls these, writes the tables).
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
    from depthlib.probes import experiment_name, probe_key, run_probe

    def expected(prof: str) -> dict | None:
        spec = _spec(prof, model, weight_noise)
        return probe_key(model, *spec) if spec else None
    corpus, n_docs, config = _spec(profile, model, weight_noise)
    if _custom(profile):                  # computed, or loaded from the local cache; a profile's own settings keep its name
        label = next((name for name in PROFILES if _spec(name, model, weight_noise) == (corpus, n_docs, config)),
                     results.CUSTOM)
        return compute(model, corpus, n_docs, config, profile=label, progress=progress)
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
    from depthlib.probes import experiment_name
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
    from depthlib.probes import probe_key
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


def compute(model: str, corpus: str = "sotu", n_docs: int = 16, config: ProbeConfig | None = None, *,
            profile: str = "custom", executor=None, shards: int | None = None, force: bool = False,
            progress: bool = True) -> results.Run:
    """Probe ``model`` on ``n_docs`` documents of ``corpus`` (cached, resumable): in this process
    (:func:`depthlib.probes.run_probe`) or, with an :class:`~depthlib.executors.ExecutorConfig` other than serial,
    as ``shards`` document shards (default: its number of jobs) merged into the same run."""
    from depthlib import paths, validate
    from depthlib.models import checks
    from depthlib.probes import SHARD_EXPERIMENT, open_probe_run, run_probe
    cfg = (config or ProbeConfig()).validate()

    def check() -> None:                     # before a run is opened (a --force deletes it) or a model is loaded
        checks.within_position_limit(model, cfg.max_length)
        checks.enough_documents(corpus, n_docs)
    if executor is None or executor.kind == "serial":
        check()
        folder = open_probe_run(model, corpus, n_docs, cfg).path
        with results.guarding(folder, f"finished documents are checkpointed in {folder} (every 4 batches)"):
            return _checked(lambda: run_probe(model, corpus, n_docs, cfg, profile=profile, progress=progress,
                                              force=force))
    if force:
        raise InputError("--force works with --executor serial only")
    from depthlib.probes import shards as sharding
    n = validate.int_in_range("--shards", shards if shards is not None else executor.jobs, 1)
    check()
    folder = paths.local_results_dir() / SHARD_EXPERIMENT
    with results.guarding(folder, f"finished shards and their checkpoints are under {folder}"):
        return _checked(lambda: sharding.run_sharded(model, corpus, n_docs, cfg, executor, n, profile=profile))


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

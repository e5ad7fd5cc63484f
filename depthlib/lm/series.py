"""One depth series: train every depth on the same tokens, save each as a Hugging Face folder, probe it.

A series is one results-cache run (experiment ``lm``). Each (depth, seed) member is a unit of work: it is
trained (resumable from ``units/checkpoint_<unit>.pt``), saved as an ordinary Hugging Face folder with its tokenizer
under ``<cache>/models/lm/<run key>/`` (so ``depthlib probes --model <folder>`` takes it), probed on the held-out
pieces by :func:`depthlib.probes.probe_documents`, and its tables are written to ``units/``; a rerun skips finished
units. When every unit is done the run's tables are written (tidy, one row per measurement):

=================  =====================================================================================
table              rows
=================  =====================================================================================
``curves``         depth, seed, step, lr, tokens_seen, train_loss, val_loss
``doc_losses``     depth, seed, step, doc_id, n_tokens, nll_sum, loss: held-out loss per document
``models``         depth, seed, parameters, tokens seen, final losses, wall time, tokens/s, folder
``probe_layers``   depth, seed, step, metric, layer, mean, std, count (the probes' per-layer table)
``probe_summary``  depth, seed, step, middle-block angle, update angle, first/last angle, model loss
``probe_docs``     depth, seed, step, doc_id, block, n_valid, theta_sum (per held-out document, for the bootstrap)
``clusters``       depth, seed, cluster, fraction, block, theta: the trajectory clusters of the final probes
``signature``      depth, seed, step, doc_id, theta_sum, theta_n, lag_sum, lag_n: per probe piece of the final
                   models, θ(Δh_l, Δh_{l+1}) and the long-lag cosine cos(Δh_l, Δh_{l+k}), k ≥ ℓ/4, summed over
                   middle blocks and tokens (chapter 5's :func:`~depthlib.measures.update_signature`,
                   the measure it applies to the offline LMs and the toy controls), so that pieces bootstrap
``fit``            quantity, value, lo, hi: α_ℓ, L∞, c of L(ℓ) = L∞ + c·ℓ^(−α_ℓ); the middle-angle exponent
``fit_bootstrap``  resample, alpha, L_inf, c, rmse, at_bound (paired bootstrap over held-out documents)
``angle_bootstrap``resample, alpha, theta_mid_<ℓ>
``fit_steps``      step, alpha, lo, hi, L_inf: α_ℓ at every evaluation step
=================  =====================================================================================

The probes run at every evaluation step for the ``angle_depths`` (without lenses) and, with lenses, on every trained
model, so the chapter can be drawn from the tables alone: the weights are not committed.
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
from depthlib.contract import from_dict, to_dict
from depthlib.errors import InputError
from depthlib.lm import fit
from depthlib.lm.corpus import CorpusConfig, TokenData, probe_pieces, split_documents, tokenize
from depthlib.lm.model import MAX_DEPTH, ModelConfig, build_model, flops_per_token, parameter_counts
from depthlib.lm.tokenizer import load_tokenizer, save_tokenizer, tokenizer_digest, train_tokenizer
from depthlib.lm.train import TrainConfig, train_model
from depthlib.validate import distinct, int_in_range, resolve_device

EXPERIMENT = "lm"
UNITS = "units"


@dataclass(frozen=True)
class SeriesConfig:
    """A depth series: the depths and seeds, the tokenizer, the family, the optimiser, the data and the probes."""

    profile: str
    depths: tuple = (1, 2, 4, 8, 16)             # ℓ: four octaves (Pythia spans 6 … 24)
    seeds: tuple = (0,)                          # replicates: initialisation and data order (the same for every ℓ)
    vocab_size: int = 2048                       # BPE vocabulary (a few thousand: the head stays cheap at width 64)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    angle_depths: tuple = (4, 8, 16)             # also probed (no lenses) at every evaluation step
    probe_batch: int = 16                        # probe pieces per forward pass (memory only)
    lens_tokens: int = 32                        # tokens per piece scored by the logit and last-block lenses
    reservoir: int = 20_000                      # per-token angle trajectories kept for the clusters (all, here)
    n_bootstrap: int = 1000                      # resamples of the held-out documents for the final fits
    step_bootstrap: int = 200                    # ... for α_ℓ at each evaluation step
    bootstrap_seed: int = 0

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SeriesConfig":
        return from_dict(cls, d)

    def validate(self) -> "SeriesConfig":
        for depth in self.depths:
            int_in_range("depth", depth, 1, MAX_DEPTH)
        distinct("depths", self.depths, at_least=1)
        distinct("seeds", self.seeds, at_least=1)
        for s in self.seeds:
            int_in_range("seed", s, 0, 2**31 - 1)
        for depth in self.angle_depths:
            if depth not in self.depths:
                raise InputError(f"angle depth {depth} is not one of the trained depths {list(self.depths)}")
        int_in_range("vocab_size", self.vocab_size, 260, 1 << 20)
        int_in_range("probe_batch", self.probe_batch, 1)
        int_in_range("lens_tokens", self.lens_tokens, 1)
        int_in_range("reservoir", self.reservoir, 1)
        int_in_range("n_bootstrap", self.n_bootstrap, 1)
        int_in_range("step_bootstrap", self.step_bootstrap, 1)
        self.model.validate()
        self.train.validate()
        self.corpus.validate()
        return self

    def units(self) -> list[tuple[int, int]]:
        """(depth, seed) of every member, shallowest first (each seed's series in turn)."""
        return [(int(d), int(s)) for s in self.seeds for d in sorted(self.depths)]

    def tokens_per_model(self) -> int:
        return self.train.steps * self.train.batch_size * self.model.context


def unit_name(depth: int, seed: int) -> str:
    return f"d{depth:03d}_s{seed}"


def open_series_run(cfg: SeriesConfig, root: Path | None = None) -> results.Run:
    return results.open_run(EXPERIMENT, cfg.validate().to_dict(), root=root)


def checkpoint_names(cfg: SeriesConfig) -> list[str]:
    return [f"{UNITS}/checkpoint_{unit_name(d, s)}.pt" for d, s in cfg.units()]


def model_dir(run: results.Run, depth: int, seed: int) -> Path:
    """Where the trained member (depth, seed) of a series is saved: an ordinary Hugging Face folder."""
    return paths.cache_dir() / "models" / EXPERIMENT / run.key / f"depth-{depth:02d}-seed-{seed}"


def _probe_config(cfg: SeriesConfig, device: str, lenses: bool):
    from depthlib.probes import ProbeConfig
    return ProbeConfig(max_length=cfg.model.context, batch_size=cfg.probe_batch, dtype="float32", device=device,
                       lenses=lenses, lens_tokens_per_doc=cfg.lens_tokens, reservoir_size=cfg.reservoir, seed=0)


def probe_tables(model, tokenizer, pieces, cfg: SeriesConfig, device: str, *, depth: int, seed: int, step: int,
                 lenses: bool) -> dict[str, pd.DataFrame]:
    """Run the chapter-2 probes on a model (in memory) over the held-out pieces; its tidy tables for one step."""
    import warnings

    from depthlib.probes import probe_documents
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # one block has no update pairs: θ(Δh) is NaN, said below
        res = probe_documents(model, tokenizer, pieces, _probe_config(cfg, device, lenses), progress=False,
                              model_name=f"lm depth {depth}")
        s = res.summary()
    key = {"depth": depth, "seed": seed, "step": step}
    theta = s["theta_by_layer"]
    summary = {**key, "n_tokens": s["n_tokens"], "theta_middle_mean": s["theta_middle_mean"],
               "theta_dh_mean": s["theta_dh_mean"] if depth > 1 else np.nan,
               "theta_first": theta[0], "theta_last": theta[-1],
               "model_loss": (s.get("ce_logit_by_layer") or [np.nan])[-1]}
    out = {"probe_layers": res.layers.assign(**key),
           "probe_docs": fit.tidy_probe_docs(res.docs, depth).assign(**key)}
    if lenses and depth >= fit.ANGLE_MIN_DEPTH:
        from depthlib.probes import trajectory
        analysis = trajectory.analyze_trajectories(trajectory.theta_matrix(res.tokens))
        small = trajectory.small_cluster_tokens(res.tokens, analysis)
        summary.update({f"cluster_{k.replace(' ', '_')}": v for k, v in analysis.fractions.items()})
        summary["small_cluster_share_position_0"] = small["share_position_0"]
        summary["position_0_share"] = small["share_position_0_overall"]
        rows = [{**key, "cluster": name, "kind": kind, "fraction": analysis.fractions.get(name, np.nan),
                 "block": b + 1, "theta": float(v)}
                for kind, table in (("cluster mean", analysis.cluster_means), ("ideal", analysis.ideals))
                for name, traj in table.items() for b, v in enumerate(traj)]
        out["clusters"] = pd.DataFrame(rows)
    if lenses:
        sig = update_signatures(model, tokenizer, pieces, cfg, device).assign(**key)
        summary["long_lag_cos"] = (float(sig["lag_sum"].sum() / sig["lag_n"].sum()) if sig["lag_n"].sum() > 0
                                   else np.nan)
        out["signature"] = sig
    out["probe_summary"] = pd.DataFrame([summary])
    return out


@torch.no_grad()
def update_signatures(model, tokenizer, pieces, cfg: SeriesConfig, device: str) -> pd.DataFrame:
    """Per probe piece (tokenised as the probes tokenise it: right-padded, one context window), the sums of
    θ(Δh_l, Δh_{l+1}) over middle update pairs and of the long-lag cosine over middle pairs k ≥ ℓ/4 apart, with their
    counts (:func:`depthlib.measures.update_signature` on the residual stream h_0 … h_ℓ before the
    final norm, :func:`depthlib.probes.tap.tap_hidden_states`). Columns doc_id, theta_sum, theta_n, lag_sum, lag_n."""
    from depthlib.measures import update_signature
    from depthlib.probes.tap import tap_hidden_states
    was = model.training
    model.eval()
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    parts = []
    for start in range(0, len(pieces), cfg.probe_batch):
        batch = pieces[start:start + cfg.probe_batch]
        enc = tokenizer([p.text for p in batch], return_tensors="pt", padding=True, truncation=True,
                        max_length=cfg.model.context)
        ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
        tap = tap_hidden_states(model, ids, mask)
        sig = update_signature([h.float().cpu() for h in tap.hidden], mask.cpu())
        parts.append(sig.drop(columns="doc").assign(doc_id=[p.doc_id for p in batch]))
    model.train(was)
    return pd.concat(parts, ignore_index=True)[["doc_id", "theta_sum", "theta_n", "lag_sum", "lag_n"]]


def save_model(model, tokenizer, folder: Path) -> Path:
    """Save a trained member as a Hugging Face folder (weights, config, tokenizer), atomically."""
    from transformers.utils import logging as hf_logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()                 # its "Writing model shards" bar is noise on stderr
    try:
        return results.atomic_folder(Path(folder), lambda tmp: (model.save_pretrained(str(tmp)),
                                                                tokenizer.save_pretrained(str(tmp))))
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _tokenizer(store: results.Run, cfg: SeriesConfig, train_docs):
    """The series' tokenizer, trained on the training documents once and kept in the run folder (a resumed run reuses
    it; training again would give the same one)."""
    folder = store.path / "tokenizer"
    if (folder / "tokenizer.json").is_file():
        return load_tokenizer(folder)
    tok = train_tokenizer([d.text for d in train_docs], cfg.vocab_size)
    save_tokenizer(tok, folder)
    return tok


def prepare_data(cfg: SeriesConfig, store: results.Run | None = None):
    """(tokenizer, token data, held-out documents, probe pieces) of a series."""
    train_docs, held = split_documents(cfg.corpus)
    if store is not None:
        store.path.mkdir(parents=True, exist_ok=True)
        tok = _tokenizer(store, cfg, train_docs)
    else:
        tok = train_tokenizer([d.text for d in train_docs], cfg.vocab_size)
    data = tokenize(tok, train_docs, held, cfg.model.context, cfg.corpus.val_tokens)
    pieces = probe_pieces(held, cfg.corpus.probe_chunks, cfg.corpus.probe_words)
    return tok, data, held, pieces


def train_unit(cfg: SeriesConfig, depth: int, seed: int, tok, data: TokenData, pieces, device: str, *,
               checkpoint: Path | None = None, on_step=None, stop_at_step: int | None = None) -> dict | None:
    """Train member (depth, seed) with the probes at its evaluation steps; returns train_model's record (or None
    when stopped early). Its weights are in ``record['model']``."""
    model = build_model(cfg.model, depth, len(tok), seed, tok.eos_token_id).to(device)

    def on_eval(step, m):
        if depth not in cfg.angle_depths or step == cfg.train.steps:
            return {}
        return probe_tables(m, tok, pieces, cfg, device, depth=depth, seed=seed, step=step, lenses=False)
    rec = train_model(model, data, cfg.train, seed=seed, checkpoint=checkpoint, on_eval=on_eval, on_step=on_step,
                      stop_at_step=stop_at_step)
    if rec is not None:
        rec["model"] = model
    return rec


def _progress(cfg: SeriesConfig, todo: list[tuple[int, int]], vocab: int, enabled: bool):
    """One bar for the whole series, in training GFLOP (so its ETA weighs deep members by their cost). It counts whole
    FLOPs (integers, shown ×1e-9): float steps summed one by one would overshoot a float total by round-off, and tqdm
    would warn and show a negative time left."""
    from tqdm.auto import tqdm
    per_step = {d: int(round(flops_per_token(cfg.model, d, vocab) * cfg.train.batch_size * cfg.model.context))
                for d in cfg.depths}
    total = sum(per_step[d] * cfg.train.steps for d, _ in todo)
    tty = sys.stderr.isatty()
    bar = tqdm(total=total, unit="GFLOP", unit_scale=1e-9, desc=f"lm {cfg.profile} ({len(todo)} models to train)",
               disable=not enabled, file=sys.stderr, dynamic_ncols=True, mininterval=0.5 if tty else 20,
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} GFLOP [{elapsed}<{remaining}, {rate_fmt}]{postfix}")
    return bar, per_step


def _train_and_store(cfg: SeriesConfig, run: results.Run, store: results.Run, depth: int, seed: int, tok,
                     data: TokenData, pieces, dev: str, ceiling: float, on_step=None) -> None:
    """Train member (depth, seed), save it, probe it and write its tables to ``store`` (its ``_model`` table last:
    a member counts as finished once that exists)."""
    from depthlib.lm.throughput import achieved
    name = unit_name(depth, seed)
    ckpt = store.path / f"checkpoint_{name}.pt"
    rec = train_unit(cfg, depth, seed, tok, data, pieces, dev, checkpoint=ckpt, on_step=on_step)
    model = rec.pop("model")
    folder = save_model(model, tok, model_dir(run, depth, seed))
    t0 = time.perf_counter()
    final = probe_tables(model, tok, pieces, cfg, dev, depth=depth, seed=seed, step=cfg.train.steps, lenses=True)
    probe_s = time.perf_counter() - t0
    key = {"depth": depth, "seed": seed}
    store.write_table(f"{name}_curve", rec["curve"].assign(**key))
    store.write_table(f"{name}_docs", rec["doc_losses"].assign(**key))
    for table in ("probe_layers", "probe_docs", "probe_summary", "clusters", "signature"):
        parts = [t for t in (rec["extra"].get(table), final.get(table)) if t is not None]
        if parts:
            store.write_table(f"{name}_{table}", pd.concat(parts, ignore_index=True))
    curve = rec["curve"]
    tokens = cfg.tokens_per_model()
    speed = achieved(flops_per_token(cfg.model, depth, len(tok)) * tokens, rec["seconds"], ceiling)
    store.write_table(f"{name}_model", pd.DataFrame([{
        **key, **parameter_counts(model), "tokens_seen": tokens, "steps": cfg.train.steps,
        "final_train_loss": float(curve["train_loss"].iloc[-1]), "final_val_loss": float(curve["val_loss"].iloc[-1]),
        "train_seconds": rec["seconds"], "eval_seconds": rec["eval_seconds"], "probe_seconds": probe_s,
        "tokens_per_s": tokens / max(rec["seconds"], 1e-12), "flop": flops_per_token(cfg.model, depth, len(tok)) * tokens,
        **speed, "folder": str(folder)}]))
    ckpt.unlink(missing_ok=True)


def _store(run: results.Run) -> results.Run:
    """Where a series keeps its members' tables, tokenizer and checkpoints."""
    return results.Run(EXPERIMENT, run.config, run.path / UNITS)


def train_member(config: dict, depth: int, seed: int, device: str = "cpu") -> str:
    """Train (or resume, or skip) one member of a series in its run's folder; returns the folder. Module-level so
    that executors can run members as separate jobs; the series' tokenizer must exist (run_series
    trains it before it dispatches members)."""
    from depthlib.lm.throughput import matmul_ceiling
    cfg = SeriesConfig.from_dict(config).validate()
    dev = str(resolve_device(device))
    run = open_series_run(cfg)
    store = _store(run)
    if not store.has(f"{unit_name(depth, seed)}_model"):
        tok, data, _, pieces = prepare_data(cfg, store)
        _train_and_store(cfg, run, store, depth, seed, tok, data, pieces, dev, matmul_ceiling(dev))
    return str(run.path)


def run_series(cfg: SeriesConfig, device: str = "cpu", *, progress: bool = True, force: bool = False,
               root: Path | None = None, stop_after_units: int | None = None, executor=None) -> results.Run | None:
    """Train (or resume, or load) a depth series; returns the complete run (None if ``stop_after_units`` stopped it).
    Its lifecycle is :func:`depthlib.results.computing`'s.

    With an :class:`depthlib.executors.ExecutorConfig` other than serial, the members still to train are units of
    that executor (one job per (depth, seed)); a failed member raises one :class:`InputError` line naming its log,
    and the finished members stay in the run folder."""
    from depthlib.lm.throughput import achieved, matmul_ceiling
    cfg.validate()
    dev = str(resolve_device(device))
    with results.computing(EXPERIMENT, cfg.to_dict(), profile=cfg.profile, code=(f"{__name__}:run_series",),
                           seed=int(cfg.seeds[0]), device=dev, force=force, root=root,
                           checkpoints=checkpoint_names(cfg), unit_marker="model",
                           saves=f"finished models and the current model's last checkpoint (every "
                                 f"{cfg.train.eval_every} steps) are in {{folder}}") as job:
        if job.complete:
            return job.run
        run = job.run
        store = _store(run)
        tok, data, held, pieces = prepare_data(cfg, store)
        todo = [(d, s) for d, s in cfg.units() if not store.has(f"{unit_name(d, s)}_model")]
        if executor is not None and executor.kind != "serial" and todo:
            if root is not None:
                raise InputError("a depth series on an executor uses the results cache (no root folder)")
            from depthlib import executors
            deepest_first = sorted(todo, key=lambda u: -u[0])      # the costliest jobs first: workers finish together
            units = [executors.Unit(f"lm-{run.key}-{unit_name(d, s)}", "depthlib.lm.series:train_member",
                                    dict(config=cfg.to_dict(), depth=d, seed=s, device=dev)) for d, s in deepest_first]
            problem = executors.failures(executors.run_units(units, executor))
            if problem:
                raise InputError(f"depth series {run.key}: {problem}; the finished members are kept, rerun to resume")
            todo = []
        ceiling = matmul_ceiling(dev)
        bar, per_step = _progress(cfg, todo, len(tok), progress)
        for trained, (depth, seed) in enumerate(todo):
            if stop_after_units is not None and trained >= stop_after_units:
                bar.close()
                job.stop()
                return None
            bar.set_postfix_str(f"depth {depth}, seed {seed}")

            def on_step(step, loss, d=depth, s=seed):
                bar.update(per_step[d])
                if step % 10 == 0:
                    bar.set_postfix_str(f"depth {d}, seed {s}, step {step}, loss {loss:.3f}")
            _train_and_store(cfg, run, store, depth, seed, tok, data, pieces, dev, ceiling, on_step)
            job.save_progress()
        bar.close()
        tables = combine(cfg, store)
        for name, table in tables.items():
            run.write_table(name, table)
        models = tables["models"]
        job.record(tokenizer=tokenizer_digest(tok), vocab_size=len(tok), train_tokens=data.train_tokens,
                   n_train_windows=data.n_windows, held_out_documents=data.val_ids, n_probe_pieces=len(pieces),
                   executor=getattr(executor, "kind", "serial"),
                   throughput={"train_seconds": float(models["train_seconds"].sum()),
                               "tokens_per_s": float(models["tokens_seen"].sum() / models["train_seconds"].sum()),
                               **achieved(float(models["flop"].sum()), float(models["train_seconds"].sum()), ceiling)},
                   summary=summary(tables, cfg))
    return results.Run.load(run.path)


def combine(cfg: SeriesConfig, store: results.Run) -> dict[str, pd.DataFrame]:
    """The run's tables from its units' tables, and the fits."""
    def gather(kind: str) -> pd.DataFrame:
        parts = [store.table(f"{unit_name(d, s)}_{kind}") for d, s in cfg.units() if store.has(f"{unit_name(d, s)}_{kind}")]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    out = {"curves": gather("curve"), "doc_losses": gather("docs"), "models": gather("model"),
           "probe_layers": gather("probe_layers"), "probe_summary": gather("probe_summary"),
           "probe_docs": gather("probe_docs"), "clusters": gather("clusters"), "signature": gather("signature")}
    out["models"]["folder"] = out["models"]["folder"].map(lambda p: str(Path(p).relative_to(paths.cache_dir()))
                                                          if Path(p).is_relative_to(paths.cache_dir()) else p)
    boot = fit.bootstrap_depth_law(out["doc_losses"], cfg.n_bootstrap, cfg.bootstrap_seed)
    angle_boot = fit.bootstrap_angle_exponent(out["probe_docs"], cfg.n_bootstrap, cfg.bootstrap_seed)
    out["fit_bootstrap"] = boot
    out["angle_bootstrap"] = angle_boot
    out["fit_steps"] = fit.alpha_by_step(out["doc_losses"], cfg.step_bootstrap, cfg.bootstrap_seed)
    out["fit"] = fit_table(boot, angle_boot, out["probe_summary"])
    return out


def fit_table(boot: pd.DataFrame, angle_boot: pd.DataFrame, probe_summary: pd.DataFrame) -> pd.DataFrame:
    """quantity, value, lo, hi, se, n_resamples, share_undefined_or_at_bound, n_depths: the chapter's fitted numbers."""
    s = fit.summarize_bootstrap(boot)
    rows = [{"quantity": q, "value": s[q]["value"], "lo": s[q]["lo"], "hi": s[q]["hi"], "se": np.nan,
             "n_resamples": s["n_resamples"], "share_undefined_or_at_bound": s["share_undefined_or_at_bound"],
             "n_depths": int(boot["n"].iloc[0])} for q in ("alpha", "L_inf", "c")]
    for column, name in (("theta_middle_mean", "alpha_theta"), ("theta_dh_mean", "alpha_theta_dh")):
        f = fit.angle_exponent(probe_summary, column)
        lo, hi = fit.interval(angle_boot["alpha"]) if column == "theta_middle_mean" else (np.nan, np.nan)
        bad = float((~np.isfinite(angle_boot["alpha"].to_numpy(float))).mean()) if column == "theta_middle_mean" else np.nan
        rows.append({"quantity": name, "value": f["alpha"], "lo": lo, "hi": hi, "se": f["alpha_se"],
                     "n_resamples": len(angle_boot) if column == "theta_middle_mean" else 0,
                     "share_undefined_or_at_bound": bad, "n_depths": f["n"]})
    return pd.DataFrame(rows)


def summary(tables: dict[str, pd.DataFrame], cfg: SeriesConfig) -> dict:
    """The key numbers of a finished series (the manifest's ``summary``; the CLI prints it)."""
    models = tables["models"]
    final = fit.depth_losses(tables["doc_losses"])
    f = tables["fit"].set_index("quantity")
    ps = tables["probe_summary"]
    last = ps[ps["step"] == cfg.train.steps].groupby("depth")[["theta_middle_mean", "theta_dh_mean",
                                                               "long_lag_cos"]].mean()

    def q(name):
        return {k: (None if not np.isfinite(f.loc[name, k]) else round(float(f.loc[name, k]), 4)) for k in ("value", "lo", "hi")}
    return {
        "val_loss": {int(r.depth): round(float(r.val_loss), 4) for r in final.itertuples()},
        "alpha_l": q("alpha"), "L_inf": q("L_inf"), "c_l": q("c"),
        "alpha_theta": {**q("alpha_theta"), "se": round(float(f.loc["alpha_theta", "se"]), 4)
                        if np.isfinite(f.loc["alpha_theta", "se"]) else None},
        "theta_middle_mean": {int(d): round(float(v), 4) for d, v in last["theta_middle_mean"].items()},
        "theta_dh_mean": {int(d): (round(float(v), 4) if np.isfinite(v) else None) for d, v in last["theta_dh_mean"].items()},
        "long_lag_cos": {int(d): (round(float(v), 4) if np.isfinite(v) else None) for d, v in last["long_lag_cos"].items()},
        "tokens_per_model": cfg.tokens_per_model(),
        "n_params": {int(r.depth): int(r.n_params) for r in models.drop_duplicates("depth").itertuples()},
        "n_non_embedding": {int(r.depth): int(r.n_non_embedding) for r in models.drop_duplicates("depth").itertuples()},
        "bootstrap": {"n_resamples": cfg.n_bootstrap, "over": "held-out documents" + (" and seeds" if len(cfg.seeds) > 1 else ""),
                      "share_undefined_or_at_bound": round(float(f.loc["alpha", "share_undefined_or_at_bound"]), 4)},
    }

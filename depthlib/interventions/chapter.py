"""Chapter 5's glue: the profiles of the interventions, the runs the chapter shows, and their replay check.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (one part per LM and ``toy``
for the toy students), ``compute``, ``replay``, ``describe``, ``summary`` and ``COMPUTE``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.contract import Profile, from_dict
from depthlib.interventions import InterventionConfig, experiment_name, intervention_key, run_interventions
from depthlib.interventions.suite import SuiteConfig
from depthlib.interventions.toy import EXPERIMENT as TOY_EXPERIMENT
from depthlib.interventions.toy import ToyInterventionConfig, run_toy_interventions

#: The compute entry of each experiment's runs (the LMs' ``interventions-<model>``, the toy students'
#: ``interventions-toy``): their code modules are derived from its imports (:func:`depthlib.results.compute_modules`).
COMPUTE = {"interventions-": "depthlib.interventions:run_interventions",
           TOY_EXPERIMENT: "depthlib.interventions.toy:run_toy_interventions"}


@dataclass(frozen=True)
class InterventionProfile(Profile):
    """The settings of one profile of the interventions chapter (design: profiles)."""

    models: tuple[str, ...]
    corpus: str
    n_docs: int                       # scored documents (the rankings use ``config.rank_docs`` others)
    config: InterventionConfig
    toy: ToyInterventionConfig


_SMOKE_SUITE = SuiteConfig(ks=(1, 2, 4), draws=1, permutations=2, swaps=2, group_sizes=(2, 4))
PROFILES = {
    # seconds: proves the code path on both offline models and a tiny toy
    "smoke": InterventionProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 2,
                                 InterventionConfig(max_length=16, batch_size=2, rank_docs=2, suite=_SMOKE_SUITE),
                                 ToyInterventionConfig(depth=8, steps=60, batch=64, test_inputs=256, docs=4,
                                                       teacher_depth=16, suite=_SMOKE_SUITE)),
    # minutes on 2 CPU cores (benchmarks/bench_interventions.py sizes it): 8 scored addresses × their first 64 tokens,
    # one batch; Gemma's 262k-word unembedding (172 GFLOP per plan here) is most of the cost
    "cpu": InterventionProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 8,
                               InterventionConfig(max_length=64, batch_size=8), ToyInterventionConfig()),
    # a GPU: the Pythia suite on FineWeb, 256 documents × 512 tokens (not run by us)
    "paper": InterventionProfile(tuple(f"EleutherAI/pythia-{s}" for s in ("160m", "410m", "1.4b")), "fineweb", 256,
                                 InterventionConfig(max_length=512, batch_size=16, rank_docs=64, device="cuda",
                                                    suite=SuiteConfig(ks=(1, 2, 4, 6, 8, 12), draws=8, permutations=32,
                                                                      swaps=16)),
                                 ToyInterventionConfig(steps=40_000, batch=1024, variant="exp-9")),
}


def _lm_run(profile: str, model: str, rerun: bool, progress: bool) -> results.Run:
    def expected(prof: str) -> dict | None:
        p = PROFILES.get(prof)
        if p is None or model not in p.models:
            return None
        return intervention_key(model, p.corpus, p.n_docs, p.config)
    p = PROFILES[profile]
    return results.chapter_run(experiment_name(model), profile,
                               lambda: compute(model, p.corpus, p.n_docs, p.config, profile=profile,
                                               progress=progress),
                               expected_config=expected, rerun=rerun)


def _toy_run(profile: str, rerun: bool, progress: bool) -> results.Run:
    def expected(prof: str) -> dict | None:
        return dataclasses.asdict(PROFILES[prof].toy) if prof in PROFILES else None
    return results.chapter_run(TOY_EXPERIMENT, profile,
                               lambda: compute("toy", config=PROFILES[profile].toy, profile=profile, progress=progress),
                               expected_config=expected, rerun=rerun)


def runs(profile: str = "smoke", *, rerun: bool = False, executor=None, device: str = "cpu",
         progress: bool = False) -> dict[str, results.Run]:
    """{model name: run} for the profile's LMs and ``"toy"`` for the toy students, each found by the one rule
    (:func:`depthlib.results.select_run`) or computed now in this process (the profile's settings decide the device)."""
    results.check_profile(profile)
    runs = {model: _lm_run(profile, model, rerun, progress) for model in PROFILES[profile].models}
    runs["toy"] = _toy_run(profile, rerun, progress)
    return runs


def compute(model: str, corpus: str = "sotu", n_docs: int = 8, config: InterventionConfig | None = None, *,
            plans=None, profile: str = "custom", progress: bool = True, force: bool = False) -> results.Run:
    """Run the plan suite (or ``plans``) on ``model``, cached (:func:`depthlib.interventions.run_interventions`);
    ``model="toy"`` trains and edits the toy students of ``config`` (a :class:`ToyInterventionConfig`) instead."""
    if model == "toy":
        toy = (config or ToyInterventionConfig()).validate()
        folder = results.open_run(TOY_EXPERIMENT, dataclasses.asdict(toy)).path
        with results.guarding(folder, f"the students' last checkpoint (every 500 steps) is in {folder}"):
            return run_toy_interventions(toy, profile=profile, progress=progress, force=force)
    cfg = (config or InterventionConfig()).validate()
    folder = results.open_run(experiment_name(model), intervention_key(model, corpus, n_docs, cfg, plans)).path
    with results.guarding(folder, f"finished batches are checkpointed in {folder}"):
        return run_interventions(model, corpus, n_docs, cfg, plans=plans, profile=profile, progress=progress,
                                 force=force)


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    c = run.config
    keys = (("variant", "rhos", "temperature", "depth", "steps", "batch", "test_inputs", "docs")
            if run.experiment == TOY_EXPERIMENT else ("model", "corpus", "n_docs", "max_length", "rank_docs"))
    return {**results.run_info(run), **{k: c.get(k) for k in keys}}


def summary(run: results.Run) -> dict:
    """The key numbers of a run: per plan (one row per plan text), the loss, its change from the unedited model, the
    KL to it and the top-1 agreement; and the run's own summary (blocks, documents, the unedited loss)."""
    from depthlib.interventions.analysis import plan_effects
    effects = plan_effects(run.table("plans"), run.table("scores")).drop_duplicates("plan")
    return {"run": str(run.path), **run.manifest.get("summary", {}),
            "plans": [{"plan": r.plan, "family": r.family, "rule": r.rule, "loss": r.loss,
                       "delta_loss": r.delta_loss, "kl": r.kl, "top1_agreement": r.agree}
                      for r in effects.itertuples()],
            "units": "loss, delta_loss, kl: nats per predicted token; kl = KL(unedited || edited)"}


def tables(runs: dict[str, results.Run]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(plans, scores, distances, influence) of all runs, each with a ``model`` column (toy rows: ``toy ρ=…``)."""
    out = []
    for name in ("plans", "scores", "distances", "influence"):
        parts = []
        for model, run in runs.items():
            df = run.table(name)
            parts.append(df if "model" in df else df.assign(model=model))
        out.append(pd.concat(parts, ignore_index=True))
    return tuple(out)


def replay(run: results.Run, n_plans: int = 3) -> pd.DataFrame:
    """Recompute a cheap prefix of a run with the current code; returns the committed and recomputed numbers
    (columns ``committed``, ``replayed``). An LM run: its first batch of documents for the identity and a few other
    plans (loss, and KL except the identity's, which is 0 up to rounding and gives the KL's tolerance, ``atol``).
    The toy run: the students' test loss after their first 500 steps."""
    if run.experiment == TOY_EXPERIMENT:
        return _replay_toy(run)
    model, corpus = run.config["model"], run.config["corpus"]
    cfg = from_dict(InterventionConfig, run.config)
    committed = run.table("scores")
    plans = list(dict.fromkeys(run.table("plans")["plan"]))
    chosen = [plans[0]] + [plans[i] for i in np.linspace(1, len(plans) - 1, n_plans - 1).astype(int)]
    fresh = compute(model, corpus, cfg.batch_size, cfg, plans=chosen[1:], progress=False, force=True).table("scores")
    merged = fresh.merge(committed, on=["plan", "doc_index"], suffixes=("_replayed", "_committed"))
    # KL = Σ p log p − (p·z − lse) cancels sums over the vocabulary of terms of size |z|: the identity plan's KL, 0 in
    # exact arithmetic, is what that cancellation leaves of a document's KL in float32. Two computations of a KL (two
    # CPUs' kernels) each carry about that error, so they may differ by up to twice it (``atol``).
    floor = committed[committed["plan"] == plans[0]].set_index("doc_index")["kl"].abs()
    rows = [dict(plan=r.plan, metric=metric, atol=2 * floor[r.doc_index] if metric == "kl" else 0.0,
                 committed=getattr(r, f"{metric}_committed"), replayed=getattr(r, f"{metric}_replayed"))
            for r in merged.itertuples() for metric in ("loss", "kl") if not (metric == "kl" and r.plan == plans[0])]
    return pd.DataFrame(rows)


def _replay_toy(run: results.Run, steps: int = 500) -> pd.DataFrame:
    from depthlib.interventions.toy import _train
    cfg = from_dict(ToyInterventionConfig, run.config)
    steps = min(steps, cfg.steps)
    _, curves, _ = _train(cfg, None, progress=False, stop_at=steps)
    committed = run.table("training")
    merged = curves[curves["step"] == steps].merge(committed[committed["step"] == steps], on=["rho", "step"],
                                                   suffixes=("_replayed", "_committed"))
    return pd.DataFrame({"rho": merged["rho"], "metric": "test_loss", "committed": merged["test_loss_committed"],
                         "replayed": merged["test_loss_replayed"]})


def settings_table(runs: dict[str, results.Run]) -> pd.DataFrame:
    """One row per run: what was edited, on how much text, and the unedited loss."""
    rows = []
    for name, run in runs.items():
        s, cfg = run.manifest["summary"], run.config
        if name == "toy":
            for st in s["students"]:
                rows.append({"model": f"toy ρ={st['rho']:g}", "blocks": s["n_blocks"],
                             "scored": f"{cfg['test_inputs']} inputs in {cfg['docs']} slices",
                             "training": f"{cfg['variant']}, {cfg['steps']} steps × {cfg['batch']}, T = {cfg['temperature']:g}",
                             "unedited loss": round(st["test_loss"], 6)})
        else:
            rows.append({"model": name, "blocks": s["n_blocks"],
                         "scored": f"{s['n_docs']} docs × ≤ {cfg['max_length']} tokens ({s['n_tokens']} predicted)",
                         "training": "pretrained (fp32)", "unedited loss": round(s["baseline_loss"], 4)})
    return pd.DataFrame(rows).set_index("model")


def rule_choices(plans: pd.DataFrame) -> pd.DataFrame:
    """Which blocks Gromov et al.'s rule and ShortGPT's order delete for each k, per model."""
    from depthlib.interventions.analysis import n_blocks_of
    from depthlib.interventions.plan import parse_plan
    rows = []
    for model, m in plans.groupby("model", sort=False):
        L = n_blocks_of(m)
        for k in sorted(m.loc[m["rule"] == "gromov", "k"].unique()):
            row = {"model": model, "k": int(k)}
            for rule in ("gromov", "shortgpt"):
                text = m.loc[(m["rule"] == rule) & (m["k"] == k) & (~m["rescale"]), "plan"].iloc[0]
                kept = {s.blocks[0] for s in parse_plan(text, L).steps}
                row[rule] = " ".join(str(b) for b in range(L) if b not in kept)
            rows.append(row)
    return pd.DataFrame(rows)


def fit_table(fits: dict[str, dict]) -> pd.DataFrame:
    """The ensemble fit of each model's random-middle deletion curve: α, its interval, c, the ks fitted."""
    return pd.DataFrame([{"model": m, "ℓ": f.get("n_blocks"), "ks": " ".join(f"{k:g}" for k in f["ks"]),
                          "α": round(f["alpha"], 2), "α 2.5 %": round(f["alpha_lo"], 2), "α 97.5 %": round(f["alpha_hi"], 2),
                          "c": round(f["c"], 3), "R²": round(f["r2"], 3), "α at search edge": f["at_bound"]}
                         for m, f in fits.items()]).set_index("model")

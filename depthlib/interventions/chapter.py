"""Chapter 5's glue: the profiles of the interventions, the runs the chapter shows, and their replay check.

The names of the chapter contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs`` (one part per LM and ``toy``
for chapter 3's certified-protocol toy students), ``compute``, ``replay``, ``describe``, ``summary`` and ``COMPUTE``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.contract import Profile, from_dict
from depthlib.errors import InputError
from depthlib.interventions import InterventionConfig, experiment_name, intervention_key, run_interventions
from depthlib.interventions.suite import SuiteConfig
from depthlib.interventions.toy import EXPERIMENT as TOY_EXPERIMENT
from depthlib.interventions.toy import ToyInterventionConfig, run_toy_interventions
from depthlib.validate import resolve_device

#: The compute entry of each experiment's runs (the LMs' ``interventions-<model>``, the toy controls'
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
    suites: tuple[tuple[str, SuiteConfig], ...] = ()   # per-model plan suites replacing ``config.suite``

    def config_for(self, model: str) -> InterventionConfig:
        """The LM settings of ``model``: ``config`` with its own suite where ``suites`` names one."""
        suite = dict(self.suites).get(model)
        return self.config if suite is None else dataclasses.replace(self.config, suite=suite)


_SMOKE_SUITE = SuiteConfig(ks=(2,), draws=2, each_block=False, plateau_k=2, plateau_draws=1, norm_matched=1,
                           permutations=1, reverse=False, group_sizes=(2,), group_positions=1)
#: The cpu run: the toy controls, then both LMs one after the other on two threads, under an hour in all on an
#: idle 2-core machine (benchmarks/bench_interventions.py measures a plan). The toy controls get the full design
#: (seconds per plan). Both LMs keep the issue's minimums: 32 documents × 256 tokens scored on the last 128 (4,096
#: tokens), 10 random draws for each k and 30 reorderings. SmolLM2: k = 2 and 6 (20 reorderings over the middle, 10
#: inside the plateau), two parallel positions. Gemma's 262k-word unembedding makes a plan ~3× dearer (measured on
#: two threads: 4.2 s against 1.5 s a batch), so it deletes one k (4, a k the controls share) and reaches its 30
#: reorderings with 10 random orders of the whole middle beside the 10 middle and 10 plateau shifts; one parallel
#: position. Neither LM deletes every block alone on cpu (the cost by position comes from the smallest k's draws).
_SMOL_CPU = SuiteConfig(ks=(2, 6), draws=10, each_block=False, plateau_k=4, plateau_draws=10, norm_matched=3,
                        permutations=0, reverse=False, group_sizes=(4,), group_positions=2)
_GEMMA_CPU = SuiteConfig(ks=(4,), draws=10, each_block=False, plateau_k=4, plateau_draws=10, norm_matched=3,
                         permutations=10, reverse=False, group_sizes=(4,), group_positions=1)
PROFILES = {
    # seconds: proves the code path on both offline models and chapter 3's smoke students
    "smoke": InterventionProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 2,
                                 InterventionConfig(max_length=16, score_last=8, batch_size=2, rank_docs=2,
                                                    suite=_SMOKE_SUITE),
                                 ToyInterventionConfig(profile="smoke", depth=8, replicates=2, docs=4, inputs_per_doc=16,
                                                       rank_docs=2, suite=_SMOKE_SUITE)),
    "cpu": InterventionProfile(("gemma-3-270m", "smollm2-135m"), "sotu", 32,
                               InterventionConfig(max_length=256, score_last=128, batch_size=4, rank_docs=16),
                               ToyInterventionConfig(),
                               suites=(("gemma-3-270m", _GEMMA_CPU), ("smollm2-135m", _SMOL_CPU))),
    # a GPU: the Pythia suite on FineWeb, the full design on every model (not run by us)
    "paper": InterventionProfile(tuple(f"EleutherAI/pythia-{s}" for s in ("160m", "410m", "1.4b")), "fineweb", 256,
                                 InterventionConfig(max_length=512, score_last=256, batch_size=16, rank_docs=64,
                                                    device="cuda",
                                                    suite=SuiteConfig(ks=(2, 4, 8), draws=10, permutations=30)),
                                 ToyInterventionConfig(profile="paper")),
}


def _lm_run(profile: str | InterventionProfile, model: str, rerun: bool, progress: bool) -> results.Run:
    def expected(prof: str) -> dict | None:
        p = PROFILES.get(prof)
        if p is None or model not in p.models:
            return None
        return intervention_key(model, p.corpus, p.n_docs, p.config_for(model))
    if isinstance(profile, InterventionProfile):     # custom settings: computed, or loaded from the local cache
        spec = (profile.corpus, profile.n_docs, profile.config_for(model))
        label = next((name for name, p in PROFILES.items()   # a profile's own settings keep its name
                      if model in p.models and (p.corpus, p.n_docs, p.config_for(model)) == spec), results.CUSTOM)
        return compute(InterventionRun(model, *spec, profile=label), spec[-1].device, progress=progress)
    p = PROFILES[profile]
    return results.chapter_run(experiment_name(model), profile,
                               lambda: compute(InterventionRun(model, p.corpus, p.n_docs, p.config_for(model),
                                                               profile=profile), p.config_for(model).device,
                                               progress=progress),
                               expected_config=expected, rerun=rerun)


def _toy_run(profile: str | InterventionProfile, rerun: bool, progress: bool) -> results.Run:
    def expected(prof: str) -> dict | None:
        return PROFILES[prof].toy.key() if prof in PROFILES else None
    if isinstance(profile, InterventionProfile):     # custom settings: custom unless a profile's own
        label = next((name for name, p in PROFILES.items() if p.toy == profile.toy), results.CUSTOM)
        return compute(InterventionRun("toy", config=profile.toy, profile=label), progress=progress)
    return results.chapter_run(TOY_EXPERIMENT, profile,
                               lambda: compute(InterventionRun("toy", config=PROFILES[profile].toy, profile=profile),
                                               progress=progress),
                               expected_config=expected, rerun=rerun)


def runs(profile: str | InterventionProfile = "smoke", *, rerun: bool = False, executor=None, device: str = "cpu",
         progress: bool = False) -> dict[str, results.Run]:
    """{model name: run} for the profile's LMs and ``"toy"`` for the toy controls, each found by the one rule
    (:func:`depthlib.results.select_run`) or computed now in this process (the profile's settings decide the device);
    the toy controls first (a minute), then the LMs. Custom settings (an :class:`InterventionProfile`, e.g.
    ``depthlib interventions --set``) are computed, or loaded from the local cache, never chosen among committed runs,
    and labelled ``custom`` unless they are a profile's own settings."""
    if isinstance(profile, InterventionProfile):
        settings = profile
    else:
        results.check_profile(profile)
        settings = PROFILES[profile]
    toy = _toy_run(profile, rerun, progress)
    out = {model: _lm_run(profile, model, rerun, progress) for model in settings.models}
    out["toy"] = toy
    return out


@dataclass(frozen=True)
class InterventionRun:
    """One interventions run, what :func:`compute` takes: the plan suite (or ``plans``, plan texts) on ``model``
    over ``n_docs`` documents of ``corpus`` with ``config``; or, with ``model="toy"``, chapter 3's certified-protocol
    toy students of ``config`` (a :class:`ToyInterventionConfig`; ``corpus`` and ``n_docs`` unused). ``profile``
    labels it (a profile's name where these are its settings, else ``custom``)."""

    model: str
    corpus: str = "sotu"
    n_docs: int = 32
    config: InterventionConfig | ToyInterventionConfig | None = None
    plans: tuple[str, ...] | None = None
    profile: str = results.CUSTOM


def compute(cfg: InterventionRun, device: str = "cpu", *, force: bool = False, progress: bool = True,
            executor=None) -> results.Run:
    """Compute (or resume, or load) the run ``cfg`` on ``device`` in this process, cached
    (:func:`depthlib.interventions.run_interventions`, or :func:`run_toy_interventions` for the toy students, which
    are edited on the CPU). Only the serial executor applies: a run's plans share one loaded model."""
    if executor is not None and executor.kind != "serial":
        raise InputError("an interventions run is computed in this process: use --executor serial")
    if cfg.model == "toy":
        if resolve_device(device).type != "cpu":
            raise InputError(f"the toy students are edited on the CPU, not on {device}: drop --device")
        return run_toy_interventions(cfg.config, profile=cfg.profile, progress=progress, force=force)
    from depthlib.models import checks
    config = dataclasses.replace(cfg.config or InterventionConfig(), device=device).validate()
    checks.within_position_limit(cfg.model, config.max_length)      # before a run is opened (a --force deletes it)
    checks.enough_documents(cfg.corpus, cfg.n_docs, first=config.rank_docs)
    return run_interventions(cfg.model, cfg.corpus, cfg.n_docs, config, plans=cfg.plans, profile=cfg.profile,
                             progress=progress, force=force)


def reduction(profile: str) -> str:
    """How ``profile``'s runs are reduced against the paper's: one line of the verdict's "how reduced" list."""
    p = PROFILES[profile]
    return (f"{', '.join(p.models)} and chapter 3's toy students, {p.n_docs} documents × {p.config.max_length} tokens "
            f"(the last {p.config.score_last} scored); " + "; ".join(
                f"{m}: k = {', '.join(map(str, p.config_for(m).suite.ks))} blocks deleted, "
                f"{p.config_for(m).suite.draws} draws each" for m in p.models)
            + "; no single-block deletions on the LMs (not in the paper).")


def describe(run: results.Run) -> dict:
    """Provenance and settings of a run, for the chapter's text."""
    c = run.config
    keys = (("profile", "depth", "rhos", "temperature", "replicates", "docs", "inputs_per_doc")
            if run.experiment == TOY_EXPERIMENT else ("model", "corpus", "n_docs", "max_length", "score_last", "rank_docs"))
    return {**results.run_info(run), **{k: c.get(k) for k in keys}}


def summary(run: results.Run) -> dict:
    """The key numbers of a run: per plan (one row per plan text), the loss, its change from the unedited model, the
    KL to it and the top-1 agreement; and the run's own summary (blocks, documents, the unedited loss)."""
    from depthlib.interventions.analysis import plan_effects
    plans, scores = run.table("plans"), run.table("scores")
    if "model" not in plans:
        plans, scores = plans.assign(model=""), scores.assign(model="")
    effects = plan_effects(plans, scores).drop_duplicates(["model", "plan"])
    return {"run": str(run.path), **run.manifest.get("summary", {}),
            "plans": [{"model": r.model, "plan": r.plan, "family": r.family, "rule": r.rule, "loss": r.loss,
                       "delta_loss": r.delta_loss, "kl": r.kl, "top1_agreement": r.agree}
                      for r in effects.itertuples()],
            "units": "loss, delta_loss, kl: nats per scored token (toy: per input); kl = KL(unedited || edited)"}


TABLE_NAMES = ("plans", "scores", "distances", "influence", "signature")


def tables(runs: dict[str, results.Run]) -> dict[str, pd.DataFrame]:
    """{table: all runs' rows} for plans, scores, distances, influence and signature, each with a ``model`` column
    (the toy's rows: ``toy independent r0`` …)."""
    out = {}
    for name in TABLE_NAMES:
        parts = []
        for model, run in runs.items():
            df = run.table(name)
            parts.append(df if "model" in df else df.assign(model=model))
        out[name] = pd.concat(parts, ignore_index=True)
    return out


def statistics(runs: dict[str, results.Run], n_boot: int | None = None) -> dict[str, dict]:
    """{model: :func:`~depthlib.interventions.analysis.model_statistics`} of every LM and toy student."""
    from depthlib.interventions import analysis
    t = tables(runs)
    out = {}
    for model, meta in t["plans"].groupby("model", sort=False):
        sig = t["signature"][t["signature"]["model"] == model]
        out[model] = analysis.model_statistics(meta, t["scores"][t["scores"]["model"] == model], sig,
                                               n_boot=n_boot or analysis.N_BOOT)
    return out


def replay(run: results.Run, n_plans: int = 3) -> pd.DataFrame:
    """Recompute a cheap prefix of a run with the current code; returns the committed and recomputed numbers
    (columns ``committed``, ``replayed``). An LM run: its first batch of documents for the identity and a few other
    plans (loss, and KL except the identity's). The toy run: its first student's first two "documents" for the
    identity and a few plans; it needs chapter 3's students' weights, which only the local cache holds (a fresh clone
    raises :class:`depthlib.errors.ReplayUnavailable`, and the replay test skips with that reason)."""
    if run.experiment == TOY_EXPERIMENT:
        return _replay_toy(run, n_plans)
    model, corpus = run.config["model"], run.config["corpus"]
    cfg = from_dict(InterventionConfig, run.config)
    committed = run.table("scores")
    plans = list(dict.fromkeys(run.table("plans")["plan"]))
    chosen = [plans[0]] + [plans[i] for i in np.linspace(1, len(plans) - 1, n_plans - 1).astype(int)]
    fresh = compute(InterventionRun(model, corpus, cfg.batch_size, cfg, tuple(chosen[1:])), cfg.device, progress=False,
                    force=True).table("scores")
    merged = fresh.merge(committed, on=["plan", "doc_index"], suffixes=("_replayed", "_committed"))
    # KL is summed term by term over the vocabulary (V terms, each |p (log p − log q)|): two CPUs' kernels may differ by
    # a few float32 eps per term, so the KL of a document may move by about V · eps32 · (its KL): covered by the
    # relative tolerance of the committed-run test (1e-4); the identity's KL is exactly 0 and is not compared.
    rows = [dict(plan=r.plan, metric=metric, atol=0.0, committed=getattr(r, f"{metric}_committed"),
                 replayed=getattr(r, f"{metric}_replayed"))
            for r in merged.itertuples() for metric in ("loss", "kl") if not (metric == "kl" and r.plan == plans[0])]
    return pd.DataFrame(rows)


def _replay_toy(run: results.Run, n_plans: int) -> pd.DataFrame:
    from depthlib.interventions.toy import edit_student
    cfg = from_dict(ToyInterventionConfig, run.config)
    cfg = dataclasses.replace(cfg, suite=from_dict(SuiteConfig, run.config["suite"]))
    plans_table, committed = run.table("plans"), run.table("scores")
    first = plans_table["model"].iloc[0]
    texts = list(dict.fromkeys(plans_table.loc[plans_table["model"] == first, "plan"]))
    chosen = [texts[0]] + [texts[i] for i in np.linspace(1, len(texts) - 1, n_plans - 1).astype(int)]
    rho, r = (0.0 if "independent" in first else 1.0), int(first.rsplit("r", 1)[1])
    fresh = edit_student(cfg, rho, r, n_docs=2, plans=chosen)["scores"]
    merged = fresh.merge(committed[committed["model"] == first], on=["plan", "doc_index"],
                         suffixes=("_replayed", "_committed"))
    return pd.DataFrame({"plan": merged["plan"], "metric": "loss", "committed": merged["loss_committed"],
                         "replayed": merged["loss_replayed"]})


def settings_table(runs: dict[str, results.Run], stats: dict[str, dict] | None = None) -> pd.DataFrame:
    """One row per model or toy student: what was edited, on how much text or how many inputs, the unedited loss (with
    its 95 % bootstrap interval over documents when ``stats``, :func:`statistics`, is given)."""
    from depthlib.interventions.predictions import interval

    def loss(model: str, value: float, digits: int) -> str | float:
        if not stats or model not in stats:
            return round(value, digits)
        v, lo, hi = interval(stats[model][("baseline", "", 0)])
        return f"{v:.{digits}g} [{lo:.{digits}g}, {hi:.{digits}g}]"
    rows = []
    for name, run in runs.items():
        s, cfg = run.manifest["summary"], run.config
        if name == "toy":
            students = run.table("students")
            for st in students.itertuples():
                n_plans = int((run.table("plans")["model"] == st.model).sum())
                rows.append({"model": st.model, "blocks": int(st.depth), "plans": n_plans,
                             "scored": f"{cfg['docs']} slices × {cfg['inputs_per_doc']} inputs",
                             "training": f"chapter 3, {st.stage} ({'certified' if st.certified else 'not certified'}), "
                                         f"T = {st.temperature:g}",
                             "unedited loss": loss(st.model, float(st.loss_here), 3)})
        else:
            rows.append({"model": name, "blocks": s["n_blocks"], "plans": s["n_plans"],
                         "scored": f"{s['n_docs']} docs × {cfg['max_length']} tokens, last {cfg['score_last']} scored "
                                   f"({s['n_tokens']} tokens)",
                         "training": "pretrained (fp32)", "unedited loss": loss(name, s["baseline_loss"], 4)})
    return pd.DataFrame(rows).set_index("model")

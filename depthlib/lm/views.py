"""Chapter 6's tables and Markdown, built from a finished series for the notebook (``notebooks/06_lm.ipynb``).

Every function reads the run's tables through :mod:`depthlib.lm.analysis` (nothing is computed that a run stores) and
returns a DataFrame or a Markdown string for the notebook to display; no compute code imports this module, so editing
it never makes a committed run stale. Units: losses in nats per token, angles in radians, exponents dimensionless.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.claims import Measurement, t_interval
from depthlib.lm import analysis

__all__ = ["alpha_comparison_rows", "alpha_steps_text", "angle_text", "budget_table", "chinchilla_text", "cluster_text",
           "fit_text", "leave_one_out_table", "leave_one_out_text", "limits_text", "measurements", "numbers_text",
           "settings_table", "throughput_text"]


def settings_table(run: results.Run, profile: str) -> pd.DataFrame:
    """The family and its budget, one row per setting (column ``<profile> profile``): architecture, width, heads,
    context and vocabulary (tokens), depths, seeds, optimiser steps, tokens per step and per model, the corpus's
    training tokens, held-out addresses and probe pieces, and the parameter counts of the shallowest and deepest
    models."""
    from depthlib.lm.chapter import describe
    info, budget = describe(run), analysis.budget(run)
    return pd.Series({
        "architecture": f"{info['arch']} (GPT-NeoX = Pythia's)" if info["arch"] == "neox" else info["arch"],
        "width d_model": info["d_model"], "attention heads": info["n_heads"], "context (tokens)": info["context"],
        "vocabulary (BPE tokens)": info["vocab_size"], "depths ℓ": ", ".join(map(str, info["depths"])),
        "seeds": len(info["seeds"]), "optimiser steps": info["steps"],
        "tokens per step": info["batch_size"] * info["context"], "tokens seen per model": info["tokens_per_model"],
        "training tokens in the corpus": info["train_tokens"], "held-out addresses": info["held_out_documents"],
        "probe pieces (held-out)": info["n_probe_pieces"],
        "parameters, shallowest → deepest": f"{budget.n_params.iloc[0]:,} → {budget.n_params.iloc[-1]:,}"},
        name=f"{profile} profile").to_frame()


def fit_text(run: results.Run, profile: str) -> str:
    """**Measured** (Markdown): the final held-out loss per depth (nats/token), the fitted α_ℓ, L∞ (nats/token) and c_ℓ
    with their 95 % bootstrap intervals, the share of resamples without a usable fit, and whether the interval contains
    the paper's α_ℓ."""
    final = analysis.final_losses(run)
    alpha, L_inf, c_l = (analysis.fit_row(run, q) for q in ("alpha", "L_inf", "c"))
    paper_value = analysis.PAPER_ALPHA_L[0]
    inside = alpha["lo"] <= paper_value <= alpha["hi"]
    return (f"**Measured** ({profile} profile, {len(final)} depths, {int(final.n_docs.iloc[0])} held-out addresses). "
            "Held-out loss " + ", ".join(f"ℓ = {r.depth}: {r.val_loss:.3f}" for r in final.itertuples())
            + " nats/token. "
            f"Fit: {analysis.alpha_phrase(run)}, "
            f"L∞ = {L_inf['value']:.3f} [{L_inf['lo']:.3f}, {L_inf['hi']:.3f}] nats/token, c_ℓ = {c_l['value']:.3f}; "
            f"{100 * alpha['share_undefined_or_at_bound']:.0f} % of the {int(alpha['n_resamples'])} resamples gave no "
            "fit or one at the edge of the searched range (α ∈ [0.02, 8]). The 95 % interval "
            f"{'contains' if inside else 'does not contain'} the paper's {paper_value} (whose ± 0.3 is one standard "
            "error of a fit to other models, so the two are not the same kind of interval).")


def leave_one_out_table(loo: pd.DataFrame) -> pd.DataFrame:
    """The depth law refitted without each depth (``loo``: :func:`depthlib.lm.chapter.leave_one_depth_out`), indexed
    by the depth left out, rounded to 3 digits: α_ℓ (dimensionless), L∞ (nats/token), c_ℓ."""
    return loo.round(3).set_index("left out")


def leave_one_out_text(loo: pd.DataFrame) -> str:
    """How much the fit rests on one model (Markdown): the range of α_ℓ over the leave-one-depth-out refits and
    which depth left out gives each end."""
    return ("**How much the fit rests on one model.** Refitted without each depth in turn, α_ℓ ranges from "
            f"{loo['α_ℓ'].min():.2f} (without ℓ = {loo.loc[loo['α_ℓ'].idxmin(), 'left out']}) to {loo['α_ℓ'].max():.2f} "
            f"(without ℓ = {loo.loc[loo['α_ℓ'].idxmax(), 'left out']}): with five depths and three parameters, one model "
            "moves the exponent more than the bootstrap interval says.")


def alpha_comparison_rows(run: results.Run, profile: str, ch1: dict | None) -> pd.DataFrame:
    """The rows of :func:`depthlib.plots.lm.alpha_comparison` (label, value, lo, hi; α_ℓ is dimensionless): this
    family's α_ℓ with its 95 % bootstrap interval, the paper's 1.2 ± 1.96 × 0.3 and, when ``ch1``
    (:func:`depthlib.lm.chapter.chinchilla_alpha`) is given, chapter 1's converged fit ± 1.96 SE."""
    alpha = analysis.fit_row(run, "alpha")
    return pd.DataFrame(
        [{"label": f"this family ({profile}), 95 % bootstrap", "value": alpha["value"], "lo": alpha["lo"],
          "hi": alpha["hi"]},
         {"label": "paper (Chinchilla points), ± 1.96 × its SE 0.3", "value": 1.2, "lo": 1.2 - 1.96 * 0.3,
          "hi": 1.2 + 1.96 * 0.3}]
        + ([{"label": "chapter 1, converged fit, ± 1.96 SE", "value": ch1["alpha_l"],
             "lo": ch1["alpha_l"] - 1.96 * ch1["se"], "hi": ch1["alpha_l"] + 1.96 * ch1["se"]}] if ch1 else []))


def chinchilla_text(ch1: dict | None) -> str:
    """Chapter 1's converged α_ℓ ± 1.96 SE (Markdown), or what it needs when the Chinchilla CSV is missing (``ch1``:
    :func:`depthlib.lm.chapter.chinchilla_alpha`)."""
    if ch1:
        return (f"Chapter 1's converged fit of the decomposed law gives α_ℓ = {ch1['alpha_l']:.2f} ± "
                f"{1.96 * ch1['se']:.2f} (1.96 SE).")
    return "Chapter 1's value needs the Chinchilla CSV (set `DEPTHLIB_DATA_DIR`), which is not available here."


def angle_text(run: results.Run, profile: str) -> str:
    """**Measured** (Markdown): the middle-block mean angle per depth (rad), its exponent α_θ over the depths with
    ℓ ≥ 4 with the least-squares SE, the 95 % t interval and the bootstrap interval over held-out text, and the mean
    update angle θ(Δh_l, Δh_l+1) per depth (rad) beside π/2."""
    angles, a = analysis.angles(run), analysis.fit_row(run, "alpha_theta")
    n = int(a["n_depths"])
    lo, hi = t_interval(a["value"], a["se"], n - 2)
    return (f"**Measured** ({profile} profile). Middle-block mean angle "
            + ", ".join(f"ℓ = {r.depth}: {r.theta_middle_mean:.3f}" for r in angles.itertuples()) + " rad. "
            f"Over the {n} depths with ℓ ≥ 4, ⟨θ⟩_mid ∝ ℓ^−α_θ with α_θ = {a['value']:.2f} "
            f"(least-squares SE {a['se']:.2f}; with {n} points and {n - 2} degree(s) of freedom its 95 % t interval is "
            f"[{lo:.2f}, {hi:.2f}], so the exponent is barely constrained; the bootstrap interval over held-out text, "
            f"[{a['lo']:.2f}, {a['hi']:.2f}], counts only which text is probed, not how far three points stray from a "
            "power law). "
            "Both ensemble averaging and procedural assembly predict 1/ℓ here, so this row would not tell them apart "
            "even if it were pinned down. Mean update angle θ(Δh_l, Δh_l+1) over the middle pairs: "
            + ", ".join(f"ℓ = {r.depth}: {r.theta_dh_mean:.2f}" for r in angles.itertuples()
                        if np.isfinite(r.theta_dh_mean))
            + f" rad (π/2 = {np.pi / 2:.2f}).")


def cluster_text(run: results.Run) -> str:
    """**Measured** (Markdown): per clustered depth, the share of tokens (%) near the 'evenly' ideal and how many of
    the others are first tokens of a piece, beside the share of first tokens among all."""
    angles = analysis.angles(run)
    ca = angles.dropna(subset=["cluster_evenly"]) if "cluster_evenly" in angles else angles.iloc[:0]
    if not len(ca):
        return "**Measured.** No depth has enough middle blocks to cluster."
    return "**Measured.** " + " ".join(
        f"ℓ = {r.depth}: {100 * r.cluster_evenly:.1f} % of tokens near 'evenly'" + (
            f"; of the others, {100 * r.small_cluster_share_position_0:.0f} % are first tokens of a piece (first tokens "
            f"are {100 * r.position_0_share:.1f} % of all)." if np.isfinite(r.small_cluster_share_position_0) else
            " (no token in the other cluster).") for r in ca.itertuples())


def alpha_steps_text(run: results.Run) -> str:
    """**Measured** (Markdown): α_ℓ at each evaluation step with its 95 % bootstrap interval, the steps without an
    exponent, and the middle-angle exponent α_θ over the probed depths at each step."""
    steps, by_step = analysis.alpha_steps(run), analysis.angles_by_step(run)
    fitted, undefined = steps[steps.defined], steps[~steps.defined & (steps.step > 0)]
    alpha_t = by_step.drop_duplicates("step")[["step", "alpha_theta"]]
    # the last step's exponent is the chapter's fit (its own, larger bootstrap): one number for one exponent
    final, last = analysis.fit_row(run, "alpha"), int(steps["step"].max())

    def interval(r) -> str:
        lo, hi = (final["lo"], final["hi"]) if r.step == last else (r.lo, r.hi)
        return f"step {r.step}: {r.alpha:.2f} [{lo:.2f}, {hi:.2f}]"
    n_step, n_fit = run.config.get("step_bootstrap"), run.config.get("n_bootstrap")
    return ("**Measured.** α_ℓ at each evaluation step" + (
        f" (intervals from {n_step} bootstrap resamples; the last step's is the fit's, from {n_fit})"
        if n_step and n_fit and n_step != n_fit else "") + ": " + (", ".join(interval(r) for r in fitted.itertuples())
                                                                     if len(fitted) else "no step has a fit")
        + (f"; no exponent at step(s) {', '.join(str(s) for s in undefined.step)} (the loss does not yet fall with "
           "depth as a power law: no fit, or one at the edge of the searched range)" if len(undefined) else "")
        + ". Middle-angle exponent over the probed depths at each step: "
        + ", ".join(f"step {r.step}: {r.alpha_theta:.2f}" for r in alpha_t.itertuples() if np.isfinite(r.alpha_theta))
        + ".")


def budget_table(run: results.Run) -> pd.DataFrame:
    """Per depth: parameters (all and non-embedding), tokens seen, and tokens per parameter of each kind
    (:func:`depthlib.lm.analysis.budget`), rounded to 2 digits."""
    budget = analysis.budget(run)
    return budget[["depth", "n_params", "n_non_embedding", "tokens_seen", "tokens_per_parameter",
                   "tokens_per_non_embedding"]].rename(
        columns={"n_params": "parameters", "n_non_embedding": "non-embedding", "tokens_seen": "tokens seen",
                 "tokens_per_parameter": "tokens / param.", "tokens_per_non_embedding": "tokens / non-emb."}).round(2)


def limits_text(run: results.Run) -> str:
    """What this family can and cannot say (Markdown list): its width, parameters, tokens per model and per parameter
    (against Chinchilla's ≈ 20), seeds and learning rate, why this configuration was kept, and which profile the page
    shows beside the `paper` profile's (defined, not run)."""
    from depthlib.lm.chapter import PROFILES, describe
    info, budget = describe(run), analysis.budget(run)
    fewest, paper = budget.tokens_per_parameter.min(), PROFILES["paper"].series
    covered = " and seeds" if len(info["seeds"]) > 1 else ", not initialisation or data order"
    return f"""
* **Can:** within one recipe, width and token budget, whether held-out loss falls with depth like a power law plus a
  floor, with what exponent and with what uncertainty over held-out text; whether the middle-layer angle of the *same*
  family falls like 1/ℓ; whether consecutive updates are near-orthogonal at every depth; how both move during training.
  Every number comes from models and data that anyone can regenerate offline with the code of this book.
* **Cannot:** stand in for the paper's LLMs. These models have width {info['d_model']} (Pythia: 512–2048) and
  {budget.n_params.min():,}–{budget.n_params.max():,} parameters; each saw {info['tokens_per_model']:,} tokens of one small
  corpus of political speeches (as few as {fewest:.2f} tokens per parameter, against Chinchilla's ≈ 20), with
  {len(info['seeds'])} seed(s) (the bootstrap covers held-out text{covered})
  and one learning rate ({info['lr']:g}) for every depth, not tuned per depth. The configuration was chosen after a
  first attempt at width 128 with 400 steps left every depth in the regime where each extra block only slows
  training (held-out loss rose with ℓ): the width was halved to afford 2.5× the steps, so this family was kept
  because it shows a fall with depth. The fitted α_ℓ is the exponent **at this
  budget**: with more tokens the models' losses keep falling and the exponent can move; L∞ is a fitted floor for this
  width and budget, not the entropy of the text.
* **Profile.** This page shows the `{run.profile}` profile on {info['device']}. The `cpu` profile is a reduced run for a
  2-core CPU; the `paper` profile (width {paper.model.d_model}, depths {min(paper.depths)}–{max(paper.depths)},
  {len(paper.seeds)} seeds, {paper.tokens_per_model():,} tokens per model) is defined for a GPU and reruns this chapter
  unchanged; it has not been run here.
"""


def numbers_text(run: results.Run) -> str:
    """The conclusion's numbers (Markdown): α_ℓ at the last step with its 95 % bootstrap interval, how it moved over
    the last three steps with a fit, and the tokens per parameter of the deepest and shallowest models."""
    alpha, steps, budget = analysis.fit_row(run, "alpha"), analysis.alpha_steps(run), analysis.budget(run)
    last = steps[steps.defined].tail(3)
    if len(last):
        moved = (f"; over steps {int(last.step.iloc[0])}–{int(last.step.iloc[-1])} it moved "
                 + " → ".join(f"{r.alpha:.2f}" for r in last.itertuples()))
    else:
        moved = "; no evaluation step has a defined fit"
    return (f"**The numbers.** α_ℓ = {alpha['value']:.2f} [{alpha['lo']:.2f}, {alpha['hi']:.2f}] at the last step{moved}"
            f". Tokens per parameter: {budget.tokens_per_parameter.iloc[-1]:.2f} (deepest) to "
            f"{budget.tokens_per_parameter.iloc[0]:.2f} (shallowest), against Chinchilla's ≈ 20.")


def throughput_text(run: results.Run) -> str:
    """What training cost (Markdown): process time summed over the depths and the run's wall time (min), tokens/s
    summed over the models, GFLOP/s and its share of the fp32 matmul rate measured when the run started."""
    from depthlib.lm.chapter import describe
    info = describe(run)
    tp = info["throughput"]
    return (f"Training took {tp.get('train_seconds', float('nan')) / 60:.1f} min of process time summed over the "
            f"{len(info['depths'])} depths, trained as parallel units within a {info['wall_time_s'] / 60:.1f} min "
            "wall-clock run (which also holds the held-out losses, probes and fits); throughput "
            f"{tp.get('tokens_per_s', float('nan')):,.0f} tokens/s summed over the models, "
            f"{tp.get('gflop_per_s', float('nan')):.1f} GFLOP/s "
            f"= {100 * tp.get('fraction_of_matmul', float('nan')):.0f} % of the fp32 matmul rate measured when the run "
            f"started ({tp.get('matmul_gflop_per_s', float('nan')):.0f} GFLOP/s; training FLOPs counted as 6N + 6ℓTd "
            "per token; `benchmarks/bench_lm.py` measures both side by side).")


def measurements(parts: dict[str, results.Run | None]) -> dict[str, list]:
    """Chapter 6's numbers for the verdict's claims: the series' α_ℓ and α_θ, from the certified series
    (:func:`depthlib.lm.converged_views.measurements`) where the chapter shows one, else from the first series (its
    members not certified: undecided)."""
    if parts.get("converged") is not None:     # the series trained until α_ℓ stops moving supersedes the 2 M-token one
        from depthlib.lm import converged_views
        return converged_views.measurements(parts["converged"])
    run = parts.get("series")
    if run is None:
        return {}
    alpha, theta = analysis.fit_row(run, "alpha"), analysis.fit_row(run, "alpha_theta")
    depths = sorted(analysis.final_losses(run)["depth"])
    model = f"depth series ℓ = {', '.join(map(str, depths))}"
    n = int(theta["n_depths"])
    return {
        "series_alpha": [Measurement(model, alpha["value"], alpha["lo"], alpha["hi"], run.profile,
                                     "95 % bootstrap over held-out addresses; members not certified (no "
                                     "continuation was run)", converged=False)],
        "angle_depth": [Measurement(f"depth series, {n} depths with middle blocks", theta["value"],
                                    *t_interval(theta["value"], theta["se"], n - 2), run.profile,
                                    f"least-squares t interval over {n} points ({n - 2} degree(s) of freedom); "
                                    "members not certified", converged=False)],
    }

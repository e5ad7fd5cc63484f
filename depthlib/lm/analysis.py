"""Views of a finished depth series for chapter 6: small tables computed live from the run's tables.

Nothing here is stored in a run (so it is not part of the run's code fingerprint): every view is recomputed from the
tidy tables of :mod:`depthlib.lm.series` each time the chapter is built, with the definitions of
:mod:`depthlib.lm.fit` (the depth law, the paired bootstrap over held-out documents) and :mod:`depthlib.measures`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.lm import fit

#: The paper's depth exponent for LLMs (§3, from the Chinchilla points): α_ℓ = 1.2 ± 0.3.
PAPER_ALPHA_L = (1.2, 0.3)


def final_losses(run: results.Run, level: float = 0.95) -> pd.DataFrame:
    """Held-out loss per depth at the last step (nats/token) with a percentile interval from the run's own paired
    bootstrap draws over held-out documents: depth, val_loss, lo, hi, n_docs."""
    cfg = run.config
    docs = run.table("doc_losses")
    last = docs[docs["step"] == docs["step"].max()]
    depths, nll, n = fit._cube(last, "nll_sum", "n_tokens")
    draws, seeds = fit._resample_index(nll.shape[2], nll.shape[1], cfg["n_bootstrap"], cfg["bootstrap_seed"])
    boot = np.stack([(nll[:, seeds[r]][:, :, draws[r]].sum(2) / n[:, seeds[r]][:, :, draws[r]].sum(2)).mean(1)
                     for r in range(len(draws))])                                   # (resample, depth)
    q = (1 - level) / 2
    return pd.DataFrame({"depth": depths.astype(int), "val_loss": boot[0], "lo": np.quantile(boot, q, axis=0),
                         "hi": np.quantile(boot, 1 - q, axis=0), "n_docs": nll.shape[2]})


def fit_row(run: results.Run, quantity: str) -> dict:
    """One row of the run's ``fit`` table as a dict (value, lo, hi, se, ...)."""
    t = run.table("fit").set_index("quantity")
    return t.loc[quantity].to_dict()


def fit_band(run: results.Run, grid: np.ndarray, level: float = 0.95) -> pd.DataFrame:
    """The fitted law L∞ + c·ℓ^(−α) on ``grid`` (depths) and its pointwise percentile band over the bootstrap fits."""
    boot = run.table("fit_bootstrap")
    ok = boot[np.isfinite(boot["alpha"])]
    curves = ok["L_inf"].to_numpy()[:, None] + ok["c"].to_numpy()[:, None] * grid[None, :] ** -ok["alpha"].to_numpy()[:, None]
    point = boot[boot["resample"] == 0].iloc[0]
    q = (1 - level) / 2
    return pd.DataFrame({"depth": grid, "fit": point["L_inf"] + point["c"] * grid ** -point["alpha"],
                         "lo": np.quantile(curves, q, axis=0) if len(ok) else np.nan,
                         "hi": np.quantile(curves, 1 - q, axis=0) if len(ok) else np.nan})


def angles(run: results.Run, level: float = 0.95) -> pd.DataFrame:
    """Per depth, the final probes' middle-block mean angle (with its bootstrap interval over held-out documents where
    the depth enters the exponent fit), the mean update angle θ(Δh_l, Δh_{l+1}), first and last block angles and the
    trajectory-cluster fractions (mean over seeds)."""
    summary = run.table("probe_summary")
    last = summary[summary["step"] == summary.groupby("depth")["step"].transform("max")]
    cols = [c for c in ("theta_middle_mean", "theta_dh_mean", "theta_first", "theta_last", "model_loss",
                        "cluster_evenly", "cluster_stops_early", "small_cluster_share_position_0", "position_0_share")
            if c in last]
    out = last.groupby("depth", as_index=False)[cols].mean()
    boot = run.table("angle_bootstrap")
    q = (1 - level) / 2
    out["lo"] = [np.quantile(boot[f"theta_mid_{d}"], q) if f"theta_mid_{d}" in boot else np.nan for d in out["depth"]]
    out["hi"] = [np.quantile(boot[f"theta_mid_{d}"], 1 - q) if f"theta_mid_{d}" in boot else np.nan for d in out["depth"]]
    out["in_fit"] = out["depth"] >= fit.ANGLE_MIN_DEPTH
    return out


def layer_tables(run: results.Run, step: int | None = None, seed: int | None = None) -> dict[str, pd.DataFrame]:
    """{'ℓ = 8': layers table} of the final (or ``step``) probes, one per depth, for the chapter-2 figures."""
    layers = run.table("probe_layers")
    seed = int(layers["seed"].min()) if seed is None else seed
    layers = layers[layers["seed"] == seed]
    out = {}
    for depth, g in layers.groupby("depth"):
        s = int(g["step"].max()) if step is None else step
        if (g["step"] == s).any():
            out[f"ℓ = {int(depth)}"] = g[g["step"] == s][["metric", "layer", "mean", "std", "count"]]
    return out


def angles_by_step(run: results.Run) -> pd.DataFrame:
    """Middle-block and update angles of the probed depths at every evaluation step (mean over seeds), with the
    tokens seen; and, per step, the middle-angle exponent over those depths (column ``alpha_theta``)."""
    summary = run.table("probe_summary")
    curves = run.table("curves")[["depth", "seed", "step", "tokens_seen"]]
    probed = sorted(run.config["angle_depths"])
    t = summary[summary["depth"].isin(probed)].merge(curves, on=["depth", "seed", "step"], how="left")
    t = t.groupby(["depth", "step"], as_index=False)[["theta_middle_mean", "theta_dh_mean", "tokens_seen"]].mean()
    alpha = {int(s): fit.angle_exponent(g, step=int(s))["alpha"] if g["depth"].nunique() > 1 else np.nan
             for s, g in t.groupby("step")}
    t["alpha_theta"] = t["step"].map(alpha)
    return t


def budget(run: results.Run) -> pd.DataFrame:
    """Per depth: parameters (all, non-embedding), tokens seen, tokens per non-embedding parameter (Chinchilla's
    compute-optimal ratio is ≈ 20 tokens per parameter), training wall time and tokens/s."""
    m = run.table("models")
    out = m.groupby("depth", as_index=False).agg(
        n_params=("n_params", "first"), n_non_embedding=("n_non_embedding", "first"),
        tokens_seen=("tokens_seen", "first"), train_seconds=("train_seconds", "mean"),
        tokens_per_s=("tokens_per_s", "mean"), fraction_of_matmul=("fraction_of_matmul", "mean"))
    out["tokens_per_parameter"] = out["tokens_seen"] / out["n_params"]
    out["tokens_per_non_embedding"] = out["tokens_seen"] / out["n_non_embedding"]
    return out


def loss_curves(run: results.Run) -> pd.DataFrame:
    """Held-out and training loss per (depth, step), mean over seeds."""
    c = run.table("curves")
    return c.groupby(["depth", "step"], as_index=False)[["tokens_seen", "lr", "train_loss", "val_loss"]].mean()


def point_fit(run: results.Run) -> dict:
    """The depth-law fit to the data themselves (bootstrap resample 0): alpha, L_inf, c, rmse, n, at_bound."""
    boot = run.table("fit_bootstrap")
    return boot[boot["resample"] == 0].iloc[0].to_dict()


def alpha_phrase(run: results.Run) -> str:
    """How the chapter states the fitted α_ℓ: the value and interval, or why there is none."""
    a, point = fit_row(run, "alpha"), point_fit(run)
    if not np.isfinite(a["value"]):
        return "no α_ℓ (the held-out loss does not fall with depth, so the law has no decreasing fit)"
    if point["at_bound"]:
        return (f"no usable α_ℓ: the best fit runs to the edge of the searched range (α = {a['value']:.2f}), i.e. the loss "
                "is flat beyond the shallowest depths at this budget")
    return f"α_ℓ = {a['value']:.2f} (95 % bootstrap interval [{a['lo']:.2f}, {a['hi']:.2f}])"


def alpha_steps(run: results.Run) -> pd.DataFrame:
    """α_ℓ at every evaluation step (the run's ``fit_steps``) with ``defined``: the fit exists and lies inside the
    searched range (at an edge, e.g. α = 8 when the loss is flat beyond ℓ = 1, no exponent is measured)."""
    t = run.table("fit_steps")
    lo, hi = fit.ALPHA_RANGE
    t["defined"] = np.isfinite(t["alpha"]) & (t["alpha"] > lo * 1.05) & (t["alpha"] < hi * 0.95) & (t["step"] > 0)
    return t


def alpha_result(run: results.Run) -> dict:
    """Whether the series' α_ℓ of L = L∞ + c·ℓ^(−α_ℓ) (the run's ``fit``: 95 % bootstrap over held-out documents) is
    a result: ``alpha``, ``lo``, ``hi``, ``L_inf``, ``n_depths``, ``depths`` (the run's ``models``),
    ``share_undefined_or_at_bound`` of the resamples, and ``shown`` with ``why_not`` when it is not: fewer than five
    depths, no fit (a loss that does not fall with depth as the law needs), or a point or an interval that reaches an
    end of the searched range (:data:`depthlib.lm.fit.ALPHA_RANGE`)."""
    f = run.table("fit").set_index("quantity")
    a, floor = f.loc["alpha"], f.loc["L_inf"]
    lo_end, hi_end = fit.ALPHA_RANGE[0] * 1.05, fit.ALPHA_RANGE[1] * 0.95
    if a.n_depths < 5:
        why = f"{int(a.n_depths)} depths (the law needs 5)"
    elif not np.isfinite(a.value):
        why = "no fit: loss does not fall with depth"
    elif not (lo_end < a.value < hi_end):
        why = "fit at a search bound"
    elif not (np.isfinite(a.lo) and np.isfinite(a.hi) and lo_end < a.lo and a.hi < hi_end):
        why = "interval reaches a search bound"
    else:
        why = ""
    return {"alpha": float(a.value), "lo": float(a.lo), "hi": float(a.hi), "L_inf": float(floor.value),
            "n_depths": int(a.n_depths),
            "depths": ", ".join(str(int(d)) for d in sorted(run.table("models")["depth"].unique())),
            "shown": not why, "why_not": why, "share_undefined_or_at_bound": float(a.share_undefined_or_at_bound)}

"""Views of a finished chapter-7 run: small tables computed live from its tables, never stored in it.

* :func:`fit_laws` — the depth laws of every (family, replicate). With the Bayes loss B of the held-out set known
  exactly (:func:`depthlib.compose.rhm.bayes_nll`), the excess E(ℓ) = L(ℓ) − B is fitted as a power law
  E = c·ℓ^(−α) in log–log space (``law = "excess"``: two parameters, so at least four depths). The paper's law with a
  free floor, L = L∞ + c·ℓ^(−α_ℓ) (§3, :func:`depthlib.lm.fit.fit_depth_law`), is fitted as well where a family has at
  least five depths; a fit whose α lands at an end of the searched range is kept in the table but counted as
  undefined (``at_bound``).
* :func:`alpha_table` — per family and law, α over replicates: mean and 95 % t interval (n − 1 degrees of freedom).
* :func:`loss_table`, :func:`diagnostic_table` — per family and depth, means over replicates with 95 % t intervals.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.lm.fit import fit_depth_law
from depthlib.measures import fit_power_law

#: fewest depths for a fit: its parameters + 2
MIN_POINTS = {"excess": 4, "free floor": 5}
#: what each family reuses, for labels
FAMILY_LABELS = {"untied": "untied (ℓ blocks)", "looped": "looped (prelude, core × (ℓ−2), coda)",
                 "tied": "fully tied (one block × ℓ)"}


def mean_interval(values, level: float = 0.95) -> tuple[float, float, float, int]:
    """(mean, lo, hi, n) of finite ``values``: a t interval over replicates (NaN bounds with fewer than two)."""
    from scipy import stats
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    m = float(v.mean())
    if n < 2:
        return m, math.nan, math.nan, n
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(v.std(ddof=1)) / math.sqrt(n)
    return m, m - half, m + half, n


def fit_laws(members: pd.DataFrame) -> pd.DataFrame:
    """family, seed, law, alpha, c, L_inf, rmse, n, at_bound, defined: the depth laws of every replicate."""
    rows = []
    for (family, seed), g in members.groupby(["family", "seed"]):
        g = g.sort_values("depth")
        base = {"family": family, "seed": int(seed), "n": len(g)}
        ok = len(g) >= MIN_POINTS["excess"] and bool((g["excess"] > 0).all())
        f = fit_power_law(g["depth"], g["excess"]) if ok else {"alpha": np.nan, "c": np.nan}
        pred = f["c"] * g["depth"].to_numpy(float) ** -f["alpha"] if ok else np.nan
        rows.append({**base, "law": "excess", "alpha": f["alpha"], "c": f["c"], "L_inf": float(g["bayes"].mean()),
                     "rmse": float(np.sqrt(np.mean((np.log(g["excess"]) - np.log(pred)) ** 2))) if ok else np.nan,
                     "at_bound": False, "defined": ok and bool(np.isfinite(f["alpha"]))})
        f = fit_depth_law(g["depth"], g["val_loss"]) if len(g) >= MIN_POINTS["free floor"] else {}
        alpha = f.get("alpha", np.nan)
        rows.append({**base, "law": "free floor", "alpha": alpha, "c": f.get("c", np.nan),
                     "L_inf": f.get("L_inf", np.nan), "rmse": f.get("rmse", np.nan),
                     "at_bound": bool(f.get("at_bound", False)),
                     "defined": bool(np.isfinite(alpha)) and not f.get("at_bound", False)})
    return pd.DataFrame(rows)


def alpha_table(run: results.Run) -> pd.DataFrame:
    """family, law, value, lo, hi, n_seeds, defined (every replicate gave a fit inside its range), depths."""
    members = run.table("members")
    fits = fit_laws(members)
    rows = []
    for (family, law), g in fits.groupby(["family", "law"], sort=False):
        ok = g[g["defined"]]
        m, lo, hi, n = mean_interval(ok["alpha"])
        rows.append({"family": family, "law": law, "value": m, "lo": lo, "hi": hi, "n_seeds": n,
                     "defined": bool(len(ok) == len(g) and n >= 2),
                     "depths": ", ".join(map(str, sorted(members.loc[members["family"] == family, "depth"].unique())))})
    return pd.DataFrame(rows)


def loss_table(run: results.Run) -> pd.DataFrame:
    """Per family and depth: held-out loss and excess over the Bayes loss (mean over replicates, 95 % t interval),
    parameters, relative improvement over the last 20 % of training (max over replicates), converged (all)."""
    m = run.table("members")
    rows = []
    for (family, depth), g in m.groupby(["family", "depth"]):
        v, vlo, vhi, n = mean_interval(g["val_loss"])
        e, elo, ehi, _ = mean_interval(g["excess"])
        rows.append({"family": family, "depth": int(depth), "val_loss": v, "val_lo": vlo, "val_hi": vhi,
                     "excess": e, "excess_lo": elo, "excess_hi": ehi, "n_seeds": n, "n_params": int(g["n_params"].iloc[0]),
                     "n_blocks": int(g["n_blocks"].iloc[0]), "bayes": float(g["bayes"].mean()),
                     "rel_improvement_max": float(g["rel_improvement"].max()),
                     "rel_improvement_excess_max": float(g["rel_improvement_excess"].max()),
                     "converged": bool(g["converged"].all())})
    return pd.DataFrame(rows)


DIAGNOSTICS = ("theta_middle_mean", "theta_dh_mean", "long_lag_cos", "cluster_evenly", "delete_middle_delta",
               "delete_middle_max", "delete_first_delta", "swap_delta", "permute_delta", "probe_excess",
               "delete_vs_ensemble")


def delete_vs_ensemble(members: pd.DataFrame) -> pd.Series:
    """Per member, the loss added by deleting one middle block application over what an ensemble would lose.

    If the excess falls as E(ℓ) ∝ 1/ℓ (ensemble averaging, paper §3), removing one of ℓ similar members turns E(ℓ)
    into about E(ℓ − 1) = E(ℓ)·ℓ/(ℓ − 1), a rise of E(ℓ)/(ℓ − 1). The ratio Δloss·(ℓ − 1)/E(ℓ) (E the member's own
    excess on the probe set) is therefore ≈ 1 for an ensemble (≈ α for E ∝ ℓ^−α) and ≫ 1 when one application
    cannot be spared — an assembly line. NaN where ℓ < 3 (no middle application)."""
    return members["delete_middle_delta"] * (members["depth"] - 1) / members["probe_excess"]


def diagnostic_table(run: results.Run) -> pd.DataFrame:
    """Per family and depth, each diagnostic (:mod:`depthlib.compose.diagnostics`) and :func:`delete_vs_ensemble`
    as mean, lo, hi over replicates."""
    m = run.table("members")
    m = m.assign(delete_vs_ensemble=delete_vs_ensemble(m))
    rows = []
    for (family, depth), g in m.groupby(["family", "depth"]):
        row = {"family": family, "depth": int(depth)}
        for col in DIAGNOSTICS:
            if col in g:
                row[col], row[f"{col}_lo"], row[f"{col}_hi"], _ = mean_interval(g[col])
        rows.append(row)
    return pd.DataFrame(rows)


def _replicate_means(t: pd.DataFrame, keys: list[str], column: str, name: str) -> pd.DataFrame:
    """One row per ``keys`` (family, depth and one more integer key): ``name`` = the mean of ``column`` over
    replicates, with its 95 % t interval (lo, hi)."""
    rows = []
    for values, g in t.groupby(keys):
        m, lo, hi, _ = mean_interval(g[column])
        rows.append({**{k: (v if k == "family" else int(v)) for k, v in zip(keys, values)}, name: m, "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


def layer_profiles(run: results.Run, metric: str = "theta") -> pd.DataFrame:
    """family, depth, layer, mean (over replicates of the per-block means), lo, hi."""
    t = run.table("layers")
    return _replicate_means(t[t["metric"] == metric], ["family", "depth", "layer"], "mean", "mean")


def lag_profiles(run: results.Run) -> pd.DataFrame:
    """family, depth, k, cos (mean over replicates), lo, hi."""
    return _replicate_means(run.table("lags"), ["family", "depth", "k"], "cos", "cos")


def edit_profiles(run: results.Run, edit: str = "delete") -> pd.DataFrame:
    """family, depth, position, delta (Δloss, nats/token; mean over replicates), lo, hi, for one kind of edit."""
    t = run.table("edits")
    return _replicate_means(t[t["edit"] == edit], ["family", "depth", "position"], "delta", "delta")


def local_slopes(run: results.Run) -> pd.DataFrame:
    """family, from, to, slope, lo, hi: −Δlog E / Δlog ℓ of the excess loss between consecutive depths, per replicate,
    then mean and 95 % t interval over replicates (where a threshold lies, the slope peaks)."""
    m = run.table("members").sort_values("depth")
    rows = []
    for family, g in m.groupby("family", sort=False):
        depths = sorted(g["depth"].unique())
        for a, b in zip(depths[:-1], depths[1:]):
            ea = g[g["depth"] == a].set_index("seed")["excess"]
            eb = g[g["depth"] == b].set_index("seed")["excess"]
            s = -(np.log(eb) - np.log(ea.reindex(eb.index))) / np.log(b / a)
            v, lo, hi, n = mean_interval(s)
            rows.append({"family": family, "from": int(a), "to": int(b), "slope": v, "lo": lo, "hi": hi, "n_seeds": n})
    return pd.DataFrame(rows)


def curves(run: results.Run) -> pd.DataFrame:
    """The held-out curves, mean over replicates: family, depth, step, val_loss, excess."""
    c = run.table("curves")
    return c.groupby(["family", "depth", "step"], as_index=False)[["val_loss", "excess"]].mean()


__all__ = ["DIAGNOSTICS", "FAMILY_LABELS", "MIN_POINTS", "alpha_table", "curves", "delete_vs_ensemble", "diagnostic_table",
           "edit_profiles", "fit_laws", "lag_profiles", "layer_profiles", "local_slopes", "loss_table", "mean_interval"]

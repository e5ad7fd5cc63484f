"""Analysis of toy sweeps: α_ℓ fits and hidden-state signatures (paper §4, App. C).

* α_ℓ: least-squares fit of log(test loss) against log(depth), L = c·ℓ^(−α_ℓ), per replicate (no offset:
  the teacher is realisable). Replicates are then averaged; the interval is a t-interval over replicates,
  or with one replicate the fit's own t-interval with n_depths − 2 degrees of freedom (with 4 depths:
  t₀.₉₇₅ = 4.30, not 1.96). That one measures the departure from a power law, not seed variation; the
  ``interval`` column says which it is.
* α_ℓ against training step (Fig. 4a,b): the same fit at every evaluation step.
* Signatures of a trained network's residual stream h_0..h_ℓ (the LLM probes' quantities, paper §2):
  per-layer step angle θ(h_l, h_{l+1}), step size ‖Δh_l‖/‖h_l‖, and the angle between successive
  updates θ(Δh_l, Δh_{l+1}) (≈ π/2: ensemble averaging; ≈ 0: smooth, procedural dynamics).
* The long-lag signature cos(Δh_l, Δh_{l+k}) for k up to the middle's length: a shared drift keeps
  it positive at large k even when neighbouring updates look nearly orthogonal; an ensemble gives ≈ 0.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from depthlib.errors import InputError
from depthlib.measures import angle_between, fit_power_law, middle_blocks, middle_update_pairs

CELL = ["rho", "temperature"]


def alpha_per_replicate(df: pd.DataFrame, depths: Iterable[int] | None = None,
                        by: Sequence[str] = ("rho", "temperature", "replicate", "step")) -> pd.DataFrame:
    """α_ℓ per (cell, replicate[, step]) from a tidy table with columns depth, test_loss and ``by``."""
    by = [c for c in by if c in df.columns]
    if depths is not None:
        df = df[df["depth"].isin(list(depths))]
    rows = []
    for key, g in df.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), **fit_power_law(g["depth"], g["test_loss"])})
    return pd.DataFrame(rows)


def summarize_alpha(per_rep: pd.DataFrame, by: Sequence[str] = ("rho", "temperature", "step")) -> pd.DataFrame:
    """Mean α_ℓ over replicates with a 95 % interval (t over replicates; fit SE if only one replicate)."""
    from scipy import stats
    by = [c for c in by if c in per_rep.columns]
    rows = []
    for key, g in per_rep.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        a = g["alpha"].to_numpy(float)
        n = len(a)
        mean = float(np.mean(a))
        if n > 1:
            half = float(stats.t.ppf(0.975, n - 1) * np.std(a, ddof=1) / math.sqrt(n))
            kind = f"t95 over {n} replicates"
        else:
            df = int(g["n"].iloc[0]) - 2
            half = float(stats.t.ppf(0.975, df) * g["alpha_se"].iloc[0]) if df >= 1 else float("nan")
            kind = f"t95 of the fit, {df} df (1 replicate: power-law misfit, not seed spread)"
        rows.append({**dict(zip(by, key)), "alpha": mean, "lo": mean - half, "hi": mean + half,
                     "n_replicates": n, "interval": kind})
    return pd.DataFrame(rows)


def alpha_table(curves: pd.DataFrame, depths: Iterable[int] | None = None,
                step_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """α_ℓ (mean and interval over replicates) per cell and evaluation step, optionally on chosen depths
    and a step range. Used by the notebook's live panel and the CLI."""
    if curves.empty:
        raise InputError("no toy results to fit")
    if step_range is not None:
        curves = curves[(curves["step"] >= step_range[0]) & (curves["step"] <= step_range[1])]
    if depths is not None and len(set(depths) & set(curves["depth"])) < 2:
        raise InputError(f"need at least two of the trained depths {sorted(set(curves['depth']))} to fit α_ℓ")
    return summarize_alpha(alpha_per_replicate(curves, depths))


def final_alpha(curves: pd.DataFrame, depths: Iterable[int] | None = None) -> pd.DataFrame:
    """α_ℓ at the last evaluation step, one row per (ρ, T)."""
    last = curves[curves["step"] == curves["step"].max()]
    return alpha_table(last, depths).drop(columns="step")


# ---- hidden-state signatures ---------------------------------------------------------------------------
def signatures(states: torch.Tensor) -> pd.DataFrame:
    """Per-layer signatures of a residual stream ``states`` (ℓ+1, B, d), averaged over the B inputs.

    Columns: layer l (0-based block index), theta_step = θ(h_l, h_{l+1}), step_norm = ‖Δh_l‖,
    rel_step = ‖Δh_l‖/‖h_l‖, theta_update = θ(Δh_l, Δh_{l+1}) (NaN for the last block).
    """
    h = states.double()
    dh = h[1:] - h[:-1]                                                   # (ℓ, B, d)
    theta_step = angle_between(h[:-1], h[1:]).mean(-1)
    step_norm = dh.norm(dim=-1).mean(-1)
    rel = (dh.norm(dim=-1) / h[:-1].norm(dim=-1)).mean(-1)
    upd = torch.full_like(step_norm, float("nan"))
    if dh.shape[0] > 1:
        upd[:-1] = angle_between(dh[:-1], dh[1:]).mean(-1)
    return pd.DataFrame({"layer": np.arange(dh.shape[0]), "theta_step": theta_step.numpy(),
                         "step_norm": step_norm.numpy(), "rel_step": rel.numpy(), "theta_update": upd.numpy()})


def middle(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the middle layers: every block but the first and the last (paper §2.7 item 3); networks of
    one or two blocks keep all their blocks."""
    keys = [c for c in ("net", "rho", "temperature", "depth", "replicate") if c in df.columns]
    n = df.groupby(keys, dropna=False)["layer"].transform("max") + 1
    inner = (df["layer"] >= 1) & (df["layer"] <= n - 2)
    return df[inner | (n <= 2)]


def lag_cosines(states: torch.Tensor) -> pd.DataFrame:
    """Mean cos(Δh_l, Δh_{l+k}) over the inputs and over every pair of middle blocks k apart
    (:func:`depthlib.measures.middle_blocks`), for k = 1 .. (number of middle blocks − 1).
    ``states`` (ℓ+1, B, d); returns columns lag, cos (empty for networks with fewer than two middle blocks)."""
    dh = (states[1:] - states[:-1]).double()                                 # (ℓ, B, d)
    u = dh / dh.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    mid = middle_blocks(dh.shape[0])
    u = u[mid]                                                                # (n_mid, B, d)
    gram = torch.einsum("lbd,mbd->lm", u, u) / u.shape[1]                     # (n_mid, n_mid) mean cos
    lags = range(1, u.shape[0])
    return pd.DataFrame({"lag": list(lags), "cos": [float(torch.diagonal(gram, k).mean()) for k in lags]})


def long_lag(lag: pd.DataFrame, depth_col: str = "depth") -> pd.DataFrame:
    """Per network: the mean of cos(Δh_l, Δh_{l+k}) over the long lags k ≥ ℓ/4 (ℓ = its number of blocks)."""
    keys = [c for c in ("net", "rho", "temperature", "depth", "replicate") if c in lag.columns]
    far = lag[lag["lag"] >= np.ceil(lag[depth_col] / 4)]
    return far.groupby(keys, as_index=False, dropna=False)["cos"].mean().rename(columns={"cos": "long_lag_cos"})


def signature_summary(sig: pd.DataFrame, lag: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per network: mean middle-layer θ(h_l,h_{l+1}), ‖Δh‖ and θ(Δh_l,Δh_{l+1}) over the same middle blocks
    (no update pair with the first or last block: :func:`depthlib.measures.middle_update_pairs`); the log–log
    slope of the middle-layer step angle against depth per cell (−1 means step ∝ 1/ℓ); and, given the
    ``lag_cos`` table, the long-lag cosine (:func:`long_lag`)."""
    keys = [c for c in ("net", "rho", "temperature", "depth", "replicate") if c in sig.columns]
    mid = middle(sig)
    out = mid.groupby(keys, as_index=False, dropna=False)[["theta_step", "step_norm", "rel_step"]].mean()
    n = sig.groupby(keys, dropna=False)["layer"].transform("max") + 1
    pairs = [middle_update_pairs(int(k)) for k in n]
    in_pairs = np.array([p.start <= l < p.stop for p, l in zip(pairs, sig["layer"])], dtype=bool)
    upd = sig[in_pairs].groupby(keys, as_index=False, dropna=False)["theta_update"].mean()
    out = out.merge(upd, on=keys, how="left")
    slopes = []
    cell = [c for c in ("net", "rho", "temperature", "replicate") if c in out.columns]
    for key, g in out.groupby(cell, dropna=False):
        fit = fit_power_law(g["depth"], g["theta_step"])
        slopes.append({**dict(zip(cell, key if isinstance(key, tuple) else (key,))),
                       "step_angle_slope": -fit["alpha"]})
    out = out.merge(pd.DataFrame(slopes), on=cell, how="left")
    if lag is not None:
        out = out.merge(long_lag(lag), on=keys, how="left")
    return out


def describe_regimes(summary: pd.DataFrame) -> list[str]:
    """One sentence per teacher correlation ρ: the trained students' middle-layer update angle
    θ(Δh_l, Δh_{l+1}), their long-lag cosine (both averaged over temperatures and depths) and the slope of the
    middle-layer step angle against depth, read against the two reference regimes (paper §1 and §2.7).
    Nearly orthogonal neighbours alone do not make an ensemble: a shared drift shows as a long-lag cosine
    well above 0, so "ensemble averaging" needs θ(Δh) > 1.2 rad *and* a long-lag cosine < 0.1."""
    stu = summary[summary["net"] == "student"]
    lines = []
    for rho, g in stu.groupby("rho"):
        upd = float(g["theta_update"].mean())
        far = float(g["long_lag_cos"].mean()) if "long_lag_cos" in g else float("nan")
        slope = float(g["step_angle_slope"].mean())
        drift = not np.isnan(far) and far >= 0.1
        regime = ("smooth, procedural dynamics (successive updates aligned)" if upd < 0.4 else
                  "a shared drift under nearly orthogonal neighbouring updates" if upd > 1.2 and drift else
                  "ensemble averaging (updates nearly orthogonal at every lag, as in the LLMs)" if upd > 1.2 else
                  "in between the two reference regimes")
        lag_text = f", long-lag cos = {far:.2f}" if not np.isnan(far) else ""
        lines.append(f"ρ = {rho:g}: θ(Δh_l, Δh_l+1) = {upd:.2f} rad (π/2 = 1.57){lag_text}, middle-layer step "
                     f"angle ∝ ℓ^{slope:.2f} (LLMs: ≈ ℓ^-1) → {regime}.")
    return lines

"""Analysis of toy sweeps: α_ℓ fits and hidden-state signatures (paper §4, spec §4.8 and §2.4).

* α_ℓ: least-squares fit of log(test loss) against log(depth), L = c·ℓ^(−α_ℓ), per replicate (no offset:
  the teacher is realisable). Replicates are then averaged; the interval is a t-interval over replicates,
  or with one replicate the fit's own ±1.96·SE (labelled as such in the ``interval`` column).
* α_ℓ against training step (Fig. 4a,b): the same fit at every evaluation step.
* Signatures of a trained network's residual stream h_0..h_ℓ (the LLM probes' quantities, paper §2):
  per-layer step angle θ(h_l, h_{l+1}), step size ‖Δh_l‖/‖h_l‖, and the angle between successive
  updates θ(Δh_l, Δh_{l+1}) (≈ π/2: ensemble averaging; ≈ 0: smooth, procedural dynamics).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from depthlib.errors import InputError
from depthlib.measures import angle_between, fit_power_law

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
            half = float(1.96 * g["alpha_se"].iloc[0])
            kind = "±1.96 SE of the fit (1 replicate)"
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


def signature_summary(sig: pd.DataFrame) -> pd.DataFrame:
    """Per network: mean middle-layer θ(h_l,h_{l+1}), ‖Δh‖, and θ(Δh_l,Δh_{l+1}); plus the log–log slope of
    the middle-layer step angle against depth per cell (−1 means step ∝ 1/ℓ)."""
    keys = [c for c in ("net", "rho", "temperature", "depth", "replicate") if c in sig.columns]
    mid = middle(sig)
    out = mid.groupby(keys, as_index=False, dropna=False)[["theta_step", "step_norm", "rel_step", "theta_update"]].mean()
    slopes = []
    cell = [c for c in ("net", "rho", "temperature", "replicate") if c in out.columns]
    for key, g in out.groupby(cell, dropna=False):
        fit = fit_power_law(g["depth"], g["theta_step"])
        slopes.append({**dict(zip(cell, key if isinstance(key, tuple) else (key,))),
                       "step_angle_slope": -fit["alpha"]})
    return out.merge(pd.DataFrame(slopes), on=cell, how="left")


def describe_regimes(summary: pd.DataFrame) -> list[str]:
    """One sentence per teacher correlation ρ: the trained students' middle-layer update angle
    θ(Δh_l, Δh_{l+1}) (averaged over temperatures and depths) and the slope of the middle-layer step angle
    against depth, read against the two reference regimes (paper §1 and §2.7)."""
    stu = summary[summary["net"] == "student"]
    lines = []
    for rho, g in stu.groupby("rho"):
        upd = float(g["theta_update"].mean())
        slope = float(g["step_angle_slope"].mean())
        regime = ("ensemble averaging (updates nearly orthogonal, as in the LLMs)" if upd > 1.2 else
                   "smooth, procedural dynamics (successive updates aligned)" if upd < 0.4 else
                   "in between the two reference regimes")
        lines.append(f"ρ = {rho:g}: θ(Δh_l, Δh_l+1) = {upd:.2f} rad (π/2 = 1.57), middle-layer step angle ∝ "
                     f"ℓ^{slope:.2f} (LLMs: ≈ ℓ^-1) → {regime}.")
    return lines

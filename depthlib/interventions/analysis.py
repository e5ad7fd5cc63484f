"""Chapter 5's summaries of an intervention run: the effect of every plan, deletion curves, and the ensemble fit.

Everything here reads the run's tables (``scores``: per plan and document, sums over predicted tokens), so a
figure is redrawn from a committed run without recomputing. Per-token means pool the tokens of all documents.
The deletion curve's fit is the ensemble prediction (paper §3: L(ℓ) = L∞ + c/ℓ^α, so removing k of ℓ similar
blocks costs ΔL(k) = c[(ℓ − k)^−α − ℓ^−α]); its interval is a bootstrap over documents.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from depthlib.finite import pool

ALPHA_MIN, ALPHA_MAX = 0.05, 8.0   # the range α is searched in; a fit at its edge means the form does not fit


def baseline_loss(scores: pd.DataFrame, identity_text: str) -> float:
    """Mean loss per predicted token of the unedited model (nats)."""
    s = scores[scores["plan"] == identity_text]
    return float(s["loss"].sum(skipna=False) / s["n"].sum())


def _identity_text(meta: pd.DataFrame) -> str:
    return meta.loc[meta["family"] == "identity", "plan"].iloc[0]


def plan_effects(meta: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """One row per plan and rule (``meta``'s rows) with: loss (nats/token), delta_loss (vs the unedited model),
    kl (KL(unedited ‖ edited), nats/token), agree (fraction of tokens whose top-1 prediction is unchanged).

    A plan whose edited pass was not finite on some document (scores NaN: it overflowed) gets NaN for all four,
    with a warning naming it: its documents are never pooled away."""
    if "model" not in meta:
        meta, scores = meta.assign(model=""), scores.assign(model="")
    pooled = pool(scores, ["model", "plan"], ["loss", "kl", "agree", "n"])
    broken = pooled[pooled["loss"].isna() | pooled["kl"].isna()].reset_index()
    if len(broken):
        names = ", ".join(f"{r.plan}" + (f" ({r.model})" if r.model else "") for r in broken.itertuples())
        warnings.warn(f"{len(broken)} plan(s) gave non-finite log-probabilities (the edited fp32 pass overflowed) "
                      f"on some documents: {names}; their loss, delta_loss, kl and agreement are null",
                      stacklevel=2)
    per = pooled[["loss", "kl", "agree"]].div(pooled["n"], axis=0).reset_index()
    base = {m: per.loc[(per["model"] == m) & (per["plan"] == _identity_text(g)), "loss"].iloc[0]
            for m, g in meta.groupby("model")}
    per["delta_loss"] = per["loss"] - per["model"].map(base)
    return meta.merge(per, on=["model", "plan"], how="left")


def deletion_curves(effects: pd.DataFrame) -> pd.DataFrame:
    """Δloss and KL against k for every deletion rule (with and without rescaling): mean, min and max over the
    random draws (one value for the deterministic rules)."""
    d = effects[(effects["family"] == "delete") & (effects["rule"] != "each")]
    return (d.groupby(["model", "rule", "rescale", "k"])
             .agg(delta_loss=("delta_loss", "mean"), delta_loss_min=("delta_loss", "min"),
                  delta_loss_max=("delta_loss", "max"), kl=("kl", "mean"), kl_min=("kl", "min"), kl_max=("kl", "max"),
                  draws=("delta_loss", "size")).reset_index())


def _fit_alpha(k: np.ndarray, dl: np.ndarray, n_blocks: int) -> tuple[float, float]:
    """Least-squares (α, c) of ΔL(k) = c[(ℓ − k)^−α − ℓ^−α]; c has a closed form for each α."""
    def basis(a):
        return (n_blocks - k) ** -a - float(n_blocks) ** -a

    def sse(a):
        b = basis(a)
        c = float(b @ dl / (b @ b))
        return float(((dl - c * b) ** 2).sum())
    grid = np.linspace(ALPHA_MIN, ALPHA_MAX, 160)
    a0 = grid[int(np.argmin([sse(a) for a in grid]))]
    res = minimize_scalar(sse, bounds=(max(ALPHA_MIN, a0 - 0.05), min(ALPHA_MAX, a0 + 0.05)), method="bounded")
    a = float(res.x)
    b = basis(a)
    return a, float(b @ dl / (b @ b))


def ensemble_fit(meta: pd.DataFrame, scores: pd.DataFrame, n_blocks: int, *, rule: str = "random",
                 rescale: bool = False, model: str | None = None, n_boot: int = 500, seed: int = 0) -> dict:
    """Fit ΔL(k) = c[(ℓ − k)^−α − ℓ^−α] to the mean deletion curve of ``rule`` (ℓ = ``n_blocks``).

    Returns α, c, the 95 % bootstrap interval of α (documents resampled with replacement; the draws and ks fixed),
    and the points fitted. Needs at least three values of k.
    """
    if model is not None:
        meta, scores = meta[meta["model"] == model], scores[scores["model"] == model]
    rows = meta[(meta["family"] == "delete") & (meta["rule"] == rule) & (meta["rescale"] == rescale)]
    ident = _identity_text(meta)
    wide = scores.pivot_table(index="plan", columns="doc_index", values=["loss", "n"], aggfunc="sum")
    loss, n = wide["loss"], wide["n"].loc[ident]
    ks = np.array(sorted(rows["k"].unique()), dtype=float)
    if len(ks) < 3:
        return dict(alpha=np.nan, c=np.nan, alpha_lo=np.nan, alpha_hi=np.nan, ks=ks.tolist(), delta=[])
    plans_by_k = [rows.loc[rows["k"] == k, "plan"].tolist() for k in ks]

    def curve(w: np.ndarray) -> np.ndarray:                  # w: weight of each document (bootstrap counts)
        tokens = float((n.to_numpy() * w).sum())
        base = float((loss.loc[ident].to_numpy() * w).sum()) / tokens
        return np.array([np.mean([(loss.loc[p].to_numpy() * w).sum() / tokens - base for p in ps]) for ps in plans_by_k])
    dl = curve(np.ones(len(n)))
    alpha, c = _fit_alpha(ks, dl, n_blocks)
    resid = dl - c * ((n_blocks - ks) ** -alpha - float(n_blocks) ** -alpha)
    r2 = 1 - float((resid ** 2).sum() / max(((dl - dl.mean()) ** 2).sum(), 1e-300))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        w = np.bincount(rng.integers(0, len(n), len(n)), minlength=len(n)).astype(float)
        boots.append(_fit_alpha(ks, curve(w), n_blocks)[0])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return dict(alpha=alpha, c=c, alpha_lo=float(lo), alpha_hi=float(hi), ks=ks.tolist(), delta=dl.tolist(),
                n_boot=n_boot, rule=rule, rescale=rescale, n_blocks=n_blocks, r2=r2,
                at_bound=bool(alpha >= ALPHA_MAX - 0.01 or alpha <= ALPHA_MIN + 0.01))


def n_blocks_of(meta: pd.DataFrame) -> int:
    """ℓ of the model a plan table belongs to (its identity plan runs every block once)."""
    from depthlib.interventions.plan import parse_plan
    text = _identity_text(meta)
    last = max(int(part.split("-")[-1]) for part in text.split(","))
    return len(parse_plan(text, last + 1).steps)


def ensemble_fits(meta: pd.DataFrame, scores: pd.DataFrame, *, rescale: bool = False, n_boot: int = 500) -> dict[str, dict]:
    """{model: :func:`ensemble_fit` of its random-middle deletion curve} for every model in the tables."""
    out = {}
    for model, m in meta.groupby("model", sort=False):
        out[model] = ensemble_fit(m, scores[scores["model"] == model], n_blocks_of(m), rescale=rescale, n_boot=n_boot)
    return out


CALIBRATION = [  # (label, family, rule, k, rescale, how the rows are reduced)
    ("delete 1 middle block", "delete", "random", 1, False, "mean"),
    ("delete 4 middle blocks", "delete", "random", 4, False, "mean"),
    ("delete 4, rescaled", "delete", "random", 4, True, "mean"),
    ("one adjacent swap", "order", "swap", 2, False, "mean"),
    ("random permutation (median)", "order", "permutation", None, False, "median"),
    ("middle reversed", "order", "reverse", None, False, "mean"),
    ("4 in parallel, summed", "parallel", "sum", 4, False, "mean"),
    ("4 in parallel, averaged", "parallel", "mean", 4, False, "mean"),
]


def calibration_table(effects: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, intervention): Δloss and ΔL/L₀ (L₀ the unedited loss), the same edits on every model
    so the LMs and the toy students can be compared on one scale."""
    rows = []
    for model, e in effects.groupby("model", sort=False):
        base = float(e.loc[e["family"] == "identity", "loss"].iloc[0])
        for label, family, rule, k, rescale, how in CALIBRATION:
            sel = e[(e["family"] == family) & (e["rule"] == rule) & (e["rescale"] == rescale)]
            if k is not None:
                sel = sel[sel["k"] == k]
            if sel.empty:
                continue
            delta = float(getattr(sel["delta_loss"], how)())
            rows.append(dict(model=model, intervention=label, delta_loss=delta, baseline=base, relative=delta / base,
                             plans=len(sel)))
    return pd.DataFrame(rows)


def findings(effects: pd.DataFrame, fits: dict[str, dict]) -> list[str]:
    """One sentence per model and prediction, with the run's own numbers (no verdict beyond what they show)."""
    out = []
    for model, e in effects.groupby("model", sort=False):
        base = float(e.loc[e["family"] == "identity", "loss"].iloc[0])
        each = e[e["rule"] == "each"].sort_values("start")
        if len(each) > 2:
            mid = each.iloc[1:-1]["delta_loss"]
            out.append(f"**{model}** (ℓ = {len(each)}, unedited loss {base:.3g}): deleting one middle block costs "
                       f"{mid.median():.3g} (median; range {mid.min():.3g} to {mid.max():.3g}); the first block "
                       f"{each.iloc[0]['delta_loss']:.3g}, the last {each.iloc[-1]['delta_loss']:.3g}.")
        rnd = e[(e["rule"] == "random") & (~e["rescale"])].groupby("k")["delta_loss"].mean()
        f = fits.get(model, {})
        if len(rnd) and np.isfinite(f.get("alpha", np.nan)):
            edge = (f" — at the edge of the searched range {ALPHA_MIN:g}–{ALPHA_MAX:g}, so the form does not describe "
                    "this curve") if f["at_bound"] else ""
            out.append(f"Random middle deletions cost {', '.join(f'{v:.3g} (k = {k})' for k, v in rnd.items())}; "
                       f"the ensemble form c[(ℓ−k)^−α − ℓ^−α] fitted to them gives α = {f['alpha']:.2f} "
                       f"(95 % bootstrap over documents: {f['alpha_lo']:.2f} to {f['alpha_hi']:.2f}; "
                       f"R² = {f['r2']:.3f}){edge}.")
        perm = e[e["rule"] == "permutation"]["delta_loss"]
        swap = e[e["rule"] == "swap"]["delta_loss"]
        rev = e[e["rule"] == "reverse"]["delta_loss"]
        if len(perm):
            out.append(f"Order: one adjacent swap costs {swap.mean():.3g} on average (max {swap.max():.3g}); a random "
                       f"permutation of the middle {perm.median():.3g} (median of {len(perm)}; {perm.min():.3g} to "
                       f"{perm.max():.3g}); reversing it {rev.mean():.3g}.")
        par = e[e["family"] == "parallel"]
        if len(par):
            parts = []
            for g in sorted(par["k"].unique()):
                s = par[(par["k"] == g) & (par["rule"] == "sum")]["delta_loss"]
                m = par[(par["k"] == g) & (par["rule"] == "mean")]["delta_loss"]
                parts.append(f"g = {g}: {s.mean():.3g} summed vs {m.mean():.3g} averaged")
            out.append("Parallel groups (mean over positions): " + "; ".join(parts) + ".")
        r = signature_ratios(e)
        if r:
            out.append("Signature ratios (an ensemble predicts all three ≲ 1): "
                       + "; ".join(f"{k} = {v:.3g}" for k, v in r.items()) + ".")
    return out


def signature_ratios(effects: pd.DataFrame) -> dict[str, float]:
    """Unit-free ratios of one model's loss changes, comparable across LMs and toy students: a random permutation
    of the middle (median) and one adjacent swap (mean), each over deleting one random middle block; and 4 blocks in
    parallel with summed updates over the same groups averaged. Small when order does not matter and updates add."""
    def mean(family, rule, k=None, how="mean"):
        sel = effects[(effects["family"] == family) & (effects["rule"] == rule) & (~effects["rescale"])]
        sel = sel if k is None else sel[sel["k"] == k]
        return float(getattr(sel["delta_loss"], how)()) if len(sel) else np.nan
    one = mean("delete", "random", 1)
    out = {"permutation / one deletion": mean("order", "permutation", how="median") / one,
           "adjacent swap / one deletion": mean("order", "swap") / one,
           "4 parallel summed / averaged": mean("parallel", "sum", 4) / mean("parallel", "mean", 4)}
    return {k: v for k, v in out.items() if np.isfinite(v)}

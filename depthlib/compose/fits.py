"""The depth fits of chapter 7's hierarchy control, and the checks a fit must pass before the chapter shows it.

The paper's depth law L = L∞ + c·ℓ^(−α_ℓ) (Liu et al., arXiv 2602.05970, §3) is read here on a quantity whose floor
is known, so that no floor is fitted: the next-leaf **excess** over the exact Bayes loss, the root cross-entropy (its
Bayes value is 0) and the root error 1 − accuracy (:func:`quantities`). Its exponent is only a result if it does not
rest on one depth, so every fit comes with these checks:

* :func:`exponents` — α_ℓ of E = c·ℓ^(−α) (log–log least squares, :func:`depthlib.measures.fit_power_law`) per
  replicate, then the mean with a 95 % t interval over replicates (:func:`depthlib.compose.analysis.mean_interval`):
  on every depth (at least four, the grammar part's rule :data:`depthlib.compose.analysis.MIN_POINTS`), without
  ℓ = 1, and without each depth in turn (the drop-one range; such a fit keeps one residual degree of freedom, so three
  depths are enough for it);
* :func:`stability` — one row per (quantity, family): the all-depths fit is **shown** only when every replicate has
  it and no single depth left out moves the mean outside the all-depths interval (else ``why_not`` says which);
* :func:`local_slopes` — −Δlog E/Δlog ℓ between neighbouring depths, mean and t interval over replicates
  (:func:`depthlib.compose.analysis.local_slopes`, the grammar part's own);
* :func:`slope_change` — a threshold as a change in slope, not read by eye: a continuous two-segment line through
  (log ℓ, log E) with a free break ℓ_b (:func:`two_segment`), its slope change Δ = α_after − α_before with a percentile
  bootstrap over replicates (the break re-fitted in every resample) and a t interval over replicates with the break
  held at its estimate. Composition predicts a break near the grammar's depth L (E falls faster once ℓ ≥ L can
  hold one level per block, or stops falling once the tree is parsed): Δ's interval excludes 0 and ℓ_b's meets the
  stretch of the depth grid around L (:func:`near`);
* :func:`by_round`, :func:`round_fits` — the same fits after every round of continuations (each member's best stage
  so far), so that a run whose members are not certified still says whether more training moves its exponents.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib.compose import analysis
from depthlib.compose.analysis import MIN_POINTS, mean_interval
from depthlib.errors import InputError
from depthlib.measures import fit_power_law

#: quantity name -> (task, column of the members table): the fitted quantities, each > 0 with a known floor 0
QUANTITIES = {"leaf excess": ("leaf", "excess"), "root cross-entropy": ("root", "excess"),
              "root error": ("root", "error")}
#: break positions tried between the second and the second-to-last depth (log-spaced), besides the depths themselves
BREAK_GRID = 200
LEVEL = 0.95


def quantities(members: pd.DataFrame) -> pd.DataFrame:
    """The long table the fits read: quantity, family, depth, seed, value (one row per member and quantity)."""
    out = []
    for name, (task, column) in QUANTITIES.items():
        m = members[members["task"] == task]
        if m.empty:
            continue
        value = 1.0 - m["accuracy"] if column == "error" else m[column]
        out.append(pd.DataFrame({"quantity": name, "family": m["family"].to_numpy(), "depth": m["depth"].astype(int),
                                 "seed": m["seed"].astype(int), "value": value.astype(float).to_numpy()}))
    if not out:
        raise InputError("no members to fit")
    return pd.concat(out, ignore_index=True)


def _alpha(g: pd.DataFrame, keep: list[int], min_points: int) -> tuple[float, float, float, int, bool]:
    """Mean α over replicates on depths ``keep`` (lo, hi, replicates, defined: every replicate fitted on at least
    ``min_points`` positive points, and two replicates for an interval)."""
    per, ok = [], True
    for _, r in g[g["depth"].isin(keep)].groupby("seed"):
        good = r[r["value"] > 0]
        if len(good) < min_points or len(good) < len(r):
            ok = False
            continue
        per.append(fit_power_law(good["depth"], good["value"])["alpha"])
    m, lo, hi, n = mean_interval(per, LEVEL)
    return m, lo, hi, n, ok and n >= 2


def exponents(long: pd.DataFrame) -> pd.DataFrame:
    """quantity, family, fit (all depths | without ℓ = d), depths, n_depths, alpha, lo, hi, replicates, defined."""
    rows = []
    for (quantity, family), g in long.groupby(["quantity", "family"], sort=False):
        depths = sorted(int(d) for d in g["depth"].unique())
        for label, keep in [("all depths", depths)] + [(f"without ℓ = {d}", [x for x in depths if x != d])
                                                      for d in depths]:
            a, lo, hi, n, ok = _alpha(g, keep, MIN_POINTS["excess"] - (label != "all depths"))
            rows.append({"quantity": quantity, "family": family, "fit": label, "depths": ", ".join(map(str, keep)),
                         "n_depths": len(keep), "alpha": a, "lo": lo, "hi": hi, "replicates": n, "defined": ok})
    return pd.DataFrame(rows)


def stability(fits: pd.DataFrame) -> pd.DataFrame:
    """One row per (quantity, family) of :func:`exponents`: the all-depths α with its interval, α without ℓ = 1, the
    drop-one range (min, max over the depths left out) and whether the fit is ``shown``, with ``why_not``."""
    rows = []
    for (quantity, family), g in fits.groupby(["quantity", "family"], sort=False):
        full = g[g["fit"] == "all depths"].iloc[0]
        drops = g[g["fit"].str.startswith("without")]
        no1 = g[g["fit"] == "without ℓ = 1"]
        ok_drops = drops[drops["defined"]]
        outside = ok_drops[(ok_drops["alpha"] < full["lo"]) | (ok_drops["alpha"] > full["hi"])]
        if not full["defined"]:
            why = "not every replicate has a fit (too few depths, or a value ≤ 0)"
        elif len(ok_drops) < len(drops):
            why = f"{len(drops) - len(ok_drops)} drop-one fit(s) undefined"
        elif len(outside):
            why = "leaving out " + ", ".join(outside["fit"].str.removeprefix("without ")) + " moves α outside its interval"
        else:
            why = ""
        rows.append({"quantity": quantity, "family": family, "alpha": full["alpha"], "lo": full["lo"],
                     "hi": full["hi"], "replicates": int(full["replicates"]),
                     "alpha_without_1": float(no1["alpha"].iloc[0]) if len(no1) else np.nan,
                     "lo_without_1": float(no1["lo"].iloc[0]) if len(no1) else np.nan,
                     "hi_without_1": float(no1["hi"].iloc[0]) if len(no1) else np.nan,
                     "drop_one_min": float(ok_drops["alpha"].min()) if len(ok_drops) else np.nan,
                     "drop_one_max": float(ok_drops["alpha"].max()) if len(ok_drops) else np.nan,
                     "shown": not why, "why_not": why})
    return pd.DataFrame(rows)


class _Members:
    """The one table :func:`depthlib.compose.analysis.local_slopes` reads (``members``: family, depth, seed,
    excess), made from a quantity of the long table."""

    def __init__(self, members: pd.DataFrame):
        self._members = members

    def table(self, name: str) -> pd.DataFrame:
        return self._members


def local_slopes(long: pd.DataFrame) -> pd.DataFrame:
    """quantity, family, from, to, slope, lo, hi, n_seeds: −Δlog E/Δlog ℓ between neighbouring depths, mean and 95 %
    t interval over replicates."""
    out = []
    for quantity, g in long.groupby("quantity", sort=False):
        members = g[g["value"] > 0].rename(columns={"value": "excess"})
        if members.empty:
            continue
        out.append(analysis.local_slopes(_Members(members)).assign(quantity=quantity))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def two_segment(depths, values) -> dict:
    """The continuous two-segment least-squares line through (log ℓ, log E): log E = a − α_before·min(x − b, 0)
    − α_after·max(x − b, 0), the break b = log ℓ_b searched over the depths strictly inside the range and a log-spaced
    grid between the second and the second-to-last depth. Needs ≥ 4 distinct depths with E > 0."""
    x, y = np.log(np.asarray(depths, dtype=float)), np.log(np.asarray(values, dtype=float))
    order = np.argsort(x)
    x, y = x[order], y[order]
    if len(np.unique(x)) < 4 or len(x) != len(np.unique(x)) or not np.all(np.isfinite(y)):
        raise InputError("a two-segment fit needs at least 4 distinct depths with positive values")
    grid = np.union1d(np.linspace(x[1], x[-2], BREAK_GRID), x[1:-1])                # (G,)
    d = x[None, :] - grid[:, None]                                                     # (G, n)
    A = np.stack([np.ones_like(d), np.minimum(d, 0.0), np.maximum(d, 0.0)], -1)        # (G, n, 3)
    coef = np.linalg.solve(A.transpose(0, 2, 1) @ A, (A.transpose(0, 2, 1) @ y)[..., None])[..., 0]   # (G, 3)
    sse = ((y[None] - np.einsum("gnk,gk->gn", A, coef)) ** 2).sum(1)
    i = int(np.argmin(sse))
    sse, b, coef = float(sse[i]), grid[i], coef[i]
    line = np.polyfit(x, y, 1)
    return {"break": float(np.exp(b)), "alpha_before": float(-coef[1]), "alpha_after": float(-coef[2]),
            "change": float(coef[1] - coef[2]), "sse": sse,
            "sse_one_line": float(np.sum((y - np.polyval(line, x)) ** 2)), "alpha_one_line": float(-line[0])}


def _fixed_break_change(depths, values, brk: float) -> float:
    x, y = np.log(np.asarray(depths, dtype=float)), np.log(np.asarray(values, dtype=float))
    b = np.log(brk)
    A = np.column_stack([np.ones_like(x), np.minimum(x - b, 0.0), np.maximum(x - b, 0.0)])
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(coef[1] - coef[2])


def near(depths, L: int) -> tuple[float, float]:
    """The stretch of the depth grid around the grammar's depth ``L``: from the largest measured depth below L to the
    smallest above it (L's own neighbours when L is measured; an end of the grid where there is none), the finest
    that a break between measured depths can be placed."""
    d = np.asarray(sorted({float(x) for x in depths}))
    below, above = d[d < L], d[d > L]
    return (float(below.max()) if len(below) else float(d.min())), (float(above.min()) if len(above) else float(d.max()))


def slope_change(long: pd.DataFrame, L: int, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per (quantity, family) with ≥ 4 depths and ≥ 2 replicates, every value > 0: :func:`two_segment` on the mean
    over replicates of log E at each depth, and its intervals: a percentile bootstrap over replicates (resampled with
    replacement, break re-fitted; ``change_lo/hi``, ``break_lo/hi``) and a t interval over replicates of the change
    with the break held at its estimate (``change_t_lo/hi``). ``changes``: both intervals exclude 0; ``break_at_L``:
    the break's interval meets ``near_lo … near_hi``, the measured depths on either side of ``L`` (:func:`near`: the
    grid cannot place a break more finely); ``break_contains_L``: the interval contains ``L`` itself.
    the break's interval contains the grammar's depth ``L``."""
    rows = []
    for (quantity, family), g in long.groupby(["quantity", "family"], sort=False):
        wide = g.pivot_table(index="seed", columns="depth", values="value")
        if wide.shape[1] < 4 or wide.shape[0] < 2 or wide.isna().any().any() or not (wide.to_numpy() > 0).all():
            continue
        depths = wide.columns.to_numpy(int)
        logs = np.log(wide.to_numpy(float))                                  # (replicates, depths)
        point = two_segment(depths, np.exp(logs.mean(0)))
        rng = np.random.default_rng([seed, len(rows)])
        boot = [two_segment(depths, np.exp(logs[rng.integers(0, len(logs), len(logs))].mean(0)))
                for _ in range(n_boot)]
        change = np.array([b["change"] for b in boot])
        brk = np.array([b["break"] for b in boot])
        q = ((1 - LEVEL) / 2, (1 + LEVEL) / 2)
        per = [_fixed_break_change(depths, np.exp(r), point["break"]) for r in logs]
        near_lo, near_hi = near(depths, L)
        _, t_lo, t_hi, n = mean_interval(per, LEVEL)
        c_lo, c_hi = (float(v) for v in np.quantile(change, q))
        b_lo, b_hi = (float(v) for v in np.quantile(brk, q))
        rows.append({"quantity": quantity, "family": family, "L": int(L), **point, "break_lo": b_lo, "break_hi": b_hi,
                     "change_lo": c_lo, "change_hi": c_hi, "change_t_lo": t_lo, "change_t_hi": t_hi,
                     "replicates": n, "n_depths": len(depths), "n_boot": int(n_boot),
                     "changes": bool((c_lo > 0 or c_hi < 0) and (t_lo > 0 or t_hi < 0)),
                     "near_lo": near_lo, "near_hi": near_hi, "break_at_L": bool(b_lo <= near_hi and b_hi >= near_lo),
                     "break_contains_L": bool(b_lo <= L <= b_hi)})
    return pd.DataFrame(rows)


def _round(stage: str) -> int:
    """The round a stage belongs to: main 0, continuation ck k."""
    return 0 if stage == "main" else int(stage.removeprefix("c"))


def by_round(stages: pd.DataFrame) -> pd.DataFrame:
    """The long table of :func:`quantities` after every round of continuations: quantity, family, depth, seed, round,
    value, sequences. At round r each member is its best stage so far by its certified value (the stage a member
    would end on had it stopped there; a member that stopped earlier keeps its best); ``sequences`` is the training
    sequences the member's stages up to round r drew."""
    key = ["task", "family", "depth", "seed"]
    st = stages.assign(round=stages["stage"].map(_round))
    last = int(st["round"].max())
    rows = []
    for (task, family, depth, seed), g in st.groupby(key, sort=False):
        g = g.sort_values("round")
        best, drawn = None, 0
        for r in range(last + 1):
            here = g[g["round"] == r]
            if len(here):
                row = here.iloc[0]
                drawn += int(row["sample_stop"] - row["sample_start"])
                if best is None or row["value"] < best["value"]:
                    best = row
            values = ({"leaf excess": best["excess"]} if task == "leaf" else
                      {"root cross-entropy": best["excess"], "root error": best["error"]})
            rows += [{"quantity": q, "family": family, "depth": int(depth), "seed": int(seed), "round": r,
                      "value": float(v), "sequences": drawn} for q, v in values.items()]
    return pd.DataFrame(rows)


def round_fits(rounds: pd.DataFrame, L: int, n_boot: int = 1000) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`stability` and :func:`slope_change` on the table of :func:`by_round` at every round (column ``round``,
    and ``sequences``: the most training sequences a member had drawn by then): whether more training still moves the
    exponents and the change in slope, whatever the certificate says."""
    stab, brk = [], []
    for r, g in rounds.groupby("round", sort=True):
        seqs = g.groupby("quantity")["sequences"].max()
        long = g.drop(columns=["round", "sequences"])
        s = stability(exponents(long))
        stab.append(s.assign(round=int(r), sequences=s["quantity"].map(seqs).astype(int)))
        b = slope_change(long, L, n_boot)
        if len(b):
            brk.append(b.assign(round=int(r), sequences=b["quantity"].map(seqs).astype(int)))
    return (pd.concat(stab, ignore_index=True),
            pd.concat(brk, ignore_index=True) if brk else pd.DataFrame(columns=["quantity", "family", "round"]))


__all__ = ["BREAK_GRID", "QUANTITIES", "by_round", "exponents", "local_slopes", "near", "quantities",
           "round_fits", "slope_change", "stability", "two_segment"]

"""Chapter 7's looped toy students under chapter 3's certified protocol, read for the notebook: their tables, the
section's answer, its limits and its conclusion.

Everything here is read from two finished runs: ``run``, the certified looped students (experiment
``compose-toy-certified``, :mod:`depthlib.compose.looped_certified`, merged by
:func:`depthlib.compose.chapter.merge_looped_certified`), and ``untied``, chapter 3's certified run of untied students
(``toy-certified``, :mod:`depthlib.toy.certified`). Both hold the same tables (``stages``, ``certified``,
``alpha_summary``, ``fragility``, ``slopes`` …), so chapter 3's fits (:func:`depthlib.toy.certified.fragility`,
:func:`~depthlib.toy.certified.local_slopes`, :func:`depthlib.toy.analysis.alpha_per_replicate`) are reused, never
copied. No compute entry imports this module, so editing it never makes a run stale. Every function takes the runs or
mappings of their tables (table name → DataFrame, ``"config"`` → the run's config, ``"manifest"`` → its manifest), so
that the rules can be tested on tables with known answers. Units: losses are held-out KL divergences from the teacher
in nats, angles radians, exponents, ratios and cosines dimensionless; intervals are 95 % t intervals over replicates.

**The question** (paper §4's calibration, Fig. 4a,b, asked of the paper's §5 proposal that reusing depth may use it
compositionally): does a looped student — one block applied ℓ times with step 1/ℓ, an autonomous flow — reach a
steeper α_ℓ than chapter 3's untied students on the tied teacher (itself one flow), and does its loss plateau on the
independent teacher (128 different blocks: an ensemble)?

**The comparison.** A replicate's looped and untied students share their teacher, training pool and held-out inputs
(the same seeds), so they are compared *paired by replicate*: the looped/untied loss ratio at each depth (geometric
mean over replicates with a t interval on its logarithm) and the difference of their exponents, both fitted on the
depths both runs trained (the looped depths: chapter 3's untied run has them all in every profile).

**What a number may say** — the book's rule for certified runs (chapters 3, 6 and 7):

* an exponent, ratio or slope resting on students that are not all certified (a last continuation still gained
  ≥ 2 %) is reported **not certified**, whatever its interval: it describes students still improving and decides
  nothing;
* between certified students, an interval that includes the value it is compared with (0 for a difference, 1 for a
  ratio, :data:`PLATEAU_SLOPE` for a plateau) is **undecided**;
* otherwise the comparison is decided: steeper / shallower, lower / higher, plateau / still falling.

The untrained Euler start and each route's own students before any continuation have no certificate; they are shown
as what they are (``untrained``, ``before any continuation``), never as results.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib.claims import (
    PLATEAU_SLOPE,  # the interval below it: "plateau"; wholly above: "still falling"
    gain_range,
)
from depthlib.compose.analysis import mean_interval
from depthlib.errors import InputError
from depthlib.sources import config as _config
from depthlib.sources import manifest as _manifest
from depthlib.sources import table as _table
from depthlib.toy import analysis as toy_analysis
from depthlib.toy import certified

__all__ = ["CHAIN", "CHAIN_ROUTES", "ENSEMBLE_LONG_LAG", "ENSEMBLE_UPDATE_ANGLE", "PLATEAU_SLOPE", "answer",
           "certification_table", "conclusion_text", "difference_display", "difference_table", "exponent_display",
           "exponent_table", "limits_text", "loss_display", "loss_lines", "loss_table", "measurements", "plateau_display",
           "plateau_table", "settings_table", "signature_means", "signatures_table", "signatures_text", "slopes_display",
           "slopes_table"]

#: the looped routes that train without the teacher's block: scratch at the smallest depth, halved above it
CHAIN_ROUTES = ("scratch", "halved")
#: the name of the fit (and figure line) of that chain alone
CHAIN = "looped, scratch → halved"
#: chapter 3's rule for an ensemble's signatures (:func:`depthlib.toy.analysis.describe_regimes`)
ENSEMBLE_UPDATE_ANGLE, ENSEMBLE_LONG_LAG = 1.2, 0.1
_KEYS = ["teacher", "temperature", "replicate"]
_TEACHERS = ("tied", "independent")
_LOOPED_ENVELOPE = "looped envelope"
_UNTIED_ENVELOPE = "untied envelope (chapter 3)"


# ---- reading runs or mappings of tables -----------------------------------------------------------------------------
def _protocol(run) -> dict:
    """The looped run's chapter-3 protocol settings (:class:`depthlib.toy.certified.CertifiedConfig` as a dict)."""
    return dict(_config(run).get("protocol", {}))


def _iv(v: float, lo: float, hi: float, digits: int = 2, *, sign: bool = False, sci: bool = False) -> str:
    """"v [lo, hi]" (``sci``: 3 significant digits in e-notation), the value alone without an interval, "—" without
    a value."""
    if not np.isfinite(v):
        return "—"
    f = ((lambda x: f"{x:.2e}") if sci else (lambda x: f"{x:+.{digits}f}") if sign else (lambda x: f"{x:.{digits}f}"))
    return f"{f(v)} [{f(lo)}, {f(hi)}]" if np.isfinite(lo) and np.isfinite(hi) else f(v)


def _gmean_interval(values) -> tuple[float, float, float, int]:
    """(geometric mean, lo, hi, n) of positive ``values``: the 95 % t interval of their logarithm, exponentiated (a
    loss spans decades across depths and replicates, and the exponents are fitted to its logarithm)."""
    v, lo, hi, n = mean_interval(np.log(np.asarray(values, dtype=float)))
    return float(np.exp(v)), float(np.exp(lo)), float(np.exp(hi)), n


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"


def _depths(values) -> str:
    return ", ".join(str(int(d)) for d in sorted(set(values)))


def _cells(run) -> list[tuple[str, float]]:
    """The looped run's (teacher, temperature) cells, tied first."""
    c = _table(run, "certified")
    cells = {(str(t), float(T)) for t, T in zip(c["teacher"], c["temperature"])}
    return sorted(cells, key=lambda k: (_TEACHERS.index(k[0]) if k[0] in _TEACHERS else 9, -k[1]))


def _in(t: pd.DataFrame, teacher: str, temperature: float) -> pd.DataFrame:
    return t[(t["teacher"] == teacher) & np.isclose(t["temperature"].astype(float), temperature)]


def _looped(run) -> pd.DataFrame:
    """The looped envelope: one student per (teacher, T, replicate, depth), certified or not."""
    return _table(run, "certified")


def _check_shared_teachers(run, untied) -> None:
    """The looped and untied students of a replicate must share their teacher and held-out inputs (the protocol's
    seed, teacher depth and width), or a paired comparison compares different teachers."""
    p, u = _protocol(run), _config(untied)
    if not p or not u:
        return
    differ = [k for k in ("seed", "teacher_depth", "d_model") if k in p and k in u and p[k] != u[k]]
    if differ:
        raise InputError("the looped and untied runs do not share their teachers (they differ in "
                         + ", ".join(f"{k}: {p[k]} vs {u[k]}" for k in differ) + "): no paired comparison")


def _untied(run, untied) -> pd.DataFrame:
    """Chapter 3's untied envelope students of the looped run's cells and replicates, at the depths both runs trained."""
    _check_shared_teachers(run, untied)
    looped = _looped(run)
    u = _table(untied, "certified")
    u = u.merge(looped[_KEYS].drop_duplicates(), on=_KEYS)
    return u[u["depth"].isin(set(looped["depth"]))].reset_index(drop=True)


def _common_depths(run, untied) -> list[int]:
    return sorted(set(_looped(run)["depth"]) & set(_untied(run, untied)["depth"]))


def _chain(run) -> pd.DataFrame:
    """The scratch → halved chain alone, for each teacher that also has the Euler route: per (teacher, T, replicate,
    depth) the lowest held-out loss its chain stages reached (scratch or halved, with their continuations: the student
    the next depth's halved start is built from). It is certified only where the depth's envelope is that chain
    student and certified; elsewhere it was never continued. (Without an Euler route the chain *is* the envelope.)"""
    st = _table(run, "stages")
    teachers = set(st.loc[st["route"] == "euler", "teacher"])
    chain = st[st["route"].isin(CHAIN_ROUTES) & st["teacher"].isin(teachers)]
    if chain.empty:
        return pd.DataFrame(columns=[*_KEYS, "depth", "test_loss", "certified"])
    best = chain.loc[chain.groupby([*_KEYS, "depth"])["test_loss"].idxmin()].copy()
    env = _looped(run).set_index([*_KEYS, "depth"])
    flags = []
    for r in best.itertuples():
        e = env.loc[(r.teacher, r.temperature, r.replicate, r.depth)]
        flags.append(bool(e["certified"]) and e["route"] in CHAIN_ROUTES and np.isclose(e["test_loss"], r.test_loss))
    best["certified"] = flags
    return best[[*_KEYS, "depth", "route", "stage", "test_loss", "certified"]].reset_index(drop=True)


def _per_replicate(students: pd.DataFrame, depths=None) -> pd.DataFrame:
    """α_ℓ per (teacher, T, replicate) fitted on ``depths`` (default: every depth present), chapter 3's fit."""
    return toy_analysis.alpha_per_replicate(students, depths=depths, by=_KEYS)


def _fit(students: pd.DataFrame, teacher: str, temperature: float, depths=None) -> dict:
    """α_ℓ [95 % t over replicates] of ``students`` (columns teacher, temperature, replicate, depth, test_loss,
    certified) in one cell, its drop-one-depth range (:func:`depthlib.toy.certified.fragility`, the refits without one
    depth) and how many of its students are certified."""
    s = _in(students, teacher, temperature)
    if depths is not None:
        s = s[s["depth"].isin(depths)]
    per = _per_replicate(s)
    summ = toy_analysis.summarize_alpha(per, by=("teacher", "temperature"))
    r = summ.iloc[0] if len(summ) else pd.Series({"alpha": np.nan, "lo": np.nan, "hi": np.nan, "n_replicates": 0,
                                                  "interval": ""})
    drop = certified.fragility(s) if s["depth"].nunique() >= 3 else pd.DataFrame(columns=["fit", "alpha"])
    drop = drop[drop["fit"].str.startswith("without ℓ = ")]
    return {"alpha": float(r["alpha"]), "lo": float(r["lo"]), "hi": float(r["hi"]),
            "replicates": int(r["n_replicates"]), "interval": r["interval"], "depths": _depths(s["depth"]),
            "n_students": len(s), "n_certified": int(s["certified"].astype(bool).sum()),
            "drop_one_min": float(drop["alpha"].min()) if len(drop) else np.nan,
            "drop_one_max": float(drop["alpha"].max()) if len(drop) else np.nan}


def _certificate(n_certified: int, n_students: int) -> str:
    return "certified" if n_certified == n_students and n_students else (
        f"not certified ({n_certified} of {n_students})")


def _certified_phrase(r) -> str:
    """"all 6 students certified" or "2 of 6 students certified: not certified" for a row of a fit."""
    n, k = int(r["n_students"]), int(r["n_certified"])
    return f"all {n} students certified" if k == n and n else f"{k} of {n} students certified: not certified"


def _position(lo: float, hi: float, ref: float, above: str, below: str) -> str:
    """Where an interval lies against ``ref``: ``above``, ``below``, "includes <ref>", or "no interval"."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "no interval"
    return above if lo > ref else below if hi < ref else f"includes {ref:g}"


def _status(position: str, all_certified: bool) -> str:
    """The book's reading of a comparison: "not certified" unless every student behind it is certified, then
    "undecided" where the interval includes the comparison value (or there is none), else the position."""
    if not all_certified:
        return "not certified"
    return "undecided" if position.startswith("includes") or position == "no interval" else position


def _gains(g: pd.Series) -> str:
    """Every replicate's last continuation gain in % (the column says so), with a true minus sign."""
    g = g.dropna().astype(float)
    return "—" if g.empty else ", ".join(f"{100 * x:+.1f}".replace("-", "−") for x in g)


# ---- tables -----------------------------------------------------------------------------------------------------
def settings_table(run, untied=None) -> pd.DataFrame:
    """What the part trained, one row per setting (column ``value``): teachers (depth ℓ*, width, temperatures),
    replicates, looped depths (and chapter 3's untied depths compared), routes, steps × batch per route, the pool, the
    learning rates, the certificate, parameters per looped student, the exact held-out check, students certified and
    the wall time (min)."""
    from depthlib.compose.chapter import describe_toy_certified
    d = describe_toy_certified(run) if hasattr(run, "table") else _describe_mapping(run)
    cert = _looped(run)
    first = min(d["depths"])
    routes = (f"scratch (one block, exp-9-3's init, W_down = 0) at ℓ = {first} → halved (the best block of ℓ/2 "
              "trained without the teacher, W_down ÷ 2) at each deeper depth")
    if d.get("euler"):
        routes += "; Euler (tied teacher): the teacher's block with W_down × ℓ*/ℓ, then trained"
    rows = {
        "teachers": ", ".join(d["teachers"]) + f" (ℓ* = {d['teacher_depth']}, width {d['d_model']}, T = "
                    + ", ".join(f"{t:g}" for t in d["temperatures"]) + ")",
        "replicates (chapter 3's teachers, pools and held-out inputs)": d["replicates"],
        "looped depths ℓ": ", ".join(map(str, d["depths"])),
        "routes": routes,
        "steps × batch, every route at every depth": f"{d['steps']:,} × {d['batch']}",
        "training pool": f"{d['pool_batches']:,} batches of teacher outputs, visited without replacement",
        "learning rate (every depth; warm starts ×)": f"{d['flow_lr']:.2e}; × {d['lr_warm']:g}",
        "certificate": (f"continuations of half the steps so far, re-warmed and decayed, until one gains "
                        f"< {100 * d['gain_below']:g} % (at most {d['max_continuations']})"),
        "trained parameters per looped student": f"{int(cert['parameters'].iloc[0]):,} at every depth"
                                                 if "parameters" in cert else "—",
        "held-out inputs found in a training pool (exact)": int(cert["heldout_in_pool"].max())
                                                            if "heldout_in_pool" in cert else "—",
        "looped students certified": f"{int(cert['certified'].sum())} of {len(cert)}"}
    if untied is not None:
        u = _untied(run, untied)
        rows["untied students compared (chapter 3's certified run)"] = (
            f"ℓ = {_depths(u['depth'])}: {int(u['certified'].sum())} of {len(u)} certified; "
            f"{int(_config(untied).get('steps', 0)):,} steps × {_config(untied).get('batch', '—')} per route, best of "
            "scratch, Euler, group distillation and progressive")
    wall = d.get("wall_time_s")
    unit_wall = _manifest(run).get("unit_wall_time_s")
    rows["wall time"] = ("—" if wall is None else _minutes(wall)
                         + (f" ({d.get('units', '—')} units, {_minutes(unit_wall)} of unit time added up)"
                            if unit_wall else ""))
    return pd.Series(rows, name="value").to_frame()


def _describe_mapping(run) -> dict:
    """:func:`depthlib.compose.chapter.describe_toy_certified`'s settings from a mapping of tables (for tests)."""
    p, cert = _protocol(run), _looped(run)
    return {"teachers": list(dict.fromkeys(cert["teacher"])), "temperatures": sorted(set(cert["temperature"])),
            "replicates": int(cert["replicate"].nunique()), "depths": sorted(set(cert["depth"])),
            "steps": p.get("steps", 0), "batch": p.get("batch", 0), "pool_batches": p.get("pool_batches", 0),
            "flow_lr": float("nan"), "lr_warm": p.get("lr_warm", float("nan")),
            "max_continuations": p.get("max_continuations", 0), "gain_below": p.get("gain_below", 0.02),
            "euler": _config(run).get("euler", True), "teacher_depth": p.get("teacher_depth", 0),
            "d_model": p.get("d_model", 0), "units": None, "wall_time_s": _manifest(run).get("wall_time_s")}


def loss_table(run, untied) -> pd.DataFrame:
    """Per (teacher, T, depth) of the looped run: the looped envelope's held-out loss (KL, nats; geometric mean over
    replicates [95 % t interval of its logarithm]) and how many of its students are certified, chapter 3's untied
    envelope's at the same depth (NaN where it has none), and the looped/untied loss ratio paired by replicate
    (geometric mean [95 % t of its logarithm]: with the same replicates on both sides it is the ratio of the two
    geometric means), with where it lies against 1 (``position``) and the book's reading (``status``: not certified
    unless every student of both is certified, undecided where the interval includes 1)."""
    looped, u = _looped(run), _untied(run, untied)
    rows = []
    for teacher, temp in _cells(run):
        lc, uc = _in(looped, teacher, temp), _in(u, teacher, temp)
        for depth, g in lc.groupby("depth"):
            h = uc[uc["depth"] == depth]
            lv, llo, lhi, n = _gmean_interval(g["test_loss"])
            uv, ulo, uhi, _ = _gmean_interval(h["test_loss"])
            pair = g[["replicate", "test_loss"]].merge(h[["replicate", "test_loss"]], on="replicate",
                                                      suffixes=("_looped", "_untied"))
            lr, lr_lo, lr_hi, n_pairs = mean_interval(np.log(pair["test_loss_looped"] / pair["test_loss_untied"]))
            n_l, n_u = int(g["certified"].sum()), int(h["certified"].sum())
            position = _position(lr_lo, lr_hi, 0.0, "looped higher", "looped lower").replace("includes 0",
                                                                                              "includes 1")
            rows.append({"teacher": teacher, "temperature": temp, "depth": int(depth), "looped": lv,
                         "looped_lo": llo, "looped_hi": lhi, "looped_certified": n_l, "looped_students": len(g),
                         "untied": uv, "untied_lo": ulo, "untied_hi": uhi, "untied_certified": n_u,
                         "untied_students": len(h), "replicates": n, "pairs": n_pairs,
                         "ratio": float(np.exp(lr)), "ratio_lo": float(np.exp(lr_lo)),
                         "ratio_hi": float(np.exp(lr_hi)), "position": position if n_pairs else "no untied students",
                         "status": _status(position, n_l == len(g) and n_u == len(h) and len(h) > 0)
                         if n_pairs else "—"})
    return pd.DataFrame(rows)


def loss_display(run, untied) -> pd.DataFrame:
    """:func:`loss_table` for a reader: losses in e-notation (KL, nats; geometric means), certified counts, the paired
    ratio and its reading."""
    t = loss_table(run, untied)
    return pd.DataFrame({
        "teacher": t["teacher"], "T": t["temperature"], "depth ℓ": t["depth"],
        "looped loss (KL, nats) [95 % t]": [_iv(r.looped, r.looped_lo, r.looped_hi, sci=True) for r in t.itertuples()],
        "looped certified": [f"{r.looped_certified} of {r.looped_students}" for r in t.itertuples()],
        "untied loss (KL, nats) [95 % t]": [_iv(r.untied, r.untied_lo, r.untied_hi, sci=True) for r in t.itertuples()],
        "untied certified": [f"{r.untied_certified} of {r.untied_students}" for r in t.itertuples()],
        "looped ÷ untied (paired) [95 % t]": [_iv(r.ratio, r.ratio_lo, r.ratio_hi) if r.pairs else "—"
                                              for r in t.itertuples()],
        "reading": t["status"]}).set_index(["teacher", "T", "depth ℓ"])


def loss_lines(run, untied) -> pd.DataFrame:
    """The loss-against-depth figure's points (:func:`depthlib.plots.compose.looped_loss_vs_depth`): per kind,
    teacher and depth the held-out loss (KL, nats; geometric mean over replicates [95 % t of its logarithm]), the
    replicates and how many are certified. Kinds: ``looped`` (the envelope), the scratch → halved chain
    (:data:`CHAIN`, teachers with an Euler route), ``untied`` (chapter 3's envelope at every depth it trained, at the
    looped run's temperatures and replicates) and ``untrained Euler start`` (the tied teacher's block with
    W_down × ℓ*/ℓ before training: the same network for looped and untied students; no certificate, ``certified``
    NaN)."""
    u = _table(untied, "certified").merge(_looped(run)[_KEYS].drop_duplicates(), on=_KEYS)
    st = _table(run, "stages")
    euler = st[(st["route"] == "euler") & ~st["stage"].str.contains("+", regex=False)]
    sources = {"looped": _looped(run), CHAIN: _chain(run), "untied": u,
               "untrained Euler start": euler.drop(columns="test_loss").rename(columns={"initial_loss": "test_loss"})
               .assign(certified=np.nan)}
    rows = []
    for kind, t in sources.items():
        for (teacher, temp, depth), g in t.groupby(["teacher", "temperature", "depth"]):
            v, lo, hi, n = _gmean_interval(g["test_loss"])
            cert = g["certified"]
            rows.append({"kind": kind, "teacher": teacher, "temperature": float(temp), "depth": int(depth),
                         "loss": v, "lo": lo, "hi": hi, "n": n,
                         "certified": float(cert.astype(float).sum()) if cert.notna().all() else np.nan})
    return pd.DataFrame(rows)


def exponent_table(run, untied) -> pd.DataFrame:
    """Per (teacher, T) and fit: α_ℓ of the held-out loss over depth (dimensionless; log–log fit per replicate, mean
    [95 % t] over replicates), the depths, replicates, the refits without one depth (range), how many of its students
    are certified and the certificate's word. Fits: the looped envelope (the run's ``alpha_summary`` and
    ``fragility``), the scratch → halved chain alone (teachers with an Euler route), each looped route's own students
    before any continuation (fits on at least two depths), the untrained Euler start, and chapter 3's untied envelope
    refitted on the looped depths."""
    summary, frag, looped = _table(run, "alpha_summary"), _table(run, "fragility"), _looped(run)
    st = _table(run, "stages")
    routes = st[~st["stage"].str.contains("+", regex=False)]
    chain, u = _chain(run), _untied(run, untied)
    rows = []
    for teacher, temp in _cells(run):
        s, f, own = _in(summary, teacher, temp), _in(frag, teacher, temp), _in(looped, teacher, temp)
        env = s[s["fit"] == "envelope"].iloc[0]
        drop = f[f["fit"].str.startswith("without ℓ = ")]
        n_c = int(own["certified"].sum())
        rows.append({"teacher": teacher, "temperature": temp, "fit": _LOOPED_ENVELOPE, "kind": "looped",
                     "alpha": float(env["alpha"]), "lo": float(env["lo"]), "hi": float(env["hi"]),
                     "replicates": int(env["replicates"]), "depths": _depths(own["depth"]), "n_students": len(own),
                     "n_certified": n_c, "certificate": _certificate(n_c, len(own)),
                     "drop_one_min": float(drop["alpha"].min()) if len(drop) else np.nan,
                     "drop_one_max": float(drop["alpha"].max()) if len(drop) else np.nan})
        if not _in(chain, teacher, temp).empty:
            c = _fit(chain, teacher, temp)
            c.pop("interval")
            rows.append({"teacher": teacher, "temperature": temp, "fit": CHAIN, "kind": "looped", **c,
                         "certificate": _certificate(c["n_certified"], c["n_students"])})
        for r in s[s["fit"].str.startswith(("route ", "untrained "))].itertuples():
            if not np.isfinite(r.alpha):
                continue                                   # one depth (the scratch route): no fit
            route = r.fit.split(" ", 1)[1]
            mine = _in(routes[routes["route"] == route], teacher, temp)
            rows.append({"teacher": teacher, "temperature": temp, "fit": f"looped {r.fit}", "kind": "looped",
                         "alpha": float(r.alpha), "lo": float(r.lo), "hi": float(r.hi),
                         "replicates": int(r.replicates), "depths": _depths(mine["depth"]),
                         "n_students": len(mine), "n_certified": 0,
                         "certificate": "untrained" if r.fit.startswith("untrained") else "before any continuation",
                         "drop_one_min": np.nan, "drop_one_max": np.nan})
        if not _in(u, teacher, temp).empty:
            c = _fit(u, teacher, temp)
            c.pop("interval")
            rows.append({"teacher": teacher, "temperature": temp, "fit": _UNTIED_ENVELOPE, "kind": "untied", **c,
                         "certificate": _certificate(c["n_certified"], c["n_students"])})
    return pd.DataFrame(rows)


def exponent_display(run, untied) -> pd.DataFrame:
    """:func:`exponent_table` for a reader: α_ℓ [95 % t], the depths, replicates, the drop-one-depth range and the
    certificate."""
    e = exponent_table(run, untied)
    return pd.DataFrame({
        "teacher": e["teacher"], "T": e["temperature"], "fit": e["fit"], "depths ℓ": e["depths"],
        "α_ℓ [95 % t]": [_iv(r.alpha, r.lo, r.hi) for r in e.itertuples()],
        "replicates": e["replicates"],
        "without one depth": [f"{a:.2f} to {b:.2f}" if np.isfinite(a) else "—"
                              for a, b in zip(e["drop_one_min"], e["drop_one_max"])],
        "certificate": e["certificate"]}).set_index(["teacher", "T", "fit"])


def difference_table(run, untied) -> pd.DataFrame:
    """Per (teacher, T): α_ℓ of the looped envelope (and of the scratch → halved chain, where there is one) minus
    chapter 3's untied envelope's, both fitted on the depths both runs trained, paired by replicate (the same
    teacher), mean [95 % t]; where the interval lies against 0 (``position``: steeper / shallower / includes 0) and the
    book's reading (``status``: not certified unless every student of both fits is certified, then undecided where
    the interval includes 0)."""
    depths = _common_depths(run, untied)
    u, rows = _untied(run, untied), []
    fits = {_LOOPED_ENVELOPE: _looped(run), CHAIN: _chain(run)}
    for teacher, temp in _cells(run):
        b = _in(u, teacher, temp)
        if b.empty or len(depths) < 2:
            continue
        pb = _per_replicate(b, depths)[["replicate", "alpha"]]
        for name, students in fits.items():
            a = _in(students, teacher, temp)
            a = a[a["depth"].isin(depths)]
            if a.empty:
                continue
            pair = _per_replicate(a, depths)[["replicate", "alpha"]].merge(pb, on="replicate",
                                                                          suffixes=("_looped", "_untied"))
            v, lo, hi, n = mean_interval(pair["alpha_looped"] - pair["alpha_untied"])
            all_certified = bool(a["certified"].astype(bool).all() and b["certified"].astype(bool).all())
            position = _position(lo, hi, 0.0, "steeper", "shallower")
            rows.append({"teacher": teacher, "temperature": temp, "fit": name, "against": _UNTIED_ENVELOPE,
                         "depths": _depths(depths), "diff": v, "lo": lo, "hi": hi, "replicates": n,
                         "n_certified": int(a["certified"].astype(bool).sum()), "n_students": len(a),
                         "untied_certified": int(b["certified"].astype(bool).sum()), "untied_students": len(b),
                         "all_certified": all_certified, "position": position,
                         "status": _status(position, all_certified)})
    return pd.DataFrame(rows)


def difference_display(run, untied) -> pd.DataFrame:
    """:func:`difference_table` for a reader: looped − untied α_ℓ (paired by replicate) [95 % t], the depths, the
    students certified on each side, where the interval lies and the book's reading."""
    d = difference_table(run, untied)
    if d.empty:
        return pd.DataFrame({"looped − untied α_ℓ": ["no depths both runs trained: nothing to compare"]})
    return pd.DataFrame({
        "teacher": d["teacher"], "T": d["temperature"], "looped fit": d["fit"], "depths ℓ": d["depths"],
        "looped − untied α_ℓ (paired) [95 % t]": [_iv(r.diff, r.lo, r.hi, sign=True) for r in d.itertuples()],
        "certified (looped; untied)": [f"{r.n_certified} of {r.n_students}; {r.untied_certified} of "
                                       f"{r.untied_students}" for r in d.itertuples()],
        "interval": d["position"], "reading": d["status"]}).set_index(["teacher", "T", "looped fit"])


def certification_table(run, untied=None) -> pd.DataFrame:
    """Per (teacher, T, depth): the looped envelope's route(s), how many of its students are certified, the rounds of
    continuations run and every replicate's last continuation gain (%, held-out loss it removed); beside it the same
    for chapter 3's untied students of that depth (given ``untied``). Columns are two-level (students, what), so the
    table fits the book's column."""
    looped = _looped(run)
    u = _untied(run, untied) if untied is not None else None
    rows = []
    for (teacher, temp, depth), g in looped.groupby(["teacher", "temperature", "depth"], sort=False):
        g = g.sort_values("replicate")
        row = {("", "teacher"): teacher, ("", "T"): temp, ("", "depth ℓ"): int(depth),
               ("looped", "route"): ", ".join(dict.fromkeys(g["route"])),
               ("looped", "certified"): f"{int(g['certified'].sum())} of {len(g)}",
               ("looped", "rounds"): "–".join(dict.fromkeys(str(int(k)) for k in
                                                          (g["continuations"].min(), g["continuations"].max()))),
               ("looped", "last gains (%)"): _gains(g["last_continuation_gain"])}
        if u is not None:
            h = _in(u, teacher, temp)
            h = h[h["depth"] == depth].sort_values("replicate")
            row.update({("untied (chapter 3)", "route"): ", ".join(dict.fromkeys(h["route"])) or "—",
                        ("untied (chapter 3)", "certified"): f"{int(h['certified'].sum())} of {len(h)}",
                        ("untied (chapter 3)", "last gains (%)"): _gains(h["last_continuation_gain"])})
        rows.append(row)
    order = {t: i for i, t in enumerate(_TEACHERS)}
    out = pd.DataFrame(rows)
    out.columns = pd.MultiIndex.from_tuples(out.columns)
    out = out.sort_values([("", "teacher"), ("", "T"), ("", "depth ℓ")],
                          key=lambda c: c.map(order) if c.name == ("", "teacher") else c)
    out = out.set_index([("", "teacher"), ("", "T"), ("", "depth ℓ")])
    out.index.names = ["teacher", "T", "depth ℓ"]
    return out


def slopes_table(run, untied) -> pd.DataFrame:
    """Local exponents −Δlog L/Δlog ℓ between neighbouring looped depths per (teacher, T): the looped envelope's (the
    run's ``slopes``) and chapter 3's untied envelope's between the same depths
    (:func:`depthlib.toy.certified.local_slopes` on them), each mean [95 % t] over replicates; the looped slope's
    position against :data:`PLATEAU_SLOPE` and whether every looped student at both depths is certified."""
    s = _table(run, "slopes")
    s = s[s["replicate"] == -1]
    u = _untied(run, untied)
    us = certified.local_slopes(u) if u["depth"].nunique() >= 2 else pd.DataFrame(columns=s.columns)
    us = us[us["replicate"] == -1][["teacher", "temperature", "depth_from", "depth_to", "slope", "lo", "hi"]]
    out = s[["teacher", "temperature", "depth_from", "depth_to", "slope", "lo", "hi"]].merge(
        us, on=["teacher", "temperature", "depth_from", "depth_to"], how="left", suffixes=("", "_untied"))
    looped = _looped(run)
    cert = []
    for r in out.itertuples():
        g = _in(looped, r.teacher, r.temperature)
        g = g[g["depth"].isin([r.depth_from, r.depth_to])]
        cert.append(bool(g["certified"].astype(bool).all()))
    out["all_certified"] = cert
    out["position"] = [_position(lo, hi, PLATEAU_SLOPE, "still falling", "plateau") for lo, hi in
                       zip(out["lo"], out["hi"])]
    order = {t: i for i, t in enumerate(_TEACHERS)}
    return (out.assign(o=out["teacher"].map(order)).sort_values(["o", "temperature", "depth_from"])
            .drop(columns="o").reset_index(drop=True))


def slopes_display(run, untied) -> pd.DataFrame:
    """:func:`slopes_table` for a reader."""
    t = slopes_table(run, untied)
    return pd.DataFrame({
        "teacher": t["teacher"], "T": t["temperature"], "from ℓ": t["depth_from"], "to ℓ": t["depth_to"],
        "looped slope [95 % t]": [_iv(r.slope, r.lo, r.hi) for r in t.itertuples()],
        "untied slope [95 % t]": [_iv(r.slope_untied, r.lo_untied, r.hi_untied) for r in t.itertuples()],
        f"looped against {PLATEAU_SLOPE:g}": t["position"],
        "looped students certified": t["all_certified"].map({True: "all", False: "not all"})
    }).set_index(["teacher", "T", "from ℓ", "to ℓ"])


def plateau_table(run) -> pd.DataFrame:
    """Per (teacher, T): the looped envelope's local exponent between its two deepest depths [95 % t] and the book's
    reading of it (``status``): ``plateau`` (the interval below :data:`PLATEAU_SLOPE`), ``still falling`` (above it),
    ``undecided`` (it includes it, or there is no interval), or ``not certified`` (a student at either depth is not)."""
    s = _table(run, "slopes")
    s = s[s["replicate"] == -1]
    looped, rows = _looped(run), []
    for teacher, temp in _cells(run):
        g = _in(s, teacher, temp).sort_values("depth_to")
        if g.empty:
            continue
        r = g.iloc[-1]
        students = _in(looped, teacher, temp)
        students = students[students["depth"].isin([r["depth_from"], r["depth_to"]])]
        position = _position(r["lo"], r["hi"], PLATEAU_SLOPE, "still falling", "plateau")
        all_certified = bool(students["certified"].astype(bool).all())
        open_ = students[~students["certified"].astype(bool)]
        rows.append({"teacher": teacher, "temperature": temp, "depth_from": int(r["depth_from"]),
                     "depth_to": int(r["depth_to"]), "slope": float(r["slope"]), "lo": float(r["lo"]),
                     "hi": float(r["hi"]), "n_certified": int(students["certified"].astype(bool).sum()),
                     "n_students": len(students), "all_certified": all_certified,
                     "last_gain_min": float(open_["last_continuation_gain"].min()) if len(open_) else np.nan,
                     "last_gain_max": float(open_["last_continuation_gain"].max()) if len(open_) else np.nan,
                     "position": position, "status": _status(position, all_certified)})
    return pd.DataFrame(rows)


def plateau_display(run) -> pd.DataFrame:
    """:func:`plateau_table` for a reader: the local exponent between the two deepest depths, the students behind it
    certified, and the reading."""
    t = plateau_table(run)
    return pd.DataFrame({
        "teacher": t["teacher"], "T": t["temperature"], "from ℓ": t["depth_from"], "to ℓ": t["depth_to"],
        "local exponent [95 % t]": [_iv(r.slope, r.lo, r.hi) for r in t.itertuples()],
        "students certified": [f"{r.n_certified} of {r.n_students}" for r in t.itertuples()],
        f"against {PLATEAU_SLOPE:g}": t["position"], "reading": t["status"]}).set_index(["teacher", "T"])


def measurements(run) -> dict[str, list[dict]]:
    """What the book's verdict reads from this part at T = 1 (claim → one dict per teacher): the tied teacher's
    looped envelope α_ℓ (``looped_toy_flow``) and the independent teacher's local exponent between the two deepest
    depths (``looped_toy_plateau``, :func:`plateau_table`), each with its 95 % t interval over replicates, whether
    every student behind it is certified and how many are (``certified_of``: (certified, of)); the flow's ``facts``
    hold the α_ℓ of the scratch → halved chain alone (``scratch``: trained without the teacher's block)."""
    summary, looped, out = _table(run, "alpha_summary"), _looped(run), {}
    for teacher, temp in _cells(run):
        if temp != 1.0:
            continue
        if teacher == "tied":
            own = _in(looped, teacher, temp)
            n_c = int(own["certified"].astype(bool).sum())
            env = _in(summary, teacher, temp).query("fit == 'envelope'").iloc[0]
            chain = _chain(run)
            scratch = _fit(chain, teacher, temp) if not _in(chain, teacher, temp).empty else None
            out.setdefault("looped_toy_flow", []).append({
                "teacher": teacher, "depths": _depths(own["depth"]), "value": float(env["alpha"]),
                "lo": float(env["lo"]), "hi": float(env["hi"]), "certified": n_c == len(own),
                "certified_of": (n_c, len(own)),
                "facts": {} if scratch is None else {"scratch": _iv(scratch["alpha"], scratch["lo"], scratch["hi"])},
                "note": f"α_ℓ of the envelope, 95 % t interval over {int(env['replicates'])} replicates; "
                        f"{n_c} of {len(own)} students certified"})
        elif teacher == "independent":
            p = _row(plateau_table(run), teacher=teacher, temperature=temp)
            if p is None:
                continue
            out.setdefault("looped_toy_plateau", []).append({
                "teacher": teacher, "depths": f"{int(p['depth_from'])} → {int(p['depth_to'])}",
                "value": float(p["slope"]), "lo": float(p["lo"]), "hi": float(p["hi"]),
                "certified": bool(p["all_certified"]),
                "certified_of": (int(p["n_certified"]), int(p["n_students"])),
                "note": f"local exponent −Δlog L/Δlog ℓ, 95 % t interval over replicates; {int(p['n_certified'])} of "
                        f"{int(p['n_students'])} students at those depths certified"})
    return out


# ---- hidden-state signatures ------------------------------------------------------------------------------------------
def signature_means(run, temperature: float = 1.0) -> pd.DataFrame:
    """Per (net, teacher, depth) at ``temperature``: the middle-block step angle θ(h_l, h_{l+1}), the update angle
    θ(Δh_l, Δh_{l+1}) and the long-lag cosine (k ≥ ℓ/4) of the looped students (the certified envelope) and their teachers
    (:func:`depthlib.toy.analysis.signature_summary`), each the mean over replicates with its 95 % t interval."""
    sig, lag = run.table("signatures"), run.table("lags")
    keep = np.isclose(sig["temperature"], temperature)
    per = toy_analysis.signature_summary(sig[keep], lag[np.isclose(lag["temperature"], temperature)])
    per = per.merge(sig[keep][["net", "rho", "teacher"]].drop_duplicates(), on=["net", "rho"], how="left")
    rows = []
    for (net, teacher, depth), g in per.groupby(["net", "teacher", "depth"], sort=False):
        row = {"net": net, "teacher": teacher, "depth": int(depth), "n": len(g)}
        for col in ("theta_step", "theta_update", "long_lag_cos"):
            row[col], row[f"{col}_lo"], row[f"{col}_hi"], _ = mean_interval(g[col])
        rows.append(row)
    return pd.DataFrame(rows)


def signatures_table(run) -> pd.DataFrame:
    """Per (net, teacher, depth): the middle-block step angle θ(h_l, h_l+1), the angle between consecutive updates
    θ(Δh_l, Δh_l+1) (both rad) and the long-lag cosine cos(Δh_l, Δh_l+k), k ≥ ℓ/4 (dimensionless), of each depth's
    envelope student and of its teacher (chapter 3's measures, :func:`signature_means`),
    mean [95 % t] over replicates."""
    frames = []
    for temp in sorted({t for _, t in _cells(run)}, reverse=True):
        frames.append(signature_means(run, temp).assign(temperature=temp))
    t = pd.concat(frames, ignore_index=True)

    def col(name, digits=3):
        return [f"{v:.{digits}g}" + (f" [{lo:.{digits}g}, {hi:.{digits}g}]" if np.isfinite(lo) else "")
                if np.isfinite(v) else "—" for v, lo, hi in zip(t[name], t[f"{name}_lo"], t[f"{name}_hi"])]
    return pd.DataFrame({"net": t["net"], "teacher": t["teacher"], "T": t["temperature"], "depth ℓ": t["depth"],
                         "middle θ(h_l, h_l+1) (rad)": col("theta_step"),
                         "θ(Δh_l, Δh_l+1) (rad)": col("theta_update"),
                         "long-lag cos (k ≥ ℓ/4)": col("long_lag_cos"),
                         "replicates": t["n"]}).set_index(["net", "teacher", "T", "depth ℓ"])


def signatures_text(run) -> str:
    """**Measured** (Markdown): at the deepest looped depth, per teacher, the looped students' update angle (rad) and
    long-lag cosine beside their teachers'; what chapter 3's rule calls them (an ensemble needs θ(Δh) >
    :data:`ENSEMBLE_UPDATE_ANGLE` rad **and** a long-lag cosine below :data:`ENSEMBLE_LONG_LAG`, on the means over
    replicates); and the exponent with which the middle step angle falls from the shallowest to the deepest depth
    (a step of 1/ℓ gives 1)."""
    temp = max(t for _, t in _cells(run))
    ts = signature_means(run, temp).set_index(["net", "teacher", "depth"])
    students = ts.loc["looped student"]
    deep, shallow = int(students.index.get_level_values("depth").max()), int(
        students.index.get_level_values("depth").min())
    teachers = [t for t in _TEACHERS if (t, deep) in students.index]

    def v(net, teacher, depth, col):
        r = ts.loc[(net, teacher, depth)]
        return _iv(r[col], r[col + "_lo"], r[col + "_hi"], 2)

    parts = []
    for teacher in teachers:
        tdepth = int(ts.loc["teacher"].loc[teacher].index.max())
        parts.append(f"on the {teacher} teacher the looped students' consecutive updates meet at "
                     f"{v('looped student', teacher, deep, 'theta_update')} rad and their long-lag cosine is "
                     f"{v('looped student', teacher, deep, 'long_lag_cos')}; the teacher's (ℓ* = {tdepth}) are "
                     f"{v('teacher', teacher, tdepth, 'theta_update')} rad and "
                     f"{v('teacher', teacher, tdepth, 'long_lag_cos')}")
    calls = {}
    for teacher in teachers:
        r = students.loc[teacher].dropna(subset=["theta_update", "long_lag_cos"])
        ensemble = (r["theta_update"] > ENSEMBLE_UPDATE_ANGLE) & (r["long_lag_cos"] < ENSEMBLE_LONG_LAG)
        calls[teacher] = (f"an ensemble at ℓ = {_depths(r.index[ensemble])}" if ensemble.any()
                          else "a non-ensemble at every depth")
    falls = []
    for teacher in teachers:
        a, b = students.loc[(teacher, shallow), "theta_step"], students.loc[(teacher, deep), "theta_step"]
        falls.append(f"{teacher} {a:.3g} → {b:.3g} rad, ℓ^−{np.log(a / b) / np.log(deep / shallow):.2f}")
    return (f"**Measured** (each depth's envelope student, means over {int(ts['n'].max())} replicates [95 % t], T = "
            f"{temp:g}). At ℓ = {deep}, " + "; ".join(parts) + ". Chapter 3's rule — an ensemble needs θ(Δh) > "
            f"{ENSEMBLE_UPDATE_ANGLE:g} rad **and** a long-lag cosine below {ENSEMBLE_LONG_LAG:g} — calls the looped "
            "students " + "; ".join(f"{calls[t]} on the {t} teacher" for t in teachers) + ". A looped student is one "
            "flow by construction, whatever its teacher, so these measures are checked here on networks whose "
            "mechanism is known: on the independent teacher they show what the student *is*, a flow imitating an "
            "ensemble, not how well it fits. The middle step angle falls from ℓ = "
            f"{shallow} to ℓ = {deep} ({'; '.join(falls)}); a flow with step 1/ℓ and an ensemble of ℓ members both "
            "give about ℓ^−1, so this measure cannot tell the two apart. These students need no certificate to be "
            "described: the measures are of the students as trained.")


# ---- the section's answer, limits and conclusion --------------------------------------------------------------------
def _row(t: pd.DataFrame, **match) -> pd.Series | None:
    m = np.ones(len(t), dtype=bool)
    for k, v in match.items():
        m &= np.isclose(t[k].astype(float), v) if isinstance(v, float) else (t[k] == v).to_numpy()
    return t[m].iloc[0] if m.any() else None


def _gain_range(students: pd.DataFrame) -> str:
    open_ = students[~students["certified"].astype(bool)]
    if open_.empty:
        return ""
    return f"last continuations still gained {gain_range(open_['last_continuation_gain'].astype(float))}"


def _tied_sentence(run, untied, temp: float) -> str:
    e, d = exponent_table(run, untied), difference_table(run, untied)
    env = _row(e, teacher="tied", temperature=temp, fit=_LOOPED_ENVELOPE)
    un = _row(e, teacher="tied", temperature=temp, fit=_UNTIED_ENVELOPE)
    diff = _row(d, teacher="tied", temperature=temp, fit=_LOOPED_ENVELOPE)
    if env is None or un is None or diff is None:
        return ""
    students = pd.concat([_in(_looped(run), "tied", temp), _in(_untied(run, untied), "tied", temp)])
    lead = {"steeper": "**Yes**", "shallower": "**No — shallower**",
            "undecided": "**Undecided**: the paired interval includes 0",
            "not certified": (f"**Not certified**: {int(diff['n_certified'])} of {int(diff['n_students'])} looped and "
                              f"{int(diff['untied_certified'])} of {int(diff['untied_students'])} untied students are "
                              f"certified ({_gain_range(students)}), so the difference decides nothing"
                              + ("" if diff["position"] in ("steeper", "shallower")
                                 else f"; its interval also {diff['position']}"))}[diff["status"]]
    text = (f"**Does a looped student of the tied teacher (a true flow) reach a steeper α_ℓ than untied students?** "
            f"{lead}. Over ℓ = {diff['depths']} at T = {temp:g}, the looped envelope's α_ℓ is "
            f"{_iv(env['alpha'], env['lo'], env['hi'])} ({_certified_phrase(env)}) and chapter 3's untied envelope's, "
            f"refitted on the same depths, {_iv(un['alpha'], un['lo'], un['hi'])} ({_certified_phrase(un)}); paired by "
            f"replicate (the same teacher), looped − untied = {_iv(diff['diff'], diff['lo'], diff['hi'], sign=True)} "
            f"({diff['position']}).")
    chain = _row(e, teacher="tied", temperature=temp, fit=CHAIN)
    if chain is not None:
        text += (f" Trained without the teacher's block (scratch → halved) the looped student reaches "
                 f"{_iv(chain['alpha'], chain['lo'], chain['hi'])} ({_certified_phrase(chain)}).")
    return text


def _plateau_sentence(run, untied, temp: float) -> str:
    p = _row(plateau_table(run), teacher="independent", temperature=temp)
    if p is None:
        return ""
    e, d = exponent_table(run, untied), difference_table(run, untied)
    env = _row(e, teacher="independent", temperature=temp, fit=_LOOPED_ENVELOPE)
    un = _row(e, teacher="independent", temperature=temp, fit=_UNTIED_ENVELOPE)
    diff = _row(d, teacher="independent", temperature=temp, fit=_LOOPED_ENVELOPE)
    students = _in(_looped(run), "independent", temp)
    students = students[students["depth"].isin([p["depth_from"], p["depth_to"]])]
    lead = {"plateau": "**Yes**", "still falling": "**No — still falling**",
            "undecided": f"**Undecided**: the slope's interval {p['position']}",
            "not certified": (f"**Not certified**: {int(p['n_certified'])} of {int(p['n_students'])} looped students "
                              f"at ℓ = {p['depth_from']} and {p['depth_to']} are certified ({_gain_range(students)}), "
                              f"so the slope decides nothing (its interval: {p['position']})")}[p["status"]]
    text = (f"**Does its loss plateau on the independent teacher (an ensemble)?** {lead}. Between ℓ = "
            f"{p['depth_from']} and {p['depth_to']} the looped envelope's loss falls with local exponent "
            f"{_iv(p['slope'], p['lo'], p['hi'])} (a plateau: the interval below {PLATEAU_SLOPE:g}); over every looped "
            f"depth α_ℓ = {_iv(env['alpha'], env['lo'], env['hi'])} ({_certified_phrase(env)})")
    if un is not None and diff is not None:
        text += (f", against chapter 3's untied students' {_iv(un['alpha'], un['lo'], un['hi'])} ({_certified_phrase(un)};"
                 f" paired difference {_iv(diff['diff'], diff['lo'], diff['hi'], sign=True)}, {diff['position']})")
    return text + "."


def answer(run, untied) -> str:
    """The section's answer (Markdown, one paragraph) to its two questions, stated only as strongly as the certificate
    allows (the module's rule): on the tied teacher, the looped envelope's α_ℓ against chapter 3's untied envelope's
    on the same depths and their paired difference (and the scratch → halved chain's α_ℓ); on the independent
    teacher, whether the looped loss plateaus (the local exponent between the two deepest depths against
    :data:`PLATEAU_SLOPE`) beside its α_ℓ and the untied students'; then how many students are certified."""
    parts = []
    for teacher, temp in _cells(run):
        parts.append(_tied_sentence(run, untied, temp) if teacher == "tied" else
                     _plateau_sentence(run, untied, temp) if teacher == "independent" else "")
    looped, u = _looped(run), _untied(run, untied)
    parts.append(f"In all, {int(looped['certified'].sum())} of {len(looped)} looped students and "
                 f"{int(u['certified'].sum())} of {len(u)} of chapter 3's untied students on the same depths are "
                 "certified (a continuation of half a student's steps, re-warmed and decayed, gained < 2 %).")
    return " ".join(p for p in parts if p)


def _euler_bias(run) -> str:
    """One sentence: the tied teacher is itself ℓ* Euler steps of its flow, so the Euler start's error vanishes at
    ℓ = ℓ*, not as ℓ → ∞; to first order (Euler's global error ∝ step) its loss ∝ (1/ℓ − 1/ℓ*)², whose local exponent
    2/(1 − ℓ/ℓ*) grows with ℓ. Empty without the Euler route."""
    p = _protocol(run)
    st = _table(run, "stages")
    if not (st["route"] == "euler").any() or not p.get("teacher_depth"):
        return ""
    star, depths = int(p["teacher_depth"]), sorted(set(st.loc[st["route"] == "euler", "depth"]))

    def local(d):
        return 2 / (1 - d / star)
    return (f" The tied teacher is itself ℓ* = {star} Euler steps of its flow, so the Euler start's error vanishes at "
            f"ℓ = ℓ*, not as ℓ → ∞: to first order its loss ∝ (1/ℓ − 1/ℓ*)², whose local exponent 2/(1 − ℓ/ℓ*) is "
            f"{local(depths[0]):.1f} at ℓ = {depths[0]} and {local(depths[-1]):.1f} at ℓ = {depths[-1]}; an exponent "
            "of students that stay near the Euler start is read against that, not against a smooth flow's 3 alone.")


def limits_text(run, untied) -> str:
    """What this part can and cannot say (Markdown list items, to follow the chapter's limits): what it compares, with
    what (replicates, depths, temperature, width, steps), how many students are certified, the asymmetry of routes
    (the untied envelope is the best of four, the looped of one or two), the Euler start's finite-ℓ* bias
    (:func:`_euler_bias`), what was not done, and what the `paper` profile (defined, not run) would train."""
    from depthlib.compose.chapter import PROFILES
    p, looped, u = _protocol(run), _looped(run), _untied(run, untied)
    depths = sorted(set(looped["depth"]))
    temps = ", ".join(f"{t:g}" for t in sorted(set(looped["temperature"])))
    paper = PROFILES["paper"].toy_certified.protocol
    between = sorted(set(_table(untied, "certified")["depth"]) - set(depths))
    between = (f", and chapter 3's depths between the looped ones (untied ℓ = {', '.join(map(str, between))})"
               if between else "")
    return f"""
* **Looped toy students (chapter 3's certified protocol). Can:** compare, student by student, looped and untied
  students trained by one protocol — the same teachers, training pools, held-out inputs, {p.get('steps', 0):,} steps ×
  {p.get('batch', 0)} per route at every depth and the same certificate — at ℓ = {', '.join(map(str, depths))},
  T = {temps}, with intervals over {looped['replicate'].nunique()} replicates paired by teacher. **Cannot:** decide
  anything that rests on students still improving: {int(looped['certified'].sum())} of {len(looped)} looped and
  {int(u['certified'].sum())} of {len(u)} untied students (on the same depths) are certified. One width
  ({p.get('d_model', '—')}), one teacher depth (ℓ* = {p.get('teacher_depth', '—')}; the Euler start needs ℓ < ℓ*),
  {'one temperature' if temps.count(',') == 0 else 'these temperatures'} and looped depths that double (the halved
  route halves the step). The untied envelope is the best of four routes (scratch, Euler, group distillation,
  progressive), the looped one of two on the tied teacher (the chain, Euler) and one on the independent teacher, so
  a looped loss above the untied one may partly be a route the looped student was not given.{_euler_bias(run)}
* **Not done (cut for the budget):** chapter 3's low temperature (T = 0.01), group distillation into one
  block{between}. The `paper` profile
  (defined, not run) trains looped depths {', '.join(map(str, paper.depths))} with {paper.steps:,} steps ×
  {paper.batch} per route.
"""


def conclusion_text(run, untied) -> str:
    """The conclusion on the looped toy students (Markdown): parameters per looped student; on the tied teacher α_ℓ of
    the looped envelope, the chain and the untied envelope with the paired difference and its reading, and the paired
    loss ratios at the shallowest and deepest common depths; on the independent teacher α_ℓ, the loss (nats) from the
    shallowest to the deepest depth, the ratio at the deepest and the plateau reading; certification and wall time."""
    looped, lt = _looped(run), loss_table(run, untied)
    e, d, pl = exponent_table(run, untied), difference_table(run, untied), plateau_table(run)
    common = _common_depths(run, untied)
    lines = [f"**Looped students in chapter 3's toy, certified protocol.** A looped student applies one block ℓ times "
             f"with step 1/ℓ — one autonomous flow, {int(looped['parameters'].iloc[0]):,} trained parameters at every "
             "depth — and was trained exactly as chapter 3 trains its untied students."
             if "parameters" in looped else "**Looped students in chapter 3's toy, certified protocol.**"]
    for teacher, temp in _cells(run):
        env = _row(e, teacher=teacher, temperature=temp, fit=_LOOPED_ENVELOPE)
        un = _row(e, teacher=teacher, temperature=temp, fit=_UNTIED_ENVELOPE)
        diff = _row(d, teacher=teacher, temperature=temp, fit=_LOOPED_ENVELOPE)
        t = _in(lt, teacher, temp).set_index("depth")
        text = (f"On the **{teacher} teacher** (T = {temp:g}) its α_ℓ is {_iv(env['alpha'], env['lo'], env['hi'])} "
                f"({_certified_phrase(env)}")
        if teacher == "tied":
            routes = _in(looped, teacher, temp)["route"]
            text += f"; {int((routes == 'euler').sum())} of {len(routes)} of them from the Euler route"
        text += ")"
        if un is not None and diff is not None:
            text += (f", chapter 3's untied students' {_iv(un['alpha'], un['lo'], un['hi'])} on the same depths "
                     f"({_certified_phrase(un)}): looped − untied "
                     f"{_iv(diff['diff'], diff['lo'], diff['hi'], sign=True)}, **{diff['status']}**")
        chain = _row(e, teacher=teacher, temperature=temp, fit=CHAIN)
        if chain is not None:
            text += (f". Trained without the teacher's block (scratch → halved) the looped student's α_ℓ is "
                     f"{_iv(chain['alpha'], chain['lo'], chain['hi'])} ({_certified_phrase(chain)})")
        text += ". "
        if common and common[0] in t.index:
            lo_d, hi_d = common[0], common[-1]
            text += ("Its loss over the untied student's, paired by replicate: "
                     + "; ".join(f"{_iv(t.loc[x, 'ratio'], t.loc[x, 'ratio_lo'], t.loc[x, 'ratio_hi'])} at ℓ = {x} "
                                 f"({t.loc[x, 'status']})" for x in dict.fromkeys([lo_d, hi_d])) + ". ")
        if teacher == "independent":
            p = _row(pl, teacher=teacher, temperature=temp)
            ds = sorted(t.index)
            text += (f"Its loss goes from {t.loc[ds[0], 'looped']:.2e} nats at ℓ = {ds[0]} to "
                     f"{t.loc[ds[-1], 'looped']:.2e} at ℓ = {ds[-1]}")
            if p is not None:
                text += (f", with local exponent {_iv(p['slope'], p['lo'], p['hi'])} between ℓ = {p['depth_from']} and "
                         f"{p['depth_to']}: **{p['status']}** (a plateau: below {PLATEAU_SLOPE:g})")
            text += ". "
        lines.append(text.strip())
    cert = f"{int(looped['certified'].sum())} of {len(looped)}"
    open_ = looped[~looped["certified"].astype(bool)]
    lines.append(f"{cert} looped students are certified"
                 + (f" (the others' last continuations gained {gain_range(open_['last_continuation_gain'])})"
                    if len(open_) else "")
                 + "; a comparison resting on a student that is not certified is reported *not certified* and decides "
                 "nothing, and one whose interval includes its comparison value is *undecided*.")
    wall = _manifest(run).get("wall_time_s")
    if wall:
        lines.append(f"The run took {_minutes(wall)} of wall time"
                     + (f" ({_minutes(_manifest(run)['unit_wall_time_s'])} of unit time added up)."
                        if _manifest(run).get("unit_wall_time_s") else "."))
    return "\n\n".join(lines) + "\n"

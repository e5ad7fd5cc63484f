"""Chapter 3's generated prose: what the certified protocol found, how to read it, and the chapter's conclusion.

Every sentence is worded from the runs' tables by a stated rule (no number typed by hand), so that a recomputed run
changes the prose with it. The certified protocol (:mod:`depthlib.toy.certified`) is the book's calibration of the
paper's §4 toy: a student's exponent says "procedural" (a smooth flow, α_ℓ → 3) or "ensemble" (α_ℓ ≈ 1) only when
its losses are converged, which here means *certified* — a re-warmed continuation from its final weights gained less
than ``gain_below`` of its held-out loss.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.claims import Measurement, gain_range
from depthlib.contract import from_dict
from depthlib.toy import certified

__all__ = ["calibration_lines", "certificate_table", "certified_answer", "certified_count", "certified_reading",
           "conclusion", "exponent_table", "measurements", "protocol_exponents", "row_facts", "separation_table",
           "slopes_table", "still_gaining"]


def certified_answer(run: results.Run) -> str:
    """The certified protocol's answer, one paragraph of Markdown generated from its tables. A cell (teacher,
    temperature) is *decided* only when every student of its envelope is certified (its last continuation gained less
    than ``gain_below``); otherwise it is undecided by the certificate, with the continuation gains that show why.
    Beside the certificate it says how far each cell's α_ℓ moved in the last round of continuations against its
    interval's half-width (the exponent's own stopping rule, reported as such, never as convergence), and whether the
    paired tied − independent difference excludes 0 under every drop-one-depth refit."""
    cfg = from_dict(certified.CertifiedConfig, run.config)
    cert, rounds, sep = run.table("certified"), run.table("alpha_rounds"), run.table("separation")
    summary = run.table("alpha_summary")
    n_cert, n = int(cert["certified"].sum()), len(cert)
    parts = [f"**{n_cert} of {n} students are certified** (a continuation of {100 * cfg.continuation:.0f} % of a "
             f"student's steps, re-warmed and decayed, gained less than {100 * cfg.gain_below:g} % of its held-out loss; at most "
             f"{cfg.max_continuations} continuations)."]
    decided = {}
    for (teacher, temp), c in cert.groupby(["teacher", "temperature"], sort=False):
        env = summary[(summary["fit"] == "envelope") & (summary["teacher"] == teacher)
                      & (summary["temperature"] == temp)].iloc[0]
        g = rounds[(rounds["teacher"] == teacher) & (rounds["temperature"] == temp)].sort_values("round")
        moved, half = abs(g["alpha"].iloc[-1] - g["alpha"].iloc[-2]), (g["hi"].iloc[-1] - g["lo"].iloc[-1]) / 2
        lo_steps, hi_steps = int(c["steps"].min()), int(c["steps"].max())
        steps = f"{lo_steps:,}" if lo_steps == hi_steps else f"{lo_steps:,}–{hi_steps:,}"
        decided[(teacher, temp)] = bool(c["certified"].all())
        status = ("certified" if decided[(teacher, temp)] else
                  f"**undecided by the certificate**: {int((~c['certified']).sum())} of {len(c)} students' last "
                  f"continuations still gained {_gains(c)}")
        parts.append(f"The {teacher} teacher at T = {temp:g} is {status}. Its envelope's α_ℓ is {env['alpha']:.2f} "
                     f"[{env['lo']:.2f}, {env['hi']:.2f}] after {steps} steps a student; over the last round of "
                     f"continuations it moved by {moved:.3f}, "
                     + ("less" if moved < half else "more") + f" than its interval's half-width ({half:.3f}).")
    if len(sep):
        every = sep[sep["fit"] == "all depths"].iloc[0]
        apart = bool((sep["lo"] > 0).all())
        both = all(decided.get((t, float(every["temperature"])), False) for t in ("tied", "independent"))
        parts.append(f"The paired difference tied − independent at T = {every['temperature']:g} is "
                     f"{every['diff']:+.2f} [{every['lo']:+.2f}, {every['hi']:+.2f}]; "
                     + ("it excludes 0 under every drop-one-depth refit" if apart
                        else "under at least one drop-one-depth refit its interval includes 0")
                     + (", between certified losses." if both else
                        ", between losses that are not certified: it says how the exponents of students trained this "
                        "far compare, not what the converged exponents are."))
    return " ".join(parts)



def _gains(c: pd.DataFrame) -> str:
    """The range of the last continuation gains (%) of the students of ``c`` that are not certified."""
    return gain_range(c.loc[~c["certified"], "last_continuation_gain"])


def _envelope(summary: pd.DataFrame, teacher: str, temperature: float) -> pd.Series | None:
    rows = summary[(summary["fit"] == "envelope") & (summary["teacher"] == teacher)
                   & np.isclose(summary["temperature"], temperature)]
    return rows.iloc[0] if len(rows) else None


def _against(r: pd.Series, value: float) -> str:
    """Where the interval of ``r`` lies against ``value``: below, above or containing it."""
    return "below" if r["hi"] < value else "above" if r["lo"] > value else "containing"


def certified_reading(run: results.Run, converged_run: results.Run | None = None) -> str:
    """**Reading it** for the certified protocol (Markdown), worded from its tables by these rules:

    * the certificate first: how many students are certified, and the last gains of the others per teacher; a cell
      whose students are not all certified gives the exponent of students trained this far, not a converged one;
    * what survives every check at T = 1: whether the paired tied − independent interval excludes 0 under every
      drop-one-depth refit, and how the difference of the teachers' mean exponents moved over the rounds of
      continuations;
    * each teacher's exponent against its mechanism's value (3 for the tied teacher's smooth flow, 1 for the
      independent teacher's ensemble), whether it still moves with training (last round's change against its
      interval's half-width), its local slopes and the route that won at each depth;
    * the low-temperature cell (fresh inputs) by the same rules;
    * beside the converged protocol (``converged_run``, the 1 % rule), when given: how far the certificate moved the
      exponents."""
    cert, summary, sep = run.table("certified"), run.table("alpha_summary"), run.table("separation")
    rounds, slopes, frag = run.table("alpha_rounds"), run.table("slopes"), run.table("fragility")
    n_cert, n = int(cert["certified"].sum()), len(cert)
    parts = [f"**Reading it.** {n_cert} of {n} students are certified"]
    by_teacher = [f"{_gains(c)} ({t} teacher, T = {temp:g})"
                  for (t, temp), c in cert.groupby(["teacher", "temperature"], sort=False) if _gains(c)]
    if by_teacher:
        parts[0] += ("; the others' last continuations still gained " + "; ".join(by_teacher) + ". Every exponent "
                     "below is therefore that of students trained this far, not a converged exponent, and the verdict "
                     "counts the rows that rest on it as undecided.")
    else:
        parts[0] += ": every exponent below rests on converged losses."
    t1 = {t: _envelope(summary, t, 1.0) for t in ("tied", "independent")}
    if len(sep) and all(r is not None for r in t1.values()):
        every = sep[sep["fit"] == "all depths"].iloc[0]
        drops = sep[sep["fit"] != "all depths"]
        g = rounds[np.isclose(rounds["temperature"], 1.0)].pivot_table(index="round", columns="teacher",
                                                                        values="alpha")
        diff = g["tied"] - g["independent"]
        apart = bool((sep["lo"] > 0).all() and (diff > 0).all())
        parts.append(
            ("What survives every check is the order of the two teachers at T = 1" if apart else
             "At T = 1 the order of the two teachers does not survive every check")
            + f": the paired difference "
            f"{every['diff']:+.2f} [{every['lo']:+.2f}, {every['hi']:+.2f}] "
            + ("excludes 0" if every["lo"] > 0 else "includes 0")
            + f" (without one depth its lower bound is {drops['lo'].min():+.2f} to {drops['lo'].max():+.2f}), and the "
            f"difference of the mean exponents went from {diff.iloc[0]:+.2f} before any continuation to "
            f"{diff.iloc[-1]:+.2f} after round {int(diff.index[-1])}"
            + (": the smooth teacher's students fall faster with depth at every stage of training measured here."
               if apart else "."))
    routes = summary[summary["fit"].str.startswith("route ") & np.isclose(summary["temperature"], 1.0)]
    both = routes.pivot_table(index="fit", columns="teacher", values="alpha").dropna()
    if {"tied", "independent"} <= set(both.columns) and len(both):
        reversed_ = [f.removeprefix("route ") for f, r in both.iterrows() if r["tied"] <= r["independent"]]
        parts.append("Route by route (each route's own students, before any continuation), tied against independent: "
                     + ", ".join(f"{f.removeprefix('route ')} {r['tied']:.2f} against {r['independent']:.2f}"
                                 for f, r in both.iterrows())
                     + (f"; the order reverses for {', '.join(reversed_)}: the separation rests on the routes that "
                        "reach the lowest losses, not on every way of training." if reversed_ else
                        "; every route shared by both teachers keeps the order."))
    for teacher, value, mechanism in (("tied", 3.0, "a converged smooth flow's 3"),
                                      ("independent", 1.0, "an ensemble's 1")):
        r = t1.get(teacher)
        if r is None:
            continue
        g = rounds[(rounds["teacher"] == teacher) & np.isclose(rounds["temperature"], 1.0)].sort_values("round")
        moved = g["alpha"].iloc[-1] - g["alpha"].iloc[-2]
        half = (g["hi"].iloc[-1] - g["lo"].iloc[-1]) / 2
        s = slopes[(slopes["teacher"] == teacher) & np.isclose(slopes["temperature"], 1.0)
                   & (slopes["replicate"] == -1)].sort_values("depth_from")
        c = cert[(cert["teacher"] == teacher) & np.isclose(cert["temperature"], 1.0)]
        won = c.groupby("depth")["route"].agg(lambda v: "/".join(sorted(set(v))))
        shallow = frag[(frag["teacher"] == teacher) & np.isclose(frag["temperature"], 1.0)
                       & frag["fit"].str.startswith("without ℓ ≤")]
        sentence = (f"The {teacher} teacher's α_ℓ = {_interval(r['alpha'], r['lo'], r['hi'])} lies "
                    f"{_against(r, value)} {mechanism}. Over the rounds of continuations it went "
                    + " → ".join(f"{a:.2f}" for a in g["alpha"]) + f"; the last round moved it by {moved:+.3f}, "
                    + ("less" if abs(moved) < half else "more") + f" than its interval's half-width ({half:.3f})"
                    + ("" if abs(moved) < half else ", so it is still changing with training")
                    + ". Its local slopes run " + ", ".join(f"{a.depth_from}→{a.depth_to}: {a.slope:.2f}"
                                                            for a in s.itertuples()))
        if won.nunique() > 1:
            by_route = won.groupby(won).groups
            sentence += ("; they follow the route that won each depth (" + "; ".join(
                f"{route} at ℓ = {', '.join(str(d) for d in ds)}" for route, ds in by_route.items()) + ")")
        if len(shallow):
            f0 = shallow.iloc[0]
            sentence += (f"; fitted to its {int(f0['depths'])} deepest depths only ({f0['fit']}) it is "
                         f"{_interval(f0['alpha'], f0['lo'], f0['hi'])}")
        parts.append(sentence + ".")
    low = [(t, temp) for t, temp in cert[["teacher", "temperature"]].drop_duplicates().itertuples(index=False)
           if temp < 1.0]
    for teacher, temp in low:
        r, c = _envelope(summary, teacher, temp), cert[(cert["teacher"] == teacher) & (cert["temperature"] == temp)]
        if r is None:
            continue
        raised = c[c["certified"] & (c["last_continuation_gain"] < 0)]
        far = c[~c["within_gap"]]
        sentence = (f"At T = {temp:g} ({teacher} teacher) α_ℓ = {_interval(r['alpha'], r['lo'], r['hi'])}, "
                    f"{_against(r, 3.0)} 3, with {int(c['certified'].sum())} of {len(c)} students certified and "
                    f"{len(c) - len(far)} of {len(c)} held-out losses within {100 * certified.GAP_BELOW:g} % of their "
                    "pool losses.")
        if len(raised):
            sentence += (f" {len(raised)} of the certificates come from a continuation that *raised* the held-out loss "
                         f"(by {-100 * raised['last_continuation_gain'].max():.0f}–"
                         f"{-100 * raised['last_continuation_gain'].min():.0f} %): re-warmed to the base rate, those "
                         "students did not come back to their loss, so the certificate says a continuation could not "
                         "improve them, not that they sit at the lowest loss their depth allows.")
        if len(far):
            sentence += (f" Held-out ÷ pool − 1 reaches {100 * far['gap'].abs().max():.0f} % (replicate"
                         f"{'s' * (far['replicate'].nunique() > 1)} "
                         f"{', '.join(str(int(x)) for x in sorted(far['replicate'].unique()))}): there the students "
                         "fit the pool better than fresh inputs, which the equal-footing check forbids, so the cell "
                         "is undecided.")
        parts.append(sentence)
    if converged_run is not None and "alpha_summary" in converged_run.tables():
        old = converged_run.table("alpha_summary")
        moved, outside = [], []
        for teacher in ("tied", "independent"):
            o = old[(old["teacher"] == teacher) & np.isclose(old["temperature"], 1.0)]
            if len(o) and t1.get(teacher) is not None:
                o = o.iloc[0]
                moved.append(f"{teacher} {_interval(o['alpha'], o['lo'], o['hi'])} → {t1[teacher]['alpha']:.2f}")
                outside.append(not o["lo"] <= t1[teacher]["alpha"] <= o["hi"])
        if moved:
            parts.append("Against the converged protocol's students (a 1 % rule a schedule can meet, fewer steps for "
                         "deeper students), α_ℓ at T = 1 went " + ", ".join(moved) + ": "
                         + ("both now lie outside that protocol's intervals." if all(outside) else
                            "some now lie outside that protocol's intervals." if any(outside) else
                            "both within that protocol's intervals."))
    return "\n\n".join(parts)


def conclusion(runs: dict[str, results.Run]) -> str:
    """The chapter's conclusion (Markdown) from the runs it shows (:func:`depthlib.toy.chapter.runs`): the
    calibration's exponents and whether their intervals overlap; the certified protocol's exponents at T = 1, their
    paired difference and how many students are certified (which decides whether the verdict can count them); the
    low-temperature cell; and at how many temperatures the phase diagram resolves a direction along ρ."""
    from depthlib.toy import chapter
    lines = ["**What this chapter found.**"]
    cal = {k: r for k, r in chapter.calibration_parts(runs).items() if r is not None}
    if {"tied", "independent"} <= set(cal):
        s = chapter.calibration_summary(cal).set_index("teacher")
        t, i = s.loc["tied"], s.loc["independent"]
        overlap = not (t["lo"] > i["hi"] or i["lo"] > t["hi"])
        lines.append(f"Trained by the paper's recipe at a CPU budget ({int(t['steps']):,} steps × {int(t['batch']):,}, "
                     f"one replicate), the tied teacher's students give α_ℓ = {_interval(t['alpha'], t['lo'], t['hi'])} and "
                     f"the independent teacher's {_interval(i['alpha'], i['lo'], i['hi'])}: the intervals "
                     + ("overlap, so that budget cannot turn \"α_ℓ ≈ 1\" into \"ensemble averaging\"." if overlap else
                        "do not overlap."))
    cert = runs.get("certified")
    if cert is not None and {"certified", "alpha_summary"} <= set(cert.tables()):
        cfg = from_dict(certified.CertifiedConfig, cert.config)
        c, summary, sep = cert.table("certified"), cert.table("alpha_summary"), cert.table("separation")
        t, i = _envelope(summary, "tied", 1.0), _envelope(summary, "independent", 1.0)
        reps = max(int(x[2]) for x in cfg.cells)
        if t is not None and i is not None:
            every = sep[sep["fit"] == "all depths"].iloc[0]
            apart = bool((sep["lo"] > 0).all())
            lines.append(
                f"Trained by the certified protocol ({reps} replicates, every route {cfg.steps:,} steps × {cfg.batch} "
                f"at every depth, then continued), the two teachers separate at T = 1: tied "
                f"{_interval(t['alpha'], t['lo'], t['hi'])}, independent {_interval(i['alpha'], i['lo'], i['hi'])}, paired "
                f"difference {every['diff']:+.2f} [{every['lo']:+.2f}, {every['hi']:+.2f}]"
                + (", above 0 under every drop-one-depth refit" if apart else "")
                + f". The tied exponent lies {_against(t, 3.0)} a smooth flow's 3 and the independent one "
                f"{_against(i, 1.0)} an ensemble's 1.")
        n_cert, n = int(c["certified"].sum()), len(c)
        if n_cert < n:
            lines.append(f"But {n - n_cert} of {n} students are not certified (their last continuations still gained "
                         f"{_gains(c)}), so these are the exponents of students trained this far; the verdict counts "
                         "every row that rests on them as **undecided**, and the calibration's step from \"α_ℓ ≈ 1\" "
                         "to \"ensemble averaging\" is supported in direction, not certified.")
        for teacher, temp in c[["teacher", "temperature"]].drop_duplicates().itertuples(index=False):
            r = _envelope(summary, teacher, temp)
            if temp < 1.0 and r is not None:
                cc = c[(c["teacher"] == teacher) & (c["temperature"] == temp)]
                raised = int((cc["certified"] & (cc["last_continuation_gain"] < 0)).sum())
                far = int((~cc["within_gap"]).sum())
                lines.append(f"At T = {temp:g} the {teacher} teacher's students give "
                             f"{_interval(r['alpha'], r['lo'], r['hi'])} ({int(cc['certified'].sum())} of {len(cc)} "
                             f"certified, {raised} of them by a continuation that raised the held-out loss; {far} of "
                             f"{len(cc)} held-out losses more than {100 * certified.GAP_BELOW:g} % from their pool "
                             "losses)" + (": undecided." if far or cc["certified"].sum() < len(cc) else "."))
    sweep = runs.get("sweep")
    if sweep is not None:
        alpha = sweep.table("alpha")
        resolved = 0
        for _, g in alpha.groupby("temperature"):                 # do the ρ = 0 and ρ = 1 intervals overlap?
            first, last = g.sort_values("rho").iloc[[0, -1]].to_dict("records")
            resolved += bool(first["hi"] < last["lo"] or last["hi"] < first["lo"])
        reps = int(sweep.config["replicates"])
        lines.append(f"The phase diagram ({sweep.config['steps']:,} steps, {reps} replicate{'s' * (reps != 1)}) "
                     f"resolves a direction along ρ at {resolved} of {alpha['temperature'].nunique()} temperatures.")
    lines.append("What would change this: students certified by longer continuations (the `paper` profile on a "
                 "GPU); the table gives each claim's number and status.")
    return " ".join(lines)


# ---- the certified protocol's tables, for the reader ---------------------------------------------------------
def _interval(v: float, lo: float, hi: float, digits: int = 2) -> str:
    """"v [lo, hi]", or v alone where there is no interval."""
    return (f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]" if np.isfinite(lo) and np.isfinite(hi)
            else f"{v:.{digits}f}")


def certificate_table(run: results.Run) -> pd.DataFrame:
    """Each student's certificate, one row per (teacher, T, depth) and a column per replicate (so the table fits the
    book's column): the stage fitted (its route and continuations, ``+cK``) and "certified" or the last
    continuation's gain (% of the held-out loss)."""
    cert = run.table("certified")
    cell = cert.apply(lambda r: f"{r['stage']}: " + ("certified" if r["certified"] else
                                                     f"+{100 * r['last_continuation_gain']:.1f} %"), axis=1)
    out = (cert.assign(certificate=cell, replicate=[f"replicate {int(k)}" for k in cert["replicate"]])
           .pivot_table(index=["teacher", "temperature", "depth"], columns="replicate", values="certificate",
                        aggfunc="first")
           .rename_axis(index=["teacher", "T", "depth ℓ"], columns=None))
    order = {"tied": 0, "independent": 1}
    return out.sort_index(level=["teacher", "T", "depth ℓ"], ascending=[True, False, True],
                          key=lambda i: i.map(order) if i.name == "teacher" else i)


def exponent_table(run: results.Run) -> pd.DataFrame:
    """α_ℓ of every fit per (teacher, T): the envelope (each depth's best, continued student), each route's own
    students before any continuation, and the untrained warm starts, as "α [95 % t interval over replicates]"; for
    the envelope also its range when one depth is left out (``fragility``) and how many of its students are
    certified."""
    summary, frag, cert = run.table("alpha_summary"), run.table("fragility"), run.table("certified")
    rows = []
    for r in summary.itertuples():
        row = {"teacher": r.teacher, "T": r.temperature, "fit": r.fit,
               "α_ℓ [95 % interval]": _interval(r.alpha, r.lo, r.hi), "replicates": int(r.replicates),
               "without one depth": "", "students certified": ""}
        if r.fit == "envelope":
            f = frag[(frag["teacher"] == r.teacher) & np.isclose(frag["temperature"], r.temperature)
                     & frag["fit"].str.startswith("without ℓ =")]
            c = cert[(cert["teacher"] == r.teacher) & np.isclose(cert["temperature"], r.temperature)]
            row["without one depth"] = f"{f['alpha'].min():.2f} to {f['alpha'].max():.2f}" if len(f) else ""
            row["students certified"] = f"{int(c['certified'].sum())} of {len(c)}"
        rows.append(row)
    order = {"envelope": 0}
    return (pd.DataFrame(rows).sort_values(["teacher", "T", "fit"], key=lambda col: col.map(
        lambda v: (order.get(v, 1), v) if isinstance(v, str) and col.name == "fit" else v))
            .set_index(["teacher", "T", "fit"]))


def slopes_table(run: results.Run) -> pd.DataFrame:
    """The envelope's local exponents −Δlog L/Δlog ℓ between neighbouring depths, "slope [95 % t interval over
    replicates]", one row per (teacher, T) and a column per depth pair."""
    s = run.table("slopes")
    s = s[s["replicate"] == -1]
    return (s.assign(pair=[f"{a}→{b}" for a, b in zip(s["depth_from"], s["depth_to"])],
                     value=[_interval(v, lo, hi) for v, lo, hi in zip(s["slope"], s["lo"], s["hi"])])
            .pivot_table(index=["teacher", "temperature"], columns="pair", values="value", aggfunc="first", sort=False)
            .rename_axis(index=["teacher", "T"], columns="depths"))


def separation_table(run: results.Run) -> pd.DataFrame:
    """The paired difference α_ℓ(tied) − α_ℓ(independent) of the envelopes, "Δ [95 % t interval over replicates]",
    on all depths and without each depth in turn."""
    sep = run.table("separation")
    return pd.DataFrame({"depths fitted": sep["fit"], "T": sep["temperature"],
                         "Δα_ℓ tied − independent [95 % interval]": [
                             _interval(v, lo, hi) for v, lo, hi in zip(sep["diff"], sep["lo"], sep["hi"])],
                         "replicates": sep["n"].astype(int)}).set_index("depths fitted")


def calibration_lines(cal: dict[str, results.Run]) -> str:
    """One line per calibration run: its training FLOPs, wall time, rate and threads."""
    return "\n".join(f"{kind}: {m['flop_total']:.2e} FLOP in {m['wall_time_s']:.0f} s of wall time, "
                     f"{m['gflop_per_s']} GFLOP/s on {m['torch_threads']} thread(s)"
                     for kind, m in ((kind, run.manifest) for kind, run in cal.items()))


# ---- the numbers the verdict states (depthlib.toy.chapter.measurements) ---------------------------------------
def protocol_exponents(parts: dict[str, results.Run | None]) -> tuple[pd.DataFrame | None, str | None, str, str]:
    """Chapter 3's calibration exponents (teacher, temperature, alpha, lo, hi, replicates), with how many of the
    fitted students are converged (``n_converged`` of ``n_students``), its profile and the protocol's name, from the
    protocol runs among chapter 3's shown ``parts``: the ``certified`` run (its envelope; converged = certified by a
    continuation) when the chapter shows one, else the ``converged`` run (its 1 % rule, which certifies nothing: its
    rows are undecided)."""
    run = parts.get("certified")
    if run is not None and {"alpha_summary", "certified"} <= set(run.tables()):
        summary = run.table("alpha_summary")
        summary = summary[summary["fit"] == "envelope"]
        students = run.table("certified")
        counts = students.groupby(["teacher", "temperature"])["certified"].agg(n_converged="sum", n_students="size")
        gains = students[~students["certified"]].groupby(["teacher", "temperature"])["last_continuation_gain"].agg(
            gain_lo="min", gain_hi="max")
        counts = counts.join(gains)
        return (summary.merge(counts.reset_index(), on=["teacher", "temperature"]), run.profile,
                "certified protocol", "certified")
    run = parts.get("converged")
    if run is None or "alpha_summary" not in run.tables():
        return None, None, "", ""
    best = run.table("best")
    counts = best.groupby(["teacher", "temperature"])["converged"].agg(n_converged="sum", n_students="size")
    return (run.table("alpha_summary").merge(counts.reset_index(), on=["teacher", "temperature"]), run.profile,
            "converged-loss protocol", "met its 1 % rule (a rule a schedule can meet, not a certificate)")


def certified_count(r) -> tuple[int, int]:
    """(certified, of) from a :func:`protocol_exponents` row (or the sum of several)."""
    return int(r["n_converged"]), int(r["n_students"])


def still_gaining(rows: pd.DataFrame) -> tuple[float, float] | None:
    """(least, most) last continuation gain of the uncertified students of :func:`protocol_exponents` ``rows``."""
    lo, hi = rows.get("gain_lo", pd.Series(dtype=float)).min(), rows.get("gain_hi", pd.Series(dtype=float)).max()
    return (float(lo), float(hi)) if np.isfinite(lo) and np.isfinite(hi) else None


def row_facts(parts: dict[str, results.Run | None], teacher: str, temperature: float) -> dict[str, str]:
    """The further numbers of a chapter 3 row (:attr:`depthlib.claims.Measurement.facts`), from its certified run:
    the envelope's α_ℓ fitted without its shallowest depths (``without_shallowest``, the fragility table's "without
    ℓ ≤ …" fit), the envelope's α_ℓ before the first and after the last round of continuations (``rounds``,
    "0.84 → 0.89") and how many held-out losses lie farther from their pool losses than the protocol allows
    (``far_from_pool``, "11 of 18")."""
    run = parts.get("certified")
    if run is None or not {"fragility", "certified"} <= set(run.tables()):
        return {}
    frag, cert = run.table("fragility"), run.table("certified")
    frag = frag[(frag["teacher"] == teacher) & np.isclose(frag["temperature"], temperature)
                & frag["fit"].str.startswith("without ℓ ≤")]
    cert = cert[(cert["teacher"] == teacher) & np.isclose(cert["temperature"], temperature)]
    out = {"far_from_pool": f"{int((~cert['within_gap']).sum())} of {len(cert)}"}
    if "alpha_rounds" in run.tables():
        rounds = run.table("alpha_rounds")
        rounds = rounds[(rounds["teacher"] == teacher) & np.isclose(rounds["temperature"], temperature)]
        if len(rounds) > 1:
            alpha = rounds.sort_values("round")["alpha"]
            out["rounds"] = f"{alpha.iloc[0]:.2f} → {alpha.iloc[-1]:.2f}"
    if len(frag):
        f = frag.iloc[0]
        out["without_shallowest"] = Measurement("", f["alpha"], f["lo"], f["hi"]).text(2)
    return out


def measurements(parts: dict[str, results.Run | None]) -> dict[str, list]:
    """Chapter 3's numbers for the verdict's claims: the tied and the independent teacher's α_ℓ (highest T), their
    paired difference and the tied α_ℓ at the lowest T, from the certified protocol run (its envelope; a number
    decides only where every student behind it is certified) or else the converged-loss protocol's (its 1 % rule
    certifies nothing) or else the calibration runs; and the phase diagram's student signature θ(Δh) at ρ = 0."""
    from depthlib.toy import analysis, chapter
    out: dict[str, list[Measurement]] = {}
    conv, conv_profile, protocol, word = protocol_exponents(parts)
    if conv is not None:
        certifies = word == "certified"          # only the certified protocol's students can decide a row

        def cell(teacher: str, r: pd.Series, settings: str) -> list[Measurement]:
            """The α_ℓ of one (teacher, T) row ``r`` of ``conv``, with how many of its students are certified."""
            return [Measurement(f"toy, {teacher} teacher, T = {r['temperature']:g}", float(r["alpha"]), float(r["lo"]),
                                float(r["hi"]), conv_profile, f"{protocol}{settings}; {int(r['n_converged'])} of "
                                f"{int(r['n_students'])} students {word}",
                                converged=certifies and bool(r["n_converged"] == r["n_students"]),
                                certified=certified_count(r) if certifies else None,
                                gaining=still_gaining(conv.loc[[r.name]]),
                                facts=row_facts(parts, teacher, float(r["temperature"])))]
        for teacher, key in (("tied", "tied_alpha"), ("independent", "independent_alpha")):
            t = conv[conv["teacher"] == teacher]
            if len(t):
                r = t.loc[t["temperature"].idxmax()]
                out[key] = cell(teacher, r, f", {int(r['replicates'])} replicate(s)")
        source = parts.get("certified" if certifies else "converged")
        sep = source.table("separation") if "separation" in source.tables() else pd.DataFrame()
        if len(sep):
            r = sep[sep["fit"] == "all depths"].iloc[0] if "fit" in sep else sep.iloc[0]
            at = conv[conv["temperature"] == float(r.get("temperature", 1.0))]
            out["tied_minus_independent"] = [Measurement(
                f"toy, tied − independent, T = {float(r.get('temperature', 1.0)):g}", float(r["diff"]), float(r["lo"]),
                float(r["hi"]), conv_profile, f"{protocol}, paired by replicate ({int(r['n'])}); "
                f"{int(at['n_converged'].sum())} of {int(at['n_students'].sum())} students {word}",
                converged=certifies and bool((at["n_converged"] == at["n_students"]).all()),
                certified=certified_count(at.sum(numeric_only=True)) if certifies else None, gaining=still_gaining(at))]
        tied = conv[conv["teacher"] == "tied"]
        if len(tied):
            out["low_t_incomplete"] = cell("tied", tied.loc[tied["temperature"].idxmin()], "")
    elif "calibration" in chapter.SHOWN_PARTS:
        cal = {kind: run for kind, run in chapter.calibration_parts(parts).items() if run is not None}
        if cal:
            summary = chapter.calibration_summary(cal)
            for _, r in summary.iterrows():
                key = "tied_alpha" if r["teacher"] == "tied" else "independent_alpha"
                prof = cal[r["teacher"]].profile
                out[key] = [Measurement(f"toy, {r['teacher']} teacher, T = {r['temperature']:g}", float(r["alpha"]),
                                        float(r["lo"]), float(r["hi"]), prof,
                                        f"toy-calibration run (no converged run yet): {int(r['steps']):,} steps, "
                                        "1 replicate, t interval of the fit")]
    run = parts.get("sweep")
    if run is not None:
        summary = analysis.signature_summary(run.table("signatures"), run.table("lag_cos"))
        students = summary[(summary["net"] == "student") & (summary["rho"] == 0)]["theta_update"]
        if len(students):
            out["student_signatures"] = [Measurement(
                "toy students, ρ = 0 (phase diagram)", float(students.mean()), float(students.min()),
                float(students.max()), run.profile, f"mean over {len(students)} (T, depth) cells; range, not a "
                f"95 % interval; {run.config['steps']:,}-step students, not certified", converged=False)]
    return out

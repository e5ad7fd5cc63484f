"""The book's verdict: one row per claim of the paper, generated from the runs the chapters show.

Each row states a claim of Liu et al. (arXiv 2602.05970), the paper's value, the book's number with its 95 %
interval, the model and profile it comes from, a status and the section that shows it. The numbers are read from
the runs each chapter's notebook shows: its own ``runs`` looked up without computing
(:func:`depthlib.selection.shown_runs`), so recomputing a chapter's run changes its rows the next time the book is
built, and a missing run leaves its rows *not tested here*.

The claims, their regions and **the status rule** are :mod:`depthlib.claims`'s.

Each chapter is read by one small adapter function (``_chapter1`` … ``_chapter7``) that takes the parts its
notebook shows; all the numbers come from the chapters' public analysis functions.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.chapters import by_name
from depthlib.claims import (  # noqa: F401 - the verdict's one namespace: claims, the rule and the t interval
    CLAIMS,
    PI,
    SECTIONS,
    STATUSES,
    Claim,
    Measurement,
    gain_range,
    region_status,
    status,
    t_interval,
)
from depthlib.errors import InputError
from depthlib.selection import shown_runs

#: how a row covering several models is summarised: the weakest status wins
_WEAKNESS = {"not tested here": 5, "contradicted": 4, "undecided": 3, "differs": 2, "holds": 0, "reproduced": 0}


@dataclass
class Row:
    claim: Claim
    measurements: list[Measurement] = field(default_factory=list)
    note: str = ""

    @property
    def status(self) -> str:
        if not self.measurements:
            return "not tested here"
        each = [status(self.claim.paper, self.claim.region, m.value, m.lo, m.hi)
                if m.converged and m.lo is not None and m.hi is not None else "undecided"
                for m in self.measurements]
        return max(each, key=_WEAKNESS.__getitem__)

    @property
    def how_much(self) -> str:
        """For a row that *differs*: how far the paper's value lies outside each interval that misses it."""
        c, out = self.claim, []
        for m in self.measurements:
            if (c.paper is None or m.lo is None or m.hi is None or not m.converged
                    or status(c.paper, c.region, m.value, m.lo, m.hi) != "differs"):
                continue
            k = 100.0 if c.percent else 1.0
            gap, side = (c.paper - m.hi, "above") if c.paper > m.hi else (m.lo - c.paper, "below")
            out.append(f"the paper's value is {_fmt(k * gap, c.digits)}{' points' if c.percent else ''} {side} "
                       + (f"{m.model}'s interval" if len(self.measurements) > 1 else "the interval"))
        return "; ".join(out)

    @property
    def why(self) -> str:
        """What the status alone does not say: for a row that *differs*, by how much (:attr:`how_much`); for an
        *undecided* one, what keeps each of its undecided measurements from deciding."""
        if self.status == "differs":
            return self.how_much
        if self.status != "undecided":
            return ""
        labels = short_labels([m.model for m in self.measurements])
        reasons = [(label, undecided_because(self.claim, m)) for label, m in zip(labels, self.measurements)]
        return "; ".join(why if len(self.measurements) == 1 else f"{label}: {why}" for label, why in reasons if why)


def short_labels(models: Sequence[str]) -> list[str]:
    """The labels of a row's several models, as short as still tells them apart: the text before the first comma
    ("looped, effective depths 3, 4 (unseen RHM; root error)" → "looped"), and where that is not unique, with what
    its parenthesis says that the others' do not ("untied (root error)"); else the whole labels. One model keeps its
    whole label (its depths or teacher are then what the cell says)."""
    if len(models) < 2:
        return list(models)
    heads = [m.split(",")[0] for m in models]
    if len(set(heads)) == len(heads):
        return heads
    notes = [m[m.rfind("(") + 1:m.rfind(")")].split("; ") if m.endswith(")") else [] for m in models]
    shared = set.intersection(*map(set, notes))
    own = [[x for x in n if x not in shared] for n in notes]
    out = [f"{h} ({'; '.join(o)})" for h, o in zip(heads, own)]
    return out if all(own) and len(set(out)) == len(out) else list(models)


def undecided_because(claim: Claim, m: Measurement) -> str:
    """Why ``m`` cannot decide ``claim`` ("" where it decides): no number (the row's note says why; how many students
    are certified); students or models not certified (how many are, and what the others' last continuations still
    gained); no interval; or an interval across an edge of the claim's region."""
    if not math.isfinite(m.value):
        return "no result" + (f" ({m.certified[0]} of {m.certified[1]} certified)" if m.certified else "")
    if not m.converged:
        if m.certified is None:
            return "not certified"
        text = f"{m.certified[0]} of {m.certified[1]} certified"
        if m.gaining is not None:
            text += f"; the others' last continuations still gained {gain_range(m.gaining)}"
        return text
    if m.lo is None or m.hi is None or not (math.isfinite(m.lo) and math.isfinite(m.hi)):
        return "no interval"
    if status(claim.paper, claim.region, m.value, m.lo, m.hi) != "undecided":
        return ""
    k, (r_lo, r_hi) = (100.0 if claim.percent else 1.0), claim.region
    edges = [e for e, crossed in ((r_lo, m.lo < r_lo <= m.hi), (r_hi, m.lo <= r_hi < m.hi)) if crossed]
    return "the interval reaches across the region's edge " + " and ".join(_fmt(k * e, claim.digits) for e in edges)


# ---- small computations the chapters do not make ---------------------------------------------------------
def percentile_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return math.nan, math.nan
    q = (1 - level) / 2
    return float(np.quantile(v, q)), float(np.quantile(v, 1 - q))


def wilson_interval(share: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion ``share`` of ``n`` draws."""
    if n <= 0:
        raise InputError("a proportion needs at least one draw")
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def optimum_exponents(alpha_m: np.ndarray, alpha_l: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """m ∝ ℓ^x and loss ∝ N^−y at the width–depth optimum (:func:`depthlib.scaling.law.width_depth_optimum`),
    vectorised over bootstrap resamples: x = α_ℓ/α_m, y = α_m α_ℓ / (2 α_ℓ + α_m)."""
    a_m, a_l = np.asarray(alpha_m, float), np.asarray(alpha_l, float)
    return a_l / a_m, a_m * a_l / (2 * a_l + a_m)


def middle_angle_per_doc(docs: pd.DataFrame) -> np.ndarray:
    """Each document's mean middle-block angle (chapter 2's ``docs`` table: θ_0 … θ_{L−1} per document)."""
    from depthlib.measures import middle_blocks
    cols = sorted((c for c in docs.columns if c.startswith("theta_") and c[6:].isdigit()), key=lambda c: int(c[6:]))
    return docs[cols].to_numpy(float)[:, middle_blocks(len(cols))].mean(1)


def middle_update_angle(layers: pd.DataFrame) -> tuple[float, float]:
    """(mean θ(Δh) over the middle pairs, its token-level standard error) from chapter 2's ``layers`` table."""
    from depthlib.measures import middle_update_pairs
    dh = layers[layers["metric"] == "theta_dh"].sort_values("layer")
    if dh.empty:
        return math.nan, math.nan
    n_blocks = len(dh) + 1
    mid = dh.iloc[middle_update_pairs(n_blocks)]
    se = float((mid["std"] / np.sqrt(mid["count"])).mean())     # as if every pair moved together: the larger SE
    return float(mid["mean"].mean()), se


# ---- one adapter per chapter: the runs its notebook shows (never computed) and their numbers -----------------
def _shown(chapter: str, profile: str, rerun: bool, **kwargs) -> dict[str, results.Run | None]:
    """The runs ``chapter``'s notebook shows for ``profile``, by part (its own ``runs``, looked up without computing:
    :func:`depthlib.selection.shown_runs`); a part without a run is None."""
    return shown_runs(by_name(chapter).module.runs, profile, rerun=rerun, **kwargs)


def _chapter1(profile: str, rerun: bool) -> dict[str, list[Measurement]]:
    from depthlib.scaling import chapter, law
    try:
        chapter.csv_sha256()
    except Exception:  # noqa: BLE001 - no CSV here: the chapter's rows are then not tested
        return {}
    run = _shown("scaling", profile, rerun)["fits"]
    if run is None:
        return {}
    boot, scan = run.table("bootstrap"), run.table("exclusion_scan")
    k = run.config["exclude"]
    row = scan[(scan["exclude"] == k) & (scan["depth_offset"] == 0)].iloc[0]
    summary = law.bootstrap_summary(boot)["alpha_l"]
    model = f"Chinchilla ({len(boot)} bootstrap resamples, {k} highest losses excluded)"
    x, y = optimum_exponents(boot["alpha_m"], boot["alpha_l"])
    x0, y0 = optimum_exponents(np.array([row["alpha_m"]]), np.array([row["alpha_l"]]))
    return {
        "chinchilla_alpha": [Measurement(model, float(row["alpha_l"]), summary["lo"], summary["hi"], run.profile,
                                         "converged fit; 95 % bootstrap percentile interval")],
        "width_depth": [Measurement(model, float(x0[0]), *percentile_interval(x), run.profile,
                                    "α_ℓ/α_m of the converged fit; bootstrap interval")],
        "n_exponent": [Measurement(model, float(y0[0]), *percentile_interval(y), run.profile,
                                   "α_m α_ℓ/(2α_ℓ + α_m); bootstrap interval")],
    }


def _chapter2(profile: str, rerun: bool) -> dict[str, list[Measurement]]:
    from depthlib.probes import chapter, trajectory
    out: dict[str, list[Measurement]] = {"tokens_evenly": [], "middle_angle": [], "update_angle": []}
    for model, run in chapter.model_runs(_shown("probes", profile, rerun)).items():
        if run is None:
            continue
        if "tokens" in run.tables():
            tokens = run.table("tokens")
            share = trajectory.analyze_trajectories(trajectory.theta_matrix(tokens)).fractions["evenly"]
            out["tokens_evenly"].append(Measurement(model, share, *wilson_interval(share, len(tokens)), run.profile,
                                                    f"{len(tokens)} sampled tokens; Wilson interval"))
        per_doc = middle_angle_per_doc(run.table("docs"))
        mean, se = float(per_doc.mean()), float(per_doc.std(ddof=1) / math.sqrt(len(per_doc)))
        out["middle_angle"].append(Measurement(model, mean, *t_interval(mean, se, len(per_doc) - 1), run.profile,
                                               f"mean over {len(per_doc)} documents; t interval"))
        dh, dh_se = middle_update_angle(run.table("layers"))
        out["update_angle"].append(Measurement(model, dh, dh - 1.96 * dh_se, dh + 1.96 * dh_se, run.profile,
                                               "token-level interval (tokens of a document are not independent)"))
    return out


def _converged_summary(parts: dict[str, results.Run | None]) -> tuple[pd.DataFrame | None, str | None, str, str]:
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


def _count(r) -> tuple[int, int]:
    """(certified, of) from a :func:`_converged_summary` row (or the sum of several)."""
    return int(r["n_converged"]), int(r["n_students"])


def _gaining(rows: pd.DataFrame) -> tuple[float, float] | None:
    """(least, most) last continuation gain of the uncertified students of :func:`_converged_summary` ``rows``."""
    lo, hi = rows.get("gain_lo", pd.Series(dtype=float)).min(), rows.get("gain_hi", pd.Series(dtype=float)).max()
    return (float(lo), float(hi)) if np.isfinite(lo) and np.isfinite(hi) else None


def _toy_facts(parts: dict[str, results.Run | None], teacher: str, temperature: float) -> dict[str, str]:
    """:data:`FACTS` of a chapter 3 row, from its certified run: the envelope's α_ℓ fitted without its shallowest
    depths (``without_shallowest``, the fragility table's "without ℓ ≤ …" fit), the envelope's α_ℓ before the first
    and after the last round of continuations (``rounds``, "0.84 → 0.89") and how many held-out losses lie farther
    from their pool losses than the protocol allows (``far_from_pool``, "11 of 18")."""
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
        out["without_shallowest"] = _number(Measurement("", f["alpha"], f["lo"], f["hi"]), 2)
    return out


def _chapter3(profile: str, rerun: bool) -> dict[str, list[Measurement]]:
    from depthlib.toy import analysis, chapter
    parts = _shown("toy", profile, rerun, parts=chapter.SHOWN_PARTS)
    out: dict[str, list[Measurement]] = {}
    conv, conv_profile, protocol, word = _converged_summary(parts)
    if conv is not None:
        certifies = word == "certified"          # only the certified protocol's students can decide a row
        for teacher, key in (("tied", "tied_alpha"), ("independent", "independent_alpha")):
            t = conv[conv["teacher"] == teacher]
            if len(t):
                r = t.loc[t["temperature"].idxmax()]
                out[key] = [Measurement(f"toy, {teacher} teacher, T = {r['temperature']:g}", float(r["alpha"]),
                                        float(r["lo"]), float(r["hi"]), conv_profile,
                                        f"{protocol}, {int(r['replicates'])} replicate(s); "
                                        f"{int(r['n_converged'])} of {int(r['n_students'])} students {word}",
                                        converged=certifies and bool(r["n_converged"] == r["n_students"]),
                                        certified=_count(r) if certifies else None,
                                        gaining=_gaining(t.loc[[t["temperature"].idxmax()]]),
                                        facts=_toy_facts(parts, teacher, float(r["temperature"])))]
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
                certified=_count(at.sum(numeric_only=True)) if certifies else None, gaining=_gaining(at))]
        tied = conv[conv["teacher"] == "tied"]
        if len(tied):
            r = tied.loc[tied["temperature"].idxmin()]
            out["low_t_incomplete"] = [Measurement(f"toy, tied teacher, T = {r['temperature']:g}", float(r["alpha"]),
                                                   float(r["lo"]), float(r["hi"]), conv_profile,
                                                   f"{protocol}; {int(r['n_converged'])} of "
                                                   f"{int(r['n_students'])} students {word}",
                                                   converged=certifies and bool(r["n_converged"] == r["n_students"]),
                                                   certified=_count(r) if certifies else None,
                                                   gaining=_gaining(tied.loc[[tied["temperature"].idxmin()]]),
                                                   facts=_toy_facts(parts, "tied", float(r["temperature"])))]
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


def _chapter4(profile: str, rerun: bool) -> dict[str, list[Measurement]]:
    from depthlib import tracing
    run = _shown("tracing", profile, rerun)["trace"]
    if run is None:
        return {}
    tables = tracing.chapter_tables(run)
    groups = tracing.functional_groups(tables["facts"], "block", tables["baseline"])
    out = []
    for _, g in groups.iterrows():
        half = 1 / (2 * g["n_layers"])      # the crossover is known to one block
        out.append(Measurement(g["model"], float(g["early_to"]), float(g["early_to"]) - half,
                               float(g["early_to"]) + half, run.profile,
                               f"{int(g['n_facts'])} facts; ± half a block; the late group's effect arrives at one "
                               f"block ({g['late_step_from']:.2f} → {g['late_step_to']:.2f})"))
    return {"functional_groups": out}


def _chapter5(profile: str, rerun: bool) -> dict[str, list[Measurement]]:
    from depthlib.interventions import analysis, chapter
    runs = {part: run for part, run in _shown("interventions", profile, rerun).items() if run is not None}
    if "toy" not in runs or len(runs) == 1:
        return {"order_matters_little": []}
    table = analysis.prediction_table(chapter.statistics(runs), [m for m in runs if m != "toy"])
    rows = table[(table["statistic"] == "order_ratio") & (table["scope"] == "middle")
                 & ~table["model"].str.startswith("toy")] if len(table) else table
    students = runs["toy"].table("students")
    controls = (f"controls: {len(students)} of chapter 3's students at ℓ = {int(students['depth'].iloc[0])}"
                + (f", {int(students['certified'].sum())} certified" if "certified" in students else ""))
    out = []
    for r in rows.itertuples():
        usable = bool(r.held_on_control and r.separates_controls)
        why = (f"reading: {r.reading} (controls separate at {r.threshold:.3g})" if usable else
               "not applied: " + ("the prediction failed on its control" if not r.held_on_control
                                  else "the two controls do not separate"))
        out.append(Measurement(r.model, r.value, r.lo, r.hi, profile,
                               f"reordering ÷ deleting the same blocks, 95 % bootstrap over documents; {why}; "
                               f"{controls}", converged=usable))
    return {"order_matters_little": out}


def _chapter6(profile: str, rerun: bool) -> dict[str, list[Measurement]]:
    from depthlib.lm import analysis
    parts = _shown("lm", profile, rerun)
    if parts.get("converged") is not None:     # the series trained until α_ℓ stops moving supersedes the 2 M-token one
        from depthlib.lm import converged_views
        return converged_views.measurements(parts["converged"])
    run = parts["series"]
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


def _chapter7(profile: str, rerun: bool) -> dict[str, list[Measurement]]:
    from depthlib.compose import analysis
    parts = _shown("compose", profile, rerun)
    run, hierarchy = parts.get("rhm"), parts.get("hierarchy")
    out: dict[str, list[Measurement]] = {"hierarchical": [], "looped": []}
    if hierarchy is not None:       # the unseen, certified control supersedes the first grammar
        from depthlib.compose import hierarchy_views
        what = {"leaf": "next-leaf excess", "root": "root error"}     # excess over the exact Bayes loss
        for claim, ms in hierarchy_views.measurements(hierarchy).items():
            out[claim] = [Measurement(f"{m['family']}, effective depths {m['depths']} (unseen RHM; {what[m['task']]})",
                                      m["value"], m["lo"], m["hi"], hierarchy.profile, m["note"],
                                      converged=m["certified"], certified=m["certified_of"],
                                      gaining=m["gaining"]) for m in ms]
    elif run is not None:
        # its members met a rule of little change at the end of their schedule, which certifies nothing (chapter 3)
        for r in analysis.alpha_table(run).itertuples():
            if not r.defined:
                continue
            law = "excess over the Bayes loss" if r.law == "excess" else "L∞ + c·ℓ^−α, free floor"
            m = Measurement(f"{r.family}, effective depths {r.depths} (RHM; {law})", r.value, r.lo, r.hi,
                            run.profile, f"95 % t interval over {r.n_seeds} replicates; members not certified",
                            converged=False)
            out["hierarchical" if r.family == "untied" else "looped"].append(m)
    looped_toy = parts.get("toy_certified")
    if looped_toy is not None:          # looped students of chapter 3's teachers, certified
        from depthlib.compose import looped_views
        for claim, ms in looped_views.measurements(looped_toy).items():
            out[claim] = [Measurement(f"looped students of the {m['teacher']} teacher, ℓ = {m['depths']} (T = 1)",
                                      m["value"], m["lo"], m["hi"], looped_toy.profile, m["note"],
                                      converged=m["certified"], certified=m["certified_of"],
                                      facts=m.get("facts", {})) for m in ms]
    certified_text = parts.get("text_certified")
    if certified_text is not None:      # the families at chapter 6's certified budget
        from depthlib.compose import text_certified_views
        out["looped_text"] = [
            Measurement(f"{m['family']}, effective depths {m['depths']} (text at chapter 6's certified budget; "
                        "L∞ + c·ℓ^−α)", m["value"], m["lo"], m["hi"], certified_text.profile, m["note"],
                        converged=m["certified"], certified=m["certified_of"])
            for m in text_certified_views.measurements(certified_text)]
    return out


ADAPTERS: dict[int, Callable[[str, bool], dict[str, list[Measurement]]]] = {
    1: _chapter1, 2: _chapter2, 3: _chapter3, 4: _chapter4, 5: _chapter5, 6: _chapter6, 7: _chapter7}

NOTES = {
    "tokens_evenly": "the two-cluster split tests only \"does not stop early\"; the small cluster is about the "
                     "position-0 share (one first token per document)",
    "angle_depth": "both ensemble averaging and procedural assembly predict 1/ℓ: this row cannot tell them apart",
    "functional_groups": "with window-1 restoration any single attention transfer makes a one-block step, so the "
                         "trace cannot tell a compositional site from an ensemble",
    "order_matters_little": "not a claim of the paper; a prediction of the ensemble reading",
    "hierarchical": "the untied family on the grammar (the first grammar: two laws, the excess over the exact "
                    "Bayes loss and the paper's form with a free floor; the unseen control: the certified quantity of "
                    "each task)",
    "looped": "one row for the looped and the fully tied family (the weakest status wins)",
    "looped_toy_flow": "with the next row, a calibration of reuse on a known target: chapter 3's tied teacher is one "
                       "block reused, and a looped student starting from that block follows it",
    "looped_toy_plateau": "where the untied students of the same teacher keep gaining with depth, the looped "
                          "students' loss stops falling: one block reused does not stand in for 128 different ones",
    "looped_text": "one seed (the interval is over held-out documents); where the loss does not fall "
                   "with effective depth, or one depth moves the fit to a bound, no exponent is given: the run "
                   "cannot decide",
}


def verdict(profile: str = "cpu", *, rerun: bool = False, chapters: Sequence[int] | None = None) -> list[Row]:
    """One :class:`Row` per claim (in :data:`CLAIMS` order), from the runs the chapters show for ``profile``."""
    results.check_profile(profile)
    wanted = set(ADAPTERS) if chapters is None else set(chapters)
    found: dict[str, list[Measurement]] = {}
    failed: dict[int, str] = {}
    for number, adapter in ADAPTERS.items():
        if number in wanted:
            try:
                found.update(adapter(profile, rerun))
            except Exception as err:  # noqa: BLE001 - one unreadable chapter must not hide the others' rows
                failed[number] = f"{type(err).__name__}: {err}"
                print(f"[depthlib verdict] chapter {number}: {failed[number]}", file=sys.stderr)
    rows = []
    for c in CLAIMS:
        if c.chapter not in wanted:
            continue
        # a run without a number it can stand behind (value NaN) leaves its row undecided, never untested
        ms = [m for m in found.get(c.key, []) if m.value is not None
              and (math.isfinite(m.value) or not m.converged)]
        # a number from students that are still improving decides nothing: say how many were not converged
        note = "; ".join(n for n in (NOTES.get(c.key, ""),
                                     *(m.note for m in ms if not m.converged and m.note)) if n)
        if c.chapter in failed:
            note = f"its run could not be read ({failed[c.chapter]})"
        rows.append(Row(c, ms, note))
    return rows


# ---- how the book prints it ------------------------------------------------------------------------------
def _fmt(x: float, digits: int) -> str:
    return "∞" if math.isinf(x) else f"{x:.{digits}f}"


def _number(m: Measurement, digits: int, percent: bool = False) -> str:
    k, unit = (100.0, " %") if percent else (1.0, "")
    if not math.isfinite(m.value):              # a run that gives no number it can stand behind (undecided)
        return "no result"
    text = _fmt(k * m.value, digits)
    if m.lo is not None and m.hi is not None and math.isfinite(m.lo) and math.isfinite(m.hi):
        text += f" [{_fmt(k * m.lo, digits)}, {_fmt(k * m.hi, digits)}]"
    return text + unit


def numbers(row: Row) -> dict[str, str]:
    """{model: "value [lo, hi]"} of a row, printed as the verdict table prints them (a chapter's answer quotes these,
    so its numbers are the table's); several models by their :func:`short_labels`."""
    c = row.claim
    return {label: _number(m, c.digits, c.percent)
            for label, m in zip(short_labels([m.model for m in row.measurements]), row.measurements)}


def table(rows: Sequence[Row]) -> pd.DataFrame:
    """The verdict as a reader's table: one row per claim, numbers formatted, no NaN cells."""
    out = []
    for r in rows:
        c = r.claim
        ms = r.measurements
        out.append({
            "chapter": c.chapter, "claim": c.claim, "paper": c.paper_text,
            "this book (95 % interval)": "; ".join(f"{label}: {text}" for label, text in numbers(r).items()) or "—",
            "profile": ", ".join(sorted({m.profile or "?" for m in ms})) or "—",
            "status": r.status + (f" ({r.why})" if r.why else ""), "holds if": c.region_text})
    return pd.DataFrame(out)


def markdown(rows: Sequence[Row], link: Callable[[Claim], str] | None = None) -> str:
    """A MyST markdown table of the rows; ``link`` gives each row's section link (default: a ``{ref}`` role)."""
    link = link or (lambda c: f"{{ref}}`ch. {c.chapter} <{c.section}>`")
    lines = ["| claim | paper | holds if | this book: value [95 % interval] · model | profile | status | section |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.claim
        numbers = "<br>".join(f"{_number(m, c.digits, c.percent)} · {m.model}" for m in r.measurements) or "—"
        note = f" <br><small>{r.note}</small>" if r.note else ""
        profile = ", ".join(sorted({m.profile or "?" for m in r.measurements})) or "—"
        much = f" <br><small>{r.why}</small>" if r.why else ""
        lines.append(f"| {c.claim}{note} | {c.paper_text} | {c.region_text} | {numbers} | {profile} | "
                     f"**{r.status}**{much} | {link(c)} |")
    return "\n".join(lines) + "\n"


RULE_TEXT = ("**How a status is decided.** Each claim holds *qualitatively* in a region of values bounded half-way "
             "between the paper's value and what the rival mechanism predicts (column *holds if*). A 95 % interval "
             "wholly outside the region: **contradicted**; reaching outside it: **undecided** (the run cannot "
             "decide, and the row says why); inside it and containing the paper's value: **reproduced**; inside it "
             "but missing the paper's value: **differs** (the direction holds, the number does not); for the book's "
             "own predictions (no paper value), inside it: **holds**; no run: **not tested here**. A number from "
             "students or models that are still improving (not certified), or a number without an interval, is "
             "**undecided**. A row over several models shows the weakest status.")


def chapter_table(chapter: int, profile: str = "cpu", *, rerun: bool = False) -> pd.DataFrame:
    """The compact verdict table of one chapter, for its conclusion: one row per claim, indexed by the claim."""
    rows = verdict(profile, rerun=rerun, chapters=[chapter])
    cols = ["claim", "paper", "holds if", "this book (95 % interval)", "profile", "status"]
    return table(rows)[cols].set_index("claim")


def chapter_summary(chapter: int, profile: str = "cpu", *, rerun: bool = False) -> str:
    """One markdown bullet per claim of a chapter: the book's number and the status (a chapter's opening answer)."""
    lines = []
    for r in verdict(profile, rerun=rerun, chapters=[chapter]):
        c = r.claim
        numbers = "; ".join(f"{m.model}: {_number(m, c.digits, c.percent)}" for m in r.measurements) or "no run"
        lines.append(f"- {c.claim} (paper: {c.paper_text}; holds if {c.region_text}) — {numbers} → **{r.status}**"
                     + (f" ({r.measurements[0].note})" if r.measurements and r.measurements[0].note else ""))
    return "\n".join(lines)


def reductions(profile: str = "cpu") -> list[str]:
    """One line per chapter (:data:`depthlib.chapters.CHAPTERS`): how the ``profile``'s runs are reduced against the
    paper's (steps, tokens, models, replicates), each chapter's own ``reduction``, read from its ``PROFILES``."""
    from depthlib import chapters
    results.check_profile(profile)
    return [f"**{c.number}.** {c.module.reduction(profile)}" for c in chapters.CHAPTERS]


#: the box every page built from ``smoke`` runs carries
PLACEHOLDER_BOX = ("```{warning}\n**Placeholder numbers.** This page was built from `smoke` runs, which only prove that "
                   "the code runs end to end: their numbers mean nothing. Build with `make book` (profile `cpu`) for "
                   "the book's results.\n```")


def tally(rows: Sequence[Row]) -> str:
    """How many claims have each status: "20 claims: 2 reproduced, …, 1 contradicted"."""
    counts = pd.Series([r.status for r in rows]).value_counts()
    return f"{len(rows)} claims: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if s in counts)


#: the further numbers (:attr:`Measurement.facts`) each claim's row offers the prose, ``<key>_<name>``
FACTS = {"tied_alpha": ("without_shallowest", "rounds"), "independent_alpha": ("without_shallowest", "rounds"),
         "low_t_incomplete": ("far_from_pool",), "looped_toy_flow": ("scratch",)}


def substitutions(rows: Sequence[Row]) -> dict[str, str]:
    """What the hand-written pages quote from the verdict, by name, for MyST's ``{{ name }}`` substitutions (the book build
    puts them in the staged ``_config.yml``): ``tally`` (:func:`tally`), ``n_<status>`` (spaces as ``_``), and for each
    claim ``<key>_status``, ``<key>_value`` (its numbers as the table prints them, "; "-joined with the model where a
    row has several; "no run" without one) and ``<key>_certified`` ("2 of 18" students or members certified where a
    continuation certifies them, per model as the values; else "no certificate") and ``<key>_gains`` ("4.3–11.7 %":
    what the last continuations of the others still gained; else "not measured") and ``<key>_<fact>`` for the
    further numbers of :data:`FACTS` ("not measured" where a run has none). Every name exists for every profile.
    So a recomputed run changes the prose that quotes it, as it changes the table."""
    out = {"tally": tally(rows)}
    out |= {f"n_{s.replace(' ', '_')}": str(sum(r.status == s for r in rows)) for s in STATUSES}
    for r in rows:
        k, shown = r.claim.key, numbers(r)
        out[f"{k}_status"] = r.status
        out[f"{k}_value"] = _per_model(shown, "no run")
        labels = list(zip(short_labels([m.model for m in r.measurements]), r.measurements))
        out[f"{k}_certified"] = _per_model({label: f"{m.certified[0]} of {m.certified[1]}" for label, m in labels
                                            if m.certified is not None}, "no certificate")
        out[f"{k}_gains"] = _per_model({label: gain_range(m.gaining) for label, m in labels
                                        if m.gaining is not None}, "not measured")
        for name in FACTS.get(k, ()):
            out[f"{k}_{name}"] = _per_model({label: m.facts[name] for label, m in labels if name in m.facts},
                                            "not measured")
    return out


def _per_model(texts: dict[str, str], none: str) -> str:
    """One model's text as it is; several models' "; "-joined, each with its model; ``none`` without any."""
    if len(texts) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"{model}: {text}" for model, text in texts.items()) or none


def book_page(profile: str = "cpu", *, rerun: bool = False, rows: Sequence[Row] | None = None) -> str:
    """The verdict as the book's intro includes it: the count of each status, the table, how a status is decided, and
    how reduced the runs are. Regenerated at every build, so a recomputed run changes it. ``rows``: the verdict of
    ``profile`` if already computed."""
    rows = verdict(profile, rerun=rerun) if rows is None else rows
    lines = [PLACEHOLDER_BOX, ""] if profile == "smoke" else []
    lines += [f"**{tally(rows)}.**", "", "```{container} verdict", markdown(rows), "```", "", RULE_TEXT,
              "",
             f"**How reduced these runs are** (profile `{profile}`; every number above can change at the paper's "
             "scale):", ""]
    lines += [f"- {line}" for line in reductions(profile)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m depthlib.verdict [--profile cpu] [--markdown]`` prints the verdict of the runs found."""
    parser = argparse.ArgumentParser(prog="python -m depthlib.verdict", description=main.__doc__)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--markdown", action="store_true", help="print the book's markdown (the intro's verdict)")
    args = parser.parse_args(argv)
    try:
        rows = verdict(args.profile)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.markdown:
        print(book_page(args.profile))
    else:
        with pd.option_context("display.max_colwidth", 90, "display.width", 250):
            print(table(rows).drop(columns="holds if").to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

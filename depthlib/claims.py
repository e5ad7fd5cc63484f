"""The paper's claims the book tests, each with the region where it holds, and the written rule that gives a number
its status (used by :mod:`depthlib.verdict`, which assembles the rows from the runs, and by the chapters' views,
whose own rows follow the same rule).

**The status rule** (:func:`status`). Each claim has the paper's value and a *region*: the values for which the
claim holds qualitatively, bounded half-way between the paper's value and what the rival mechanism predicts (e.g.
α_ℓ below 2, half-way between ensemble averaging's 1 and procedural assembly's 3). With the book's 95 % interval
[lo, hi] (a point when there is none):

1. no number → **not tested here**;
2. the interval lies wholly outside the region → **contradicted**;
3. the interval reaches outside the region (it straddles an edge) → **undecided**: the run cannot decide; so is a
   number without an interval, or from students or models that are still improving (not certified, still moving);
4. the interval lies inside the region and contains the paper's value → **reproduced**;
5. inside the region but missing the paper's value → **differs** (the qualitative claim holds, the number does not:
   the table says by how much).

A claim without a paper value (the book's own predictions) **holds** under rules 4 and 5. A row that covers several
models takes the weakest of their statuses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from depthlib.errors import InputError

STATUSES = ("reproduced", "holds", "differs", "undecided", "contradicted", "not tested here")


def gain_range(gains) -> str:
    """The least and most of ``gains`` (fractions, e.g. what the last continuations of uncertified students still
    gained) as per cent, "4.3–11.7 %"; "" without any (NaN ignored)."""
    g = [float(x) for x in gains if x == x]
    return f"{100 * min(g):.1f}–{100 * max(g):.1f} %" if g else ""


def fmt(x: float, digits: int) -> str:
    """``x`` to ``digits`` decimals; "∞" for an infinite bound."""
    return "∞" if math.isinf(x) else f"{x:.{digits}f}"


@dataclass(frozen=True)
class Measurement:
    """The book's number for one claim on one model: value, 95 % interval (None: no interval), where it is from."""

    model: str
    value: float
    lo: float | None = None
    hi: float | None = None
    profile: str | None = None
    note: str = ""
    converged: bool = True      # False: from students or models still improving: undecided
    certified: tuple[int, int] | None = None    # (certified, of) the students behind the number, where one certifies
    # (least, most) of what the last continuation of each uncertified student behind the number still gained, as a
    # fraction of its held-out loss: why a certificate is missing (None where not measured, or all are certified)
    gaining: tuple[float, float] | None = None
    # further numbers of the run behind it that the book's prose quotes, by name (:data:`depthlib.verdict.FACTS`),
    # formatted as the chapter prints them: e.g. the exponent without the shallowest depths
    facts: dict[str, str] = field(default_factory=dict)

    def text(self, digits: int, percent: bool = False) -> str:
        """"value [lo, hi]" as the verdict prints it (percentages with ``percent``); "no result" without a number."""
        k, unit = (100.0, " %") if percent else (1.0, "")
        if not math.isfinite(self.value):        # a run that gives no number it can stand behind (undecided)
            return "no result"
        out = fmt(k * self.value, digits)
        if self.lo is not None and self.hi is not None and math.isfinite(self.lo) and math.isfinite(self.hi):
            out += f" [{fmt(k * self.lo, digits)}, {fmt(k * self.hi, digits)}]"
        return out + unit


@dataclass(frozen=True)
class Claim:
    """One claim of the paper (or, with ``paper`` None, one prediction the book tests), with its region."""

    key: str
    chapter: int
    claim: str
    paper: float | None
    paper_text: str
    region: tuple[float, float]
    region_text: str
    section: str                       # a MyST label in the chapter's notebook (see :data:`SECTIONS`)
    digits: int = 2
    percent: bool = False              # print values as percentages


def status(paper: float | None, region: tuple[float, float], value: float | None,
           lo: float | None = None, hi: float | None = None) -> str:
    """The status of one measurement under the module's written rule (see the module docstring)."""
    if value is None or not math.isfinite(value):
        return "not tested here"
    lo = value if lo is None or not math.isfinite(lo) else lo
    hi = value if hi is None or not math.isfinite(hi) else hi
    if lo > hi:
        raise InputError(f"interval [{lo}, {hi}] has lo > hi")
    r_lo, r_hi = region
    if hi < r_lo or lo > r_hi:
        return "contradicted"
    if lo < r_lo or hi > r_hi:
        return "undecided"
    if paper is None:
        return "holds"
    if lo <= paper <= hi:
        return "reproduced"
    return "differs"


def region_status(claim: "Claim", value: float, lo: float, hi: float) -> tuple[str, str]:
    """A part's own verdict row on ``claim``'s region, in three words, and why: *holds* (the interval lies inside the
    region: :func:`status` says reproduced, holds or differs), *contradicted* (wholly outside) or *undecided*
    (straddling an edge, or no interval)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undecided", "no interval"
    s = status(claim.paper, claim.region, value, lo, hi)
    if s in ("reproduced", "holds", "differs"):
        paper = "" if claim.paper is None else (f"; it {'contains' if lo <= claim.paper <= hi else 'misses'} the "
                                               f"paper's {claim.paper:g}")
        return "holds", f"the interval [{lo:.2f}, {hi:.2f}] lies inside the region{paper}"
    if s == "contradicted":
        return "contradicted", f"the interval [{lo:.2f}, {hi:.2f}] lies wholly outside the region"
    return "undecided", f"the interval [{lo:.2f}, {hi:.2f}] straddles an edge of the region"


PI = math.pi
#: a loss "plateaus" when its local exponent −Δlog L/Δlog ℓ between the two deepest depths lies below this (95 %
#: upper bound): a loss that falls by less than 7 % when the depth doubles (2^−0.1 = 0.93), a tenth of ensemble
#: averaging's rate (chapter 7's looped toy students)
PLATEAU_SLOPE = 0.1
CLAIMS: tuple[Claim, ...] = (
    Claim("chinchilla_alpha", 1, "Loss falls as 1/ℓ on the Chinchilla runs: α_ℓ ≈ 1", 1.2, "1.2 ± 0.3",
          (0.0, 2.0), "α_ℓ < 2 (half-way to procedural assembly's 3)", "ch1-alpha"),
    Claim("width_depth", 1, "Compute-optimal width grows linearly with depth, m ∝ ℓ", 1.0, "m ∝ ℓ¹",
          (0.5, 1.5), "exponent within 0.5 of 1", "ch1-optimum"),
    Claim("n_exponent", 1, "Width and depth parts then fall as N^(−1/3)", 1 / 3, "1/3 (Chinchilla's 0.34)",
          (0.25, 0.42), "within 0.085 of 1/3", "ch1-optimum", digits=3),
    Claim("tokens_evenly", 2, "Tokens are updated evenly through the middle (99.6 % / 0.4 %)", 0.996,
          "99.6 % of tokens", (0.75, 1.0), "≥ 75 % (half-way to an even split)", "ch2-trajectories", digits=1,
          percent=True),
    Claim("middle_angle", 2, "Middle blocks turn the state by similar small angles, ≈ 0.45 rad", 0.45,
          "0.45 rad (Pythia-410m)", (0.225, 0.9), "within a factor 2 of 0.45 rad", "ch2-angles"),
    Claim("angle_depth", 6, "The middle angle falls as 1/ℓ across depths (α_θ ≈ 1)", 1.0, "α_θ ≈ 1 (Pythia)",
          (0.5, 1.5), "α_θ within 0.5 of 1 (both rival mechanisms predict 1: it tells them apart only from "
          "compositional assembly)", "ch6-angles"),
    Claim("update_angle", 2, "Consecutive updates are nearly orthogonal, θ(Δh) ≈ π/2", PI / 2, "π/2 = 1.57 rad",
          (PI / 4, 3 * PI / 4), "θ(Δh) in [π/4, 3π/4] (half-way to the parallel updates of a smooth flow)",
          "ch2-updates"),
    Claim("tied_alpha", 3, "Toy, tied teacher (a smooth flow): α_ℓ → 3", 3.0, "≈ 3 at high T", (2.0, math.inf),
          "α_ℓ > 2", "ch3-certified"),
    Claim("independent_alpha", 3, "Toy, independent teacher (an ensemble): α_ℓ ≈ 1 at every T", 1.0, "≈ 1",
          (0.0, 2.0), "α_ℓ < 2", "ch3-certified"),
    Claim("tied_minus_independent", 3, "Toy: the calibration's step, a smooth flow's students have the larger depth "
          "exponent: α_ℓ(tied) − α_ℓ(independent) ≈ 2", 2.0, "3 − 1 = 2", (1.0, math.inf),
          "difference > 1 (half-way from no difference)", "ch3-certified"),
    Claim("low_t_incomplete", 3, "Toy, tied teacher at low T: α_ℓ ≈ 1 is incomplete training (→ 3 when trained "
          "longer)", 3.0, "→ 3 with longer training", (2.0, math.inf), "α_ℓ > 2 after converged training",
          "ch3-certified"),
    Claim("student_signatures", 3, "The LLM signatures match the independent-teacher students (θ(Δh) ≈ π/2)",
          PI / 2, "π/2 = 1.57 rad", (PI / 4, 3 * PI / 4), "students' θ(Δh) in [π/4, 3π/4]", "ch3-signatures"),
    Claim("functional_groups", 4, "Causal tracing: an early group at the subject up to l/ℓ ≈ 0.6, a late group "
          "at the last token", 0.6, "l/ℓ ≈ 0.6 (Pythia-12b)", (0.3, 0.8), "crossover l/ℓ in [0.3, 0.8]",
          "ch4-groups"),
    Claim("order_matters_little", 5, "(Ours) The middle blocks' order hardly matters: reordering k of them costs "
          "less than deleting the same k", None, "— (not in the paper)", (0.0, 1.0),
          "reordering / deletion of the moved blocks < 1", "ch5-order"),
    Claim("series_alpha", 6, "A depth series trained at one width: α_ℓ ≈ 1", 1.2, "1.2 ± 0.3 (Chinchilla)",
          (0.0, 2.0), "α_ℓ < 2", "ch6-alpha"),
    Claim("hierarchical", 7, "(Ours) On a hierarchical target, untied depth still averages: α_ℓ below 2", None,
          "— (the paper's §5 proposal, untested there)", (-math.inf, 2.0),
          "α_ℓ < 2 (half-way between 1 and 3)", "ch7-alpha"),
    Claim("looped", 7, "(Ours) Reusing depth (looped, fully tied) on that target: α_ℓ over effective depth below 2",
          None, "— (the paper's §5 proposal, untested there)", (-math.inf, 2.0),
          "α_ℓ < 2 (half-way between 1 and 3)", "ch7-alpha"),
    Claim("looped_toy_flow", 7, "(Ours) Toy: a looped student (one block reused ℓ times) of the tied teacher, "
          "itself one block reused, falls as a converged flow's students do: α_ℓ above 2", None,
          "— (not in the paper)", (2.0, math.inf), "α_ℓ > 2 (half-way between 1 and 3)", "ch7-looped-toy"),
    Claim("looped_toy_plateau", 7, "(Ours) Toy: a looped student of the independent teacher (128 different "
          "blocks) stops gaining with depth: its loss plateaus", None, "— (not in the paper)",
          (-math.inf, PLATEAU_SLOPE), f"local exponent between the two deepest depths < {PLATEAU_SLOPE:g} (the loss "
          "falls < 7 % per doubling of depth, a tenth of the ensemble's rate)", "ch7-looped-toy"),
    Claim("looped_text", 7, "(Ours) Reusing depth (looped, fully tied) on chapter 6's text: α_ℓ over effective "
          "depth below 2", None, "— (the paper's §5 proposal, untested there)", (-math.inf, 2.0),
          "α_ℓ < 2 (half-way between 1 and 3)", "ch7-text"),
)
#: where each row's link points: the MyST label of the section that shows the number (in the chapter notebooks)
SECTIONS = {"ch1-alpha": 1, "ch1-optimum": 1, "ch2-trajectories": 2, "ch2-angles": 2, "ch2-updates": 2,
            "ch3-certified": 3, "ch3-signatures": 3, "ch4-groups": 4, "ch5-order": 5, "ch6-alpha": 6,
            "ch6-angles": 6, "ch7-alpha": 7, "ch7-looped-toy": 7, "ch7-text": 7}


def percentile_interval(values, level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` percentile interval of ``values`` (e.g. bootstrap resamples; NaN ignored; NaNs without
    any)."""
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


def t_interval(value: float, se: float, dof: int) -> tuple[float, float]:
    """value ± t_{0.975, dof} · se (NaNs when the fit has no degrees of freedom left)."""
    from scipy import stats
    if dof < 1 or not math.isfinite(se):
        return math.nan, math.nan
    t = float(stats.t.ppf(0.975, dof))
    return value - t * se, value + t * se

"""Fits of the law (paper §3, Fig. 2f, App. B): one fitted law, its standard errors, the presets, side-by-side tables.

Presets (the objective is the paper's, 100 · mean (ln L − ln L̂)², unless ``objective="huber"``):

- ``paper``: what the paper did — one start, Adam with three learning rates, 50,000 full-batch steps — with the
  original loop's arithmetic (:func:`depthlib.scaling.solvers.adam_paper`), which reproduces the published digits
  (α_ℓ = 1.201390). It stops before convergence.
- ``converged`` (default): the true minimiser, from a batched Levenberg–Marquardt solver run from a
  multi-start grid. The objective's valley along (c_ℓ, α_ℓ) is nearly flat, so the two differ.

Uncertainties: for the least-squares fits, Gauss–Newton standard errors as the paper computes them (linear
residuals); for the Huber fit, a sandwich (M-estimator) estimator, since Gauss–Newton errors assume a least-squares
objective. c_ℓ and c_D are reported in the paper's units (``c_l_raw`` converts c_ℓ back to blocks).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from depthlib.errors import InputError
from depthlib.scaling.model import LAWS, index, jacobian, log_residuals, predict, risk, split, theta_of
from depthlib.scaling.points import DATA_SCALE, DEPTH_SCALE, N_EXCLUDED_PAPER, Points, select_points
from depthlib.scaling.solvers import adam_paper, converged_theta, huber_refine

#: The paper's published fit, for comparison only: the end point of the fit-5 notebook's 50k Adam steps as it prints
#: it (full float precision; rounded to 0.97691, 1.20139, 0.29910, 1.75033 in the paper's App. B), and its
#: Gauss–Newton SEs. ``logged_risk`` is the objective the loop logged last, at the parameters *before* its final
#: update (Adam oscillates along the valley); the objective at the end point itself is 0.0030578.
PUBLISHED = {"alpha_m": 0.9769136309623718, "alpha_l": 1.201390266418457, "alpha_D": 0.29909613728523254,
             "L0": 1.7503269910812378, "c_m": 333.3808501910344, "c_l": 1284.3676595484178, "c_D": 8.48674282280199,
             "mean_rel_err": 0.0040, "logged_risk": 0.0030680681655081803,
             "se": {"alpha_m": 0.0833, "alpha_l": 0.2685, "alpha_D": 0.0139, "L0": 0.0256}}


@dataclass
class Fit:
    """One fitted law: parameters, standard errors (Gauss–Newton or sandwich, ``se_method``) and goodness of fit."""

    law: str
    preset: str
    objective: str
    theta: np.ndarray                 # (2k+1,) ln c_j, α_j, L0
    se: np.ndarray                    # (2k+1,) standard errors (of ln c for coefficients), see se_method
    points: Points
    exclude: int
    risk: float                       # the paper's objective at θ (100 · mean squared log error)
    extra: dict = field(default_factory=dict)
    se_method: str = "gauss-newton"   # "gauss-newton" (least squares, as the paper) or "sandwich" (Huber)

    @property
    def terms(self) -> tuple[str, ...]:
        return LAWS[self.law][1]

    @property
    def k(self) -> int:
        return len(self.terms)

    def param(self, name: str) -> float:
        return float(self.params()[name])

    def se_of(self, name: str) -> float:
        """The standard error of parameter ``name`` (``alpha_l``, ``L0``, ``ln_c_m`` …; see ``se_method``)."""
        return float(self.se[index(self.law, name)])

    def params(self) -> dict[str, float]:
        log_c, alpha, l0 = split(self.theta, self.k)
        out = {f"alpha_{n}": alpha[j] for j, n in enumerate(self.terms)}
        out["L0"] = l0
        out.update({f"c_{n}": float(np.exp(log_c[j])) for j, n in enumerate(self.terms)})
        return {key: float(v) for key, v in out.items()}

    def predict(self, x: np.ndarray | None = None) -> np.ndarray:
        return predict(self.theta[None], self.points.x if x is None else x)[0][0]

    def term_values(self) -> np.ndarray:
        """(n, k) each power-law term at each fitted point."""
        return predict(self.theta[None], self.points.x)[1][0]

    @property
    def mean_rel_err(self) -> float:
        return float(np.mean(np.abs(self.points.loss - self.predict()) / self.points.loss))

    @property
    def c_l_raw(self) -> float:
        """c_ℓ in units of blocks (c_ℓ' / 100^α_ℓ)."""
        return self.param("c_l") / DEPTH_SCALE ** self.param("alpha_l")

    def summary(self, digits: int = 6) -> dict:
        """The CLI's JSON: exponents, coefficients (paper units), fit quality, SEs."""
        p = self.params()
        names = self.terms
        se = {f"alpha_{n}": self.se_of(f"alpha_{n}") for n in names}
        se["L0"] = self.se_of("L0")
        se.update({f"ln_c_{n}": self.se_of(f"ln_c_{n}") for n in names})
        out = {key: round(v, digits) for key, v in p.items()}
        out.update(mean_rel_err=round(self.mean_rel_err, digits), n_points=self.points.n,
                   se={key: round(float(v), digits) for key, v in se.items()},
                   se_method=self.se_method, law=self.law, preset=self.preset, objective=self.objective,
                   exclude=self.exclude, risk=round(self.risk, 9))
        if self.law == "decomposed":
            out.update(depth_offset=self.points.depth_offset, c_l_raw=round(self.c_l_raw, digits),
                       units={"l": f"{DEPTH_SCALE:g}*(n_layers-{self.points.depth_offset})",
                              "D": f"num_tokens/{DATA_SCALE:g}"})
        out.update({key: v for key, v in self.extra.items() if not isinstance(v, np.ndarray)})
        return out


def gauss_newton_se(theta: np.ndarray, points: Points) -> np.ndarray:
    """Standard errors as the paper reports them (App. B): linear residuals r = L − L̂,
    J = ∂L̂/∂θ, s² = Σ r² / (n − p), Cov = s² (JᵀJ)⁻¹."""
    pred, terms = predict(theta[None], points.x)
    r = points.loss - pred[0]
    J = jacobian(terms, points.x)[0]
    n, p = J.shape
    s2 = float(r @ r) / (n - p)
    cov = s2 * np.linalg.pinv(J.T @ J)
    return np.sqrt(np.clip(np.diag(cov), 0, None))


def sandwich_se(theta: np.ndarray, points: Points, delta: float) -> np.ndarray:
    """Standard errors of the Huber fit: the M-estimator sandwich (Huber 1967; White 1980).

    The Huber fit solves Σ ψ(r_i) g_i = 0 with r = ln L − ln L̂, g_i = ∂r_i/∂θ and ψ(r) = clip(r, −δ, δ), so
    Cov = n/(n − p) · A⁻¹ B A⁻¹ with A = Σ ψ'(r_i) g_i g_iᵀ (only the rows with |r_i| ≤ δ) and B = Σ ψ(r_i)² g_i g_iᵀ.
    Gauss–Newton errors, s² (JᵀJ)⁻¹, assume the least-squares objective: with δ = 1e−3 most rows lie in Huber's
    linear part (|r| > δ), and Gauss–Newton then understates the spread of α_D and L0 by a factor ≈ 1.7 against a
    bootstrap of Huber fits, which the sandwich matches (test_scaling.py).
    """
    r, J = log_residuals(theta[None], points.x, points.loss)
    r, J = r[0], J[0]                                               # (n,), (n, p)
    inside = np.abs(r) <= delta
    psi = np.clip(r, -delta, delta)
    n, p = J.shape
    if inside.sum() < p:
        raise InputError(f"only {inside.sum()} residuals within δ = {delta:g}: the sandwich needs at least {p}")
    bread = np.linalg.pinv((J[inside]).T @ J[inside])
    meat = (J * psi[:, None] ** 2).T @ J
    cov = n / (n - p) * bread @ meat @ bread
    return np.sqrt(np.clip(np.diag(cov), 0, None))


def fit_decomposed_law(df: pd.DataFrame, *, preset: str = "converged", exclude: int = N_EXCLUDED_PAPER,
                       depth_offset: int = 0, objective: str = "mse", law: str = "decomposed",
                       huber_delta: float = 1e-3, steps: int = 50_000) -> Fit:
    """Fit the decomposed law (or ``law="chinchilla"``) to the Chinchilla runs.

    preset "paper" reproduces the published fit to its printed digits (α_m 0.976914, α_ℓ 1.201390, α_D 0.299096,
    0.40 %; see :func:`adam_paper`); "converged" finds the true minimiser of the same objective and reports its
    distance to the published values. objective "huber" minimises the summed Huber loss (δ = 1e−3) in log space.
    Standard errors: Gauss–Newton as the paper computes them for the least-squares objective, the sandwich
    estimator (:func:`sandwich_se`) for the Huber objective (``Fit.se_method`` says which).
    """
    if preset not in ("paper", "converged"):
        raise InputError(f"preset must be 'paper' or 'converged', got '{preset}'")
    if objective not in ("mse", "huber"):
        raise InputError(f"objective must be 'mse' or 'huber', got '{objective}'")
    if preset == "paper" and (objective != "mse" or law != "decomposed"):
        raise InputError("the paper preset uses the paper's objective (mse) and the decomposed law")
    points = select_points(df, exclude, depth_offset, law)
    extra: dict = {}
    if preset == "paper":
        theta, risks = adam_paper(points, steps=steps, return_risks=True)
        theta = theta[0]
        extra.update(adam_steps=steps, risk_history=risks[:, 0], logged_risk=float(risks[-1, 0]))
    else:
        theta, extra = converged_theta(points)
        if objective == "huber":
            theta = huber_refine(theta, points, huber_delta)
            extra["huber_delta"] = huber_delta
        elif law == "decomposed" and depth_offset == 0:
            published = published_theta()
            extra["risk_at_published"] = round(float(risk(published, points.x, points.loss)[0]), 9)
    if objective == "huber":
        se, se_method = sandwich_se(theta, points, huber_delta), "sandwich"
    else:
        se, se_method = gauss_newton_se(theta, points), "gauss-newton"
    fit = Fit(law, preset, objective, theta, se, points, exclude, float(risk(theta, points.x, points.loss)[0]), extra,
              se_method)
    if preset == "converged" and law == "decomposed" and depth_offset == 0 and objective == "mse":
        fit.extra["minus_published"] = {key: round(fit.param(key) - PUBLISHED[key], 4)
                                        for key in ("alpha_m", "alpha_l", "alpha_D", "L0")}
    return fit


def published_theta() -> np.ndarray:
    """θ of the paper's published fit (:data:`PUBLISHED`)."""
    p = PUBLISHED
    return theta_of("decomposed", ln_c_m=np.log(p["c_m"]), ln_c_l=np.log(p["c_l"]), ln_c_D=np.log(p["c_D"]),
                    alpha_m=p["alpha_m"], alpha_l=p["alpha_l"], alpha_D=p["alpha_D"], L0=p["L0"])


SE_METHODS = {"gauss-newton": "Gauss–Newton", "sandwich": "sandwich (Huber)"}


def fits_table(fits: dict[str, Fit], with_published: bool = True) -> pd.DataFrame:
    """Side-by-side exponents, L0, SEs of α_ℓ and α_D (and which estimator gave them), mean relative error and
    objective of several decomposed fits, with the paper's published row (its objective evaluated on the same 203
    runs: 0.0030578 at the printed end point)."""
    rows = {}
    for name, f in fits.items():
        rows[name] = {"α_m": f.param("alpha_m"), "α_ℓ": f.param("alpha_l"), "α_D": f.param("alpha_D"),
                      "L0": f.param("L0"), "SE α_ℓ": f.se_of("alpha_l"), "SE α_D": f.se_of("alpha_D"),
                      "SE method": SE_METHODS[f.se_method],
                      "mean rel. err (%)": 100 * f.mean_rel_err, "objective R ×10³": 1e3 * f.risk, "runs": f.points.n}
    if with_published:
        pts = next(iter(fits.values())).points
        p = PUBLISHED
        same_rows = pts.depth_offset == 0 and pts.n == 203
        rows["published (R at its printed end point)"] = {
            "α_m": p["alpha_m"], "α_ℓ": p["alpha_l"], "α_D": p["alpha_D"], "L0": p["L0"], "SE α_ℓ": p["se"]["alpha_l"],
            "SE α_D": p["se"]["alpha_D"], "SE method": SE_METHODS["gauss-newton"], "mean rel. err (%)": 100 * p["mean_rel_err"],
            "objective R ×10³": 1e3 * float(risk(published_theta(), pts.x, pts.loss)[0]) if same_rows else np.nan,
            "runs": 203}
    return pd.DataFrame.from_dict(rows, orient="index").astype({"runs": int})


def width_depth_optimum(fit: Fit) -> dict:
    """Compute-optimal shape implied by the width and depth terms at fixed N ∝ m²ℓ (paper §1).

    Minimising c_m m^−α_m + c_ℓ ℓ^−α_ℓ subject to m²ℓ = N gives α_m T_m = 2 α_ℓ T_ℓ, so
    m ∝ ℓ^(α_ℓ/α_m) and both terms fall as N^(−α_m α_ℓ / (2 α_ℓ + α_m)) (1/3 when α_m = α_ℓ = 1).
    m grows linearly with ℓ only when α_m = α_ℓ; the converged fit's α_ℓ/α_m ≈ 1.4 makes it grow faster.
    A fit with depth offset 2 has depth variable ℓ − 2, so its optimum is under the constraint N ∝ m²(ℓ − 2),
    which is not the parameter count (∝ m²ℓ): a different constraint, not the compute-optimal shape.
    """
    if fit.law != "decomposed":
        raise InputError("the width–depth optimum needs the decomposed law")
    a_m, a_l, c_m = fit.param("alpha_m"), fit.param("alpha_l"), fit.param("c_m")
    prefactor = (a_m * c_m / (2 * a_l * fit.c_l_raw)) ** (1 / a_m)
    return {"m_vs_l_exponent": a_l / a_m, "N_exponent": a_m * a_l / (2 * a_l + a_m),
            "m_prefactor": prefactor,
            "note": "m* = m_prefactor · ℓ^(m_vs_l_exponent), ℓ in blocks"
                    + (" minus 2; under the constraint N ∝ m²(ℓ − 2), which is not the parameter count (∝ m²ℓ)"
                       if fit.points.depth_offset == 2 else "")}

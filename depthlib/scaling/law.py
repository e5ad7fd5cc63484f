"""The decomposed scaling law and its fits (paper §3, Fig. 2f, App. B).

    L(m, ℓ, D) = c_m / m^α_m + c_ℓ / ℓ^α_ℓ + c_D / D^α_D + L0          (width m, depth ℓ, data D)

and, for comparison, Chinchilla's classic form L(N, D) = E + A / N^α + B / D^β. Both are sums of power
laws plus a constant, fitted with coefficients in log space: θ = (ln c_1 … ln c_k, α_1 … α_k, L0).

Presets (the objective is the paper's, 100 · mean (ln L − ln L̂)², unless ``objective="huber"``):

- ``paper``: what the paper did — one start, Adam with three learning rates, 50,000 full-batch steps,
  the exponents and L0 in float32 as in the original. It stops before convergence (spec §5.1).
- ``converged`` (default): the true minimiser, from a batched Levenberg–Marquardt solver run from a
  multi-start grid. The objective's valley along (c_ℓ, α_ℓ) is nearly flat, so the two differ.

Units follow the paper: ℓ' = 100 · (n_layers − depth_offset), D' = tokens / 1e6; c_ℓ and c_D are
reported in those units (``c_l_raw`` converts c_ℓ back to blocks). Uncertainties: Gauss–Newton
standard errors as the paper computes them (linear residuals, spec §3.5) and a bootstrap of converged
fits. Everything is vectorised over many fits at once (bootstrap resamples, exclusion scans) by
expressing a data subset as per-row weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pandas as pd

from depthlib.errors import InputError

DEPTH_SCALE = 100.0   # ℓ' = 100 ℓ (paper's rescaling; changes c_ℓ only)
DATA_SCALE = 1e6      # D' = D / 1e6
N_EXCLUDED_PAPER = 40  # "drop the 40 highest losses" (drops 42 rows because of ties, spec §3.2)

#: The paper's published fit (fit-5 notebook, spec §3.7), for comparison only.
PUBLISHED = {"alpha_m": 0.97691, "alpha_l": 1.20139, "alpha_D": 0.29910, "L0": 1.75033,
             "c_m": 333.38, "c_l": 1284.37, "c_D": 8.4867, "mean_rel_err": 0.0040,
             "se": {"alpha_m": 0.0833, "alpha_l": 0.2685, "alpha_D": 0.0139, "L0": 0.0256}}

LAWS = {
    # name: (features, term names)
    "decomposed": (("log_m", "log_l", "log_D"), ("m", "l", "D")),
    "chinchilla": (("log_N", "log_D_raw"), ("N", "D")),
}


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Points:
    """Chinchilla runs prepared for fitting: log features (n, k) for one law, losses (n,)."""

    law: str
    x: np.ndarray          # (n, k) log features: ln m, ln ℓ', ln D' (decomposed) or ln N, ln D (chinchilla)
    loss: np.ndarray       # (n,)
    frame: pd.DataFrame    # the rows used, with their original index
    depth_offset: int = 0

    @property
    def n(self) -> int:
        return len(self.loss)


def excluded_mask(loss: np.ndarray, exclude: int) -> np.ndarray:
    """True for rows dropped by the paper's strict rule: loss >= the ``exclude``-th largest loss.

    Ties at the threshold are dropped too, so excluding 40 drops 42 of the 245 rows (spec §3.2).
    """
    loss = np.asarray(loss, float)
    if not 0 <= exclude < len(loss):
        raise InputError(f"exclude must be in [0, {len(loss) - 1}], got {exclude}")
    if exclude == 0:
        return np.zeros(len(loss), bool)
    threshold = np.sort(loss)[::-1][exclude - 1]
    return loss >= threshold


def features(df: pd.DataFrame, law: str = "decomposed", depth_offset: int = 0) -> np.ndarray:
    """Log features of every row for ``law``: (n, 3) or (n, 2)."""
    if law == "decomposed":
        depth = df["n_layers"].to_numpy(float) - depth_offset
        if np.any(depth <= 0):
            raise InputError(f"depth_offset={depth_offset} leaves a non-positive depth")
        return np.column_stack([np.log(df["d_model"].to_numpy(float)),
                                np.log(DEPTH_SCALE * depth),
                                np.log(df["num_tokens"].to_numpy(float) / DATA_SCALE)])
    if law == "chinchilla":
        return np.column_stack([np.log(df["model_size"].to_numpy(float)),
                                np.log(df["num_tokens"].to_numpy(float))])
    raise InputError(f"unknown law '{law}' (choose from {', '.join(LAWS)})")


def select_points(df: pd.DataFrame, exclude: int = N_EXCLUDED_PAPER, depth_offset: int = 0,
                  law: str = "decomposed") -> Points:
    """The rows kept by the exclusion rule, as fitting arrays."""
    if depth_offset not in (0, 2):
        raise InputError(f"depth_offset must be 0 or 2, got {depth_offset}")
    keep = ~excluded_mask(df["loss"].to_numpy(), exclude)
    frame = df.loc[keep]
    return Points(law, features(frame, law, depth_offset), frame["loss"].to_numpy(float), frame, depth_offset)


# ---------------------------------------------------------------------------------------------------
# The model: a sum of power laws plus a constant, batched over S parameter vectors
# ---------------------------------------------------------------------------------------------------
def predict(theta: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """L̂ and its terms for parameter vectors θ (S, 2k+1) on features x (n, k).

    Returns (pred (S, n), terms (S, n, k)) with terms_j = exp(ln c_j − α_j x_j).
    """
    k = x.shape[1]
    log_c, alpha, l0 = theta[:, :k], theta[:, k:2 * k], theta[:, 2 * k]
    with np.errstate(over="ignore", invalid="ignore"):
        terms = np.exp(log_c[:, None, :] - alpha[:, None, :] * x[None, :, :])  # (S, n, k)
    return terms.sum(-1) + l0[:, None], terms


def jacobian(terms: np.ndarray, x: np.ndarray) -> np.ndarray:
    """∂L̂/∂θ (S, n, 2k+1) from the terms: [T_j, −x_j T_j, 1]."""
    ones = np.ones(terms.shape[:2] + (1,))
    return np.concatenate([terms, -x[None] * terms, ones], axis=-1)


def log_residuals(theta: np.ndarray, x: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """r = ln L − ln L̂ (S, n) and ∂r/∂θ (S, n, p)."""
    pred, terms = predict(theta, x)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.log(loss)[None] - np.log(pred)
    jac = -jacobian(terms, x) / pred[..., None]
    return r, jac


def risk(theta: np.ndarray, x: np.ndarray, loss: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """The paper's objective, 100 · weighted mean of squared log residuals, per parameter vector (S,)."""
    theta = np.atleast_2d(theta)
    r, _ = log_residuals(theta, x, loss)
    w = np.ones_like(r) if weights is None else np.broadcast_to(weights, r.shape)
    return 100.0 * (w * r ** 2).sum(-1) / w.sum(-1)


# ---------------------------------------------------------------------------------------------------
# Solvers
# ---------------------------------------------------------------------------------------------------
def levenberg_marquardt(theta0: np.ndarray, x: np.ndarray, loss: np.ndarray, weights: np.ndarray | None = None,
                        max_iter: int = 300, tol: float = 1e-12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimise Σ_i w_i (ln L_i − ln L̂_i)² for S problems at once (batched Levenberg–Marquardt).

    theta0 (S, p) starts; weights (S, n) or (n,) per-row weights (bootstrap counts, 0/1 subsets).
    Returns (theta (S, p), cost (S,), converged (S,) bool). Marquardt's diagonal scaling copes with the
    very different scales of ln c, α and L0; Nielsen's damping update keeps the steps long in the
    objective's flat (c_ℓ, α_ℓ) valley. A problem stops when a step changes its cost by < tol relative;
    only the problems still running are computed.
    """
    theta = np.array(theta0, float, ndmin=2)
    S, p = theta.shape
    w_all = np.ones((S, len(loss))) if weights is None else np.broadcast_to(np.asarray(weights, float), (S, len(loss)))
    with np.errstate(all="ignore"):
        r, jac = log_residuals(theta, x, loss)
        cost = np.where(np.isfinite(r).all(-1), np.sum(w_all * r ** 2, -1), np.inf)
        lam, nu = np.full(S, 1e-3), np.full(S, 2.0)
        converged = np.zeros(S, bool)
        eye = np.eye(p)
        for _ in range(max_iter):
            idx = np.flatnonzero(~converged)
            if idx.size == 0:
                break
            w, J, res = w_all[idx], jac[idx], r[idx]
            wjT = np.swapaxes(J * w[..., None], 1, 2)                 # (s, p, n)
            A = wjT @ J                                                # (s, p, p) JᵀWJ
            g = (wjT @ res[..., None])[..., 0]                         # (s, p)    JᵀWr
            diag = np.maximum(np.einsum("spp->sp", A), 1e-300)
            step = -np.linalg.solve(A + lam[idx, None, None] * diag[:, :, None] * eye, g[..., None])[..., 0]
            predicted = -(2 * (g * step).sum(-1) + (step * (A @ step[..., None])[..., 0]).sum(-1))
            r_t, jac_t = log_residuals(theta[idx] + step, x, loss)
            cost_t = np.where(np.isfinite(r_t).all(-1), np.sum(w * r_t ** 2, -1), np.inf)
            rho = (cost[idx] - cost_t) / np.where(predicted > 0, predicted, np.inf)
            better = rho > 0
            acc = idx[better]
            converged[idx] = (better & (cost[idx] - cost_t <= tol * cost[idx])) | (lam[idx] > 1e14)
            theta[acc] += step[better]
            r[acc], jac[acc], cost[acc] = r_t[better], jac_t[better], cost_t[better]
            lam[idx] = np.where(better, lam[idx] * np.maximum(1 / 3, 1 - (2 * rho - 1) ** 3), lam[idx] * nu[idx])
            nu[idx] = np.where(better, 2.0, nu[idx] * 2)
    return theta, cost, converged


def start_grid(x: np.ndarray, loss: np.ndarray, exponents=(0.5, 1.0, 1.5), l0_fraction: float = 0.8) -> np.ndarray:
    """Multi-start grid: every combination of exponents (3^k starts), each term scaled to start at an
    equal share of the reducible loss at the median point (so no term starts dead), L0 = 0.8 min L."""
    k = x.shape[1]
    alphas = np.array(np.meshgrid(*[list(exponents)] * k)).reshape(k, -1).T      # (3^k, k)
    l0 = l0_fraction * loss.min()
    log_c = alphas * np.median(x, 0) + np.log((np.median(loss) - l0) / k)
    return np.column_stack([log_c, alphas, np.full(len(alphas), l0)])


PAPER_START = np.array([np.log(200.0), np.log(200.0), np.log(10.0), 1.0, 1.0, 0.33, 1.69])


def adam_paper(points: Points, weights: np.ndarray | None = None, steps: int = 50_000,
               theta0: np.ndarray = PAPER_START) -> np.ndarray:
    """The paper's optimiser (spec §3.4), batched over S weightings of the same rows.

    Adam (β = 0.9, 0.999, ε = 1e−8) on 100 · mean squared log error from one start; learning rates 5e−3
    for ln c, 5e−4 for the exponents, 5e−3 for L0. As in the original, ln c is float64 while the
    exponents, L0 and ln m, ln ℓ' are float32 — which, with the early stop, decides the last digits.
    Returns θ (S, 7) in float64.
    """
    if points.law != "decomposed":
        raise InputError("the paper preset exists only for the decomposed law")
    n = points.n
    w = np.ones((1, n)) if weights is None else np.atleast_2d(np.asarray(weights, float))
    S = w.shape[0]
    w_mean = w / w.sum(-1, keepdims=True)                       # (S, n) weighted mean
    x32 = points.x[:, :2].astype(np.float32)                    # ln m, ln ℓ' : float32 in the original
    log_d = points.x[:, 2]                                      # ln D' : float64
    log_loss = np.log(points.loss)
    log_c = np.tile(theta0[:3], (S, 1)).astype(np.float64)      # (S, 3) float64
    a32 = np.tile(theta0[3:6], (S, 1)).astype(np.float32)       # (S, 3) float32 exponents
    l0 = np.full((S, 1), theta0[6], np.float32)                 # (S, 1) float32
    groups = [(log_c, 5e-3), (a32, 5e-4), (l0, 5e-3)]
    m1 = [np.zeros_like(p) for p, _ in groups]
    m2 = [np.zeros_like(p) for p, _ in groups]
    b1, b2, eps = 0.9, 0.999, 1e-8
    for t in range(1, steps + 1):
        # forward: width and depth terms in float32 (1-d float32 operand wins torch's promotion), data in float64
        t_md = np.exp(log_c[:, None, :2].astype(np.float32) - a32[:, None, :2] * x32[None])   # (S, n, 2) f32
        t_d = np.exp(log_c[:, None, 2] - a32[:, None, 2].astype(np.float64) * log_d[None])    # (S, n) f64
        pred = t_md.sum(-1, dtype=np.float64) + t_d + l0.astype(np.float64)                    # (S, n) f64
        r = log_loss[None] - np.log(pred)
        g_pred = -200.0 * w_mean * r / pred                                                     # ∂R/∂L̂ (S, n)
        g_md = g_pred[..., None].astype(np.float32) * t_md                                      # (S, n, 2) f32
        g_d = g_pred * t_d
        grads = [np.concatenate([g_md.sum(1, dtype=np.float32).astype(np.float64), g_d.sum(1, keepdims=True)], 1),
                 np.concatenate([(-g_md * x32[None]).sum(1, dtype=np.float32),
                                 (-g_d * log_d[None]).sum(1, keepdims=True).astype(np.float32)], 1),
                 g_pred.sum(1, keepdims=True).astype(np.float32)]
        bc1, bc2_sqrt = 1 - b1 ** t, np.sqrt(1 - b2 ** t)
        for i, ((param, lr), grad) in enumerate(zip(groups, grads)):
            m1[i] += (grad - m1[i]) * (1 - b1)
            m2[i] *= b2
            m2[i] += (1 - b2) * grad * grad
            param -= (lr / bc1) * m1[i] / (np.sqrt(m2[i]) / bc2_sqrt + eps)
    return np.concatenate([log_c, a32.astype(np.float64), l0.astype(np.float64)], axis=1)


# ---------------------------------------------------------------------------------------------------
# Fits
# ---------------------------------------------------------------------------------------------------
@dataclass
class Fit:
    """One fitted law: parameters, Gauss–Newton SEs and goodness of fit."""

    law: str
    preset: str
    objective: str
    theta: np.ndarray                 # (2k+1,) ln c_j, α_j, L0
    se: np.ndarray                    # (2k+1,) Gauss–Newton standard errors (of ln c for coefficients)
    points: Points
    exclude: int
    risk: float                       # the paper's objective at θ (100 · mean squared log error)
    extra: dict = field(default_factory=dict)

    @property
    def terms(self) -> tuple[str, ...]:
        return LAWS[self.law][1]

    @property
    def k(self) -> int:
        return len(self.terms)

    def param(self, name: str) -> float:
        return float(self.params()[name])

    def params(self) -> dict[str, float]:
        k, names = self.k, self.terms
        out = {f"alpha_{n}": self.theta[k + j] for j, n in enumerate(names)}
        out["L0"] = self.theta[2 * k]
        out.update({f"c_{n}": float(np.exp(self.theta[j])) for j, n in enumerate(names)})
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
        se = {f"alpha_{n}": self.se[self.k + j] for j, n in enumerate(names)}
        se["L0"] = self.se[2 * self.k]
        se.update({f"ln_c_{n}": self.se[j] for j, n in enumerate(names)})
        out = {key: round(v, digits) for key, v in p.items()}
        out.update(mean_rel_err=round(self.mean_rel_err, digits), n_points=self.points.n,
                   se={key: round(float(v), digits) for key, v in se.items()},
                   law=self.law, preset=self.preset, objective=self.objective, exclude=self.exclude,
                   risk=round(self.risk, 9))
        if self.law == "decomposed":
            out.update(depth_offset=self.points.depth_offset, c_l_raw=round(self.c_l_raw, digits),
                       units={"l": f"{DEPTH_SCALE:g}*(n_layers-{self.points.depth_offset})",
                              "D": f"num_tokens/{DATA_SCALE:g}"})
        out.update({key: v for key, v in self.extra.items() if not isinstance(v, np.ndarray)})
        return out


def gauss_newton_se(theta: np.ndarray, points: Points) -> np.ndarray:
    """Standard errors as the paper reports them (spec §3.5): linear residuals r = L − L̂,
    J = ∂L̂/∂θ, s² = Σ r² / (n − p), Cov = s² (JᵀJ)⁻¹."""
    pred, terms = predict(theta[None], points.x)
    r = points.loss - pred[0]
    J = jacobian(terms, points.x)[0]
    n, p = J.shape
    s2 = float(r @ r) / (n - p)
    cov = s2 * np.linalg.pinv(J.T @ J)
    return np.sqrt(np.clip(np.diag(cov), 0, None))


def _huber_refine(theta0: np.ndarray, points: Points, delta: float) -> np.ndarray:
    """Minimise Σ Huber_δ(ln L − ln L̂) (Epoch AI's replication of Chinchilla Approach 3: δ = 1e−3, summed)."""
    from scipy.optimize import least_squares

    def fun(th):
        return log_residuals(th[None], points.x, points.loss)[0][0]

    def jac(th):
        return log_residuals(th[None], points.x, points.loss)[1][0]

    res = least_squares(fun, theta0, jac=jac, loss="huber", f_scale=delta, method="trf",
                        xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=5000)
    return res.x


def converged_theta(points: Points, weights: np.ndarray | None = None,
                    starts: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """The minimiser of the paper's objective from a multi-start grid (batched LM); best of all starts."""
    k = points.x.shape[1]
    starts = start_grid(points.x, points.loss) if starts is None else np.atleast_2d(starts)
    if points.law == "decomposed":
        starts = np.vstack([PAPER_START, starts])
    theta, cost, ok = levenberg_marquardt(starts, points.x, points.loss, weights)
    best = int(np.argmin(cost))
    finite = np.isfinite(cost)
    near = finite & (cost <= cost[best] * (1 + 1e-6))
    info = {"n_starts": len(starts), "n_starts_at_best": int(near.sum()),
            "start_spread_alpha": float(np.ptp(theta[near, k:2 * k], axis=0).max()) if near.sum() > 1 else 0.0}
    return theta[best], info


def fit_decomposed_law(df: pd.DataFrame, *, preset: str = "converged", exclude: int = N_EXCLUDED_PAPER,
                       depth_offset: int = 0, objective: str = "mse", law: str = "decomposed",
                       huber_delta: float = 1e-3, steps: int = 50_000) -> Fit:
    """Fit the decomposed law (or ``law="chinchilla"``) to the Chinchilla runs.

    preset "paper" reproduces the published fit (α_m 0.977, α_ℓ 1.201, α_D 0.299, 0.40 %);
    "converged" finds the true minimiser of the same objective and reports its distance to the
    published values. objective "huber" minimises the summed Huber loss (δ = 1e−3) in log space.
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
        theta = adam_paper(points, steps=steps)[0]
        extra["adam_steps"] = steps
    else:
        theta, extra = converged_theta(points)
        if objective == "huber":
            theta = _huber_refine(theta, points, huber_delta)
            extra["huber_delta"] = huber_delta
        elif law == "decomposed" and depth_offset == 0:
            published = _published_theta()
            extra["risk_at_published"] = round(float(risk(published, points.x, points.loss)[0]), 9)
    fit = Fit(law, preset, objective, theta, gauss_newton_se(theta, points), points, exclude,
              float(risk(theta, points.x, points.loss)[0]), extra)
    if preset == "converged" and law == "decomposed" and depth_offset == 0 and objective == "mse":
        fit.extra["minus_published"] = {key: round(fit.param(key) - PUBLISHED[key], 4)
                                        for key in ("alpha_m", "alpha_l", "alpha_D", "L0")}
    return fit


def _published_theta() -> np.ndarray:
    p = PUBLISHED
    return np.array([np.log(p["c_m"]), np.log(p["c_l"]), np.log(p["c_D"]),
                     p["alpha_m"], p["alpha_l"], p["alpha_D"], p["L0"]])


def fits_table(fits: dict[str, Fit], with_published: bool = True) -> pd.DataFrame:
    """Side-by-side exponents, L0, SE of α_ℓ, mean relative error and objective of several decomposed fits,
    with the paper's published row (its objective evaluated on the same 203 runs)."""
    rows = {}
    for name, f in fits.items():
        rows[name] = {"α_m": f.param("alpha_m"), "α_ℓ": f.param("alpha_l"), "α_D": f.param("alpha_D"),
                      "L0": f.param("L0"), "SE α_ℓ": f.se[4], "mean rel. err (%)": 100 * f.mean_rel_err,
                      "objective R ×10³": 1e3 * f.risk, "runs": f.points.n}
    if with_published:
        pts = next(iter(fits.values())).points
        p = PUBLISHED
        rows["published (R at its printed values)"] = {
            "α_m": p["alpha_m"], "α_ℓ": p["alpha_l"], "α_D": p["alpha_D"], "L0": p["L0"], "SE α_ℓ": p["se"]["alpha_l"],
            "mean rel. err (%)": 100 * p["mean_rel_err"],
            "objective R ×10³": 1e3 * float(risk(_published_theta(), pts.x, pts.loss)[0]) if pts.depth_offset == 0 else np.nan,
            "runs": 203}
    return pd.DataFrame(rows).T.astype({"runs": int})


# ---------------------------------------------------------------------------------------------------
# Uncertainty and validation
# ---------------------------------------------------------------------------------------------------
def _names(law: str) -> list[str]:
    terms = LAWS[law][1]
    return [f"ln_c_{t}" for t in terms] + [f"alpha_{t}" for t in terms] + ["L0"]


def bootstrap(df: pd.DataFrame, n_resamples: int = 1000, seed: int = 0, *, exclude: int = N_EXCLUDED_PAPER,
              depth_offset: int = 0, law: str = "decomposed", objective: str = "mse") -> pd.DataFrame:
    """Converged fits of ``n_resamples`` bootstrap resamples (rows drawn with replacement), batched.

    Each resample is a vector of row counts used as weights, so all resamples are solved in one batched
    LM call started at the full-data minimiser. Returns one row per resample: θ, α's and a converged flag.
    """
    if n_resamples < 1:
        raise InputError(f"n_resamples must be >= 1, got {n_resamples}")
    if objective != "mse":
        raise InputError("the bootstrap uses the paper's objective (mse)")
    points = select_points(df, exclude, depth_offset, law)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, points.n, size=(n_resamples, points.n))
    counts = np.zeros((n_resamples, points.n))
    np.add.at(counts, (np.arange(n_resamples)[:, None], idx), 1.0)
    theta0, _ = converged_theta(points)
    theta, cost, ok = levenberg_marquardt(np.tile(theta0, (n_resamples, 1)), points.x, points.loss, counts)
    out = pd.DataFrame(theta, columns=_names(law))
    out.insert(0, "resample", np.arange(n_resamples))
    out["risk"] = 100 * cost / points.n
    out["converged"] = ok
    return out


def bootstrap_summary(boot: pd.DataFrame, level: float = 0.95) -> dict:
    """Mean, std and percentile interval of each exponent and L0 over the resamples."""
    lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    out = {"n_resamples": int(len(boot)), "n_converged": int(boot["converged"].sum()), "level": level}
    for col in [c for c in boot.columns if c.startswith("alpha_")] + ["L0"]:
        v = boot[col].to_numpy()
        out[col] = {"mean": round(float(v.mean()), 4), "std": round(float(v.std(ddof=1)), 4),
                    "lo": round(float(np.percentile(v, lo)), 4), "hi": round(float(np.percentile(v, hi)), 4)}
    return out


def held_out(df: pd.DataFrame, n_splits: int = 10, test_fraction: float = 0.2, seed: int = 0, *,
             exclude: int = N_EXCLUDED_PAPER, depth_offset: int = 0) -> pd.DataFrame:
    """Random train/test splits (80/20 as App. B.3): converged fit on train, errors on both.

    Returns one row per split: train/test log-MSE and mean relative error, α's.
    """
    points = select_points(df, exclude, depth_offset)
    rng = np.random.default_rng(seed)
    n_test = int(test_fraction * points.n)
    masks = np.ones((n_splits, points.n))
    for s in range(n_splits):
        masks[s, rng.permutation(points.n)[:n_test]] = 0.0
    theta0, _ = converged_theta(points)
    theta, _, ok = levenberg_marquardt(np.tile(theta0, (n_splits, 1)), points.x, points.loss, masks)
    pred, _ = predict(theta, points.x)
    log_sq = (np.log(points.loss)[None] - np.log(pred)) ** 2
    rel = np.abs(points.loss[None] - pred) / points.loss[None]
    train, test = masks == 1, masks == 0
    rows = []
    for s in range(n_splits):
        rows.append({"split": s, "n_train": int(train[s].sum()), "n_test": int(test[s].sum()),
                     "train_log_mse": log_sq[s, train[s]].mean(), "test_log_mse": log_sq[s, test[s]].mean(),
                     "train_rel_err": rel[s, train[s]].mean(), "test_rel_err": rel[s, test[s]].mean(),
                     "alpha_m": theta[s, 3], "alpha_l": theta[s, 4], "alpha_D": theta[s, 5],
                     "converged": bool(ok[s])})
    return pd.DataFrame(rows)


def exclusion_scan(df: pd.DataFrame, excludes: Iterable[int] = range(0, 101), depth_offsets: Iterable[int] = (0, 2),
                   preset: str = "converged", steps: int = 50_000) -> pd.DataFrame:
    """α's (± Gauss–Newton SE) against the number of excluded rows and the depth offset (App. B.3).

    All exclusion counts of one offset are solved together: an exclusion is a 0/1 weight on all rows.
    preset "paper" runs the paper's Adam (batched) instead of the converged solver.
    """
    excludes = list(excludes)
    rows = []
    for offset in depth_offsets:
        allpts = select_points(df, 0, offset)
        masks = np.array([~excluded_mask(allpts.loss, k) for k in excludes], float)   # (K, n)
        if preset == "paper":
            thetas = adam_paper(allpts, masks, steps=steps)
        else:
            # every exclusion from two starts (the paper's and the k=40 minimiser): one batched call
            starts = np.vstack([PAPER_START, converged_theta(select_points(df, N_EXCLUDED_PAPER, offset))[0]])
            theta, cost, _ = levenberg_marquardt(np.repeat(starts, len(excludes), 0), allpts.x, allpts.loss,
                                                 np.tile(masks, (len(starts), 1)))
            theta, cost = theta.reshape(len(starts), len(excludes), -1), cost.reshape(len(starts), len(excludes))
            thetas = theta[np.argmin(cost, 0), np.arange(len(excludes))]
        for k, theta, mask in zip(excludes, thetas, masks):
            kept = Points("decomposed", allpts.x[mask == 1], allpts.loss[mask == 1], allpts.frame[mask == 1], offset)
            se = gauss_newton_se(theta, kept)
            pred = predict(theta[None], kept.x)[0][0]
            rows.append({"exclude": k, "depth_offset": offset, "n_points": kept.n, "preset": preset,
                         "ln_c_m": theta[0], "ln_c_l": theta[1], "ln_c_D": theta[2],
                         "alpha_m": theta[3], "alpha_l": theta[4], "alpha_D": theta[5], "L0": theta[6],
                         "se_alpha_m": se[3], "se_alpha_l": se[4], "se_alpha_D": se[5],
                         "mean_rel_err": float(np.mean(np.abs(kept.loss - pred) / kept.loss))})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------
# Consequences of the fitted exponents
# ---------------------------------------------------------------------------------------------------
def width_depth_optimum(fit: Fit) -> dict:
    """Compute-optimal shape implied by the width and depth terms at fixed N ∝ m²ℓ (paper §1).

    Minimising c_m m^−α_m + c_ℓ ℓ^−α_ℓ subject to m²ℓ = N gives α_m T_m = 2 α_ℓ T_ℓ, so
    m ∝ ℓ^(α_ℓ/α_m) and both terms fall as N^(−α_m α_ℓ / (2 α_ℓ + α_m)) (1/3 when α_m = α_ℓ = 1).
    """
    if fit.law != "decomposed":
        raise InputError("the width–depth optimum needs the decomposed law")
    a_m, a_l, c_m = fit.param("alpha_m"), fit.param("alpha_l"), fit.param("c_m")
    prefactor = (a_m * c_m / (2 * a_l * fit.c_l_raw)) ** (1 / a_m)
    return {"m_vs_l_exponent": a_l / a_m, "N_exponent": a_m * a_l / (2 * a_l + a_m),
            "m_prefactor": prefactor,
            "note": "m* = m_prefactor · ℓ^(m_vs_l_exponent), ℓ in blocks"
                    + (" minus 2" if fit.points.depth_offset == 2 else "")}

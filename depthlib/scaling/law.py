"""The decomposed scaling law and its fits (paper §3, Fig. 2f, App. B).

    L(m, ℓ, D) = c_m / m^α_m + c_ℓ / ℓ^α_ℓ + c_D / D^α_D + L0          (width m, depth ℓ, data D)

and, for comparison, Chinchilla's classic form L(N, D) = E + A / N^α + B / D^β. Both are sums of power
laws plus a constant, fitted with coefficients in log space: θ = (ln c_1 … ln c_k, α_1 … α_k, L0).

Presets (the objective is the paper's, 100 · mean (ln L − ln L̂)², unless ``objective="huber"``):

- ``paper``: what the paper did — one start, Adam with three learning rates, 50,000 full-batch steps — with the
  original loop's arithmetic (float32 exponents, L0 and their Adam state; float64 forward pass and loss), which
  reproduces the published digits (α_ℓ = 1.201390). It stops before convergence (spec §5.1).
- ``converged`` (default): the true minimiser, from a batched Levenberg–Marquardt solver run from a
  multi-start grid. The objective's valley along (c_ℓ, α_ℓ) is nearly flat, so the two differ.

Units follow the paper: ℓ' = 100 · (n_layers − depth_offset), D' = tokens / 1e6; c_ℓ and c_D are
reported in those units (``c_l_raw`` converts c_ℓ back to blocks). Uncertainties: for the least-squares fits,
Gauss–Newton standard errors as the paper computes them (linear residuals, spec §3.5); for the Huber fit, a
sandwich (M-estimator) estimator, since Gauss–Newton errors assume a least-squares objective; and a bootstrap of
converged fits. Everything is vectorised over many fits at once (bootstrap resamples, exclusion scans) by
expressing a data subset as per-row weights.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pandas as pd

from depthlib.errors import InputError

DEPTH_SCALE = 100.0   # ℓ' = 100 ℓ (paper's rescaling; changes c_ℓ only)
DATA_SCALE = 1e6      # D' = D / 1e6
N_EXCLUDED_PAPER = 40  # "drop the 40 highest losses" (drops 42 rows because of ties, spec §3.2)
#: A fit with fewer points than this per free parameter is refused: its SEs and exponents mean nothing
#: (7 parameters: at least 35 points for the decomposed law; 5 parameters: 25 for the classic form).
MIN_POINTS_PER_PARAMETER = 5

#: The paper's published fit, for comparison only: the end point of the fit-5 notebook's 50k Adam steps as it prints
#: it (full float precision; spec §3.7 and §5.1 round it to 0.97691, 1.20139, 0.29910, 1.75033), and its
#: Gauss–Newton SEs. ``logged_risk`` is the objective the loop logged last, at the parameters *before* its final
#: update (Adam oscillates along the valley); the objective at the end point itself is 0.0030578.
PUBLISHED = {"alpha_m": 0.9769136309623718, "alpha_l": 1.201390266418457, "alpha_D": 0.29909613728523254,
             "L0": 1.7503269910812378, "c_m": 333.3808501910344, "c_l": 1284.3676595484178, "c_D": 8.48674282280199,
             "mean_rel_err": 0.0040, "logged_risk": 0.0030680681655081803,
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


def n_free_parameters(law: str) -> int:
    """Free parameters of a law: a coefficient and an exponent per term, plus L0."""
    if law not in LAWS:
        raise InputError(f"unknown law '{law}' (choose from {', '.join(LAWS)})")
    return 2 * len(LAWS[law][1]) + 1


def min_points(law: str = "decomposed") -> int:
    """The fewest points a fit of ``law`` accepts (:data:`MIN_POINTS_PER_PARAMETER` per free parameter)."""
    return MIN_POINTS_PER_PARAMETER * n_free_parameters(law)


def check_enough_points(n: int, law: str = "decomposed", what: str = "the fit") -> int:
    """``n``, or InputError if ``n`` points are too few to fit ``law`` meaningfully."""
    need = min_points(law)
    if n < need:
        raise InputError(f"{what} has only {n} point(s) for the {law} law's {n_free_parameters(law)} free parameters: "
                         f"it needs at least {need} (at least {MIN_POINTS_PER_PARAMETER} points per free parameter); "
                         "exclude fewer rows or give more data")
    return n


def warn_duplicate_rows(df: pd.DataFrame) -> int:
    """Warn (``warnings.warn``) if rows repeat: each copy counts as another point and moves the fit. Returns how many."""
    cols = [c for c in ("model_size", "FLOP", "loss", "num_tokens", "d_model", "n_layers") if c in df.columns]
    copies = df.duplicated(subset=cols or None).to_numpy()
    n = int(copies.sum())
    if n:
        first = int(np.flatnonzero(df.duplicated(subset=cols or None, keep=False).to_numpy())[0])
        warnings.warn(f"{n} row(s) of the data repeat an earlier row (e.g. row {first}, data line {first + 2}, appears "
                      "again): each copy counts as another point and moves the fit; remove them if they are not "
                      "separate runs", UserWarning, stacklevel=3)
    return n


def select_points(df: pd.DataFrame, exclude: int = N_EXCLUDED_PAPER, depth_offset: int = 0,
                  law: str = "decomposed") -> Points:
    """The rows kept by the exclusion rule, as fitting arrays (InputError if too few to fit; a warning if rows
    repeat)."""
    if depth_offset not in (0, 2):
        raise InputError(f"depth_offset must be 0 or 2, got {depth_offset}")
    n_free_parameters(law)
    if len(df) == 0:
        raise InputError("the data has no rows to fit")
    warn_duplicate_rows(df)
    keep = ~excluded_mask(df["loss"].to_numpy(), exclude)
    frame = df.loc[keep]
    check_enough_points(len(frame), law, f"excluding {exclude} of {len(df)} rows, the fit")
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


def _torch_features(points: Points):
    """ln m, ln ℓ', ln D' and ln L as the original loop computes them: float64 torch tensors of the CSV's float64
    columns (ℓ' = 100 · (n_layers − offset), D' = D / 1e6), logarithms by torch — four (n,) tensors."""
    import torch
    f = points.frame
    m = torch.tensor(f["d_model"].to_numpy(np.float64))
    depth = torch.tensor(f["n_layers"].to_numpy(np.float64) - points.depth_offset) * DEPTH_SCALE
    tokens = torch.tensor(f["num_tokens"].to_numpy(np.float64)) / DATA_SCALE
    return m.log(), depth.log(), tokens.log(), torch.tensor(f["loss"].to_numpy(np.float64)).log()


def adam_paper(points: Points, weights: np.ndarray | None = None, steps: int = 50_000,
               theta0: np.ndarray = PAPER_START, return_risks: bool = False):
    """The paper's optimiser with the original loop's arithmetic (spec §3.4), batched over S weightings of the rows.

    Adam (β = 0.9, 0.999, ε = 1e−8, PyTorch's update formulas) on 100 · mean squared log error from one start;
    learning rates 5e−3 for ln c, 5e−4 for the exponents, 5e−3 for L0. As in the original, ln c are float64
    parameters while the exponents and L0 are float32 parameters with float32 Adam state; the forward pass and the
    loss are float64 (the CSV columns are float64, and a 0-d float32 parameter times a float64 tensor is float64),
    and each float32 parameter's gradient is the float64 gradient rounded to float32. The backward pass is written
    out, in the order autograd evaluates it, with torch's own elementwise kernels and sums, so that one unweighted
    fit is bit for bit the original loop and reproduces the published digits (α_ℓ = 1.201390266418457).

    The last digits are fragile: the 50k-step trajectory amplifies rounding, so a one-ulp change in a float64 sum
    near step 9,200 moves the end point's α_ℓ by about 1e−4. They are reproduced where torch runs the same kernels
    as the original (verified on x86-64 with AVX2 kernels); torch's non-vectorised kernels
    (``ATEN_CPU_CAPABILITY=default``) give α_ℓ = 1.20127. Weighted problems (bootstrap counts, exclusion masks) use
    the weighted mean and agree with separate runs on the kept rows to about that precision: the batched exclusion
    scan gives scanignore.py's α_ℓ = 1.184, 0.951, 1.028, 1.205, 1.201, …, 1.374 (spec §5.4) to three decimals.
    Returns θ (S, 7) in float64 and, with ``return_risks``, the objective before each update (steps, S), as the
    original logs it.
    """
    import torch
    if points.law != "decomposed":
        raise InputError("the paper preset exists only for the decomposed law")
    n = points.n
    w = torch.ones((1, n), dtype=torch.float64) if weights is None else torch.tensor(np.atleast_2d(weights), dtype=torch.float64)
    S = w.shape[0]
    coef = (100.0 * w) / w.sum(-1, keepdim=True)       # (S, n) ∂R/∂(r²): 100/n for unit weights, as mean()'s backward
    x_m, x_l, x_D, log_loss = _torch_features(points)   # (n,) each
    theta0 = np.asarray(theta0, np.float64)
    log_c = torch.tensor(np.tile(theta0[:3], (S, 1)), dtype=torch.float64)    # (S, 3) float64 parameters
    alpha = torch.tensor(np.tile(theta0[3:6], (S, 1)), dtype=torch.float32)   # (S, 3) float32 parameters
    l0 = torch.tensor(np.full((S, 1), theta0[6]), dtype=torch.float32)       # (S, 1) float32 parameter
    params, lrs = [log_c, alpha, l0], (5e-3, 5e-4, 5e-3)
    exp_avgs, exp_avg_sqs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    risks = torch.empty((steps, S), dtype=torch.float64) if return_risks else None
    threads = torch.get_num_threads()
    # the (S, n) tensors are small: a second thread only spin-waits (12x slower for S = 11 on a busy 2-core
    # machine), and one thread keeps the order of every sum fixed
    torch.set_num_threads(1)
    try:
        for step in range(1, steps + 1):
            a, e = alpha.double(), l0.double()                              # exact: float32 values in float64
            # forward, term by term as the original (separate contiguous (S, n) tensors: same kernels, same tails)
            t_D = (log_c[:, 2:3] - a[:, 2:3] * x_D).exp()
            t_m = (log_c[:, 0:1] - a[:, 0:1] * x_m).exp()
            t_l = (log_c[:, 1:2] - a[:, 1:2] * x_l).exp()
            pred = t_D + t_m + t_l + e                                      # (S, n) L̂
            r = log_loss - pred.log()
            if risks is not None:                                           # as the original's risk.item(): mean · 100
                risks[step - 1] = (w * r.pow(2)).sum(-1) / w.sum(-1) * 100
            # backward in autograd's order: mean → pow → sub → log → add → exp → sub/mul, summed over the rows
            g_pred = -(coef * (2 * r)) / pred                               # ∂R/∂L̂
            g_D, g_m, g_l = g_pred * t_D, g_pred * t_m, g_pred * t_l
            grads = [torch.stack([g_m.sum(-1), g_l.sum(-1), g_D.sum(-1)], -1),
                     # Σ(−g·x) = −Σ(g·x) exactly (negation commutes with rounding); then rounded to float32
                     torch.stack([(g_m * x_m).sum(-1), (g_l * x_l).sum(-1), (g_D * x_D).sum(-1)], -1).neg_().float(),
                     g_pred.sum(-1, keepdim=True).float()]
            # torch.optim.Adam's single-tensor update (its CPU default), op for op; the _foreach_ forms run the same
            # per-tensor kernels with the same scalars
            bias_correction1 = 1 - beta1 ** step
            bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
            torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
            denom = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_div_(denom, bias_correction2_sqrt)
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(params, exp_avgs, denom, [-(lr / bias_correction1) for lr in lrs])
    finally:
        torch.set_num_threads(threads)
    theta = torch.cat([log_c, alpha.double(), l0.double()], -1).numpy()
    return (theta, risks.numpy()) if return_risks else theta


# ---------------------------------------------------------------------------------------------------
# Fits
# ---------------------------------------------------------------------------------------------------
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
                   se_method=self.se_method, law=self.law, preset=self.preset, objective=self.objective,
                   exclude=self.exclude, risk=round(self.risk, 9))
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
            theta = _huber_refine(theta, points, huber_delta)
            extra["huber_delta"] = huber_delta
        elif law == "decomposed" and depth_offset == 0:
            published = _published_theta()
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


def _published_theta() -> np.ndarray:
    p = PUBLISHED
    return np.array([np.log(p["c_m"]), np.log(p["c_l"]), np.log(p["c_D"]),
                     p["alpha_m"], p["alpha_l"], p["alpha_D"], p["L0"]])


SE_METHODS = {"gauss-newton": "Gauss–Newton", "sandwich": "sandwich (Huber)"}


def fits_table(fits: dict[str, Fit], with_published: bool = True) -> pd.DataFrame:
    """Side-by-side exponents, L0, SEs of α_ℓ and α_D (and which estimator gave them), mean relative error and
    objective of several decomposed fits, with the paper's published row (its objective evaluated on the same 203
    runs: 0.0030578 at the printed end point)."""
    rows = {}
    for name, f in fits.items():
        rows[name] = {"α_m": f.param("alpha_m"), "α_ℓ": f.param("alpha_l"), "α_D": f.param("alpha_D"),
                      "L0": f.param("L0"), "SE α_ℓ": f.se[4], "SE α_D": f.se[5], "SE method": SE_METHODS[f.se_method],
                      "mean rel. err (%)": 100 * f.mean_rel_err, "objective R ×10³": 1e3 * f.risk, "runs": f.points.n}
    if with_published:
        pts = next(iter(fits.values())).points
        p = PUBLISHED
        same_rows = pts.depth_offset == 0 and pts.n == 203
        rows["published (R at its printed end point)"] = {
            "α_m": p["alpha_m"], "α_ℓ": p["alpha_l"], "α_D": p["alpha_D"], "L0": p["L0"], "SE α_ℓ": p["se"]["alpha_l"],
            "SE α_D": p["se"]["alpha_D"], "SE method": SE_METHODS["gauss-newton"], "mean rel. err (%)": 100 * p["mean_rel_err"],
            "objective R ×10³": 1e3 * float(risk(_published_theta(), pts.x, pts.loss)[0]) if same_rows else np.nan,
            "runs": 203}
    return pd.DataFrame.from_dict(rows, orient="index").astype({"runs": int})


# ---------------------------------------------------------------------------------------------------
# Uncertainty and validation
# ---------------------------------------------------------------------------------------------------
def _names(law: str) -> list[str]:
    terms = LAWS[law][1]
    return [f"ln_c_{t}" for t in terms] + [f"alpha_{t}" for t in terms] + ["L0"]


def bootstrap(df: pd.DataFrame, n_resamples: int = 1000, seed: int = 0, *, exclude: int = N_EXCLUDED_PAPER,
              depth_offset: int = 0, law: str = "decomposed", objective: str = "mse",
              resamples: Iterable[int] | None = None) -> pd.DataFrame:
    """Converged fits of ``n_resamples`` bootstrap resamples (rows drawn with replacement), batched.

    Each resample is a vector of row counts used as weights, so all resamples are solved in one batched
    LM call started at the full-data minimiser (each problem of the batch is solved independently of the others).
    ``resamples`` solves only those resamples of the same draw (a replay of part of a run).
    Returns one row per resample: θ, α's and a converged flag.
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
    chosen = np.arange(n_resamples) if resamples is None else np.asarray(list(resamples), int)
    if chosen.size == 0 or chosen.min() < 0 or chosen.max() >= n_resamples:
        raise InputError(f"resamples must be indices in [0, {n_resamples - 1}]")
    theta0, _ = converged_theta(points)
    theta, cost, ok = levenberg_marquardt(np.tile(theta0, (len(chosen), 1)), points.x, points.loss, counts[chosen])
    out = pd.DataFrame(theta, columns=_names(law))
    out.insert(0, "resample", chosen)
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
    check_enough_points(points.n - n_test, "decomposed", "each training split")
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
        for k, mask in zip(excludes, masks):
            check_enough_points(int(mask.sum()), "decomposed", f"excluding {k} of {allpts.n} rows, the fit")
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

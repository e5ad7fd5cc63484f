"""The solvers of the law's fits (paper App. B): Levenberg–Marquardt to convergence, the paper's Adam, Huber.

- :func:`levenberg_marquardt` minimises the paper's objective for many problems at once (bootstrap resamples,
  exclusion scans, as per-row weights) from :func:`start_grid`'s multi-start grid (:func:`converged_theta`).
  :func:`parameter_tolerance` says how far its stopping rule leaves a minimiser from the exact one.
- :func:`adam_paper` is the paper's optimiser with the original loop's arithmetic (it stops before convergence).
- :func:`huber_refine` minimises the summed Huber loss in log space instead.
"""
from __future__ import annotations

import numpy as np

from depthlib.errors import InputError
from depthlib.scaling.model import log_residuals, split, theta_of
from depthlib.scaling.points import DATA_SCALE, DEPTH_SCALE, Points

#: :func:`levenberg_marquardt`'s stopping rule: a problem stops when an accepted step lowers its cost by less than
#: this fraction of the cost
LM_TOL = 1e-12


def levenberg_marquardt(theta0: np.ndarray, x: np.ndarray, loss: np.ndarray, weights: np.ndarray | None = None,
                        max_iter: int = 300, tol: float = LM_TOL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


#: The paper's start (fit-5 notebook): c_m = c_ℓ = 200, c_D = 10, α_m = α_ℓ = 1, α_D = 0.33, L0 = 1.69
PAPER_START = theta_of("decomposed", ln_c_m=np.log(200.0), ln_c_l=np.log(200.0), ln_c_D=np.log(10.0),
                       alpha_m=1.0, alpha_l=1.0, alpha_D=0.33, L0=1.69)



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
    """The paper's optimiser with the original loop's arithmetic (paper App. B), batched over S weightings of the rows.

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
    scan gives scanignore.py's α_ℓ = 1.184, 0.951, 1.028, 1.205, 1.201, …, 1.374 to three decimals.
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
    log_c0, alpha0, l00 = split(np.asarray(theta0, np.float64), 3)
    log_c = torch.tensor(np.tile(log_c0, (S, 1)), dtype=torch.float64)    # (S, 3) float64 parameters
    alpha = torch.tensor(np.tile(alpha0, (S, 1)), dtype=torch.float32)    # (S, 3) float32 parameters
    l0 = torch.tensor(np.full((S, 1), l00), dtype=torch.float32)          # (S, 1) float32 parameter
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


def huber_refine(theta0: np.ndarray, points: Points, delta: float) -> np.ndarray:
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
            "start_spread_alpha": float(np.ptp(split(theta[near], k)[1], axis=0).max()) if near.sum() > 1 else 0.0}
    return theta[best], info


def parameter_tolerance(theta: np.ndarray, x: np.ndarray, loss: np.ndarray, weights: np.ndarray | None = None,
                        rel_cost: float = LM_TOL) -> np.ndarray:
    """How far each parameter of a converged fit may lie from the exact minimiser, given the stopping rule (S, p).

    :func:`levenberg_marquardt` stops a problem when a step lowers its cost C = Σ w r² by less than ``tol`` · C, so
    two runs of the same problem (another CPU's kernels, another start, another order of sums) agree in cost to about
    ``tol`` · C, and in their parameters only as far as such a cost difference resolves them. Near the minimum
    C(θ* + δ) − C(θ*) ≈ δᵀHδ / 2 with H the Hessian of C, and the largest |δ_i| with δᵀHδ / 2 ≤ ε is
    sqrt(2 ε (H⁻¹)_ii). Returns that bound for ε = ``rel_cost`` · C(θ), per parameter vector θ (S, p). H is the
    exact Hessian (central differences of the analytic gradient 2 Jᵀ W r): in the flat valley the Gauss–Newton
    2 JᵀWJ misses half the curvature. On the Chinchilla fit (k = 40) the bound is about 1e−6 (α_m) and 3e−6 (α_ℓ)
    relative at tol = 1e−12: the objective's flat (c_ℓ, α_ℓ) valley, not float round-off, decides how many digits
    of a minimiser are reproducible.
    """
    theta = np.array(theta, float, ndmin=2)
    S, p = theta.shape
    w = np.ones((S, len(loss))) if weights is None else np.broadcast_to(np.asarray(weights, float), (S, len(loss)))

    def gradient(t: np.ndarray) -> np.ndarray:
        r, jac = log_residuals(t, x, loss)
        return 2 * np.einsum("sn,snp->sp", w * r, jac)

    r, _ = log_residuals(theta, x, loss)
    cost = (w * r ** 2).sum(-1)
    hessian = np.empty((S, p, p))
    for j in range(p):
        h = 1e-5 * np.maximum(1.0, np.abs(theta[:, j]))[:, None]
        step = np.zeros_like(theta)
        step[:, j:j + 1] = h
        hessian[:, :, j] = (gradient(theta + step) - gradient(theta - step)) / (2 * h)
    hessian = (hessian + np.swapaxes(hessian, 1, 2)) / 2
    h_inv = np.linalg.pinv(hessian)
    return np.sqrt(2 * rel_cost * cost[:, None] * np.clip(np.einsum("spp->sp", h_inv), 0, None))

"""The law as a function of its parameters (paper §3, App. B): a sum of power laws plus a constant.

    L(m, ℓ, D) = c_m / m^α_m + c_ℓ / ℓ^α_ℓ + c_D / D^α_D + L0          (width m, depth ℓ, data D)

and, for comparison, Chinchilla's classic form L(N, D) = E + A / N^α + B / D^β. Both are fitted with coefficients in
log space: θ = (ln c_1 … ln c_k, α_1 … α_k, L0). :func:`split`, :func:`parameter_names`, :func:`index` and
:func:`theta_of` are the one place that layout is written; everything else asks them by name. Everything here is
batched over S parameter vectors θ (S, 2k+1).
"""
from __future__ import annotations

import numpy as np

from depthlib.errors import InputError

LAWS = {
    # name: (features, term names)
    "decomposed": (("log_m", "log_l", "log_D"), ("m", "l", "D")),
    "chinchilla": (("log_N", "log_D_raw"), ("N", "D")),
}


def check_law(law: str) -> str:
    """``law``, or InputError naming the laws there are."""
    if law not in LAWS:
        raise InputError(f"unknown law '{law}' (choose from {', '.join(LAWS)})")
    return law


def term_names(law: str) -> tuple[str, ...]:
    """The law's power-law terms, in θ's order: ("m", "l", "D") or ("N", "D")."""
    return LAWS[check_law(law)][1]


def parameter_names(law: str) -> list[str]:
    """θ's entries by name: ``ln_c_<term>`` …, ``alpha_<term>`` …, ``L0``."""
    names = term_names(law)
    return [f"ln_c_{t}" for t in names] + [f"alpha_{t}" for t in names] + ["L0"]


def index(law: str, name: str) -> int:
    """Where parameter ``name`` (e.g. ``alpha_l``) sits in θ of ``law``."""
    names = parameter_names(law)
    if name not in names:
        raise InputError(f"the {law} law has no parameter '{name}' (it has {', '.join(names)})")
    return names.index(name)


def theta_of(law: str, **values: float) -> np.ndarray:
    """θ (2k+1,) of ``law`` from every parameter given by name."""
    names = parameter_names(law)
    if set(values) != set(names):
        raise InputError(f"θ of the {law} law needs exactly {', '.join(names)}; got {', '.join(values)}")
    return np.array([values[n] for n in names], float)


def split(theta: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ln c (…, k), α (…, k), L0 (…,)) of parameter vectors θ (…, 2k+1) of a law with ``k`` terms."""
    return theta[..., :k], theta[..., k:2 * k], theta[..., 2 * k]


def predict(theta: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """L̂ and its terms for parameter vectors θ (S, 2k+1) on features x (n, k).

    Returns (pred (S, n), terms (S, n, k)) with terms_j = exp(ln c_j − α_j x_j).
    """
    log_c, alpha, l0 = split(theta, x.shape[1])
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

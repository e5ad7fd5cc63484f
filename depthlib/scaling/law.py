"""The decomposed scaling law and its fits (paper §3, Fig. 2f, App. B), in one namespace.

    L(m, ℓ, D) = c_m / m^α_m + c_ℓ / ℓ^α_ℓ + c_D / D^α_D + L0          (width m, depth ℓ, data D)

One concept per module, re-exported here so that ``from depthlib.scaling import law; law.bootstrap(...)`` reads
as before:

- :mod:`depthlib.scaling.model`       the law as a function of θ, and θ's layout by parameter name
- :mod:`depthlib.scaling.points`      the Chinchilla runs as fitting arrays, the exclusion rule
- :mod:`depthlib.scaling.solvers`     Levenberg–Marquardt to convergence (and its tolerance), the paper's Adam, Huber
- :mod:`depthlib.scaling.fits`        one fitted law (:class:`Fit`), its standard errors, the presets, tables
- :mod:`depthlib.scaling.uncertainty` bootstrap, held-out splits, exclusion scans
"""
from depthlib.scaling.fits import (
    PUBLISHED,
    SE_METHODS,
    Fit,
    fit_decomposed_law,
    fits_table,
    gauss_newton_se,
    published_theta,
    sandwich_se,
    width_depth_optimum,
)
from depthlib.scaling.model import (
    LAWS,
    index,
    jacobian,
    log_residuals,
    parameter_names,
    predict,
    risk,
    split,
    term_names,
    theta_of,
)
from depthlib.scaling.points import (
    DATA_SCALE,
    DEPTH_SCALE,
    MIN_POINTS_PER_PARAMETER,
    N_EXCLUDED_PAPER,
    Points,
    check_enough_points,
    excluded_mask,
    features,
    min_points,
    n_free_parameters,
    select_points,
    warn_duplicate_rows,
)
from depthlib.scaling.solvers import (
    LM_TOL,
    PAPER_START,
    adam_paper,
    converged_theta,
    huber_refine,
    levenberg_marquardt,
    parameter_tolerance,
    start_grid,
)
from depthlib.scaling.uncertainty import bootstrap, bootstrap_counts, bootstrap_summary, exclusion_scan, held_out

__all__ = ["DATA_SCALE", "DEPTH_SCALE", "LAWS", "LM_TOL", "MIN_POINTS_PER_PARAMETER", "N_EXCLUDED_PAPER", "PAPER_START",
           "PUBLISHED", "SE_METHODS", "Fit", "Points", "adam_paper", "bootstrap", "bootstrap_counts", "bootstrap_summary",
           "check_enough_points", "converged_theta", "excluded_mask", "exclusion_scan", "features", "fit_decomposed_law",
           "fits_table", "gauss_newton_se", "held_out", "huber_refine", "index", "jacobian", "levenberg_marquardt",
           "log_residuals", "min_points", "n_free_parameters", "parameter_names", "parameter_tolerance", "predict",
           "published_theta", "risk", "sandwich_se", "select_points", "split", "start_grid", "term_names", "theta_of",
           "warn_duplicate_rows", "width_depth_optimum"]

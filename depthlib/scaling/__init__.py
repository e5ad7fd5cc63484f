"""Chapter 1: the decomposed scaling law on the Chinchilla runs (paper §3, Fig. 2f, App. B).

- :mod:`depthlib.scaling.model`       the law as a function of θ, and θ's layout by parameter name
- :mod:`depthlib.scaling.points`      the Chinchilla runs as fitting arrays, the exclusion rule
- :mod:`depthlib.scaling.solvers`     Levenberg–Marquardt to convergence (and its tolerance), the paper's Adam, Huber
- :mod:`depthlib.scaling.fits`        one fitted law, standard errors, presets, tables, the width–depth optimum
- :mod:`depthlib.scaling.uncertainty` bootstrap, held-out splits, exclusion scans
- :mod:`depthlib.scaling.law`         all of the above in one namespace
- :mod:`depthlib.scaling.chapter`     the chapter's profiles, the cached run it shows, and its replay check

``from depthlib import scaling; scaling.fit_decomposed_law(df)`` keeps working: the names below are re-exported.
"""
from depthlib.scaling.law import (
    DATA_SCALE,
    DEPTH_SCALE,
    LAWS,
    N_EXCLUDED_PAPER,
    PAPER_START,
    PUBLISHED,
    SE_METHODS,
    Fit,
    Points,
    adam_paper,
    bootstrap,
    bootstrap_summary,
    converged_theta,
    excluded_mask,
    exclusion_scan,
    features,
    fit_decomposed_law,
    fits_table,
    gauss_newton_se,
    held_out,
    index,
    jacobian,
    levenberg_marquardt,
    log_residuals,
    parameter_names,
    parameter_tolerance,
    predict,
    risk,
    sandwich_se,
    select_points,
    start_grid,
    theta_of,
    width_depth_optimum,
)

__all__ = ["DATA_SCALE", "DEPTH_SCALE", "LAWS", "N_EXCLUDED_PAPER", "PAPER_START", "PUBLISHED", "SE_METHODS", "Fit",
           "Points", "adam_paper", "bootstrap", "bootstrap_summary", "converged_theta", "excluded_mask",
           "exclusion_scan", "features", "fit_decomposed_law", "fits_table", "gauss_newton_se", "held_out", "index",
           "jacobian", "levenberg_marquardt", "log_residuals", "parameter_names", "parameter_tolerance", "predict",
           "risk", "sandwich_se", "select_points", "start_grid", "theta_of", "width_depth_optimum"]

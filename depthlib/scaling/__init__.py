"""Chapter 1: the decomposed scaling law on the Chinchilla runs (paper §3, Fig. 2f, App. B).

- :mod:`depthlib.scaling.law`     the law, its fits (paper preset, converged minimiser, Huber), standard errors,
                                  bootstrap, held-out splits, exclusion scans, the width–depth optimum
- :mod:`depthlib.scaling.chapter` the chapter's profiles, the cached run it shows, and its replay check

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
    jacobian,
    levenberg_marquardt,
    log_residuals,
    predict,
    risk,
    sandwich_se,
    select_points,
    start_grid,
    width_depth_optimum,
)

__all__ = ["DATA_SCALE", "DEPTH_SCALE", "LAWS", "N_EXCLUDED_PAPER", "PAPER_START", "PUBLISHED", "SE_METHODS", "Fit",
           "Points", "adam_paper", "bootstrap", "bootstrap_summary", "converged_theta", "excluded_mask", "exclusion_scan",
           "features", "fit_decomposed_law", "fits_table", "gauss_newton_se", "held_out", "jacobian",
           "levenberg_marquardt", "log_residuals", "predict", "risk", "sandwich_se", "select_points", "start_grid",
           "width_depth_optimum"]

"""The Chinchilla runs as fitting arrays (paper App. B): log features, the exclusion rule, the minimum of points.

Units follow the paper: ℓ' = 100 · (n_layers − depth_offset), D' = tokens / 1e6 (they change c_ℓ and c_D only).
The paper drops "the 40 highest losses" with a strict rule that drops the ties too (42 of the 245 rows).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthlib.errors import InputError
from depthlib.scaling.model import LAWS, check_law

DEPTH_SCALE = 100.0   # ℓ' = 100 ℓ (paper's rescaling; changes c_ℓ only)
DATA_SCALE = 1e6      # D' = D / 1e6
N_EXCLUDED_PAPER = 40  # "drop the 40 highest losses" (drops 42 rows because of ties, App. B)
#: A fit with fewer points than this per free parameter is refused: its SEs and exponents mean nothing
#: (7 parameters: at least 35 points for the decomposed law; 5 parameters: 25 for the classic form).
MIN_POINTS_PER_PARAMETER = 5


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

    Ties at the threshold are dropped too, so excluding 40 drops 42 of the 245 rows (as the paper's rule does).
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
    return 2 * len(LAWS[check_law(law)][1]) + 1


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

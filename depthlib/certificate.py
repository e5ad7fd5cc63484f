"""The convergence certificate every trained model of the book answers to (chapters 3, 6 and 7; ours).

A rule a schedule can meet — little change while the learning rate is decayed — is not convergence. A model is
**certified** when a *continuation* from its final weights — a fresh schedule re-warmed to its base rate and decayed
again — lowers its held-out loss by less than :data:`GAIN_BELOW`. The chapters' protocols (:mod:`depthlib.toy.certified`,
:mod:`depthlib.compose.certify`, :mod:`depthlib.lm.continuation`) say how long a continuation is and how often it is
repeated; the threshold and the gain are defined once, here.

Why 2 %: α_ℓ is the slope of log L against log ℓ over a range of depths (chapter 3: 6–48, ln 8 = 2.08). A model
whose loss could still fall by 2 % moves log L by at most ln 1.02 = 0.0198, so α_ℓ by at most 0.0198 / ln(ℓ_max/ℓ_min)
(≈ 0.01 over 6–48) if it sits at an end of the range: a tenth of the replicate spread of α_ℓ in chapter 3.
"""
from __future__ import annotations

#: A continuation gaining less than this (a fraction of the loss before it) certifies the model.
GAIN_BELOW = 0.02


def gain(before: float, after: float) -> float:
    """The continuation's gain: (held-out loss before − after) / before (negative when it rose)."""
    return (before - after) / before


__all__ = ["GAIN_BELOW", "gain"]

"""Per-query losses after a calibration, from many prompts' label scores at once (numpy): what a
search ranks prompts by and what a fidelity run compares caches on, with the label lean removed."""

from __future__ import annotations

import numpy as np

from icl_ssm.calibrate.base import NONE

SEARCHED = (NONE, "batch")  # calibrations read from the scores alone: no further forward pass


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def calibrated_query_losses(scores: np.ndarray, gold: np.ndarray, method: str) -> np.ndarray:
    """``scores (M, Q, L)`` label log-likelihoods, ``gold (Q,)`` label indices -> ``(M, Q)`` the
    cross-entropy over the label set after ``method`` (``none`` or ``batch``, estimated per
    subset over its ``Q`` queries)."""
    if method not in SEARCHED:
        raise ValueError(f"calibration {method!r} on subset losses; accepted: {', '.join(SEARCHED)}")
    logp = _log_softmax(np.asarray(scores, dtype=np.float64))
    if method == "batch":
        logp = _log_softmax(logp - logp.mean(1, keepdims=True))  # (M, Q, L)
    return -np.take_along_axis(logp, np.asarray(gold)[None, :, None].repeat(logp.shape[0], 0), -1)[..., 0]



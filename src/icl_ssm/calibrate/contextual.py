"""Contextual calibration (Zhao et al., "Calibrate Before Use", ICML 2021): the bias is the log of
the mean label probabilities the prompt gives content-free inputs ("N/A", "", "[MASK]")."""

from __future__ import annotations

import math

import torch

from icl_ssm.calibrate.base import Calibrator, register
from icl_ssm.data.tasks import Example

CONTENT_FREE = ("N/A", "", "[MASK]")


@register
class ContextualCalibration(Calibrator):
    name = "contextual"

    def inputs(self, examples, rng):
        return [Example(f"content-free-{i}", text, "") for i, text in enumerate(CONTENT_FREE)]

    def fit(self, logp, gold):
        return torch.logsumexp(logp, dim=0) - math.log(logp.shape[0])  # log of the mean probability, (L,)

    def describe(self, inputs: int) -> str:
        return f"the mean label probability of {inputs} content-free inputs ({', '.join(map(repr, CONTENT_FREE))})"

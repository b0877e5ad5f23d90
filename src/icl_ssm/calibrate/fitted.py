"""A per-label bias fitted on labelled examples: the ``(L,)`` vector that minimises the mean
cross-entropy of ``log_softmax(logp - bias)`` against the gold labels (convex; L-BFGS). It learns
the examples' label shares with the prompt's lean, so it suits inputs whose labels are spread as
the examples' are."""

from __future__ import annotations

import torch

from icl_ssm.calibrate.base import Calibrator, register

STEPS = 100


@register
class FittedCalibration(Calibrator):
    name = "fitted"
    needs_labels = True

    def fit(self, logp, gold):
        bias = torch.zeros(logp.shape[1], dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([bias], max_iter=STEPS, line_search_fn="strong_wolfe")

        def loss():
            opt.zero_grad()
            value = torch.nn.functional.cross_entropy(logp.double() - bias, gold) + 1e-4 * bias.pow(2).sum()
            value.backward()
            return value

        with torch.enable_grad():
            opt.step(loss)
        return bias.detach()

    def describe(self, inputs: int) -> str:
        return f"the bias minimising the cross-entropy on {inputs} labelled inputs"

"""Batch calibration (Zhou et al., "Batch Calibration: Rethinking Calibration for In-Context
Learning and Prompt Engineering", ICLR 2024): the bias is each label's mean log-probability over
a batch of unlabelled inputs of the task. It assumes the batch's labels are roughly balanced: on
a batch that leans one way it pushes answers the other way (measured in
docs/research/calibration.md)."""

from __future__ import annotations

from icl_ssm.calibrate.base import Calibrator, register


@register
class BatchCalibration(Calibrator):
    name = "batch"

    def fit(self, logp, gold):
        return logp.mean(0)  # (L,)

    def describe(self, inputs: int) -> str:
        return f"the mean label log-probability over {inputs} unlabelled inputs"

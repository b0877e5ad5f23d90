"""Domain-context calibration (Fei et al., "Mitigating Label Biases for In-context Learning", ACL
2023): the bias is the log of the mean label probabilities of random strings of in-domain words,
each as long as a typical input, drawn from the task's own texts."""

from __future__ import annotations

import math

import torch

from icl_ssm.calibrate.base import Calibrator, register
from icl_ssm.data.tasks import Example

STRINGS = 20


@register
class DomainCalibration(Calibrator):
    name = "domain"

    def inputs(self, examples, rng):
        texts = [e.input.split() for e in examples]
        words = [w for t in texts for w in t]
        if not words:
            raise ValueError("domain calibration draws words from the task's inputs, and these hold none")
        length = max(1, int(round(sum(len(t) for t in texts) / len(texts))))
        return [Example(f"domain-{i}", " ".join(rng.choice(words, size=length)), "") for i in range(STRINGS)]

    def fit(self, logp, gold):
        return torch.logsumexp(logp, dim=0) - math.log(logp.shape[0])  # (L,)

    def describe(self, inputs: int) -> str:
        return f"the mean label probability of {inputs} random strings of in-domain words"

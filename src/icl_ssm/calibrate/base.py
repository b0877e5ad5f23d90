"""The calibration contract: :class:`Calibrator` (which inputs, and the bias from their label
scores) and :class:`Calibration` (the bias, applied to any answer's label scores, saved and loaded).

Label scores are ``(n, L)`` log-likelihoods of each label's verbaliser. A calibration works on
their log-softmax over the label set (the label log-probabilities) and subtracts a bias ``(L,)``
from every row; the answer is the argmax of the result. Subtracting a per-row constant changes
neither the argmax nor the softmax, so the raw verbaliser log-likelihoods and their log-softmax
give the same calibrated answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from icl_ssm.data.tasks import Example

NONE = "none"
# (inputs) -> (n, L) label log-likelihoods after the prompt being calibrated
Scorer = Callable[[Sequence[Example]], Tensor]


@dataclass(frozen=True)
class Calibration:
    """A per-label bias and where it came from.

    ``method``: the calibrator's name (``"none"``: no bias); ``labels``: the label names, in the
    order of the scores' columns; ``bias``: ``(L,)``, subtracted from each label's log-probability;
    ``inputs``: how many inputs it was estimated on; ``source``: what they were (a sentence).
    """

    method: str
    labels: tuple[str, ...]
    bias: tuple[float, ...]
    inputs: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.bias) != len(self.labels):
            raise ValueError(f"calibration {self.method!r}: {len(self.bias)} bias values for {len(self.labels)} labels "
                             f"{list(self.labels)}; expected one per label")
        if not all(math.isfinite(b) for b in self.bias):
            raise ValueError(f"calibration {self.method!r}: bias {list(self.bias)} is not finite")

    @property
    def is_none(self) -> bool:
        return self.method == NONE

    def apply(self, scores: Tensor) -> Tensor:
        """``scores (n, L)`` -> calibrated ``(n, L)``: unchanged for ``none``, else
        ``log_softmax(scores) - bias``."""
        if scores.shape[-1] != len(self.labels):
            raise ValueError(f"scores of {scores.shape[-1]} labels; calibration {self.method!r} has "
                             f"{len(self.labels)} ({', '.join(self.labels)})")
        if self.is_none:
            return scores
        bias = torch.tensor(self.bias, dtype=scores.dtype, device=scores.device)
        return torch.log_softmax(scores, dim=-1) - bias

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "labels": list(self.labels), "bias": [float(b) for b in self.bias],
                "inputs": self.inputs, "source": self.source}

    @staticmethod
    def from_dict(data: Any, where: str = "the calibration") -> Calibration:
        """A calibration from :meth:`to_dict`'s layout; a clear error naming ``where`` otherwise."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object with method, labels and bias; got {type(data).__name__}")
        missing = [key for key in ("method", "labels", "bias") if key not in data]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        unknown = sorted(set(data) - {"method", "labels", "bias", "inputs", "source"})
        if unknown:
            raise ValueError(f"{where}: unknown keys {', '.join(unknown)}; accepted: method, labels, bias, inputs, "
                             "source")
        if data["method"] != NONE and data["method"] not in CALIBRATORS:
            raise ValueError(f"{where}: method {data['method']!r}; accepted: {', '.join((NONE, *CALIBRATORS))}")
        labels, bias = data["labels"], data["bias"]
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise ValueError(f"{where}: labels {labels!r}; expected a list of label names")
        if not isinstance(bias, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in bias):
            raise ValueError(f"{where}: bias {bias!r}; expected a list of numbers, one per label")
        inputs = data.get("inputs", 0)
        if not isinstance(inputs, int) or isinstance(inputs, bool) or inputs < 0:
            raise ValueError(f"{where}: inputs {inputs!r}; expected a count >= 0")
        try:
            return Calibration(data["method"], tuple(labels), tuple(float(b) for b in bias), inputs,
                               str(data.get("source", "")))
        except ValueError as err:  # a bias per label, each finite: name where the values came from
            raise ValueError(f"{where}: {err}") from err


def no_calibration(labels: Sequence[str]) -> Calibration:
    """The identity: raw scores."""
    return Calibration(NONE, tuple(labels), tuple(0.0 for _ in labels))


class Calibrator:
    """One calibration method. Override :meth:`fit` (and :meth:`inputs` where the bias is not
    estimated on the given examples themselves); register the class with :func:`register`.

    ``needs_labels``: :meth:`fit` reads the gold labels (it is then estimated on labelled
    examples only)."""

    name: ClassVar[str] = ""
    needs_labels: ClassVar[bool] = False

    def inputs(self, examples: Sequence[Example], rng: np.random.Generator) -> list[Example]:
        """The inputs whose label scores the bias is estimated from (default: ``examples``)."""
        return list(examples)

    def fit(self, logp: Tensor, gold: Tensor | None) -> Tensor:
        """``logp (n, L)`` label log-probabilities (log-softmax over the labels) of the inputs;
        ``gold (n,)`` their label indices where :attr:`needs_labels`, else None -> bias ``(L,)``."""
        raise NotImplementedError  # abstract: every calibrator overrides it

    def describe(self, inputs: int) -> str:
        return f"{inputs} inputs"


CALIBRATORS: dict[str, type[Calibrator]] = {}


def register(cls: type[Calibrator]) -> type[Calibrator]:
    CALIBRATORS[cls.name] = cls
    return cls


def get_calibrator(name: str) -> Calibrator:
    if name not in CALIBRATORS:
        raise ValueError(f"calibration {name!r}; accepted: {', '.join((NONE, *CALIBRATORS))}")
    return CALIBRATORS[name]()


def estimate(method: str, labels: Sequence[str], scorer: Scorer, examples: Sequence[Example],
             gold: Sequence[int] | None = None, *, rng: np.random.Generator | None = None) -> Calibration:
    """The calibration ``method`` for one prompt: ``scorer`` (inputs -> ``(n, L)`` label
    log-likelihoods after that prompt) is run on the calibrator's inputs drawn from ``examples``
    and its bias fitted; ``gold`` (label index per example) for a method that reads labels."""
    if method == NONE:
        return no_calibration(labels)
    calibrator = get_calibrator(method)
    if not examples:
        raise ValueError(f"calibration {method!r} needs examples to estimate its bias on; got none")
    rng = rng if rng is not None else np.random.default_rng(0)
    inputs = calibrator.inputs(examples, rng)
    target = None
    if calibrator.needs_labels:
        if gold is None or len(gold) != len(examples):
            raise ValueError(f"calibration {method!r} fits its bias on labelled examples: expected a gold label index "
                             f"for each of the {len(examples)} examples")
        target = torch.as_tensor(list(gold), dtype=torch.long)
    scores = scorer(inputs).double()
    if scores.shape != (len(inputs), len(labels)):
        raise ValueError(f"the scorer returned {tuple(scores.shape)} for {len(inputs)} inputs and {len(labels)} labels")
    bias = calibrator.fit(torch.log_softmax(scores, dim=-1), target)
    bias = bias - bias.mean()  # only differences between labels matter: centred, so bias files compare
    return Calibration(method, tuple(labels), tuple(float(b) for b in bias), len(inputs),
                       calibrator.describe(len(inputs)))

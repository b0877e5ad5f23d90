"""Subset losses after a calibration: a prompt scored on validation exactly as it will answer.

:func:`calibrated_losses` turns the label scores an evaluator read (``SubsetLosses.query_scores``)
into each subset's label-balanced cross-entropy over the label set after a calibration method
(:mod:`icl_ssm.calibrate`) estimated on those same queries: ``none`` (the raw scores) or ``batch``
(each subset's mean label log-probability over the queries, their labels unread). Both are read
from one forward pass, so a search can score every (prompt, calibration) pair for the price of
the prompt. :class:`CalibratedEvaluator` wraps any evaluator that reads label scores and returns
these losses, so that Algorithm 2 or the order search can rank prompts as calibrated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from icl_ssm.calibrate.losses import calibrated_query_losses
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import label_weights
from icl_ssm.select.subset_losses import SubsetEvaluator, SubsetLosses


def calibrated_losses(scores: np.ndarray, gold: np.ndarray, method: str) -> np.ndarray:
    """``(M,)`` each subset's label-balanced mean of :func:`calibrated_query_losses` (every label
    present the same weight, :func:`~icl_ssm.evaluate.stats.label_weights`)."""
    return calibrated_query_losses(scores, gold, method) @ label_weights(np.asarray(gold))


def gold_indices(labels: Sequence[str], queries: Sequence[Example]) -> np.ndarray:
    """``(Q,)`` each query's label index in ``labels``."""
    where = {label: i for i, label in enumerate(labels)}
    missing = sorted({q.target for q in queries if q.target not in where})
    if missing:
        raise ValueError(f"validation labels {missing} are not among the task's {list(labels)}")
    return np.array([where[q.target] for q in queries])


@dataclass
class CalibratedEvaluator(SubsetEvaluator):
    """``inner``'s subsets scored after ``method`` (label-balanced cross-entropy, see the module);
    ``labels``: the task's label set, in the scores' column order."""

    inner: SubsetEvaluator
    method: str
    labels: tuple[str, ...]

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.inner.name}+{self.method}"

    def evaluate(self, pool, validation, subsets):
        result = self.inner.evaluate(pool, validation, subsets)
        if result.query_scores is None:
            raise ValueError(f"evaluator {self.inner.name!r} reads no label scores, so no calibration can be applied")
        gold = gold_indices(self.labels, validation)
        per_query = calibrated_query_losses(result.query_scores, gold, self.method)
        return SubsetLosses(per_query @ label_weights(gold), result.cost, result.tokens, per_query, gold,
                            result.query_scores)

"""The prompt order of a chosen set: the order with the lowest validation loss among a few
candidates (``--order search``, and the prompt search's last phase)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from icl_ssm.data.tasks import Example
from icl_ssm.select.base import arrange
from icl_ssm.select.subset_losses import SubsetEvaluator


def search_order(evaluator: SubsetEvaluator, pool: Sequence[Example], validation: Sequence[Example],
                 indices: Sequence[int], labels: Sequence[str], candidates: int,
                 rng: np.random.Generator) -> tuple[list[int], dict[str, Any]]:
    """The prompt order of the chosen ``indices`` with the lowest validation loss under ``evaluator``.

    The candidates are the ``score`` order, ``interleave`` and ``candidates - 2`` random
    permutations drawn from ``rng`` (with :func:`order_rng` the first is ``--order random``'s).
    Each is a "subset" in that order, so any evaluator scores it (the dense one reads the real
    prompt). Returns the best order (the first of equal losses) and, for the record, the cost
    (FLOPs, seconds) and every candidate's order name, indices and loss.
    """
    if candidates < 2:
        raise ValueError(f"order candidates={candidates}; expected >= 2 (score, interleave, then random orders)")
    names = ["score", "interleave"] + ["random"] * (candidates - 2)
    orders = [arrange(indices, labels, name, rng) for name in names]
    result = evaluator.evaluate(pool, validation, orders)
    losses = result.losses
    best = int(np.argmin(losses))
    return orders[best], {"chosen": best, "flops": result.cost.flops, "seconds": result.cost.seconds, "candidates": [
        {"order": name, "indices": list(order), "validation_loss": float(loss)}
        for name, order, loss in zip(names, orders, losses, strict=True)]}

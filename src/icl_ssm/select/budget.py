"""Affinity budgets sized to reliability: a pilot round measures how far the affinity scores can
be trusted, and the main round grows the validation queries and the subsets until a target
reliability is predicted or the time budget is spent.

Two reliabilities, each a split-half correlation corrected by Spearman-Brown:

- **subset losses** (over queries): do two halves of the validation queries rank the subsets
  alike? More queries raise it (:func:`~icl_ssm.evaluate.stats.queries_for_reliability`).
- **candidate scores** (over subsets): do the affinity scores from two halves of the subsets
  rank the candidates alike? More subsets raise it (:func:`subsets_for_reliability`).

The time of the main round is estimated from the pilot's, in proportion to subsets x queries:
an upper bound, since the cache of a subset is built once whatever the number of queries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from icl_ssm.evaluate.stats import queries_for_reliability, spearman, spearman_brown
from icl_ssm.select.evaluators import RELIABILITY_TARGET

PILOT_QUERIES = 8  # validation queries of the pilot round


def score_split_half(subsets: Sequence[Sequence[int]], losses: np.ndarray, n: int,
                     estimate: Callable[[Sequence[Sequence[int]], np.ndarray, int], tuple[np.ndarray, np.ndarray]]
                     ) -> float:
    """Spearman between the candidates' scores from the even and from the odd subsets, over the
    candidates both halves score; NaN with fewer than 3 such candidates."""
    losses = np.asarray(losses, dtype=float)
    a, _ = estimate([subsets[j] for j in range(0, len(subsets), 2)], losses[0::2], n)
    b, _ = estimate([subsets[j] for j in range(1, len(subsets), 2)], losses[1::2], n)
    both = np.isfinite(a) & np.isfinite(b)
    if both.sum() < 3:
        return math.nan
    return spearman(a[both], b[both])


def subsets_for_reliability(half: float, subsets: int, target: float = RELIABILITY_TARGET) -> int | None:
    """Subsets Spearman-Brown predicts the candidate scores need for reliability ``target``, from
    the split-half ``half`` measured on ``subsets`` subsets (halves of ``subsets / 2``); None when
    ``half <= 0`` or NaN (no number of subsets is predicted to reach it)."""
    if not 0 < target < 1:
        raise ValueError(f"target={target}: expected a reliability between 0 and 1")
    if not math.isfinite(half) or half <= 0:
        return None
    if half >= 1:
        return subsets
    factor = target * (1 - half) / (half * (1 - target))
    return max(2, math.ceil(factor * subsets / 2 - 1e-9))


@dataclass
class Reliability:
    """Split-halves (``*_half``) and their Spearman-Brown corrected reliabilities; a split-half of
    0 or below (the halves disagree) has reliability 0, since the formula means nothing there."""

    loss_half: float
    score_half: float

    @property
    def losses(self) -> float:
        return _corrected(self.loss_half)

    @property
    def scores(self) -> float:
        return _corrected(self.score_half)

    def as_dict(self) -> dict[str, float | None]:
        def fin(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        return {"loss_split_half": fin(self.loss_half), "loss_reliability": fin(self.losses),
                "score_split_half": fin(self.score_half), "score_reliability": fin(self.scores)}


@dataclass
class BudgetPlan:
    """The main round: ``subsets`` subsets on the first ``queries`` validation queries, and the
    seconds that is estimated to take (pilot included); ``limited`` names what stopped the
    growth short of the target (``"budget"``, ``"queries"``: no more validation queries,
    ``"unpredictable"``: a split-half <= 0) or is None when the target is predicted."""

    subsets: int
    queries: int
    estimated_seconds: float
    limited: str | None

    def as_dict(self) -> dict:
        return asdict(self)


def plan_budget(*, pilot_subsets: int, pilot_queries: int, pilot_seconds: float, reliability: Reliability,
                max_queries: int, min_subsets: int, budget_seconds: float,
                target: float = RELIABILITY_TARGET) -> BudgetPlan:
    """Queries and subsets for the main round.

    Queries: what the subset losses' split-half predicts for ``target`` (at least the pilot's,
    at most ``max_queries``). Subsets: what the candidate scores' split-half predicts, at least
    the pilot's and ``min_subsets``; where a split-half is <= 0 nothing is predicted and the
    budget decides. Then the plan is cut to ``budget_seconds``: fewer subsets first (not
    below the pilot's), then fewer queries. Time per subset-query is the pilot's.
    """
    if min(pilot_subsets, pilot_queries, max_queries) < 1 or pilot_seconds < 0 or budget_seconds <= 0:
        raise ValueError(f"plan_budget: pilot {pilot_subsets} subsets x {pilot_queries} queries in {pilot_seconds} s, "
                         f"max_queries {max_queries}, budget {budget_seconds} s: expected positive sizes and budget")
    unit = pilot_seconds / (pilot_subsets * pilot_queries)  # seconds per subset-query
    limited = None
    want_q = queries_for_reliability(reliability.loss_half, pilot_queries, target) if pilot_queries >= 2 else None
    if want_q is None:
        queries, limited = max_queries, "unpredictable"
    else:
        queries = max(pilot_queries, want_q)
        if queries > max_queries:
            queries, limited = max_queries, "queries"
    want_m = subsets_for_reliability(reliability.score_half, pilot_subsets, target)
    base = max(pilot_subsets, min_subsets)
    if want_m is None:
        limited = limited or "unpredictable"
        subsets = None  # as many as the budget affords
    else:
        subsets = max(base, want_m)

    def cost(m: int, q: int) -> float:  # pilot subsets are reused when the queries do not grow
        new = m - pilot_subsets if q == pilot_queries else m
        return pilot_seconds + unit * new * q

    left = budget_seconds - pilot_seconds
    affordable = int(max(left, 0.0) // (unit * queries)) if unit > 0 else 10**9
    if queries == pilot_queries:
        affordable += pilot_subsets
    if subsets is None:  # nothing predicted: what the budget affords (ten times the base for a free evaluator)
        subsets = max(base, affordable if unit > 0 else 10 * base)
    if subsets > affordable:
        limited = "budget"
        subsets = max(base, affordable)
        while queries > pilot_queries and cost(subsets, queries) > budget_seconds:
            queries = max(pilot_queries, int(queries * 0.8))
    return BudgetPlan(subsets=int(subsets), queries=int(queries), estimated_seconds=cost(subsets, queries),
                      limited=limited)


def plan_lines(pilot: dict, plan: BudgetPlan, budget_seconds: float, target: float) -> list[str]:
    """The pilot's findings and the plan, for stderr, before the main round is spent."""
    r = pilot["reliability"]
    why = {"budget": f"cut to the budget of {budget_seconds / 60:.1f} min",
           "queries": "every validation query set aside for selection is used",
           "unpredictable": "a split-half <= 0 predicts nothing, so the budget decides", None: "predicted to reach it"}
    return [f"pilot: {pilot['subsets']} subsets x {pilot['queries']} queries in {pilot['seconds']:.0f} s; reliability "
            f"of the subset losses {_r(r['loss_reliability'])}, of the candidates' scores {_r(r['score_reliability'])}",
            f"plan for reliability {target}: {plan.subsets} subsets x {plan.queries} queries, about "
            f"{plan.estimated_seconds / 60:.1f} min at most ({why[plan.limited]})"]


def _corrected(half: float) -> float:
    return math.nan if not math.isfinite(half) else spearman_brown(half) if half > 0 else 0.0


def _r(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"

"""Affinity budgets sized to reliability: a pilot round measures how far the affinity scores can
be trusted, and the main round grows the validation queries and the subsets until a target
reliability is predicted or the time budget is spent.

Two reliabilities, each a split-half correlation corrected by Spearman-Brown:

- **subset losses** (over queries): do two halves of the validation queries rank the subsets
  alike? More queries raise it (:func:`~icl_ssm.evaluate.stats.queries_for_reliability`).
- **candidate scores** (over subsets): do the affinity scores from two halves of the subsets
  rank the candidates alike? More subsets raise it (:func:`subsets_for_reliability`). The
  halves are alternate permutation blocks (:func:`block_halves`), so that each holds every
  candidate.

A pilot's split-halves are noisy, so the plan is made from their one-sided lower confidence
bounds (:func:`spearman_lower_bound`), not from the points.

The time of the main round is estimated from the pilot's, in proportion to subsets x queries:
an upper bound, since the cache of a subset is built once whatever the number of queries.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from icl_ssm.evaluate.stats import queries_for_reliability, spearman, spearman_brown
from icl_ssm.select.sampling import label_quotas
from icl_ssm.select.subset_losses import RELIABILITY_TARGET, SubsetLosses, split_half

PILOT_QUERIES = 8  # validation queries of the pilot round
PLAN_CONFIDENCE = 0.9  # one-sided level of the split-halves' lower bounds the plan is made from

Estimate = Callable[[Sequence[Sequence[int]], np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def permutation_block(n: int, k: int, labels: Sequence[str] | None = None) -> int:
    """Subsets of ``k`` that one pass over the ``n`` candidates fills: ``ceil(n / k)``; with
    ``labels`` (label-stratified subsets, :func:`~icl_ssm.select.sampling.label_quotas`), the
    most any label's candidates need at its quota, ``max_y ceil(n_y / quota_y)``."""
    if labels is None:
        if not 1 <= k <= n:
            raise ValueError(f"k={k}: expected 1 <= k <= n={n}")
        return math.ceil(n / k)
    counts = Counter(labels)
    return max(math.ceil(counts[y] / q) for y, q in label_quotas(labels, k).items())


def draw_in_blocks(draw: Callable[[int], list[list[int]]], total: int, block: int) -> list[list[int]]:
    """``total`` subsets, ``block`` at a time, each block from its own call ``draw(size)``.

    With ``draw`` a fresh balanced stream (:func:`~icl_ssm.select.sampling.balanced_subsets`,
    or :func:`~icl_ssm.select.sampling.stratified_subsets` with ``block`` from
    :func:`permutation_block` on the labels), each full block opens with a whole permutation
    of the candidates (of each label), so it holds every candidate at least once. One stream
    cut into blocks does that only where ``k`` divides ``n``: elsewhere a subset straddles two
    permutations and the blocks drift across them.
    """
    if block < 1 or total < 0:
        raise ValueError(f"draw_in_blocks: total={total}, block={block}: expected total >= 0 and block >= 1")
    return [s for start in range(0, total, block) for s in draw(min(block, total - start))]


def block_halves(m: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of ``m`` subsets split in two by blocks: subsets ``[b * block, (b + 1) * block)``
    go to the first half for even ``b``, to the second for odd ``b``. Returns two int arrays.

    On subsets drawn by :func:`draw_in_blocks` with the same ``block`` and ``m >= 2 * block``,
    every candidate is in both halves. On one balanced stream it holds exactly where the
    blocks are whole permutations (``k`` divides ``n``, unstratified) and only about elsewhere;
    a split by parity guarantees it in neither case.
    """
    if block < 1:
        raise ValueError(f"block={block}: expected at least 1 subset per block")
    first = (np.arange(m) // block) % 2 == 0
    return np.flatnonzero(first), np.flatnonzero(~first)


def _score_halves(subsets: Sequence[Sequence[int]], losses: np.ndarray, n: int, estimate: Estimate,
                  block: int) -> tuple[np.ndarray, np.ndarray]:
    """The two halves' scores ``(c,), (c,)`` over the ``c`` candidates both halves score."""
    losses = np.asarray(losses, dtype=float)
    first, second = block_halves(len(subsets), block)
    if not len(first) or not len(second):
        return np.zeros(0), np.zeros(0)
    a, _ = estimate([subsets[j] for j in first], losses[first], n)
    b, _ = estimate([subsets[j] for j in second], losses[second], n)
    both = np.isfinite(a) & np.isfinite(b)
    return a[both], b[both]


def score_split_half(subsets: Sequence[Sequence[int]], losses: np.ndarray, n: int, estimate: Estimate,
                     block: int) -> float:
    """Spearman between the candidates' scores from the two halves of the subsets (alternate
    blocks of ``block`` subsets, :func:`block_halves`), over the candidates both halves score;
    NaN with fewer than 3 such candidates."""
    a, b = _score_halves(subsets, losses, n, estimate, block)
    return spearman(a, b) if len(a) >= 3 else math.nan


def spearman_lower_bound(rho: float, pairs: int, confidence: float = PLAN_CONFIDENCE) -> float:
    """One-sided lower confidence bound at ``confidence`` of a Spearman correlation ``rho``
    measured on ``pairs`` pairs, the pairs taken as independent: Fisher's z with the variance
    ``1.06 / (pairs - 3)`` of Fieller, Hartley and Pearson (1957). NaN for a NaN ``rho`` or
    fewer than 4 pairs."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: expected a level between 0 and 1")
    if not math.isfinite(rho) or pairs < 4:
        return math.nan
    z = math.atanh(min(max(rho, -1 + 1e-12), 1 - 1e-12))
    return math.tanh(z - NormalDist().inv_cdf(confidence) * math.sqrt(1.06 / (pairs - 3)))


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
    0 or below (the halves disagree) has reliability 0, since the formula means nothing there.

    ``subsets``: the subsets the loss split-half ranks; ``candidates``: the candidates the score
    split-half ranks. They set the width of the lower bounds (:meth:`lower`); where None, that
    split-half is taken as exact (its bound is the point).
    """

    loss_half: float
    score_half: float
    subsets: int | None = None
    candidates: int | None = None

    @classmethod
    def measure(cls, result: SubsetLosses, subsets: Sequence[Sequence[int]], n: int, estimate: Estimate,
                block: int) -> Reliability:
        """Both split-halves of ``result`` (the losses of ``subsets``, in order) and their sizes:
        the queries' (:func:`~icl_ssm.select.subset_losses.split_half`) and the subsets' by blocks
        of ``block`` (:func:`score_split_half`)."""
        a, b = _score_halves(subsets, result.losses, n, estimate, block)
        rows = result.query_losses.shape[0] if result.query_losses is not None else 0
        return cls(split_half(result), spearman(a, b) if len(a) >= 3 else math.nan, rows, len(a))

    @property
    def losses(self) -> float:
        return _corrected(self.loss_half)

    @property
    def scores(self) -> float:
        return _corrected(self.score_half)

    def lower(self, confidence: float = PLAN_CONFIDENCE) -> tuple[float, float]:
        """One-sided lower bounds ``(loss, score)`` of the two split-halves at ``confidence``
        (:func:`spearman_lower_bound`); the point itself where its size is None."""
        def bound(half: float, pairs: int | None) -> float:
            return half if pairs is None else spearman_lower_bound(half, pairs, confidence)

        return bound(self.loss_half, self.subsets), bound(self.score_half, self.candidates)

    def as_dict(self) -> dict[str, float | None]:
        return {"loss_split_half": _finite(self.loss_half), "loss_reliability": _finite(self.losses),
                "score_split_half": _finite(self.score_half), "score_reliability": _finite(self.scores)}


@dataclass
class BudgetPlan:
    """The main round: ``subsets`` subsets on the first ``queries`` validation queries, and the
    seconds that is estimated to take (pilot included); ``limited`` names what stopped the
    growth short of the target (``"budget"``, ``"queries"``: no more validation queries,
    ``"unpredictable"``: a split-half's lower bound <= 0 or NaN) or is None when the target is
    predicted. The pilot's split-halves (``*_split_half``) and the lower bounds at
    ``confidence`` the plan was made from (``*_split_half_lower``) come with it."""

    subsets: int
    queries: int
    estimated_seconds: float
    limited: str | None
    confidence: float
    loss_split_half: float
    loss_split_half_lower: float
    score_split_half: float
    score_split_half_lower: float

    def as_dict(self) -> dict:
        return {key: _finite(v) if isinstance(v, float) else v for key, v in asdict(self).items()}


def plan_budget(*, pilot_subsets: int, pilot_queries: int, pilot_seconds: float, reliability: Reliability,
                max_queries: int, min_subsets: int, budget_seconds: float,
                target: float = RELIABILITY_TARGET, confidence: float = PLAN_CONFIDENCE) -> BudgetPlan:
    """Queries and subsets for the main round.

    Planned on the split-halves' lower bounds at ``confidence`` (:meth:`Reliability.lower`).
    Queries: what the subset losses' bound predicts for ``target`` (at least the pilot's, at
    most ``max_queries``). Subsets: what the candidate scores' bound predicts, at least the
    pilot's and ``min_subsets``; where a bound is <= 0 or NaN nothing is predicted and the
    budget decides. Then the plan is cut to ``budget_seconds``: fewer subsets first (not below
    the pilot's and ``min_subsets``), then the fewest queries cut that lets those fit; at the
    queries kept, the subsets grow back to what the budget affords (up to the predicted
    number). Time per subset-query is the pilot's; the pilot's subsets are reused when the
    queries do not grow. Where the floor of subsets does not fit even on the pilot's queries,
    the plan is that floor on the pilot's queries, over the budget.
    """
    if min(pilot_subsets, pilot_queries, max_queries) < 1 or pilot_seconds < 0 or budget_seconds <= 0:
        raise ValueError(f"plan_budget: pilot {pilot_subsets} subsets x {pilot_queries} queries in {pilot_seconds} s, "
                         f"max_queries {max_queries}, budget {budget_seconds} s: expected positive sizes and budget")
    loss_low, score_low = reliability.lower(confidence)
    unit = pilot_seconds / (pilot_subsets * pilot_queries)  # seconds per subset-query
    left = max(budget_seconds - pilot_seconds, 0.0)
    limited = None
    want_q = queries_for_reliability(loss_low, pilot_queries, target) if pilot_queries >= 2 else None
    if want_q is None:
        queries, limited = max_queries, "unpredictable"
    else:
        queries = max(pilot_queries, want_q)
        if queries > max_queries:
            queries, limited = max_queries, "queries"
    want_m = subsets_for_reliability(score_low, pilot_subsets, target)
    base = max(pilot_subsets, min_subsets)

    def cost(m: int, q: int) -> float:  # pilot subsets are reused when the queries do not grow
        new = m - pilot_subsets if q == pilot_queries else m
        return pilot_seconds + unit * new * q

    def affordable(q: int) -> int:  # the most subsets whose cost at q queries is within the budget
        if unit == 0:
            return 10**9
        return int(left / (unit * q) + 1e-9) + (pilot_subsets if q == pilot_queries else 0)

    if want_m is None:  # nothing predicted: what the budget affords (ten times the base for a free evaluator)
        limited = limited or "unpredictable"
        subsets = max(base, affordable(queries) if unit > 0 else 10 * base)
    else:
        subsets = max(base, want_m)
    if subsets > affordable(queries):
        limited = "budget"
        if affordable(queries) < base and queries > pilot_queries:  # the fewest queries cut for the base to fit
            queries = max(pilot_queries, min(queries, int(left / (unit * base) + 1e-9)))
        subsets = max(base, min(subsets, affordable(queries)))  # the time a cut frees goes back to subsets
    return BudgetPlan(subsets=int(subsets), queries=int(queries), estimated_seconds=cost(subsets, queries),
                      limited=limited, confidence=confidence, loss_split_half=float(reliability.loss_half),
                      loss_split_half_lower=float(loss_low), score_split_half=float(reliability.score_half),
                      score_split_half_lower=float(score_low))


def plan_lines(pilot: dict, plan: BudgetPlan, budget_seconds: float, target: float) -> list[str]:
    """The pilot's findings and the plan, for stderr, before the main round is spent: each
    reliability with its split-half and that split-half's lower bound, which the plan is made from."""
    r = pilot["reliability"]
    why = {"budget": f"cut to the budget of {budget_seconds / 60:.1f} min",
           "queries": "every validation query set aside for selection is used",
           "unpredictable": "a split-half's lower bound <= 0 predicts nothing, so the budget decides",
           None: "predicted from the lower bounds to reach it"}
    level = f"{plan.confidence:.0%}"
    return [f"pilot: {pilot['subsets']} subsets x {pilot['queries']} queries in {pilot['seconds']:.0f} s; reliability "
            f"of the subset losses {_r(r['loss_reliability'])} (split-half {_r(_finite(plan.loss_split_half))}, "
            f"{level} lower bound {_r(_finite(plan.loss_split_half_lower))}), of the candidates' scores "
            f"{_r(r['score_reliability'])} (split-half {_r(_finite(plan.score_split_half))}, {level} lower bound "
            f"{_r(_finite(plan.score_split_half_lower))})",
            f"plan for reliability {target}: {plan.subsets} subsets x {plan.queries} queries, about "
            f"{plan.estimated_seconds / 60:.1f} min at most ({why[plan.limited]})"]


def _corrected(half: float) -> float:
    return math.nan if not math.isfinite(half) else spearman_brown(half) if half > 0 else 0.0


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _r(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"

"""Algorithm 2: sample subsets of the pool, score each by its validation loss from a
:class:`~icl_ssm.select.subset_losses.SubsetEvaluator`, give each candidate an affinity score and
take the best ``k``; and the search over prompt orders."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from icl_ssm.cost import Cost
from icl_ssm.select.base import (
    Hooks,
    Selection,
    Selector,
    register,
    top_k,
    top_k_per_label,
    validate_selection_inputs,
)
from icl_ssm.select.budget import (
    PILOT_QUERIES,
    RELIABILITY_TARGET,
    Reliability,
    draw_in_blocks,
    permutation_block,
    plan_budget,
    plan_lines,
    score_split_half,
)
from icl_ssm.select.estimators import (
    ESTIMATORS,
    adjusted_affinity,
    boundary,
    indicator,
    mean_affinity,
    ridge_affinity,
)
from icl_ssm.select.sampling import balanced_subsets, focused_subsets, label_quotas, stratified_subsets, subsets_for
from icl_ssm.select.subset_losses import (
    SubsetEvaluator,
    SubsetLosses,
    concat,
    evaluator_for,
    reliability,
    split_half,
)


@register("affinity")
@dataclass
class AffinitySelector(Selector):
    """Algorithm 2 on any :class:`SubsetEvaluator`.

    ``subsets``: the budget ``M`` (default :func:`subsets_for` at ``eps``); ``coverage``: every
    candidate must be in at least this many subsets of the first round, else a ValueError
    says how many subsets would do; ``adaptive``: fraction of ``M`` spent in a second round on
    the candidates near the top-``k`` boundary; ``stratify``: every subset holds the pool's
    labels in the same even shares (:func:`stratified_subsets`) and the ``k`` demonstrations
    are chosen with the same shares (:func:`top_k_per_label`); ``chunk``: subsets per evaluator
    call (the progress granularity); ``hooks``: progress after every chunk of subsets and, with a
    ``budget``, the pilot's findings and the plan (``say``) and the subsets in all (``total``).
    """

    evaluator: SubsetEvaluator
    subsets: int | None = None
    estimator: str = "mean"
    coverage: int = 1
    adaptive: float = 0.0
    eps: float = 0.5
    stratify: bool = False
    chunk: int = 32
    budget: float | None = None  # seconds: size queries and subsets to `target` reliability (select.budget)
    target: float = RELIABILITY_TARGET
    pilot_queries: int = PILOT_QUERIES
    hooks: Hooks = Hooks()
    _labels: list[str] | None = field(default=None, init=False, repr=False)  # the pool's, set by select()

    @classmethod
    def from_config(cls, cfg, model, builder, compressor=None, hooks=None) -> AffinitySelector:
        """``cfg.evaluator``: ``dense-per-query`` (one full prompt per query), else a
        :class:`CacheEvaluator` of that kind (``compressed`` needs ``compressor``)."""
        evaluator = evaluator_for(cfg, model, builder, compressor)
        budget = None if cfg.budget is None else 60.0 * cfg.budget  # minutes on the command line
        return cls(evaluator, subsets=cfg.subsets, estimator=cfg.estimator, coverage=cfg.coverage,
                   adaptive=cfg.adaptive, eps=cfg.eps, stratify=cfg.stratify, chunk=cfg.batch,
                   budget=budget, target=cfg.target_reliability, hooks=hooks or Hooks())

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator={self.estimator!r}; accepted: {', '.join(ESTIMATORS)}")
        if self.subsets is not None and self.subsets < 1:
            raise ValueError(f"subsets={self.subsets}: expected >= 1")
        if not 0.0 <= self.adaptive < 1.0:
            raise ValueError(f"adaptive={self.adaptive}: expected a fraction in [0, 1)")
        if self.coverage < 0:
            raise ValueError(f"coverage={self.coverage}: expected >= 0")
        if self.budget is not None:
            if not self.budget > 0:
                raise ValueError(f"budget={self.budget} s: expected a positive time")
            if self.adaptive or self.subsets is not None:
                raise ValueError("a budget sizes the subsets itself: give it without subsets and adaptive")
            if not 0 < self.target < 1:
                raise ValueError(f"target reliability {self.target}: expected a value between 0 and 1")
            if self.pilot_queries < 2:
                raise ValueError(f"pilot_queries={self.pilot_queries}: a split-half needs at least 2")

    def planned(self, n: int, k: int) -> int:
        return sum(self.plan(n, k))

    def plan(self, n: int, k: int) -> tuple[int, int]:
        """(first-round subsets, second-round subsets); with a budget, the pilot's and 0."""
        if self.budget is not None:
            return self.pilot_size(n, k), 0
        total = self.subsets if self.subsets is not None else subsets_for(n, k, self.eps)
        second = int(total * self.adaptive)
        return total - second, second

    def select(self, pool, validation, k, rng):
        validate_selection_inputs(pool, validation, k)
        n = len(pool)
        if k == n:  # nothing to choose
            return Selection(self.name, list(range(n)), np.zeros(n), details={"estimator": self.estimator})
        first, second = self.plan(n, k)
        labels = [e.target for e in pool]
        self._labels = labels
        if self.stratify:  # each label's candidates share its places: covering them takes n_y / quota_y subsets
            sizes = Counter(labels)
            need = max(math.ceil(self.coverage * sizes[y] / q) for y, q in label_quotas(labels, k).items())
        else:
            need = math.ceil(self.coverage * n / k)
        if first < need:
            raise ValueError(
                f"subsets={first} (first round) cannot put each of the {n} candidates in {self.coverage} "
                f"subset(s) of {k}: use --subsets >= {need}" + (" / (1 - adaptive)" if self.adaptive else "")
            )
        if self.budget is not None:
            subsets, result, budget = self._budgeted(pool, validation, k, rng, labels)
            first = len(subsets)
        else:
            subsets, budget = self._sample(labels, k, first, rng), None
            result = self._evaluate(pool, validation, subsets)
        focus: list[int] = []
        if second:
            scores, stderr = self.estimate(subsets, result.losses, n)
            focus = boundary(scores, stderr, k)
            more = (stratified_subsets(labels, k, second, rng, focus=focus) if self.stratify
                    else focused_subsets(n, k, second, focus, rng))
            result = concat(result, self._evaluate(pool, validation, more))
            subsets += more
        losses, cost, tokens = result.losses, result.cost, result.tokens
        scores, _ = self.estimate(subsets, losses, n)
        half = split_half(result)
        block = permutation_block(n, k, labels if self.stratify else None)
        scores_half = Reliability(half, score_split_half(subsets, losses, n, self.estimate, block)).as_dict()
        queries = result.query_losses.shape[1] if result.query_losses is not None else 0
        unseen = np.flatnonzero(~np.isfinite(scores)).tolist()
        counts = indicator(subsets, n).sum(0)
        chosen = top_k_per_label(scores, labels, k) if self.stratify else top_k(scores, k)
        return Selection(
            self.name, chosen, scores, cost, tokens, len(subsets), unseen,
            details={"estimator": self.estimator, "evaluator": self.evaluator.name, "stratified": self.stratify,
                     "min_coverage": int(counts.min()), "rounds": [first, second], "focus": focus,
                     "subset_losses": losses.tolist(),
                     **reliability(half, queries),
                     "score_split_half": scores_half["score_split_half"],
                     "score_reliability": scores_half["score_reliability"],
                     "query_losses": None if result.query_losses is None else result.query_losses.tolist(),
                     "query_labels": None if result.query_labels is None else result.query_labels.tolist(),
                     **({"budget": budget} if budget is not None else {})},
        )

    def _sample(self, labels: list[str], k: int, m: int, rng: np.random.Generator) -> list[list[int]]:
        if m <= 0:
            return []
        return stratified_subsets(labels, k, m, rng) if self.stratify else balanced_subsets(len(labels), k, m, rng)

    def pilot_size(self, n: int, k: int) -> int:
        """Subsets of the pilot round: every candidate in about 2 of them (one per split half), at
        least 8: small beside the main round, whose size it sets."""
        return max(8, 2 * math.ceil(max(self.coverage, 1) * n / k))

    def _budgeted(self, pool, validation, k, rng, labels) -> tuple[list[list[int]], SubsetLosses, dict]:
        """Pilot round, plan (:func:`~icl_ssm.select.budget.plan_budget`), main round; the pilot's
        subsets are kept (and re-scored when the main round asks more queries).

        The pilot is drawn a permutation block at a time (:func:`~icl_ssm.select.budget.draw_in_blocks`),
        at least two blocks, so that each half of its score split-half holds every candidate."""
        n = len(pool)
        q0 = min(self.pilot_queries, len(validation))
        if q0 < 2:
            raise ValueError(f"a budget needs at least 2 validation queries for its pilot; got {len(validation)}")
        t0 = time.perf_counter()
        block = permutation_block(n, k, labels if self.stratify else None)
        subsets = draw_in_blocks(lambda m: self._sample(labels, k, m, rng), max(self.pilot_size(n, k), 2 * block),
                                 block)
        pilot = self._evaluate(pool, validation[:q0], subsets)
        seconds = pilot.cost.seconds or time.perf_counter() - t0  # the evaluator's own clock where it keeps one
        measured = Reliability.measure(pilot, subsets, n, self.estimate, block)
        need = math.ceil(max(self.coverage, 1) * n / k)
        plan = plan_budget(pilot_subsets=len(subsets), pilot_queries=q0, pilot_seconds=seconds,
                           reliability=measured, max_queries=len(validation), min_subsets=need,
                           budget_seconds=self.budget, target=self.target)
        record = {"pilot": {"subsets": len(subsets), "queries": q0, "seconds": seconds,
                            "reliability": measured.as_dict()},
                  "plan": plan.as_dict(), "budget_seconds": self.budget, "target": self.target}
        for line in plan_lines(record["pilot"], plan, self.budget, self.target):
            self.hooks.say(line)
        more = self._sample(labels, k, plan.subsets - len(subsets), rng)
        self.hooks.total(len(subsets) + len(more) + (len(subsets) if plan.queries != q0 else 0))
        if plan.queries == q0:
            result = concat(pilot, self._evaluate(pool, validation[:q0], more)) if more else pilot
        else:  # every subset on the larger query set; the pilot's cost stays counted
            result = self._evaluate(pool, validation[: plan.queries], subsets + more)
            result.cost = Cost(result.cost.flops + pilot.cost.flops, result.cost.seconds + pilot.cost.seconds)
            result.tokens += pilot.tokens
        subsets = subsets + more
        reached = Reliability.measure(result, subsets, n, self.estimate, block)
        record.update(reached=reached.as_dict(), queries=plan.queries, subsets=len(subsets),
                      seconds=time.perf_counter() - t0)
        self.hooks.say(f"reached: reliability of the subset losses {_fmt(reached.losses)}, of the candidates' scores "
                       f"{_fmt(reached.scores)} ({len(subsets)} subsets x {plan.queries} queries, "
                       f"{record['seconds'] / 60:.1f} min)")
        return subsets, result, record

    def estimate(self, subsets, losses, n) -> tuple[np.ndarray, np.ndarray]:
        if self.estimator == "adjusted":  # needs the pool's labels, set by select()
            if self._labels is None or len(self._labels) != n:
                raise ValueError("the adjusted estimator needs the pool's labels: call select()")
            return adjusted_affinity(subsets, losses, n, self._labels)
        fn = mean_affinity if self.estimator == "mean" else ridge_affinity
        return fn(subsets, losses, n)

    def _evaluate(self, pool, validation, subsets: list[list[int]]) -> SubsetLosses:
        """Losses of ``subsets`` in order; sharded over the processes of a distributed run."""
        rank, world = _process()
        mine = list(range(rank, len(subsets), world))
        parts = []
        for start in range(0, len(mine), self.chunk):
            idx = mine[start : start + self.chunk]
            parts.append(self.evaluator.evaluate(pool, validation, [subsets[j] for j in idx]))
            self.hooks.progress(len(idx) * world)
        local = concat(*parts) if parts else SubsetLosses(np.zeros(0))
        if world == 1:
            return local
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, (mine, local))
        losses = np.empty(len(subsets))
        per_query = None if any(p.query_losses is None for _, p in gathered if len(p.losses)) else \
            np.empty((len(subsets), len(validation)))
        cost, tokens = Cost(), 0
        for positions, part in gathered:
            losses[positions] = part.losses
            if per_query is not None and len(positions):
                per_query[positions] = part.query_losses
            cost = Cost(cost.flops + part.cost.flops, max(cost.seconds, part.cost.seconds))
            tokens += part.tokens
        labels = next((p.query_labels for _, p in gathered if p.query_labels is not None), None)
        return SubsetLosses(losses, cost, tokens, per_query, labels)


def _fmt(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "n/a"


def _process() -> tuple[int, int]:
    """(rank, world) of a ``torch.distributed`` run, (0, 1) otherwise."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1

"""One call of the prompt search (:class:`~icl_ssm.select.search.PromptSearch`): its inputs, its
arms (:mod:`~icl_ssm.select.search_candidates`) and how they are scored: on the screen evaluator in
chunks until a deadline, on the confirm evaluator by successive halving that stops before a rung
would end past its share of the budget. Every evaluator call's cost is kept in ``spent`` and its
prompts are counted through ``progress``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from icl_ssm.cost import Cost
from icl_ssm.data.tasks import Example
from icl_ssm.select.calibrated import calibrated_losses, gold_indices
from icl_ssm.select.search_candidates import Arm, Arms, balanced_prompts, random_prompts
from icl_ssm.select.subset_losses import SubsetEvaluator, SubsetLosses, concat, reliability, split_half


class Halving(NamedTuple):
    """What :meth:`SearchRun.halve` reached: the ``contenders`` ranked by the last rung reached,
    the rung log (per rung: ``arms``, ``queries``, ``losses``, ``sources``), why it stopped (None
    if it ran every rung) and its ``pace``: seconds taken over the seconds the pilot's rates give
    (1.0 before any rung)."""

    contenders: list[Arm]
    rungs: list[dict]
    stopped: str | None
    pace: float


@dataclass
class SearchRun:
    """The state one search call's phases share. ``validation`` must be in
    :func:`~icl_ssm.select.search.balanced_order` (every prefix label-balanced): the screen reads
    its first ``screen_queries``, a rung of ``q`` queries its first ``q``. ``labels``: the task's
    label set (empty for a generative task); ``calibrations``: scored per prompt where given
    (see :class:`~icl_ssm.select.search.PromptSearch`)."""

    pool: Sequence[Example]
    validation: list[Example]
    k: int
    rng: np.random.Generator
    start: float  # the clock when the call began
    confirm: SubsetEvaluator
    screen: SubsetEvaluator | None
    screen_queries: int
    labels: tuple[str, ...]
    calibrations: tuple[str, ...]
    clock: Callable[[], float]
    progress: Callable[[int], None] | None = None
    spent: list[Cost] = field(default_factory=list)  # every evaluator call's cost
    arms: Arms = field(default_factory=Arms)
    screen_results: list[SubsetLosses] = field(default_factory=list)  # every screen call, in order
    phases: dict[str, float] = field(default_factory=dict)  # seconds each phase took, in phase order
    pool_labels: list[str] = field(init=False)  # the pool's targets
    screen_q: list[Example] = field(init=False)  # the screen's queries: the first ``screen_queries``

    def __post_init__(self) -> None:
        self.pool_labels = [e.target for e in self.pool]
        self.screen_q = self.validation[: self.screen_queries]

    @property
    def n(self) -> int:
        return len(self.pool)

    def fresh(self, m: int) -> list[Arm]:
        """The new arms among ``m`` random prompts, half of them label-balanced where the task has
        labels (the random ones drawn first)."""
        half = m // 2 if self.labels else 0
        return (self.arms.add(random_prompts(self.n, self.k, m - half, self.rng), "random")
                + self.arms.add(balanced_prompts(self.pool_labels, self.labels, self.k, half, self.rng), "balanced"))

    # -- scoring ---------------------------------------------------------------------------------
    def pair_losses(self, result: SubsetLosses, queries) -> list[dict[str, float]] | None:
        """Per subset of ``result``: {calibration: its loss} (None without calibrations)."""
        if not self.calibrations:
            return None
        if result.query_scores is None:
            raise ValueError("search calibrations need an evaluator that reads label scores")
        gold = gold_indices(self.labels, queries)
        table = {c: calibrated_losses(result.query_scores, gold, c) for c in self.calibrations}
        return [{c: float(table[c][i]) for c in self.calibrations} for i in range(len(result.losses))]

    def score_screen(self, arms: list[Arm]) -> None:
        """Set the ``arms``' screen losses on the screen's queries (their best calibration's, with
        calibrations); the call's result kept in ``screen_results``."""
        result = self.screen.evaluate(self.pool, self.screen_q, [a.prompt for a in arms])
        self.spent.append(result.cost)
        self.screen_results.append(result)
        pairs = self.pair_losses(result, self.screen_q)
        for i, (a, loss) in enumerate(zip(arms, result.losses, strict=True)):
            a.screen_loss = float(loss) if pairs is None else min(pairs[i].values())
        if self.progress is not None:
            self.progress(len(arms))

    def screen_until(self, arms: list[Arm], deadline: float) -> None:
        """Screen ``arms`` in chunks of the screen evaluator's batch until ``deadline``."""
        step = max(1, getattr(self.screen, "batch", 8))
        for j in range(0, len(arms), step):
            if self.clock() >= deadline:
                break
            self.score_screen(arms[j : j + step])

    def score_confirm(self, arms: list[Arm], queries: int) -> None:
        """Set the ``arms``' confirm losses on the first ``queries`` validation queries."""
        result = self.confirm.evaluate(self.pool, self.validation[:queries], [a.prompt for a in arms])
        self.spent.append(result.cost)
        pairs = self.pair_losses(result, self.validation[:queries])
        for i, (a, loss) in enumerate(zip(arms, result.losses, strict=True)):
            if pairs is None:
                a.confirm[queries] = float(loss)
            else:
                a.pairs[queries] = pairs[i]
                a.confirm[queries] = min(pairs[i].values())
        if self.progress is not None:
            self.progress(len(arms))

    def time_confirm(self, prompts: list[Arm], confirm_queries: int) -> tuple[float, float]:
        """(prefix seconds, seconds per query) of the confirm evaluator, from two query counts."""
        q_small = max(1, min(4, confirm_queries))
        q_big = max(q_small + 1, min(16, confirm_queries))
        t0 = self.clock()
        self.score_confirm(prompts[:1], q_small)
        t1 = self.clock()
        self.score_confirm(prompts[:1], q_big)
        t2 = self.clock()
        a, b = t1 - t0, t2 - t1
        per_query = max((b - a) / (q_big - q_small), 1e-6)
        return max(a - per_query * q_small, 0.0), per_query

    def halve(self, contenders: list[Arm], rungs: list[tuple[int, int]], prefix: float, per_query: float,
              confirm_end: float) -> Halving:
        """Successive halving on the confirm evaluator: each rung ``(size, queries)`` scores the best
        ``size`` contenders on ``queries`` validation queries and re-ranks them.

        Before each chunk (the confirm evaluator's batch) it predicts the chunk's end from the
        pilot's rates (``prefix``, ``per_query``) times the pace measured so far; one that would end
        past ``confirm_end`` stops the halving (never before the first chunk)."""
        rung_log: list[dict] = []
        stopped = None
        modelled = measured = 0.0  # the rungs run so far: seconds the pilot's rates give, seconds they took
        chunk = max(1, int(getattr(self.confirm, "batch", 8)))  # the evaluator's own batch: no padding lost
        pace = lambda: measured / modelled if modelled > 0 else 1.0  # noqa: E731  # seconds taken / the pilot's
        for i, (size, queries) in enumerate(rungs):
            each = prefix + per_query * queries
            todo = [a for a in contenders[:size] if queries not in a.confirm]
            late = self.clock() + pace() * len(todo) * each - confirm_end
            if rung_log and todo and late > 0:  # a slowed machine: the whole rung would end past the budget
                stopped = (f"the confirmation stopped before rung {i + 1} of {len(rungs)} ({size} x {queries}q): "
                           f"it ran {pace():.2f}x the pilot's time and would have ended {late:.0f} s past its "
                           f"share of the budget; the best of {len(contenders)} at {rung_log[-1]['queries']} "
                           "queries goes on")
                break
            for j in range(0, len(todo), chunk):
                part = todo[j : j + chunk]
                late = self.clock() + pace() * len(part) * each - confirm_end
                if (rung_log or j) and late > 0:  # ... or would go past it within this rung
                    stopped = (f"the confirmation stopped within rung {i + 1} of {len(rungs)} ({size} x "
                               f"{queries}q) after {j} of its {len(todo)} new prompts: it ran {pace():.2f}x the "
                               "pilot's time; the best of the prompts it reached goes on")
                    break
                t1 = self.clock()
                self.score_confirm(part, queries)
                measured, modelled = measured + self.clock() - t1, modelled + len(part) * each
            reached = [a for a in contenders[:size] if queries in a.confirm]
            if not reached:  # stopped before any prompt of this rung: the last rung's order stands
                break
            contenders = sorted(reached, key=lambda a: a.confirm[queries])
            rung_log.append({"arms": len(contenders), "queries": queries,
                             "losses": [a.confirm[queries] for a in contenders],
                             "sources": [a.source for a in contenders]})
            if stopped:
                break
        return Halving(contenders, rung_log, stopped, pace())

    def screen_stats(self) -> dict[str, Any]:
        """Split-half reliability of the screen's prompt losses (over its queries)
        (:func:`~icl_ssm.select.subset_losses.split_half`, :func:`~icl_ssm.select.subset_losses.reliability`),
        on the prompts screened with per-query losses."""
        rows = [r for r in self.screen_results if r.query_losses is not None and len(r.losses)]
        if not rows:
            return {"screen_split_half": None, "screen_reliability": None}
        merged = concat(*rows)
        r = reliability(split_half(merged), merged.query_losses.shape[1])
        return {"screen_split_half": r["split_half"], "screen_reliability": r["reliability"]}

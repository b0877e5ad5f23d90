"""Prompt search: find the best whole prompt (a set of ``k`` demonstrations in an order) within a
wall-time budget, by screening many candidate prompts on a cheap evaluator, confirming the best
few on the dense prompt, and ordering the survivor.

Algorithm 2 gives every candidate the mean loss of the subsets that hold it, which assumes a
demonstration's worth does not depend on its company. Where it does (label mix, order, the last
labels before the query), whole prompts can still be measured and compared even when such
averages cannot. The search therefore keeps whole prompts as its arms:

1. **generate** candidate prompts from several sources (:data:`SOURCES`): random prompts,
   label-balanced random prompts (classification only), Algorithm 2's top ``k`` computed from
   the screen's own losses of the random prompts (no extra evaluations), prompts given by the
   caller (``seeds``: another method's pick, a retrieval pick), and one- or two-member swaps and
   reorderings of the best prompts screened so far;
2. **screen** them on the ``screen`` evaluator (compressed caches, say) with label-balanced
   validation queries; the split-half reliability of the screen's losses is measured and kept;
3. **confirm** the best ``arms`` of the screen on the ``confirm`` evaluator (dense caches) by
   successive halving: every arm on the first rung's queries, the better half on twice as many,
   and so on up to ``confirm_queries``. Successive halving is the fixed-budget best-arm rule with
   no tuning parameters (Karnin et al., 2013; TRIPLE, Shi et al., 2024): it spends most
   evaluations on the arms whose order is still in doubt, and its budget is known in advance;
4. **order** the survivor: its ``order_candidates`` orders (its own, interleaved, random) on the
   ``order`` evaluator (dense by default), the lowest loss kept.

Without a screen (``screen=None``) random candidates go straight into the confirmation: random
search over whole prompts, the baseline every screen has to beat at equal time.

The time is split by :func:`~icl_ssm.select.search_plan.plan_search` from a short timing pilot and
printed before it is spent (``hooks.say``); every phase stops at its own deadline, so the whole search
ends within the budget up to one evaluator call. A machine that slows after the pilot (another job
on the cores) stretches every evaluation: the confirmation measures how much slower its rungs run
than the pilot's rates and stops before a rung that would end past its share (the best of the
last rung run goes on, and ``details["stopped"]`` says why), and the order search is sized at the
same pace.

The arms and their generators are in :mod:`~icl_ssm.select.search_candidates`; one call's state and
its evaluator calls (the screen in chunks, the halving's rungs) in :mod:`~icl_ssm.select.search_run`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

from icl_ssm.calibrate.losses import SEARCHED
from icl_ssm.cost import Cost
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import spearman
from icl_ssm.select.base import Hooks, Selection, Selector, register, validate_selection_inputs
from icl_ssm.select.calibrated import CalibratedEvaluator
from icl_ssm.select.estimators import mean_affinity
from icl_ssm.select.order import search_order
from icl_ssm.select.sampling import label_quotas
from icl_ssm.select.search_candidates import SOURCES as SOURCES  # re-exported, as is key: callers import them here
from icl_ssm.select.search_candidates import Arm, affinity_prompts, swap_prompts
from icl_ssm.select.search_candidates import key as key
from icl_ssm.select.search_plan import MAX_ARMS, SearchPlan, fit_confirmation, plan_lines, plan_search, rungs_for
from icl_ssm.select.search_run import SearchRun
from icl_ssm.select.subset_losses import SubsetEvaluator

SCREENS = ("compressed", "dense", "none")  # the screen a run names (compressed: the run's compressor, a control too)
PILOT = 4  # prompts timed on each evaluator before the plan


def balanced_order(validation: Sequence[Example], labels: Sequence[str]) -> list[int]:
    """Indices of ``validation`` in an order whose every prefix has the labels in equal shares as
    far as the labels allow: round robin over the labels (in order of first appearance), each
    label's queries in their own order. Without ``labels`` (a generative task), the given order."""
    if not labels:
        return list(range(len(validation)))
    queues: dict[str, list[int]] = {}
    for i, q in enumerate(validation):
        queues.setdefault(q.target, []).append(i)
    out: list[int] = []
    lanes = list(queues.values())
    for depth in range(max(len(v) for v in lanes)):
        out += [lane[depth] for lane in lanes if depth < len(lane)]
    return out


class _Pilot(NamedTuple):
    """What the pilot measured: its prompts (kept as candidates), the screen's seconds per prompt
    (None without a screen), and the confirm evaluator's prefix seconds and seconds per query."""

    first: list[Arm]
    screen_each: float | None
    prefix: float
    per_query: float


class _Confirmed(NamedTuple):
    """The confirmation's outcome: its ``winner`` and the ``queries`` of the last rung reached, the
    rung log, why it stopped (None: every rung ran), its pace (seconds taken over the seconds the
    pilot's rates give) and the Spearman correlation of screen and first-rung losses (None
    without a screen or with fewer than three arms on the first rung)."""

    winner: Arm
    queries: int
    rungs: list[dict]
    stopped: str | None
    pace: float
    screen_vs_confirm: float | None


@register("search")
@dataclass
class PromptSearch(Selector):
    """Search over whole prompts within ``budget`` seconds (see the module).

    ``screen``: the cheap evaluator (None: no screen); ``confirm``: the dense one; ``order``: the
    evaluator of the survivor's orders (default ``confirm``). ``screen_queries``: label-balanced
    validation queries of the screen; ``confirm_queries``: queries of the last rung (the
    validation set passed to :meth:`select` must hold at least the larger of the two);
    ``labels``: the task's answer set when it is a fixed label set (enables the label-balanced
    sources and query balance), else empty; ``seeds``: named prompts to screen beside the
    generated ones. ``hooks.say`` gets the plan before the budget is spent and a line per phase.
    ``calibrations`` (classification; from :data:`~icl_ssm.select.calibrated.SEARCHED`): every
    prompt is scored with each calibration from the same label scores, as the label-balanced
    cross-entropy over the label set (:func:`~icl_ssm.select.calibrated.calibrated_losses`), and
    ranks by its best pair; the winner's calibration is handed over with it
    (``details["calibration"]``) and orders it. Empty: the evaluators' own losses, uncalibrated.
    """

    confirm: SubsetEvaluator
    screen: SubsetEvaluator | None = None
    order: SubsetEvaluator | None = None
    budget: float = 120.0
    screen_queries: int = 32
    confirm_queries: int = 64
    order_candidates: int = 8
    labels: tuple[str, ...] = ()
    seeds: dict[str, list[int]] = field(default_factory=dict)
    swap_share: float = 0.3  # of the screened prompts: swaps around the best so far
    calibrations: tuple[str, ...] = ()
    screen_name: str = "compressed"
    hooks: Hooks = Hooks()
    clock: Callable[[], float] = time.perf_counter
    _spent: list[Cost] = field(default_factory=list, init=False, repr=False)  # every evaluator call's cost
    balances_labels: ClassVar[bool] = True  # its label-balanced prompts are its own: no per-label quota over them

    def __post_init__(self) -> None:
        if not self.budget > 0:
            raise ValueError(f"budget={self.budget} s: expected a positive time")
        for name in ("screen_queries", "confirm_queries", "order_candidates"):
            if getattr(self, name) < (2 if name == "order_candidates" else 1):
                raise ValueError(f"{name}={getattr(self, name)}: expected >= {2 if name == 'order_candidates' else 1}")
        if not 0 <= self.swap_share < 1:
            raise ValueError(f"swap_share={self.swap_share}: expected a share in [0, 1)")
        unknown = [c for c in self.calibrations if c not in SEARCHED]
        if unknown:
            raise ValueError(f"search calibrations {unknown}; accepted: {', '.join(SEARCHED)}")
        if self.calibrations and not self.labels:
            raise ValueError("search calibrations shift label scores: they need a classification task's labels")

    @classmethod
    def from_config(cls, cfg, model, builder, compressor=None, hooks=None) -> PromptSearch:
        """``cfg.screen``: ``compressed`` (``compressor``'s caches), ``dense`` or ``none``; the
        confirmation and the order search on dense caches; label balance where the task has labels."""
        from icl_ssm.compress.builders import cache_for
        from icl_ssm.select.subset_losses import CacheEvaluator

        labels = tuple(builder.task.labels) if builder.task.kind == "classification" else ()
        balance = bool(labels)

        def ev(cache: str) -> CacheEvaluator:
            return CacheEvaluator(model, builder, cache_for(cache, model, compressor), loss=cfg.loss,
                                  batch=cfg.batch, query_batch=cfg.query_batch, balance_labels=balance,
                                  pack=cfg.pack, flops="off")  # the budget is time: nothing counted inside it

        if cfg.screen not in SCREENS:
            raise ValueError(f"--screen {cfg.screen!r}; accepted: {', '.join(SCREENS)}")
        screen = None if cfg.screen == "none" else ev(cfg.screen)
        dense = ev("dense")
        dense.batch = 1  # one prompt per call: a rung's arms are timed one by one
        return cls(confirm=dense, screen=screen, budget=60.0 * cfg.search_minutes,
                   screen_queries=cfg.screen_queries, confirm_queries=cfg.confirm_queries,
                   order_candidates=cfg.order_candidates, labels=labels, screen_name=cfg.screen,
                   seeds=dict(cfg.seeds), hooks=hooks or Hooks(),
                   calibrations=tuple(cfg.search_calibrations) if labels else ())

    def findings(self, details: dict[str, Any]) -> dict[str, Any]:
        """All of the search's details (its plan, screen, rungs and order search) are its record."""
        return {**super().findings(details), **{key: value for key, value in details.items() if key != "order_search"},
                "order_search": details.get("order_search")}

    @property
    def _screen_label(self) -> str:
        return self.screen_name if self.screen is not None else "none"

    # -- the search: pilot and plan, screen (or random search), confirm, order --------------------
    def select(self, pool, validation, k, rng):
        run = self._begin(pool, validation, k, rng)
        pilot = self._pilot(run)
        plan = self._plan(run, pilot)
        if self.screen is not None:
            ranked = self._screen_phase(run, plan, pilot.first)
        else:
            ranked = self._random_search(run, plan, pilot.first)
        screen_stats = run.screen_stats()
        confirmed = self._confirm_phase(run, plan, pilot, ranked)
        indices, order_log = self._order_phase(run, plan, pilot, confirmed)
        wall = self.clock() - run.start
        details = self._details(run, plan, confirmed, order_log, screen_stats, wall)
        return Selection(self.name, indices, self._scores(run, ranked), sum(run.spent, Cost()),
                         subsets=len(run.arms), details=details)

    def _begin(self, pool, validation, k, rng) -> SearchRun:
        """The call's state after its inputs are checked, its validation queries in
        :func:`balanced_order` so that every prefix (the screen's, a rung's) is label-balanced."""
        validate_selection_inputs(pool, validation, k)
        need = max(self.confirm_queries, self.screen_queries if self.screen is not None else 0)
        if len(validation) < need:
            raise ValueError(f"the search needs {need} validation queries (screen_queries={self.screen_queries}, "
                             f"confirm_queries={self.confirm_queries}); got {len(validation)}")
        start = self.clock()
        self._spent = []  # the run's: every evaluator call's cost
        validation = [validation[i] for i in balanced_order(validation, self.labels)]
        run = SearchRun(pool, validation, k, rng, start, confirm=self.confirm, screen=self.screen,
                        screen_queries=self.screen_queries, labels=self.labels, calibrations=self.calibrations,
                        clock=self.clock, progress=self.hooks.progress, spent=self._spent)
        if self.labels:
            label_quotas(run.pool_labels, k)  # refuses a pool that cannot fill a balanced prompt
        return run

    def _pilot(self, run: SearchRun) -> _Pilot:
        """Time both evaluators on :data:`PILOT` fresh prompts (kept as candidates)."""
        first = run.fresh(PILOT)
        screen_each = None
        if self.screen is not None:
            t0 = self.clock()
            run.score_screen(first)
            screen_each = (self.clock() - t0) / len(first)
        prefix, per_query = run.time_confirm(first, self.confirm_queries)
        run.phases["pilot"] = self.clock() - run.start
        return _Pilot(first, screen_each, prefix, per_query)

    def _plan(self, run: SearchRun, pilot: _Pilot) -> SearchPlan:
        """Split the budget the pilot left (:func:`~icl_ssm.select.search_plan.plan_search`), say
        the plan, and hand ``hooks.total`` the prompt evaluations in all."""
        plan = plan_search(max(self.budget - run.phases["pilot"], 1e-3), screen_per_prompt=pilot.screen_each,
                           prefix=pilot.prefix, per_query=pilot.per_query, confirm_queries=self.confirm_queries,
                           order_candidates=self.order_candidates, max_arms=MAX_ARMS if self.screen else 16 * MAX_ARMS)
        for line in plan_lines(plan, self.budget, self._screen_label):
            self.hooks.say(line)
        self.hooks.total(len(pilot.first) * (2 + (self.screen is not None)) + plan.screened
                         + sum(a for a, _ in plan.rungs) + plan.orders)
        return plan

    def _screen_phase(self, run: SearchRun, plan: SearchPlan, first: list[Arm]) -> list[Arm]:
        """Screen random and balanced prompts, then the seeds and Algorithm 2's picks from the
        screen's losses so far, then swaps around the best, until the screen's deadline. Returns
        the screened arms, lowest screen loss first."""
        deadline = run.start + run.phases["pilot"] + plan.seconds["screen"]
        t0 = self.clock()
        swaps = int(self.swap_share * plan.screened)
        fresh = max(0, plan.screened - len(first) - swaps - len(self.seeds) - 2)
        run.screen_until(run.fresh(fresh), deadline)
        given = [list(p) for p in self.seeds.values()]
        derived = affinity_prompts(run.arms.screened(), run.n, run.k, run.pool_labels, self.labels, run.rng)
        run.arms.add(given, "seed")
        run.arms.add(derived, "affinity")
        run.screen_until([a for a in run.arms.values() if not math.isfinite(a.screen_loss)], deadline)
        while self.clock() < deadline and swaps > 0:
            best = sorted(run.arms.screened(), key=lambda a: a.screen_loss)
            near = swap_prompts([a.prompt for a in best[:4]], run.n, run.pool_labels, self.labels, min(8, swaps),
                                run.rng)
            new = run.arms.add(near, "swap")
            swaps -= len(new) or 1
            run.screen_until(new, deadline)
        run.phases["screen"] = self.clock() - t0
        return sorted(run.arms.screened(), key=lambda a: a.screen_loss)

    def _random_search(self, run: SearchRun, plan: SearchPlan, first: list[Arm]) -> list[Arm]:
        """Without a screen: random (and balanced) prompts straight into the confirmation. Returns
        every arm, the seeds first (the given picks always confirmed)."""
        run.fresh(plan.arms - len(first))
        seeded = run.arms.add(list(self.seeds.values()), "seed")
        return seeded + [a for a in run.arms.values() if a not in seeded]

    def _confirm_phase(self, run: SearchRun, plan: SearchPlan, pilot: _Pilot, ranked: list[Arm]) -> _Confirmed:
        """Successive halving of the best of ``ranked`` on the dense prompt, replanned on the time
        left (:func:`~icl_ssm.select.search_plan.fit_confirmation`) and ending before the order
        search's share."""
        t0 = self.clock()
        left = self.budget - (t0 - run.start) - plan.seconds["order"]
        arms_in, top_q, _ = fit_confirmation(left, prefix=pilot.prefix, per_query=pilot.per_query,
                                             queries=plan.queries, max_arms=plan.arms)
        contenders, rung_log, stopped, pace = run.halve(
            ranked[:arms_in], rungs_for(len(ranked[:arms_in]), top_q), pilot.prefix, pilot.per_query,
            confirm_end=run.start + self.budget - plan.seconds["order"])
        if stopped:
            self.hooks.say(f"search: {stopped}")
        top_q = rung_log[-1]["queries"]
        winner = contenders[0]
        run.phases["confirm"] = self.clock() - t0
        screen_vs_confirm = None
        first_rung = [a for a in ranked[:arms_in] if rung_log and rung_log[0]["queries"] in a.confirm]
        if self.screen is not None and len(first_rung) >= 3:
            q0 = rung_log[0]["queries"]
            screen_vs_confirm = _finite(spearman([a.screen_loss for a in first_rung],
                                                 [a.confirm[q0] for a in first_rung]))
        return _Confirmed(winner, top_q, rung_log, stopped, pace, screen_vs_confirm)

    def _order_phase(self, run: SearchRun, plan: SearchPlan, pilot: _Pilot,
                     confirmed: _Confirmed) -> tuple[list[int], dict[str, Any] | None]:
        """The winner's best order (:func:`~icl_ssm.select.order.search_order`) on the
        confirmation's queries, as many orders as the time left holds at the confirmation's pace
        (none below two: the winner's own order stands). Returns (indices, the order log or None)."""
        winner, top_q = confirmed.winner, confirmed.queries
        t0 = self.clock()
        left = self.budget - (t0 - run.start)
        one = confirmed.pace * (pilot.prefix + pilot.per_query * top_q)  # as slow as the confirmation ran
        orders = int(min(plan.orders, left // max(one, 1e-9)))
        indices, order_log = list(winner.prompt), None
        if orders >= 2:
            labels_of = [run.pool_labels[i] for i in winner.prompt]
            order_ev = self.order or self.confirm
            if self.calibrations:  # the survivor's orders scored as it will answer: with its calibration
                order_ev = CalibratedEvaluator(order_ev, winner.calibration(top_q), self.labels)
            indices, order_log = search_order(order_ev, run.pool, run.validation[:top_q], winner.prompt, labels_of,
                                              orders, run.rng)
            order_log["winner_loss"] = winner.confirm.get(top_q)
            run.spent.append(Cost(order_log["flops"], order_log["seconds"]))
        run.phases["order"] = self.clock() - t0
        return indices, order_log

    def _scores(self, run: SearchRun, ranked: list[Arm]) -> np.ndarray:
        """(n,) float64: Algorithm 2's mean affinity from the screened prompts' screen losses (all
        NaN without a screen)."""
        scores = np.full(run.n, math.nan)
        if len(ranked) >= 2 and self.screen is not None:
            scored = [a for a in ranked if math.isfinite(a.screen_loss)]
            scores, _ = mean_affinity([a.prompt for a in scored], np.array([a.screen_loss for a in scored]), run.n)
        return np.asarray(scores, dtype=np.float64)

    def _details(self, run: SearchRun, plan: SearchPlan, confirmed: _Confirmed, order_log: dict[str, Any] | None,
                 screen_stats: dict[str, Any], wall: float) -> dict[str, Any]:
        """The search's record: its plan, seconds per phase, candidates per source, the screen's
        reliability, the rungs, the winner and its order search and calibration."""
        sources: dict[str, int] = {}
        for a in run.arms.values():
            sources[a.source] = sources.get(a.source, 0) + 1
        winner, top_q = confirmed.winner, confirmed.queries
        return {
            "plan": plan.as_dict(), "budget_seconds": self.budget, "wall_seconds": wall, "phases": run.phases,
            "screen": self._screen_label, "screened": len(run.arms.screened()), "sources": sources,
            "screen_queries": len(run.screen_q), "confirm_queries": top_q, **screen_stats,
            "screen_vs_confirm_spearman": confirmed.screen_vs_confirm, "rungs": confirmed.rungs,
            "stopped": confirmed.stopped, "slower_than_pilot": confirmed.pace,
            "winner_source": winner.source, "winner_confirm_loss": winner.confirm.get(top_q),
            "order_search": order_log, "calibrations": list(self.calibrations),
            "calibration": winner.calibration(top_q) if self.calibrations else None,
            "calibration_losses": winner.pairs.get(top_q),
        }


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


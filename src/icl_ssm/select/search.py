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
printed before it is spent (``say``); every phase stops at its own deadline, so the whole search
ends within the budget up to one evaluator call. A machine that slows after the pilot (another job
on the cores) stretches every evaluation: the confirmation measures how much slower its rungs run
than the pilot's rates and stops before a rung that would end past its share (the best of the
last rung run goes on, and ``details["stopped"]`` says why), and the order search is sized at the
same pace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from icl_ssm.calibrate import NONE
from icl_ssm.calibrate.losses import SEARCHED
from icl_ssm.cost import Cost
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import spearman
from icl_ssm.select.affinity import search_order
from icl_ssm.select.base import (
    Selection,
    Selector,
    arrange,
    register,
    top_k,
    top_k_per_label,
    validate_selection_inputs,
)
from icl_ssm.select.calibrated import CalibratedEvaluator, calibrated_losses, gold_indices
from icl_ssm.select.estimators import mean_affinity
from icl_ssm.select.evaluators import SubsetEvaluator, SubsetLosses, concat, reliability, split_half
from icl_ssm.select.sampling import balanced_subsets, label_quotas, stratified_subsets
from icl_ssm.select.search_plan import MAX_ARMS, fit_confirmation, plan_lines, plan_search, rungs_for

SOURCES = ("random", "balanced", "affinity", "seed", "swap")
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


def key(prompt: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(i) for i in prompt)


@dataclass
class Arm:
    """One candidate prompt: pool indices in prompt order, where it came from, and its losses."""

    prompt: list[int]
    source: str
    screen_loss: float = math.nan
    confirm: dict[int, float] = field(default_factory=dict)  # queries -> label-balanced dense loss
    # with calibrations: queries -> {calibration: its loss}; the arm's loss is the best of them
    pairs: dict[int, dict[str, float]] = field(default_factory=dict)

    def calibration(self, queries: int) -> str:
        """The calibration whose pair scored best on ``queries`` (``none`` without calibrations)."""
        losses = self.pairs.get(queries)
        return min(losses, key=losses.get) if losses else NONE


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
    generated ones. ``say`` gets the plan before the budget is spent and a line per phase.
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
    say: Callable[[str], None] | None = None
    progress: Callable[[int], None] | None = None
    on_total: Callable[[int], None] | None = None
    clock: Callable[[], float] = time.perf_counter
    _spent: list[Cost] = field(default_factory=list, init=False, repr=False)  # every evaluator call's cost

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
    def from_config(cls, cfg, model, builder, compressor=None, progress=None) -> PromptSearch:
        """``cfg.screen``: ``compressed`` (``compressor``'s caches), ``dense`` or ``none``; the
        confirmation and the order search on dense caches; label balance where the task has labels."""
        from icl_ssm.select.evaluators import CacheEvaluator

        labels = tuple(builder.task.labels) if builder.task.kind == "classification" else ()
        balance = bool(labels)

        def ev(cache: str) -> CacheEvaluator:
            return CacheEvaluator(model, builder, cache, compressor if cache == "compressed" else None, loss=cfg.loss,
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
                   seeds=dict(cfg.seeds), progress=progress,
                   calibrations=tuple(cfg.search_calibrations) if labels else ())

    def _say(self, line: str) -> None:
        if self.say is not None:
            self.say(line)

    # -- candidate generation ------------------------------------------------------------------
    def _random(self, n: int, k: int, m: int, rng: np.random.Generator) -> list[list[int]]:
        return balanced_subsets(n, k, m, rng) if m > 0 else []

    def _balanced(self, pool_labels: list[str], k: int, m: int, rng: np.random.Generator) -> list[list[int]]:
        if m <= 0 or not self.labels:
            return []
        prompts = stratified_subsets(pool_labels, k, m, rng)
        return [arrange(p, [pool_labels[i] for i in p], "interleave", rng) if j % 2 else p
                for j, p in enumerate(prompts)]  # half interleaved, half in a random order

    def _swaps(self, best: Sequence[Arm], n: int, pool_labels: list[str], m: int,
               rng: np.random.Generator) -> list[list[int]]:
        """``m`` neighbours of the best screened prompts: one or two members swapped for outsiders
        (of the same label where the task has labels, so a balanced prompt stays balanced), or
        two positions exchanged."""
        out = []
        for j in range(m):
            base = list(best[j % len(best)].prompt)
            move = rng.integers(3)
            if move == 2 and len(base) > 1:  # reorder: two positions exchanged
                a, b = rng.choice(len(base), 2, replace=False)
                base[a], base[b] = base[b], base[a]
            else:
                inside = set(base)
                for _ in range(int(move) + 1):
                    at = int(rng.integers(len(base)))
                    same = [i for i in range(n) if i not in inside
                            and (not self.labels or pool_labels[i] == pool_labels[base[at]])]
                    if not same:
                        continue
                    new = int(rng.choice(same))
                    inside.discard(base[at])
                    inside.add(new)
                    base[at] = new
            out.append(base)
        return out

    # -- evaluation ------------------------------------------------------------------------------
    def _pair_losses(self, result: SubsetLosses, queries) -> list[dict[str, float]] | None:
        """Per subset of ``result``: {calibration: its loss} (None without calibrations)."""
        if not self.calibrations:
            return None
        if result.query_scores is None:
            raise ValueError("search calibrations need an evaluator that reads label scores")
        gold = gold_indices(self.labels, queries)
        table = {c: calibrated_losses(result.query_scores, gold, c) for c in self.calibrations}
        return [{c: float(table[c][i]) for c in self.calibrations} for i in range(len(result.losses))]

    def _screen(self, pool, queries, arms: list[Arm]) -> SubsetLosses:
        result = self.screen.evaluate(pool, queries, [a.prompt for a in arms])
        self._spent.append(result.cost)
        pairs = self._pair_losses(result, queries)
        for i, (a, loss) in enumerate(zip(arms, result.losses, strict=True)):
            a.screen_loss = float(loss) if pairs is None else min(pairs[i].values())
        if self.progress is not None:
            self.progress(len(arms))
        return result

    def _confirm(self, pool, validation, arms: list[Arm], queries: int) -> None:
        result = self.confirm.evaluate(pool, validation[:queries], [a.prompt for a in arms])
        self._spent.append(result.cost)
        pairs = self._pair_losses(result, validation[:queries])
        for i, (a, loss) in enumerate(zip(arms, result.losses, strict=True)):
            if pairs is None:
                a.confirm[queries] = float(loss)
            else:
                a.pairs[queries] = pairs[i]
                a.confirm[queries] = min(pairs[i].values())
        if self.progress is not None:
            self.progress(len(arms))

    def _time_confirm(self, pool, validation, prompts: list[Arm]) -> tuple[float, float]:
        """(prefix seconds, seconds per query) of the confirm evaluator, from two query counts."""
        q_small = max(1, min(4, self.confirm_queries))
        q_big = max(q_small + 1, min(16, self.confirm_queries))
        t0 = self.clock()
        self._confirm(pool, validation, prompts[:1], q_small)
        t1 = self.clock()
        self._confirm(pool, validation, prompts[:1], q_big)
        t2 = self.clock()
        a, b = t1 - t0, t2 - t1
        per_query = max((b - a) / (q_big - q_small), 1e-6)
        return max(a - per_query * q_small, 0.0), per_query

    def _halve(self, pool, validation, contenders: list[Arm], rungs: list[tuple[int, int]], prefix: float,
               per_query: float, confirm_end: float) -> tuple[list[Arm], list[dict], str | None, float]:
        """Successive halving on the confirm evaluator: each rung ``(size, queries)`` scores the best
        ``size`` contenders on ``queries`` validation queries and re-ranks them.

        Before each chunk it predicts the chunk's end from the pilot's rates (``prefix``,
        ``per_query``) times the pace measured so far; one that would end past ``confirm_end`` stops
        the halving (never before the first chunk). Returns the contenders ranked by the last rung
        reached, the rung log, why it stopped (``None`` if it ran every rung) and the pace (seconds
        taken over seconds the pilot's rates give; 1.0 before any rung)."""
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
                self._confirm(pool, validation, part, queries)
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
        if stopped:
            self._say(f"search: {stopped}")
        return contenders, rung_log, stopped, pace()

    # -- the search ------------------------------------------------------------------------------
    def select(self, pool, validation, k, rng):
        validate_selection_inputs(pool, validation, k)
        need = max(self.confirm_queries, self.screen_queries if self.screen is not None else 0)
        if len(validation) < need:
            raise ValueError(f"the search needs {need} validation queries (screen_queries={self.screen_queries}, "
                             f"confirm_queries={self.confirm_queries}); got {len(validation)}")
        start = self.clock()
        self._spent = []
        n = len(pool)
        pool_labels = [e.target for e in pool]
        if self.labels:
            label_quotas(pool_labels, k)  # refuses a pool that cannot fill a balanced prompt
        validation = [validation[i] for i in balanced_order(validation, self.labels)]  # every prefix balanced
        screen_q = validation[: self.screen_queries]
        arms: dict[tuple[int, ...], Arm] = {}

        def add(prompts: list[list[int]], source: str) -> list[Arm]:
            new = []
            for p in prompts:
                if key(p) not in arms:
                    arms[key(p)] = Arm(list(p), source)
                    new.append(arms[key(p)])
            return new

        # pilot: time both evaluators on a few prompts (kept as candidates)
        half = PILOT // 2 if self.labels else 0
        first = add(self._random(n, k, PILOT - half, rng), "random") + add(self._balanced(pool_labels, k, half, rng),
                                                                          "balanced")
        screen_each = None
        if self.screen is not None:
            t0 = self.clock()
            screen_results = [self._screen(pool, screen_q, first)]
            screen_each = (self.clock() - t0) / len(first)
        else:
            screen_results = []
        prefix, per_query = self._time_confirm(pool, validation, first)
        spent = self.clock() - start
        plan = plan_search(max(self.budget - spent, 1e-3), screen_per_prompt=screen_each, prefix=prefix,
                           per_query=per_query, confirm_queries=self.confirm_queries,
                           order_candidates=self.order_candidates, max_arms=MAX_ARMS if self.screen else 16 * MAX_ARMS)
        for line in plan_lines(plan, self.budget, self.screen_name if self.screen is not None else "none"):
            self._say(line)
        if self.on_total is not None:  # prompt evaluations in all, for a progress bar
            self.on_total(len(first) * (2 + (self.screen is not None)) + plan.screened
                          + sum(a for a, _ in plan.rungs) + plan.orders)
        deadline = start + spent + plan.seconds["screen"]

        # screen: random and balanced prompts, then Algorithm 2's top k and the seeds, then swaps
        phases: dict[str, float] = {"pilot": spent}
        if self.screen is not None:
            t0 = self.clock()
            swaps = int(self.swap_share * plan.screened)
            fresh = max(0, plan.screened - len(first) - swaps - len(self.seeds) - 2)
            half = fresh // 2 if self.labels else 0
            batch = add(self._random(n, k, fresh - half, rng), "random") + add(
                self._balanced(pool_labels, k, half, rng), "balanced")
            screen_results += self._screen_until(pool, screen_q, batch, deadline)
            randoms = [a for a in arms.values() if math.isfinite(a.screen_loss)]
            derived = {f"seed:{name}": list(p) for name, p in self.seeds.items()}
            if len(randoms) >= 2:
                scores, _ = mean_affinity([a.prompt for a in randoms], np.array([a.screen_loss for a in randoms]), n)
                if np.isfinite(scores).sum() >= k:
                    derived["affinity"] = top_k(scores, k)
                    if self.labels:
                        picked = top_k_per_label(scores, pool_labels, k)
                        derived["affinity-per-label"] = arrange(picked, [pool_labels[i] for i in picked],
                                                                "interleave", rng)
            for name, p in derived.items():
                add([p], "seed" if name.startswith("seed:") else "affinity")
            screen_results += self._screen_until(pool, screen_q, [a for a in arms.values()
                                                                  if not math.isfinite(a.screen_loss)], deadline)
            while self.clock() < deadline and swaps > 0:
                best = sorted((a for a in arms.values() if math.isfinite(a.screen_loss)), key=lambda a: a.screen_loss)
                new = add(self._swaps(best[:4], n, pool_labels, min(8, swaps), rng), "swap")
                swaps -= len(new) or 1
                screen_results += self._screen_until(pool, screen_q, new, deadline)
            phases["screen"] = self.clock() - t0
            ranked = sorted((a for a in arms.values() if math.isfinite(a.screen_loss)), key=lambda a: a.screen_loss)
        else:  # random search: random (and balanced) prompts straight into the confirmation
            want = plan.arms - len(first)
            half = want // 2 if self.labels else 0
            add(self._random(n, k, want - half, rng), "random")
            add(self._balanced(pool_labels, k, half, rng), "balanced")
            seeded = add(list(self.seeds.values()), "seed")
            ranked = seeded + [a for a in arms.values() if a not in seeded]  # the given picks always confirmed
        screen_stats = _screen_stats(screen_results)

        # confirm: successive halving on the dense prompt, replanned on the time left
        t0 = self.clock()
        left = self.budget - (t0 - start) - plan.seconds["order"]
        arms_in, top_q, _ = fit_confirmation(left, prefix=prefix, per_query=per_query, queries=plan.queries,
                                             max_arms=plan.arms)
        contenders = ranked[:arms_in]
        contenders, rung_log, stopped, slower = self._halve(
            pool, validation, contenders, rungs_for(len(contenders), top_q), prefix, per_query,
            confirm_end=start + self.budget - plan.seconds["order"])
        top_q = rung_log[-1]["queries"]
        winner = contenders[0]
        phases["confirm"] = self.clock() - t0
        screen_vs_confirm = None
        first_rung = [a for a in ranked[:arms_in] if rung_log and rung_log[0]["queries"] in a.confirm]
        if self.screen is not None and len(first_rung) >= 3:
            q0 = rung_log[0]["queries"]
            screen_vs_confirm = _finite(spearman([a.screen_loss for a in first_rung],
                                                 [a.confirm[q0] for a in first_rung]))

        # order the survivor, on the time left
        t0 = self.clock()
        left = self.budget - (t0 - start)
        one = slower * (prefix + per_query * top_q)  # as slow as the confirmation ran
        orders = int(min(plan.orders, left // max(one, 1e-9)))
        indices, order_log = list(winner.prompt), None
        if orders >= 2:
            labels_of = [pool_labels[i] for i in winner.prompt]
            order_ev = self.order or self.confirm
            if self.calibrations:  # the survivor's orders scored as it will answer: with its calibration
                order_ev = CalibratedEvaluator(order_ev, winner.calibration(top_q), self.labels)
            indices, order_log = search_order(order_ev, pool, validation[:top_q], winner.prompt, labels_of, orders,
                                              rng)
            order_log["winner_loss"] = winner.confirm.get(top_q)
            self._spent.append(Cost(order_log["flops"], order_log["seconds"]))
        phases["order"] = self.clock() - t0
        wall = self.clock() - start

        scores = np.full(n, math.nan)
        if len(ranked) >= 2 and self.screen is not None:
            scored = [a for a in ranked if math.isfinite(a.screen_loss)]
            scores, _ = mean_affinity([a.prompt for a in scored], np.array([a.screen_loss for a in scored]), n)
        sources: dict[str, int] = {}
        for a in arms.values():
            sources[a.source] = sources.get(a.source, 0) + 1
        details = {
            "plan": plan.as_dict(), "budget_seconds": self.budget, "wall_seconds": wall, "phases": phases,
            "screen": self.screen_name if self.screen is not None else "none",
            "screened": sum(math.isfinite(a.screen_loss) for a in arms.values()), "sources": sources,
            "screen_queries": len(screen_q), "confirm_queries": top_q, **screen_stats,
            "screen_vs_confirm_spearman": screen_vs_confirm, "rungs": rung_log, "stopped": stopped,
            "slower_than_pilot": slower,
            "winner_source": winner.source, "winner_confirm_loss": winner.confirm.get(top_q),
            "order_search": order_log, "calibrations": list(self.calibrations),
            "calibration": winner.calibration(top_q) if self.calibrations else None,
            "calibration_losses": winner.pairs.get(top_q),
        }
        return Selection(self.name, indices, np.asarray(scores, dtype=np.float64), sum(self._spent, Cost()),
                         subsets=len(arms), details=details)

    def _screen_until(self, pool, queries, arms: list[Arm], deadline: float) -> list[SubsetLosses]:
        """Screen ``arms`` in chunks of the screen evaluator's batch until ``deadline``."""
        out, step = [], max(1, getattr(self.screen, "batch", 8))
        for j in range(0, len(arms), step):
            if self.clock() >= deadline:
                break
            out.append(self._screen(pool, queries, arms[j : j + step]))
        return out


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _screen_stats(results: Sequence[SubsetLosses]) -> dict[str, Any]:
    """Split-half reliability of the screen's prompt losses (over its queries)
    (:func:`~icl_ssm.select.evaluators.split_half`, :func:`~icl_ssm.select.evaluators.reliability`),
    on the prompts screened with per-query losses."""
    rows = [r for r in results if r.query_losses is not None and len(r.losses)]
    if not rows:
        return {"screen_split_half": None, "screen_reliability": None}
    merged = concat(*rows)
    r = reliability(split_half(merged), merged.query_losses.shape[1])
    return {"screen_split_half": r["split_half"], "screen_reliability": r["reliability"]}

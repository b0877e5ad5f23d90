"""How the prompt search (:mod:`icl_ssm.select.search`) spends its wall-time budget: successive
halving's rungs and their seconds, the largest confirmation that fits a share of the budget, and
the split of the budget between screen, confirmation and order search, in words before it is
spent."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

SHARES = {"screen": 0.5, "confirm": 0.35, "order": 0.15}  # of the budget, with a screen
MAX_ARMS = 32  # prompts a screen hands to the confirmation at most (random search takes up to 16 times more)
MIN_CONFIRM_QUERIES = 8  # the fewest queries the confirmation's last rung is cut to when the budget is short


@dataclass
class SearchPlan:
    """How the budget is spent: ``screened`` candidate prompts on the screen (0 without one),
    ``arms`` prompts entering the confirmation, its ``rungs`` as ``(arms, queries)`` pairs
    ending at ``queries`` (the asked ``confirm_queries``, or fewer where the budget cannot hold
    two prompts on them), ``orders`` orders of the survivor (0: no order search), the seconds
    each phase is given, and ``over`` (True when even the smallest confirmation does not fit)."""

    screened: int
    arms: int
    queries: int
    rungs: list[tuple[int, int]]
    orders: int
    seconds: dict[str, float]
    per_prompt: dict[str, float]  # measured seconds: screen per prompt, confirm prefix and per query
    over: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rungs_for(arms: int, max_queries: int) -> list[tuple[int, int]]:
    """Successive halving's rungs for ``arms`` prompts ending at ``max_queries`` queries:
    ``[(arms, q0), (ceil(arms/2), 2 q0), ..., (1 or 2, max_queries)]``, where the last rung
    holds the final two (one when ``arms == 1``) and every rung doubles the queries."""
    if arms < 1 or max_queries < 1:
        raise ValueError(f"arms={arms}, max_queries={max_queries}: expected >= 1")
    sizes = [arms]
    while sizes[-1] > 2:
        sizes.append(math.ceil(sizes[-1] / 2))
    queries = [max(1, max_queries >> (len(sizes) - 1 - i)) for i in range(len(sizes))]
    return list(zip(sizes, queries, strict=True))


def rungs_seconds(rungs: Sequence[tuple[int, int]], prefix: float, per_query: float) -> float:
    """Seconds the rungs take: every arm of a rung pays one prefix and ``per_query`` per query."""
    return sum(a * (prefix + per_query * q) for a, q in rungs)


def fit_confirmation(seconds: float, *, prefix: float, per_query: float, queries: int, min_arms: int = 2,
                     max_arms: int = MAX_ARMS, min_queries: int = MIN_CONFIRM_QUERIES) -> tuple[int, int, bool]:
    """``(arms, queries, over)`` of the largest successive halving that fits ``seconds``: the
    queries halved (not below ``min_queries``) until ``min_arms`` prompts fit, then the arms
    doubled while they fit, then grown a quarter at a time (at most ``max_arms``); ``over``
    when even ``min_arms`` on ``min_queries`` do not."""
    q = queries
    while q > min_queries and rungs_seconds(rungs_for(min_arms, q), prefix, per_query) > seconds:
        q = max(min_queries, q // 2)
    def fits(m: int) -> bool:
        return m <= max_arms and rungs_seconds(rungs_for(m, q), prefix, per_query) <= seconds

    arms = min_arms
    while fits(arms * 2):
        arms *= 2
    step = max(1, arms // 4)  # then a quarter at a time, so that little of the share is left unused
    while fits(arms + step):
        arms += step
    return arms, q, rungs_seconds(rungs_for(arms, q), prefix, per_query) > seconds


def plan_search(budget: float, *, screen_per_prompt: float | None, prefix: float, per_query: float,
                confirm_queries: int, order_candidates: int, min_arms: int = 2, max_arms: int = MAX_ARMS) -> SearchPlan:
    """Split ``budget`` seconds between screen, confirmation and order search.

    ``screen_per_prompt``: measured seconds per screened prompt (None: no screen); ``prefix``
    and ``per_query``: the confirm evaluator's seconds per prompt and per (prompt, query).
    With a screen the budget is shared as :data:`SHARES`; without one the screen's share goes
    to the confirmation. The confirmation is the largest that fits its share
    (:func:`fit_confirmation`); the order search takes the most orders (at least 2, else none)
    on the confirmation's queries that fit its share; the screen what is left.
    """
    if budget <= 0:
        raise ValueError(f"budget={budget} s: expected a positive time")
    confirm_share = SHARES["confirm"] if screen_per_prompt is not None else 1.0 - SHARES["order"]
    arms, queries, over = fit_confirmation(confirm_share * budget, prefix=prefix, per_query=per_query,
                                           queries=confirm_queries, min_arms=min_arms, max_arms=max_arms)
    rungs = rungs_for(arms, queries)
    confirm_s = rungs_seconds(rungs, prefix, per_query)
    one_order = prefix + per_query * queries
    orders = min(order_candidates, int(SHARES["order"] * budget // max(one_order, 1e-9)))
    orders = orders if orders >= 2 else 0
    order_s = orders * one_order
    screened, screen_s = 0, 0.0
    if screen_per_prompt is not None:
        screen_s = max(0.0, budget - confirm_s - order_s)
        screened = int(screen_s // max(screen_per_prompt, 1e-9))
    return SearchPlan(screened=screened, arms=arms, queries=queries, rungs=rungs, orders=orders,
                      seconds={"screen": screen_s, "confirm": confirm_s, "order": order_s},
                      per_prompt={"screen": screen_per_prompt or 0.0, "prefix": prefix, "per_query": per_query},
                      over=over)


def plan_lines(plan: SearchPlan, budget: float, screen: str) -> list[str]:
    """The plan, for stderr, before the budget is spent."""
    rungs = " -> ".join(f"{a} x {q}q" for a, q in plan.rungs)
    lines = [f"search plan for {budget / 60:.1f} min: "
             + (f"screen {plan.screened} prompts on {screen} caches ({plan.seconds['screen']:.0f} s, "
                f"{plan.per_prompt['screen']:.2f} s each); " if screen != "none" else "no screen; ")
             + f"confirm {plan.arms} on dense caches by successive halving ({rungs}, about "
             f"{plan.seconds['confirm']:.0f} s); "
             + (f"order the survivor over {plan.orders} orders ({plan.seconds['order']:.0f} s)" if plan.orders
                else "no order search (two orders do not fit)")]
    if plan.over:
        lines.append(f"warning: {budget / 60:.1f} min cannot hold even {plan.arms} prompts on {plan.queries} dense "
                     f"queries at {plan.per_prompt['prefix']:.1f} s a prompt and "
                     f"{plan.per_prompt['per_query']:.2f} s a query; the search will run over its budget "
                     "(--search-minutes)")
    return lines

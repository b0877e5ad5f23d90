"""Affinity budgets sized to reliability: the pilot's split-halves, the plan, the main round."""

import math

import numpy as np
import pytest

from icl_ssm.cost import Cost
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import spearman
from icl_ssm.select.affinity import AffinitySelector
from icl_ssm.select.budget import (
    BudgetPlan,
    Reliability,
    plan_budget,
    plan_lines,
    score_split_half,
    subsets_for_reliability,
)
from icl_ssm.select.estimators import mean_affinity
from icl_ssm.select.evaluators import SubsetEvaluator, SubsetLosses


class NoisyAdditive(SubsetEvaluator):
    """A subset's loss on query q: minus the mean quality of its members plus query noise.
    Each call costs `unit` seconds per subset-query (counted, not slept)."""

    name = "noisy"

    def __init__(self, quality, noise, unit=0.01, seed=0):
        self.quality, self.noise, self.unit = np.asarray(quality), noise, unit
        self.rng = np.random.default_rng(seed)
        self.calls = []

    def evaluate(self, pool, validation, subsets):
        self.calls.append((len(subsets), len(validation)))
        base = np.array([-self.quality[list(s)].mean() for s in subsets])
        q = base[:, None] + self.noise * self.rng.normal(size=(len(subsets), len(validation)))
        return SubsetLosses(q.mean(1), Cost(1.0 * q.size, self.unit * q.size), q.size, q)


def pool_of(n):
    return [Example(id=str(i), input=f"x{i}", target="a" if i % 2 else "b") for i in range(n)]


def test_score_split_half_sees_a_real_ranking_and_noise():
    rng = np.random.default_rng(0)
    n, k = 40, 8
    quality = np.linspace(0, 1, n)
    subsets = [sorted(rng.choice(n, k, replace=False).tolist()) for _ in range(400)]
    real = np.array([-quality[s].mean() for s in subsets])
    assert score_split_half(subsets, real, n, mean_affinity) > 0.8
    noise = rng.normal(size=len(subsets))
    assert abs(score_split_half(subsets, noise, n, mean_affinity)) < 0.3
    assert math.isnan(score_split_half(subsets[:2], real[:2], n, mean_affinity))


def test_reliability_of_disagreeing_halves_is_zero():
    r = Reliability(loss_half=-0.6, score_half=0.5)
    assert r.losses == 0.0 and r.scores == pytest.approx(2 / 3)
    assert r.as_dict() == {"loss_split_half": -0.6, "loss_reliability": 0.0, "score_split_half": 0.5,
                           "score_reliability": pytest.approx(2 / 3)}
    assert Reliability(float("nan"), 0.5).as_dict()["loss_reliability"] is None


def test_spearman_brown_prophecy_for_subsets():
    # half 0.5 on 40 subsets: reliability 0.67; 0.8 takes a factor 4 on a half of 20 subsets
    assert subsets_for_reliability(0.5, 40, 0.8) == 80
    assert subsets_for_reliability(0.8, 40, 0.8) == 20
    assert subsets_for_reliability(0.0, 40) is None and subsets_for_reliability(float("nan"), 40) is None
    with pytest.raises(ValueError, match="target=1.2"):
        subsets_for_reliability(0.5, 40, 1.2)


def test_plan_grows_to_the_target_when_affordable_and_is_cut_by_the_budget():
    r = Reliability(loss_half=0.5, score_half=0.5)
    plan = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=r, max_queries=64,
                       min_subsets=5, budget_seconds=3600)
    assert plan == BudgetPlan(subsets=40, queries=16, estimated_seconds=16.0 + 0.1 * 40 * 16, limited=None)
    cut = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=r, max_queries=64,
                      min_subsets=5, budget_seconds=60)
    assert cut.limited == "budget" and cut.estimated_seconds <= 60 + 1e-9 and cut.subsets >= 20
    few = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=r, max_queries=10,
                      min_subsets=5, budget_seconds=3600)
    assert few.queries == 10 and few.limited == "queries"
    noise = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0,
                        reliability=Reliability(-0.1, 0.9), max_queries=32, min_subsets=5, budget_seconds=120)
    assert noise.limited == "unpredictable" and noise.queries <= 32 and noise.estimated_seconds <= 120 + 1e-9
    spend = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=Reliability(0.9, -0.1),
                        max_queries=8, min_subsets=5, budget_seconds=3600)  # scores unpredictable: the budget is spent
    assert spend.limited == "unpredictable" and spend.subsets == 20 + int((3600 - 16.0) // 0.8)
    assert spend.estimated_seconds == pytest.approx(3600, abs=0.8)
    same = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=Reliability(0.9, 0.9),
                       max_queries=32, min_subsets=5, budget_seconds=120)
    assert same == BudgetPlan(subsets=20, queries=8, estimated_seconds=16.0, limited=None)  # the pilot suffices
    lines = plan_lines({"subsets": 20, "queries": 8, "seconds": 16.0, "reliability": r.as_dict()}, plan, 3600, 0.8)
    assert lines[0] == ("pilot: 20 subsets x 8 queries in 16 s; reliability of the subset losses 0.67, of the "
                        "candidates' scores 0.67")
    assert lines[1].startswith("plan for reliability 0.8: 40 subsets x 16 queries, about 1.3 min at most")
    with pytest.raises(ValueError, match="expected positive sizes and budget"):
        plan_budget(pilot_subsets=0, pilot_queries=8, pilot_seconds=1.0, reliability=r, max_queries=8,
                    min_subsets=1, budget_seconds=10)


def test_a_budgeted_selection_runs_pilot_plan_and_main_round():
    n, k = 40, 8
    quality = np.linspace(0, 1, n)
    pool, validation = pool_of(n), pool_of(48)
    evaluator = NoisyAdditive(quality, noise=1.0)
    said, totals = [], []
    selector = AffinitySelector(evaluator, budget=600.0, say=said.append, on_total=totals.append)
    sel = selector.select(pool, validation, k, np.random.default_rng(0))
    record = sel.details["budget"]
    pilot = record["pilot"]
    assert (pilot["subsets"], pilot["queries"]) == (selector.pilot_size(n, k), 8) == (10, 8)
    assert evaluator.calls[0] == (10, 8)  # the pilot, one chunk... then the main round on the planned queries
    assert record["queries"] == record["plan"]["queries"] > 8 and sel.subsets == record["plan"]["subsets"]
    assert all(q == record["queries"] for _, q in evaluator.calls[1:])
    assert totals == [2 * 10 + (sel.subsets - 10)]  # the pilot's subsets scored again on more queries
    assert said[0].startswith("pilot: 10 subsets x 8 queries") and said[1].startswith("plan for reliability 0.8")
    assert said[2].startswith("reached: reliability of the subset losses")
    assert record["reached"]["score_reliability"] > pilot["reliability"]["score_reliability"]
    assert spearman(sel.scores, quality) > 0.7 and min(sel.indices) >= n // 2  # the better half is found
    assert sel.cost.seconds == pytest.approx(0.01 * (10 * 8 + sel.subsets * record["queries"]))  # pilot counted


def test_a_budget_the_pilot_spends_keeps_the_pilot():
    n, k = 40, 8
    evaluator = NoisyAdditive(np.linspace(0, 1, n), noise=0.1, unit=10.0)  # the pilot alone: 800 s
    sel = AffinitySelector(evaluator, budget=60.0).select(pool_of(n), pool_of(48), k, np.random.default_rng(0))
    record = sel.details["budget"]
    assert record["plan"]["limited"] == "budget" and sel.subsets == 10 and record["queries"] == 8
    assert len(evaluator.calls) == 1  # nothing after the pilot
    assert record["reached"] == record["pilot"]["reliability"] and record["reached"]["loss_reliability"] is not None


def test_budget_refuses_conflicting_settings():
    ev = NoisyAdditive(np.zeros(4), 1.0)
    with pytest.raises(ValueError, match="without subsets and adaptive"):
        AffinitySelector(ev, budget=10.0, subsets=30)
    with pytest.raises(ValueError, match="budget=-1.0 s"):
        AffinitySelector(ev, budget=-1.0)
    with pytest.raises(ValueError, match="at least 2 validation queries"):
        AffinitySelector(ev, budget=10.0).select(pool_of(8), pool_of(1), 2, np.random.default_rng(0))

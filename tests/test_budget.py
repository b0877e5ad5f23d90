"""Affinity budgets sized to reliability: the pilot's split-halves, the plan, the main round."""

import math

import numpy as np
import pytest

from icl_ssm.cost import Cost
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import queries_for_reliability, spearman
from icl_ssm.select.affinity import AffinitySelector
from icl_ssm.select.base import Hooks
from icl_ssm.select.budget import (
    Reliability,
    block_halves,
    draw_in_blocks,
    permutation_block,
    plan_budget,
    plan_lines,
    score_split_half,
    spearman_lower_bound,
    subsets_for_reliability,
)
from icl_ssm.select.estimators import mean_affinity
from icl_ssm.select.sampling import balanced_subsets, stratified_subsets
from icl_ssm.select.subset_losses import SubsetEvaluator, SubsetLosses


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


class Recording(NoisyAdditive):
    """NoisyAdditive that keeps the subsets of every call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def evaluate(self, pool, validation, subsets):
        self.seen.append([list(s) for s in subsets])
        return super().evaluate(pool, validation, subsets)


def pool_of(n, targets=None):
    targets = targets or ["a" if i % 2 else "b" for i in range(n)]
    return [Example(id=str(i), input=f"x{i}", target=targets[i]) for i in range(n)]


def covered(subsets, idx):
    return set().union(*(subsets[j] for j in idx))


def test_score_split_half_sees_a_real_ranking_and_noise():
    rng = np.random.default_rng(0)
    n, k = 40, 8
    quality = np.linspace(0, 1, n)
    subsets = [sorted(rng.choice(n, k, replace=False).tolist()) for _ in range(400)]
    real = np.array([-quality[s].mean() for s in subsets])
    block = permutation_block(n, k)
    assert score_split_half(subsets, real, n, mean_affinity, block) > 0.8
    noise = rng.normal(size=len(subsets))
    assert abs(score_split_half(subsets, noise, n, mean_affinity, block)) < 0.3
    assert math.isnan(score_split_half(subsets[:2], real[:2], n, mean_affinity, block))  # one half empty


@pytest.mark.parametrize(("n", "k"), [(40, 8), (41, 8), (13, 5), (30, 4), (9, 9)])
def test_a_pilot_drawn_in_blocks_has_every_candidate_in_both_halves(n, k):
    block = permutation_block(n, k)
    assert block == math.ceil(n / k)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        pilot = draw_in_blocks(lambda m, rng=rng: balanced_subsets(n, k, m, rng), max(8, 2 * block), block)
        assert len(pilot) == max(8, 2 * block) and all(len(set(s)) == k for s in pilot)
        first, second = block_halves(len(pilot), block)
        assert covered(pilot, first) == covered(pilot, second) == set(range(n))


def test_what_the_blocks_fix_parity_and_one_stream_miss_candidates():
    n, k = 41, 8  # k does not divide n: a subset straddles two permutations
    block = permutation_block(n, k)
    assert block_halves(14, 3)[0].tolist() == [0, 1, 2, 6, 7, 8, 12, 13]
    stream = balanced_subsets(n, k, 2 * block, np.random.default_rng(0))
    assert min(len(covered(stream, range(h, 2 * block, 2))) for h in (0, 1)) < n  # halves by parity
    assert min(len(covered(stream, half)) for half in block_halves(2 * block, block)) < n  # one stream in blocks
    square = balanced_subsets(40, 8, 10, np.random.default_rng(0))  # k divides n: one stream's blocks are exact
    assert all(covered(square, half) == set(range(40)) for half in block_halves(10, 5))


def test_stratified_blocks_cover_every_label_in_both_halves():
    labels = ["a"] * 20 + ["b"] * 10 + ["c"] * 6
    block = permutation_block(len(labels), 7, labels)
    assert block == 10  # "a" needs 20 / 2 subsets at its quota of 2
    for seed in range(10):
        rng = np.random.default_rng(seed)
        pilot = draw_in_blocks(lambda m, rng=rng: stratified_subsets(labels, 7, m, rng), 2 * block, block)
        assert all(covered(pilot, half) == set(range(len(labels))) for half in block_halves(len(pilot), block))


@pytest.mark.parametrize("stratify", [False, True])
def test_the_selectors_pilot_has_every_candidate_in_both_halves(stratify):
    n, k = (41, 8) if not stratify else (40, 4)
    targets = None if not stratify else ["a"] * 30 + ["b"] * 10  # "a" needs 15 subsets a block, beyond n / k
    evaluator = Recording(np.linspace(0, 1, n), noise=0.1)
    selector = AffinitySelector(evaluator, budget=60.0, stratify=stratify, chunk=64)
    sel = selector.select(pool_of(n, targets), pool_of(48), k, np.random.default_rng(0))
    pilot, block = evaluator.seen[0], (6 if not stratify else 15)
    assert len(pilot) == sel.details["budget"]["pilot"]["subsets"] == 2 * block
    assert all(covered(pilot, half) == set(range(n)) for half in block_halves(len(pilot), block))


def test_spearman_lower_bound_is_fishers_z_and_covers_the_truth():
    # planted: 0.5 on 40 pairs at 90%: tanh(atanh(0.5) - z_0.9 sqrt(1.06 / 37))
    assert spearman_lower_bound(0.5, 40, 0.9) == pytest.approx(0.32067, abs=1e-4)
    assert spearman_lower_bound(0.5, 20, 0.9) == pytest.approx(0.22536, abs=1e-4)
    assert spearman_lower_bound(0.5, 40, 0.99) < spearman_lower_bound(0.5, 40, 0.9) < 0.5
    assert math.isnan(spearman_lower_bound(0.5, 3)) and math.isnan(spearman_lower_bound(math.nan, 40))
    assert spearman_lower_bound(1.0, 40) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="confidence=1.5"):
        spearman_lower_bound(0.5, 40, 1.5)
    rng = np.random.default_rng(0)  # bivariate normal, rho 0.5: population Spearman (6 / pi) asin(rho / 2)
    truth = 6 / math.pi * math.asin(0.25)
    draws = rng.multivariate_normal([0, 0], [[1, 0.5], [0.5, 1]], size=(1000, 40))
    below = [spearman_lower_bound(spearman(x[:, 0], x[:, 1]), 40, 0.9) <= truth for x in draws]
    assert 0.86 <= np.mean(below) <= 0.94


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
    r = Reliability(loss_half=0.5, score_half=0.5)  # no sizes: the split-halves are taken as exact
    plan = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=r, max_queries=64,
                       min_subsets=5, budget_seconds=3600)
    assert (plan.subsets, plan.queries, plan.limited) == (40, 16, None)
    assert plan.estimated_seconds == pytest.approx(16.0 + 0.1 * 40 * 16)
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
    assert spend.limited == "unpredictable" and spend.subsets == 20 + 4480  # 3584 s left at 0.8 s a subset
    assert spend.estimated_seconds == pytest.approx(3600, abs=0.8)
    same = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=Reliability(0.9, 0.9),
                       max_queries=32, min_subsets=5, budget_seconds=120)
    assert (same.subsets, same.queries, same.estimated_seconds, same.limited) == (20, 8, 16.0, None)  # the pilot
    # suffices
    lines = plan_lines({"subsets": 20, "queries": 8, "seconds": 16.0, "reliability": r.as_dict()}, plan, 3600, 0.8)
    assert lines[0] == ("pilot: 20 subsets x 8 queries in 16 s; reliability of the subset losses 0.67 (split-half "
                        "0.50, 90% lower bound 0.50), of the candidates' scores 0.67 (split-half 0.50, 90% lower "
                        "bound 0.50)")
    assert lines[1].startswith("plan for reliability 0.8: 40 subsets x 16 queries, about 1.3 min at most")
    with pytest.raises(ValueError, match="expected positive sizes and budget"):
        plan_budget(pilot_subsets=0, pilot_queries=8, pilot_seconds=1.0, reliability=r, max_queries=8,
                    min_subsets=1, budget_seconds=10)


def test_the_plan_is_made_from_the_lower_bounds():
    kw = dict(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, max_queries=512, min_subsets=5,
              budget_seconds=1e6)
    exact = plan_budget(reliability=Reliability(0.5, 0.5), **kw)
    sized = Reliability(0.5, 0.5, subsets=20, candidates=40)  # halves over 20 subsets, over 40 candidates
    assert sized.lower(0.9) == (pytest.approx(0.22536, abs=1e-4), pytest.approx(0.32067, abs=1e-4))
    plan = plan_budget(reliability=sized, **kw)
    assert (exact.queries, exact.subsets) == (16, 40)
    assert plan.queries == queries_for_reliability(0.22536, 8) == 55  # 4 (1 - h) / h on halves of 4 queries
    assert plan.subsets == subsets_for_reliability(0.32067, 20) == 85 and plan.limited is None
    record = plan.as_dict()
    assert record["confidence"] == 0.9 and record["loss_split_half"] == record["score_split_half"] == 0.5
    assert record["loss_split_half_lower"] == pytest.approx(0.22536, abs=1e-4)
    assert record["score_split_half_lower"] == pytest.approx(0.32067, abs=1e-4)
    lines = plan_lines({"subsets": 20, "queries": 8, "seconds": 16.0, "reliability": sized.as_dict()}, plan, 1e6, 0.8)
    assert "(split-half 0.50, 90% lower bound 0.23)" in lines[0] and "lower bound 0.32)" in lines[0]
    assert lines[1].startswith("plan for reliability 0.8: 85 subsets x 55 queries")
    # a point above 0 whose bound is not: nothing is predicted for the queries
    shaky = plan_budget(reliability=Reliability(0.3, 0.5, subsets=8, candidates=None), **kw)
    assert shaky.loss_split_half_lower < 0 < shaky.loss_split_half
    assert shaky.limited == "unpredictable" and shaky.queries == 512
    assert plan_budget(reliability=Reliability(0.3, 0.5), **kw).limited is None
    none = Reliability(math.nan, 0.5, subsets=0, candidates=40)
    assert plan_budget(reliability=none, **kw).as_dict()["loss_split_half_lower"] is None


def test_subsets_grow_back_when_the_budget_cuts_queries():
    # unit 0.1 s per subset-query; at least 40 subsets; the split-halves want 144 queries (64 there) and 360 subsets
    r = Reliability(0.1, 0.1)
    plan = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=r, max_queries=64,
                       min_subsets=40, budget_seconds=55.6)
    # 39.6 s left: 40 subsets fit on 9 queries (36 s), and at 9 queries 44 subsets do (39.6 s)
    assert (plan.subsets, plan.queries, plan.limited) == (44, 9, "budget")
    assert plan.estimated_seconds == pytest.approx(55.6) and plan.estimated_seconds <= 55.6 + 1e-9
    for budget in (40.0, 55.6, 90.0, 200.0):  # whatever the cut, no whole subset's time is left unspent
        p = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=r, max_queries=64,
                        min_subsets=40, budget_seconds=budget)
        assert p.limited == "budget" and 8 <= p.queries < 64 and p.subsets >= 40
        assert budget - 0.1 * p.queries < p.estimated_seconds <= budget + 1e-9
    floor = plan_budget(pilot_subsets=20, pilot_queries=8, pilot_seconds=16.0, reliability=r, max_queries=64,
                        min_subsets=40, budget_seconds=30.0)  # 40 subsets do not fit even on the pilot's 8 queries
    assert (floor.subsets, floor.queries, floor.estimated_seconds) == (40, 8, 32.0)


def test_a_budgeted_selection_runs_pilot_plan_and_main_round():
    n, k = 40, 8
    quality = np.linspace(0, 1, n)
    pool, validation = pool_of(n), pool_of(48)
    evaluator = NoisyAdditive(quality, noise=1.0)
    said, totals = [], []
    selector = AffinitySelector(evaluator, budget=600.0, hooks=Hooks(on_say=said.append, on_total=totals.append))
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
    plan = record["plan"]  # the pilot's points and the lower bounds the plan was made from
    assert plan["loss_split_half"] == pilot["reliability"]["loss_split_half"] > plan["loss_split_half_lower"]
    assert plan["score_split_half"] == pilot["reliability"]["score_split_half"] > plan["score_split_half_lower"]
    assert "90% lower bound" in said[0]
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

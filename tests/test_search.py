"""The prompt search (select/search.py, select/search_plan.py): its plan, its halving, its budget
and what it finds on planted prompt values where the best prompt is known."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

from icl_ssm.cost import Cost
from icl_ssm.data.tasks import Example
from icl_ssm.select.search import PromptSearch, balanced_order
from icl_ssm.select.search_plan import plan_lines, plan_search, rungs_for, rungs_seconds
from icl_ssm.select.subset_losses import SubsetEvaluator, SubsetLosses

LABELS = ("neg", "pos")


def pool_of(n: int) -> list[Example]:
    return [Example(str(i), f"text {i}", LABELS[i % 2]) for i in range(n)]


def validation_of(q: int) -> list[Example]:
    return [Example(f"v{i}", f"query {i}", LABELS[(i // 3) % 2]) for i in range(q)]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Planted(SubsetEvaluator):
    """A prompt's loss: minus the planted members it holds, plus a penalty when its last two
    labels agree (an order effect), plus per-query noise of scale ``noise``; each call advances
    ``clock`` by ``prefix + per_query * queries`` seconds per prompt."""

    good: frozenset
    pool_labels: list
    clock: Clock
    noise: float = 0.5
    prefix: float = 0.2
    per_query: float = 0.02
    seed: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def value(self, prompt) -> float:
        tail = self.pool_labels[prompt[-1]] == self.pool_labels[prompt[-2]] if len(prompt) > 1 else False
        return -float(sum(i in self.good for i in prompt)) + 0.5 * tail

    def evaluate(self, pool, validation, subsets):
        q = len(validation)
        per_query = np.array([[self.value(s) + self.noise * self.rng.normal() for _ in range(q)] for s in subsets])
        seconds = len(subsets) * (self.prefix + self.per_query * q)
        self.clock.t += seconds
        return SubsetLosses(per_query.mean(1), Cost(0, seconds), 0, per_query, None)


def make_search(budget: float, *, screen: bool = True, seed: int = 0, n: int = 40, good=range(6), noise=0.5,
                **kw) -> tuple[PromptSearch, list[Example]]:
    pool = pool_of(n)
    clock = Clock()
    labels = [e.target for e in pool]
    confirm = Planted(frozenset(good), labels, clock, noise=noise, seed=seed)
    cheap = Planted(frozenset(good), labels, clock, noise=2 * noise, prefix=0.02, per_query=0.002, seed=seed + 1)
    return PromptSearch(confirm=confirm, screen=cheap if screen else None, budget=budget, screen_queries=16,
                        confirm_queries=32, order_candidates=6, labels=LABELS, clock=clock, **kw), pool


def test_rungs_halve_the_arms_and_double_the_queries():
    assert rungs_for(16, 64) == [(16, 8), (8, 16), (4, 32), (2, 64)]
    assert rungs_for(2, 64) == [(2, 64)]
    assert rungs_for(1, 64) == [(1, 64)]
    assert rungs_for(5, 40) == [(5, 10), (3, 20), (2, 40)]
    with pytest.raises(ValueError, match="arms=0"):
        rungs_for(0, 64)


def test_plan_fits_the_budget_and_gives_the_screen_what_is_left():
    plan = plan_search(120.0, screen_per_prompt=0.1, prefix=0.5, per_query=0.05, confirm_queries=64,
                       order_candidates=8)
    assert sum(plan.seconds.values()) <= 120.0 + 1e-9
    assert plan.seconds["confirm"] == pytest.approx(rungs_seconds(plan.rungs, 0.5, 0.05))
    assert plan.seconds["confirm"] <= 0.35 * 120 and plan.arms >= 2
    assert plan.screened == int(plan.seconds["screen"] // 0.1)
    without = plan_search(120.0, screen_per_prompt=None, prefix=0.5, per_query=0.05, confirm_queries=64,
                          order_candidates=8)
    assert without.screened == 0 and without.arms >= plan.arms  # the screen's share goes to the confirmation
    with pytest.raises(ValueError, match="budget=0"):
        plan_search(0, screen_per_prompt=None, prefix=1, per_query=1, confirm_queries=4, order_candidates=2)


def test_balanced_order_balances_every_prefix():
    val = validation_of(24)
    order = balanced_order(val, LABELS)
    assert sorted(order) == list(range(24))
    for m in range(2, 25, 2):
        counts = Counter(val[i].target for i in order[:m])
        assert counts["pos"] == counts["neg"]
    assert balanced_order(val, ()) == list(range(24))


@pytest.mark.parametrize("budget", [20.0, 60.0, 180.0])
@pytest.mark.parametrize("screen", [True, False])
def test_the_search_keeps_to_its_budget(budget, screen):
    search, pool = make_search(budget, screen=screen)
    selection = search.select(pool, validation_of(40), 10, np.random.default_rng(0))
    wall = selection.details["wall_seconds"]
    assert wall <= 1.1 * budget, (wall, budget, selection.details["phases"])
    assert len(selection.indices) == 10 and len(set(selection.indices)) == 10


@dataclass
class SlowedAfter(Planted):
    """:class:`Planted` whose calls take ``factor`` times as long after its first ``after`` calls: a
    machine that slows once the pilot has timed it (another job on the cores)."""

    after: int = 2
    factor: float = 1.5

    def evaluate(self, pool, validation, subsets):
        self.calls = getattr(self, "calls", 0) + 1
        before = self.clock.t
        out = super().evaluate(pool, validation, subsets)
        if self.calls > self.after:
            self.clock.t = before + self.factor * (self.clock.t - before)
        return out


@pytest.mark.parametrize(("factor", "where"), [(2.0, "before rung 4"), (3.0, "within rung 1")])
def test_a_machine_slowed_after_the_pilot_stops_the_confirmation_within_the_budget(factor, where):
    """The pilot (two confirm calls) runs at full speed, every later call ``factor`` times slower: the
    confirmation stops before a rung, or within one, that would end past the budget, and says so."""
    budget, pool = 60.0, pool_of(40)
    labels = [e.target for e in pool]

    def run(slow: float):
        clock = Clock()
        confirm = SlowedAfter(frozenset(range(6)), labels, clock, seed=0, factor=slow)
        search = PromptSearch(confirm=confirm, screen=None, budget=budget, screen_queries=16, confirm_queries=32,
                              order_candidates=6, labels=LABELS, clock=clock)
        return search.select(pool, validation_of(40), 10, np.random.default_rng(0)).details

    steady, slowed = run(1.0), run(factor)
    assert steady["stopped"] is None and steady["slower_than_pilot"] == pytest.approx(1.0)
    assert slowed["wall_seconds"] <= 1.02 * budget, (slowed["wall_seconds"], slowed["phases"])
    assert where in slowed["stopped"] and f"ran {factor:.2f}x the pilot's time" in slowed["stopped"]
    assert len(slowed["rungs"]) < len(steady["rungs"])  # it gave up the last rungs, not the budget
    assert slowed["confirm_queries"] == slowed["rungs"][-1]["queries"]
    assert slowed["slower_than_pilot"] == pytest.approx(factor)


def test_the_search_finds_planted_demonstrations_and_beats_random_prompts():
    """Six planted members lower a prompt's loss by one each; a random 10-prompt from 40 holds 1.5
    of them on average. The search's pick must hold far more, and end with differing last labels."""
    held = []
    for seed in range(3):
        search, pool = make_search(120.0, seed=seed)
        selection = search.select(pool, validation_of(40), 10, np.random.default_rng(seed))
        held.append(sum(i < 6 for i in selection.indices))
        labels = [pool[i].target for i in selection.indices]
        assert labels[-1] != labels[-2]  # the order phase removed the planted order penalty
        assert selection.details["screened"] > 50
        assert selection.details["screen_reliability"] is not None
    assert np.mean(held) >= 4, held


def test_a_screen_finds_more_than_random_search_at_equal_time():
    """With an informative cheap screen, screening many prompts beats sending a few random ones
    straight into the confirmation (same budget, same seeds)."""
    screened, unscreened = [], []
    for seed in range(4):
        for screen, out in ((True, screened), (False, unscreened)):
            search, pool = make_search(60.0, screen=screen, seed=seed)
            sel = search.select(pool, validation_of(40), 10, np.random.default_rng(seed))
            out.append(sum(i < 6 for i in sel.indices))
    assert np.mean(screened) > np.mean(unscreened), (screened, unscreened)


def test_same_seed_same_prompt_and_seeds_are_screened():
    a, pool = make_search(60.0, seeds={"mine": list(range(10))})
    b, _ = make_search(60.0, seeds={"mine": list(range(10))})
    sa = a.select(pool, validation_of(40), 10, np.random.default_rng(3))
    sb = b.select(pool, validation_of(40), 10, np.random.default_rng(3))
    assert sa.indices == sb.indices
    assert sa.details["sources"].get("seed") == 1


def test_bad_input_is_refused_with_the_numbers():
    search, pool = make_search(60.0)
    with pytest.raises(ValueError, match="needs 32 validation queries"):
        search.select(pool, validation_of(10), 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="budget=-1"):
        make_search(-1.0)


def planted_runs(gains: dict[str, float], n: int = 200, seeds=(0, 1, 2), budget: float = 6.0) -> list[dict]:
    """(task, seed) runs of every arm; an arm of gain g answers (0.6 + g) n of n test examples right,
    the first ones, so its answers nest inside the better arms'."""
    runs = []
    for task in ("rotten_tomatoes", "cr"):
        for seed in seeds:
            for arm, gain in gains.items():
                right = round((0.6 + gain) * n)
                runs.append({"budget": budget, "task": task, "seed": seed, "arm": arm,
                             "test_accuracy": right / n, "correct": [1] * right + [0] * (n - right),
                             "wall_seconds": 60 * budget})
    return runs


def test_the_equal_time_rule_takes_the_best_arm_only_when_it_is_shown_better_than_no_screen():
    from icl_ssm_bench.search import search_markdown, summarize

    clear = summarize(planted_runs({"compressed": 0.10, "control": 0.02, "none": 0.0, "dense": 0.05}))
    assert clear["decision"]["default_screen"] == "compressed"
    table = clear["budgets"]["6.0"]
    assert table["compressed"]["vs_cheapest"]["mean"] == pytest.approx(0.10)
    assert table["compressed"]["vs_cheapest"]["ci95"][0] > 0 and "vs_cheapest" not in table["none"]
    close = summarize(planted_runs({"compressed": 0.005, "none": 0.0}, n=40)
                      + [{**r, "correct": r["correct"][::-1]} for r in planted_runs({"compressed": 0.0}, n=40,
                                                                                       seeds=(7,))])
    assert close["decision"]["default_screen"] == "none" and "containing 0" in close["decision"]["why"]
    assert "| 6.0 | compressed |" in search_markdown(clear) and "**compressed**" in search_markdown(clear)


def test_a_short_budget_cuts_the_queries_and_the_order_search_and_says_when_it_cannot_fit():
    plan = plan_search(60.0, screen_per_prompt=6.7, prefix=7.7, per_query=0.3, confirm_queries=64,
                       order_candidates=8)  # the seconds of a k = 20 prompt on one CPU thread
    assert plan.queries < 64 and plan.orders == 0 and not plan.over
    assert plan.seconds["confirm"] <= 0.35 * 60
    tight = plan_search(20.0, screen_per_prompt=6.7, prefix=7.7, per_query=0.3, confirm_queries=64,
                        order_candidates=8)
    assert tight.over and tight.queries == 8 and tight.arms == 2
    assert "will run over its budget" in plan_lines(tight, 20.0, "compressed")[-1]
    assert "no order search" in plan_lines(tight, 20.0, "compressed")[0]


def test_the_equal_time_bench_takes_a_compressor_per_task_and_refuses_one_it_cannot_use(tmp_path):
    from icl_ssm_bench.search import arm_compressors

    (tmp_path / "G").mkdir()
    (tmp_path / "G" / "config.json").write_text('{"model_type": "icl_ssm_compressor"}')
    (tmp_path / "G" / "model.safetensors").write_bytes(b"")
    given = arm_compressors(["rotten_tomatoes", "cr"], {"cr": str(tmp_path / "G")}, {})
    assert given == {"cr": {"compressed": str(tmp_path / "G")}}
    with pytest.raises(ValueError, match=r"--control mmlu=.*not among --tasks"):
        arm_compressors(["cr"], {}, {"mmlu": str(tmp_path / "G")})
    with pytest.raises(ValueError, match=r"--compressor cr=.*not a compressor directory"):
        arm_compressors(["cr"], {"cr": str(tmp_path)}, {})


@dataclass
class Leaning(SubsetEvaluator):
    """Label scores where every planted member a prompt holds adds signal (0.5 of margin towards
    the gold label) and a larger lean (1.5 towards 'pos'): raw, the planted members look harmful;
    with the lean removed (batch calibration), they are what helps."""

    good: frozenset
    clock: Clock
    seed: int = 0

    def evaluate(self, pool, validation, subsets):
        rng = np.random.default_rng(self.seed + len(subsets))
        gold = np.array([LABELS.index(q.target) for q in validation])
        scores = []
        for s in subsets:
            g = sum(i in self.good for i in s)
            margin = (2 * gold - 1) * (0.3 + 0.5 * g) + 1.5 * g + 0.2 * rng.normal(size=len(gold))
            scores.append(np.stack([np.zeros_like(margin), margin], axis=1))
        scores = np.array(scores)  # (M, Q, 2)
        logp = scores - np.logaddexp(scores[..., :1], scores[..., 1:])
        per_query = -np.take_along_axis(logp, gold[None, :, None].repeat(len(subsets), 0), -1)[..., 0]
        self.clock.t += len(subsets) * (0.2 + 0.02 * len(gold))
        return SubsetLosses(per_query.mean(1), Cost(0, 0.0), 0, per_query, None, scores)


def test_search_calibrations_score_each_prompt_as_it_will_answer_and_hand_over_the_best_pair():
    pool = pool_of(40)
    good = frozenset(range(10))
    found = {}
    for calibrations in ((), ("none", "batch")):
        clock = Clock()
        search = PromptSearch(confirm=Leaning(good, clock), budget=60.0, screen_queries=16, confirm_queries=32,
                              order_candidates=4, labels=LABELS, clock=clock, calibrations=calibrations)
        sel = search.select(pool, validation_of(64), 6, np.random.default_rng(0))
        found[calibrations] = (sum(i in good for i in sel.indices), sel.details)
    raw_good, raw = found[()]
    cal_good, cal = found[("none", "batch")]
    assert raw["calibration"] is None and raw_good <= 1  # raw losses shun the planted members
    assert cal["calibration"] == "batch" and cal_good >= 3
    assert set(cal["calibration_losses"]) == {"none", "batch"}
    assert cal["calibration_losses"]["batch"] < cal["calibration_losses"]["none"]
    with pytest.raises(ValueError, match="search calibrations \\['fitted'\\]; accepted: none, batch"):
        PromptSearch(confirm=Leaning(good, Clock()), labels=LABELS, calibrations=("fitted",))

"""The pre-registered rule of ``icl-ssm bench calibrate`` on planted runs: the cheapest arm not
shown worse than the best is run's default, and the cost target compares it with raw search."""

import numpy as np
from icl_ssm_bench.calibrate_equal_time import decide


def runs(arm, budget, accuracy, wall, n=400, seeds=(0, 1, 2)):
    out = []
    for seed in seeds:
        rng = np.random.default_rng([seed, int(1000 * accuracy)])
        correct = (rng.random(n) < accuracy).astype(int).tolist()
        out.append({"arm": arm, "budget": budget, "task": "t", "seed": seed, "correct": correct,
                    "raw_correct": correct, "test_accuracy": float(np.mean(correct)),
                    "raw_test_accuracy": float(np.mean(correct)), "wall_seconds": wall})
    return out


def test_the_cheapest_arm_not_shown_worse_than_the_best_is_chosen():
    planted = (runs("raw-search", 2.0, 0.70, 120) + runs("calibrated-search", 2.0, 0.82, 120)
               + runs("calibrated-random", None, 0.81, 20) + runs("calibrated-zero-shot", None, 0.60, 8))
    summary = decide(planted)
    d = summary["decision"]
    assert d["best"] == "calibrated-search 2 min" and d["default"] == "calibrated-random"
    assert summary["arms"]["calibrated-zero-shot"]["vs_best"]["ci95"][1] < 0  # shown worse: passed over
    assert d["cost_target"]["raw_search"] == "raw-search 2 min" and d["cost_target"]["met"]


def test_the_best_is_kept_when_every_cheaper_arm_is_shown_worse_and_the_cost_target_can_fail():
    planted = runs("raw-search", 2.0, 0.85, 120) + runs("calibrated-random", None, 0.65, 20)
    d = decide(planted)["decision"]
    assert d["default"] == "raw-search 2 min" and not d["cost_target"]["met"]
    assert d["cost_target"]["wall_ratio"] == 1.0

"""The readers of the trust runs and of the records behind the trust targets (tools/claim_tables/readers/), on
small hand-made records: what each reader computes, and the intervals it names."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from claim_tables.adapt import as_record  # noqa: E402
from claim_tables.readers.trust_search import (  # noqa: E402
    budget_ratio,
    counts,
    evaluation,
    gains,
    headroom,
    placed,
    retrieval_tie,
    shown_worse_runs,
)
from claim_tables.readers.trust_targets import equal_time  # noqa: E402

PROV = {"command": "c", "commit": "abc", "machine": "m", "date": "d", "torch": "t", "transformers": "x"}


def _right(n, of=10):
    return {"correct": [1] * n + [0] * (of - n)}


def _run(task, seed, handed, vs, *, commit="a" * 40, threads=2, wall=110.0):
    """A trust-search run: 4 plain prompts (4, 5, 6, 9 correct of 10), 2 balanced (5, 8), topk 7, bm25 6."""
    answers = {"handed-over": _right(handed), "plain-0": _right(4), "plain-1": _right(5), "plain-2": _right(6),
               "plain-3": _right(9), "balanced-0": _right(5), "balanced-1": _right(8), "topk": _right(7),
               "bm25": _right(6)}
    return {"task": task, "seed": seed, "test_size": 10, "handed_over": "search", "handed_test_accuracy": handed / 10,
            "zero_shot_test_accuracy": 0.5, "retrieval": {"topk": 0.7, "bm25": 0.6},
            "plain": {"median": 0.55, "vs_median_prompt": vs, "shown_better": vs["ci95"][0] > 0},
            "balanced": {"median": 0.65, "shown_better": False},
            "search": {"wall_seconds": wall, "budget_seconds": 100.0},
            "prompts_on_test": answers,
            "environment": {"commit": commit, "machine": f"x86_64, {threads} torch threads, cpu"}}


def test_a_trust_run_is_placed_in_correct_answers_with_its_paired_interval_over_test_examples():
    r = as_record("trust-search/cr-s5.json", _run("cr", 5, 7, {"mean": 0.15, "ci95": [0.05, 0.25], "n": 10}))
    assert (r["plain_at_or_above"].value, r["plain_count"].value) == (3, 4)  # 7 >= 4, 5, 6; not 9
    assert (r["balanced_at_or_above"].value, r["balanced_count"].value) == (1, 2)
    assert r["at_or_above_retrieval"].value == 1 and r["retrieval_tie"].value == 1  # 7 = topk's 7: a tie, at
    assert r["retrieval_best"].value == 0.7 and r["handed"].value == 0.7 and r["handed"].n == 10
    vs = r["plain_vs_median"]
    assert vs.interval == (0.05, 0.25) and vs.resamples == "test examples" and vs.n == 10
    assert r["plain_shown_better"].value == 1 and r["plain_shown_worse"].value == 0
    assert r["balanced_vs_median"].value is None  # the record has no balanced paired difference
    assert r["oracle"].value == 0.9 and r["oracle_median"].value == 0.55
    assert r["captured"].value == pytest.approx((7 - 5.5) / (9 - 5.5))
    assert r["budget_ratio"].value == pytest.approx(1.1)
    assert r.config["task"] == "cr" and r.config["seed"] == 5


def test_the_trust_evaluation_counts_runs_summarises_gains_and_names_the_runs_shown_worse():
    runs = [as_record("trust-search/cr-s5.json", _run("cr", 5, 9, {"mean": 0.2, "ci95": [0.1, 0.3]})),
            as_record("trust-search/cr-s6.json", _run("cr", 6, 6, {"mean": 0.1, "ci95": [-0.01, 0.2]}, wall=130.0)),
            as_record("trust-search/coin_flip-s5.json",
                      _run("coin_flip", 5, 3, {"mean": -0.2, "ci95": [-0.3, -0.1]}, commit="b" * 40, threads=1))]
    e = evaluation(runs)
    assert e["runs"].value == 3 and e["at_or_above_three_quarters"].value == 2  # 9 and 6 correct: 4 and 3 of 4
    assert e["at_or_above_retrieval"].value == 1 and e["ties"].value == 0
    assert (e["shown_better_rt_cr"].value, e["runs_rt_cr"].value, e["shown_worse"].value) == (1, 2, 1)
    assert e["gain_mean"].value == pytest.approx(0.15) and e["gain_mean"].n == 2  # coin_flip left out
    assert e["gain.cr"].value == pytest.approx(0.15) and e.config["gain_low_run"] == "cr seed 6"
    assert e["budget_ratio_max"].value == pytest.approx(1.3) and e["timed"].value == 3
    shares = sorted([(9 - 5.5) / 3.5, (6 - 5.5) / 3.5, (3 - 5.5) / 3.5])
    assert e["captured_median"].value == pytest.approx(shares[1]) and e["captured_median"].n == 3
    assert e.config["worse"] == [["coin_flip", 5]] and e["worse.coin_flip-s5"].interval == (-0.3, -0.1)
    assert e.config["made_by"]["coin_flip-s5"]["commits"] == ["bbbbbbb"]
    assert e.config["made_by"]["cr-s5"]["threads"] == [2]


def _records(runs):
    """Stored trust runs read as records, each named by its task and seed."""
    return [as_record(f"trust-search/{r.get('task')}-s{r.get('seed')}.json", r) for r in runs]


def test_runs_without_answers_are_counted_by_the_places_they_store():
    runs = [{"task": "cr", "plain": {"at_or_above": 8, "count": 16, "shown_better": False}},
            {"task": "rotten_tomatoes", "plain": {"at_or_above": 12, "count": 16, "shown_better": True},
             "at_or_above_retrieval": True},
            {"task": "coin_flip", "plain": {"at_or_above": 7, "count": 16, "shown_better": True}}]
    assert counts(_records(runs)) == {"runs": 3, "at_or_above_median": 2, "at_or_above_three_quarters": 1,
                                      "at_or_above_three_quarters_balanced": 0, "at_or_above_retrieval": 1,
                                      "shown_better": 2, "shown_better_rt_cr": 1,
                                      "runs_balanced": 0, "shown_better_balanced_rt_cr": 0, "runs_rt_cr": 2}


def test_trust_places_count_correct_answers_so_a_tie_is_at():
    """A record's float32 accuracies can put a tie below; the stored answers cannot."""
    right = lambda n: {"correct": [1] * n + [0] * (400 - n)}  # noqa: E731
    run = {"plain": {"at_or_above": 0, "count": 2}, "at_or_above_retrieval": False,
           "prompts_on_test": {"handed-over": right(314), "plain-0": right(314), "plain-1": right(315),
                               "balanced-0": right(100), "topk": right(314), "bm25": right(200)}}
    assert placed(run) == {"plain": 1, "plain_count": 2, "balanced": 1, "balanced_count": 1, "retrieval": True}
    assert retrieval_tie(run)  # 314 = 314 with topk: counted as at, and said to be a tie
    run["prompts_on_test"]["topk"] = right(313)
    assert placed(run)["retrieval"] and not retrieval_tie(run)


def test_the_budget_ratio_is_the_search_wall_time_over_its_budget():
    assert budget_ratio({"search": {"wall_seconds": 121.0, "budget_seconds": 120.0}}) == pytest.approx(121 / 120)
    assert budget_ratio({"search": {}}) is None


def test_headroom_is_the_share_of_the_median_to_oracle_gap_in_correct_answers():
    right = lambda n: {"correct": [1] * n + [0] * (100 - n)}  # noqa: E731
    run = {"prompts_on_test": {"handed-over": right(70), "plain-0": right(50), "plain-1": right(60),
                               "plain-2": right(90), "balanced-0": right(99)}}
    assert headroom(run) == {"oracle": 0.9, "median": 0.6, "captured": pytest.approx(1 / 3)}
    run["prompts_on_test"] = {"handed-over": right(70), "plain-0": right(60), "plain-1": right(60)}
    assert headroom(run)["captured"] is None  # no gap, no share
    assert headroom({"plain": {}}) is None  # a record without answers


def test_gains_over_the_median_prompt_average_the_rotten_tomatoes_and_cr_runs_only():
    gain = lambda task, seed, g: {"task": task, "seed": seed, "plain": {"vs_median_prompt": {"mean": g}}}  # noqa: E731
    runs = _records([gain("cr", 5, 0.2), gain("cr", 6, 0.1), gain("rotten_tomatoes", 5, 0.03),
                     gain("coin_flip", 5, -0.5),
                     {"task": "cr", "seed": 7, "plain": {}}])  # coin_flip and a run without the paired difference
    assert gains(runs) == {"mean": pytest.approx(0.11), "n": 3,
                           "tasks": {"cr": pytest.approx(0.15), "rotten_tomatoes": 0.03},
                           "low": 0.03, "low_run": "rotten_tomatoes seed 5", "high": 0.2}
    assert gains(runs[3:]) is None


def test_a_run_is_shown_worse_only_when_its_paired_interval_lies_below_zero():
    run = lambda seed, lo, hi: {"task": "coin_flip", "seed": seed,  # noqa: E731
                                "plain": {"vs_median_prompt": {"mean": (lo + hi) / 2, "ci95": [lo, hi]}}}
    runs = [run(5, -0.19, -0.01), run(6, -0.05, 0.0), run(7, 0.01, 0.2), {"task": "cr", "seed": 5, "plain": {}}]
    assert shown_worse_runs(_records(runs)) == [("coin_flip", 5, pytest.approx(-0.1))]  # an upper end of 0 is not


def test_prompt_correctness_gives_the_spearmans_and_the_spread_of_test_accuracies():
    prompts = [{"test_accuracy": x} for x in (0.5, 0.8, 0.6, 0.7)]
    r = as_record("prompt-correctness-x.json", {"prompts": prompts, "test_size": 150, "k": 20, "seed": 0,
                                                "spearman_validation_loss_vs_test": 0.85,
                                                "spearman_validation_accuracy_vs_test": 0.7, "provenance": PROV})
    assert r["prompts"].value == 4 and r["spearman_loss"].value == 0.85 and r["spearman_loss"].n == 4
    assert (r["test_min"].value, r["test_median"].value, r["test_max"].value) == (0.5, pytest.approx(0.65), 0.8)
    assert r.config["k"] == 20


def test_the_handover_simulation_gives_rates_over_draws_and_the_widest_half_width_it_quotes():
    row = lambda n, m, equal, better: {"check_size": n, "random_prompts": m, "draws": 100,  # noqa: E731
                                       "equal_new_rate": equal, "equal_old_rate": 0.1, "better_new_rate": better,
                                       "better_old_rate": 0.2}
    rows = [row(64, 8, 0.02, 0.1), row(128, 8, 0.03, 0.5), row(128, 16, 0.01, 0.9), row(256, 8, 0.04, 0.7)]
    r = as_record("handover-simulation-x.json", {"rows": rows, "provenance": PROV})
    assert r.config["default_cell"] == "128x8" and r.config["larger_cells"] == ["256x8"]
    assert (r["equal_new_min"].value, r["equal_new_max"].value) == (0.01, 0.04) and r["equal_new_min"].n == 100
    assert r["128x16.better_new_rate"].value == 0.9  # stored, though not quoted
    assert r["half_width"].value == pytest.approx(1.96 * (0.5 * 0.5 / 100) ** 0.5)  # 0.5 at the default, widest


def test_the_verdict_simulation_gives_each_scenarios_lowest_failure_and_old_pass_rates():
    rows = [{"scenario": s, "subsets": 30, "queries": q, "draws": 50, "new_pass_rate": new, "old_pass_rate": old}
            for s, q, new, old in (("a", 4, 0.0, 1.0), ("a", 8, 0.1, 0.9), ("c", 4, 0.4, 1.0), ("c", 8, 0.9, 1.0))]
    r = as_record("verdict-simulation-x.json", {"rows": rows, "sizes": ["30x4", "30x8"], "draws": 50,
                                                "scenarios": {"a": "constant", "c": "close"}, "provenance": PROV})
    assert r["a.fails_min"].value == pytest.approx(0.9) and r["a.old_pass_min"].value == 0.9
    assert r["c.30x8.new_pass_rate"].value == 0.9 and r["c.30x8.new_pass_rate"].n == 50


def _search(task, minutes, none, compressed, seeds=(0, 1), compressors=None):
    vs = {"mean": compressed - none, "ci95": [-0.1, 0.1], "resampled": "rows and columns", "n": len(seeds)}
    arms = {"none": {"mean": none, "runs": len(seeds), "wall_max_over_budget": 0.9},
            "compressed": {"mean": compressed, "runs": len(seeds), "wall_max_over_budget": 1.02, "vs_cheapest": vs}}
    raw = {"runs": [{"task": task, "seed": s, "correct": [1, 0, 1]} for s in seeds],
           "summary": {"budgets": {str(float(minutes)): arms}}, "provenance": PROV}
    return raw | ({"compressors": compressors} if compressors else {})


def test_the_equal_time_search_joins_the_pooled_decision_with_its_per_task_records():
    made = {"compressed": {"distill_seconds": {"teacher": 100, "training": 200}},
            "control": {"distill_seconds": {"teacher": 0, "training": 150}}}
    parts = [as_record("search-equal-time-cr-2min.json", _search("cr", 2, 0.7, 0.72, compressors=made)),
             as_record("search-equal-time-rotten_tomatoes-2min.json", _search("rotten_tomatoes", 2, 0.8, 0.79))]
    pooled_raw = _search("both", 2, 0.75, 0.755, seeds=(0, 1, 2, 3)) | {
        "records": [p.name for p in parts], "runs": 4,
        "summary": {**_search("both", 2, 0.75, 0.755, seeds=(0, 1, 2, 3))["summary"],
                    "decision": {"default_screen": "none", "why": "an interval containing 0"}}}
    pooled = as_record("search-equal-time.json", pooled_raw)
    j = equal_time(pooled, parts)
    assert j.config["tasks"] == ["rotten_tomatoes", "cr"] and j.config["minutes"] == ["2"]
    assert j["2.compressed.vs_none"].resamples == "(task, seed) runs and test examples"
    assert j["2.compressed.vs_none"].interval == (-0.1, 0.1) and j["2.none.runs"].value == 4
    assert j["cr.2.compressed.mean"].value == 0.72 and j["cr.distill.compressed"].value == 300
    assert j["wall_max"].value == 1.02 and j.config["distilled"] == ["cr"] and j.config["test_size"] == 3
    with pytest.raises(ValueError, match="search-equal-time.json pools 4 runs; the records it names hold 2"):
        equal_time(pooled, parts[:1])


def test_a_budget_record_gives_its_reliabilities_and_the_subsets_spearman_brown_asks_for():
    raw = {"reliability": 0.81, "score_reliability": 0.5, "subsets": 100, "queries_used": 32, "wall_seconds": 300.0,
           "k": 20, "budget": {"budget_seconds": 600.0, "target": 0.8}, "provenance": PROV}
    r = as_record("budget10-x.json", raw)
    assert r["reliability"].value == 0.81 and r["reliability"].n == 100 and r.config["target"] == 0.8
    assert r["subsets_to_target"].value == pytest.approx(400)  # 0.8 * 0.5 / (0.5 * 0.2) = 4 times the subsets
    assert r["seconds_to_target"].value == pytest.approx(1200)
    assert as_record("budget3-x.json", raw | {"score_reliability": 0.0})["subsets_to_target"].value is None


def test_the_select_cost_wall_record_gives_the_flop_saving_over_the_wall_saving():
    rows = [{"k": 8, "evaluator": e, "flops_vs_compressed": f, "seconds_vs_compressed": s}
            for e, f, s in (("compressed", 1.0, 1.0), ("dense", 3.0, 2.0), ("dense-packed", 4.0, 2.5))]
    r = as_record("select-cost-wall-x.json", {"rows": rows, "queries": 8, "subsets": 2, "provenance": PROV})
    assert r.config["ks"] == [8] and r["8.dense.apart"].value == pytest.approx(1.5)
    assert r["8.dense-packed.apart"].value == pytest.approx(1.6)

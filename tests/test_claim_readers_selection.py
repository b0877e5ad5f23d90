"""The selection and demo records read as records (tools/claim_tables/readers/selection.py, readers/demo.py)."""

import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from claim_tables.adapt import as_record  # noqa: E402
from claim_tables.readers.demo import newest_runs  # noqa: E402
from claim_tables.readers.selection import paired_sets, pooled_estimators, reliability_growth  # noqa: E402

MADE = {"commit": "abc1234", "date": "2026-11-25", "machine": "2-core CPU"}


def _order_row(report, method, seed, order, acc):
    return {"report": report, "method": method, "seed": seed, "order": order, "test_accuracy": acc}


def _select_order():
    rows = [_order_row("sq", "topk", 0, "random", 0.6), _order_row("sq", "topk", 0, "random", 0.8),
            _order_row("sq", "topk", 1, "random", 0.5), _order_row("sq", "topk", 1, "random", 0.7),
            _order_row("sq", "random", 0, "random", 0.4), _order_row("sq", "random", 0, "random", 0.5),
            _order_row("sq", "topk", 0, "interleave", 0.9), _order_row("sq", "topk", 1, "interleave", 0.7),
            _order_row("sq-pl", "topk", 0, "random", 0.9), _order_row("sq-pl", "topk", 0, "random", 0.7),
            _order_row("sq-pl", "topk", 1, "random", 0.6), _order_row("sq-pl", "topk", 1, "random", 0.6),
            _order_row("sq-pl", "random", 0, "random", 0.5), _order_row("sq-pl", "random", 0, "random", 0.5)]
    return {"rows": rows, "permutations": 2, "provenance": {**MADE, "test_examples": 150}}


def test_select_order_reads_each_set_averaged_over_its_random_orders_and_the_seeds_per_report():
    record = as_record("select-order-perm2-k20-x.json", _select_order())
    sq = record.part("sq")
    assert sq["topk.seed0.averaged"].value == pytest.approx(0.7) and sq["topk.seed0.averaged"].n == 2
    assert sq["topk.averaged"].value == pytest.approx(0.65) and sq["topk.averaged"].n == 2
    assert sq["topk.averaged_sd"].value == pytest.approx(statistics.stdev([0.7, 0.6]))
    assert sq["random.averaged_sd"].value == 0.0  # one seed
    assert sq["topk.interleave"].value == pytest.approx(0.8) and sq["topk.seed1.interleave"].value == 0.7
    assert (sq["averaged_low"].value, sq["averaged_high"].value) == (pytest.approx(0.45), pytest.approx(0.65))
    assert sq["sets"].value == 3 and sq["anova_p"].n == 3 and 0 < sq["anova_p"].value < 1
    assert record.config["sets"]["sq"] == [["topk", 0], ["topk", 1], ["random", 0]]
    assert record.config["seeds"] == [0, 1] and record.config["test_examples"] == 150


def test_paired_sets_pairs_two_reports_set_by_set():
    record = as_record("select-order-perm2-k20-x.json", _select_order())
    pair = paired_sets(record.part("sq"), record.part("sq-pl"))
    # per-label minus plain: topk seed 0 +0.1, topk seed 1 0, random seed 0 +0.05
    assert pair["minus"].value == pytest.approx(0.05) and pair["minus"].n == 3
    assert pair["seed0.minus"].value == pytest.approx(0.075) and pair["seed1.minus"].value == pytest.approx(0.0)
    assert 0 < pair["minus_p"].value < 1
    assert pair.config["methods"] == ["topk", "random"] and pair.config["seeds"] == [0, 1]


def test_order_search_reads_the_gain_of_the_chosen_order_over_the_mean_random_one():
    def result(method, seed, chosen, accs):
        return {"method": method, "seed": seed, "chosen": chosen,
                "candidates": [{"order": "score" if i == 0 else "random", "test_accuracy": a}
                               for i, a in enumerate(accs)]}
    raw = {"queries": 32, "candidates": 3, "provenance": MADE,
           "results": [result("topk", 1, 0, [0.9, 0.6, 0.8]), result("topk", 0, 1, [0.5, 0.7, 0.4]),
                       result("random", 0, 0, [0.55, 0.7, 0.5])]}
    record = as_record("order-search-k20-x.json", raw)
    assert record["topk.seed1.gain"].value == pytest.approx(0.2) and record["topk.seed1.gain"].n == 2
    assert record["random.seed0.gain"].value == pytest.approx(-0.05)
    assert record["gain"].value == pytest.approx(0.3 / 3) and record["gain"].n == 3
    assert record["sets_better"].value == 2
    assert record["topk.searched"].value == pytest.approx(0.8) and record["topk.searched_sd"].n == 2
    assert record.config["sets"] == [["topk", 1], ["topk", 0], ["random", 0]]


def test_order_evaluators_pair_each_evaluators_choice_with_the_dense_one():
    rows = [{"test_accuracy": [0.5, 0.6, 0.7], "chosen": {"dense": 2, "compressed": 1}},
            {"test_accuracy": [0.5, 0.6, 0.7], "chosen": {"dense": 0, "compressed": 2}},
            {"test_accuracy": [0.5, 0.6, 0.7], "chosen": {"dense": 1, "compressed": 1}}]
    summary = {"sets": 3, "dense": {"minus_mean_random_order": 0.05, "same_choice_as_dense": 3},
               "compressed": {"minus_mean_random_order": 0.02, "same_choice_as_dense": 1,
                              "mean_spearman_with_dense": 0.4}}
    record = as_record("order-evaluators-k20-x.json", {"queries": 32, "rows": rows, "summary": summary,
                                                         "provenance": MADE})
    assert record["compressed.minus_dense"].value == pytest.approx(0.1 / 3) and record["compressed.minus_dense"].n == 3
    assert record["compressed.better_than_dense"].value == 1 and record["compressed.worse_than_dense"].value == 1
    assert record["compressed.spearman_with_dense"].value == 0.4 and "dense.minus_dense" not in record.metrics
    assert record.config["candidates"] == 3


def test_headroom_k20_reads_each_task_and_k50_reliability_grows_by_spearman_brown():
    task = {"sets": 30, "queries": 177, "mean": 0.23, "std": 0.01, "min": 0.2, "max": 0.28, "best_minus_mean": 0.05}
    room = as_record("headroom-k20-mmlu.json", {"k": 20, "test_size": 200, "tasks": {"mmlu": task},
                                                "provenance": MADE})
    assert room["mmlu.best_minus_mean"].value == 0.05 and room["mmlu.best_minus_mean"].n == 30
    assert room["mmlu.queries"].value == 177 and room["mmlu.test_size"].value == 200
    assert room.config["tasks"] == ["mmlu"] and room.config["k"] == 20

    def k50(queries, splits):
        return {"k": 50, "settings": {"queries": queries, "subsets": 40}, "provenance": MADE, "runs": [],
                "agreement": [{"seed": s, "dense_split_half": v} for s, v in splits.items()]}
    fewer = as_record("select-k50-q32-x.json", k50(32, {0: 0.4, 1: 0.6, 2: None}))
    assert (fewer["dense_split_half_low"].value, fewer["dense_split_half_high"].value) == (0.4, 0.6)
    assert fewer["dense_split_half_low"].n == 2 and fewer.config["split_half_seeds"] == [0, 1]
    grown = reliability_growth(fewer, as_record("select-k50-q96-x.json", k50(96, {0: 0.65})))
    assert grown["predicted"].value == pytest.approx(3 * 0.4 / (1 + 2 * 0.4))
    assert grown["more.seed0.dense_split_half"].value == 0.65 and grown.config["sources"]["fewer"]["queries"] == 32


def test_pooled_estimators_lets_a_later_record_replace_a_seed_and_budget():
    def rows(cells):
        return [{"seed": s, "subsets": b, "estimator": e, "test_accuracy": a} for (s, b, e), a in cells.items()]
    first = as_record("estimators-a.json", {"rows": rows({(0, 30, "mean"): 0.6, (0, 30, "ridge"): 0.7,
                                                          (1, 30, "mean"): 0.6, (1, 30, "ridge"): 0.5}),
                                            "settings": {"test_size": 150}, "provenance": MADE})
    assert first["seed0.budget30.ridge"].value == 0.7 and first["seed0.budget30.ridge"].n == 150
    later = as_record("estimators-b.json", {"rows": rows({(1, 30, "mean"): 0.5, (1, 30, "ridge"): 0.8}),
                                            "provenance": MADE})
    pooled = pooled_estimators([first, later])
    assert pooled["ridge_minus_mean"].value == pytest.approx(0.2) and pooled["ridge_minus_mean"].n == 2
    assert pooled.config == {"seeds": [0, 1], "budgets": [30]}


def test_select_cost_reads_each_evaluators_flops_against_the_compressed_ones():
    rows = [{"k": 50, "evaluator": "compressed", "flops_per_subset": 2e11, "flops_vs_compressed": 1.0},
            {"k": 50, "evaluator": "dense", "flops_per_subset": 8.8e11, "flops_vs_compressed": 4.4}]
    record = as_record("select-cost-attention.json", {"queries": 16, "subsets": 1, "rows": rows, "provenance": MADE})
    assert record["k50.dense.flops_ratio"].value == 4.4 and record["k50.dense.flops"].value == 8.8e11
    assert record.config["queries"] == 16


def _demo(commit, total, **extra):
    return {"install_seconds": 40.0, "demo_seconds": total - 40.0, "total_seconds": total, "handed_over": "search",
            "handed_test_accuracy": 0.8, "search": {"screen": "none", "budget_seconds": 120.0, "wall_seconds": 100.0},
            "provenance": {**MADE, "commit": commit}, **extra}


def test_demo_cold_reads_the_times_and_what_the_verdict_did_and_the_newest_commits_spread():
    old = as_record("demo-cold-1.json", _demo("a" * 40, 600.0))
    assert old["total_seconds"].value == 600.0 and old["handed_raw"].value is None
    assert old.config["verdict"] == "dense"  # no screen: the verdict failed
    new = [as_record(f"demo-cold-{i}.json", _demo("b" * 40, total, compressor_source="unused",
                                                  calibrated={"test_size": 150}, handed_raw_test_accuracy=0.7))
           for i, total in ((2, 540.0), (3, 570.0))]
    assert new[0].config["verdict"] == "unused" and new[0]["handed"].n == 150
    same = newest_runs([old, *new])
    assert same["runs"].value == 2 and same["stored"].value == 3
    assert (same["total_low"].value, same["total_high"].value) == (9.0, 9.5)
    assert same["spread_seconds"].value == pytest.approx(30.0)
    assert same.config["names"] == ["demo-cold-2.json", "demo-cold-3.json"]


def test_two_cold_runs_compare_each_methods_prompt_and_a_run_without_selections_is_refused():
    from claim_tables.readers.demo import same_selection

    chosen = {"search": [3, 1, 2], "bm25": [4, 5, 6], "zero-shot": []}
    before = as_record("demo-cold-d.json", _demo("a" * 40, 560.0, selections=chosen, handed_indices=[3, 1, 2]))
    after = as_record("demo-cold-e.json", _demo("b" * 40, 580.0, selections={**chosen, "bm25": [4, 6, 5]},
                                                handed_indices=[3, 1, 2]))
    pair = same_selection(before, after)
    assert pair.config["methods"] == ["handed", "search", "bm25", "zero-shot"]
    assert [pair[f"{m}.same"].value for m in pair.config["methods"]] == [1.0, 1.0, 0.0, 1.0]  # order counts
    assert pair["zero-shot.size"].value == 0 and pair.config["before"] == "a" * 40
    with pytest.raises(ValueError, match="stores no selections"):
        same_selection(as_record("demo-cold-c.json", _demo("c" * 40, 500.0)), after)

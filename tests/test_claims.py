"""The published tables are rendered from their records: tools/claims.py."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import research_script

claims = research_script("claims", folder="tools")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def copy(tmp_path):
    """The markdown files with generated tables and the records, copied under a temporary root."""
    shutil.copytree(ROOT / claims.RESULTS, tmp_path / claims.RESULTS)
    for file in {f for f, _ in claims.TABLES.values()}:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / file, tmp_path / file)
    return tmp_path


def test_committed_tables_match_their_records():
    assert claims.check(ROOT) == []


def test_a_number_changed_in_a_table_fails_naming_the_number_and_record(copy):
    page = copy / "docs" / "results.md"
    text = page.read_text()
    assert text.count("dense per query: 42.7x more") == 1  # in the generated table 'results' only
    page.write_text(text.replace("dense per query: 42.7x more", "dense per query: 43.7x more"))
    problems = claims.check(copy)
    assert len(problems) == 1
    assert "docs/results.md" in problems[0] and "'results'" in problems[0]
    assert "43.7 where the records give 42.7" in problems[0]
    assert "docs/results/select-cost-attention.json" in problems[0]
    assert claims.main(["--root", str(copy)]) == 1


def test_a_changed_record_fails_until_the_table_is_rendered_again(copy):
    path = copy / claims.RESULTS / "synthetic-products-select-k20.json"
    record = json.loads(path.read_text())
    for row in record["rows"]:  # every seed's top-k pick: the reader averages them
        row["topk"]["mse"] = 0.5
    path.write_text(json.dumps(record))
    problems = claims.check(copy)
    assert problems and "0.767 where the records give 0.500" in problems[0]
    assert claims.check(copy, write=True) == []
    assert claims.check(copy) == []
    assert "topk 0.500" in (copy / "docs" / "results.md").read_text()


@pytest.mark.parametrize("key", claims.PROVENANCE)
def test_a_record_without_its_provenance_fails(copy, key):
    path = copy / claims.RESULTS / "select-cost-attention.json"
    record = json.loads(path.read_text())
    del record["provenance"][key]
    path.write_text(json.dumps(record))
    with pytest.raises(claims.ClaimError, match=f"select-cost-attention.json: provenance lacks {key}"):
        claims.check(copy)
    assert claims.main(["--root", str(copy)]) == 1


def test_missing_markers_are_named(copy):
    page = copy / "docs" / "results.md"
    page.write_text(page.read_text().replace("<!-- /table results -->", ""))
    with pytest.raises(claims.ClaimError, match="docs/results.md: no markers for table 'results'"):
        claims.check(copy)


def test_trust_records_count_runs_at_or_above_the_median():
    runs = [{"task": "cr", "plain": {"at_or_above": 8, "count": 16, "shown_better": False}},
            {"task": "rotten_tomatoes", "plain": {"at_or_above": 12, "count": 16, "shown_better": True},
             "at_or_above_retrieval": True},
            {"task": "coin_flip", "plain": {"at_or_above": 7, "count": 16, "shown_better": True}}]
    assert claims.trust_counts(runs) == {"runs": 3, "at_or_above_median": 2, "at_or_above_three_quarters": 1,
                                         "at_or_above_three_quarters_balanced": 0, "at_or_above_retrieval": 1,
                                         "shown_better": 2, "shown_better_rt_cr": 1,
                                         "runs_balanced": 0, "shown_better_balanced_rt_cr": 0, "runs_rt_cr": 2}


def test_trust_places_count_correct_answers_so_a_tie_is_at():
    """A record's float32 accuracies can put a tie below; the stored answers cannot."""
    right = lambda n: {"correct": [1] * n + [0] * (400 - n)}  # noqa: E731
    run = {"plain": {"at_or_above": 0, "count": 2}, "at_or_above_retrieval": False,
           "prompts_on_test": {"handed-over": right(314), "plain-0": right(314), "plain-1": right(315),
                               "balanced-0": right(100), "topk": right(314), "bm25": right(200)}}
    assert claims.placed(run) == {"plain": 1, "plain_count": 2, "balanced": 1, "balanced_count": 1,
                                  "retrieval": True}
    assert claims.retrieval_tie(run)  # 314 = 314 with topk: counted as at, and said to be a tie
    run["prompts_on_test"]["topk"] = right(313)
    assert claims.placed(run)["retrieval"] and not claims.retrieval_tie(run)


def test_a_trust_target_is_decided_only_when_the_runs_to_come_cannot_change_it():
    assert claims.verdict(12, 12, left=3) == "met"
    assert claims.verdict(10, 12, left=1) == "**not met**"
    assert claims.verdict(10, 12, left=2) == "needs 2 of the 2 runs to come"
    assert claims.verdict(11, 12, left=0) == "**not met**"
    assert claims.budget_ratio({"search": {"wall_seconds": 121.0, "budget_seconds": 120.0}}) == pytest.approx(121 / 120)
    assert claims.budget_ratio({"search": {}}) is None


def test_the_trust_targets_are_counted_over_the_stored_runs_and_decided_at_fifteen(copy):
    """The budget target is met only once 15 runs are stored, all within 1.1x; one run over it fails it."""
    folder = copy / claims.RESULTS / "trust-search"
    stored = sorted(folder.glob("*.json"))

    def budget_row(ratios: dict[Path, float]) -> str:
        for path, ratio in ratios.items():
            record = json.loads(path.read_text())
            record["search"]["wall_seconds"] = ratio * record["search"]["budget_seconds"]
            path.write_text(json.dumps(record))
        claims.check(copy, write=True)
        text = (copy / "BENCHMARKS.md").read_text()
        return next(line for line in text.splitlines() if line.startswith("| pre-registered trust evaluation"))

    row = budget_row({path: 1.0 for path in stored[:-1]} | {stored[-1]: 1.05})
    if len(stored) < 15:  # every stored run within 1.1x: undecided while runs are to come
        assert f"{len(stored)} of 15 runs stored" in row
        assert f"at most 1.05x its budget (so far; {15 - len(stored)} runs undecided)" in row
    for i in range(15 - len(stored)):  # stand-ins for the runs to come: copies of stored runs under new seeds
        record = json.loads(stored[i].read_text())
        record["seed"] = 100 + i
        (folder / f"{record['task']}-s{record['seed']}.json").write_text(json.dumps(record))
    row = budget_row({})
    assert "all 15 runs stored" in row and "runs to come" not in row
    assert "at most 1.05x its budget (met)" in row
    row = budget_row({stored[0]: 1.2})
    assert "at most 1.20x its budget (**not met**)" in row
    text = (copy / "BENCHMARKS.md").read_text()
    assert "Of the 15 runs: at or above 12 of the 16 plain random prompts in" in text


def test_headroom_is_the_share_of_the_median_to_oracle_gap_in_correct_answers():
    right = lambda n: {"correct": [1] * n + [0] * (100 - n)}  # noqa: E731
    run = {"prompts_on_test": {"handed-over": right(70), "plain-0": right(50), "plain-1": right(60),
                               "plain-2": right(90), "balanced-0": right(99)}}
    assert claims.headroom(run) == {"oracle": 0.9, "median": 0.6, "captured": pytest.approx(1 / 3)}
    run["prompts_on_test"] = {"handed-over": right(70), "plain-0": right(60), "plain-1": right(60)}
    assert claims.headroom(run)["captured"] is None  # no gap, no share
    assert claims.headroom({"plain": {}}) is None  # a record without answers


def test_gains_over_the_median_prompt_average_the_rotten_tomatoes_and_cr_runs_only():
    gain = lambda task, seed, g: {"task": task, "seed": seed, "plain": {"vs_median_prompt": {"mean": g}}}  # noqa: E731
    runs = [gain("cr", 5, 0.2), gain("cr", 6, 0.1), gain("rotten_tomatoes", 5, 0.03), gain("coin_flip", 5, -0.5),
            {"task": "cr", "seed": 7, "plain": {}}]  # coin_flip and a run without the paired difference left out
    g = claims.gains_over_median_prompt(runs)
    assert g == {"mean": pytest.approx(0.11), "n": 3, "tasks": {"cr": pytest.approx(0.15), "rotten_tomatoes": 0.03},
                 "low": 0.03, "low_run": "rotten_tomatoes seed 5", "high": 0.2}
    assert claims.gains_over_median_prompt(runs[3:]) is None


def test_a_run_is_shown_worse_only_when_its_paired_interval_lies_below_zero():
    run = lambda seed, lo, hi: {"task": "coin_flip", "seed": seed,  # noqa: E731
                                "plain": {"vs_median_prompt": {"mean": (lo + hi) / 2, "ci95": [lo, hi]}}}
    runs = [run(5, -0.19, -0.01), run(6, -0.05, 0.0), run(7, 0.01, 0.2), {"task": "cr", "seed": 5, "plain": {}}]
    assert claims.shown_worse(runs) == [("coin_flip", 5, pytest.approx(-0.1))]  # an upper end of 0 is not below


def test_p_values_print_two_decimals_or_one_significant_digit():
    assert claims.p_text(0.0641) == "0.06"
    assert claims.p_text(1.86e-4) == "2e-4"
    assert claims.p_text(7.4e-6) == "7e-6"


def test_orders_averaged_reads_one_report_of_a_joined_record_seed_by_seed():
    row = lambda report, seed, order, acc: {"report": report, "method": "topk", "seed": seed,  # noqa: E731
                                            "order": order, "test_accuracy": acc}
    order = {"rows": [row("sq", 1, "random", 0.6), row("sq", 1, "random", 0.8), row("sq", 0, "random", 0.5),
                      row("sq", 0, "score", 0.9), row("sq-pl", 0, "random", 0.1)]}
    assert claims.orders_averaged(order, "sq") == {"topk": [0.5, pytest.approx(0.7)]}
    assert claims.one_order(order, "score") == {"topk": [0.9]}


def test_order_search_gain_is_the_chosen_order_minus_the_mean_random_order():
    search = {"results": [{"method": "random", "seed": 1, "chosen": 0, "candidates": [
        {"order": "score", "test_accuracy": 0.55}, {"order": "random", "test_accuracy": 0.7},
        {"order": "random", "test_accuracy": 0.5}]}]}
    assert claims.search_gains(search) == [("random", 1, pytest.approx(-0.05))]


def test_exact_share_brackets_the_windows_that_meet_both_targets():
    windows = {"16": (0.9, 0.05), "32": (0.7, 0.01), "64": (0.85, 0.015), "128": (0.95, 0.005)}
    recency = {"prompt_tokens_mean": 100.0,
               "rows": [{"cache": f"window: 4 sinks + last {w} tokens", "tokens": int(w) + 4} for w in windows],
               "windows": {w: {"subset_loss_spearman": s, "kl": kl} for w, (s, kl) in windows.items()}}
    assert claims.exact_share(recency) == (pytest.approx(0.36), pytest.approx(0.68))


def test_a_changed_trust_record_fails_the_trust_targets_table(copy):
    """BENCHMARKS' trust targets are rendered from their records: a changed rate is caught."""
    path = copy / claims.RESULTS / "handover-simulation-rotten_tomatoes-k20.json"
    record = json.loads(path.read_text())
    row = next(r for r in record["rows"] if (r["check_size"], r["random_prompts"]) == (128, 8))
    row["better_new_rate"] = 0.85
    path.write_text(json.dumps(record))
    problems = claims.check(copy)
    assert len(problems) == 1
    assert "BENCHMARKS.md" in problems[0] and "'trust-targets'" in problems[0]
    assert "16 where the records give 85" in problems[0]
    assert "docs/results/handover-simulation-rotten_tomatoes-k20.json" in problems[0]
    assert claims.check(copy, write=True) == []
    assert "85% at the default 128 examples x 8 random prompts" in (copy / "BENCHMARKS.md").read_text()


def test_a_record_that_is_a_list_of_runs_needs_provenance_on_each_run(copy):
    path = copy / claims.RESULTS / "per-query-k20-rotten_tomatoes.json"
    runs = json.loads(path.read_text())
    del runs[3]["provenance"]["commit"]
    path.write_text(json.dumps(runs))
    with pytest.raises(claims.ClaimError, match=r"per-query-k20-rotten_tomatoes.json\[3\]: provenance lacks commit"):
        claims.check(copy)


def test_a_changed_fidelity_record_fails_the_ssm_reads_table(copy):
    path = copy / claims.RESULTS / "ssm-input-coin_flip-k20.json"
    record = json.loads(path.read_text())
    record["also"]["layer2"]["logit_mse"] = 9.99
    path.write_text(json.dumps(record))
    problems = claims.check(copy)
    assert len(problems) == 1 and "'ssm-reads'" in problems[0]
    assert "3.37 where the records give 9.99" in problems[0]


def test_from_k_is_the_smallest_k_after_which_a_statement_always_holds():
    assert claims.from_k([5, 10, 20, 40], lambda k: k != 10) == 20
    assert claims.from_k([5, 10, 20], lambda k: k < 20) is None
    assert claims.rate(0.735) == "73.5" and claims.rate(0.16) == "16"


def test_the_pooled_equal_time_record_must_hold_the_runs_of_the_records_it_names(copy):
    path = copy / claims.RESULTS / "search-equal-time.json"
    record = json.loads(path.read_text())
    assert record["runs"] == 48 and len(record["records"]) == 4
    record["records"] = record["records"][:3]  # a task's 6-min record left out of the pooled decision
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="search-equal-time.json pools 48 runs; the records it names hold 36"):
        claims.check(copy)


def _calibrated_run(task, seed, handed, plain_median, cal_vs, zero_vs, search, *, commits=("a" * 40,), threads=(2,)):
    """A trust-calibrated record as bench trust writes it, reduced to what the table reads."""
    stages = {f"stage{i}": {"commit": c, "machine": f"x86_64, {t} torch threads, cpu", "modified_files": []}
              for i, (c, t) in enumerate(zip(commits, threads, strict=True))}
    correct = [1] * handed + [0] * (10 - handed)
    rows = {"handed-over": {"correct": correct}}
    rows |= {f"calibrated plain-{i}": {"correct": [1] * (i // 2) + [0] * (10 - i // 2)} for i in range(16)}
    return {"task": task, "seed": seed, "handed_test_accuracy": handed / 10, "handed_raw_test_accuracy": 0.5,
            "plain": {"median": plain_median}, "calibrated_plain": {"median": 0.7, "vs_median_prompt": cal_vs},
            "vs_calibrated_zero_shot": zero_vs, "headroom": {"search": search, "reliability": 0.6},
            "stages_made_by": stages, "scored_on_test_by": stages["stage0"], "prompts_on_test": rows}


def test_trust_calibrated_targets_follow_the_rule_fixed_before_the_runs():
    from claim_tables import trust_calibrated as tc

    fine = {"mean": 0.01, "ci95": [-0.02, 0.04]}
    runs = [_calibrated_run("rotten_tomatoes", 15, 9, 0.7, fine, fine, True),
            _calibrated_run("cr", 15, 8, 0.7, fine, fine, False),
            _calibrated_run("coin_flip", 15, 3, 0.5, fine, {"mean": -0.1, "ci95": [-0.2, -0.01]}, True)]
    e = tc.evaluate(runs)
    assert [f"{r['task']}" for r in e["worse"]] == ["coin_flip"]  # shown below calibrated zero-shot
    assert e["gain"] == pytest.approx((0.9 - 0.7 + 0.8 - 0.7) / 2)  # rotten_tomatoes and cr only
    assert (e["searched"], e["held"]) == (2, 1)  # coin_flip: 3 correct, at or above 8 of the 16 (0, 0, ..., 3, 3)
    text = tc.verdicts(e)
    assert "**not met**" in text[0] and "coin_flip seed 15" in text[0]
    assert "+15.0 points over 2 runs: at or above it so far (12 of 15 runs to come)" in text[1]
    assert "1 of 2 (50%): below it so far" in text[2]
    done = tc.verdicts({**e, "runs": 15})
    assert done[1].endswith("runs: met") and done[2].endswith("(50%): **not met**")


def test_trust_calibrated_names_a_run_made_by_two_commits_or_thread_counts():
    from claim_tables.adapt import as_record

    from icl_ssm.provenance import made_by_summary

    def made_by(raw):  # what the table reads: the provenance of the record the adapter makes
        return made_by_summary(as_record("trust-calibrated/run.json", raw).provenance)

    fine = {"mean": 0.0, "ci95": [-0.01, 0.01]}
    one = _calibrated_run("cr", 16, 8, 0.7, fine, fine, True, commits=("a" * 40, "a" * 40), threads=(2, 2))
    two = _calibrated_run("cr", 17, 8, 0.7, fine, fine, True, commits=("a" * 40, "b" * 40), threads=(2, 1))
    assert made_by(one)["mixed"] is None
    mixed = made_by(two)["mixed"]
    assert "commits aaaaaaa, bbbbbbb" in mixed and "1 torch thread (stage1)" in mixed
    old = {"environment": {"commit": "c" * 40, "machine": "x86_64, 1 torch threads, cpu"}}
    assert made_by(old)["threads"] == [1] and made_by(old)["mixed"] is None

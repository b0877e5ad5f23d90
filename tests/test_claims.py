"""The published tables are rendered from their records: tools/claims.py."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import research_script

claims = research_script("claims", folder="tools")  # puts tools/ on sys.path, for claim_tables
from claim_tables.base import p_text  # noqa: E402
from claim_tables.trust_targets import rate, verdict  # noqa: E402

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


def test_a_trust_target_is_decided_only_when_the_runs_to_come_cannot_change_it():
    assert verdict(12, 12, left=3) == "met"
    assert verdict(10, 12, left=1) == "**not met**"
    assert verdict(10, 12, left=2) == "needs 2 of the 2 runs to come"
    assert verdict(11, 12, left=0) == "**not met**"


def test_a_rate_over_draws_prints_as_exact_as_the_draws_make_it():
    assert rate(0.735) == "73.5" and rate(0.16) == "16"


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


def test_p_values_print_two_decimals_or_one_significant_digit():
    assert p_text(0.0641) == "0.06"
    assert p_text(1.86e-4) == "2e-4"
    assert p_text(7.4e-6) == "7e-6"


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

"""The calibration and fair-trial records read as records (tools/claim_tables/readers/calibration.py,
readers/fair_trial.py), and the calibration-headroom table over a record of two tasks: hand-made records in, the
metrics and cells the tables print out."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # as tools/claims.py does
from claim_tables.adapt import as_record  # noqa: E402
from claim_tables.calibration import calibration_headroom  # noqa: E402

MADE = {"command": "python research/x.py", "commit": "abc1234", "date": "2026-11-28", "machine": "2-core CPU"}


def _lean_row(record, n, same=None, rho=0.5):
    return {"record": f"docs/results/{record}.json", "k": 20, "n_subsets": n, "n_queries": 32, "r2_quadratic": 0.98,
            "r2_linear": 0.77, "dense_same_as_or_nested_in": same,
            "spearman": [{"ranker": "plain label count, count^2", "spearman": rho, "ci95": [0.1, 0.7]},
                         {"ranker": "cache path: layer8", "spearman": 0.3, "ci95": [-0.1, 0.6]}],
            "reference_not_a_ranker": {"ranker": "|lean|", "spearman": 0.9, "ci95": [0.8, 0.95]}}


def test_label_lean_reads_each_stored_record_as_a_part_with_its_rankers():
    raw = {"provenance": MADE, "config": {"bootstrap": {"resampled": "subsets (queries held fixed)"}},
           "records": [_lean_row("ssm-a-k20", 30),
                       _lean_row("ssm-a-k20-layers", 30, same="docs/results/ssm-a-k20.json")]}
    r = as_record("calibration/label-lean-x.json", raw)
    assert list(r.config["parts"]) == ["ssm-a-k20", "ssm-a-k20-layers"]
    row = r.part("ssm-a-k20")
    assert row["spearman.count2"].value == 0.5 and row["spearman.count2"].interval == (0.1, 0.7)
    assert row["spearman.count2"].n == 30 and row["spearman.count2"].resamples == "subsets (queries held fixed)"
    assert row["spearman.layer8"].value == 0.3  # a cache path by its own name
    assert row["spearman.compressed"].value is None  # a ranker the table asks for, absent here
    assert row["r2_quadratic"].value == 0.98 and row["spearman_abs_lean"].interval == (0.8, 0.95)
    assert r.config["parts"]["ssm-a-k20-layers"]["dense_same_as_or_nested_in"] == "docs/results/ssm-a-k20.json"


def test_calibrate_equal_time_reads_each_arm_and_names_its_bootstrap_axes():
    vs = {"mean": -0.03, "ci95": [-0.08, 0.01], "level": 0.95, "resampled": "rows and columns", "n": 6}
    arms = {"raw-search 2 min": {"mean": 0.77, "raw_mean": 0.77, "runs": 6, "wall_mean": 96.4, "wall_max": 120.0,
                                 "vs_best": vs},
            "calibrated-search 2 min": {"mean": 0.79, "raw_mean": 0.74, "runs": 6, "wall_mean": 112.8, "wall_max": 124}}
    decision = {"best": "calibrated-search 2 min", "default": "calibrated-random", "why": "w",
                "cost_target": {"raw_search": "raw-search 2 min", "accuracy_gap": -0.01, "wall_ratio": 0.06,
                                "met": False}}
    raw = {"provenance": MADE, "config": {"k": 20}, "summary": {"arms": arms, "decision": decision},
           "runs": [{"task": "cr", "seed": 20, "test_ids": ["cr-1", "cr-2"]}]}
    r = as_record("calibration/calibrate-equal-time.json", raw)
    raw_search = r.part("raw-search 2 min")
    assert raw_search["accuracy"].value == 0.77 and raw_search["accuracy"].n == 6
    assert raw_search["vs_best"].interval == (-0.08, 0.01)
    assert raw_search["vs_best"].resamples == "runs and their test examples" and raw_search["vs_best"].n == 6
    assert r.part("calibrated-search 2 min")["vs_best"].value is None  # the best arm has no difference from itself
    assert r["cost.wall_ratio"].value == 0.06 and r["cost.accuracy_gap"].value == -0.01
    assert r.config["decision"]["cost_target"] == {"against": "raw-search 2 min", "met": False}
    assert r.example_ids == {"cr seed 20": ["cr-1", "cr-2"]}


def test_fidelity_calibrated_reads_each_cache_path_on_each_target():
    raw = {"provenance": MADE, "config": {"k": 20}, "k": 20, "subsets": 32, "queries": 64,
           "subset_loss_spearman_balanced": 0.44, "subset_loss_spearman_balanced_ci95_queries": [-0.02, 0.75],
           "control_subset_loss_spearman_calibrated": -0.34,
           "control_subset_loss_spearman_calibrated_ci95_queries": [-0.76, 0.39],
           "window_subset_loss_spearman_calibrated": -0.15,
           "window_subset_loss_spearman_calibrated_ci95_queries": [None, 0.5],
           "dense_split_half_spearman_calibrated": 0.5}
    r = as_record("calibration/fidelity-calibrated-x.json", raw)
    assert r["compressed.spearman_balanced"].interval == (-0.02, 0.75)
    assert r["compressed.spearman_balanced"].resamples == "subsets and queries"
    assert r["compressed.spearman_balanced"].n == 32
    assert r.part("control")["spearman_calibrated"].value == -0.34
    window = r["window.spearman_calibrated"]
    assert window.value == -0.15 and window.interval is None  # an interval with a missing end is not one
    assert r["compressed.spearman_calibrated"].value is None
    assert r["dense.split_half_calibrated"].value == 0.5 and r.config["queries"] == 64


def _target(split, need, label):
    return {"subset_loss_split_half": split, "subset_loss_reliability": 2 * split / (1 + split),
            "score_split_half": 0.3, "score_reliability": 0.46, "subsets_for_0_8": need, "score_label_spearman": label}


def test_algorithm2_calibrated_reads_each_seed_and_target_as_a_part():
    raw = {"provenance": MADE, "k": 20, "pool_size": 100, "settings": {"seeds": [0]},
           "runs": [{"seed": 0, "subsets": 192, "queries": 32, "top_k_overlap": 3,
                     "targets": {"raw": _target(0.68, 918, -0.6), "batch": _target(-0.05, None, 0.05)}}]}
    r = as_record("calibration/algorithm2-calibrated-x.json", raw)
    assert list(r.config["parts"]) == ["seed0.raw", "seed0.batch"]
    raw_target, batch = r.part("seed0.raw"), r.part("seed0.batch")
    assert raw_target["subsets_for_0_8"].value == 918 and batch["subsets_for_0_8"].value is None
    assert raw_target["top_k_shared_with_raw"].value is None and batch["top_k_shared_with_raw"].value == 3
    assert raw_target["subset_loss_split_half"].n == 32 and raw_target["score_split_half"].n == 192
    assert batch["score_label_spearman"].value == 0.05 and batch["score_label_spearman"].n == 100
    assert r.config["parts"]["seed0.batch"] == {"seed": 0, "target": "batch", "subsets": 192, "queries": 32}


def test_fair_trial_rankers_reads_each_task_with_its_rankers_and_the_paired_difference():
    what = "subsets, and the target and probe queries within each label"
    task = {"task": "cr", "k": 20, "subsets": 32, "queries": {"target": 56, "probe": 8}, "target_split_half": 0.44,
            "target_reliability": 0.61,
            "spearman": [{"ranker": "cache: compressed", "spearman": -0.12, "ci95": [-0.59, 0.56]},
                         {"ranker": "dense 4+4", "spearman": -0.2, "ci95": [-0.7, 0.67]}],
            "paired": [{"ranker": "cache: compressed", "minus": "dense 4+4", "difference": 0.07,
                        "ci95": [-0.9, 0.98]}]}
    raw = {"provenance": MADE, "config": {"bootstrap": {"resampled": what}}, "records": [task]}
    r = as_record("fair-trial/rankers-x.json", raw).part("cr")
    assert r["spearman.compressed"].interval == (-0.59, 0.56) and r["spearman.compressed"].resamples == what
    assert r["spearman.dense_probe"].value == -0.2 and r["spearman.dense_probe"].n == 32
    assert r["spearman.control"].value is None  # a ranker the table asks for, absent here
    assert r["compressed_minus_dense_probe"].value == 0.07
    assert r["compressed_minus_dense_probe"].unit == "spearman difference"
    assert r["compressed_minus_control"].value is None
    assert r["target_split_half"].value == 0.44 and r["target_split_half"].n == 56
    assert r.config["parts"]["cr"]["probe_queries"] == 8


class _Records:
    """The records a table reads, from ``root/docs/results`` (tools/claims.py's Records, without its checks)."""

    def __init__(self, root: Path):
        self.root = root

    def __call__(self, name: str) -> dict:
        return json.loads((self.root / "docs/results" / name).read_text())

    def glob(self, pattern: str) -> list[tuple[str, dict]]:
        return [(p.name, json.loads(p.read_text())) for p in sorted((self.root / "docs/results").glob(pattern))]

    def link(self, name: str, depth: int = 0) -> str:
        return f"[record]({'../' * depth}docs/results/{name})"


def _summary(median, best, diff):
    return {"median": median, "std": 0.05, "min": 0.5, "max": 0.9, "test_accuracy": [0.6] * 3,
            "validation_test_spearman": 0.7, "validation_split_half": 0.4, "best_on_validation_test": best,
            "best_minus_median": diff, "zero_shot": 0.55}


def test_calibration_headroom_renders_each_task_of_a_record_of_two(tmp_path):
    diff = {"mean": 0.1, "ci95": [0.03, 0.17], "resampled": "rows", "n": 150}
    task = {"test_ids": [f"t{i}" for i in range(150)], "validation_ids": [], "test_labels": {"a": 120, "b": 30},
            "summary": {"none": _summary(0.69, 0.61, diff), "batch-inputs": _summary(0.7, None, None)}}
    raw = {"provenance": MADE, "config": {"prompts": 3, "test_size": 150, "seed": 0, "imbalance": 0.8},
           "tasks": {"rotten_tomatoes": task, "cr": task}}
    (tmp_path / "docs/results/calibration").mkdir(parents=True)
    (tmp_path / "docs/results/calibration/headroom-x.json").write_text(json.dumps(raw))
    lines = calibration_headroom(_Records(tmp_path)).splitlines()
    assert lines[2] == ("| rotten_tomatoes | 0 | 80% | none | 55.0 | 69.0 (5.0) | 50.0-90.0 | 61.0 "
                        "| +10.0 [+3.0, +17.0] | 0.70 | 0.40 | 3 x 150 |")
    assert lines[3].startswith("| rotten_tomatoes | 0 | 80% | batch-inputs | 55.0 | 70.0 (5.0) | 50.0-90.0 | - | - |")
    assert [line.split(" | ")[0] for line in lines[2:6]] == ["| rotten_tomatoes"] * 2 + ["| cr"] * 2
    assert "over test examples, n = 150" in lines[7]


STORED = ["calibration/label-lean-rotten_tomatoes.json", "calibration/calibrate-equal-time.json",
          "calibration/fidelity-calibrated-rotten_tomatoes-k20-32x64.json",
          "calibration/algorithm2-calibrated-rotten_tomatoes-k20.json", "fair-trial/rankers-k20-96x64.json"]


@pytest.mark.parametrize("name", STORED)
def test_the_stored_records_read(name):
    root = Path(__file__).resolve().parents[1]
    assert as_record(name, json.loads((root / "docs/results" / name).read_text())).metrics


def test_the_per_demonstration_probe_reads_each_learned_ranker_and_its_margin_over_label_counts():
    raw = {"provenance": MADE, "config": {"bootstrap": {"resampled": "subsets (out-of-fold predictions held fixed)"}},
           "records": [{"record": "r.json", "task": "rotten_tomatoes_foobar", "k": 20, "subsets": 96, "pool": 1500,
                        "target_queries": 56,
                        "spearman": [{"ranker": "per-demonstration encodings", "spearman": 0.3, "ci95": [0.1, 0.5]},
                                     {"ranker": "label counts", "spearman": 0.1, "ci95": [-0.1, 0.3]},
                                     {"ranker": "both", "spearman": 0.35, "ci95": [0.15, 0.55]}],
                        "paired": {"ranker": "per-demonstration encodings", "minus": "label counts",
                                   "difference": 0.2, "ci95": [-0.05, 0.45]}}]}
    record = as_record("fair-trial/per-demo-ranker-k20.json", raw).part("rotten_tomatoes_foobar")
    assert record["spearman.encodings"].value == 0.3 and record["spearman.encodings"].interval == (0.1, 0.5)
    assert record["spearman.label_counts"].n == 96
    margin = record["encodings_minus_label_counts"]
    assert (margin.value, margin.interval, margin.unit) == (0.2, (-0.05, 0.45), "spearman difference")
    assert margin.resamples == "subsets (out-of-fold predictions held fixed)"

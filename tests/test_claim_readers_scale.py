"""The readers of the scale and answering records (``tools/claim_tables/readers/scale.py``, ``answering.py``):
hand-made records in, the metrics the tables print out."""

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # as tools/claims.py does
adapt = importlib.import_module("claim_tables.adapt")
scale = importlib.import_module("claim_tables.readers.scale")
answering = importlib.import_module("claim_tables.readers.answering")
records = importlib.import_module("icl_ssm.records")

PROVENANCE = {"command": "icl-ssm bench scale --shapes tiny", "commit": "abc", "date": "2026-11-28"}


def _row(evaluator: str, flops: float, seconds: float, **extra) -> dict:
    return {"k": 20, "evaluator": evaluator, "prompt_tokens": 100.0, "flops_per_subset": flops,
            "seconds_per_subset": seconds, "peak_bytes": 3 * 2**30, "working_bytes": 2**30, **extra}


def _bench(shape: str = "tiny", rows: bool = True, seconds: float = 8.0) -> dict:
    """One shape at k = 20: dense 800 FLOPs in ``seconds``, compressed 100 in 4 s; projected from the shape."""
    measured = [_row("dense-packed", 800.0, seconds), _row("dense-lean-packed", 600.0, 6.0),
                _row("compressed-packed", 100.0, 4.0),
                _row("dense-per-query", 4000.0, 40.0, queries_measured=2), _row("compressed", 90.0, 3.0)]
    return {"threads": 1, "settings": {"queries": 8}, "provenance": PROVENANCE, "shapes": [{
        "shape": shape, "k": [20], "params": 2**30, "vocab": 1000, "layers": 2, "kv_heads": 1, "head_dim": 4,
        "weights_bytes": 2**32, "rows": measured if rows else [],
        "builds": [{"k": 20, "case": "dense", "flops": 5e11, "seconds": 1.5, "prompt_tokens": 100}],
        "distill": [{"k": 20, "case": "distillation step", "seconds": 9.0, "working_bytes": 2**31}],
        "projected": [{"k": 20, "prompt_tokens": 100, "dense-packed": 1000, "compressed-packed": 250,
                       "paper-compressed-packed": 200, "dense-lean-packed": 500, "dense-per-query": 6000,
                       "compressed": 240}]}]}


def test_bench_scale_names_each_row_and_computes_its_savings():
    r = adapt.as_record("scale-tiny-cpu.json", _bench())
    assert scale.measured_rows(r) == [f"tiny/k20/{e}" for e in ("dense-packed", "dense-lean-packed",
                                                                   "compressed-packed", "dense-per-query",
                                                                   "compressed")]
    saving = r.part("tiny/k20/saving")
    assert scale.where(saving) == ("tiny", "k20", "saving")
    assert (saving["recipe_flops"].value, saving["recipe_time"].value, saving["recipe_flops_per_time"].value) == (
        8.0, 2.0, 4.0)
    assert (saving["lean_flops"].value, saving["lean_time"].value) == (6.0, 1.5)
    assert saving["per_query_flops"].value == pytest.approx(4000 / 90)
    assert saving["paper_flops"].value is None  # no paper-compressed row measured
    assert r.part("tiny/k20/dense-per-query")["queries_measured"].value == 2
    assert r["tiny/k20/build-dense.seconds"].value == 1.5 and r["tiny/k20/distill.working_bytes"].value == 2**31
    projected = r.part("tiny/k20/projected")
    assert (projected["recipe_flops"].value, projected["paper_flops"].value, projected["lean_flops"].value,
            projected["per_query_flops"].value) == (4.0, 5.0, 2.0, 25.0)
    assert projected["window_flops"].value is None  # a shape without a sliding window
    assert r.config["k"] == {"tiny": [20]} and r.config["command"] == PROVENANCE["command"]
    assert all(m.interval is None for m in r.metrics.values())


def test_scale_profile_reads_seconds_by_kind_and_the_rest_share():
    raw = {"shape": "tiny", "k": 50, "queries": 8, "threads": 1, "flop_saving": 10.0, "time_saving": 5.0,
           "provenance": PROVENANCE,
           "dense-packed": {"seconds": 4.0, "gflops": 400.0, "gflop_per_s": 100.0, "matmul_gflop_per_s": 120.0,
                            "seconds_by_kind": {"matmul": 3.0, "other": 1.0}}}
    r = adapt.as_record("scale-profile-tiny-k50.json", raw)
    dense = r.part("dense-packed")
    assert dense["other_share"].value == 0.25 and dense["attention_seconds"].value == 0  # none measured
    assert (r["saving.flops"].value, r["saving.time"].value) == (10.0, 5.0)
    assert r.config["k"] == 50


def _demo(name: str, demo: float, search: float) -> "records.Record":
    metrics = {"demo_seconds": records.Metric(demo), "search_wall_seconds": records.Metric(search),
               "search_budget_seconds": records.Metric(120.0)}
    return records.Record({"process": PROVENANCE}, {}, metrics, {}, name)


def test_run_costs_projects_each_shape_from_the_demos_and_the_measured_seconds():
    projected = _bench()
    projected["shapes"] += [_bench("big", rows=False)["shapes"][0], _bench("mid")["shapes"][0]]
    projected = adapt.as_record("scale-projected.json", projected)
    measured = [adapt.as_record("scale-tiny-cpu.json", _bench()),
                adapt.as_record("scale-mid-cpu.json", _bench("mid", seconds=16.0))]
    demos = [_demo("demo-cold-a.json", 600.0, 100.0), _demo("demo-cold-b.json", 660.0, 140.0)]
    r = scale.run_costs(projected, measured, demos, base="tiny", anchor="mid")
    tiny, big, mid = r.part("tiny"), r.part("big"), r.part("mid")
    assert tiny["minutes"].value == 630 / 60 and tiny["minutes"].n == 2  # the demos' mean, measured
    assert mid["dense_seconds"].value == 16.0  # measured
    assert big["dense_seconds"].value == 1000 / (800 / 16)  # projected FLOPs over mid's FLOP/s
    assert mid["minutes"].value == ((630 - 120) * 16.0 / 8.0 + 120) / 60  # work outside the search, scaled
    assert tiny["weights_gib"].value == 4.0 and tiny["weights_gib_bf16"].value == 2.0
    kv, logits = 8 * 100 * 2 * 2 * 1 * 4 * 4 / 2**30, 8 * 100 * 1000 * 4 / 2**30
    assert tiny["run_gib"].value == pytest.approx(4.0 + logits + kv)
    assert r.config["how"]["big"] == {"seconds": "projected", "minutes": "projected"}
    assert set(r.provenance) == {"scale-projected.json", "scale-tiny-cpu.json", "scale-mid-cpu.json",
                                 "demo-cold-a.json", "demo-cold-b.json"}


def test_answer_throughput_reads_paths_agreements_and_their_intervals():
    accuracy = {"mean": 0.8, "ci95": [0.77, 0.83], "level": 0.95, "resampled": "rows", "n": 1000}
    raw = {"settings": {"model": "smollm2-135m", "task": "rotten_tomatoes", "k": 20}, "provenance": PROVENANCE,
           "rows": [{"path": "shared-exact", "inputs": 1000, "answers_per_second": 9.0, "x_reencode": 19.5,
                     "peak_rss_mib": 1157.0, "prompt_tokens": 663, "accuracy": accuracy},
                    {"path": "reencode", "inputs": 100, "answers_per_second": 0.46, "x_reencode": 1.0,
                     "peak_rss_mib": 1674.0, "prompt_tokens": 663}],
           "agreement": {"shared-exact vs reencode": {"inputs": 100, "identical_answers": 99},
                         "shared-compressed vs shared-exact": {
                             "inputs": 1000, "agreeing_answers": 655,
                             "accuracy_minus_dense": {**accuracy, "mean": -0.145, "ci95": [-0.18, -0.11]}}}}
    r = adapt.as_record("answer-throughput-rotten_tomatoes-k20.json", raw)
    exact = r.part("shared-exact")
    assert exact["accuracy"].interval == (0.77, 0.83) and exact["accuracy"].resamples == "test examples"
    assert exact["accuracy"].n == 1000 and exact["answers_per_second"].n == 1000
    assert r["reencode.accuracy"].value is None and r["shared-compressed.accuracy"].value is None  # not scored
    assert "shared-compressed.answers_per_second" not in r.metrics  # not run
    assert r["exact_vs_reencode.identical_answers"].value == 99
    gap = r["compressed_vs_exact.accuracy_minus_dense"]
    assert (gap.value, gap.interval, gap.n) == (-0.145, (-0.18, -0.11), 1000)
    assert "logit_check.inputs" not in r.metrics
    assert r.config["command"] == PROVENANCE["command"] and r.config["k"] == 20

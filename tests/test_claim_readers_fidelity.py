"""The readers of fidelity reports, their research records and the scan benchmarks (tools/claim_tables/readers/
fidelity.py, scan.py), on small hand-made records, and the summary-table rows built from them."""

import sys
from pathlib import Path

import pytest

from icl_ssm.records import Metric, Record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from claim_tables.adapt import as_record  # noqa: E402
from claim_tables.readers.common import combined  # noqa: E402
from claim_tables.rows import Row, est, render_rows  # noqa: E402

PROVENANCE = {"command": "icl-ssm fidelity ...", "commit": "a" * 7}


def report(**extra) -> dict:
    """A fidelity report of 4 subsets x 8 queries: the compressed cache, its control, one --also path."""
    return {"task": "rotten_tomatoes", "k": 20, "subsets": 4, "queries": 8, "provenance": PROVENANCE,
            "acc_dense": 0.75, "acc_compressed": 0.5, "flops_dense": 4e11, "flops_compressed": 1e11, "kl": 0.03,
            "subset_loss_spearman": 0.6, "subset_loss_spearman_ci95": [0.2, 0.9],
            "subset_loss_spearman_ci95_queries": [-0.1, 0.95], "dense_split_half_spearman": 0.4,
            "control_subset_loss_spearman": 0.5, "control_subset_loss_spearman_ci95": [None, 0.8], "control_acc": 0.6,
            "control_subset_loss_spearman_balanced": 0.55,
            "also": {"layer8": {"subset_loss_spearman": 0.7, "acc": 0.625, "flops": 2e11, "logit_mse": 2.5}},
            "paired": {"layer8-control": {"diff": 0.2, "ci95": [-0.1, 0.4], "ci95_queries": [-0.3, 0.5]}},
            "per_subset": {"ids": [[3, 1], [2, 5]]}, **extra}


def test_a_fidelity_report_names_each_path_its_intervals_and_the_paired_differences():
    r = as_record("ssm-input-rotten_tomatoes-k20.json", report())
    assert r["compressed.spearman"] == Metric(0.6, (0.2, 0.9), 4, "subsets", "spearman")
    assert r["compressed.spearman_over_queries"].interval == (-0.1, 0.95)
    assert r["compressed.spearman_over_queries"].resamples == "subsets and queries"
    assert r["compressed.acc"] == Metric(0.5, n=32, unit="accuracy")
    assert r["compressed.gflop"].value == pytest.approx(100) and r["compressed.flops_share"].value == 0.25
    assert r["control.spearman"].interval is None  # a bound stored as None (not finite): no interval
    assert r["control.spearman_pooled"].value == 0.55 and r["compressed.spearman_pooled"].value == 0.6
    assert r["layer8.logit_mse"].value == 2.5 and r["layer8.flops_share"].value == 0.5
    assert r["dense.acc"].value == 0.75 and r["dense.split_half"].value == 0.4
    assert r["layer8_minus_control"] == Metric(0.2, (-0.1, 0.4), 4, "subsets", "spearman difference")
    assert r["layer8_minus_control_over_queries"].interval == (-0.3, 0.5)
    assert "window.spearman" not in r.metrics
    assert r.config["paths"] == ["compressed", "control", "layer8"] and r.config["subsets"] == 4
    assert r.example_ids == {"subsets": ["3,1", "2,5"]}
    assert r.part("layer8")["acc"].value == 0.625


def test_a_fidelity_report_keeps_its_virtual_token_count_in_its_config():
    assert as_record("nv-t-k50.json", report(num_virtual=16)).config["num_virtual"] == 16
    assert "num_virtual" not in as_record("ssm-input-t-k20.json", report()).config


def test_a_joined_report_holds_the_paired_differences_and_how_far_the_two_runs_drifted():
    raw = {"subsets": 4, "queries": 8, "provenance": PROVENANCE, "drift": {"dense": 0.0, "control": 0.01},
           "paired": {"G-rank10-compressed": {"diff": -0.05, "ci95": [-0.2, 0.1], "ci95_queries": [-0.3, 0.2]}}}
    r = as_record("ssm-input-coin_flip-k50-joined.json", raw)
    assert r["G-rank10_minus_compressed"].value == -0.05
    assert r["G-rank10_minus_compressed_over_queries"].resamples == "subsets and queries"
    assert r["drift.control"].value == 0.01


def recency_raw() -> dict:
    windows = {"16": (0.9, 0.05, 0.3), "32": (0.7, 0.01, 0.2), "64": (0.85, 0.015, 0.1), "128": (0.95, 0.005, 0.15)}
    return {"task": "rotten_tomatoes", "k": 50, "subsets": 4, "queries": 8, "prompt_tokens_mean": 100.0,
            "provenance": PROVENANCE,
            "rows": [{"cache": f"window: 4 sinks + last {w} tokens", "tokens": int(w) + 4} for w in windows],
            "windows": {w: {"subset_loss_spearman": s, "kl": kl, "rel_logit_err": e}
                        for w, (s, kl, e) in windows.items()}}


def test_recency_brackets_the_exact_share_and_names_the_window_of_the_lowest_logit_error():
    r = as_record("recency-k50-rotten_tomatoes.json", recency_raw())
    assert r["exact.miss"].value == pytest.approx(0.36) and r["exact.meets"].value == pytest.approx(0.68)
    assert r.config["best"] == "64" and r["best.rel_logit_err"].value == 0.1
    assert r["best.share"].value == pytest.approx(0.68) and r["last16.share"].value == pytest.approx(0.20)


def test_the_probes_read_their_loss_changes_and_the_state_separability():
    probe = {"subsets": 24, "queries": 16, "provenance": PROVENANCE, "control": "runs/control",
             "dense": {"diff": 0.07, "ci95": [0.016, 0.129], "higher_share": 0.7},
             "compressed": {"diff": -0.018, "ci95": [-0.05, 0.015], "higher_share": 0.46},
             "state_separability": {"accuracy": 0.63, "ci95": [0.59, 0.67], "pairs": 256}}
    r = as_record("flipped-rotten_tomatoes-k20-G-state.json", probe)
    assert r["dense.loss_change"] == Metric(0.07, (0.016, 0.129), 24, "subsets", "loss")
    assert "control.loss_change" not in r.metrics  # an older record names its control's directory there
    assert r["state_separability"].n == 512 and r["state_separability"].interval == (0.59, 0.67)
    block = {"subset_loss_spearman": 0.69, "subset_loss_spearman_ci95": [0.41, 0.86], "acc_compressed": 0.5,
             "flops_dense": 4.0, "flops_compressed": 1.0}
    tail = as_record("tail-readout-k20-rotten_tomatoes.json",
                     {"provenance": PROVENANCE, "runs": {"C4": {"readout": block, "dense_tail": block}}})
    assert tail["C4.spearman"].interval == (0.41, 0.86) and tail["C4-dense-tail.acc"].value == 0.5
    assert tail["C4.flops_share"].value == 0.25


def test_the_scan_readers_take_the_worst_agreement_and_the_spans_over_layer_groups():
    rows = [{"impl": "fast", "max_rel_diff": d} for d in (1e-6, 3e-6)] + [{"impl": "paper", "max_rel_diff": 0.1}]
    ratios = {"fast_over_projection": 1.1, "reference_over_fast": 10.0, "paper_over_fast": 700.0}
    scan = as_record("scan-cpu.json", {"provenance": PROVENANCE, "command": "icl-ssm bench scan", "rows": rows,
                                       "machine": {"threads": 2},
                                       "targets": {"T": 16, "N": 4, "batch_1": ratios, "batch_8": ratios}})
    assert scan["fast.max_rel_diff"] == Metric(3e-6, n=2, unit="relative difference (float32)")
    assert scan["fast.shapes"].value == 2 and scan["batch_8.paper_over_fast"].value == 700.0
    assert scan.config["threads"] == 2
    groups = [{"keys": [0.5, 0.9, 0.95], "values": [0.1, 0.4, 0.6]},
              {"keys": [0.6, 0.8, 0.9], "values": [0.2, 0.5, 0.7]}]
    spectrum = as_record("legendre-k20.json", {"provenance": PROVENANCE, "k": 20, "degrees": 3, "groups": groups})
    assert spectrum["keys.first_min"].value == 0.5 and spectrum["keys.first_max"].value == 0.6
    assert spectrum["values.all_min"].value == 0.6 and spectrum["values.all_max"].value == 0.7
    assert spectrum["keys.all_max"].n == 2


def test_a_row_of_several_records_states_its_statistics_and_renders_by_the_one_renderer():
    a = as_record("seeds-rotten_tomatoes-k20.json", report())
    b = as_record("ssm-input-rotten_tomatoes-k20.json", report(subset_loss_spearman=0.8))
    r = combined("ranking", {"a": a, "b": b}, {
        "mean": ("mean", ["a.compressed.spearman", "b.compressed.spearman"]),
        "sd": ("sd", ["a.compressed.spearman", "b.compressed.spearman"]),
        "gain": ("minus", ["b.compressed.spearman", "a.compressed.spearman"])}, {"measure": "ranking"})
    assert (r["mean"].value, r["mean"].n, r["mean"].unit) == (pytest.approx(0.7), 2, "spearman")
    assert r["sd"].value == pytest.approx(0.1414, abs=1e-4)
    assert r["gain"].value == pytest.approx(0.2) and r["gain"].unit == "spearman difference"
    assert r.config["sources"]["a"]["queries"] == 8 and r.provenance["a: process"] == PROVENANCE
    measured = {"measured": lambda r: f"{est(r['b.compressed.spearman'])}, mean {r['mean'].value:.2f}"}
    text = render_rows([Row(r, measured)], ["measure", "measured"])
    assert text.splitlines()[2] == "| ranking | 0.80 [0.20, 0.90], mean 0.70 |"
    with pytest.raises(KeyError, match="no metric 'a.window.spearman'"):
        combined("bad", {"a": a}, {"x": ("mean", ["a.window.spearman"])})


def test_a_joined_record_keeps_the_metrics_its_caller_derived_and_states_statistics_over_them():
    a = as_record("seeds-rotten_tomatoes-k20.json", report())
    projected = Metric(0.9, n=64, unit="spearman (split-half, predicted)")
    r = combined("growth", {"a": a}, {"gain": ("minus", ["projected", "a.compressed.spearman"])},
                 derived={"projected": projected})
    assert r["projected"] == projected and "a.projected" not in r.metrics
    assert r["gain"].value == pytest.approx(0.3) and r["gain"].unit == "spearman (split-half, predicted) difference"
    assert r.config == {"sources": {"a": a.config}}


def test_a_record_of_the_schema_is_read_as_it_is():
    record = Record({"process": PROVENANCE}, {}, {"x": Metric(1.0)}, {}, "k50-new.json")
    assert as_record("k50-new.json", record.to_dict())["x"].value == 1.0

"""The readers of the synthetic, robustness and paper-run records (tools/claim_tables/readers/), on small
hand-made records: what each reader computes, and the intervals it names."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from claim_tables.adapt import as_record  # noqa: E402
from claim_tables.readers.paper_runs import per_query, transfer_matrix  # noqa: E402
from claim_tables.readers.synthetic import from_k  # noqa: E402
from claim_tables.synthetic import part, row  # noqa: E402

PROV = {"command": "c", "commit": "abc", "machine": "m", "date": "d", "torch": "t", "transformers": "x"}


def _select_row(k, seed, random, topk, dense, comp):
    return {"k": k, "seed": seed, "random": {"mse": random, "d1_share": 0.5}, "topk": {"mse": topk, "d1_share": 0.5},
            "affinity-dense": {"mse": dense, "d1_share": 0.8}, "affinity-compressed": {"mse": comp, "d1_share": 1.0}}


def test_a_select_record_gives_means_sds_gaps_and_the_k_from_which_a_statement_holds():
    rows = [_select_row(5, 0, 1.0, 1.0, 0.5, 0.4), _select_row(5, 1, 1.0, 1.0, 0.5, 0.6),  # comp ahead at 5
            _select_row(10, 0, 1.0, 0.9, 0.5, 0.9), _select_row(10, 1, 1.0, 0.9, 0.5, 0.9),  # comp not below top-k
            _select_row(20, 0, 1.0, 0.9, 0.5, 0.52), _select_row(20, 1, 1.0, 0.9, 0.5, 0.54)]
    r = as_record("synthetic-x-select.json", {"rows": rows, "d1_share": 0.5, "subsets": 7, "queries": 3,
                                              "provenance": PROV})
    assert r.config["ks"] == [5, 10, 20] and r.config["subsets"] == 7
    assert r["k5.affinity-compressed.mse"].value == pytest.approx(0.5) and r["k5.affinity-compressed.mse"].n == 2
    assert r["k5.affinity-compressed.mse_sd"].value == pytest.approx(0.1414213562)
    assert r["k20.gap"].value == pytest.approx(0.06) and r["k5.gap"].value == pytest.approx(0.0)
    assert r["k10.topk_minus_dense"].value == pytest.approx(0.4)
    assert r["k20.affinity-compressed.d1_share"].value == 1.0 and r["pool_d1_share"].value == 0.5
    assert r["below_from"].value == 20  # at k = 10 compressed (0.9) is not below top-k (0.9)
    assert r["close_from"].value == 20 and r["close_gap_max"].value == pytest.approx(0.06)
    assert r["below_random_from"].value == 5 and r["below_topk_from"].value == 20
    assert r["k5.random.mse"].interval is None


def _fidelity_run(k, comp, control, diff):
    path = lambda rho: {"spearman": rho, "ci95": [rho - 0.1, rho + 0.1], "mean_loss": 1.0,  # noqa: E731
                        "flops_per_subset": 10.0, "cache_flops_per_subset": 2.0}
    return {"k": k, "subsets": 64, "queries": 16, "compressed": path(comp), "control": path(control),
            "window": path(0.3), "dense": {"mean_loss": 1.0, "flops_per_subset": 30.0, "cache_flops_per_subset": 8.0},
            "paired": {"compressed-control": {"diff": diff, "ci95": [diff - 0.2, diff + 0.2],
                                              "ci95_queries": [diff - 0.3, diff + 0.3]}},
            "flop_ratio": 3.0, "cache_flop_ratio": 4.0}


def test_from_k_is_the_smallest_k_after_which_a_statement_always_holds():
    assert from_k([5, 10, 20, 40], lambda k: k != 10) == 20
    assert from_k([5, 10, 20], lambda k: k < 20) is None  # not at the largest k


def test_a_fidelity_record_names_what_its_intervals_resample_and_ranges_over_its_ks():
    one = as_record("synthetic-x-fidelity-q16.json", {**_fidelity_run(20, 0.8, 0.1, 0.7), "provenance": PROV})
    rho = one["compressed.spearman"]
    assert (rho.value, rho.interval, rho.n, rho.resamples) == (0.8, pytest.approx((0.7, 0.9)), 64, "subsets")
    assert one["compressed_minus_control"].interval == pytest.approx((0.5, 0.9))
    assert one["compressed_minus_control_over_queries"].resamples == "subsets and queries"
    assert one["cache_flop_ratio"].value == 4.0 and one.config["queries"] == 16
    several = as_record("synthetic-x-fidelity-k20-40.json", {"k20": _fidelity_run(20, 0.8, -0.2, 1.0),
                                                             "k40": _fidelity_run(40, 0.6, 0.3, 0.3),
                                                             "provenance": PROV})
    assert several.config["ks"] == [20, 40] and several["k40.compressed.spearman"].value == 0.6
    assert (several["control_spearman_min"].value, several["control_spearman_max"].value) == (-0.2, 0.3)
    assert several["compressed_minus_control_min"].value == 0.3 and several["compressed_spearman_max"].value == 0.8
    assert several.part("k40")["compressed.spearman"].value == 0.6


def test_a_probe_and_a_teacher_evaluation():
    probe = as_record("synthetic-x-probe.json", {
        "k": 20, "pairs": 8, "queries": 4, "state_separability": {"accuracy": 0.9, "ci95": [0.8, 0.95], "pairs": 16},
        "dense": {"right": 0.5, "flipped": 1.5, "diff": 1.0, "ci95": [0.9, 1.1], "higher_share": 1.0},
        "compressed": {"right": 0.4, "flipped": 1.0, "diff": 0.6, "ci95": [0.5, 0.7], "higher_share": 0.75},
        "provenance": PROV})
    assert probe["compressed.rise"].interval == (0.5, 0.7) and probe["compressed.rise"].resamples == "pairs"
    assert probe["compressed.higher_share"].value == 0.75 and probe["dense.rise"].n == 8
    assert probe["state_separability"].n == 32
    teacher = as_record("synthetic-teacher-x-evaluation.json", {
        "by_k": [{"k": 40, "teacher": 0.46, "teacher_se": 0.01, "zero": 1.06, "zero_se": 0.03}], "prompts": 100})
    assert teacher["k40.teacher"].value == 0.46 and teacher["k40.zero_se"].value == 0.03
    assert teacher["k40.teacher"].n == 100


def test_a_joined_row_reads_each_record_back_with_its_own_config():
    a = as_record("synthetic-x-probe.json", {"k": 20, "pairs": 8, "queries": 4, "provenance": PROV,
                                             "dense": {"diff": 1.0}, "compressed": {"diff": 0.5}})
    joined = row("probe", probe=a)
    assert joined.config["records"] == ["synthetic-x-probe.json"] and joined.config["row"] == "probe"
    assert part(joined, "probe").config == a.config and part(joined, "probe")["compressed.rise"].value == 0.5


def test_the_robustness_readers_count_per_kind_and_per_command():
    fuzz = as_record("fuzz-inputs-x.json", {"total": 5, "failed": 0, "exit_status": 0, "provenance": PROV,
                                            "cases": {"task files": {"result": 2, "error": 3}}})
    assert fuzz.config["kinds"] == ["task files"] and fuzz["task files.error"].value == 3
    kill = lambda c, d, killed=True, diff=(): {"command": c, "delay_seconds": d, "killed": killed,  # noqa: E731
                                                "differences": list(diff), "rerun_exit": 0}
    kills = as_record("kill-resume.json", {
        "provenance": PROV, "settings": {"commands": ["run", "select"]},
        "summary": {"kills": 2, "attempts": 3, "reruns_completed": 3, "identical": 3, "identical_after_a_kill": 1},
        "uninterrupted": {"select": {"seconds": 7.9}, "run": {"seconds": 17.0}},
        "kills": [kill("select", 3.5), kill("select", 7.0, diff=["a"]), kill("run", 2.0, killed=False)]})
    assert kills.config["commands"] == ["select", "run"]  # in the order first killed, not the settings'
    assert (kills["select.kills"].value, kills["select.same"].value, kills["run.kills"].value) == (2, 1, 0)
    assert (kills["select.delay_min"].value, kills["select.delay_max"].value) == (3.5, 7.0)
    assert kills["run.uninterrupted"].value == 17.0 and kills["identical_after_a_kill"].value == 1


def _report(**also):
    return {"task": "t", "k": 20, "subsets": 10, "queries": 4, "kl": 0.1, "logit_mse": 2.0, "acc_compressed": 0.6,
            "acc_dense": 0.7, "subset_loss_spearman": 0.5, "subset_loss_spearman_ci95": [0.1, 0.8],
            "window_kl": 0.3, "window_subset_loss_spearman": 0.2, "control_kl": 0.12, "control_logit_mse": 3.0,
            "control_subset_loss_spearman": 0.1, "also": also, "provenance": PROV}


def test_a_fidelity_report_of_the_paper_runs_gains_the_differences_between_its_paths():
    r = as_record("transfer-t-k20.json", _report(**{"from-cr": {"kl": 0.08, "acc": 0.65},
                                                     "as-is-cr": {"kl": 0.4, "logit_mse": 2.5}}))
    assert r["from-cr.kl_minus_compressed"].value == pytest.approx(-0.02)
    assert r["as-is-cr.kl_minus_window"].value == pytest.approx(0.1)
    assert r["as-is-cr.logit_mse_minus_control"].value == pytest.approx(-0.5)
    assert r["compressed.acc_minus_dense"].value == pytest.approx(-0.1)
    assert "compressed.kl_minus_compressed" not in r.metrics and "window.kl_minus_window" not in r.metrics
    nv = as_record("nv-t-k50.json", _report(nv4={"kl": 0.2, "acc": 0.75}))
    assert nv["nv4.acc_minus_dense"].value == pytest.approx(0.05) and nv["compressed.spearman"].resamples == "subsets"


def test_the_transfer_matrix_counts_the_transfers_at_or_below_native_and_the_sources_worse_than_the_window():
    a = as_record("transfer-a-k20.json", {**_report(**{"from-b": {"kl": 0.08}, "as-is-b": {"kl": 0.4}}), "task": "a"})
    b = as_record("transfer-b-k20.json", {**_report(**{"from-a": {"kl": 0.15}, "as-is-a": {"kl": 0.2},
                                                       "from-c": {"kl": 0.1}}), "task": "b"})
    m = transfer_matrix([a, b])
    assert (m["transfers"].value, m["at_or_below"].value, m["at_or_below"].n) == (3, 2, 3)  # b from c: a tie is at
    assert m["above_min"].value == m["above_max"].value == pytest.approx(0.05) and m["above_max"].n == 1
    assert (m["as_is"].value, m["as_is_worse"].value) == (2, 1)  # a's as-is-b: 0.4 over its window's 0.3
    assert m.config["met_into"] == ["a"]  # b has a transfer above its own compressor's KL
    assert m.config["tasks"] == ["a", "b"] and (m.config["subsets"], m.config["queries"]) == (10, 4)
    assert m["a.from-b.kl"].value == 0.08 and m["b.compressed.kl"].value == 0.1
    assert m["above_max"].interval is None and "transfer-b-k20.json: process" in m.provenance


def _lc_row(path, kl, lo, hi, mib=6.5):
    return {"path": path, "kl": kl, "spearman": (lo + hi) / 2, "spearman_ci95": [lo, hi], "cache_mib": mib,
            "flops_vs_dense": 0.5, "slots": 36, "rel_logit_err": kl}


def test_a_long_context_record_ranges_over_its_ks_and_says_whether_the_intervals_overlap():
    results = [{"task": "t", "k": k, "subsets": 12, "rows": [_lc_row("dense", 0.0, 1.0, 1.0, mib),
                                                             _lc_row("compressed", kl, 0.1, 0.5),
                                                             _lc_row("window", 0.3, lo, lo + 0.3)]}
               for k, kl, mib, lo in ((75, 0.05, 110.0, 0.4), (50, 0.04, 75.0, 0.6))]
    r = as_record("long-context-t-k50-k75.json", {"results": results, "subsets": 12, "queries": 8,
                                                  "provenance": PROV})
    assert r.config["ks"] == [50, 75] and r.config["paths"] == ["dense", "compressed", "window"]
    assert (r["compressed.kl_min"].value, r["compressed.kl_max"].value) == (0.04, 0.05)
    assert r["dense.cache_mib_max"].value == 110.0
    spearman = r["k75.window.spearman"]
    assert spearman.interval == pytest.approx((0.4, 0.7)) and spearman.resamples == "subsets and queries"
    assert r["spearman_intervals_overlap"].value == 0.0  # at k = 50 the window's [0.6, 0.9] misses [0.1, 0.5]


def test_a_length_record_and_the_per_query_runs():
    rows = [{"k": 50, "prompt_tokens": 1700.0, "in_context": True, "subsets": 3, "kl": 0.04, "rel_logit_err": 0.1,
             "compressed": {"flops": 9e10, "seconds": 1.6, "accuracy": 0.6}, "dense": {"flops": 5e11}},
            {"k": 1000, "prompt_tokens": 33741.0, "in_context": False, "subsets": 3,
             "compressed": {"flops": 1.5e11, "seconds": 21.0, "accuracy": 0.8}}]
    r = as_record("length-t.json", {"trained_k": 50, "context": 8192, "rows": rows, "provenance": PROV})
    assert r.config["ks_in_context"] == [50] and r.config["ks_past_context"] == [1000]
    assert (r["compressed.flops_min"].value, r["compressed.flops_max"].value) == (9e10, 1.5e11)
    assert r["kl_max"].value == 0.04 and r["kl_max"].n == 1 and r["prompt_tokens_max"].value == 33741.0
    assert "k1000.kl" not in r.metrics and r["k1000.in_context"].value == 0.0
    run = lambda m, seed, acc: {"method": f"{m} (per query)", "seed": seed, "test_accuracy": acc,  # noqa: E731
                                "answer_flops": 1e13 * (seed + 1), "answer_seconds": 100 + seed, "test_size": 150,
                                "provenance": PROV}
    runs = per_query([run("bm25", 1, 0.7), run("bm25", 0, 0.6), run("topk", 0, 0.5)], "per-query-t.json")
    assert runs.config["methods"] == ["bm25", "topk"] and runs.config["test_size"] == 150
    assert runs["bm25.accuracy"].value == pytest.approx(0.65) and runs["bm25.accuracy"].n == 2
    assert runs["bm25.accuracy_sd"].value == pytest.approx(0.0707106781) and runs["topk.accuracy_sd"].value == 0.0
    assert (runs["answer_flops_min"].value, runs["answer_seconds_max"].value) == (1e13, 101)

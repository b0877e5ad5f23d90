"""The fidelity check that decides whether affinity selects on compressed caches."""

import pytest

from icl_ssm.evaluate.gate import fidelity_gate, paired_accuracy_gap


def report(rho=0.7, ci=(0.4, 0.85), window=(0.3, (0.1, 0.6)), acc_c=None, acc_d=None):
    acc_c = [0.5] * 10 if acc_c is None else acc_c
    acc_d = [0.5] * 10 if acc_d is None else acc_d
    r = {"subset_loss_spearman": rho, "subset_loss_spearman_ci95": list(ci),
         "acc_compressed": sum(acc_c) / len(acc_c), "acc_dense": sum(acc_d) / len(acc_d),
         "per_subset": {"acc": {"compressed": acc_c, "dense": acc_d}}, "paired": {}}
    if window is not None:
        r["paired"]["compressed-window"] = {"diff": window[0], "ci95": list(window[1])}
    return r


def test_a_faithful_compressor_passes():
    gate = fidelity_gate(report())
    assert gate["evaluator"] == "compressed" and gate["reason"] is None
    assert [c["passed"] for c in gate["checks"]] == [True, True, True]


def test_each_failed_check_sends_affinity_to_dense_caches_with_its_numbers():
    gate = fidelity_gate(report(rho=-0.01, ci=(-0.4, 0.35)))
    assert gate["evaluator"] == "dense"
    assert "ranks held-out subsets: no, subset-loss Spearman against the dense prompt -0.010 (95% CI " \
           "[-0.400, +0.350])" in gate["reason"]
    gate = fidelity_gate(report(window=(-0.18, (-0.3, -0.05))))
    assert gate["evaluator"] == "dense" and "ranks at least as well as the window: no" in gate["reason"]
    held_out_model = report(acc_c=[0.5, 0.25, 0.75, 0.5, 0.5] * 6, acc_d=[1.0, 0.75, 1.0, 1.0, 0.75] * 6)
    gate = fidelity_gate(held_out_model)
    assert gate["evaluator"] == "dense"
    assert "answers like the dense prompt: no, accuracy 0.500 against the dense prompt's 0.900: -0.400" \
        in gate["reason"]


def test_a_small_accuracy_loss_within_the_allowed_drop_passes():
    acc_c, acc_d = [0.5, 0.75, 0.5, 0.5] * 8, [0.5, 0.75, 0.75, 0.5] * 8  # 6 points lower, surely
    assert fidelity_gate(report(acc_c=acc_c, acc_d=acc_d), max_accuracy_drop=0.1)["evaluator"] == "compressed"
    assert fidelity_gate(report(acc_c=acc_c, acc_d=acc_d), max_accuracy_drop=0.0)["evaluator"] == "dense"


def test_missing_numbers_do_not_fail_the_gate():
    gate = fidelity_gate(report(ci=(None, None), window=None, acc_c=[1.0, 0.0], acc_d=[1.0, 1.0]))
    assert gate["evaluator"] == "compressed" and [c["passed"] for c in gate["checks"]] == [None, None, None]
    with pytest.raises(ValueError, match=r"max_accuracy_drop=1.5; expected a share in \[0, 1\)"):
        fidelity_gate(report(), max_accuracy_drop=1.5)


def test_paired_accuracy_gap_is_paired():
    gap, (lo, hi) = paired_accuracy_gap({"a": [0.2, 0.9, 0.5, 0.4], "b": [0.1, 0.8, 0.4, 0.3]}, "a", "b")
    assert gap == pytest.approx(0.1) and lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
    assert paired_accuracy_gap({"a": [1.0, None, 0.0, 1.0], "b": [0.0, 1.0, None, 1.0]}, "a", "b") is None
    assert paired_accuracy_gap({"a": [1.0]}, "a", "b") is None

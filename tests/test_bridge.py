"""BRIDGE's optimisation step: the GP surrogate, expected improvement, and the search on planted
subset losses and through ``icl-ssm select``."""

import json

import numpy as np
import pytest
from scipy.stats import norm
from test_select_cli import args, files, run_json  # noqa: F401  (the module fixture and helpers)

from icl_ssm.data.tasks import Example
from icl_ssm.select.base import SELECTORS
from icl_ssm.select.bridge import BridgeSelector, expected_improvement, fit_gp, membership, proposals
from icl_ssm.select.subset_losses import OracleEvaluator

POOL = [Example(str(i), f"x{i}", "a") for i in range(30)]
PLANTED = [3, 7, 11, 19, 25]


def planted_loss(subset):
    return -float(np.isin(subset, PLANTED).sum())  # one point lower for each planted member


def test_registered_and_bad_options_refused():
    assert SELECTORS["bridge"] is BridgeSelector
    oracle = OracleEvaluator(planted_loss)
    with pytest.raises(ValueError, match="subsets=1: BRIDGE needs at least 2 subsets"):
        BridgeSelector(oracle, subsets=1)
    with pytest.raises(ValueError, match=r"initial=0.0: expected a share in \(0, 1\]"):
        BridgeSelector(oracle, initial=0.0)
    with pytest.raises(ValueError, match="batch=9, candidates=4: expected 1 <= batch <= candidates"):
        BridgeSelector(oracle, batch=9, candidates=4)


def test_bayesian_optimisation_climbs_past_its_random_start_on_planted_losses():
    """Over 5 seeds, 30 random subsets of 5 from 30 find at most 3 of the 5 planted candidates;
    30 more proposed by expected improvement find at least 4, and the GP's importance ranks
    every planted candidate above every other."""
    for seed in range(5):
        sel = BridgeSelector(OracleEvaluator(planted_loss), subsets=60).select(POOL, POOL[:2], 5,
                                                                                np.random.default_rng(seed))
        assert sel.subsets == 60 and len(sel.details["subset_losses"]) == 60 and sel.details["subsets_random"] == 30
        assert sel.details["best_random_loss"] >= -3 and sel.details["pick_loss"] <= -4
        assert sel.details["bo_improved"] and len(set(sel.indices)) == 5
        assert planted_loss(sel.indices) == sel.details["pick_loss"]
        others = np.delete(sel.scores, PLANTED)
        assert sel.scores[PLANTED].min() > others.max()
        assert list(sel.indices) == sorted(sel.indices, key=lambda i: (sel.scores[i], i))  # best last


def test_gp_mean_gradient_matches_finite_differences_and_ei_matches_the_normal_formula():
    rng = np.random.default_rng(0)
    subsets = [rng.choice(12, size=4, replace=False) for _ in range(15)]
    y = np.array([planted_loss(s) for s in subsets]) + 0.1 * rng.normal(size=15)
    gp = fit_gp(membership(subsets, 12), y, 4)
    x = membership([subsets[0]], 12)[0]
    h, numeric = 1e-6, np.zeros(12)
    for j in range(12):
        up, down = x.copy(), x.copy()
        up[j] += h
        down[j] -= h
        numeric[j] = (gp.predict(up[None])[0][0] - gp.predict(down[None])[0][0]) / (2 * h)
    np.testing.assert_allclose(gp.mean_gradient(x), numeric, rtol=1e-4, atol=1e-7)
    mean, std = np.array([0.0, 1.0, -2.0]), np.array([0.5, 1.0, 2.0])
    z = (-0.5 - mean) / std
    np.testing.assert_allclose(expected_improvement(mean, std, -0.5), (-0.5 - mean) * norm.cdf(z) + std * norm.pdf(z))


def test_proposals_are_new_k_subsets():
    rng = np.random.default_rng(1)
    scored = [tuple(sorted(rng.choice(10, size=3, replace=False).tolist())) for _ in range(6)]
    out = proposals(scored, np.arange(6.0), 10, 3, 40, rng)
    assert out and len(out) == len(set(out)) and not set(out) & set(scored)
    assert all(len(set(s)) == 3 and all(0 <= i < 10 for i in s) for s in out)
    assert proposals([(0, 1, 2)], np.zeros(1), 3, 3, 5, rng) == []  # the only 3-subset of 3 is scored


def test_bridge_through_the_command_on_compressed_caches(files, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "bridge"
    summary = run_json(capsys, *args(files, "--method", "bridge", "--compressor", files["comp"], "--subsets", "12",
                                     "--out", str(out)))
    assert summary["method"] == "bridge" and summary["evaluator"] == "compressed" and summary["subsets"] == 12
    assert len(set(summary["indices"])) == 3 and summary["flops"] > 0
    assert json.loads((out / "summary.json").read_text())["indices"] == summary["indices"]
    dense = run_json(capsys, *args(files, "--method", "bridge", "--evaluator", "dense", "--subsets", "12"))
    assert dense["evaluator"] == "dense" and dense["subsets"] == 12

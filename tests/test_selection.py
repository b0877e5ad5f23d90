"""Selection (Algorithm 2): sampling, the mean and ridge estimators, evaluators, affinity.

The oracle tests plant known good demonstrations in a loss that is an exact function of the
subset; the model tests use a tiny random Llama and a small generated task.
"""

import json
import math
from itertools import groupby

import numpy as np
import pytest
import torch
from helpers import qa_task

from icl_ssm.compress import pretrained as pretrained_mod
from icl_ssm.compress.builders import CompressedCache, DenseCache, cache_for
from icl_ssm.compress.cache import compress_demonstrations, dense_cache
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.compress.generate import generate_with_prefix
from icl_ssm.compress.pretrained import find_pretrained, load_pretrained
from icl_ssm.cost import ShapeFlops
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.evaluate.answers import evaluate_prefixes, pad_right
from icl_ssm.evaluate.stats import (
    label_weights,
    queries_for_reliability,
    spearman,
    spearman_brown,
    split_half_spearman,
)
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer
from icl_ssm.select.affinity import AffinitySelector
from icl_ssm.select.base import (
    SELECTORS,
    Hooks,
    Selection,
    arrange,
    order_rng,
    per_label,
    top_k,
    top_k_per_label,
    top_k_per_label_ref,
)
from icl_ssm.select.estimators import indicator, mean_affinity, ridge_fit, ridge_fit_ref
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm.select.order import search_order
from icl_ssm.select.random_k import RandomSelector
from icl_ssm.select.sampling import balanced_subsets, focused_subsets, stratified_subsets, subsets_for
from icl_ssm.select.subset_losses import (
    RELIABILITY_TARGET,
    CacheEvaluator,
    OracleEvaluator,
    PerQueryDenseEvaluator,
    SubsetLosses,
    query_labels,
    reliability,
    split_half,
)

SMALL = dict(state_size=16, num_virtual=4, num_sink=2, latent_size=8)


def pool_of(n):
    return [Example(str(i), f"text {i}", "heads") for i in range(n)]


VAL = [Example("v", "query", "heads")]


def planted(n, good, effect=1.0, noise=0.0, seed=0):
    """A loss where each planted candidate lowers the subset's loss by ``effect``."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0, 0.05, n)  # small per-candidate effects everywhere else

    def loss(subset):
        return float(sum(base[i] - (effect if i in good else 0.0) for i in subset) + noise * rng.normal())

    return loss


# ----------------------------------------------------------------------------- sampling


def test_balanced_subsets_cover_evenly_and_are_deterministic():
    rng = np.random.default_rng(0)
    subs = balanced_subsets(50, 7, 40, rng)
    assert all(len(s) == 7 == len(set(s)) for s in subs)
    counts = indicator(subs, 50).sum(0)
    assert counts.max() - counts.min() <= 2
    assert abs(counts.mean() - 40 * 7 / 50) < 1e-9
    assert subs == balanced_subsets(50, 7, 40, np.random.default_rng(0))
    assert subs != balanced_subsets(50, 7, 40, np.random.default_rng(1))


def test_focused_subsets_take_half_from_focus():
    rng = np.random.default_rng(0)
    focus = [3, 4, 5, 6]
    subs = focused_subsets(30, 6, 20, focus, rng)
    for s in subs:
        assert len(s) == 6 == len(set(s))
        assert len(set(s) & set(focus)) >= 3


def labelled_pool(counts):
    """A pool with ``counts[y]`` candidates of each label ``y``, labels in runs."""
    labels = [y for y, c in counts.items() for _ in range(c)]
    return [Example(str(i), f"text {i}", y) for i, y in enumerate(labels)], labels


def test_stratified_subsets_hold_the_label_shares():
    pool, labels = labelled_pool({"a": 20, "b": 10, "c": 6})
    subs = stratified_subsets(labels, 7, 60, np.random.default_rng(0))
    extra = dict.fromkeys("abc", 0)
    for s in subs:
        assert len(s) == 7 == len(set(s))
        shares = {y: sum(labels[i] == y for i in s) for y in "abc"}
        assert sorted(shares.values()) == [2, 2, 3]  # 7 // 3 each, the place left over to one label
        extra[max(shares, key=shares.get)] += 1
    assert max(extra.values()) - min(extra.values()) <= 1  # the odd place goes round the labels
    counts = indicator(subs, len(labels)).sum(0)
    for y in "abc":  # each label's candidates appear evenly (their own balanced stream)
        c = counts[[i for i in range(len(labels)) if labels[i] == y]]
        assert c.max() - c.min() <= 2
    assert any(labels[s[0]] != "a" for s in subs) and any(labels[s[0]] == "a" for s in subs)  # shuffled
    assert subs == stratified_subsets(labels, 7, 60, np.random.default_rng(0))
    assert subs[:10] == stratified_subsets(labels, 7, 10, np.random.default_rng(0))  # budgets cut one stream
    assert subs != stratified_subsets(labels, 7, 60, np.random.default_rng(1))
    focus = [0, 1, 20, 30]
    for s in stratified_subsets(labels, 6, 30, np.random.default_rng(0), focus=focus):
        assert len(s) == 6 == len(set(s)) and sorted(labels[i] for i in s) == ["a", "a", "b", "b", "c", "c"]
        assert {0, 1} & set(s) and 20 in s and 30 in s  # half of each label's places from its focus
    with pytest.raises(ValueError, match="at most k=2 distinct labels; the candidates have 3"):
        stratified_subsets(labels, 2, 5, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"need 4 candidates of each label; these labels have fewer: \{'c': 3\}"):
        stratified_subsets(labels[:33], 10, 5, np.random.default_rng(0))


def test_stratified_affinity_finds_the_best_of_each_label_under_a_label_share_effect():
    """The loss grows with how far a subset leans to one label (not additive: as a small
    model's answers pulled toward its prompt's majority label), and 2 planted candidates of
    each label lower it. Uniform subsets carry the lean as noise on every candidate's score;
    stratified ones hold it fixed and find the planted candidates exactly."""
    pool, labels = labelled_pool({"a": 20, "b": 20})
    good = {3, 11, 25, 36}

    def loss(subset):
        lean = abs(sum(1 if labels[i] == "a" else -1 for i in subset))
        return float(1.5 * lean - sum(i in good for i in subset))

    for estimator in ("mean", "ridge"):
        plain = AffinitySelector(OracleEvaluator(loss), subsets=80, estimator=estimator).select(
            pool, VAL, 4, np.random.default_rng(0))
        assert len(good & set(plain.indices)) <= 2
        sel = AffinitySelector(OracleEvaluator(loss), subsets=80, estimator=estimator, stratify=True).select(
            pool, VAL, 4, np.random.default_rng(0))
        assert set(sel.indices) == good and sel.details["stratified"] is True
        assert list(sel.scores[sel.indices]) == sorted(sel.scores[sel.indices])  # best last
    sel = AffinitySelector(OracleEvaluator(loss), subsets=80, adaptive=0.5, stratify=True).select(
        pool, VAL, 4, np.random.default_rng(0))
    assert set(sel.indices) == good and sel.details["rounds"] == [40, 40]
    # coverage counts per label: 20 candidates of a label, 2 places each -> 10 subsets
    lean, lean_labels = labelled_pool({"a": 30, "b": 10})
    with pytest.raises(ValueError, match="use --subsets >= 15"):
        AffinitySelector(OracleEvaluator(loss), subsets=14, stratify=True).select(
            lean, VAL, 4, np.random.default_rng(0))
    sel = AffinitySelector(OracleEvaluator(lambda s: float(len(s))), subsets=15, stratify=True).select(
        lean, VAL, 4, np.random.default_rng(0))
    assert sel.details["min_coverage"] >= 1 and sorted(lean_labels[i] for i in sel.indices) == ["a", "a", "b", "b"]


def test_subsets_for_formula():
    assert subsets_for(1500, 20, 0.5) == 300
    assert subsets_for(100, 10, 1.0) == 10
    with pytest.raises(ValueError, match="eps"):
        subsets_for(10, 2, 0.0)


# ----------------------------------------------------------------------------- estimators


def test_ridge_fit_matches_leave_one_out_reference():
    rng = np.random.default_rng(0)
    subs = balanced_subsets(12, 4, 30, rng)
    X = indicator(subs, 12)
    y = X @ rng.normal(size=12) + 0.1 * rng.normal(size=30)
    alphas = [0.01, 0.3, 3.0, 30.0]
    w, a, loo = ridge_fit(X, y, alphas)
    w_ref, a_ref, loo_ref = ridge_fit_ref(X, y, alphas)
    np.testing.assert_allclose(loo, loo_ref, rtol=1e-8)
    assert a == a_ref
    np.testing.assert_allclose(w, w_ref, rtol=1e-7, atol=1e-10)


def test_mean_affinity_is_minus_mean_of_containing_subsets():
    subs = [[0, 1], [1, 2], [0, 2]]
    losses = np.array([1.0, 2.0, 4.0])
    scores, se = mean_affinity(subs, losses, 4)
    np.testing.assert_allclose(scores[:3], [-2.5, -1.5, -3.0])
    assert np.isnan(scores[3])  # never sampled
    np.testing.assert_allclose(se[0], np.std([1.0, 4.0], ddof=1) / np.sqrt(2))


@pytest.mark.parametrize("estimator", ["mean", "ridge"])
def test_affinity_recovers_planted_demonstrations(estimator):
    n, k, good = 40, 4, {5, 17, 23, 31}
    selector = AffinitySelector(OracleEvaluator(planted(n, good, noise=0.3)), subsets=120, estimator=estimator)
    sel = selector.select(pool_of(n), VAL, k, np.random.default_rng(0))
    assert set(sel.indices) == good
    assert sel.subsets == 120 and sel.unseen == []
    assert sel.details["min_coverage"] >= 1
    # prompt order: ascending score, the best last
    assert list(sel.scores[sel.indices]) == sorted(sel.scores[sel.indices])


def test_ridge_needs_fewer_subsets_than_mean_on_a_noisy_oracle():
    """Counting planted hits over seeds at a small budget: ridge accounts for the company."""
    n, k, good = 60, 6, set(range(0, 60, 10))
    hits = {"mean": 0, "ridge": 0}
    for seed in range(6):
        fn = planted(n, good, effect=0.5, noise=0.2, seed=seed)
        for est in hits:
            sel = AffinitySelector(OracleEvaluator(fn), subsets=60, estimator=est).select(
                pool_of(n), VAL, k, np.random.default_rng(seed))
            hits[est] += len(set(sel.indices) & good)
    assert hits["ridge"] > hits["mean"]


def test_adaptive_second_round_spends_on_the_boundary():
    n, k, good = 40, 4, {1, 2, 3, 4}
    sel = AffinitySelector(OracleEvaluator(planted(n, good, noise=0.3)), subsets=100, adaptive=0.5).select(
        pool_of(n), VAL, k, np.random.default_rng(0))
    assert sel.subsets == 100
    assert set(sel.indices) == good
    assert sel.details["rounds"] == [50, 50]
    focus = sel.details["focus"]
    assert 2 * k <= len(focus) < n  # the uncertain ones, not everyone
    assert len(sel.details["subset_losses"]) == 100


def test_same_seed_same_selection_and_k_equals_n():
    fn = planted(20, {1, 2})
    a = AffinitySelector(OracleEvaluator(fn), subsets=30).select(pool_of(20), VAL, 3, np.random.default_rng(7))
    b = AffinitySelector(OracleEvaluator(fn), subsets=30).select(pool_of(20), VAL, 3, np.random.default_rng(7))
    assert a.indices == b.indices
    np.testing.assert_array_equal(a.scores, b.scores)
    whole = AffinitySelector(OracleEvaluator(fn)).select(pool_of(5), VAL, 5, np.random.default_rng(0))
    assert sorted(whole.indices) == list(range(5))


def test_coverage_and_bad_input():
    fn = planted(30, {1})
    with pytest.raises(ValueError, match="--subsets >= 15"):
        AffinitySelector(OracleEvaluator(fn), subsets=10, coverage=2).select(
            pool_of(30), VAL, 4, np.random.default_rng(0))
    sel = AffinitySelector(OracleEvaluator(fn), subsets=15, coverage=2).select(
        pool_of(30), VAL, 4, np.random.default_rng(0))
    assert sel.details["min_coverage"] >= 1
    # coverage 0 allows unseen candidates: reported, never ranked
    sel = AffinitySelector(OracleEvaluator(fn), subsets=2, coverage=0).select(
        pool_of(30), VAL, 4, np.random.default_rng(0))
    assert len(sel.unseen) == 30 - 8
    assert not set(sel.unseen) & set(sel.indices)
    assert np.isnan(sel.scores[sel.unseen]).all()
    with pytest.raises(ValueError, match="k=0"):
        RandomSelector().select(pool_of(5), VAL, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="only 5 candidates"):
        RandomSelector().select(pool_of(5), VAL, 6, np.random.default_rng(0))
    with pytest.raises(ValueError, match="duplicate ids"):
        RandomSelector().select(pool_of(3) + pool_of(1), VAL, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="validation set is empty"):
        RandomSelector().select(pool_of(5), [], 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="estimator"):
        AffinitySelector(OracleEvaluator(fn), estimator="median")


def test_top_k_orders_best_last_and_skips_nan():
    scores = np.array([0.1, np.nan, 0.5, 0.3, 0.5])
    assert top_k(scores, 3) == [3, 4, 2]
    with pytest.raises(ValueError, match="only 4 candidates have a score"):
        top_k(scores, 5)


def test_top_k_per_label_matches_the_enumeration():
    rng = np.random.default_rng(0)
    for trial in range(60):
        n = int(rng.integers(3, 10))
        labels = [str(y) for y in rng.integers(0, int(rng.integers(1, 4)), size=n)]
        k = int(rng.integers(max(1, len(set(labels))), n + 1))
        scores = rng.normal(size=n)
        scores[rng.random(n) < 0.2] = np.nan  # unseen candidates are never chosen
        if np.isfinite(scores).sum() < k:
            continue
        fast = top_k_per_label(scores, labels, k)
        assert fast == top_k_per_label_ref(scores, labels, k), trial
        assert all(np.isfinite(scores[fast])) and list(scores[fast]) == sorted(scores[fast])  # best last
    # a pool leaning 6:2 to one label whose best scores are all "a": the plain top 4 is all "a"
    scores = np.array([9.0, 8, 7, 6, 5, 4, 1, 0])
    labels = ["a"] * 6 + ["b"] * 2
    assert top_k(scores, 4) == [3, 2, 1, 0]
    assert top_k_per_label(scores, labels, 4) == [7, 6, 1, 0]
    assert top_k_per_label(scores, labels, 5) == [7, 6, 2, 1, 0]  # the odd place: the best of the rest
    one_b = np.array([9.0, 8, 7, 6, 5, 4, np.nan, 0])
    assert top_k_per_label(one_b, labels, 4) == [7, 2, 1, 0]  # "b" has one scored candidate for 2 places
    with pytest.raises(ValueError, match="at most k=2 distinct labels; the candidates have 3"):
        top_k_per_label(scores[:3], ["a", "b", "c"], 2)
    with pytest.raises(ValueError, match="3 labels for 8 scores"):
        top_k_per_label(scores, labels[:3], 2)
    sel = Selection("random", top_k(scores, 4), scores, details={"x": 1})
    pool = [Example(str(i), "", y) for i, y in enumerate(labels)]
    again = per_label(sel, pool)
    assert again.indices == [7, 6, 1, 0] and again.details == {"x": 1, "per_label": True}
    assert sel.indices == [3, 2, 1, 0]  # the original selection is left as it was


def test_arrange_spreads_each_label_and_keeps_the_better_ones_later():
    idx, labels = list(range(10)), ["neg"] * 3 + ["pos"] * 7  # ascending score: 9 is the best
    assert arrange(idx, labels, "score", np.random.default_rng(0)) == idx
    mixed = arrange(idx, labels, "interleave", np.random.default_rng(0))
    assert sorted(mixed) == idx and mixed == [3, 0, 4, 5, 1, 6, 7, 8, 2, 9]
    by_label = {y: [i for i in mixed if labels[i] == y] for y in ("neg", "pos")}
    assert by_label == {"neg": [0, 1, 2], "pos": [3, 4, 5, 6, 7, 8, 9]}  # within a label: ascending score
    assert max(len(list(run)) for _, run in groupby(labels[i] for i in mixed)) == 3  # 7 pos among 3 neg
    assert arrange(idx, [str(i) for i in idx], "interleave", np.random.default_rng(0)) == idx  # no label repeats
    shuffled = arrange(idx, labels, "random", np.random.default_rng(0))
    assert sorted(shuffled) == idx and shuffled != idx
    assert shuffled == arrange(idx, labels, "random", np.random.default_rng(0))
    with pytest.raises(ValueError, match="order 'best'; accepted: score, interleave, random"):
        arrange(idx, labels, "best", np.random.default_rng(0))
    with pytest.raises(ValueError, match="9 labels for 10 demonstrations"):
        arrange(idx, labels[:9], "interleave", np.random.default_rng(0))


def test_search_order_keeps_the_candidate_order_with_the_lowest_loss():
    idx, labels = list(range(6)), ["neg", "pos"] * 3
    # an order-sensitive oracle: the loss is where demonstration 0 sits (first is best)
    oracle = OracleEvaluator(lambda s: s.index(0))
    best, details = search_order(oracle, pool_of(6), VAL, idx, labels, 6, order_rng(4))
    names = [c["order"] for c in details["candidates"]]
    assert names == ["score", "interleave"] + ["random"] * 4
    losses = [c["validation_loss"] for c in details["candidates"]]
    assert best == details["candidates"][details["chosen"]]["indices"] and best.index(0) == min(losses)
    assert details["chosen"] == losses.index(min(losses))  # the first of equal losses
    assert details["candidates"][0]["indices"] == idx and sorted(best) == idx
    # the first random candidate is `--order random`'s
    assert details["candidates"][2]["indices"] == arrange(idx, labels, "random", order_rng(4))
    with pytest.raises(ValueError, match="order candidates=1; expected >= 2"):
        search_order(oracle, pool_of(6), VAL, idx, labels, 1, order_rng(4))


def test_random_selector_is_seeded():
    a = RandomSelector().select(pool_of(30), VAL, 5, np.random.default_rng(3))
    b = RandomSelector().select(pool_of(30), VAL, 5, np.random.default_rng(3))
    assert a.indices == b.indices and len(set(a.indices)) == 5
    assert "random" in SELECTORS and "affinity" in SELECTORS


# ----------------------------------------------------------------------------- model evaluators


@pytest.fixture(scope="module")
def setup():
    model, tok = tiny_model("llama"), tiny_tokenizer()
    task = get_task("coin_flip", size=120)
    splits = split(task, seed=0)
    builder = PromptBuilder(tok, task)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        comp = SSMCompressor(SSMCompressorConfig.for_teacher(model.config, **SMALL)).eval()
    return model, builder, splits, comp


def test_batched_evaluation_equals_one_at_a_time(setup):
    model, builder, splits, comp = setup
    pool, val = splits.pool[:20], splits.validation[:3]
    subs = balanced_subsets(20, 3, 5, np.random.default_rng(0))
    for cache in (CompressedCache(model, comp), DenseCache(model)):
        batched = CacheEvaluator(model, builder, cache, batch=5, query_batch=7).evaluate(pool, val, subs)
        single = CacheEvaluator(model, builder, cache, batch=1, query_batch=1).evaluate(pool, val, subs)
        packed = CacheEvaluator(model, builder, cache, batch=5, query_batch=7, pack=True).evaluate(
            pool, val, subs)
        np.testing.assert_allclose(batched.losses, single.losses, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(packed.losses, single.losses, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(packed.query_losses, single.query_losses, rtol=1e-4, atol=1e-5)
        assert batched.cost.flops > 0 and batched.tokens > 0 and packed.tokens == batched.tokens
    per_query = PerQueryDenseEvaluator(model, builder, batch=2).evaluate(pool, val, subs)
    dense = CacheEvaluator(model, builder, DenseCache(model)).evaluate(pool, val, subs)
    np.testing.assert_allclose(per_query.losses, dense.losses, rtol=1e-4, atol=1e-5)
    assert per_query.tokens > dense.tokens  # the prompt is re-read for every query


def test_split_half_reads_the_per_query_losses():
    rng = np.random.default_rng(0)
    effect = np.linspace(0, 1, 12)[:, None]  # (subsets, 1): the subsets differ, every query sees it
    steady = SubsetLosses(np.zeros(12), query_losses=effect + 0.01 * rng.normal(size=(12, 8)))
    assert split_half(steady) > 0.95
    # the even queries rank the subsets one way and the odd ones the other: no reliability at all
    torn = np.concatenate([effect, -effect], 1).repeat(4, 1)[:, [0, 4, 1, 5, 2, 6, 3, 7]]
    assert split_half(SubsetLosses(np.zeros(12), query_losses=torn)) == pytest.approx(-1.0)
    # six queries of label 0 see the subsets' effect, two of label 1 the opposite: the plain halves
    # (3 + 1 queries each) both follow label 0, the label-balanced halves weigh the two alike
    labels = np.array([0, 0, 0, 0, 0, 0, 1, 1])
    mixed = np.where(labels == 0, effect, -effect) + 0.01 * rng.normal(size=(12, 8))
    assert split_half(SubsetLosses(np.zeros(12), query_losses=mixed)) > 0.9
    balanced = SubsetLosses(np.zeros(12), query_losses=mixed, query_labels=labels)
    assert split_half(balanced) == split_half_spearman(mixed, labels) < 0.9
    assert np.isnan(split_half(SubsetLosses(np.zeros(12))))  # an oracle has no per-query losses
    assert np.isnan(split_half(SubsetLosses(np.zeros(2), query_losses=np.ones((2, 4)))))


def test_sampled_flops_stay_close_to_flops_counted_on_every_batch(setup):
    """CacheEvaluator(flops="sample") counts a few batches and interpolates the rest by padded
    length; its total is within 1% of counting every batch (the reference), on both caches and
    query paths, and equal where every batch was counted."""
    model, builder, splits, comp = setup
    pool, val = splits.pool[:30], splits.validation[:3]
    rng = np.random.default_rng(1)
    subs = [sorted(rng.choice(30, size=int(rng.integers(1, 6)), replace=False).tolist()) for _ in range(30)]
    for cache in (CompressedCache(model, comp), DenseCache(model)):
        for pack in (True, False):
            counted = CacheEvaluator(model, builder, cache, batch=3, pack=pack, flops="count").evaluate(
                pool, val, subs)
            ev = CacheEvaluator(model, builder, cache, batch=3, pack=pack)
            sampled = ev.evaluate(pool, val, subs)
            [form] = ev._flop_samples.values()
            assert form.estimated > 0 and len(form.counted) + form.estimated == 10  # some batches uncounted
            assert sampled.cost.flops == pytest.approx(counted.cost.flops, rel=0.01)
            np.testing.assert_allclose(sampled.losses, counted.losses, rtol=1e-5)
            few = CacheEvaluator(model, builder, cache, batch=3, pack=pack).evaluate(pool, val, subs[:9])
            assert few.cost.flops == CacheEvaluator(model, builder, cache, batch=3, pack=pack,
                                                    flops="count").evaluate(pool, val, subs[:9]).cost.flops
    assert CacheEvaluator(model, builder, DenseCache(model), flops="off").evaluate(pool, val, subs[:2]).cost.flops == 0
    with pytest.raises(ValueError, match="flops='every'; accepted: sample, count, off"):
        CacheEvaluator(model, builder, DenseCache(model), flops="every")


def test_shape_flops_counts_new_lengths_and_interpolates_between_them():
    flops = ShapeFlops(sample=3)
    truth = lambda b, t: b * (1000 + 30 * t + 2 * t * t)  # noqa: E731
    for b, t in [(2, 10), (3, 40), (1, 20)]:
        assert flops.wants(b, t)
        flops.add(b, t, truth(b, t))
    assert not flops.wants(2, 10) and flops.predict(2, 10) == truth(2, 10) and flops.estimated == 0
    assert not flops.wants(4, 30) and flops.wants(1, 41) and flops.wants(1, 9)  # outside the counted lengths
    per_row = (truth(1, 20) + truth(1, 40)) / 2
    assert flops.predict(4, 30) == round(4 * per_row) and flops.estimated == 1
    with pytest.raises(ValueError, match=r"no FLOPs for B=1, T=41 between counted lengths \[10, 20, 40\]"):
        flops.predict(1, 41)
    with pytest.raises(ValueError, match="sample=0: expected >= 1"):
        ShapeFlops(sample=0)


def test_evaluators_keep_every_query_loss(setup):
    model, builder, splits, comp = setup
    pool, val = splits.pool[:20], splits.validation[:4]
    subs = balanced_subsets(20, 3, 5, np.random.default_rng(0))
    for ev in (CacheEvaluator(model, builder, CompressedCache(model, comp), batch=2),
               CacheEvaluator(model, builder, DenseCache(model), batch=2, balance_labels=True),
               PerQueryDenseEvaluator(model, builder, batch=2, balance_labels=True)):
        out = ev.evaluate(pool, val, subs)
        assert out.query_losses.shape == (5, 4)
        if out.query_labels is None:
            np.testing.assert_allclose(out.query_losses.mean(1), out.losses, rtol=1e-6)
        else:
            assert out.query_labels.tolist() == [builder.label_index(q) for q in val]
            np.testing.assert_allclose(out.query_losses @ label_weights(out.query_labels), out.losses, rtol=1e-6)
    dense = CacheEvaluator(model, builder, DenseCache(model), batch=4)
    sel = AffinitySelector(dense, subsets=12, adaptive=0.25).select(
        pool, val, 4, np.random.default_rng(0))
    assert sel.details["split_half"] is not None and -1 <= sel.details["split_half"] <= 1
    assert sel.details["reliability"] == pytest.approx(spearman_brown(sel.details["split_half"]))
    assert np.array(sel.details["query_losses"]).shape == (sel.subsets, 4)
    oracle = AffinitySelector(OracleEvaluator(lambda s: float(sum(s))), subsets=12).select(
        pool, val, 4, np.random.default_rng(0))
    assert oracle.details["split_half"] is None and oracle.details["queries_needed"] is None


def test_reliability_names_the_queries_a_validation_set_needs():
    half = reliability(0.35, 32)
    assert half["reliability"] == pytest.approx(0.7 / 1.35)
    assert half["queries_needed"] == queries_for_reliability(0.35, 32, RELIABILITY_TARGET) > 32
    assert reliability(-0.1, 32)["queries_needed"] is None
    assert reliability(math.nan, 32) == {"split_half": None, "reliability": None, "queries_needed": None}


def test_label_balanced_subset_losses_weigh_each_label_alike(setup):
    model, builder, splits, comp = setup
    pool = splits.pool[:20]
    gold = [builder.label_index(q) for q in splits.validation]
    first = gold[0]
    # three queries of one label, one of the other: an unbalanced validation set
    val = [q for q, g in zip(splits.validation, gold) if g == first][:3] + \
          [next(q for q, g in zip(splits.validation, gold) if g != first)]
    subs = balanced_subsets(20, 3, 5, np.random.default_rng(0))
    plain = CacheEvaluator(model, builder, DenseCache(model), batch=5)
    balanced = CacheEvaluator(model, builder, DenseCache(model), batch=5, balance_labels=True)
    ids, mask = pad_right([builder.build_prefix([pool[i] for i in s]) for s in subs])
    per_query = evaluate_prefixes(model, builder, dense_cache(model, ids, mask), val).loss.double().numpy()
    want = per_query[:, :3].mean(1) / 2 + per_query[:, 3] / 2
    np.testing.assert_allclose(balanced.evaluate(pool, val, subs).losses, want, rtol=1e-5)
    np.testing.assert_allclose(plain.evaluate(pool, val, subs).losses, per_query.mean(1), rtol=1e-5)
    assert not np.allclose(want, per_query.mean(1))
    reference = PerQueryDenseEvaluator(model, builder, batch=2, balance_labels=True).evaluate(pool, val, subs)
    np.testing.assert_allclose(reference.losses, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="balance_labels needs a classification task"):
        query_labels(PromptBuilder(builder.tokenizer, qa_task()), val, True)


def test_affinity_on_compressed_caches_end_to_end(setup):
    model, builder, splits, comp = setup
    pool, val = splits.pool[:16], splits.validation[:2]
    ticks = []
    selector = AffinitySelector(CacheEvaluator(model, builder, CompressedCache(model, comp), batch=4), subsets=12,
                                  chunk=4, hooks=Hooks(on_progress=ticks.append))
    sel = selector.select(pool, val, 4, np.random.default_rng(0))
    assert len(set(sel.indices)) == 4 and sel.subsets == 12 == sum(ticks)
    assert sel.cost.flops > 0 and np.isfinite(sel.scores).all()
    again = AffinitySelector(CacheEvaluator(model, builder, CompressedCache(model, comp), batch=3), subsets=12).select(
        pool, val, 4, np.random.default_rng(0))
    assert again.indices == sel.indices
    result = evaluate_selection(model, builder, sel.examples(pool), splits.test[:5])
    assert 0.0 <= result["accuracy"] <= 1.0 and result["flops"] > 0
    with pytest.raises(ValueError, match="needs a compressor"):
        cache_for("compressed", model)
    with pytest.raises(TypeError, match="expected a CacheBuilder"):
        CacheEvaluator(model, builder, "compressed")


def test_compress_demonstrations_and_generate(setup):
    model, builder, splits, comp = setup
    prefix = compress_demonstrations(model, comp, builder, splits.pool[:3])
    assert prefix.batch_size == 1 and prefix.length == comp.config.cache_length
    query = torch.tensor([builder.build_suffix(splits.test[0]).input_ids])
    new = generate_with_prefix(model, prefix, query, max_new_tokens=2, do_sample=False)
    assert new.shape == (1, 2)


def test_load_pretrained_names_what_is_shipped():
    from icl_ssm.compress.pretrained import find_pretrained, load_pretrained

    assert find_pretrained("tiny-llama", "coin_flip") is None
    with pytest.raises(ValueError, match="no compressor is shipped for model 'tiny-llama'"):
        load_pretrained("tiny-llama", "coin_flip")


def test_find_pretrained_takes_the_shot_count_nearest_the_one_asked_for(tmp_path, monkeypatch):
    for name, model, task, k in [("a", "m", "t", 20), ("b", "m", "t", 50), ("c", "m", "u", 8), ("d", "n", "t", 45)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "recipe.json").write_text(json.dumps({"model": model, "tasks": [task], "k": k}))
    monkeypatch.setattr(pretrained_mod, "pretrained_root", lambda: tmp_path)
    assert find_pretrained("m", "t") == tmp_path / "a"  # no k: the smallest
    assert find_pretrained("m", "t", 8) == tmp_path / "a"
    assert find_pretrained("m", "t", 35) == tmp_path / "a"  # a tie: the smaller
    assert find_pretrained("m", "t", 36) == tmp_path / "b"
    assert find_pretrained("m", "t", 200) == tmp_path / "b"
    assert find_pretrained("m", "u", 50) == tmp_path / "c" and find_pretrained("m", "v", 20) is None
    with pytest.raises(ValueError, match=r"shipped: m/t/k=20, m/t/k=50, m/u/k=8, n/t/k=45"):
        load_pretrained("x", "t", k=20)


def test_adjusted_estimator_holds_the_label_mix_and_the_ending_fixed():
    """Losses set by a candidate effect plus the subset's label imbalance and its last label:
    the mean estimator's scores follow the labels, the adjusted ones the candidates."""
    from icl_ssm.select.estimators import adjusted_affinity, subset_covariates

    rng = np.random.default_rng(0)
    n, k, M = 60, 8, 600
    labels = ["pos" if i % 3 else "neg" for i in range(n)]  # 2/3 positive
    effect = rng.normal(size=n)  # lower is better
    subsets = [rng.choice(n, k, replace=False).tolist() for _ in range(M)]
    cov = subset_covariates(subsets, labels)
    assert cov.shape == (M, 3) and np.allclose(cov[:, 1], cov[:, 0] ** 2)  # "pos" share, its square, last is "pos"
    share = cov[:, 0]
    losses = np.array([0.3 * effect[s].mean() for s in subsets]) + 4 * (share - 0.5) ** 2 + 0.8 * cov[:, 2]
    losses += 0.02 * rng.normal(size=M)
    adjusted, _ = adjusted_affinity(subsets, losses, n, labels)
    mean, _ = mean_affinity(subsets, losses, n)
    truth = -effect
    assert spearman(adjusted, truth) > 0.8 > spearman(mean, truth) + 0.2
    with pytest.raises(ValueError, match="3 labels for a pool of 60"):
        adjusted_affinity(subsets, losses, n, labels[:3])
    assert subset_covariates([[0, 1]], ["a", "a"]).shape == (1, 0)  # one label: nothing to hold fixed

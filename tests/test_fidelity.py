"""icl-ssm fidelity: the core functions against references, and the command end to end.

Tiny random models only (no download). The command reads a user .jsonl task written from
a small generated coin_flip task, so no test pays for generating the default 2100 examples.
"""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch
from helpers import MULTI_EXAMPLES, QA_EXAMPLES, multi_token_task, qa_task

from icl_ssm.cli import main
from icl_ssm.compress.cache import compressed_cache, dense_cache
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.answers import (
    answer_logits,
    answer_logits_packed,
    answer_logits_ref,
    evaluate_prefixes,
    logit_agreement,
    pad_right,
)
from icl_ssm.evaluate.dense_store import DenseStore, weights_digest
from icl_ssm.evaluate.fidelity_report import fidelity_report
from icl_ssm.evaluate.label_trie import answer_scores
from icl_ssm.evaluate.paths import cache_paths, evaluate_paths, sample_subsets
from icl_ssm.evaluate.stats import (
    bootstrap_spearman,
    interval,
    label_weights,
    paired_spearman,
    pearson,
    queries_for_reliability,
    rankdata,
    spearman,
    spearman_brown,
    spearman_ci,
    split_half_spearman,
    stratified_halves,
)
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import answer_loss, predict_labels, score_labels
from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer

SMALL = dict(state_size=16, num_virtual=4, num_sink=2, latent_size=8)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama"), tiny_tokenizer()


@pytest.fixture(scope="module")
def coin():
    task = get_task("coin_flip", size=120)
    return task, split(task, seed=0)


@pytest.fixture(scope="module")
def files(tmp_path_factory, coin):
    """A .jsonl task, a compressor, a control compressor and one for another teacher."""
    root = tmp_path_factory.mktemp("fidelity")
    task, _ = coin
    data = root / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    teacher = tiny_model("llama").config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        SSMCompressor(SSMCompressorConfig.for_teacher(teacher, **SMALL)).save_pretrained(root / "comp")
        SSMCompressor(SSMCompressorConfig.for_teacher(teacher, control=True, **SMALL)).save_pretrained(root / "ctl")
        other = tiny_model("qwen2").config
        SSMCompressor(SSMCompressorConfig.for_teacher(other, **SMALL)).save_pretrained(root / "qwen")
    return {"data": str(data), "comp": str(root / "comp"), "ctl": str(root / "ctl"), "qwen": str(root / "qwen")}


def run_json(capsys, *argv):
    assert main(["fidelity", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def cli_args(files, *extra):
    return ["--model", "tiny-llama", "--task", files["data"], "--k", "3", "--compressor", files["comp"],
            "--subsets", "5", "--queries", "3", "--batch", "2", "--query-batch", "4", *extra]


# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spearman_matches_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 5, size=40).astype(float)  # many ties
    y = x + rng.integers(0, 3, size=40)
    np.testing.assert_allclose(rankdata(x), scipy.stats.rankdata(x))
    assert spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y).statistic, abs=1e-12)
    assert pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y).statistic, abs=1e-12)


def test_spearman_bootstrap_interval():
    rng = np.random.default_rng(0)
    x = rng.normal(size=30)
    y = x + rng.normal(size=30)  # true rho ~ 0.7
    lo, hi = spearman_ci(x, y)
    assert lo < spearman(x, y) < hi and 0.2 < hi - lo < 0.8
    assert spearman_ci(x, y) == (lo, hi)  # seeded
    x4, y4 = np.tile(x, 4), np.tile(y, 4)  # four times the subsets: about half the width
    lo4, hi4 = spearman_ci(x4, y4)
    assert hi4 - lo4 < 0.7 * (hi - lo)
    assert spearman_ci(x, x) == (1.0, 1.0)
    assert all(math.isnan(v) for v in spearman_ci(np.ones(10), x[:10]))  # a control's constant losses
    with pytest.raises(ValueError, match="level=1.5"):
        spearman_ci(x, y, level=1.5)


def planted_losses(seed, S=30, Q=16, noise=3.0):
    """Per-query losses: a subset effect shared by every path, plus query-by-subset noise."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(size=(S, 1))
    dense = effect + noise * rng.normal(size=(S, Q))
    return dense, effect + noise * rng.normal(size=(S, Q))  # another path: same effect, its own noise


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bootstrap_spearman_pairs_paths_and_resamples_queries(seed):
    dense, other = planted_losses(seed)
    draws = bootstrap_spearman(dense, {"same": dense, "again": dense.copy(), "other": other}, seed=seed)
    assert set(draws) == {"same", "again", "other"} and all(d.shape == (2000,) for d in draws.values())
    np.testing.assert_allclose(draws["same"], 1.0)
    np.testing.assert_array_equal(draws["same"] - draws["again"], 0.0)  # the same draws for every path
    subsets_only = bootstrap_spearman(dense, {"other": other}, queries=False, seed=seed)["other"]
    width = lambda d: np.subtract(*interval(d)[::-1])  # noqa: E731
    # a subset's loss averages 16 noisy queries: which queries were drawn moves the correlation
    assert width(draws["other"]) > 1.15 * width(subsets_only)
    lo, hi = interval(subsets_only)
    assert lo < spearman(dense.mean(1), other.mean(1)) < hi
    again = bootstrap_spearman(dense, {"other": other}, seed=seed)["other"]
    np.testing.assert_array_equal(again, draws["other"])  # seeded
    # one query: resampling queries changes nothing, and the subsets are drawn first
    one = bootstrap_spearman(dense[:, :1], {"o": other[:, :1]}, seed=seed)["o"]
    np.testing.assert_array_equal(one, bootstrap_spearman(dense[:, :1], {"o": other[:, :1]}, queries=False,
                                                            seed=seed)["o"])
    with pytest.raises(ValueError, match=r"losses of 'bad' have shape \(30, 3\)"):
        bootstrap_spearman(dense, {"bad": other[:, :3]})
    with pytest.raises(ValueError, match="needs \\(subsets, queries\\) losses"):
        bootstrap_spearman(dense.mean(1), {})


def test_split_half_spearman_measures_how_far_a_ranking_carries_to_other_queries():
    rng = np.random.default_rng(0)
    effect = rng.normal(size=(40, 1))
    assert split_half_spearman(effect + 0.01 * rng.normal(size=(40, 8))) > 0.99  # queries agree
    assert abs(split_half_spearman(rng.normal(size=(40, 8)))) < 0.35  # no subset effect
    rows = np.c_[np.arange(5.0), -np.arange(5.0)]  # the even query ranks up, the odd one down
    assert split_half_spearman(rows) == pytest.approx(-1.0)
    assert math.isnan(split_half_spearman(np.ones((5, 1))))
    with pytest.raises(ValueError, match="needs \\(subsets, queries\\)"):
        split_half_spearman(np.ones(5))



def test_spearman_brown_projects_the_split_half_to_other_query_counts():
    assert spearman_brown(0.5) == pytest.approx(2 / 3)
    assert spearman_brown(0.35, 4) == pytest.approx(1.4 / 2.05)
    assert math.isnan(spearman_brown(math.nan))
    # the queries it names reach the target when projected back
    n = queries_for_reliability(0.5, 32, 0.8)
    assert n == 64 and spearman_brown(0.5, n / 16) == pytest.approx(0.8)
    assert queries_for_reliability(0.9, 32, 0.8) <= 16  # already there with one half
    assert queries_for_reliability(0.0, 32) is None and queries_for_reliability(-0.2, 32) is None
    with pytest.raises(ValueError, match="target=1.0"):
        queries_for_reliability(0.5, 32, 1.0)
    with pytest.raises(ValueError, match="queries=1"):
        queries_for_reliability(0.5, 1)


def test_spearman_brown_predicts_the_split_half_of_a_larger_query_set():
    """Subsets with an effect of their own and noisy queries (noise set so that 16 queries rank
    400 subsets at about 0.35, as the dense evaluator does at k = 50): the split-half measured on
    32 queries predicts the one measured on 128 (two halves of 64)."""
    rng = np.random.default_rng(0)
    effect = rng.normal(size=(400, 1))
    loss = effect + 5.45 * rng.normal(size=(400, 128))
    small = split_half_spearman(loss[:, :32])
    assert 0.2 < small < 0.5
    assert split_half_spearman(loss) == pytest.approx(spearman_brown(small, 4), abs=0.1)


def label_biased_losses(seed, S=30, Q=24, positive=18):
    """Subsets that shift answers toward one label: queries of that label gain, the others lose.
    Beside it every subset has a quality of its own that helps every query alike."""
    rng = np.random.default_rng(seed)
    labels = np.r_[np.ones(positive, int), np.zeros(Q - positive, int)]
    share, quality = rng.normal(size=(S, 1)), rng.normal(size=(S, 1))
    sign = np.where(labels == 1, -1.0, 1.0)  # a positive shift lowers the loss of positive queries
    return labels, 6.0 * share * sign + quality + 0.3 * rng.normal(size=(S, Q)), quality[:, 0]


@pytest.mark.parametrize("seed", [0, 1])
def test_label_balanced_losses_rank_subsets_by_what_helps_every_label(seed):
    labels, loss, quality = label_biased_losses(seed)
    w = label_weights(labels)
    assert w.sum() == pytest.approx(1.0) and w[labels == 1].sum() == pytest.approx(0.5)
    # the plain mean follows the label mix of the queries drawn (18 of 24 positive): the shift
    assert spearman(loss.mean(1), quality) < 0.6 < spearman(loss @ w, quality)
    assert split_half_spearman(loss, labels) > 0.8
    # even queries mostly of one label, odd ones of the other: the plain halves rank the subsets
    # in opposite orders, the stratified and balanced halves alike
    labels12, loss12, _ = label_biased_losses(seed, positive=12)
    pos, neg = np.flatnonzero(labels12 == 1), np.flatnonzero(labels12 == 0)
    cols = np.empty(24, int)
    cols[0::2], cols[1::2] = np.r_[pos[:10], neg[:2]], np.r_[pos[10:], neg[2:]]
    assert split_half_spearman(loss12[:, cols]) < -0.3 and split_half_spearman(loss12[:, cols],
                                                                                   labels12[cols]) > 0.5
    a, b = stratified_halves(labels)
    assert sorted(np.r_[a, b]) == list(range(24)) and labels[a].sum() == labels[b].sum() == 9
    lo, hi = interval(bootstrap_spearman(loss, {"q": np.broadcast_to(quality[:, None], loss.shape)},
                                             labels=labels)["q"])
    assert 0.6 < lo <= hi
    with pytest.raises(ValueError, match="3 labels for 24 queries"):
        bootstrap_spearman(loss, {}, labels=labels[:3])
    with pytest.raises(ValueError, match="non-empty 1-D array of labels"):
        label_weights([])


def test_interval_leaves_out_undefined_draws():
    assert interval(np.r_[np.arange(101.0), np.nan]) == pytest.approx((2.5, 97.5))
    assert all(math.isnan(v) for v in interval(np.array([np.nan, np.nan])))
    with pytest.raises(ValueError, match="level=0"):
        interval(np.ones(3), level=0)


def test_paired_spearman_compares_trained_paths_with_the_comparators():
    dense, other = planted_losses(0)
    t = lambda x: torch.tensor(x)  # noqa: E731
    rng = np.random.default_rng(9)
    losses = {"dense": t(dense), "compressed": t(dense + 0.5 * rng.normal(size=dense.shape)),
              "control": t(np.ones_like(dense) + 1e-3 * rng.normal(size=dense.shape)), "window": t(other),
              "copy": t(dense + 0.5 * rng.normal(size=dense.shape))}
    out = paired_spearman(t(dense), losses)
    assert set(out) == {"compressed-control", "compressed-window", "copy-control", "copy-window",
                        "copy-compressed"}
    rho = lambda name: spearman(dense.mean(1), losses[name].numpy().mean(1))  # noqa: E731
    for pair, d in out.items():
        a, b = pair.split("-")
        assert d["diff"] == pytest.approx(rho(a) - rho(b))
        assert d["ci95"][0] <= d["diff"] <= d["ci95"][1] and d["ci95_queries"][0] <= d["ci95_queries"][1]
    assert out["compressed-control"]["ci95"][0] > 0  # a near-copy of dense beats noise, separably
    assert paired_spearman(t(dense[:2]), {k: v[:2] for k, v in losses.items()}) == {}


def test_correlation_of_a_constant_is_nan():
    assert math.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(pearson([1.0], [2.0]))


def test_sample_subsets_deterministic_distinct_and_checked():
    a = sample_subsets(10, 4, 6, np.random.default_rng(3))
    assert a == sample_subsets(10, 4, 6, np.random.default_rng(3))
    assert a != sample_subsets(10, 4, 6, np.random.default_rng(4))
    assert all(len(s) == 4 == len(set(s)) and all(0 <= i < 10 for i in s) for s in a)
    with pytest.raises(ValueError, match="k=11 demonstrations requested but the candidate pool has only 10"):
        sample_subsets(list(range(10)), 11, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="subsets=0"):
        sample_subsets(10, 2, 0, np.random.default_rng(0))


# ----------------------------------------------------------------------------- core vs references


def _prefixes(llama, task, splits, n=3, k=2, seed=0):
    model, tokenizer = llama
    builder = PromptBuilder.for_model(model, tokenizer, task)
    subsets = sample_subsets(splits.pool, k, n, np.random.default_rng(seed))
    demos = [[splits.pool[i] for i in s] for s in subsets]
    return builder, demos, [builder.build_prefix(d) for d in demos]


def test_answer_logits_fast_matches_reference(llama, coin):
    model, _ = llama
    builder, _, prefixes = _prefixes(llama, *coin)
    ids, mask = pad_right(prefixes)
    cache = dense_cache(model, ids, mask)
    suffixes = [builder.build_suffix(q).input_ids for q in coin[1].validation[:4]]
    rows = [0, 2, 1, 2]
    fast = answer_logits(model, cache, suffixes, rows)
    torch.testing.assert_close(fast, answer_logits_ref(model, cache, suffixes, rows), atol=1e-4, rtol=1e-4)


def _exact_or_gated(model, prefixes, gated):
    """The prompts' exact cache, or a gated hybrid compressor's (its virtual tokens carry a bias)."""
    ids, mask = pad_right(prefixes)
    if not gated:
        return dense_cache(model, ids, mask)
    config = SSMCompressorConfig.for_teacher(model.config, **SMALL, num_recent=2, gate=True, gate_init=-1.0)
    cache = compressed_cache(model, SSMCompressor(config).eval(), ids, mask)
    assert cache.bias is not None
    return cache


@pytest.mark.parametrize("gated", [False, True], ids=["exact", "gated-compressed"])
def test_packed_answer_logits_match_reference(llama, coin, gated):
    """Suffixes of unequal length, rows out of order and repeated, a gated prefix's bias: the
    packed read (one sequence per prefix row) equals one unpadded forward per pair."""
    model, _ = llama
    builder, _, prefixes = _prefixes(llama, *coin)
    cache = _exact_or_gated(model, prefixes, gated)
    suffixes = [builder.build_suffix(q).input_ids for q in coin[1].validation[:5]]
    suffixes[1] = suffixes[1][:3]  # lengths differ within a packed row
    rows = [2, 0, 2, 1, 2]
    packed = answer_logits_packed(model, cache, suffixes, rows)
    assert packed.shape == (5, model.config.vocab_size)
    torch.testing.assert_close(packed, answer_logits_ref(model, cache, suffixes, rows), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="suffix 1 is empty"):
        answer_logits_packed(model, cache, [suffixes[0], []], [0, 1])


def test_evaluate_prefixes_packed_equals_batched(llama, coin):
    model, _ = llama
    builder, _, prefixes = _prefixes(llama, *coin)
    ids, mask = pad_right(prefixes)
    cache = dense_cache(model, ids, mask)
    queries = coin[1].validation[:6]
    batched = evaluate_prefixes(model, builder, cache, queries, query_batch=4)
    packed = evaluate_prefixes(model, builder, cache, queries, query_batch=4, pack=True)
    torch.testing.assert_close(packed.logits, batched.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(packed.loss, batched.loss, atol=1e-4, rtol=1e-4)
    assert torch.equal(packed.pred, batched.pred)


def test_logits_are_compared_where_numeric_answers_differ(llama):
    """modular_addition's answers all start with a space token: the logits compared are the
    next position's, after the query and that shared space."""
    model, _ = llama
    task = get_task("modular_addition", p=13, size=60)
    splits = split(task, seed=0)
    builder, _, prefixes = _prefixes(llama, task, splits)
    ids, mask = pad_right(prefixes)
    cache = dense_cache(model, ids, mask)
    queries = splits.validation[:2]
    lead = builder.answer_lead()
    assert len(lead) == 1
    got = evaluate_prefixes(model, builder, cache, queries).logits  # (R, Q, V)
    suffixes = [builder.build_suffix(q).input_ids + lead for q in queries]
    want = answer_logits_ref(model, cache, suffixes * 3, [0, 0, 1, 1, 2, 2]).view(3, 2, -1)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gated", [False, True], ids=["exact", "gated-compressed"])
def test_multi_token_label_scores_read_the_query_once_and_equal_the_reference(llama, gated):
    model, _ = llama
    task = get_task("modular_addition", p=13, size=60)
    splits = split(task, seed=0)
    builder, _, prefixes = _prefixes(llama, task, splits)
    cache = _exact_or_gated(model, prefixes, gated)
    suffixes = [builder.build_suffix(q).input_ids for q in splits.validation[:3]] * 2
    rows = [0, 1, 2, 2, 0, 1]
    z, scores = answer_scores(model, builder, cache, suffixes, rows)
    want = score_labels(model, builder, suffixes, prefix=cache.select(rows), reference=True)
    assert scores.shape == (6, 13)
    torch.testing.assert_close(scores, want.cpu(), atol=1e-4, rtol=1e-4)
    lead = builder.answer_lead()
    torch.testing.assert_close(z, answer_logits_ref(model, cache, [s + lead for s in suffixes], rows),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("verbalizers", [None, {"pos": "very very good", "neg": "very very bad", "neu": "very"}],
                         ids=["shared-first-token", "deep-trie"])
def test_answer_scores_on_deeper_label_tries(llama, verbalizers):
    model, tokenizer = llama
    task = multi_token_task(**({"verbalizers": verbalizers} if verbalizers else {}))
    builder = PromptBuilder.for_model(model, tokenizer, task)
    assert max(len(ids) for ids in builder.label_ids()) - len(builder.answer_lead()) >= 3
    ids, mask = pad_right([builder.build_prefix(MULTI_EXAMPLES[:2]), builder.build_prefix(MULTI_EXAMPLES[1:3])])
    cache = dense_cache(model, ids, mask)
    suffixes = [builder.build_suffix(q).input_ids for q in MULTI_EXAMPLES[2:4]] * 2
    rows = [0, 0, 1, 1]
    _, scores = answer_scores(model, builder, cache, suffixes, rows)
    want = score_labels(model, builder, suffixes, prefix=cache.select(rows), reference=True)
    torch.testing.assert_close(scores, want.cpu(), atol=1e-4, rtol=1e-4)


def test_dense_path_reproduces_full_prompts_and_answer_loss(llama, coin):
    """Loss and prediction after the exact cache == scoring the whole dense prompt."""
    model, _ = llama
    task, splits = coin
    builder, demos, prefixes = _prefixes(llama, task, splits)
    queries = splits.validation[:3]
    ids, mask = pad_right(prefixes)
    ev = evaluate_prefixes(model, builder, dense_cache(model, ids, mask), queries, query_batch=4)
    full = [builder.build(d, q) for d in demos for q in queries]
    gold = [q for _ in demos for q in queries]
    nll = answer_loss(model, builder, full, gold).view(3, 3)
    torch.testing.assert_close(ev.loss, nll, atol=1e-4, rtol=1e-4)
    assert ev.pred.flatten().tolist() == [task.labels.index(p) for p in predict_labels(model, builder, full)]
    ce = evaluate_prefixes(model, builder, dense_cache(model, ids, mask), queries, loss="ce")
    torch.testing.assert_close(ce.loss, answer_loss(model, builder, full, gold, normalize=True).view(3, 3),
                               atol=1e-4, rtol=1e-4)
    assert ev.logits.shape == (3, 3, model.config.vocab_size)


@pytest.mark.parametrize("make_task, examples", [(multi_token_task, MULTI_EXAMPLES), (qa_task, QA_EXAMPLES)])
def test_multi_token_and_generative_paths_match_answer_loss(llama, make_task, examples):
    model, tokenizer = llama
    builder = PromptBuilder.for_model(model, tokenizer, make_task())
    demos = [list(examples[:2]), list(examples[1:3])]
    ids, mask = pad_right([builder.build_prefix(d) for d in demos])
    cache = dense_cache(model, ids, mask)
    queries = list(examples[2:]) + list(examples[:1])
    ev = evaluate_prefixes(model, builder, cache, queries, query_batch=3, max_new_tokens=4)
    rows = [r for r in range(2) for _ in queries]
    sfx = [builder.build_suffix(q) for _ in demos for q in queries]
    ref = answer_loss(model, builder, sfx, queries * 2, prefix=cache.select(rows))
    torch.testing.assert_close(ev.loss.flatten(), ref, atol=1e-4, rtol=1e-4)
    assert ((ev.correct == 0) | (ev.correct == 1)).all()


def test_dense_cache_as_the_other_path_agrees_perfectly(llama, coin):
    model, _ = llama
    task, splits = coin
    builder, _, prefixes = _prefixes(llama, task, splits, n=6, k=3)
    exact = lambda ids, mask: dense_cache(model, ids, mask)  # noqa: E731
    ticks = []
    results = evaluate_paths(model, builder, prefixes, splits.validation[:4], {"dense": exact, "other": exact},
                               batch=4, query_batch=5, progress=ticks.append)
    assert ticks == [4, 2] and results["dense"][1] is None
    report = fidelity_report(results["dense"][0], *results["other"])
    assert report["rel_logit_err"] < 1e-5 and report["kl"] < 1e-7
    assert report["top1_agree"] == 1.0 and report["label_agree"] == 1.0
    assert report["subset_loss_spearman"] == pytest.approx(1.0)
    assert report["acc_dense"] == report["acc_compressed"]
    assert report["flops_dense"] > 0 and report["seconds_dense"] > 0


def test_fidelity_report_from_logits_equals_streamed_agreement(llama, coin):
    model, _ = llama
    task, splits = coin
    builder, _, prefixes = _prefixes(llama, task, splits, n=4)
    ids, mask = pad_right(prefixes)
    comp = SSMCompressor(SSMCompressorConfig.for_teacher(model.config, **SMALL)).eval()
    queries = splits.validation[:3]
    with torch.no_grad():
        dense = evaluate_prefixes(model, builder, dense_cache(model, ids, mask), queries)
        other = evaluate_prefixes(model, builder, compressed_cache(model, comp, ids, mask), queries)
    direct = fidelity_report(dense, other)
    streamed = fidelity_report(dense.without_logits(), other.without_logits(),
                                 logit_agreement(dense.logits, other.logits))
    assert direct == streamed
    assert 0 < direct["rel_logit_err"] and direct["kl"] >= 0
    z_ref, z = dense.logits.double(), other.logits.double()
    assert direct["logit_mse"] == pytest.approx(float((z - z_ref).pow(2).mean()), rel=1e-5)
    with pytest.raises(ValueError, match="needs the logits"):
        fidelity_report(dense.without_logits(), other.without_logits())


# ----------------------------------------------------------------------------- the command


RATES = ("top1_agree", "label_agree", "acc_dense", "acc_compressed", "dense_subset_acc_min", "dense_subset_acc_max")
KEYS = ("rel_logit_err", "kl", "subset_loss_spearman", "subset_loss_pearson", "dense_subset_loss_mean",
        "dense_subset_loss_std", "flops_dense", "flops_compressed", "seconds_dense", "seconds_compressed",
        "model", "task", "k", "subsets", "queries", "seed", "prompt_tokens_mean", "cache_tokens", *RATES)


def test_command_reports_every_metric_in_range(capsys, files):
    out = run_json(capsys, *cli_args(files, "--control", files["ctl"]))
    for key in KEYS:
        assert key in out, key
    assert (out["subsets"], out["queries"], out["k"], out["cache_tokens"]) == (5, 3, 3, 6)
    for key in RATES + ("control_acc", "window_acc", "control_top1_agree", "window_top1_agree"):
        assert 0 <= out[key] <= 1, key
    for prefix in ("", "control_", "window_"):
        assert out[f"{prefix}kl"] >= 0 and out[f"{prefix}rel_logit_err"] >= 0
        rho = out[f"{prefix}subset_loss_spearman"]
        assert rho is None or -1 <= rho <= 1  # None: a control's losses are constant over subsets
        lo, hi = out[f"{prefix}subset_loss_spearman_ci95"]
        assert rho is None or lo is None or lo <= rho <= hi
    assert out["flops_compressed"] < out["flops_dense"]
    assert out["prompt_tokens_mean"] > out["cache_tokens"]
    assert out["window_rel_logit_err"] >= 0 and out["n_window"] == 4
    # the per-subset losses behind every correlation, for plots and re-analysis
    per = out["per_subset"]
    assert len(per["ids"]) == 5 and all(len(ids) == len(set(ids)) == 3 for ids in per["ids"])
    assert set(per["loss"]) == set(per["acc"]) == {"dense", "compressed", "control", "window"}
    for name, prefix in (("compressed", ""), ("control", "control_"), ("window", "window_")):
        rho, reported = spearman(per["loss"]["dense"], per["loss"][name]), out[f"{prefix}subset_loss_spearman"]
        assert math.isnan(rho) if reported is None else rho == pytest.approx(reported)
    assert sum(per["acc"]["dense"]) / 5 == pytest.approx(out["acc_dense"])
    for name, rows in per["query_loss"].items():  # (subsets, queries): each subset's loss is their mean
        assert np.asarray(rows).shape == (5, 3)
        np.testing.assert_allclose(np.mean(rows, 1), per["loss"][name], rtol=1e-5)
    assert set(out["paired"]) == {"compressed-control", "compressed-window"}
    for prefix, pair in (("control_", "compressed-control"), ("window_", "compressed-window")):
        a, b = out["subset_loss_spearman"], out[f"{prefix}subset_loss_spearman"]
        d = out["paired"][pair]
        assert d["diff"] is None if None in (a, b) else d["diff"] == pytest.approx(a - b)
        assert len(d["ci95"]) == len(d["ci95_queries"]) == 2
    assert len(out["subset_loss_spearman_ci95_queries"]) == 2
    labels = per["query_labels"]  # coin_flip: yes / no
    assert len(labels) == 3 and set(labels) <= {0, 1}
    w = label_weights(labels)
    for name, prefix in (("compressed", ""), ("window", "window_")):
        x, d = np.asarray(per["query_loss"][name]) @ w, np.asarray(per["query_loss"]["dense"]) @ w
        rho = out[f"{prefix}subset_loss_spearman_balanced"]
        assert math.isnan(spearman(d, x)) if rho is None else rho == pytest.approx(spearman(d, x), abs=1e-6)
    assert "ci95_balanced" in out["paired"]["compressed-window"]
    calibrated = per["query_loss_calibrated"]  # the lean removed: batch calibration per subset over its queries
    for name, prefix in (("compressed", ""), ("control", "control_"), ("window", "window_")):
        x, d = np.asarray(calibrated[name]) @ w, np.asarray(calibrated["dense"]) @ w
        rho = out[f"{prefix}subset_loss_spearman_calibrated"]
        assert math.isnan(spearman(d, x)) if rho is None else rho == pytest.approx(spearman(d, x), abs=1e-6)
    assert not np.allclose(calibrated["dense"], per["query_loss"]["dense"])  # nll raw vs calibrated cross-entropy
    dense = np.asarray(per["query_loss"]["dense"])
    assert out["dense_split_half_spearman"] == pytest.approx(spearman(dense[:, ::2].mean(1), dense[:, 1::2].mean(1)))


def test_query_offset_takes_another_query_set_on_the_same_subsets(capsys, files):
    first = run_json(capsys, *cli_args(files))
    later = run_json(capsys, *cli_args(files, "--query-offset", "1", "--queries", "2"))
    assert (later["queries"], later["query_offset"], first["query_offset"]) == (2, 1, 0)
    assert later["per_subset"]["ids"] == first["per_subset"]["ids"]
    for name in ("dense", "window"):
        np.testing.assert_allclose(np.asarray(later["per_subset"]["query_loss"][name]),
                                   np.asarray(first["per_subset"]["query_loss"][name])[:, 1:], rtol=1e-5)


def test_command_without_control_and_determinism(capsys, files):
    first = run_json(capsys, *cli_args(files, "--loss", "ce"))
    second = run_json(capsys, *cli_args(files, "--loss", "ce"))
    assert not any(key.startswith("control_") for key in first)
    assert "window_subset_loss_spearman" in first and first["loss"] == "ce"
    timing = lambda r: {k: v for k, v in r.items() if "seconds" not in k}  # noqa: E731
    assert timing(first) == timing(second)


def test_also_evaluates_further_compressors_on_the_same_subsets(capsys, files):
    out = run_json(capsys, *cli_args(files, "--control", files["ctl"], "--also", f"same={files['comp']}",
                                     f"ctl={files['ctl']}"))
    same, ctl = out["also"]["same"], out["also"]["ctl"]
    assert out["config"]["also"] == {"same": files["comp"], "ctl": files["ctl"]}
    assert same["cache_tokens"] == ctl["cache_tokens"] == out["cache_tokens"]
    # the same compressor again gives the main path's numbers; the control's, the control_ ones
    for key in ("rel_logit_err", "kl", "top1_agree", "subset_loss_spearman", "subset_loss_mean", "flops"):
        main_key = {"subset_loss_mean": "compressed_subset_loss_mean", "flops": "flops_compressed"}.get(key, key)
        assert same[key] == pytest.approx(out[main_key]), key
        assert ctl[key] == out[f"control_{key}"], key
    assert same["acc"] == out["acc_compressed"]
    assert main(["fidelity", *cli_args(files, "--subsets", "2", "--also", f"same={files['comp']}")]) == 0
    assert "same_subset_loss_spearman" in capsys.readouterr().out


def test_reuse_dense_reads_back_what_an_earlier_run_stored(capsys, files, tmp_cache):
    first = run_json(capsys, *cli_args(files, "--reuse-dense"))
    stored = sorted((tmp_cache / "dense").glob("*/*.st"))
    assert first["dense_reused_subsets"] == 0 and len(stored) == 5  # one file per subset
    second = run_json(capsys, *cli_args(files, "--reuse-dense"))
    assert second["dense_reused_subsets"] == 5
    same = lambda r: {k: v for k, v in r.items() if k not in ("dense_reused_subsets", "argv")  # noqa: E731
                      and "seconds" not in k}
    assert same(second) == same(first)
    assert second["seconds_dense"] == pytest.approx(first["seconds_dense"])  # charged as stored
    # a killed run keeps the batches it finished; a batch missing a row is computed again
    stored[0].unlink()
    third = run_json(capsys, *cli_args(files, "--reuse-dense"))
    assert 0 < third["dense_reused_subsets"] < 5 and same(third) == same(first)
    # other queries are other inputs: nothing is reused, a new store is filled beside the first
    other = run_json(capsys, *cli_args(files, "--reuse-dense", "--query-offset", "1", "--queries", "2"))
    assert other["dense_reused_subsets"] == 0 and len(list((tmp_cache / "dense").iterdir())) == 2


def test_dense_store_is_keyed_by_the_weights_and_refuses_rows_without_logits(llama, coin, tmp_path):
    model, tokenizer = llama
    task, splits = coin
    builder = PromptBuilder.for_model(model, tokenizer, task)
    queries = splits.validation[:2]
    digest = weights_digest(model)
    store = DenseStore(tmp_path, model, builder, queries, "nll")
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0  # a fine-tune of the same architecture
        try:
            assert weights_digest(model) != digest
            assert DenseStore(tmp_path, model, builder, queries, "nll").directory != store.directory
        finally:
            next(model.parameters())[0, 0] -= 1.0
    assert DenseStore(tmp_path, model, builder, queries, "ce").directory != store.directory
    assert DenseStore(tmp_path, model, builder, queries, "nll").directory == store.directory
    prefix = builder.build_prefix(splits.pool[:2])
    ev = evaluate_prefixes(model, builder, dense_cache(model, *pad_right([prefix])), queries)
    assert store.get([prefix]) is None
    with pytest.raises(ValueError, match="one evaluated row with logits per prompt"):
        store.put([prefix], ev.without_logits())
    store.put([prefix], ev)
    back = store.get([prefix])
    torch.testing.assert_close(back.logits, ev.logits)
    torch.testing.assert_close(back.loss, ev.loss)
    assert store.reused == 1


def test_command_prints_a_table(capsys, files):
    assert main(["fidelity", *cli_args(files, "--subsets", "2")]) == 0
    assert "subset_loss_spearman" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--k", "500"], r"k=500 demonstrations requested but the candidate pool has only \d+"),
        (["--subsets", "0"], "--subsets 0: expected at least 1"),
        (["--queries", "0"], "--queries 0: expected at least 1"),
        (["--queries", "999"], r"--queries 999 from --query-offset 0: task .* has only \d+ validation examples"),
        (["--query-offset", "999"], r"--queries 3 from --query-offset 999: task .* has only \d+ validation"),
        (["--query-offset", "-1"], "--query-offset -1: expected >= 0"),
        (["--control", "COMP"], "is not a control compressor"),
        (["--compressor", "QWEN"], "cannot serve this model: head_dim"),
        (["--compressor", "/nonexistent"], "compressor directory '/nonexistent' does not exist"),
        (["--n-window", "-1"], "--n-window -1: expected >= 0"),
        (["--also", "COMP"], "expected NAME=DIR"),
        (["--also", "a=COMP", "a=COMP"], "the name 'a' is given twice"),
        (["--also", "window=COMP"], r"the names \['window'\] are taken"),
        (["--also", "q=QWEN"], "cannot serve this model: head_dim"),
        (["--device", "gpu0"], "device 'gpu0' is not a torch device"),
    ],
)
def test_bad_inputs(capsys, files, extra, message):
    extra = [a.replace("COMP", files["comp"]).replace("QWEN", files["qwen"]) for a in extra]
    assert main(["fidelity", *cli_args(files), *extra]) == 2
    assert pytest.importorskip("re").search(message, capsys.readouterr().err)


def test_window_comparator_has_the_size_of_a_hybrid_cache(llama):
    llama = llama[0]
    comp = SSMCompressor(SSMCompressorConfig.for_teacher(llama.config, num_recent=3, gate=True, **SMALL)).eval()
    ids = torch.randint(5, llama.config.vocab_size, (2, 30))
    paths = cache_paths(llama, comp)
    with torch.no_grad():
        compressed, window = paths["compressed"](ids, None), paths["window"](ids, None)
    assert compressed.length == window.length == 2 + 4 + 3
    assert cache_paths(llama, comp, n_window=5)["window"](ids, None).length == 2 + 5


def test_subset_features_script_finds_a_planted_last_label_effect(capsys, files, coin):
    """research/subset_features.py on a report whose dense loss is set by the last label."""
    import importlib.util

    path = Path(__file__).parents[1] / "research" / "subset_features.py"
    spec = importlib.util.spec_from_file_location("subset_features", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    task = get_task(files["data"])
    splits = split(task, seed=0)
    labels = sorted({e.target for e in splits.pool})
    rng = np.random.default_rng(0)
    ids = sample_subsets(splits.pool, 6, 40, rng)
    last = np.array([splits.pool[s[-1]].target == labels[1] for s in ids], dtype=float)
    dense = last + 0.1 * rng.random(len(ids))
    report = {"task": task.name, "k": 6, "seed": 0, "queries": 4, "config": {"task": files["data"]},
              "per_subset": {"ids": ids, "loss": {"dense": dense.tolist(), "noise": rng.random(len(ids)).tolist()}}}
    path = files["data"] + ".report.json"
    with open(path, "w") as f:
        json.dump(report, f)
    script.main(path)
    rows = dict(re.findall(r"^\| (.+?) \| ([+-]\d\.\d\d) \| \[.*\] \|$", capsys.readouterr().out, flags=re.M))
    assert float(rows["last label"]) > 0.8
    assert max(rows, key=lambda k: float(rows[k])) == "last label"
    assert abs(float(rows["cache path: noise"])) < 0.5


def test_oracle_summary_reads_label_statistics_from_embeddings():
    """research/oracle_summary.py: share, last label and last-4 share of the label words the mask lets through."""
    import importlib.util

    path = Path(__file__).parents[1] / "research" / "oracle_summary.py"
    spec = importlib.util.spec_from_file_location("oracle_summary", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    gen = torch.Generator().manual_seed(0)
    label_embeds = torch.randn(2, 8, generator=gen)  # label 0, label 1
    filler = torch.randn(8, generator=gen)
    seq = [0, 1, 1, 0, 1, 1, 1]  # labels in prompt order; the last one lies outside the mask
    embeds = torch.stack([t for lab in seq for t in (filler, label_embeds[lab])])[None]  # (1, 14, 8)
    mask = torch.ones(1, 14, dtype=torch.bool)
    mask[0, -2:] = False
    f = script.label_features(embeds, mask, label_embeds, ["share", "last", "last4"])
    read = seq[:-1]
    assert f[0].tolist() == pytest.approx([sum(read) / 6 - 0.5, 1 - 0.5, sum(read[-4:]) / 4 - 0.5])
    with pytest.raises(ValueError, match="no label word"):
        script.label_features(embeds, torch.zeros_like(mask), label_embeds, ["share"])
    with pytest.raises(SystemExit, match="comma list"):
        script.parse("share,first")


def test_oracle_targets_explain_a_planted_share_effect():
    """research/oracle_summary.py's R^2 of centred rank targets: near 1 when the loss is the share
    times the query's sign, near 0 when it is noise."""
    import importlib.util

    path = Path(__file__).parents[1] / "research" / "oracle_summary.py"
    spec = importlib.util.spec_from_file_location("oracle_summary", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rng = np.random.default_rng(0)

    def groups(planted: bool) -> list[dict]:
        out = []
        for _ in range(30):
            labels, query = rng.integers(0, 2, (4, 20)), rng.integers(0, 2, 8)
            effect = -np.outer(labels.mean(1), 2 * query - 1) if planted else 0
            out.append({"nll": effect + 0.01 * rng.standard_normal((4, 8)), "labels": labels, "query": query})
        return out

    assert script.explained(groups(True))["per_query_r2"] > 0.95
    noise = script.explained(groups(False))
    assert noise["per_query_r2"] < 0.05 and noise["points"] == 30 * 4 * 8


def test_balanced_script_reads_reports_with_label_balanced_losses(capsys, tmp_path, monkeypatch):
    """research/balanced.py on two planted reports over the same subsets and other queries."""
    import importlib.util
    import sys

    path = Path(__file__).parents[1] / "research" / "balanced.py"
    spec = importlib.util.spec_from_file_location("balanced", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    files = []
    for offset, seed in ((0, 0), (24, 1)):
        labels, dense, quality = label_biased_losses(seed)
        shift_only = dense - quality[:, None]  # a path that tracks the label shift, not the quality
        loss = {"dense": dense, "compressed": np.broadcast_to(quality[:, None], dense.shape), "shift": shift_only}
        report = {"task": "rotten_tomatoes", "seed": 0, "subsets": 30, "queries": 24, "query_offset": offset,
                  "per_subset": {"ids": [[i] for i in range(30)], "query_labels": labels.tolist(),
                                 "loss": {k: v.mean(1).tolist() for k, v in loss.items()},
                                 "query_loss": {k: v.tolist() for k, v in loss.items()}}}
        files.append(tmp_path / f"r{offset}.json")
        files[-1].write_text(json.dumps(report))
    bal = script.balanced_losses(json.loads(files[0].read_text()))
    labels, dense, quality = label_biased_losses(0)
    np.testing.assert_allclose(bal["dense"], dense @ label_weights(labels))
    monkeypatch.setattr(sys, "argv", ["balanced.py", *map(str, files), "--rename", f"{files[1]}:shift=shifted"])
    script.main()
    out = capsys.readouterr().out
    rows = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(r"^  (\w+) +plain +(-?[\d.]+) +balanced +(-?[\d.]+)",
                                                                 out, re.M)}
    assert rows["compressed"][1] > 0.95 > rows["compressed"][0]  # balanced: the quality alone
    assert "shifted" in out and re.search(r"compressed +all query sets, balanced +0\.9", out)
    assert "shift " not in out.split("all query sets")[0].split("r24.json")[1]  # renamed in the second report


def _script(name: str):
    """``research/NAME.py`` imported as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "research" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def _saved_report(files, tmp_path, capsys) -> tuple[dict, Path]:
    """A 4-subset fidelity report of the tiny teacher, and the file it is saved in."""
    report = run_json(capsys, *cli_args(files, "--subsets", "4"))
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return report, path


def test_recency_script_reproduces_the_reports_window_and_dense(files, tmp_path, capsys, monkeypatch):
    """research/recency.py re-reads a fidelity report: the last k demonstrations are the whole
    prompt (Spearman 1), and a window of the report's size gives the report's window metrics."""
    import sys

    report, path = _saved_report(files, tmp_path, capsys)
    script = _script("recency")
    out = tmp_path / "rows.json"
    n = report["n_window"]
    monkeypatch.setattr(sys, "argv", ["recency.py", str(path), "--last", "1", "3", "--windows", str(n), "8",
                                      "--num-sink", str(report["num_sink"]), "--out", str(out)])
    script.main()
    assert "| window tokens |" in capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert [r["cache"] for r in rows["rows"]][:2] == ["dense prompt of the last 1 demonstration(s)",
                                                      "dense prompt of the last 3 demonstration(s)"]
    assert rows["rows"][1]["subset_loss_spearman"] == pytest.approx(1.0)  # k = 3: the whole prompt
    window = rows["windows"][str(n)]
    for key in ("kl", "rel_logit_err", "subset_loss_spearman"):
        assert window[key] == pytest.approx(report[f"window_{key}"], rel=1e-4, abs=1e-6), key
    assert window["acc_compressed"] == pytest.approx(report["window_acc"])


def test_blocks_script_cuts_and_encodes_demonstrations_apart(files, tmp_path, capsys, monkeypatch):
    """research/blocks.py: the dense cache cut to tails longer than any demonstration is the
    dense prompt itself (Spearman 1, KL 0); the first demonstration's block is exact (it sees
    only the header either way) and the later ones are not; whole-block tails equal the blocks."""
    import sys

    report, path = _saved_report(files, tmp_path, capsys)
    script = _script("blocks")
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["blocks.py", str(path), "--tails", "1", "10000", "--out", str(out)])
    script.main()
    assert "| dense tail 1 |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["paths"]
    assert rows["dense tail 10000"]["subset_loss_spearman"] == pytest.approx(1.0)
    assert rows["dense tail 10000"]["kl"] == pytest.approx(0.0, abs=1e-5)
    np.testing.assert_allclose(rows["block tail 10000"]["subset_loss"], rows["block"]["subset_loss"], atol=1e-5)
    assert rows["dense tail 1"]["slots"] < rows["block"]["slots"]

    model, tok = load_model(report["config"]["model"])
    task = get_task(report["config"]["task"])
    builder = PromptBuilder.for_model(model, tok, task, chat=report["config"]["chat"])
    pool = split(task, seed=report["seed"]).pool
    prompt = builder.build_prefix([pool[i] for i in report["per_subset"]["ids"][0]])
    keys, _ = script.block_kv(model, prompt)
    dense = dense_cache(model, torch.tensor([prompt.input_ids]))
    first = prompt.demo_spans[0][1]
    for k, d in zip(keys, dense.keys, strict=True):
        torch.testing.assert_close(k[:, :first], d[0][:, :first], atol=1e-4, rtol=1e-4)
    assert max((k[:, first:] - d[0][:, first:]).abs().max().item() for k, d in zip(keys, dense.keys)) > 1e-3
    h = prompt.demo_spans[0][0]
    assert script.tail_slots(prompt, 1) == [*range(h), *(e - 1 for _, e in prompt.demo_spans)]


def test_tail_readout_slots_sit_at_each_demonstrations_last_tokens(llama, coin):
    """research/tail_readout.py: RoPE un-rotation inverts rotation; the stored dense tails, rotated
    back, are the dense cache's keys at those slots; the readout cache holds the exact header and
    k * s slots, goes on at the prompt's length, and trains the SSM only when it is not the control."""
    script = _script("tail_readout")
    model, _ = llama
    task, splits = coin
    builder, _, prompts = _prefixes(llama, task, splits, n=2, k=3)
    s = 2
    prompt = prompts[0]
    pos = torch.tensor([script.tail_positions(prompt, s)])
    assert pos[0].tolist() == [i for _, e in prompt.demo_spans for i in (e - 2, e - 1)]
    k = torch.randn(1, 2, pos.shape[1], model.config.head_dim)
    torch.testing.assert_close(script.rotate(model, script.rotate(model, k, pos), -pos), k, atol=1e-5, rtol=1e-5)
    tk, tv = script.dense_tails(model, prompt, s)
    dense = dense_cache(model, torch.tensor([prompt.input_ids]))
    for layer, (k, v) in enumerate(zip(dense.keys, dense.values, strict=True)):
        torch.testing.assert_close(script.rotate(model, tk[layer][None].float(), pos)[0], k[0][:, pos[0]],
                                   atol=2e-2, rtol=2e-2)  # stored in float16
        torch.testing.assert_close(tv[layer].float(), v[0][:, pos[0]], atol=2e-2, rtol=2e-2)
    for control in (False, True):
        tr = script.TailReadout(model, s, control)
        cache = script.cache_of(model, tr, prompts)
        h = prompt.demo_spans[0][0]
        assert cache.length == h + 3 * s
        assert cache.next_position.tolist() == [len(p.input_ids) for p in prompts]
        torch.testing.assert_close(cache.keys[0][0, :, :h], dense.keys[0][0, :, :h])  # the exact header
        sum(x.pow(2).sum() for x in cache.keys + cache.values).backward()
        assert (tr.c.ssm.Bbar.grad is None) == control and tr.tok.grad.abs().sum() > 0


def test_long_context_baselines_are_measured_beside_the_compressor(files, capsys, tmp_path):
    report = run_json(capsys, *cli_args(files, "--baselines", "streaming", "lm-infinite"))
    for name in ("streaming", "lm-infinite", "window"):
        assert -1.0 <= report[f"{name}_subset_loss_spearman"] <= 1.0 and report[f"{name}_kl"] >= 0
    assert {"compressed-streaming", "compressed-lm-infinite", "compressed-window"} <= set(report["paired"])
    # the streaming cache reads K/V computed with the whole prompt; the window encodes its tokens alone
    assert report["streaming_kl"] != report["window_kl"]
    from icl_ssm.report.write import write_report

    write_report(tmp_path / "r", {"model": "m", "task": "t", "k": 3, "fidelity": report, "selections": []})
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| streaming |" in md and "| lm-infinite |" in md
    from icl_ssm.evaluate.fidelity import FidelityConfig

    with pytest.raises(ValueError, match=r"--baselines \['gist'\]; accepted: streaming, lm-infinite"):
        FidelityConfig(task="t", baselines=("gist",)).validate()


def test_bench_long_context_writes_the_table_per_task_and_k(files, tmp_path, capsys):
    """One fidelity run per k with StreamingLLM and LM-Infinite beside the compressor, its control
    and the window; the rows carry the report's numbers, the cache size follows the slots, and a
    second call reads the reports back."""
    from icl_ssm_bench.long_context import cache_bytes

    out = tmp_path / "lc"
    argv = ["bench", "long-context", "--model", "tiny-llama", "--tasks", files["data"], "--k", "2", "3",
            "--compressor", f"{files['data']}={files['comp']}", "--control", f"{files['data']}={files['ctl']}",
            "--subsets", "4", "--queries", "3", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    table = json.loads((out / "long_context.json").read_text())
    assert [r["k"] for r in table["results"]] == [2, 3]
    report = json.loads((out / "coin-k3.json").read_text())
    rows = {r["path"]: r for r in table["results"][1]["rows"]}
    assert list(rows) == ["dense", "compressed", "control", "window", "streaming", "lm-infinite"]
    assert rows["streaming"]["kl"] == report["streaming_kl"] and rows["compressed"]["kl"] == report["kl"]
    assert rows["compressed"]["spearman"] == report["subset_loss_spearman"]
    assert rows["dense"]["flops_vs_dense"] == 1.0 and rows["compressed"]["flops"] == report["flops_compressed"]
    config = tiny_model("llama").config
    assert rows["window"]["cache_mib"] == pytest.approx(cache_bytes(report["num_sink"] + report["n_window"], config)
                                                        / 2**20)
    assert rows["dense"]["slots"] == report["prompt_tokens_mean"] > rows["compressed"]["slots"]
    md = (out / "long_context.md").read_text()
    assert "| lm-infinite |" in md and "k = 3" in md and (out / "long_context.png").stat().st_size > 0
    stamp = (out / "coin-k3.json").stat().st_mtime_ns
    assert main(argv) == 0 and (out / "coin-k3.json").stat().st_mtime_ns == stamp  # read back, not rerun
    capsys.readouterr()
    assert main(["bench", "long-context", "--tasks", files["data"], "--compressor", "COMP", "--out", str(out)]) != 0
    assert "--compressor 'COMP': expected NAME=DIR" in capsys.readouterr().err


def test_bench_length_measures_error_in_the_context_and_only_the_compressed_cache_beyond(files, tmp_path, capsys):
    out = tmp_path / "len"
    assert main(["bench", "length", "--model", "tiny-llama", "--task", files["data"], "--compressor", files["comp"],
                 "--k", "2", "40", "--subsets", "2", "--queries", "3", "--out", str(out)]) == 0
    result = json.loads((out / "length.json").read_text())
    near, far = result["rows"]
    assert result["context"] == 512 and near["prompt_tokens"] < 512 < far["prompt_tokens"]
    assert near["in_context"] and near["kl"] >= 0 and near["dense"]["flops"] > near["compressed"]["flops"] > 0
    assert not far["in_context"] and "dense" not in far and "kl" not in far
    assert far["compressed"]["seconds"] > 0 and 0 <= far["compressed"]["accuracy"] <= 1
    md = (out / "length.md").read_text()
    assert "no dense reference (beyond the context)" in md and (out / "length.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["bench", "length", "--model", "tiny-llama", "--task", files["data"], "--compressor", files["comp"],
                 "--k", "500", "--out", str(out)]) != 0
    assert "--k 500: the pool of task" in capsys.readouterr().err


def test_paired_separability_reads_a_linear_difference_and_not_noise():
    from icl_ssm.evaluate.stats import paired_separability

    rng = np.random.default_rng(0)
    base = rng.normal(size=(96, 12))
    shifted = base + rng.normal(size=(96, 12)) * 0.1
    shifted[:, 3] += 4.0  # one direction tells the two sets apart
    got = paired_separability(base, shifted)
    assert got["accuracy"] > 0.9 and got["pairs"] == 96 and got["ci95"][0] > 0.8
    same = paired_separability(base, rng.normal(size=(96, 12)))
    assert 0.3 < same["accuracy"] < 0.7 and same["ci95"][0] < 0.5 < same["ci95"][1]
    with pytest.raises(ValueError, match=r"must be the same \(n, D\) with n >= 2 \* folds = 16"):
        paired_separability(base[:10], shifted[:10])


def test_transfer_table_puts_each_report_in_its_cell(tmp_path, capsys, monkeypatch):
    """research/transfer_table.py on planted reports: a transfer's numbers land in its source's row
    and its target's column; the saving compares each transfer with its target's native run."""
    import importlib.util

    path = Path(__file__).parents[1] / "research" / "transfer_table.py"
    spec = importlib.util.spec_from_file_location("transfer_table", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def path_report(kl):
        return {"kl": kl, "logit_mse": 10 * kl, "acc": 0.5}

    for target, source in (("a", "b"), ("b", "a")):
        report = {"acc_dense": 0.7, "kl": 0.1, "logit_mse": 1.0, "acc_compressed": 0.6, "window_kl": 0.3,
                  "window_acc": 0.55, "also": {f"from-{source}": path_report(0.05 if target == "a" else 0.07),
                                               f"as-is-{source}": path_report(0.9)}}
        (tmp_path / f"transfer-{target}.json").write_text(json.dumps(report))
    (tmp_path / "times.tsv").write_text("native-a\t100\t0\nnative-b\t200\t0\nxfer-b-to-a\t60\t0\n"
                                        "xfer-a-to-b\t999\t1\nxfer-a-to-b\t150\t0\n")
    monkeypatch.setattr("sys.argv", ["transfer_table.py", str(tmp_path), "--tasks", "a", "b"])
    script.main()
    out = capsys.readouterr().out
    assert "| from b (stage 2 here) | 0.050 / 0.5 / 0.500 | — |" in out
    assert "| from a (stage 2 here) | — | 0.070 / 0.7 / 0.500 |" in out
    assert "| a, as it is | — | 0.900 / 9.0 / 0.500 |" in out
    # the failed run of a -> b is left out of its saving
    assert "| a | 100 | 60 | 40% to 40% |" in out and "| b | 200 | 150 | 25% to 25% |" in out


def test_join_reports_pairs_paths_of_two_runs_on_their_common_subsets():
    """research/join_reports.py: OTHER's compressed path joins BASE's under its new name on the
    subsets both runs drew; different draws are refused."""
    import importlib.util

    path = Path(__file__).parents[1] / "research" / "join_reports.py"
    spec = importlib.util.spec_from_file_location("join_reports", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rng = np.random.default_rng(0)
    dense = rng.random((10, 4))
    good = dense + 0.01 * rng.random((10, 4))  # ranks the subsets as dense does
    common = {"task": "t", "k": 3, "seed": 0, "queries": 4, "query_offset": 0, "loss": "nll"}
    ids = [[i, i + 1, i + 2] for i in range(10)]
    base = {**common, "per_subset": {"ids": ids, "query_loss": {
        "dense": dense.tolist(), "compressed": rng.random((10, 4)).tolist(), "control": rng.random((10, 4)).tolist()}}}
    other = {**common, "per_subset": {"ids": ids[:8], "query_loss": {
        "dense": dense[:8].tolist(), "compressed": good[:8].tolist(), "control": base["per_subset"]["query_loss"][
            "control"][:8], "extra": rng.random((8, 4)).tolist()}}}
    losses, drift = script.join(base, other, "good")
    assert sorted(losses) == ["compressed", "control", "dense", "extra", "good"]
    assert losses["dense"].shape == (8, 4) and drift == {"dense": 0.0, "control": 0.0}
    rows, paired = script.table(losses)
    assert paired["good-control"]["diff"] > 0.5 and any(r.startswith("| good | 1.00 ") for r in rows)
    with pytest.raises(ValueError, match="subsets differ"):
        script.join(base, {**other, "per_subset": {**other["per_subset"], "ids": ids[1:9]}}, "good")
    with pytest.raises(ValueError, match="differ in k"):
        script.join(base, {**other, "k": 4}, "good")
    with pytest.raises(ValueError, match="already a path"):
        script.join(base, other, "control")


def test_the_fair_trial_recalibrates_stored_losses_on_any_query_subset_exactly():
    """research/fair_trial.py reads calibrated margins back from the stored calibrated losses and
    recalibrates them on another query set: the same losses as calibrating the label scores there."""
    from helpers import research_script

    from icl_ssm.calibrate.losses import calibrated_query_losses

    script = research_script("fair_trial")
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(5, 12, 2)) * 3  # (subsets, queries, labels)
    gold = rng.permutation(np.repeat([0, 1], 6))  # 4 + 4 probe, 2 + 2 target queries
    stored = calibrated_query_losses(scores, gold, "batch")
    probe, target = script.probe_and_target(gold)
    assert len(probe) == 2 * script.PROBE_PER_LABEL and len(target) == 4
    assert set(probe) | set(target) == set(range(12)) and not set(probe) & set(target)
    m = script.margins(stored, gold)
    for part in (probe, target):
        direct = calibrated_query_losses(scores[:, part], gold[part], "batch")
        want = (direct[:, gold[part] == 0].mean(1) + direct[:, gold[part] == 1].mean(1)) / 2
        np.testing.assert_allclose(script.balanced_calibrated(m[:, part], gold[part]), want, rtol=1e-9, atol=1e-12)

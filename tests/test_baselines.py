"""Selection baselines (bm25, topk, gradce) on a tiny random model and a small generated task."""

import numpy as np
import pytest
import torch
from helpers import FakeExample

from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import answer_loss
from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer
from icl_ssm.select.base import SELECTORS, top_k
from icl_ssm.select.bm25 import BM25Selector
from icl_ssm.select.gradce import GradCESelector, anchor_loss, demo_embedding
from icl_ssm.select.topk import TopKSelector, embed


@pytest.fixture(scope="module")
def setup():
    task = get_task("coin_flip", size=60)
    splits = split(task, pool_size=12, val_size=4, test_size=4, seed=0)
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    return model, PromptBuilder(tokenizer, task), splits.pool, splits.validation


def make(name, model, builder):
    if name == "bm25":
        return BM25Selector()
    if name == "topk":
        return TopKSelector(model, builder, batch=5)
    return GradCESelector(model, builder, prefilter=2, batch=3)


def test_registered():
    assert SELECTORS["bm25"] is BM25Selector
    assert SELECTORS["topk"] is TopKSelector
    assert SELECTORS["gradce"] is GradCESelector


@pytest.mark.parametrize("name", ["bm25", "topk", "gradce"])
def test_contract(setup, name):
    model, builder, pool, val = setup
    selector = make(name, model, builder)
    sel = selector.select(pool, val, 3, np.random.default_rng(0))
    again = selector.select(pool, val, 3, np.random.default_rng(0))
    assert sel.method == name
    assert len(set(sel.indices)) == 3 and all(0 <= i < len(pool) for i in sel.indices)
    assert sel.scores.shape == (len(pool),) and sel.scores.dtype == np.float64
    assert sel.indices == top_k(sel.scores, 3)  # best last
    assert sel.indices == again.indices
    np.testing.assert_array_equal(sel.scores, again.scores)
    assert sel.cost.seconds > 0
    if name == "bm25":
        assert sel.cost.flops == 0 and sel.tokens == 0
    else:
        assert sel.cost.flops > 0 and sel.tokens > 0
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("name", ["bm25", "topk", "gradce"])
def test_bad_inputs(setup, name):
    model, builder, pool, val = setup
    selector = make(name, model, builder)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="k=0"):
        selector.select(pool, val, 0, rng)
    with pytest.raises(ValueError, match="pool has only"):
        selector.select(pool, val, len(pool) + 1, rng)
    with pytest.raises(ValueError, match="validation set is empty"):
        selector.select(pool, [], 2, rng)


def test_bad_options(setup):
    model, builder, _, _ = setup
    with pytest.raises(ValueError, match="batch=0"):
        TopKSelector(model, builder, batch=0)
    with pytest.raises(ValueError, match="prefilter=0"):
        GradCESelector(model, builder, prefilter=0)


def test_bm25_prefers_overlapping_text():
    pool = [FakeExample("a", "the weather is cold today", "x"),
            FakeExample("b", "I ordered a pizza with extra cheese", "x"),
            FakeExample("c", "dogs bark at the mailman", "x"),
            FakeExample("d", "melted cheese on a crispy pizza crust", "x"),
            FakeExample("e", "the stock market fell sharply", "x")]
    val = [FakeExample("v0", "where can I get good pizza", "x"), FakeExample("v1", "which cheese melts best", "x")]
    sel = BM25Selector().select(pool, val, 2, np.random.default_rng(0))
    assert sorted(sel.indices) == [1, 3]
    assert np.all(sel.scores[[0, 2, 4]] == 0) and np.all(sel.scores[[1, 3]] > 0)


def test_topk_identical_candidate_scores_highest(setup):
    model, builder, pool, val = setup
    pool = [*pool[:5], FakeExample("copy", val[0].input, val[0].target), *pool[5:]]
    sel = TopKSelector(model, builder).select(pool, val[:1], 2, np.random.default_rng(0))
    assert int(np.argmax(sel.scores)) == 5 and sel.indices[-1] == 5
    assert sel.scores[5] == pytest.approx(1.0, abs=1e-5)
    assert sel.tokens == sum(len(builder.build_suffix(e)) for e in [*pool, val[0]])


def test_embed_does_not_depend_on_batch(setup):
    model, builder, pool, val = setup
    with torch.no_grad():
        one, tokens = embed(model, builder, pool, batch=1)
        many, _ = embed(model, builder, pool, batch=7)
    assert one.shape == (len(pool), model.config.hidden_size)
    assert tokens == sum(len(builder.build_suffix(e)) for e in pool)
    torch.testing.assert_close(one, many, atol=1e-5, rtol=1e-5)


def test_anchor_loss_matches_answer_loss(setup):
    model, builder, pool, val = setup
    demos = pool[:3]
    delta = torch.zeros(model.config.hidden_size)
    with torch.no_grad():
        ours = anchor_loss(model, builder, demos, val, delta, batch=3)
        ref = answer_loss(model, builder, [builder.build(demos, q) for q in val], val).mean()
    assert float(ours) == pytest.approx(float(ref), rel=1e-5)


def test_gradce_gradient_matches_finite_differences(setup):
    _, builder, pool, val = setup
    model = tiny_model("llama").double()  # float64 (RMSNorm still rounds through float32)
    demos = pool[:3]
    loss0, g = GradCESelector(model, builder, batch=3).gradient(demos, val)
    with torch.no_grad():
        assert loss0 == pytest.approx(float(anchor_loss(model, builder, demos, val, torch.zeros(32).double())),
                                      rel=1e-10)

        def slope(v, h):  # central difference, Richardson-extrapolated: error O(h^4)
            def d(h):
                return float(anchor_loss(model, builder, demos, val, h * v)
                             - anchor_loss(model, builder, demos, val, -h * v)) / (2 * h)
            return (4 * d(h / 2) - d(h)) / 3

        random = torch.randn(32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        for v in (random, g.double() / g.norm()):
            directional = slope(v, 1e-3)
            assert abs(directional) > 1e-3  # a meaningful check, not 0 == 0
            assert float(g.double() @ v) == pytest.approx(directional, rel=1e-4)
    assert all(p.grad is None for p in model.parameters())


def test_gradce_prefilter_and_scores(setup):
    model, builder, pool, val = setup
    sel = GradCESelector(model, builder, prefilter=2, batch=4).select(pool, val, 2, np.random.default_rng(0))
    sim, _ = TopKSelector(model, builder).similarity(pool, val)
    kept = set(top_k(sim, 4))
    assert sel.details["prefiltered"] == 4
    assert set(np.flatnonzero(np.isfinite(sel.scores))) == kept
    assert set(sel.indices) <= kept
    assert sel.details["anchor"] == top_k(sim, 2)
    # every kept score is -(L0 + g . (e(z) - e_anchor)) at the anchor
    demos = [pool[i] for i in sel.details["anchor"]]
    loss0, g = GradCESelector(model, builder).gradient(demos, val)
    assert sel.details["anchor_loss"] == pytest.approx(loss0, rel=1e-5)
    with torch.no_grad():
        e_anchor = demo_embedding(model, builder, demos)
        for z in kept:
            expect = loss0 + float(g @ (demo_embedding(model, builder, [pool[z]]) - e_anchor))
            assert -sel.scores[z] == pytest.approx(expect, rel=1e-4, abs=1e-6)
    assert all(p.requires_grad for p in model.parameters()) and all(p.grad is None for p in model.parameters())


def test_importing_the_package_leaves_bm25s_and_jax_alone():
    # bm25s runs a JAX op at import, and JAX's first op takes most of a GPU's memory
    import subprocess
    import sys

    code = "import sys, icl_ssm; print(sorted(m for m in ('bm25s', 'jax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_per_query_retrieval_gives_each_test_input_its_own_prompt(tmp_path, capsys):
    import json

    from icl_ssm.cli import main
    from icl_ssm.data.tasks import Example
    from icl_ssm.select.per_query import _nearest, bm25_prompts

    assert _nearest(np.array([[0.1, 0.9, 0.5], [0.7, 0.2, 0.7]]), 2) == [[2, 1], [2, 0]]  # best last; ties by index
    pool = [Example(id=str(i), input=text, target="a") for i, text in
            enumerate(["red apples", "green pears", "blue sky today", "ripe red apples sold"])]
    queries = [Example(id="q1", input="apples that are red", target="a"),
               Example(id="q2", input="the sky is blue", target="a")]
    prompts = bm25_prompts(pool, queries, 2)
    assert set(prompts[0]) == {0, 3} and prompts[1][-1] == 2  # the closest last
    nothing = [Example(id="q3", input="it is !", target="a")]  # stopwords and punctuation: no BM25 token
    assert bm25_prompts(pool, [*queries, *nothing], 2)[2] == [1, 0]  # every score 0: the first k, by index
    from icl_ssm.data.tasks import get_task

    task = get_task("coin_flip", size=120)
    data = tmp_path / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    base = ["select", "--model", "tiny-llama", "--task", str(data), "--k", "3", "--pool-size", "24", "--queries", "3",
            "--test-size", "5"]
    for method in ("bm25", "topk"):
        out = tmp_path / method
        assert main([*base, "--method", method, "--per-query", "--out", str(out)]) == 0
        summary = json.loads((out / "summary.json").read_text())
        rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
        assert summary["method"] == f"{method} (per query)" and len(summary["prompts"]) == 5 == len(rows)
        assert all(len(r["demonstrations"]) == 3 for r in rows)
        assert summary["test_accuracy"] == pytest.approx(np.mean(summary["correct"]))
        assert summary["answer_flops"] > 0 and (summary["flops"] > 0) == (method == "topk")
    capsys.readouterr()
    assert main([*base, "--method", "random", "--per-query"]) == 2
    assert "--per-query retrieves for each test input; --method 'random'" in capsys.readouterr().err

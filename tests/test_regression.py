"""The synthetic regression study: clustered Garg data and the in-context regression teacher.

Tiny settings only (a few thousand parameters, a few hundred steps): the suite runs in seconds.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
from icl_ssm_bench.synthetic.task import RegressionTask
from icl_ssm_bench.synthetic.teacher import (
    RegressionTeacher,
    RegressionTeacherConfig,
    curriculum,
    evaluate_teacher,
    least_squares_predictions,
    load_teacher,
    prompt_loss,
    prompt_values,
    ridge_predictions,
    teacher_predictions,
    train_teacher,
)

from icl_ssm.lm.hf import kv_from_cache


@pytest.fixture
def one_thread():
    """Torch on one thread for the test, and the process's setting back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_config(**overrides) -> RegressionTeacherConfig:
    fields = dict(n_dims=4, max_pairs=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    return RegressionTeacherConfig(**{**fields, **overrides})


def tiny_teacher(seed: int = 0, **overrides) -> RegressionTeacher:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return RegressionTeacher(tiny_config(**overrides)).eval()


# ---------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("function_class", ["linear", "relu"])
def test_same_seed_same_data(function_class):
    task = RegressionTask(function_class, d=6, clusters=3, seed=7, relu_hidden=10)
    again = RegressionTask(function_class, d=6, clusters=3, seed=7, relu_hidden=10)
    a = task.sample_selection(np.random.default_rng(1), 30, 0.5, 5, 6, query_cluster=2)
    b = again.sample_selection(np.random.default_rng(1), 30, 0.5, 5, 6, query_cluster=2)
    for field in ("pool_x", "pool_y", "pool_cluster", "valid_x", "valid_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    xa, ya = task.sample_prompts(np.random.default_rng(2), 3, 5)
    xb, yb = again.sample_prompts(np.random.default_rng(2), 3, 5)
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)
    # another task seed: other cluster functions on the same inputs
    other = RegressionTask(function_class, d=6, clusters=3, seed=8, relu_hidden=10)
    assert not np.allclose(task.target(a.pool_x, 0), other.target(a.pool_x, 0))


def test_linear_anchors_orthonormal():
    task = RegressionTask("linear", d=20, clusters=5, seed=3)
    beta = task.anchors.beta
    assert beta.shape == (5, 20)
    np.testing.assert_allclose(beta @ beta.T, np.eye(5), atol=1e-5)


def test_targets_are_the_anchor_functions():
    task = RegressionTask("linear", d=5, clusters=2, sigma=0.0)
    x, y = task.sample_points(np.random.default_rng(0), 1, n=7)
    np.testing.assert_allclose(y, x @ task.anchors.beta[1], rtol=1e-5, atol=1e-6)
    relu = RegressionTask("relu", d=5, clusters=2, sigma=0.0, relu_hidden=8)
    a = relu.anchors
    expected = a.scale * np.maximum(x @ a.w1[0], 0) @ a.w2[0]
    np.testing.assert_allclose(relu.target(x, 0), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share", [0.0, 0.3, 0.75, 1.0])
def test_selection_split_honours_d1_share(share):
    task = RegressionTask("linear", d=8, clusters=4)
    split = task.sample_selection(np.random.default_rng(0), 40, share, n_valid=5, n_test=9, query_cluster=1)
    assert split.pool_x.shape == (40, 8) and split.pool_y.shape == (40,) and split.pool_cluster.shape == (40,)
    assert split.valid_x.shape == (5, 8) and split.test_x.shape == (9, 8) and split.test_y.shape == (9,)
    assert split.pool_is_d1.sum() == round(share * 40)
    assert set(split.pool_cluster[~split.pool_is_d1]) <= {0, 2, 3}
    # queries come from D1: noiseless targets of cluster 1 explain them up to the noise
    resid = split.test_y - task.target(split.test_x, 1)
    assert np.abs(resid).max() < 6 * task.sigma


def test_d1_candidates_are_spread_over_the_pool():
    task = RegressionTask("linear", d=8, clusters=4)
    split = task.sample_selection(np.random.default_rng(0), 200, 0.5, n_valid=1, n_test=1)
    first_half = split.pool_is_d1[:100].sum()
    assert 30 < first_half < 70  # shuffled, not D1 first


def test_prompts_shapes_and_curriculum_dims():
    task = RegressionTask("linear", d=6, sigma=0.0)
    xs, ys = task.sample_prompts(np.random.default_rng(0), 4, 9, dims=3)
    assert xs.shape == (4, 9, 6) and ys.shape == (4, 9) and xs.dtype == np.float32
    active = (xs != 0).any(axis=1)  # (4, 6): the coordinates each prompt uses
    assert (active.sum(1) == 3).all() and len({tuple(a) for a in active}) > 1  # a random subset per prompt
    assert ((xs != 0) == active[:, None]).all()
    # each prompt is one linear function: 3 pairs in its 3 active dims determine the rest
    x0 = xs[0][:, active[0]]
    beta = np.linalg.lstsq(x0[:3], ys[0, :3], rcond=None)[0]
    np.testing.assert_allclose(x0[3:] @ beta, ys[0, 3:], atol=1e-4)


def test_task_errors_name_the_input():
    with pytest.raises(ValueError, match="function_class must be one of"):
        RegressionTask("cubic")
    with pytest.raises(ValueError, match="clusters=30 orthogonal anchors"):
        RegressionTask("linear", d=20, clusters=30)
    with pytest.raises(ValueError, match="d1_share must lie in"):
        RegressionTask().sample_selection(np.random.default_rng(0), 10, 1.5, 1, 1)
    with pytest.raises(ValueError, match="x must be an"):
        RegressionTask(d=4).target(np.zeros((3, 5)), 0)


# ---------------------------------------------------------------------------------------
# teacher
# ---------------------------------------------------------------------------------------


def test_prompt_values_interleave_x_and_y_tokens():
    xs = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    ys = np.array([[10.0, 20.0, 30.0]], dtype=np.float32)
    v = prompt_values(xs, ys)
    assert v.shape == (1, 6, 5)
    np.testing.assert_array_equal(v[0, 0::2, :4], xs[0])
    assert (v[0, 0::2, 4] == 0).all() and (v[0, 1::2, :4] == 0).all()
    np.testing.assert_array_equal(v[0, 1::2, 4], ys[0])
    assert prompt_values(xs).shape == (1, 3, 5)


def test_cached_forward_equals_full_forward():
    model = tiny_teacher()
    xs, ys = RegressionTask(d=4).sample_prompts(np.random.default_rng(0), 3, 9)
    values = prompt_values(xs, ys)  # (3, 18, 5)
    with torch.no_grad():
        full = model(values=values).predictions  # (3, 18)
        prefix = model(values=values[:, :11], use_cache=True)  # demonstrations, prefilled once
        rest = model(values=values[:, 11:], cache=prefix.cache, use_cache=True)
    assert kv_from_cache(prefix.cache)[0][0].shape[2] == 18  # extended in place by the second call
    torch.testing.assert_close(torch.cat([prefix.predictions, rest.predictions], 1), full, atol=1e-5, rtol=0)


def test_one_prefix_serves_each_query_alone():
    """Prefill the demonstrations, then each query x token appended through the cache gives the
    prediction that the full prompt gives at that query."""
    model = tiny_teacher()
    task = RegressionTask(d=4)
    rng = np.random.default_rng(1)
    xs, ys = task.sample_prompts(rng, 1, 5)
    queries = rng.standard_normal((3, 4)).astype(np.float32)
    with torch.no_grad():
        prefix = model(values=prompt_values(xs, ys), use_cache=True)
        cached = []
        for q in queries:
            cache = copy.deepcopy(prefix.cache)  # a forward extends its cache in place
            cached.append(model(values=prompt_values(q[None, None]), cache=cache, use_cache=True).predictions[0, 0])
        full = [model(values=prompt_values(np.concatenate([xs, q[None, None]], 1),
                                           np.concatenate([ys, [[0.0]]], 1).astype(np.float32))).predictions[0, -2]
                for q in queries]
    torch.testing.assert_close(torch.stack(cached), torch.stack(full), atol=1e-5, rtol=0)


def test_input_embeddings_are_the_read_in():
    model = tiny_teacher()
    values = prompt_values(*RegressionTask(d=4).sample_prompts(np.random.default_rng(0), 2, 3))
    assert model.get_input_embeddings() is model.read_in
    with torch.no_grad():
        a = model(values=values).predictions
        b = model(inputs_embeds=model.get_input_embeddings()(values)).predictions
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="exactly one of values"):
        model(values=values, inputs_embeds=model.read_in(values))
    with pytest.raises(ValueError, match=r"values must be \(batch, T, 5\)"):
        model(values=values[..., :4])


def test_reference_predictors():
    task = RegressionTask(d=3, clusters=2, sigma=0.0)
    xs, ys = task.sample_prompts(np.random.default_rng(0), 2, 6)
    ls = least_squares_predictions(xs, ys)
    assert ls.shape == (2, 6) and (ls[:, 0] == 0).all()
    np.testing.assert_allclose(ls[:, 3:], ys[:, 3:], atol=1e-4)  # noiseless: d pairs pin beta
    np.testing.assert_allclose(ridge_predictions(xs, ys, 1e-9), ls, atol=1e-4)


def test_curriculum_grows_to_full_size():
    stages = [curriculum(s, 1000, 20, 41) for s in range(0, 1000, 10)]
    assert stages[0] == (5, 11) and stages[-1] == (20, 41) and curriculum(500, 1000, 20, 41) == (20, 41)
    assert all(a <= b for (a, _), (b, _) in zip(stages, stages[1:]))
    assert curriculum(0, 10, 3, 4) == (3, 4)  # smaller than the start: full size at once


def test_train_reduces_loss_and_round_trips(tmp_path, one_thread):
    task = RegressionTask("linear", d=2, clusters=2, sigma=0.1)
    config = tiny_config(n_dims=2, max_pairs=6, hidden_size=64, intermediate_size=128, num_key_value_heads=4)
    xs, ys = task.sample_prompts(np.random.default_rng(99), 256, 7)
    xs, ys = torch.from_numpy(xs), torch.from_numpy(ys)
    with torch.no_grad():
        before = prompt_loss(tiny_teacher(n_dims=2, max_pairs=6, hidden_size=64, intermediate_size=128,
                                          num_key_value_heads=4), xs, ys).item()
    out = train_teacher(config, task, tmp_path / "teacher", steps=300, batch=32, lr=1e-3, seed=0, warmup=20,
                        use_curriculum=False)
    model = load_teacher(out)
    with torch.no_grad():
        after = prompt_loss(model, xs, ys).item()
    # the zero predictor scores about 1.01 here: only a teacher that reads its demonstrations
    # gets well below it
    assert after < 0.85 * min(before, 1.0)
    record = json.loads((out / "training.json").read_text())
    assert record["recipe"]["steps"] == 300 and record["final_loss"] < record["history"][0]["loss"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["teacher"]  # no temporary directory left
    mask = os.umask(0)
    os.umask(mask)
    assert {f.name: f.stat().st_mode & 0o777 for f in out.iterdir()} == dict.fromkeys(
        ["config.json", "model.safetensors", "training.json"], 0o666 & ~mask)  # as open() would make them

    # a second run into the same directory replaces the first as a whole
    again = train_teacher(config, task, out, steps=2, batch=4, lr=1e-3, seed=1, use_curriculum=False)
    assert json.loads((again / "training.json").read_text())["recipe"]["steps"] == 2
    with torch.no_grad():
        assert not torch.allclose(load_teacher(again)(values=prompt_values(xs, ys)).predictions,
                                  model(values=prompt_values(xs, ys)).predictions)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["teacher"]


def test_training_can_start_from_another_teacher(tmp_path, capsys, one_thread):
    from icl_ssm.cli import main

    linear = RegressionTask("linear", d=4, clusters=2, sigma=0.1)
    relu = RegressionTask("relu", d=4, clusters=2, sigma=0.1, relu_hidden=8)
    config = tiny_config()
    source = train_teacher(config, linear, tmp_path / "linear", steps=3, batch=4, seed=0)
    # at lr 0 the carried teacher is its source exactly; a fresh initialisation (seed 5) is not
    carried = train_teacher(config, relu, tmp_path / "carried", steps=2, batch=4, lr=0.0, seed=5,
                            use_curriculum=False, init_from=source)
    fresh = train_teacher(config, relu, tmp_path / "fresh", steps=2, batch=4, lr=0.0, seed=5)
    weights = {name: load_teacher(d).state_dict() for name, d in
               (("source", source), ("carried", carried), ("fresh", fresh))}
    assert all(torch.equal(v, weights["carried"][k]) for k, v in weights["source"].items())
    assert not all(torch.equal(v, weights["fresh"][k]) for k, v in weights["source"].items())
    record = json.loads((carried / "training.json").read_text())
    assert record["recipe"]["init_from"] == str(source) and record["task"]["function_class"] == "relu"
    with pytest.raises(ValueError, match=r"num_hidden_layers \(2 vs 3\)"):
        train_teacher(tiny_config(num_hidden_layers=3), relu, tmp_path / "bad", steps=1, init_from=source)
    assert not (tmp_path / "bad").exists()

    # the command takes the source's shape unless told otherwise, and refuses a shape that differs
    assert main(["synthetic", "train", "--function", "relu", "--init-from", str(source), "--clusters", "2",
                 "--out", str(tmp_path / "cli"), "--steps", "2", "--batch", "4"]) == 0
    assert load_teacher(tmp_path / "cli").config.hidden_size == config.hidden_size
    assert json.loads((tmp_path / "cli" / "training.json").read_text())["recipe"]["use_curriculum"] is False
    capsys.readouterr()
    assert main(["synthetic", "train", "--init-from", str(source), "--max-pairs", "9", "--out", str(tmp_path / "x"),
                 "--steps", "1"]) == 2
    assert "max_pairs (8 vs 9)" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_save_load_round_trip(tmp_path):
    model = tiny_teacher(seed=3)
    model.save_pretrained(tmp_path / "t")
    loaded = load_teacher(tmp_path / "t")
    drop = {"_name_or_path"}
    assert {k: v for k, v in loaded.config.to_dict().items() if k not in drop} == \
        {k: v for k, v in model.config.to_dict().items() if k not in drop}
    values = prompt_values(*RegressionTask(d=4).sample_prompts(np.random.default_rng(0), 2, 8))
    with torch.no_grad():
        torch.testing.assert_close(loaded(values=values).predictions, model(values=values).predictions, atol=0, rtol=0)
    with pytest.raises(ValueError, match="has no model.safetensors"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text("{}")
        load_teacher(tmp_path / "empty")


def test_evaluate_teacher_rows():
    model = tiny_teacher()
    task = RegressionTask("linear", d=4, clusters=3)
    result = evaluate_teacher(model, task, np.random.default_rng(0), n_prompts=8, mixed_ks=(4,), d1_shares=(1.0, 0.5))
    assert [row["k"] for row in result["by_k"]] == list(range(9))
    names = {"teacher", "least_squares", "ridge", "zero"}
    assert set(result["by_k"][0]) == {"k"} | names | {f"{n}_se" for n in names}
    assert [(row["k"], row["d1_share"]) for row in result["mixed"]] == [(4, 1.0), (4, 0.5)]
    preds = teacher_predictions(model, *task.sample_prompts(np.random.default_rng(0), 3, 5))
    assert preds.shape == (3, 5)


# ---------------------------------------------------------------------------------------
# the language-model cache code serves the regression teacher
# ---------------------------------------------------------------------------------------


def test_the_cache_paths_serve_a_teacher_that_reads_value_tokens():
    from icl_ssm.compress.cache import compressed_cache, dense_cache, window_cache
    from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
    from icl_ssm.lm.prefix import forward_with_prefix

    teacher = tiny_teacher()
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(3, 7, 4)), rng.normal(size=(3, 7))
    values = prompt_values(xs, ys).float()  # (3, 14, 5): 7 pairs
    prefix, query = values[:, :12], values[:, 12:13]  # 6 demonstration pairs, then the 7th x
    with torch.no_grad():
        dense = teacher(values=values[:, :13]).predictions[:, -1]
        exact = forward_with_prefix(teacher, dense_cache(teacher, prefix), query).predictions[:, -1]
        torch.testing.assert_close(exact, dense, rtol=1e-4, atol=1e-5)  # the exact cache is the dense prompt
        config = SSMCompressorConfig.for_teacher(teacher.config, state_size=8, num_virtual=2, num_sink=2,
                                                 latent_size=8, num_recent=4, gate=True, gate_init=-6.0)
        assert config.teacher_vocab_size == 0 and config.teacher_num_layers == 2
        torch.manual_seed(0)
        compressor = SSMCompressor(config).eval()
        cache = compressed_cache(teacher, compressor, prefix)
        assert cache.keys[0].shape[2] == config.cache_length == 8
        out = forward_with_prefix(teacher, cache, query).predictions[:, -1]
        assert out.shape == (3,) and torch.isfinite(out).all()
        # closed gates: the cache is the sinks and the last 4 tokens, as the window of 4 holds them
        window = forward_with_prefix(teacher, window_cache(teacher, prefix, None, 2, 4), query).predictions[:, -1]
        torch.testing.assert_close(out, window, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(3, 12\)"):
        dense_cache(teacher, prefix, torch.ones(3, 5, dtype=torch.bool))


def test_the_distillation_trains_a_compressor_for_the_regression_teacher(tmp_path):
    """The same two-stage training (KV alignment, then predictions, hidden states, ranking) on
    targets from the regression teacher; stage 2 brings the compressed predictions closer."""
    from icl_ssm_bench.synthetic.distill import regression_targets

    from icl_ssm.compress.cache import compressed_cache
    from icl_ssm.compress.compressor import load_compressor
    from icl_ssm.distill.config import DistillConfig
    from icl_ssm.distill.train import train
    from icl_ssm.lm.prefix import forward_with_prefix

    teacher = tiny_teacher(max_pairs=12)
    task = RegressionTask("linear", d=4, clusters=2, seed=0)
    shape = dict(state_size=8, num_virtual=2, num_sink=2, latent_size=8, num_recent=2, gate=False)
    targets = regression_targets(teacher, task, samples=16, k=6, queries=4, group_size=4, pool_size=30,
                                 num_sink=2, num_virtual=2, num_recent=2, seed=0)
    assert len(targets) == 16 and [e.group for e in targets.episodes[:5]] == [0, 0, 0, 0, 1]
    first = targets.get(0)
    assert first["prompt_values"].shape == (12, 5) and first["query_values"].shape == (4, 1, 5)
    assert first["pool_k"].shape == (2, 2, 2, 8) and first["hidden"].shape == (4, 2, 32)
    cfg = DistillConfig(model="regression-tiny", tasks=("synthetic-linear",), k=6, samples=16, queries=4,
                        group_size=4, stage1_epochs=2, stage2_epochs=8, stage1_lr=3e-3, stage2_lr=3e-3,
                        warmup_ratio=0.0, checkpoint_every=1000, system="scale_invariant", **shape)
    (tmp_path / "comp").mkdir()
    compressor = train(teacher, targets, cfg, tmp_path / "comp")
    history = [json.loads(line) for line in (tmp_path / "comp" / "history.jsonl").read_text().splitlines()]
    stage2 = [h["mse"] for h in history if h["stage"] == 2]
    assert stage1_ok(history) and np.mean(stage2[-4:]) < np.mean(stage2[:4])
    loaded = load_compressor(tmp_path / "comp", teacher.config)
    with torch.no_grad():
        values = first["prompt_values"][None]
        a = forward_with_prefix(teacher, compressed_cache(teacher, compressor, values), first["query_values"][:1])
        b = forward_with_prefix(teacher, compressed_cache(teacher, loaded, values), first["query_values"][:1])
    torch.testing.assert_close(a.predictions, b.predictions)


def stage1_ok(history):
    kv = [h["kv"] for h in history if h["stage"] == 1]
    return len(kv) > 0 and all(np.isfinite(kv))


def test_regression_evaluator_scores_subsets_as_the_dense_prompt_does():
    from icl_ssm_bench.synthetic.select import RegressionEvaluator, nearest_prompts, split_examples, test_errors

    from icl_ssm.compress.builders import CompressedCache, DenseCache, WindowCache
    from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
    from icl_ssm.select.affinity import AffinitySelector

    teacher = tiny_teacher(max_pairs=12)
    task = RegressionTask("linear", d=4, clusters=2, seed=0)
    split = task.sample_selection(np.random.default_rng(0), 20, 0.5, 3, 5)
    pool, valid, test = split_examples(split)
    dense = RegressionEvaluator(teacher, split, DenseCache(teacher), batch=2)
    subsets = [[0, 1, 2], [5, 3, 9], [19, 4, 7]]
    got = dense.evaluate(pool, valid, subsets)
    with torch.no_grad():
        for s, loss, per_query in zip(subsets, got.losses, got.query_losses, strict=True):
            for j in range(3):
                xs = np.concatenate([split.pool_x[s], split.valid_x[j:j + 1]])[None]
                ys = np.concatenate([split.pool_y[s], [0.0]])[None]
                pred = teacher(values=prompt_values(xs, ys)[:, :-1]).predictions[0, -1].item()
                assert per_query[j] == pytest.approx((pred - split.valid_y[j]) ** 2, rel=1e-4, abs=1e-6)
            assert loss == pytest.approx(per_query.mean())
    assert got.cost.flops > 0 and got.tokens == 3 * (6 + 3)
    config = SSMCompressorConfig.for_teacher(teacher.config, state_size=8, num_virtual=2, num_sink=2, latent_size=8)
    compressed = RegressionEvaluator(teacher, split, CompressedCache(teacher, SSMCompressor(config).eval()))
    assert compressed.evaluate(pool, valid[:2], subsets).query_losses.shape == (3, 2)
    window = RegressionEvaluator(teacher, split, WindowCache(teacher, num_sink=2, n_window=2))
    got_window = window.evaluate(pool, valid, subsets)
    assert got_window.losses.shape == (3,) and got_window.tokens == 3 * (2 + 2 + 3)
    sel = AffinitySelector(dense, subsets=12).select(pool, valid, 3, np.random.default_rng(0))
    assert len(sel.indices) == 3 and sel.details["evaluator"] == "dense"
    one = test_errors(teacher, split, [sel.indices])
    assert one.shape == (5,) and np.isfinite(one).all()
    near = nearest_prompts(split, 3)
    d = ((split.pool_x - split.test_x[0]) ** 2).sum(1)
    assert len(near) == 5 and near[0][-1] == int(np.argmin(d))
    assert test_errors(teacher, split, near).shape == (5,)
    with pytest.raises(TypeError, match="cache='nope': expected a CacheBuilder"):
        RegressionEvaluator(teacher, split, "nope")


def test_the_synthetic_command_runs_the_study_on_tiny_settings(tmp_path, capsys):
    from icl_ssm.cli import main

    teacher, comp = str(tmp_path / "teacher"), str(tmp_path / "comp")
    assert main(["synthetic", "train", "--out", teacher, "--dims", "4", "--clusters", "2", "--max-pairs", "8",
                 "--hidden-size", "32", "--steps", "20", "--batch", "8"]) == 0
    assert main(["synthetic", "evaluate", "--teacher", teacher, "--prompts", "8"]) == 0
    evaluation = json.loads((tmp_path / "teacher" / "evaluation.json").read_text())
    assert [r["k"] for r in evaluation["by_k"]] == list(range(9)) and {r["k"] for r in evaluation["mixed"]} == set()
    assert all(r["teacher_se"] > 0 for r in evaluation["by_k"]) and "±" in capsys.readouterr().out
    shape = ["--state-size", "8", "--num-virtual", "2", "--num-sink", "2", "--latent-size", "8"]
    assert main(["synthetic", "distill", "--teacher", teacher, "--out", comp, "--k", "4", "--samples", "8",
                 "--pair-size", "3", "--pair-window", "2", *shape]) == 0
    saved = json.loads((tmp_path / "comp" / "config.json").read_text())
    assert (saved["pair_size"], saved["pair_window"]) == (3, 2)
    assert main(["synthetic", "distill", "--teacher", teacher, "--out", comp + "-c", "--k", "4", "--samples", "8",
                 "--control", "--ssm-input", "layer:1", *shape]) == 0
    capsys.readouterr()
    out = tmp_path / "select"
    assert main(["synthetic", "select", "--teacher", teacher, "--compressor", comp, "--k", "3", "5", "--seeds", "0",
                 "1", "--subsets", "12", "--queries", "3", "--pool-size", "20", "--estimator", "ridge",
                 "--out", str(out)]) == 0
    result = json.loads((out / "select.json").read_text())
    assert result["estimator"] == "ridge"
    methods = {r["method"] for r in result["summary"]}
    assert methods == {"random", "topk", "affinity-dense", "affinity-compressed"}
    assert {r["k"] for r in result["summary"]} == {3, 5} and all(r["seeds"] == 2 for r in result["summary"])
    assert {s["subsets"] for s in result["scores"]} == {10} and (out / "select.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 5 | affinity-compressed |" in (out / "select.md").read_text()
    capsys.readouterr()
    assert main(["synthetic", "fidelity", "--teacher", teacher, "--compressor", comp, "--control", comp + "-c",
                 "--k", "4", "--subsets", "8", "--queries", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"compressed", "control", "window", "dense", "paired", "flop_ratio", "cache_flop_ratio"} <= set(report)
    assert report["dense"]["cache_flops_per_subset"] < report["dense"]["flops_per_subset"]
    assert report["cache_flop_ratio"] == report["dense"]["cache_flops_per_subset"] / report["compressed"][
        "cache_flops_per_subset"]
    assert main(["synthetic", "probe", "--teacher", teacher, "--compressor", comp, "--k", "4", "--pairs", "6"]) == 0
    probe = json.loads(capsys.readouterr().out)
    assert 0 <= probe["compressed"]["higher_share"] <= 1 and probe["dense"]["flipped"] > 0
    assert 0 <= probe["state_separability"]["accuracy"] <= 1 and probe["state_separability"]["pairs"] == 24

"""``icl-ssm select`` end to end on a tiny random model and a .jsonl task (no download)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from icl_ssm.cli import main
from icl_ssm.compress import pretrained as pretrained_mod
from icl_ssm.compress.builders import DenseCache
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.tiny import tiny_model
from icl_ssm.select.base import top_k_per_label
from icl_ssm.select.estimators import mean_affinity
from icl_ssm.select.sampling import stratified_subsets
from icl_ssm.select.subset_losses import CacheEvaluator, reliability

SMALL = dict(state_size=16, num_virtual=4, num_sink=2, latent_size=8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("select")
    task = get_task("coin_flip", size=120)
    data = root / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        SSMCompressor(SSMCompressorConfig.for_teacher(tiny_model("llama").config, **SMALL)).save_pretrained(
            root / "comp")
        SSMCompressor(SSMCompressorConfig.for_teacher(tiny_model("qwen2").config, **SMALL)).save_pretrained(
            root / "qwen")
    return {"data": str(data), "comp": str(root / "comp"), "qwen": str(root / "qwen"), "root": root}


def args(files, *extra):
    return ["select", "--model", "tiny-llama", "--task", files["data"], "--k", "3", "--pool-size", "24",
            "--queries", "3", "--test-size", "6", "--batch", "4", "--query-batch", "6", *extra]


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_affinity_writes_selection_summary_and_config(files, tmp_path, capsys):
    out = tmp_path / "sel"
    summary = run_json(capsys, *args(files, "--compressor", files["comp"], "--subsets", "16", "--out", str(out)))
    assert set(summary) >= {"method", "k", "indices", "test_accuracy", "flops", "wall_seconds", "subsets"}
    assert summary["method"] == "affinity" and summary["subsets"] == 16 and len(set(summary["indices"])) == 3
    assert 0.0 <= summary["test_accuracy"] <= 1.0 and summary["flops"] > 0
    rows = [json.loads(line) for line in (out / "selected.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == summary["ids"]
    assert all({"id", "text", "label", "score"} <= set(r) for r in rows)
    assert json.loads((out / "summary.json").read_text())["indices"] == summary["indices"]
    assert json.loads((out / "select_config.json").read_text())["subsets"] == 16
    prompt = (out / "prompt.txt").read_text()
    assert all(r["text"] in prompt for r in rows)
    assert not list(out.glob(".*.tmp"))
    again = run_json(capsys, *args(files, "--compressor", files["comp"], "--subsets", "16"))
    assert again["indices"] == summary["indices"]  # same seed -> same selection


@pytest.mark.parametrize("method", ["random", "bm25", "topk", "gradce"])
def test_baselines_run_through_the_command(files, capsys, method):
    summary = run_json(capsys, *args(files, "--method", method))
    assert summary["method"] == method and len(set(summary["indices"])) == 3


def test_dense_evaluator_and_ridge(files, capsys):
    summary = run_json(capsys, *args(files, "--evaluator", "dense", "--estimator", "ridge", "--subsets", "16"))
    assert summary["evaluator"] == "dense" and summary["estimator"] == "ridge" and summary["subsets"] == 16


def test_packed_queries_by_default_select_like_the_padded_batches(files, tmp_path, capsys):
    runs = {}
    for name, extra in (("packed", []), ("batched", ["--no-pack"])):
        out = tmp_path / name
        runs[name] = run_json(capsys, *args(files, "--compressor", files["comp"], "--subsets", "16", "--out", str(out)),
                              *extra)
        runs[name]["scores"] = [json.loads(line)["score"] for line in (out / "selected.jsonl").read_text().splitlines()]
        assert json.loads((out / "select_config.json").read_text())["pack"] is (name == "packed")
    assert runs["packed"]["indices"] == runs["batched"]["indices"]
    assert runs["packed"]["scores"] == pytest.approx(runs["batched"]["scores"], abs=1e-4)
    # FLOPs: packing drops the padding of the query batches but attends across the packed
    # segments (masked, computed all the same); on this tiny model the second outweighs the
    # first, on SmolLM2-135M the first (docs/research/selection-cost.md), so no order is asserted
    assert runs["packed"]["flops"] > 0 and runs["batched"]["flops"] > 0


def test_label_balanced_affinity(files, tmp_path, capsys):
    out = tmp_path / "bal"
    summary = run_json(capsys, *args(files, "--compressor", files["comp"], "--subsets", "16", "--balance-labels",
                                     "--out", str(out)))
    assert len(set(summary["indices"])) == 3
    assert json.loads((out / "select_config.json").read_text())["balance_labels"] is True
    assert {"split_half", "reliability", "queries_needed"} <= set(summary)


def test_per_label_shares_the_places_out_over_the_labels(files, tmp_path, capsys):
    from icl_ssm.lm.models import load_model
    from icl_ssm.select.config import SelectConfig
    from icl_ssm.select.stage import select_demonstrations

    model, tokenizer = load_model("tiny-llama")
    for method, seed in (("random", 1), ("bm25", 0)):  # random's seed-1 choice leans 3:1 to "yes"
        labels = [e.target for e in split(get_task(files["data"]), pool_size=24, seed=seed).pool]
        cfg = SelectConfig(model="tiny-llama", task=files["data"], k=4, method=method, pool_size=24, queries=3,
                           test_size=6, seed=seed)
        base, _, _ = select_demonstrations(cfg, model, tokenizer)
        out = tmp_path / method
        quota = run_json(capsys, *args(files, "--method", method, "--k", "4", "--seed", str(seed), "--per-label",
                                       "--out", str(out)))
        assert quota["per_label"] is True
        assert quota["labels"] == {"no": 2, "yes": 2}
        if method == "random":
            assert sorted(labels[i] for i in base.indices) == ["no"] + ["yes"] * 3
            assert main(args(files, "--method", method, "--k", "4", "--seed", "1")) == 0
            assert "warning: 3 of the 4 chosen demonstrations are 'yes'" in capsys.readouterr().err
            assert main(args(files, "--method", method, "--k", "4", "--seed", "1", "--per-label")) == 0
            assert "warning" not in capsys.readouterr().err
        assert sorted(labels[i] for i in quota["indices"]) == ["no"] * 2 + ["yes"] * 2
        assert quota["indices"] == top_k_per_label(base.scores, labels, 4)  # the same scores, re-chosen
        assert json.loads((out / "select_config.json").read_text())["per_label"] is True
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"text": f"x {i}", "label": str(i % 5)}) + "\n" for i in range(60)))
    assert main(args({"data": str(many)}, "--method", "random", "--per-label")) == 2
    assert "shares the k=3 places out over the pool's labels, but task" in capsys.readouterr().err


def test_stratify_draws_every_subset_with_the_labels_in_even_shares(files, tmp_path, capsys):
    from icl_ssm.lm.models import load_model
    from icl_ssm.lm.prompts import PromptBuilder

    out = tmp_path / "strat"
    summary = run_json(capsys, *args(files, "--evaluator", "dense", "--k", "4", "--subsets", "12", "--stratify",
                                     "--out", str(out)))
    assert summary["stratified"] is True and summary["per_label"] is True
    assert summary["labels"] == {"no": 2, "yes": 2} and summary["subsets"] == 12
    assert json.loads((out / "select_config.json").read_text())["stratify"] is True
    # the same selection by hand: the stratified stream, dense losses, the mean estimator, chosen per label
    model, tokenizer = load_model("tiny-llama")
    task = get_task(files["data"])
    splits = split(task, pool_size=24, seed=0)
    labels = [e.target for e in splits.pool]
    subsets = stratified_subsets(labels, 4, 12, np.random.default_rng(0))
    builder = PromptBuilder.for_model(model, tokenizer, task)
    losses = CacheEvaluator(model, builder, DenseCache(model), pack=True).evaluate(
        splits.pool, splits.validation[:3], subsets).losses
    scores = mean_affinity(subsets, losses, 24)[0]
    assert summary["indices"] == top_k_per_label(scores, labels, 4)
    assert main(args(files, "--method", "random", "--stratify")) == 2
    assert "--stratify draws affinity's subsets" in capsys.readouterr().err


def test_order_rearranges_the_same_selection(files, tmp_path, capsys):
    base = run_json(capsys, *args(files, "--method", "random", "--k", "5"))
    out = tmp_path / "mixed"
    mixed = run_json(capsys, *args(files, "--method", "random", "--k", "5", "--order", "interleave", "--out", str(out)))
    assert base["order"] == "score" and mixed["order"] == "interleave"
    assert sorted(mixed["indices"]) == sorted(base["indices"])
    pool = split(get_task(files["data"]), pool_size=24, seed=0).pool
    labels = [pool[i].target for i in base["indices"]]
    from icl_ssm.select.base import arrange

    assert mixed["indices"] == arrange(base["indices"], labels, "interleave", None)
    rows = [json.loads(line) for line in (out / "selected.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == mixed["ids"]  # the files list the prompt order
    assert json.loads((out / "select_config.json").read_text())["order"] == "interleave"
    searched = run_json(capsys, *args(files, "--method", "random", "--k", "5", "--order", "search",
                                      "--order-candidates", "4"))
    found = searched["order_search"]
    assert [c["order"] for c in found["candidates"]] == ["score", "interleave", "random", "random"]
    first, second = found["candidates"][:2]
    assert first["indices"] == base["indices"] and second["indices"] == mixed["indices"]
    losses = [c["validation_loss"] for c in found["candidates"]]
    chosen = found["chosen"]
    assert searched["indices"] == found["candidates"][chosen]["indices"] and min(losses) == losses[chosen]
    with pytest.raises(SystemExit):
        main(args(files, "--method", "random", "--order", "best"))
    assert "invalid choice: 'best'" in capsys.readouterr().err


@pytest.mark.parametrize("split, warned", [(0.9, None), (0.35, "about 119 queries"), (-0.2, "mostly noise")])
def test_reliability_lines_warn_with_the_queries_it_would_take(split, warned):
    from icl_ssm.select.notices import reliability_lines

    lines = reliability_lines({"validation_size": 32, **reliability(split, 32)})
    assert lines[0].startswith(f"split-half of the subset losses: {split:.2f}")
    assert (len(lines) == 1) if warned is None else (warned in lines[1])
    assert reliability_lines({"validation_size": 32, "split_half": None}) == []


def test_bad_input_is_refused(files, tmp_path, capsys):
    assert main(args(files, "--k", "0", "--method", "random")) == 2
    assert "--k 0" in capsys.readouterr().err
    assert main(args(files, "--k", "25", "--method", "random")) == 2
    assert "pool_size=24 is smaller than k=25" in capsys.readouterr().err
    assert main(args(files)) == 2  # affinity on compressed caches without a compressor
    assert "needs --compressor" in capsys.readouterr().err
    assert main(args(files, "--compressor", files["qwen"])) == 2
    assert "cannot serve this model" in capsys.readouterr().err
    assert main(args(files, "--compressor", files["comp"], "--subsets", "3", "--coverage", "1")) == 2
    assert "--subsets >= 8" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(args(files, "--method", "random", "--out", str(tmp_path / "file"))) == 2
    assert "is a file" in capsys.readouterr().err
    from icl_ssm.select.config import SelectConfig

    with pytest.raises(ValueError, match="--order 'best'; accepted: score, interleave, random, search"):
        SelectConfig(order="best").validate()
    with pytest.raises(ValueError, match="--order-candidates 1: expected >= 2"):
        SelectConfig(order="search", order_candidates=1).validate()


def test_two_processes_select_like_one(files, tmp_path, tmp_cache, capsys):
    """``accelerate launch`` with 2 CPU processes (gloo) shards the subsets, same selection."""
    extra = ("--compressor", files["comp"], "--subsets", "10", "--estimator", "ridge")
    one = run_json(capsys, *args(files, *extra))
    env = {**os.environ, "ICL_SSM_CACHE": str(tmp_cache), "OMP_NUM_THREADS": "1"}
    accelerate = Path(sys.executable).with_name("accelerate")
    result = subprocess.run([str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "-m", "icl_ssm",
                             *args(files, *extra, "--out", str(tmp_path / "two")), "--json"],
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    two = json.loads(result.stdout)
    assert two["indices"] == one["indices"] and two["subsets"] == 10
    # the per-query losses are gathered too: the split-half reliability is the one-process value
    assert one["split_half"] is not None and two["split_half"] == pytest.approx(one["split_half"], abs=1e-6)
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["indices"] == one["indices"]


def test_hub_task_offline_is_a_clear_error(capsys, tmp_cache):
    assert main(["select", "--model", "tiny-llama", "--task", "sst2", "--method", "random", "--k", "2"]) == 2
    err = capsys.readouterr().err
    assert "icl-ssm select: error:" in err and "hub" in err and "Traceback" not in err


def test_affinity_without_a_compressor_takes_the_shipped_one(files, tmp_path, monkeypatch, capsys):
    shipped = tmp_path / "tiny--coin--k3"
    shipped.mkdir()
    (shipped / "recipe.json").write_text(json.dumps({"model": "tiny-llama", "tasks": [files["data"]], "k": 3}))
    (shipped / "compressor").symlink_to(files["comp"])
    monkeypatch.setattr(pretrained_mod, "pretrained_root", lambda: tmp_path)
    given = run_json(capsys, *args(files, "--compressor", files["comp"], "--subsets", "8"))
    out = tmp_path / "sel"
    assert main([*args(files, "--subsets", "8", "--out", str(out)), "--json"]) == 0
    captured = capsys.readouterr()
    assert "using the one shipped for tiny-llama" in captured.err and "tiny--coin--k3" in captured.err
    assert json.loads(captured.out)["indices"] == given["indices"]
    assert json.loads((out / "select_config.json").read_text())["compressor"] == str(shipped / "compressor")
    monkeypatch.setattr(pretrained_mod, "pretrained_root", lambda: tmp_path / "none")
    assert main(args(files, "--subsets", "8")) == 2
    assert "none is shipped for --model tiny-llama" in capsys.readouterr().err


def test_a_budget_sizes_queries_and_subsets_from_a_pilot(files, capsys):
    argv = [*args(files, "--method", "affinity", "--evaluator", "compressed", "--compressor", files["comp"]),
            "--queries", "12", "--budget", "0.05"]  # 3 s
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "select: pilot: 16 subsets x 8 queries" in err and "select: plan for reliability 0.8:" in err
    assert "select: reached: reliability of the subset losses" in err
    summary = run_json(capsys, *argv)
    budget = summary["budget"]
    assert summary["subsets"] == budget["subsets"] == budget["plan"]["subsets"] >= 16
    assert 8 <= summary["queries_used"] == budget["plan"]["queries"] <= 12
    assert budget["plan"]["estimated_seconds"] <= 3.0 or budget["plan"]["subsets"] == 16  # never below the pilot
    assert set(budget["reached"]) == {"loss_split_half", "loss_reliability", "score_split_half", "score_reliability"}
    assert main([*argv, "--subsets", "30"]) == 2
    assert "--budget 0.05 sizes the subsets from a pilot round" in capsys.readouterr().err


def test_test_orders_give_an_order_averaged_accuracy(files, capsys):
    one = run_json(capsys, *args(files, "--method", "random"))
    many = run_json(capsys, *args(files, "--method", "random", "--test-orders", "3"))
    assert many["indices"] == one["indices"] and many["test_accuracy"] == one["test_accuracy"]
    accs = many["test_accuracy_orders"]
    assert len(accs) == 4 and accs[0] == one["test_accuracy"]
    assert many["test_accuracy_order_mean"] == pytest.approx(np.mean(accs))
    assert many["test_accuracy_std"] == pytest.approx(np.std(accs, ddof=1))
    assert "test_accuracy_orders" not in one


def test_the_papers_selection_recipe_fills_the_flags_not_given():
    from icl_ssm.pipeline import RunConfig
    from icl_ssm.select.config import SelectConfig, apply_recipe, given_flags

    assert given_flags(["--k", "3", "--pool-size=40", "--subsets", "9", "x"]) == {"k", "pool_size", "subsets"}
    paper = apply_recipe(SelectConfig(pool_size=100), "paper", set())
    assert (paper.subsets, paper.queries) == (150, 50)
    kept = apply_recipe(SelectConfig(pool_size=100, subsets=30, queries=8), "paper", {"subsets", "queries"})
    assert (kept.subsets, kept.queries) == (30, 8)
    run = apply_recipe(RunConfig(pool_size=60), "paper", {"queries"})
    assert (run.subsets, run.queries) == (90, RunConfig().queries)
    assert apply_recipe(SelectConfig(), "measured", set()) == SelectConfig()
    with pytest.raises(ValueError, match="--recipe 'authors'; accepted: measured, paper"):
        apply_recipe(SelectConfig(), "authors", set())


def test_select_with_the_papers_recipe(files, capsys):
    summary = run_json(capsys, *args(files, "--method", "affinity", "--evaluator", "dense", "--recipe", "paper",
                                     "--queries", "3"))
    assert summary["subsets"] == 36 and summary["validation_size"] == 3  # 1.5 x the pool of 24; --queries given

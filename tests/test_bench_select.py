"""The selection benchmarks run end to end on a tiny random model (their numbers are not checked)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from icl_ssm_bench import estimators as bench_estimators
from icl_ssm_bench.headroom import headroom_summary
from icl_ssm_bench.select_order import order_tables, tail_run

from icl_ssm.cli import main
from icl_ssm.compress.builders import DenseCache
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import spearman_brown
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.tiny import tiny_model
from icl_ssm.select.base import arrange, order_rng, top_k, top_k_per_label
from icl_ssm.select.estimators import mean_affinity, ridge_affinity
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm.select.sampling import balanced_subsets, stratified_subsets
from icl_ssm.select.subset_losses import CacheEvaluator


def test_order_tables_average_the_random_draws_per_selection():
    rows = [{"report": "r", "seed": seed, "method": m, "order": o, "test_accuracy": a}
            for seed, m, o, a in [(0, "x", "score", 0.5), (0, "x", "random", 0.6), (0, "x", "random", 0.8),
                                  (1, "x", "score", 0.7), (1, "x", "random", 0.7), (1, "x", "random", 0.7),
                                  (0, "y", "score", 0.4), (0, "y", "random", 0.2), (0, "y", "random", 0.4)]]
    got = order_tables(rows, ["score", "random"])
    random = got["table"]["random"]
    assert random["selections"] == 3 and random["draws"] == 2
    assert random["mean"] == pytest.approx((0.7 + 0.7 + 0.3) / 3)
    assert random["within_std"] == pytest.approx((0.1 + 0.0 + 0.1) / 3)
    assert random["paired_diff"] == pytest.approx((0.2 + 0.0 - 0.1) / 3)
    assert (random["wins"], random["losses"]) == (1, 1)
    assert "draws" not in got["table"]["score"]
    x = got["methods"]["r"]["x"]
    assert x["score"] == pytest.approx({"mean": 0.6, "std": 0.1, "seeds": 2})
    assert x["random"]["mean"] == pytest.approx(0.7) and got["methods"]["r"]["y"]["random"]["seeds"] == 1


def test_selection_benchmarks_produce_tables(tmp_path, capsys):
    task = get_task("coin_flip", size=120)
    data = tmp_path / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = SSMCompressorConfig.for_teacher(tiny_model("llama").config, state_size=16, num_virtual=4,
                                                 num_sink=2, latent_size=8)
        SSMCompressor(config).save_pretrained(tmp_path / "comp")
    common = ["--model", "tiny-llama", "--compressor", str(tmp_path / "comp"), "--queries", "3"]
    out = tmp_path / "cost.json"
    assert main(["bench", "select-cost", *common, "--task", str(data), "--k", "2", "3", "--subsets", "1",
                 "--per-query-max-k", "2", "--json-out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["k"], r["evaluator"]) for r in rows] == [
        (2, "compressed"), (2, "dense"), (2, "compressed-packed"), (2, "dense-packed"), (2, "dense-per-query"),
        (3, "compressed"), (3, "dense"), (3, "compressed-packed"), (3, "dense-packed")]
    assert rows[2]["flops_vs_compressed"] == 1.0 and rows[3]["flops_vs_compressed"] == pytest.approx(
        rows[3]["flops_per_subset"] / rows[2]["flops_per_subset"])  # ratios within one query path
    assert all(r["flops_per_subset"] > 0 for r in rows)
    # seconds come from a pass without the FLOP counter, beside the counted pass's
    assert all(r["seconds_per_subset"] > 0 and r["seconds_per_subset_counting"] > 0 for r in rows)
    per_query = rows[4]["flops_per_subset"]
    assert per_query > rows[1]["flops_per_subset"]  # per-query re-reads the prompt for every query
    assert "| 3 |" in capsys.readouterr().out
    out = tmp_path / "quality.json"
    assert main(["bench", "select-quality", *common, "--tasks", str(data), "--seeds", "0", "1", "--k", "3",
                 "--pool-size", "20", "--test-size", "4", "--subsets", "8", "--methods", "affinity",
                 "affinity:dense", "affinity:again", "random", "--also", f"again={tmp_path / 'comp'}",
                 "--json-out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "affinity:dense" in table and "**mean**" in table and "chosen in common with dense" in table
    result = json.loads(out.read_text())
    zero = [r for r in result["runs"] if r["method"] == "zero-shot"]  # one per seed, no demonstrations
    assert [(r["seed"], r["indices"]) for r in zero] == [(0, []), (1, [])] and "zero-shot" in table
    assert result["table"][str(data)]["zero-shot"][0] == pytest.approx(np.mean([r["test_accuracy"] for r in zero]))
    agree = {(a["seed"], a["method"]): a for a in result["agreement"]}
    assert set(agree) == {(s, m) for s in (0, 1) for m in ("affinity", "affinity:again")}
    for seed in (0, 1):  # the same compressor under another name: the same subsets, the same losses
        first, again = agree[seed, "affinity"], agree[seed, "affinity:again"]
        assert first == {**again, "method": "affinity"}
        runs = [r for r in result["runs"] if r["seed"] == seed and r["method"].startswith("affinity")]
        assert len({len(r["subset_losses"]) for r in runs}) == 1
        assert all(len(r["query_losses"]) == len(r["subset_losses"]) and len(r["query_losses"][0]) == 3 for r in runs)
        assert "dense_reliability" in first and "dense_queries_needed" in first
    assert result["settings"]["order"] == "score"
    ordered = tmp_path / "order.json"
    assert main(["bench", "select-order", "--model", "tiny-llama", "--reports", str(out), "--json-out",
                 str(ordered)]) == 0
    table = capsys.readouterr().out
    assert "paired diff vs score" in table and "| quality | 1 | affinity:again | " in table
    order = json.loads(ordered.read_text())
    assert len(order["rows"]) == 3 * len(result["runs"]) and order["table"]["interleave"]["selections"] == 10
    zero_rows = [r for r in order["rows"] if r["method"] == "zero-shot"]
    assert {(r["seed"], r["test_accuracy"]) for r in zero_rows} == {(r["seed"], r["test_accuracy"]) for r in zero}
    assert all(r["reproduced"] for r in order["rows"] if r["order"] == "score")  # the report's own order, rescored
    assert tail_run(["a", "b", "b"]) == 2 and tail_run(["b"]) == 1
    assert main(["bench", "select-order", "--model", "tiny-llama", "--reports", str(out), "--orders", "score",
                 "random", "--permutations", "3", "--json-out", str(ordered)]) == 0
    assert "| random | 10 |" in capsys.readouterr().out
    order = json.loads(ordered.read_text())
    assert len(order["rows"]) == 4 * len(result["runs"]) and order["table"]["random"]["draws"] == 3
    for run in (r for r in result["runs"] if r["method"] != "zero-shot"):
        drawn = [r["indices"] for r in order["rows"] if r["order"] == "random" and r["seed"] == run["seed"]
                 and r["method"] == run["method"]]
        assert len(drawn) == 3 and all(sorted(d) == sorted(run["indices"]) for d in drawn)
        # the first draw is `select --order random`'s; later draws continue the same generator
        assert drawn[0] == arrange(run["indices"], [""] * len(run["indices"]), "random", order_rng(run["seed"]))
    assert main(["bench", "select-order", "--reports", str(out), "--permutations", "0"]) == 2
    assert "--permutations 0; expected >= 1" in capsys.readouterr().err
    assert main(["bench", "select-order", "--model", "tiny-qwen2", "--reports", str(out)]) == 2
    assert "model 'tiny-qwen2' is expected, found model 'tiny-llama'" in capsys.readouterr().err
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({**result, "settings": {**result["settings"], "order": "interleave"}}))
    assert main(["bench", "select-order", "--model", "tiny-llama", "--reports", str(mixed)]) == 2
    assert "were put in 'interleave' order" in capsys.readouterr().err
    assert main(["bench", "select-order", "--reports", str(out), "--orders", "best"]) == 2
    assert "--orders 'best'; accepted" in capsys.readouterr().err
    assert main(["bench", "select-quality", *common, "--tasks", str(data), "--methods", "affinity:nope"]) == 2
    assert "unknown evaluator 'nope'; accepted: compressed, dense" in capsys.readouterr().err
    out = tmp_path / "est.json"
    assert main(["bench", "estimators", *common, "--task", str(data), "--evaluator", "dense", "--k", "3",
                 "--seeds", "0", "--budgets", "4", "8", "--pool-size", "12", "--test-size", "4",
                 "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["curve"]) == {"mean", "ridge", "mean+adaptive", "ridge+adaptive"}
    assert result["subsets_to_reach_mean_at_max"]["mean"] <= 8
    assert result["subsets_to_reach_mean_loss_at_max"]["mean"] <= 8
    assert set(result["loss_curve"]) == set(result["curve"]) and all(r["test_loss"] > 0 for r in result["rows"])
    assert "| estimator (test loss) |" in capsys.readouterr().out
    # the order averaged out: each selected set scored in the same 3 random orders of its seed
    averaged = tmp_path / "est-perm.json"
    assert main(["bench", "estimators", *common, "--task", str(data), "--evaluator", "dense", "--k", "3",
                 "--seeds", "0", "--budgets", "8", "--pool-size", "12", "--test-size", "4", "--permutations", "3",
                 "--balance-labels", "--json-out", str(averaged)]) == 0
    perm = json.loads(averaged.read_text())
    assert perm["settings"]["permutations"] == 3 and perm["settings"]["balance_labels"] is True
    model, tokenizer = load_model("tiny-llama")
    task = get_task(str(data))
    splits = split(task, pool_size=12, seed=0)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    row = perm["rows"][0]
    stream = balanced_subsets(12, 3, 8, np.random.default_rng(0))
    losses = CacheEvaluator(model, builder, DenseCache(model), pack=True, balance_labels=True).evaluate(
        splits.pool, splits.validation[:3], stream).losses
    chosen = sorted(top_k(np.nan_to_num(mean_affinity(stream, losses, 12)[0], nan=-np.inf), 3))
    rng = order_rng(0)
    expected = np.mean([evaluate_selection(model, builder, [splits.pool[chosen[i]] for i in rng.permutation(3)],
                                             splits.test[:4])["loss"] for _ in range(3)])
    assert row["estimator"] == "mean" and row["test_loss"] == pytest.approx(expected, rel=1e-5)
    quota = tmp_path / "est-quota.json"
    assert main(["bench", "estimators", *common, "--task", str(data), "--evaluator", "dense", "--k", "4",
                 "--seeds", "0", "--budgets", "8", "--pool-size", "12", "--test-size", "4", "--per-label",
                 "--no-adaptive", "--json-out", str(quota)]) == 0
    rows = {r["estimator"]: r for r in json.loads(quota.read_text())["rows"]}
    assert set(rows) == {"mean", "ridge", "mean/per-label", "ridge/per-label"}  # no adaptive rounds
    stream = balanced_subsets(12, 4, 8, np.random.default_rng(0))
    losses = CacheEvaluator(model, builder, DenseCache(model), pack=True).evaluate(
        splits.pool, splits.validation[:3], stream).losses
    scores = mean_affinity(stream, losses, 12)[0]
    assert rows["mean"]["indices"] == top_k(scores, 4)
    assert rows["mean/per-label"]["indices"] == top_k_per_label(scores, [e.target for e in splits.pool], 4)
    assert rows["mean/per-label"]["labels"] == {"no": 2, "yes": 2}
    both = tmp_path / "est-both.json"  # uniform and stratified streams side by side
    assert main(["bench", "estimators", *common, "--task", str(data), "--evaluator", "dense", "--k", "4",
                 "--seeds", "0", "--budgets", "8", "--pool-size", "12", "--test-size", "4", "--sampling", "both",
                 "--no-adaptive", "--json-out", str(both)]) == 0
    rows = {r["estimator"]: r for r in json.loads(both.read_text())["rows"]}
    assert set(rows) == {"mean", "ridge", "mean/stratified", "ridge/stratified"}
    assert rows["mean"]["indices"] == top_k(scores, 4)  # the uniform rows as before
    labels = [e.target for e in splits.pool]
    stream = stratified_subsets(labels, 4, 8, np.random.default_rng(0))
    losses = CacheEvaluator(model, builder, DenseCache(model), pack=True).evaluate(
        splits.pool, splits.validation[:3], stream).losses
    assert rows["ridge/stratified"]["indices"] == top_k_per_label(ridge_affinity(stream, losses, 12)[0], labels, 4)
    assert rows["mean/stratified"]["labels"] == {"no": 2, "yes": 2}
    strat = tmp_path / "est-strat.json"  # stratified alone, with its adaptive rounds
    assert main(["bench", "estimators", *common, "--task", str(data), "--evaluator", "dense", "--k", "4",
                 "--seeds", "0", "--budgets", "8", "--pool-size", "12", "--test-size", "4", "--sampling",
                 "stratified", "--json-out", str(strat)]) == 0
    result = json.loads(strat.read_text())
    assert set(result["curve"]) == {"mean/stratified", "ridge/stratified", "mean+adaptive/stratified",
                                    "ridge+adaptive/stratified"}
    assert all(r["labels"] == {"no": 2, "yes": 2} for r in result["rows"])
    assert main(["bench", "estimators", *common, "--task", str(data), "--permutations", "-1"]) == 2
    assert "--permutations -1; expected >= 0" in capsys.readouterr().err


def test_estimators_keep_the_finished_seeds_when_a_later_one_fails(tmp_path, monkeypatch, capsys):
    task = get_task("coin_flip", size=120)
    data = tmp_path / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    real_split = bench_estimators.split

    def fail_on_seed_1(*a, seed, **kw):
        if seed == 1:
            raise ValueError("seed 1 stops here")
        return real_split(*a, seed=seed, **kw)

    monkeypatch.setattr(bench_estimators, "split", fail_on_seed_1)
    out = tmp_path / "est.json"
    argv = ["bench", "estimators", "--model", "tiny-llama", "--queries", "3", "--task", str(data), "--evaluator",
            "dense", "--k", "3", "--seeds", "0", "1", "--budgets", "4", "--pool-size", "12", "--test-size", "4",
            "--no-adaptive", "--json-out", str(out)]
    assert main(argv) == 2
    assert "seed 1 stops here" in capsys.readouterr().err
    partial = json.loads(out.read_text())
    assert partial["partial"] is True and partial["seeds_done"] == [0]
    assert {r["seed"] for r in partial["rows"]} == {0}
    assert {r["estimator"] for r in partial["rows"]} == {"mean", "ridge"}
    monkeypatch.setattr("icl_ssm_bench.estimators.split", split)
    assert main(argv) == 0
    full = json.loads(out.read_text())
    assert "partial" not in full and full["seeds_done"] == [0, 1]
    assert [r for r in full["rows"] if r["seed"] == 0] == partial["rows"]  # the same seed, the same rows


def test_estimators_simulation_recovers_planted_demonstrations(tmp_path):
    out = tmp_path / "sim.json"
    assert main(["bench", "estimators-sim", "--pool-size", "30", "--k", "3", "--noise", "0.0", "--budgets", "10",
                 "60", "--seeds", "0", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["curve"]) == {"mean", "ridge", "mean+adaptive", "ridge+adaptive"}
    assert result["curve"]["ridge"]["60"] == 1.0  # noiseless and 60 subsets: ridge recovers the planted best


def test_bench_label_scores_agrees_with_the_reference_path(tmp_cache, capsys):
    assert main(["bench", "label-scores", "--model", "tiny-llama", "--k", "3", "--subsets", "2", "--queries", "2",
                 "--repeats", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pairs"] == 4 and result["labels"] == 97
    assert result["max_abs_diff_scores"] < 1e-3 and result["max_abs_diff_logits"] < 1e-3
    assert result["flops_after"] < result["flops_before"]  # the query is read once, not once per branch


def test_agreement_with_the_dense_evaluator():
    from icl_ssm_bench.select_quality import agreement

    dense = {"task": "t", "seed": 0, "method": "affinity:dense", "subset_losses": [0.1, 0.2, 0.3, 0.4],
             "scores": [4.0, 3.0, None, 1.0], "indices": [0, 1]}
    same = {**dense, "method": "affinity"}
    flipped = {**dense, "method": "affinity:x", "subset_losses": [0.4, 0.3, 0.2, 0.1],
               "scores": [1.0, 3.0, 2.0, 4.0], "indices": [1, 3]}
    other_seed = {**dense, "seed": 1, "method": "affinity"}
    rows = agreement([dense, same, flipped, other_seed, {**dense, "method": "random", "subset_losses": None}], 2)
    assert [(r["method"], r["subset_loss_spearman"], r["overlap"]) for r in rows] == [
        ("affinity", 1.0, 2), ("affinity:x", -1.0, 1)]
    assert rows[0]["score_spearman"] == 1.0 and rows[1]["score_spearman"] == -1.0  # over the 3 scored by both


def test_reliability_script_follows_the_split_half_over_query_counts(tmp_path, capsys, monkeypatch):
    """research/reliability.py on a planted report: the dense losses are a subset effect plus
    query noise, the compressed ones the same effect almost without noise."""
    import importlib.util
    import sys

    path = Path(__file__).parents[1] / "research" / "reliability.py"
    spec = importlib.util.spec_from_file_location("reliability", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rng = np.random.default_rng(0)
    effect = rng.normal(size=(200, 1))
    dense = effect + 3.0 * rng.normal(size=(200, 64))
    labels = np.tile([0, 1], 32)
    runs = [{"task": "t", "seed": 0, "method": "affinity:dense", "query_losses": dense.tolist(),
             "query_labels": labels.tolist()},
            {"task": "t", "seed": 0, "method": "affinity", "query_losses": (effect + 0.01 * dense).tolist(),
             "query_labels": labels.tolist()}]
    rows = script.curve(runs[1], runs[0], [16, 64], base=16)
    assert rows[0]["vs_dense"] < rows[1]["vs_dense"]  # dense firms up with more queries
    assert rows[1]["vs_dense"] == pytest.approx(rows[1]["vs_dense_all"])
    dense_rows = script.curve(runs[0], None, [16, 32, 64], base=16)
    assert dense_rows[0]["split_half"] < dense_rows[2]["split_half"]
    assert dense_rows[2]["predicted"] == pytest.approx(spearman_brown(dense_rows[0]["split_half"], 4))
    assert dense_rows[2]["split_half"] == pytest.approx(dense_rows[2]["predicted"], abs=0.15)
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"runs": runs}))
    monkeypatch.setattr(sys, "argv", ["reliability.py", str(report), "--counts", "16", "64", "--base", "16"])
    script.main()
    out = capsys.readouterr().out
    assert out.count("| t | 0 | affinity |") == 2 and out.count("| t | 0 | affinity:dense |") == 2


def test_headroom_summary_bounds_every_set_by_the_answers_that_move():
    gold = np.array([0, 1, 1, 0, 1])
    pred = np.array([[0, 0, 0, 0, 1],   # question 4 always "1"; questions 1 and 2 move
                     [0, 1, 0, 0, 1],
                     [0, 1, 1, 0, 1]])
    correct = (pred == gold).astype(float)
    h = headroom_summary(correct, pred, gold)
    assert h["sets"] == 3 and h["queries"] == 5
    assert h["mean"] == pytest.approx((3 + 4 + 5) / 15) and h["max"] == 1.0 and h["min"] == pytest.approx(0.6)
    assert h["best_minus_mean"] == pytest.approx(1.0 - 0.8)
    assert h["moved"] == pytest.approx(2 / 5) and h["fixed_right"] == pytest.approx(3 / 5)
    assert h["fixed_right"] <= h["min"] and h["max"] <= h["fixed_right"] + h["moved"]
    assert h["some_set_right"] == 1.0 and h["constant_answer"] == pytest.approx(3 / 5)
    assert h["one_answer_share"] == pytest.approx((4 / 5 + 3 / 5 + 3 / 5) / 3)
    same = np.zeros((4, 5), dtype=int)  # every set answers "0" everywhere: nothing to select
    h = headroom_summary((same == gold).astype(float), same, gold)
    assert h["moved"] == 0.0 and h["std"] == 0.0 and h["one_answer_share"] == 1.0 and h["mean"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="at least 2"):
        headroom_summary(correct[:1], pred[:1], gold)
    with pytest.raises(ValueError, match="len\\(gold\\) = 4"):
        headroom_summary(correct, pred, gold[:4])


def test_headroom_scores_random_sets_of_one_pool(tmp_path, capsys):
    task = get_task("coin_flip", size=80)
    data = tmp_path / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    out = tmp_path / "headroom.json"
    assert main(["bench", "headroom", "--model", "tiny-llama", "--tasks", str(data), "--k", "3", "--sets", "3",
                 "--pool-size", "12", "--test-size", "5", "--json-out", str(out)]) == 0
    assert "| answers that move |" in capsys.readouterr().out
    h = json.loads(out.read_text())["tasks"][str(data)]
    assert h["sets"] == 3 and h["queries"] == 5 and len(h["set_rows"]) == 3
    model, tokenizer = load_model("tiny-llama")
    splits = split(get_task(str(data)), pool_size=12, seed=0)
    builder = PromptBuilder.for_model(model, tokenizer, get_task(str(data)))
    accs = []
    for row in h["set_rows"]:  # each set is rescored the same, its drawn order kept
        assert len(set(row["indices"])) == 3 and sum(row["labels"].values()) == 3
        accs.append(evaluate_selection(model, builder, [splits.pool[i] for i in row["indices"]],
                                         splits.test[:5])["accuracy"])
        assert row["test_accuracy"] == pytest.approx(accs[-1])
    assert h["mean"] == pytest.approx(np.mean(accs)) and h["fixed_right"] <= h["min"] <= h["max"]
    assert main(["bench", "headroom", "--model", "tiny-llama", "--tasks", str(data), "--sets", "1"]) == 2
    assert "--sets 1; expected >= 2" in capsys.readouterr().err
    assert main(["bench", "headroom", "--model", "tiny-llama", "--tasks", str(data), "--k", "50",
                 "--pool-size", "12"]) == 2
    assert "--k 50 is larger than" in capsys.readouterr().err


def test_headroom_checks_every_task_first_and_keeps_the_finished_ones(tmp_path, monkeypatch, capsys):
    data = tmp_path / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n"
                            for e in get_task("coin_flip", size=80).examples()))
    small = tmp_path / "small.jsonl"  # two examples: a pool of 2, too small for k = 3
    small.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n"
                             for e in get_task("coin_flip", size=80).examples()[:2]))
    calls = []
    evaluate = evaluate_selection
    monkeypatch.setattr("icl_ssm_bench.headroom.evaluate_selection",
                        lambda *a, **kw: calls.append(1) or evaluate(*a, **kw))
    out = tmp_path / "headroom.json"
    args = ["bench", "headroom", "--model", "tiny-llama", "--k", "3", "--sets", "2", "--pool-size", "12",
            "--test-size", "4", "--json-out", str(out)]
    assert main([*args, "--tasks", str(data), str(small)]) == 2
    assert "is larger than" in capsys.readouterr().err
    assert not calls and not out.exists()  # refused before the first task was scored

    def fail_on_the_second_task(model, builder, demos, test, **kw):
        if len(calls) == 2:
            raise RuntimeError("stopped")
        calls.append(1)
        return evaluate(model, builder, demos, test, **kw)

    monkeypatch.setattr("icl_ssm_bench.headroom.evaluate_selection", fail_on_the_second_task)
    with pytest.raises(RuntimeError, match="stopped"):
        main([*args, "--tasks", str(data), "coin_flip"])
    partial = json.loads(out.read_text())
    assert partial["partial"] is True and partial["tasks_done"] == [str(data)]
    assert partial["tasks"][str(data)]["sets"] == 2 and "coin_flip" not in partial["tasks"]


HARNESSES = {"estimators": ("estimators", "estimators_sim"), "headroom": ("headroom",),
             "select_cost": ("select_cost",), "select_order": ("select_order",),
             "select_quality": ("select_quality",), "selection": ()}


def test_bench_harnesses_take_a_config_not_a_namespace():
    """Only cli/ reads flags: no module of the benchmark package outside cli/ imports argparse, and
    none of their functions takes a Namespace (or a parameter named ``args``); each selection
    harness takes a frozen config dataclass of its own module."""
    import ast
    import dataclasses
    import importlib
    import inspect
    import typing

    import icl_ssm_bench

    root = Path(icl_ssm_bench.__file__).parent
    modules = sorted(p for p in root.rglob("*.py") if "cli" not in p.relative_to(root).parts)
    assert len(modules) > 20 and {f"{name}.py" for name in HARNESSES} <= {p.name for p in modules}
    for path in modules:  # every harness and the study; only cli/ reads flags
        name = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "argparse" for a in node.names), f"{where} imports argparse"
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "argparse", f"{where} imports from argparse"
            if isinstance(node, ast.Name | ast.Attribute):
                assert getattr(node, "id", getattr(node, "attr", None)) != "Namespace", f"{where} names a Namespace"
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                assert "args" not in [a.arg for a in params], f"{where} takes args"
    for name, harnesses in HARNESSES.items():
        module = importlib.import_module(f"icl_ssm_bench.{name}")
        for harness in harnesses:
            fn = getattr(module, harness)
            config = typing.get_type_hints(fn)[next(iter(inspect.signature(fn).parameters))]
            assert dataclasses.is_dataclass(config) and config.__dataclass_params__.frozen, (harness, config)
            assert config.__module__ == module.__name__, (harness, config)


def test_bench_configs_refuse_bad_flags_before_the_model_is_loaded(capsys):
    missing = ["--model", "no-such-model"]  # never loaded: validate() refuses first
    assert main(["bench", "select-cost", *missing]) == 2
    assert "--compressor: none given" in capsys.readouterr().err
    assert main(["bench", "estimators", *missing]) == 2
    assert "--evaluator compressed: no --compressor given" in capsys.readouterr().err
    assert main(["bench", "select-quality", *missing, "--also", "dense=x"]) == 2
    assert "the names ['dense'] are taken by the built-in evaluators" in capsys.readouterr().err
    assert main(["bench", "estimators-sim", "--pool-size", "10", "--k", "20"]) == 2
    assert "--k 20; expected 1 <= k <= --pool-size (10)" in capsys.readouterr().err


def test_legendre_energy_fast_path_matches_its_reference():
    from icl_ssm_bench.spectrum import cache_spectrum, legendre_energy, legendre_energy_ref
    from numpy.polynomial import legendre

    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3))
    np.testing.assert_allclose(legendre_energy(x, 12), legendre_energy_ref(x, 12), rtol=1e-9, atol=1e-12)
    fast = legendre_energy(x, 40)
    assert np.all(np.diff(fast) >= -1e-12) and fast[-1] == pytest.approx(1.0)  # every degree: all of it
    t = 2.0 * (np.arange(50) + 0.5) / 50 - 1.0
    cubic = legendre.legval(t, [0.0, 0.0, 0.0, 1.0])[:, None]  # a pure degree-3 polynomial
    np.testing.assert_allclose(legendre_energy(cubic, 6)[3:], 1.0, atol=1e-9)
    assert legendre_energy(cubic, 6)[2] < 0.2
    keys = [torch.as_tensor(rng.normal(size=(2, 30, 4))) for _ in range(4)]
    out = cache_spectrum(keys, keys, [[0, 1], [2, 3]], 8)
    assert [g["layers"] for g in out["groups"]] == [[0, 1], [2, 3]] and len(out["groups"][0]["keys"]) == 8
    with pytest.raises(ValueError, match="positions, channels"):
        legendre_energy(np.zeros(5), 3)


def test_bench_legendre_writes_the_spectrum_of_a_tiny_model(tmp_path, capsys):
    import json

    from icl_ssm.cli import main

    assert main(["bench", "legendre", "--model", "tiny-llama", "--task", "coin_flip", "--k", "3", "--prompts", "2",
                 "--degrees", "16", "--groups", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "spectrum.json").read_text())
    assert len(result["groups"]) == 2 and (tmp_path / "spectrum.png").read_bytes()[:4] == b"\x89PNG"
    assert "16 coefficients keep" in capsys.readouterr().out

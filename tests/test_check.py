"""The check before a prompt is handed over (icl_ssm.select.check), and its place in `icl-ssm run`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from icl_ssm.cli import main
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import wilson_interval
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import predict_labels
from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer
from icl_ssm.report import check_lines
from icl_ssm.select.check import ZERO_SHOT, check_prompts, hand_over, paired_bootstrap, random_prompts


def test_wilson_interval_matches_the_closed_form_values():
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    with pytest.raises(ValueError, match="successes=6, n=5"):
        wilson_interval(6, 5)


def test_random_prompts_are_distinct_k_subsets_and_reproducible():
    a = random_prompts(30, 5, 4, np.random.default_rng(0))
    assert a == random_prompts(30, 5, 4, np.random.default_rng(0))
    assert all(len(set(p)) == 5 and all(0 <= i < 30 for i in p) for p in a)
    with pytest.raises(ValueError, match="k=31"):
        random_prompts(30, 31, 1, np.random.default_rng(0))


def test_paired_bootstrap_brackets_the_mean_and_excludes_zero_for_a_clear_gain():
    diff = np.r_[np.ones(40), np.zeros(60)]
    lo, hi = paired_bootstrap(diff, np.random.default_rng(0))
    assert lo < 0.4 < hi and lo > 0


def result(mine: float, randoms: list[float]) -> dict:
    """Check results on 50 examples; a prompt of accuracy a answers the first 50 a right."""
    def row(indices, a):
        return {"indices": indices, "accuracy": a, "correct": [1.0] * round(50 * a) + [0.0] * (50 - round(50 * a))}

    rows = {"affinity": row([1, 2], mine), "bm25": row([3, 4], 0.5), ZERO_SHOT: row([], 0.99)}
    return {"check_size": 50, "random_median": float(np.median(randoms)), "prompts": rows,
            "random": [row([10 + i], a) for i, a in enumerate(randoms)]}


def test_hand_over_keeps_a_pick_above_the_median_random_prompt():
    name, indices, reason = hand_over(result(0.8, [0.5, 0.6, 0.7]), "affinity")
    assert (name, indices) == ("affinity", [1, 2]) and "above the median random prompt's 0.600" in reason


def test_hand_over_replaces_a_pick_at_or_below_the_median_and_says_why():
    name, indices, reason = hand_over(result(0.6, [0.5, 0.6, 0.9]), "affinity")
    assert (name, indices) == ("random-2", [12])  # the best-checked prompt; zero-shot is never handed over
    assert "not above the median random prompt's 0.600" in reason and "--keep-selection" in reason
    assert "+0.300 [" in reason  # the best beats the pick on 15 more of the 50 examples, and no fewer
    name, _, reason = hand_over(result(0.6, [0.5, 0.6, 0.64]), "affinity")  # 2 more of 50: noise
    assert name == "affinity" and "no checked prompt beats it by more than those examples can tell" in reason
    name, _, reason = hand_over(result(0.6, [0.5, 0.6, 0.9]), "affinity", keep=True)
    assert name == "affinity" and reason.startswith("kept as asked")
    with pytest.raises(ValueError, match="preferred='gradce'"):
        hand_over(result(0.6, [0.5]), "gradce")


@pytest.fixture
def coin():
    model, tok = tiny_model("llama"), tiny_tokenizer()
    task = get_task("coin_flip", size=80)
    return model, PromptBuilder.for_model(model, tok, task), split(task, seed=0)


def test_check_prompts_scores_every_prompt_and_counts_as_an_independent_prediction_does(coin):
    model, builder, data = coin
    out = check_prompts(model, builder, data.pool, data.validation[:6], {"mine": [0, 1, 2]}, 3,
                        np.random.default_rng(0), random_count=3)
    assert len(out["random"]) == 3 and set(out["prompts"]) == {"mine", ZERO_SHOT}
    mine = out["prompts"]["mine"]
    prompts = [builder.build(list(data.pool[:3]), q) for q in data.validation[:6]]  # the whole prompt, per query
    pred = predict_labels(model, builder, prompts)
    correct = [p == q.target for p, q in zip(pred, data.validation[:6], strict=True)]
    assert mine["accuracy"] == pytest.approx(np.mean(correct)) and mine["correct"] == [float(c) for c in correct]
    assert 0.0 <= mine["beats_random"] <= 1.0 and mine["interval"][0] <= mine["accuracy"] <= mine["interval"][1]
    lo, hi = mine["vs_median_interval"]
    assert lo <= mine["vs_median"] + 1e-9 and mine["vs_median"] - 1e-9 <= hi
    with pytest.raises(ValueError, match="no check examples"):
        check_prompts(model, builder, data.pool, [], {"mine": [0]}, 1, np.random.default_rng(0))


def test_run_checks_the_pick_against_random_prompts_and_hands_over_what_passed(tmp_path, tmp_cache, capsys):
    data = tmp_path / "coin.jsonl"
    task = get_task("coin_flip", size=120)
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    out = tmp_path / "run"
    args = ["run", "--model", "tiny-llama", "--task", str(data), "--k", "3", "--out", str(out), "--pool-size", "24",
            "--queries", "3", "--test-size", "6", "--fidelity-subsets", "4", "--fidelity-queries", "2",
            "--distill-samples", "8", "--check-size", "5", "--random-prompts", "3", "--methods", "affinity", "random",
            "--no-dense-evaluator"]
    assert main(args) == 0
    err = capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    check, handed = report["check"], report["handed_over"]
    assert check["check_size"] == 5 and len(check["random"]) == 3 and "zero-shot" in check["prompts"]
    assert "Handed over: " in err and "Check on 5 held-out examples" in err
    pool = split(get_task(str(data)), pool_size=24, seed=0).pool
    text = (out / "prompt.txt").read_text()
    assert all(pool[i].input in text for i in handed["indices"])  # the prompt file is the one handed over
    if not handed["beats_random"]:
        assert "Warning: affinity's pick is not better than the median random prompt" in (out / "report.md").read_text()
    assert check_lines(report)[-1].startswith("Handed over: ")
    assert main([*args, "--keep-selection"]) == 0
    kept = json.loads((out / "report.json").read_text())["handed_over"]
    assert kept["name"] == "affinity" and kept["indices"] == report["selections"][0]["indices"]


def test_flipped_label_probe_tells_a_label_reader_from_a_label_blind_cache():
    from icl_ssm.data.tasks import Example
    from icl_ssm.select.evaluators import OracleEvaluator, SubsetLosses
    from icl_ssm.select.probe import flipped, flipped_label_probe

    labels = ("yes", "no")
    pool = [Example(id=str(i), input=f"t{i}", target=labels[i % 2]) for i in range(12)]
    assert [e.target for e in flipped(pool[:3], labels)] == ["no", "yes", "no"]
    with pytest.raises(ValueError, match="targets \\['maybe'\\] are not among the labels"):
        flipped([Example(id="x", input="x", target="maybe")], labels)

    class Reader(OracleEvaluator):  # loss: the share of demonstrations whose label is wrong (even index: yes)
        def evaluate(self, pool, validation, subsets):
            wrong = [np.mean([pool[i].target != labels[i % 2] for i in s]) for s in subsets]
            return SubsetLosses(np.array(wrong))

    blind = OracleEvaluator(lambda s: float(len(s)))
    subsets = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    out = flipped_label_probe({"dense": Reader(lambda s: 0.0), "blind": blind}, pool, pool[:2], labels, subsets)
    assert out["dense"]["diff"] == 1.0 and out["dense"]["higher_share"] == 1.0
    assert out["blind"]["diff"] == 0.0 and out["blind"]["higher_share"] == 0.0 and out["blind"]["ci95"] == [0.0, 0.0]


def test_a_pick_above_the_median_by_less_than_the_check_can_tell_is_warned_about():
    from icl_ssm.report import check_lines

    rows = {"affinity": {"indices": [1], "accuracy": 0.64, "beats_random": 0.6, "vs_median": 0.02,
                         "vs_median_interval": [-0.08, 0.12]}, ZERO_SHOT: {"indices": [], "accuracy": 0.5}}
    check = {"check_size": 64, "random_median": 0.62, "random": [{"accuracy": a} for a in (0.55, 0.62, 0.7)],
             "prompts": rows, "preferred": "affinity", "test_size": 150, "zero_shot_test_accuracy": 0.5,
             "handed_over": {"name": "affinity", "indices": [1], "reason": "r", "beats_random": True,
                             "shown_better": False, "test_accuracy": 0.6}}
    lines = check_lines({"check": check})
    assert lines[0].startswith("Warning: affinity's pick scored above the median random prompt on the 64 check "
                               "examples, but by less than they can tell (+0.020 [-0.080, +0.120])")
    check["handed_over"]["shown_better"] = True
    assert not check_lines({"check": check})[0].startswith("Warning")


def test_state_separability_reads_the_states_of_prompts_and_their_flipped_copies():
    """A constant state (the control's) cannot tell a prompt from its label-flipped copy: the
    read-out is at chance, exactly. A compressor's states are one row per subset."""
    import torch

    from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
    from icl_ssm.select.probe import flipped, prompt_states, state_separability
    from icl_ssm.select.sampling import balanced_subsets

    model, tokenizer = tiny_model("llama").eval(), tiny_tokenizer()
    task = get_task("rotten_tomatoes")
    splits = split(task, pool_size=40, seed=0)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    subsets = balanced_subsets(len(splits.pool), 4, 32, np.random.default_rng(0))
    shape = dict(state_size=16, channels=8, num_virtual=2, num_sink=1, latent_size=8, num_recent=0)
    torch.manual_seed(0)
    pairs = SSMCompressor(SSMCompressorConfig.for_teacher(model.config, pair_size=16, pair_window=8, **shape)).eval()
    states = prompt_states(model, pairs, builder, splits.pool, subsets)
    assert states.shape == (32, pairs.config.num_groups * 16) and np.isfinite(states).all()
    other = prompt_states(model, pairs, builder, flipped(splits.pool, task.labels), subsets)
    assert np.abs(states - other).max() > 0
    got = state_separability(model, pairs, builder, splits.pool, task.labels, subsets)
    assert 0 <= got["accuracy"] <= 1 and got["pairs"] == 32
    control = SSMCompressor(SSMCompressorConfig.for_teacher(model.config, control=True, **shape)).eval()
    assert state_separability(model, control, builder, splits.pool, task.labels, subsets)["accuracy"] == 0.5

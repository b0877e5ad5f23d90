"""The check before a prompt is handed over (icl_ssm.select.check), and its place in `icl-ssm run`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from icl_ssm.cli import main
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import paired_bootstrap, wilson_interval
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import predict_labels
from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer
from icl_ssm.report.markdown import check_lines
from icl_ssm.select.check import ZERO_SHOT, check_prompts, compare_prompts, hand_over, random_prompts


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
    out = paired_bootstrap(diff, seed=0)
    lo, hi = out["ci95"]
    assert lo < 0.4 < hi and lo > 0 and out["mean"] == pytest.approx(0.4) and out["resampled"] == "rows"
    two = paired_bootstrap(np.tile(diff, (3, 1)).T, seed=0)  # (examples, 3 copies): rows and columns
    assert two["resampled"] == "rows and columns" and two["mean"] == pytest.approx(0.4)


def test_label_balanced_random_prompts_hold_the_label_shares_and_interleave():
    labels = ["a", "b"] * 15
    prompts = random_prompts(30, 6, 5, np.random.default_rng(0), labels=labels, order="interleave")
    for p in prompts:
        assert sorted(labels[i] for i in p) == ["a"] * 3 + ["b"] * 3
        assert all(labels[p[j]] != labels[p[j + 1]] for j in range(0, 6, 2))  # interleaved: each pair holds both
    with pytest.raises(ValueError, match="29 labels for a pool of 30"):
        random_prompts(30, 6, 1, np.random.default_rng(0), labels=labels[:29])


def rows_of(n: int, accuracies: dict[str, float]) -> dict[str, dict]:
    """Prompts on ``n`` examples; a prompt of accuracy a answers the first n a right."""
    return {name: {"indices": [] if name == ZERO_SHOT else [i],
                   "correct": [1] * round(n * a) + [0] * (n - round(n * a))}
            for i, (name, a) in enumerate(accuracies.items())}


def checked(mine: float, randoms: list[float], n: int = 200, zero: float = 0.5) -> dict:
    prompts = rows_of(n, {"search": mine, "bm25": 0.5, ZERO_SHOT: zero})
    return compare_prompts(prompts, list(rows_of(n, {f"r{i}": a for i, a in enumerate(randoms)}).values()))


def test_compare_prompts_counts_against_every_random_prompt():
    result = checked(0.7, [0.5, 0.6, 0.7, 0.8])
    row = result["prompts"]["search"]
    assert row["beats_random"] == 0.5 and row["at_or_above"] == 3  # a share and a count, each its own field
    assert row["vs_random"]["mean"] == pytest.approx(0.7 - 0.65)
    assert result["random_mean"] == pytest.approx(0.65) and result["random_median"] == pytest.approx(0.65)


def test_hand_over_keeps_a_pick_no_prompt_beats_by_more_than_the_check_can_tell():
    handed = hand_over(checked(0.62, [0.5, 0.6, 0.64]), "search")
    assert handed["name"] == "search" and not handed["replaced"] and "kept" in handed["reason"]
    assert handed["at_or_above"] == 2 and handed["random_prompts"] == 3


def test_hand_over_replaces_a_pick_a_prompt_beats_clearly_and_says_why():
    handed = hand_over(checked(0.5, [0.5, 0.6, 0.9]), "search")
    assert handed["name"] == "random-2" and handed["replaced"] and handed["indices"] == [2]
    assert "beats it by more than the check can tell" in handed["reason"] and "--keep-selection" in handed["reason"]
    assert handed["beats_random"] == pytest.approx(2 / 2) or handed["at_or_above"] >= 2  # the others: 0.5, 0.6
    kept = hand_over(checked(0.5, [0.5, 0.6, 0.9]), "search", keep=True)
    assert kept["name"] == "search" and "--keep-selection keeps the pick" in kept["reason"]
    with pytest.raises(ValueError, match="preferred='gradce'"):
        hand_over(checked(0.6, [0.5]), "gradce")


def test_zero_shot_is_a_hand_over_option_and_is_flagged_when_it_beats_every_k_shot_prompt():
    handed = hand_over(checked(0.5, [0.5, 0.55], zero=0.9), "search")
    assert handed["name"] == ZERO_SHOT and handed["zero_shot_best"] and handed["indices"] == []


RECORD = Path(__file__).parents[1] / "docs/results/prompt-correctness-rotten_tomatoes-k20.json"


def stored_correctness() -> np.ndarray:
    """(prompts, examples) 0/1 validation correctness of real random prompts (SmolLM2, RT, k = 20)."""
    record = json.loads(RECORD.read_text())
    return np.array([p["validation_correct"] for p in record["prompts"]], dtype=np.float64)


def simulation():
    from helpers import research_script

    return research_script("handover_simulation")


def test_simulated_prompts_are_equally_good_on_the_stored_examples_or_planted_better():
    script, correct = simulation(), stored_correctness()
    grid = script.draw_check(correct, correct.shape[1], 6, np.random.default_rng(0), gain=0.10)
    assert grid.shape == (6, correct.shape[1])
    flipped = script.set_accuracy(correct[0], correct[0].mean() - 0.05, np.random.default_rng(1))
    assert flipped.mean() == pytest.approx(correct[0].mean() - 0.05, abs=1 / correct.shape[1])
    assert (flipped != correct[0]).sum() == round(0.05 * correct.shape[1])  # no more flips than needed


@pytest.mark.parametrize(("scenario", "size"), [("equal", None), ("better", 768)])
def test_hand_over_rates_on_resampled_stored_answers(scenario, size):
    """On resampled answers of real prompts, with the run's random prompts: where every prompt is
    equally good, a random prompt replaces the pick in <= 5% of the draws at the run's check size;
    a candidate 10 points better than the pick is handed over in >= 80% of the draws once the
    check has 768 examples (at the run's 128 it is far less: the simulation record has the rates
    by size)."""
    from icl_ssm.pipeline import RunConfig

    d, script = RunConfig(), simulation()
    correct, rng, hits, draws = stored_correctness(), np.random.default_rng(1), 0, 100
    for _ in range(draws):
        grid = script.draw_check(correct, size or d.check_size, d.random_prompts + 2, rng,
                                 gain=0.10 if scenario == "better" else None)
        prompts = {"pick": {"indices": [], "correct": grid[0].tolist()}}
        if scenario == "better":
            prompts["better"] = {"indices": [], "correct": grid[-1].tolist()}
        result = compare_prompts(prompts, [{"indices": [], "correct": r.tolist()} for r in grid[1:-1]])
        name = hand_over(result, "pick")["name"]
        hits += name != "pick" if scenario == "equal" else name == "better"
    rate = hits / draws
    assert rate <= 0.05 if scenario == "equal" else rate >= 0.80, rate


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
    assert mine["accuracy"] == pytest.approx(np.mean(correct)) and mine["correct"] == [int(c) for c in correct]
    assert 0.0 <= mine["beats_random"] <= 1.0 and mine["interval"][0] <= mine["accuracy"] <= mine["interval"][1]
    lo, hi = mine["vs_random"]["ci95"]
    assert lo <= mine["vs_random"]["mean"] + 1e-9 and mine["vs_random"]["mean"] - 1e-9 <= hi
    with pytest.raises(ValueError, match="no check examples"):
        check_prompts(model, builder, data.pool, [], {"mine": [0]}, 1, np.random.default_rng(0))


def test_run_searches_checks_the_pick_against_random_prompts_and_hands_over_what_passed(tmp_path, tmp_cache,
                                                                                       capsys):
    from icl_ssm.pipeline import RunConfig, run_splits

    data = tmp_path / "coin.jsonl"
    task = get_task("coin_flip", size=120)
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    out = tmp_path / "run"
    args = ["run", "--model", "tiny-llama", "--task", str(data), "--k", "3", "--out", str(out), "--pool-size", "24",
            "--queries", "3", "--test-size", "6", "--fidelity-subsets", "4", "--fidelity-queries", "2",
            "--distill", "--distill-samples", "8", "--check-size", "5", "--random-prompts", "3", "--methods", "search",
            "affinity", "random", "--no-dense-evaluator", "--search-minutes", "0.2", "--screen-queries", "4",
            "--confirm-queries", "8", "--calibrate", "none"]  # the raw hand-over; the calibrated one: test_pipeline
    assert main(args) == 0
    err = capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    check, handed = report["check"], report["handed_over"]
    assert check["check_size"] == 5 and len(check["random"]) == 3
    assert set(check["prompts"]) == {"search", ZERO_SHOT}  # the search screened the other picks already
    assert check["held_out"] == [8, 13]  # after the 8 validation queries the search read
    assert all("test_accuracy" in r for r in check["random"])  # the random prompts' spread on test, for the plot
    assert "search plan for 0.2 min" in err and "Handed over (prompt.txt): " in err
    assert report["search"]["plan"]["arms"] >= 2 and report["preferred"] == "search"
    pool = run_splits(RunConfig(task=str(data), pool_size=24, k=3, queries=3, confirm_queries=8, screen_queries=4,
                                check_size=5, methods=("search", "affinity", "random"))).pool
    text = (out / "prompt.txt").read_text()
    assert all(pool[i].input in text for i in handed["indices"])  # the prompt file is the one handed over
    assert check_lines(report)[0].startswith("Handed over (prompt.txt): ")
    assert main([*args, "--keep-selection"]) == 0
    kept = json.loads((out / "report.json").read_text())["handed_over"]
    assert kept["name"] == "search" and kept["indices"] == report["picks"]["search"]


def test_flipped_label_probe_tells_a_label_reader_from_a_label_blind_cache():
    from helpers import research_script

    from icl_ssm.data.tasks import Example
    from icl_ssm.select.subset_losses import OracleEvaluator, SubsetLosses

    probe = research_script("probe")  # research/probe.py
    flipped, flipped_label_probe = probe.flipped, probe.flipped_label_probe

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


def test_state_separability_reads_the_states_of_prompts_and_their_flipped_copies():
    """A constant state (the control's) cannot tell a prompt from its label-flipped copy: the
    read-out is at chance, exactly. A compressor's states are one row per subset."""
    import torch
    from helpers import research_script

    from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
    from icl_ssm.select.sampling import balanced_subsets

    probe = research_script("probe")  # research/probe.py
    flipped, prompt_states, state_separability = probe.flipped, probe.prompt_states, probe.state_separability
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

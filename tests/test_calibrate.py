"""Calibration of label scores (:mod:`icl_ssm.calibrate`): each method's bias on scores whose answer
is known, the saved form and its refusals, estimation through a real (tiny) prompt, and the
headroom study's arithmetic."""

import math

import numpy as np
import pytest
import torch
from icl_ssm_bench.calibration import ON_INPUTS, cross_fitted, imbalanced, prompt_rows, summarize_method

from icl_ssm.calibrate import CALIBRATORS, Calibration, estimate, get_calibrator, no_calibration
from icl_ssm.calibrate.contextual import CONTENT_FREE
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.held_out import calibrate_prompt, prompt_scores

LABELS = ("negative", "positive")


def leaning(n=200, lean=2.0, seed=0):
    """Scores of a prompt that adds ``lean`` to the second label, over a balanced batch whose true
    signal is +-1: raw answers are all 'positive', the lean removed they are right."""
    g = torch.Generator().manual_seed(seed)
    gold = torch.arange(n) % 2
    signal = (2.0 * gold - 1.0) + 0.3 * torch.randn(n, generator=g)
    scores = torch.stack([-signal / 2, signal / 2 + lean], dim=1).double()
    return scores, gold


def test_no_calibration_returns_the_scores_unchanged():
    scores, _ = leaning()
    assert torch.equal(no_calibration(LABELS).apply(scores), scores)


@pytest.mark.parametrize("method", ["batch", "fitted"])
def test_a_lean_is_removed_by_batch_and_fitted_calibration(method):
    scores, gold = leaning()
    assert (scores.argmax(-1) == gold).float().mean() == 0.5  # raw: every answer positive
    cal = estimate(method, LABELS, lambda xs: scores[[int(x.id) for x in xs]], [Example(str(i), "x", LABELS[int(y)])
                                                                              for i, y in enumerate(gold)],
                   gold.tolist())
    assert cal.bias[1] - cal.bias[0] == pytest.approx(2.0, abs=0.3)
    assert (cal.apply(scores).argmax(-1) == gold).float().mean() > 0.95
    assert sum(cal.bias) == pytest.approx(0.0, abs=1e-9)  # centred


def test_contextual_calibration_reads_content_free_inputs_and_averages_probabilities():
    seen = []

    def scorer(xs):
        seen.extend(x.input for x in xs)
        return torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0], [0.0, math.log(3.0)]], dtype=torch.float64)

    cal = estimate("contextual", LABELS, scorer, [Example("a", "some review", "positive")])
    assert tuple(seen) == CONTENT_FREE
    p = np.array([[0.25, 0.75], [0.5, 0.5], [0.25, 0.75]]).mean(0)  # the mean probability, then its log
    assert cal.bias[1] - cal.bias[0] == pytest.approx(math.log(p[1] / p[0]))
    assert cal.inputs == 3 and "content-free" in cal.source


def test_domain_calibration_draws_strings_of_the_inputs_own_words():
    examples = [Example(str(i), f"alpha beta gamma {i}", "positive") for i in range(10)]
    inputs = get_calibrator("domain").inputs(examples, np.random.default_rng(0))
    words = {w for e in examples for w in e.input.split()}
    assert len(inputs) == 20 and all(set(x.input.split()) <= words and len(x.input.split()) == 4 for x in inputs)
    assert all(x.target == "" for x in inputs)


def test_fitted_calibration_refuses_examples_without_labels():
    with pytest.raises(ValueError, match="fits its bias on labelled examples"):
        estimate("fitted", LABELS, lambda xs: torch.zeros(len(xs), 2), [Example("a", "x", "")])


def test_an_unknown_method_is_refused_with_the_accepted_ones():
    with pytest.raises(ValueError, match="calibration 'temperature'; accepted: none, batch"):
        get_calibrator("temperature")
    assert set(CALIBRATORS) == {"batch", "contextual", "domain", "fitted"}


def test_a_calibration_round_trips_and_bad_saved_ones_are_refused():
    cal = Calibration("batch", LABELS, (-0.5, 0.5), 64, "the mean over 64 unlabelled inputs")
    assert Calibration.from_dict(cal.to_dict()) == cal
    bad = [({**cal.to_dict(), "bias": [0.1]}, "1 bias values for 2 labels"),
           ({**cal.to_dict(), "bias": ["x", 1]}, "expected a list of numbers"),
           ({**cal.to_dict(), "method": "magic"}, "method 'magic'; accepted"),
           ({**cal.to_dict(), "extra": 1}, "unknown keys extra"),
           ({"method": "batch"}, "missing labels, bias"),
           ([1, 2], "expected an object"),
           ({**cal.to_dict(), "bias": [float("nan"), 0.0]}, "not finite")]
    for data, message in bad:
        with pytest.raises(ValueError, match=message):
            Calibration.from_dict(data, "sel/selection.json: calibration")
    with pytest.raises(ValueError, match="scores of 3 labels"):
        cal.apply(torch.zeros(4, 3))


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


def test_prompt_scores_are_the_reference_label_scores_and_batch_bias_their_mean(tiny):
    from icl_ssm.lm.scoring import score_labels

    model, tokenizer = tiny
    task = get_task("coin_flip", size=60)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    examples = task.examples()
    demos, inputs = examples[:3], examples[3:15]
    got = prompt_scores(model, builder, demos, [Example(e.id, e.input, "") for e in inputs])  # no labels read
    ref = score_labels(model, builder, [builder.build(demos, q) for q in inputs], reference=True)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4)
    cal = calibrate_prompt(model, builder, demos, "batch", inputs)
    bias = torch.log_softmax(ref.double(), -1).mean(0)
    assert cal.bias[1] - cal.bias[0] == pytest.approx(float(bias[1] - bias[0]), abs=1e-4)


def test_imbalanced_draws_the_asked_share_of_the_first_label():
    examples = [Example(str(i), "x", "yes" if i % 2 else "no") for i in range(100)]
    picked = imbalanced(examples, ["yes", "no"], 0.8, 50)
    assert len(picked) == 50 and sum(e.target == "yes" for e in picked) == 40
    assert [int(e.id) for e in picked] == sorted(int(e.id) for e in picked)  # the given order kept
    few = imbalanced(examples, ["yes", "no"], 0.8, 100)  # only 50 'yes': shrunk, the share kept
    assert sum(e.target == "yes" for e in few) / len(few) == pytest.approx(0.8, abs=0.02)


def test_cross_fitting_never_scores_an_example_with_a_bias_fitted_on_it():
    scores, gold = leaning(40)
    logp = torch.log_softmax(scores, -1)
    pred = cross_fitted(logp, gold, "fitted")
    assert (pred == gold).float().mean() > 0.9
    rows = prompt_rows(logp, gold, logp, gold, {}, ("none", "batch", "fitted"))
    assert rows["none"]["validation_correct"] == (logp.argmax(-1) == gold).int().tolist()
    assert rows[ON_INPUTS]["validation_correct"] is None


def test_the_prompt_best_on_validation_and_the_spread_are_read_from_the_grids():
    val = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=float)
    test = np.array([[1, 0, 1, 0, 1, 0], [1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 0, 0]], dtype=float)
    s = summarize_method(val, test, np.array([0, 1, 0, 1]))
    assert s["best_on_validation"] == 1 and s["best_on_validation_test"] == pytest.approx(5 / 6)
    assert s["validation_test_spearman"] == pytest.approx(1.0)
    assert s["min"] == pytest.approx(1 / 6) and s["max"] == pytest.approx(5 / 6)
    assert s["best_minus_median"]["mean"] == pytest.approx(2 / 6)


def test_headroom_reads_whether_validation_ranks_calibrated_prompts():
    from icl_ssm.select.headroom import can_add, headroom_summary

    rng = np.random.default_rng(0)
    gold = np.arange(64) % 2
    # prompts that differ in how well they separate the labels (a lean on top): a ranking validation can carry
    strength = np.linspace(0.2, 3.0, 8)
    margin = (2 * gold - 1)[None] * strength[:, None] + 2.0 + rng.normal(0, 1.0, (8, 64))
    scores = np.stack([np.zeros_like(margin), margin], -1)
    s = headroom_summary(scores, gold)
    assert s["reliability"] > 0.8 and s["calibrated_spread"] > 0.05
    assert np.mean(s["raw_accuracy"]) < np.mean(s["calibrated_accuracy"])  # the lean cost the raw answers
    assert can_add({**s, "queries": 64})[0]
    # prompts that differ only in their lean: once it is out, validation has nothing to rank
    same = (2 * gold - 1)[None] * 1.0 + np.linspace(-2, 2, 8)[:, None] + rng.normal(0, 1.0, (8, 64))
    flat = headroom_summary(np.stack([np.zeros_like(same), same], -1), gold)
    assert flat["reliability"] < 0.5 and not can_add({**flat, "queries": 64})[0]
    assert "selection is not shown to add anything measurable beyond calibration" in can_add({**flat,
                                                                                             "queries": 64})[1]


def test_batch_calibration_on_leaning_inputs_is_warned_of():
    from icl_ssm.apply.answer import leaning as lean_warning

    saved = Calibration("batch", LABELS, (0.0, 0.0), 64, "balanced validation inputs")
    scores, _ = leaning(100, lean=0.0)
    assert lean_warning(scores, saved, LABELS) is None  # half and half
    lopsided = torch.cat([scores, torch.tensor([[-3.0, 0.0]] * 300, dtype=torch.float64)])
    warning = lean_warning(lopsided, saved, LABELS)
    assert warning.startswith("88% of the first 400 inputs are answered 'positive'")
    assert "--calibrate selection" in warning


def test_the_calibration_headroom_says_what_one_dense_pass_per_prompt_cost():
    """``bench headroom --calibrations`` on a tiny model: every prompt's row holds its prompt length,
    the inputs its one dense pass read and the seconds it took; the task's ``dense_pass`` their medians."""
    from icl_ssm_bench.calibration import CalibrationHeadroomConfig, calibration_headroom

    from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer

    cfg = CalibrationHeadroomConfig(tasks=("coin_flip",), k=3, prompts=3, pool_size=20, validation=4, test_size=6,
                                    methods=("none", "batch", "contextual"))  # contextual: 3 content-free inputs more
    out = calibration_headroom(cfg, tiny_model("llama"), tiny_tokenizer(), log=lambda line: None)
    t = out["tasks"]["coin_flip"]
    shots = t["prompts"][1:]
    assert all(r["seconds"] > 0 and r["inputs"] == 4 + 6 + 3 for r in t["prompts"])
    assert t["prompts"][0]["prompt_tokens"] < min(r["prompt_tokens"] for r in shots)  # zero-shot: the header alone
    assert t["dense_pass"] == {"median_seconds": pytest.approx(float(np.median([r["seconds"] for r in shots]))),
                               "median_prompt_tokens": float(np.median([r["prompt_tokens"] for r in shots])),
                               "inputs_per_prompt": 13}

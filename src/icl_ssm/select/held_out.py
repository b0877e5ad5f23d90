"""Scoring a chosen prompt on held-out examples: accuracy, the answers given, and their cost; its
label scores, and a calibration estimated for it (:func:`calibrate_prompt`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from icl_ssm.calibrate import Calibration, estimate
from icl_ssm.compress.builders import CacheBuilder, DenseCache
from icl_ssm.cost import measure
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.answers import evaluate_prefixes, pad_right
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.subset_losses import CacheEvaluator


def evaluate_selection(
    model: PreTrainedModel,
    builder: PromptBuilder,
    demos: Sequence[Example],
    test: Sequence[Example],
    *,
    cache: CacheBuilder | None = None,
    loss: str = "nll",
    query_batch: int = 32,
    per_query: bool = False,
) -> dict[str, Any]:
    """Accuracy and mean loss of the prompt made of ``demos`` on ``test``, after ``cache`` (a
    :class:`~icl_ssm.compress.builders.CacheBuilder`; the dense cache, the real prompt, by default).
    ``per_query`` adds every test query's
    ``correct`` (0/1), ``pred`` (the predicted label index; -1 for generative tasks) and, for a
    classification task, ``scores`` (``(Q, L)`` as lists: every label's verbaliser
    log-likelihood, what a calibration reads).

    One prefix serves every test query, so the queries are packed ``query_batch`` to a sequence
    after it (:func:`icl_ssm.evaluate.answers.answer_logits_packed`) instead of each getting a copy of
    its cache: a 50-shot dense prompt on 150 reviews takes ~9 s instead of ~45 s on 2 CPU threads.
    """
    if not test:
        raise ValueError("the test set is empty")
    ev = CacheEvaluator(model, builder, cache or DenseCache(model), loss=loss, batch=1, query_batch=query_batch)
    ids, mask = pad_right([builder.build_prefix(list(demos))])
    device = model.device
    with torch.no_grad(), measure(device) as cost:
        result = evaluate_prefixes(model, builder, ev.build(ids.to(device), mask.to(device)), test, loss=loss,
                                   query_batch=query_batch, keep_logits=False, pack=True)
    out: dict[str, Any] = {"accuracy": float(result.correct.mean()), "loss": float(result.loss.mean()),
                           "flops": cost.flops, "seconds": cost.seconds}
    if per_query:
        out["correct"] = result.correct[0].tolist()
        out["pred"] = result.pred[0].tolist()
        if result.scores is not None:
            out["scores"] = result.scores[0].tolist()
    return out


def prompt_scores(model: PreTrainedModel, builder: PromptBuilder, demos: Sequence[Example], inputs: Sequence[Example],
                  *, query_batch: int = 32) -> torch.Tensor:
    """``(n, L)`` every label's verbaliser log-likelihood for each input after the dense prompt of
    ``demos`` (classification). Inputs need no labels."""
    builder._require_classification("prompt_scores")
    if not inputs:
        return torch.zeros((0, len(builder.task.labels)))
    ids, mask = pad_right([builder.build_prefix(list(demos))])
    device = model.device
    ev = CacheEvaluator(model, builder, DenseCache(model), batch=1, query_batch=query_batch)
    with torch.no_grad():
        result = evaluate_prefixes(model, builder, ev.build(ids.to(device), mask.to(device)), inputs,
                                   query_batch=query_batch, keep_logits=False, pack=True, labelled=False)
    return result.scores[0]


def calibrate_prompt(model: PreTrainedModel, builder: PromptBuilder, demos: Sequence[Example], method: str,
                     examples: Sequence[Example], *, query_batch: int = 32, seed: int = 0) -> Calibration:
    """The calibration ``method`` (:mod:`icl_ssm.calibrate`) of the dense prompt of ``demos``, estimated
    on ``examples`` (their labels read only by a method that fits on labels)."""
    builder._require_classification(f"calibration {method!r}")
    gold = [builder.label_index(e) for e in examples] if method == "fitted" else None
    return estimate(method, builder.task.labels, lambda inputs: prompt_scores(model, builder, demos, inputs,
                                                                               query_batch=query_batch),
                    examples, gold, rng=np.random.default_rng(seed))


def evaluate_calibrated(model: PreTrainedModel, builder: PromptBuilder, demos: Sequence[Example],
                        test: Sequence[Example], calibration: Calibration | None = None, *,
                        query_batch: int = 32) -> dict[str, Any]:
    """The dense prompt of ``demos`` on ``test`` (classification), raw and calibrated:
    ``{"accuracy", "raw_accuracy", "correct", "raw_correct", "calibration"}``. ``calibration``: the
    prompt's own (a :class:`~icl_ssm.calibrate.Calibration`, estimated elsewhere), or None for batch
    calibration on the test inputs themselves (their labels unread), what a user who calibrates on
    their own inputs gets."""
    scores = prompt_scores(model, builder, demos, test, query_batch=query_batch).double()  # (n, L)
    gold = torch.tensor([builder.label_index(e) for e in test])
    if calibration is None:
        logp = torch.log_softmax(scores, -1)
        shifted, method = logp - logp.mean(0), "batch (on the test inputs)"
    else:
        shifted, method = calibration.apply(scores), calibration.method
    raw = (scores.argmax(-1) == gold).int().tolist()
    cal = (shifted.argmax(-1) == gold).int().tolist()
    return {"accuracy": float(np.mean(cal)), "raw_accuracy": float(np.mean(raw)), "correct": cal, "raw_correct": raw,
            "calibration": method}

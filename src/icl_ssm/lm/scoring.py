"""Label scores, predictions and the answer loss of prompts, with or without a prefix cache: the
continuation log-probabilities (:mod:`.logprobs`, fast path or reference) of a task's answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from icl_ssm.lm.answer_format import ExampleLike
from icl_ssm.lm.batch import PromptLike, as_ids
from icl_ssm.lm.logprobs import continuation_logprobs, continuation_logprobs_ref
from icl_ssm.lm.prefix import PrefixLike, prefix_row_map
from icl_ssm.lm.prompts import PromptBuilder


def score_labels(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prompts: Sequence[PromptLike],
    *,
    prefix: PrefixLike | Any = None,
    reference: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """Log-likelihood of every label's verbaliser after each prompt.

    Args:
        prompts: ``batch`` prompts: full prompts, or query suffixes after ``prefix``.
        prefix: one row shared by all prompts, or one row per prompt (see
            :func:`~icl_ssm.lm.logprobs.continuation_logprobs`).
        reference: use :func:`~icl_ssm.lm.logprobs.continuation_logprobs_ref` instead of the
            batched path.
        kwargs: ``position_offset``, and ``batch_size``/``padding_side`` for the batched path.

    Returns:
        (batch, n_labels) float32: sum of the token log-probs of each (multi-token) verbaliser.
    """
    labels = builder.label_ids()
    rows = prefix_row_map(prefix, len(prompts), None)
    contexts = [as_ids(p) for p in prompts for _ in labels]
    continuations = [lab for _ in prompts for lab in labels]
    rows = [r for r in rows for _ in labels]
    scores = _logprobs(model, contexts, continuations, prefix, rows, reference, kwargs)
    return scores.view(len(prompts), len(labels))


def predict_labels(
    model: PreTrainedModel, builder: PromptBuilder, prompts: Sequence[PromptLike], **kwargs: Any
) -> list[str]:
    """The label with the highest verbaliser log-likelihood for each prompt."""
    scores = score_labels(model, builder, prompts, **kwargs)  # (batch, n_labels)
    return [builder.task.labels[i] for i in scores.argmax(-1).tolist()]


def answer_loss(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prompts: Sequence[PromptLike],
    examples: Sequence[ExampleLike],
    *,
    normalize: bool = False,
    prefix: PrefixLike | Any = None,
    reference: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """Per-query loss of the gold answer: the validation loss demonstration selection uses.

    ``normalize=False``: NLL of the gold answer tokens (the gold verbaliser, or the gold
    answer text of a generative task). ``normalize=True`` (classification only): cross-entropy
    over the label set, ``-log_softmax(score_labels)[gold]``. ``prefix`` and kwargs as in
    :func:`score_labels`.

    Returns (batch,) float32.
    """
    if len(prompts) != len(examples):
        raise ValueError(f"{len(prompts)} prompts but {len(examples)} examples; expected equal")
    if normalize:
        builder._require_classification("answer_loss(normalize=True)")
        gold = torch.tensor([builder.label_index(e) for e in examples])
        scores = score_labels(model, builder, prompts, prefix=prefix, reference=reference, **kwargs)
        return torch.nn.functional.cross_entropy(scores, gold.to(scores.device), reduction="none")
    if builder.task.kind == "classification":
        for e in examples:
            builder.label_index(e)  # a clear error for a target that is not a label
    gold_ids = [builder.answer_ids(e) for e in examples]
    rows = prefix_row_map(prefix, len(prompts), None)
    contexts = [as_ids(p) for p in prompts]
    return -_logprobs(model, contexts, gold_ids, prefix, rows, reference, kwargs)


def _logprobs(
    model: PreTrainedModel,
    contexts: list[list[int]],
    continuations: list[list[int]],
    prefix: Any,
    prefix_rows: list[int],
    reference: bool,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    if reference:  # batching options mean nothing to the reference
        kwargs = {k: v for k, v in kwargs.items() if k not in ("batch_size", "padding_side")}
        fn = continuation_logprobs_ref
    else:
        fn = continuation_logprobs
    rows = None if prefix is None else prefix_rows
    return fn(model, contexts, continuations, prefix=prefix, prefix_rows=rows, **kwargs)

"""Answering inputs with a chosen prompt: encode its prefix once, answer every input after it.

The fast path, :func:`iter_answers` (and :func:`answer_inputs`): the header and the
demonstrations are one prefix, encoded once into a :class:`~icl_ssm.compress.cache.PrefixCache`
(``cache="dense"``: the model's own K/V, so the answers are the dense prompt's;
``"compressed"``: a compressor's sinks and virtual tokens), and each batch of inputs reads only
its own tokens after it, the batch's inputs packed as segments of one sequence after one copy of
the cache (:func:`~icl_ssm.evaluate.answers.answer_logits_packed`). Classification scores every
label by its verbaliser's log-likelihood and answers the best; a generative task is answered by
greedy decoding, cut at the demonstration separator.

The reference, :func:`answer_inputs_ref`: every input's whole prompt (header, demonstrations,
input) encoded on its own, one unpadded forward each: what a user without a shared prefix does,
and what the fast path is tested against (the same answers, logits within float32 rounding).

A classification prompt's answers are calibrated (``calibration``, :mod:`icl_ssm.calibrate`): the
label scores are kept raw beside the calibrated ones, and the answer is the calibrated argmax.

Retrieval per input (``retriever="bm25"`` or ``"topk"``, OpenICL's inferencers): each input
gets the ``k`` pool candidates most similar to it (:mod:`icl_ssm.select.per_query`), so every
prompt is its own and is encoded whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from icl_ssm.calibrate import Calibration
from icl_ssm.compress.builders import CACHES, CacheBuilder, DenseCache, cache_for
from icl_ssm.compress.cache import PrefixCache
from icl_ssm.compress.compressor import SSMCompressor
from icl_ssm.data.tasks import Example, Task
from icl_ssm.evaluate.answers import answer_logits_packed
from icl_ssm.evaluate.label_trie import answer_scores
from icl_ssm.lm.generation import generate_answers
from icl_ssm.lm.prompts import Prompt, PromptBuilder
from icl_ssm.lm.scoring import score_labels
from icl_ssm.select.per_query import PER_QUERY_METHODS, bm25_prompts, topk_prompts
from icl_ssm.select.selected import SelectedPrompt

FROM_SELECTION = "selection"  # calibration: the one saved with the selection (None: raw scores)
RETRIEVERS = PER_QUERY_METHODS  # demonstrations retrieved for each input instead of one prompt for all


@dataclass
class Answer:
    """One input answered: its ``id``; ``answer`` (the predicted label name, or the extracted
    text of a generative task); ``scores`` (label -> log-likelihood of its verbaliser; None for a
    generative task); the ``demonstrations`` (ids, prompt order) and their ``pool_indices``
    (None where unknown) it was answered after; ``correct`` (the task's metric against the
    input's label; None for an input without one); with a calibration, ``calibrated`` (label ->
    calibrated score, what ``answer`` is the best of), ``raw_answer`` (the best raw score's label)
    and ``raw_correct`` (its metric)."""

    id: str
    answer: str
    scores: dict[str, float] | None
    demonstrations: list[str]
    pool_indices: list[int] | None
    correct: float | None = None
    calibrated: dict[str, float] | None = None
    raw_answer: str | None = None
    raw_correct: float | None = None

    def row(self) -> dict:
        """A line of ``predictions.jsonl``: the fields, scores rounded to 6 decimals."""
        scores = None if self.scores is None else {k: round(v, 6) for k, v in self.scores.items()}
        row = {"id": self.id, "answer": self.answer, "scores": scores, "correct": self.correct,
               "demonstrations": self.demonstrations, "pool_indices": self.pool_indices}
        if self.calibrated is not None:
            row |= {"calibrated_scores": {k: round(v, 6) for k, v in self.calibrated.items()},
                    "raw_answer": self.raw_answer, "raw_correct": self.raw_correct}
        return row


def cache_kind(value: str) -> str:
    """A shared prefix's cache, one of :data:`CACHES`; ``exact``, the dense cache's earlier name,
    reads as ``dense``. Anything else is refused with the accepted names."""
    value = "dense" if value == "exact" else value
    if value not in CACHES:
        raise ValueError(f"cache={value!r}; accepted: {', '.join(CACHES)}")
    return value


def shared_prefix(model: PreTrainedModel, builder: PromptBuilder, demos: Sequence[Example],
                  cache: CacheBuilder | None = None) -> PrefixCache | None:
    """``cache``'s prefix (default :class:`~icl_ssm.compress.builders.DenseCache`) of
    ``builder.build_prefix(demos)`` (header + demonstrations), one row; None when that prefix has
    no tokens (no BOS, no instruction, no demonstrations)."""
    ids = builder.build_prefix(list(demos)).input_ids
    if not ids:
        return None
    tokens = torch.tensor([ids], device=model.device)  # (1, T)
    with torch.no_grad():
        return (cache or DenseCache(model))(tokens, torch.ones_like(tokens, dtype=torch.bool))


def scores_after_prefix(model: PreTrainedModel, builder: PromptBuilder, prefix: PrefixCache | None,
                        suffixes: Sequence[Sequence[int]]) -> tuple[Tensor | None, Tensor]:
    """Every label's log-likelihood after ``prefix`` (one row, shared) and each query suffix.

    Single-token verbalisers: the answer-position logits of the suffixes packed after one copy
    of the prefix, ``(n, V)`` float32, and their log-softmax at the label tokens ``(n, L)``;
    multi-token verbalisers: :func:`~icl_ssm.evaluate.label_trie.answer_scores` (the logits where
    the labels first differ). Without a prefix the suffixes are whole prompts:
    :func:`~icl_ssm.lm.scoring.score_labels`, and no logits."""
    labels = builder.label_ids()
    if prefix is None:
        return None, score_labels(model, builder, list(suffixes), batch_size=len(suffixes)).float()
    rows = [0] * len(suffixes)
    if all(len(ids) == 1 for ids in labels):
        z = answer_logits_packed(model, prefix, suffixes, rows)  # (n, V)
        return z, z.log_softmax(-1)[:, [ids[0] for ids in labels]]
    return answer_scores(model, builder, prefix, suffixes, rows)


def scores_reencoded(model: PreTrainedModel, builder: PromptBuilder, prompts: Sequence[Prompt],
                     batch: int | None = None) -> tuple[Tensor | None, Tensor]:
    """Every label's log-likelihood after each whole prompt, encoded on its own.

    ``batch=None`` (the reference): one unpadded forward per prompt, returning its last
    position's logits ``(n, V)`` float32 and the label scores ``(n, L)`` (multi-token
    verbalisers: one forward per label, :func:`~icl_ssm.lm.logprobs.continuation_logprobs_ref`).
    ``batch=b``: ``b`` prompts padded into one forward
    (:func:`~icl_ssm.lm.scoring.score_labels`), scores only."""
    if batch is not None:
        return None, score_labels(model, builder, list(prompts), batch_size=batch).float()
    labels = builder.label_ids()
    logits = []
    with torch.no_grad():
        for p in prompts:
            out = model(input_ids=torch.tensor([p.input_ids], device=model.device))
            logits.append(out.logits[0, -1].float())  # (V,)
    z = torch.stack(logits)  # (n, V)
    if all(len(ids) == 1 for ids in labels):
        return z, z.log_softmax(-1)[:, [ids[0] for ids in labels]]
    return z, score_labels(model, builder, list(prompts), reference=True).float()


def retrieve(retriever: str, model: PreTrainedModel, builder: PromptBuilder, pool: Sequence[Example],
             inputs: Sequence[Example], k: int) -> list[list[int]]:
    """For every input, the pool indices of its ``k`` demonstrations (the most similar last)."""
    if retriever not in RETRIEVERS:
        raise ValueError(f"retriever {retriever!r}; accepted: {', '.join(RETRIEVERS)}")
    if not 1 <= k <= len(pool):
        raise ValueError(f"k={k} demonstrations per input from a pool of {len(pool)}")
    if retriever == "bm25":
        return bm25_prompts(pool, inputs, k)
    return topk_prompts(model, builder, pool, inputs, k)[0]


def iter_answers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    selected: SelectedPrompt,
    inputs: Sequence[Example],
    *,
    cache: str = "dense",
    compressor: SSMCompressor | None = None,
    batch: int = 16,
    retriever: str | None = None,
    k: int | None = None,
    pool: Sequence[Example] | None = None,
    task: Task | None = None,
    max_new_tokens: int = 32,
    calibration: Calibration | str | None = FROM_SELECTION,
) -> Iterator[list[Answer]]:
    """Answer ``inputs`` with ``selected``'s prompt, ``batch`` at a time: yields each batch's
    :class:`Answer` list as soon as it is done (so a caller can write it before the next).

    The prefix is encoded once, before the first batch (``cache``, ``compressor``: see the
    module docstring). ``retriever`` (``"bm25"`` or ``"topk"``) retrieves ``k`` (default: the
    selection's ``k``) demonstrations per input from ``pool`` (default: the selection's pool,
    rebuilt) instead. An input's ``target`` is its label, or ``""`` when it has none. ``task``:
    default ``selected.task_object()``. ``calibration``: applied to every answer's label scores
    (classification): by default the selection's own (``selected.calibration``; none with a
    ``retriever``, whose prompts are not the selection's), None for raw scores.
    """
    if batch < 1:
        raise ValueError(f"batch={batch}; expected >= 1")
    cache = cache_kind(cache)
    if retriever is not None and cache != "dense":
        raise ValueError(f"retrieval per input ({retriever}) gives every input a prompt of its own, encoded whole; "
                         f"it shares no prefix to compress (cache={cache!r}): use cache='dense'")
    task = task or selected.task_object()
    builder = PromptBuilder.for_model(model, tokenizer, task, chat=selected.chat)
    if calibration == FROM_SELECTION:
        calibration = selected.calibration if retriever is None else None
    inputs = list(inputs)
    if not inputs:
        return
    if retriever is not None:
        pool = list(pool) if pool is not None else selected.pool_examples(task)
        chosen = retrieve(retriever, model, builder, pool, inputs, k or selected.k)
        for start in range(0, len(inputs), batch):
            chunk, picks = inputs[start: start + batch], chosen[start: start + batch]
            prompts = [builder.build([pool[i] for i in p], q) for p, q in zip(picks, chunk, strict=True)]
            answers = _answer(model, builder, None, [p.input_ids for p in prompts], chunk, max_new_tokens,
                              calibration)
            yield [_with_demos(a, [pool[i].id for i in p], list(p)) for a, p in zip(answers, picks, strict=True)]
        return
    demos = selected.examples()
    prefix = shared_prefix(model, builder, demos, cache_for(cache, model, compressor))
    for start in range(0, len(inputs), batch):
        chunk = inputs[start: start + batch]
        if prefix is None:  # nothing before the inputs: each prompt is its input alone
            seqs = [builder.build(demos, q).input_ids for q in chunk]
        else:
            seqs = [builder.build_suffix(q).input_ids for q in chunk]
        answers = _answer(model, builder, prefix, seqs, chunk, max_new_tokens, calibration)
        yield [_with_demos(a, selected.ids, selected.pool_indices) for a in answers]


def answer_inputs(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, selected: SelectedPrompt,
                  inputs: Sequence[Example], **kwargs) -> list[Answer]:
    """Every input answered with ``selected``'s prompt, its prefix encoded once and shared
    (:func:`iter_answers`, whose keyword arguments it takes), in input order."""
    return [a for answers in iter_answers(model, tokenizer, selected, inputs, **kwargs) for a in answers]


CALIBRATION_INPUTS = 128  # batch calibration on the user's inputs: estimated on the first this many
MIN_BATCH_INPUTS = 32  # ... and refused with fewer (a bias from a handful of inputs is mostly their labels)


LEAN_SHARE = 0.65  # one label's share of the answers above which batch calibration on the inputs is warned of


def leaning(scores: Tensor, calibration: Calibration, labels: Sequence[str]) -> str | None:
    """A warning where ``calibration``'s answers on ``scores (n, L)`` give one label more than
    :data:`LEAN_SHARE` of them: inputs that lean so, batch calibration on the inputs pulls away from
    that label (it assumes balanced labels). None otherwise."""
    picks = calibration.apply(scores.double()).argmax(-1)
    counts = torch.bincount(picks, minlength=len(labels)).double() / max(len(picks), 1)
    top = int(counts.argmax())
    if counts[top] <= LEAN_SHARE:
        return None
    return (f"{100 * float(counts[top]):.0f}% of the first {len(picks)} inputs are answered {labels[top]!r} with the "
            f"selection's own {calibration.method} bias: if the inputs lean so, --calibrate batch (which assumes "
            "balanced labels) pulls answers away from it; on an 80/20 file it cost 10-16 points against the saved "
            "bias (docs/research/calibration.md). --calibrate selection keeps the saved bias")


def answer_calibration(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, selected: SelectedPrompt,
                       method: str, inputs: Sequence[Example], notes: list[str] | None = None,
                       **kwargs) -> Calibration:
    """The calibration ``method`` of ``selected``'s prompt estimated at answering time, through the same
    path the answers take (``kwargs``: :func:`iter_answers`'s ``cache``, ``compressor``, ``task``, ``batch``):
    ``batch`` on the first :data:`CALIBRATION_INPUTS` of ``inputs`` (at least :data:`MIN_BATCH_INPUTS`),
    ``contextual`` and ``domain`` on their own inputs (``domain``'s words drawn from ``inputs``). The
    inputs' labels are never read. ``notes`` gets :func:`leaning`'s warning for ``batch`` where the
    selection has a saved calibration to read the inputs' lean with."""
    from icl_ssm.calibrate import estimate, get_calibrator

    task = kwargs.get("task") or selected.task_object()
    if task.kind != "classification":
        raise ValueError(f"--calibrate {method}: task {selected.task!r} is {task.kind!r}; a calibration shifts label "
                         "scores, which only a classification task has")
    if method != "none" and get_calibrator(method).needs_labels:
        raise ValueError(f"--calibrate {method} fits its bias on labels, which answering does not read; accepted "
                         "here: selection, none, batch, contextual, domain")
    if method == "batch" and len(inputs) < MIN_BATCH_INPUTS:
        raise ValueError(f"--calibrate batch estimates the bias on the inputs themselves and needs at least "
                         f"{MIN_BATCH_INPUTS} of them; the file holds {len(inputs)}: use --calibrate selection (the "
                         "bias saved with the selection) or contextual")
    head = [Example(q.id, q.input, "") for q in inputs[:CALIBRATION_INPUTS]]  # labels unread

    read: list[Tensor] = []

    def scorer(xs: Sequence[Example]) -> Tensor:
        answers = answer_inputs(model, tokenizer, selected, xs, calibration=None, **kwargs)
        read.append(torch.tensor([[a.scores[label] for label in task.labels] for a in answers], dtype=torch.float64))
        return read[-1]

    calibration = estimate(method, task.labels, scorer, head, rng=np.random.default_rng(0))
    saved = selected.calibration
    if method == "batch" and notes is not None and saved is not None and not saved.is_none:
        warning = leaning(read[-1], saved, task.labels)
        if warning:
            notes.append(warning)
    if method == "batch":
        return Calibration(method, calibration.labels, calibration.bias, calibration.inputs,
                           f"{calibration.source} (the first {len(head)} inputs answered)")
    return calibration


def answer_inputs_ref(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, selected: SelectedPrompt,
                      inputs: Sequence[Example], *, task: Task | None = None, batch: int | None = None,
                      max_new_tokens: int = 32, calibration: Calibration | str | None = FROM_SELECTION
                      ) -> list[Answer]:
    """The reference for :func:`answer_inputs`: each input's whole prompt encoded on its own
    (``batch=None``: one unpadded forward per input; ``batch=b``: ``b`` padded prompts per
    forward, as a user without a shared prefix would batch them); ``calibration`` as there."""
    task = task or selected.task_object()
    if calibration == FROM_SELECTION:
        calibration = selected.calibration
    builder = PromptBuilder.for_model(model, tokenizer, task, chat=selected.chat)
    demos = selected.examples()
    prompts = [builder.build(demos, q) for q in inputs]
    if task.kind == "classification":
        scores = scores_reencoded(model, builder, prompts, batch)[1]
        answers = _labelled(builder, scores, inputs, calibration)
    else:
        answers = _generated(model, builder, None, [p.input_ids for p in prompts], inputs, max_new_tokens,
                             batch or 1)
    return [_with_demos(a, selected.ids, selected.pool_indices) for a in answers]


# ---------------------------------------------------------------------- helpers

def _answer(model: PreTrainedModel, builder: PromptBuilder, prefix: PrefixCache | None, seqs: list[list[int]],
            inputs: Sequence[Example], max_new_tokens: int, calibration: Calibration | None = None) -> list[Answer]:
    if builder.task.kind == "classification":
        return _labelled(builder, scores_after_prefix(model, builder, prefix, seqs)[1], inputs, calibration)
    return _generated(model, builder, prefix, seqs, inputs, max_new_tokens, len(seqs))


def _labelled(builder: PromptBuilder, scores: Tensor, inputs: Sequence[Example],
              calibration: Calibration | None = None) -> list[Answer]:
    """Answers from label scores ``(n, L)``: the best label (after ``calibration``, when one is
    given and is not ``none``), every label's score, and 0/1 against the input's label where it
    has one."""
    labels = builder.task.labels
    calibrate = calibration is not None and not calibration.is_none
    shifted = calibration.apply(scores.double()).tolist() if calibrate else [None] * len(inputs)
    out = []
    for row, cal, q in zip(scores.cpu().tolist(), shifted, inputs, strict=True):
        raw = labels[max(range(len(labels)), key=row.__getitem__)]
        best = labels[max(range(len(labels)), key=cal.__getitem__)] if calibrate else raw
        out.append(Answer(q.id, best, dict(zip(labels, row, strict=True)), [], None,
                          float(best == q.target) if q.target else None,
                          dict(zip(labels, cal, strict=True)) if calibrate else None, raw if calibrate else None,
                          float(raw == q.target) if calibrate and q.target else None))
    return out


def _generated(model: PreTrainedModel, builder: PromptBuilder, prefix: PrefixCache | None, seqs: list[list[int]],
               inputs: Sequence[Example], max_new_tokens: int, batch: int) -> list[Answer]:
    texts = generate_answers(model, builder, seqs, prefix=prefix, max_new_tokens=max_new_tokens, batch_size=batch)
    return [Answer(q.id, text, None, [], None, builder.task.score(text, q) if q.target else None)
            for text, q in zip(texts, inputs, strict=True)]


def _with_demos(answer: Answer, ids: list[str], indices: list[int] | None) -> Answer:
    answer.demonstrations, answer.pool_indices = list(ids), None if indices is None else list(indices)
    return answer

"""Answer logits after a prefix cache: the batched, packed and reference paths (tested equal), the
per-query losses and label scores read from them (multi-token labels through
:mod:`~icl_ssm.evaluate.label_trie`), and :func:`evaluate_prefixes`, which scores many prefixes
(subsets) against many queries."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache
from icl_ssm.compress.packed import forward_packed
from icl_ssm.cost import Cost
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.label_trie import answer_scores
from icl_ssm.lm.batch import PromptLike, as_ids, pad_ids
from icl_ssm.lm.generation import generate_answers
from icl_ssm.lm.hf import accepts_logits_to_keep
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import answer_loss

LOSSES = ("nll", "ce")  # gold-verbaliser NLL, or cross-entropy over the label set


def pad_right(prompts: Sequence[PromptLike], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Right-pad prompts into ``input_ids (B, T)`` long and ``attention_mask (B, T)`` bool."""
    return pad_ids([as_ids(p) for p in prompts], "right", pad_id)


@dataclass
class PrefixEval:
    """Answers to ``Q`` queries after each of ``R`` prefix rows (one row per subset).

    ``loss``: (R, Q) float32, the per-query loss of the gold answer (gold-verbaliser NLL, or
    the cross-entropy over the label set); ``correct``: (R, Q) float32, the task's metric;
    ``pred``: (R, Q) long, the predicted label index (-1 for generative tasks);
    ``prompt_length``: (R,) long, real tokens of each row's prompt; ``cache_length``: cache
    slots per row; ``logits``: (R, Q, V) float32 answer-position logits, or None once dropped;
    ``cost``: FLOPs and seconds to build the caches and answer the queries (all rows);
    ``scores``: (R, Q, L) float32 every label's verbaliser log-likelihood (classification; None
    for a generative task), what a calibration (:mod:`icl_ssm.calibrate`) reads.
    """

    loss: Tensor
    correct: Tensor
    pred: Tensor
    prompt_length: Tensor
    cache_length: int
    logits: Tensor | None = None
    cost: Cost = field(default_factory=Cost)
    scores: Tensor | None = None

    @property
    def rows(self) -> int:
        return self.loss.shape[0]

    def subset_loss(self) -> Tensor:
        """(R,) mean loss over the queries: the score demonstration selection ranks by."""
        return self.loss.mean(1)

    def subset_acc(self) -> Tensor:
        """(R,) mean metric over the queries."""
        return self.correct.mean(1)

    def without_logits(self) -> PrefixEval:
        return PrefixEval(self.loss, self.correct, self.pred, self.prompt_length, self.cache_length, None, self.cost,
                          self.scores)

    @staticmethod
    def cat(evals: Sequence[PrefixEval]) -> PrefixEval:
        """Rows of several evaluations (same queries) stacked; logits kept only if all have them."""
        if not evals:
            raise ValueError("PrefixEval.cat needs at least one evaluation")
        logits = [e.logits for e in evals]
        total = Cost()
        for e in evals:
            total = total + e.cost
        return PrefixEval(
            loss=torch.cat([e.loss for e in evals]),
            correct=torch.cat([e.correct for e in evals]),
            pred=torch.cat([e.pred for e in evals]),
            prompt_length=torch.cat([e.prompt_length for e in evals]),
            cache_length=max(e.cache_length for e in evals),
            logits=None if any(z is None for z in logits) else torch.cat(logits),
            cost=total,
            scores=None if any(e.scores is None for e in evals) else torch.cat([e.scores for e in evals]),
        )


@dataclass
class LogitAgreement:
    """Per-(row, query) agreement of answer-position logits with a reference path.

    ``rel_err``: (R, Q) ``||z - z_ref||_2 / ||z_ref||_2``; ``kl``: (R, Q)
    ``KL(softmax(z_ref) || softmax(z))`` in nats; ``top1``: (R, Q) bool, equal argmax; ``mse``:
    (R, Q) ``mean_v (z_v - z_ref_v)^2``, the output MSE over the vocabulary.
    """

    rel_err: Tensor
    kl: Tensor
    top1: Tensor
    mse: Tensor

    @staticmethod
    def cat(parts: Sequence[LogitAgreement]) -> LogitAgreement:
        return LogitAgreement(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(LogitAgreement)))


def logit_agreement(z_ref: Tensor, z: Tensor) -> LogitAgreement:
    """Compare logits ``z`` with reference logits ``z_ref``, both ``(..., V)``; results ``(...)``."""
    if z_ref.shape != z.shape:
        raise ValueError(f"logits of shape {tuple(z.shape)} cannot be compared with {tuple(z_ref.shape)}")
    z_ref, z = z_ref.double(), z.double()  # KL of near-equal distributions needs the precision
    rel = (z - z_ref).norm(dim=-1) / z_ref.norm(dim=-1)
    logp_ref, logp = z_ref.log_softmax(-1), z.log_softmax(-1)
    kl = (logp_ref.exp() * (logp_ref - logp)).sum(-1).clamp(min=0.0)  # rounding can dip below 0
    top1 = z.argmax(-1) == z_ref.argmax(-1)
    mse = (z - z_ref).pow(2).mean(-1)
    return LogitAgreement(rel.float(), kl.float(), top1, mse.float())


def _logits_to_keep(model: PreTrainedModel) -> dict[str, int]:
    return {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}


def answer_logits(
    model: PreTrainedModel, prefixes: PrefixCache, suffixes: Sequence[Sequence[int]], rows: Sequence[int]
) -> Tensor:
    """Answer-position logits of ``suffixes[i]`` after prefix row ``rows[i]``: ``(n, V)`` float32.

    The fast path: one forward over left-padded suffixes (so the answer position is the last
    column and only its logits are computed).
    """
    if len(suffixes) != len(rows):
        raise ValueError(f"{len(suffixes)} suffixes but {len(rows)} prefix rows; expected equal")
    device = prefixes.mask.device
    width = max(len(s) for s in suffixes)
    ids = torch.zeros((len(suffixes), width), dtype=torch.long)
    mask = torch.zeros((len(suffixes), width), dtype=torch.bool)
    for b, s in enumerate(suffixes):
        if not s:
            raise ValueError(f"suffix {b} is empty; expected at least one token")
        ids[b, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
        mask[b, width - len(s) :] = True
    sub = prefixes.select(list(rows))
    with torch.no_grad():
        out = forward_with_prefix(model, sub, ids.to(device), mask.to(device), **_logits_to_keep(model))
    return out.logits[:, -1].float()  # (n, V)


def answer_logits_packed(
    model: PreTrainedModel, prefixes: PrefixCache, suffixes: Sequence[Sequence[int]], rows: Sequence[int]
) -> Tensor:
    """:func:`answer_logits` with every suffix of a prefix row packed into one sequence
    (:func:`icl_ssm.compress.packed.forward_packed`): the prefix is read once per row instead of copied
    once per query. Same result up to float rounding; ``(n, V)`` float32."""
    with torch.no_grad():
        return forward_packed(model, prefixes, suffixes, rows)[0]


def answer_logits_ref(
    model: PreTrainedModel, prefixes: PrefixCache, suffixes: Sequence[Sequence[int]], rows: Sequence[int]
) -> Tensor:
    """Reference for :func:`answer_logits`: one unpadded forward per pair. ``(n, V)`` float32."""
    device = prefixes.mask.device
    out = []
    with torch.no_grad():
        for s, r in zip(suffixes, rows, strict=True):
            ids = torch.tensor([list(s)], dtype=torch.long, device=device)  # (1, q)
            out.append(forward_with_prefix(model, prefixes.select([r]), ids).logits[0, -1].float())
    return torch.stack(out)  # (n, V)


def _validate_request(builder: PromptBuilder, queries: Sequence[Example], loss: str, query_batch: int) -> None:
    """:func:`evaluate_prefixes`'s arguments, each refused with the accepted values."""
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r}; accepted: {', '.join(LOSSES)}")
    if not queries:
        raise ValueError("no queries: expected at least one")
    if query_batch < 1:
        raise ValueError(f"query_batch={query_batch}; expected >= 1")
    task = builder.task
    if loss == "ce" and task.kind != "classification":
        raise ValueError(f"loss='ce' (cross-entropy over the label set) needs a classification task; "
                         f"task {task.name!r} is {task.kind!r}: use loss='nll'")


def evaluate_prefixes(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prefixes: PrefixCache,
    queries: Sequence[Example],
    *,
    loss: str = "nll",
    query_batch: int = 16,
    keep_logits: bool = True,
    max_new_tokens: int = 32,
    pack: bool = False,
    labelled: bool = True,
) -> PrefixEval:
    """Answer every query after every prefix row: ``R = prefixes.batch_size`` rows, ``Q`` queries.

    Classification: the label scores are the verbalisers' log-likelihoods
    (:func:`icl_ssm.lm.scoring.score_labels`; read off the answer-position logits when every
    verbaliser is one token, and by :func:`~icl_ssm.evaluate.label_trie.answer_scores` when
    not); the prediction is their argmax and the loss is the gold verbaliser's NLL
    (``loss="nll"``, as ``answer_loss(normalize=False)``) or the cross-entropy over the label
    set (``"ce"``, as ``answer_loss(normalize=True)``). Generative: the loss is
    ``answer_loss`` and the metric is ``task.score`` of a greedy answer (slow).

    Pairs are processed ``query_batch`` at a time, so memory is that many copies of a row's
    cache; ``pack=True`` reads the answer logits with :func:`answer_logits_packed` instead (the
    pairs of a row as segments of one sequence: no copies, no padding). ``labelled=False``
    (classification): the queries have no labels; only ``scores`` and ``pred`` are read, ``loss``
    and ``correct`` are NaN. Returns a :class:`PrefixEval` (its ``cost`` is left for the caller to
    fill).
    """
    _validate_request(builder, queries, loss, query_batch)
    classification = builder.task.kind == "classification"
    R, Q = prefixes.batch_size, len(queries)
    suffixes = [builder.build_suffix(q).input_ids for q in queries]
    lead = builder.answer_lead(queries)  # logits are compared where answers differ (see answer_lead)
    gold = torch.tensor([builder.label_index(q) if labelled else 0 for q in queries]) if classification else None
    logits, scores, losses, correct = _answer_pairs(model, builder, prefixes, queries, suffixes, lead,
                                                    query_batch=query_batch, keep_logits=keep_logits,
                                                    max_new_tokens=max_new_tokens, pack=pack)
    if classification:
        s = torch.cat(scores).view(R, Q, -1)  # (R, Q, n_labels)
        per_query, hits, pred = _label_outcomes(s, gold, loss, labelled)
    else:
        per_query = torch.cat(losses).view(R, Q)
        hits = torch.cat(correct).float().view(R, Q)
        pred = torch.full((R, Q), -1, dtype=torch.long)
        s = None
    return PrefixEval(
        loss=per_query.float(),
        correct=hits,
        pred=pred,
        prompt_length=prefixes.prompt_length.cpu(),
        cache_length=prefixes.length,
        logits=torch.cat(logits).view(R, Q, -1) if keep_logits else None,
        scores=None if s is None else s.float(),
    )


def _answer_pairs(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prefixes: PrefixCache,
    queries: Sequence[Example],
    suffixes: Sequence[Sequence[int]],
    lead: list[int],
    *,
    query_batch: int,
    keep_logits: bool,
    max_new_tokens: int,
    pack: bool,
) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
    """Every (row r, query q) pair, in the order ``r * Q + q``, ``query_batch`` pairs at a time.

    Returns per batch of ``n`` pairs, on the CPU: the answer-position logits ``(n, V)`` (when
    ``keep_logits``); classification: the label scores ``(n, n_labels)``; generative: the
    answer losses ``(n,)`` and the metric of a greedy answer ``(n,)``.
    """
    classification = builder.task.kind == "classification"
    label_tokens = None
    if classification:
        labels = builder.label_ids()
        single = all(len(ids) == 1 for ids in labels)
        label_tokens = torch.tensor([ids[0] for ids in labels]) if single else None
    pairs = [(r, q) for r in range(prefixes.batch_size) for q in range(len(queries))]
    logits, scores, losses, correct = [], [], [], []
    for start in range(0, len(pairs), query_batch):
        chunk = pairs[start : start + query_batch]
        rows = [r for r, _ in chunk]
        sfx = [suffixes[q] for _, q in chunk]
        if classification and label_tokens is None:  # multi-token verbalisers: the query is read once
            z, label_scores = answer_scores(model, builder, prefixes, sfx, rows)
            scores.append(label_scores.cpu())
        else:
            read = answer_logits_packed if pack else answer_logits
            z = read(model, prefixes, [s + lead for s in sfx], rows)  # (n, V)
        if keep_logits:
            logits.append(z.cpu())
        if classification:
            if label_tokens is not None:
                scores.append(z.log_softmax(-1)[:, label_tokens.to(z.device)].cpu())  # (n, n_labels)
        else:
            chunk_loss, chunk_correct = _graded_answers(model, builder, prefixes.select(rows), sfx,
                                                        [queries[q] for _, q in chunk], query_batch, max_new_tokens)
            losses.append(chunk_loss)
            correct.append(chunk_correct)
    return logits, scores, losses, correct


def _graded_answers(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prefix: PrefixCache,
    suffixes: Sequence[Sequence[int]],
    examples: Sequence[Example],
    batch_size: int,
    max_new_tokens: int,
) -> tuple[Tensor, Tensor]:
    """Generative: each pair's answer loss ``(n,)`` and ``task.score`` of its greedy answer ``(n,)``."""
    losses = answer_loss(model, builder, suffixes, examples, prefix=prefix, batch_size=batch_size).cpu()
    answers = generate_answers(model, builder, suffixes, prefix=prefix, max_new_tokens=max_new_tokens,
                               batch_size=batch_size)
    return losses, torch.tensor([builder.task.score(a, e) for a, e in zip(answers, examples, strict=True)])


def _label_outcomes(scores: Tensor, gold: Tensor, loss: str, labelled: bool) -> tuple[Tensor, Tensor, Tensor]:
    """From label scores ``(R, Q, n_labels)`` and the gold labels ``(Q,)``: the per-query loss,
    the hits (NaN both when not ``labelled``) and the predicted label, each ``(R, Q)``."""
    R, Q = scores.shape[:2]
    g = gold[None].expand(R, Q)
    if loss == "nll":
        per_query = -scores.gather(-1, g[..., None])[..., 0]
    else:
        per_query = -scores.log_softmax(-1).gather(-1, g[..., None])[..., 0]
    pred = scores.argmax(-1)  # (R, Q)
    hits = (pred == g).float()
    if not labelled:
        per_query, hits = torch.full_like(per_query, math.nan), torch.full_like(hits, math.nan)
    return per_query, hits, pred

"""Subset evaluators: the validation loss of many demonstration subsets at once, from compressed,
window or exact prefix caches (:class:`CacheEvaluator`) or one full prompt per query
(:class:`PerQueryDenseEvaluator`), with the split-half reliability of the losses."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.builders import CacheBuilder, cache_for
from icl_ssm.compress.cache import PrefixCache
from icl_ssm.compress.compressor import SSMCompressor
from icl_ssm.cost import Cost, ShapeFlops, measure
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.answers import LOSSES, evaluate_prefixes, pad_right
from icl_ssm.evaluate.stats import label_weights, queries_for_reliability, spearman_brown, split_half_spearman
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import answer_loss

# the reliability a validation set should give the subsets' ranking; `select` names the queries it takes
RELIABILITY_TARGET = 0.8
# how CacheEvaluator counts FLOPs: "sample" (a few batches counted, the others interpolated by length, so
# that the counter's dispatch stays out of most timings), "count" (every batch: the reference), "off"
FLOP_MODES = ("sample", "count", "off")


@dataclass
class SubsetLosses:
    """``losses``: (M,) mean validation loss per subset; cost and transformer tokens spent.

    ``query_losses``: (M, Q) the loss of every validation query after every subset, where the
    evaluator has them (model evaluators do, oracles do not); ``query_labels``: (Q,) each
    query's label index when ``losses`` are label-balanced (None for the plain mean). With them
    :func:`split_half` tells how much of the subsets' ranking the validation set can carry.
    ``query_scores``: (M, Q, L) every label's verbaliser log-likelihood for every query after
    every subset, where the evaluator reads them (a classification task on model caches): what a
    calibration (:mod:`icl_ssm.select.calibrated`) is applied to.
    """

    losses: np.ndarray
    cost: Cost = field(default_factory=Cost)
    tokens: int = 0
    query_losses: np.ndarray | None = None
    query_labels: np.ndarray | None = None
    query_scores: np.ndarray | None = None


class SubsetEvaluator:
    """Override :meth:`evaluate`: the mean validation loss of each demonstration subset."""

    name: ClassVar[str] = ""

    def evaluate(self, pool: Sequence[Example], validation: Sequence[Example],
                 subsets: Sequence[Sequence[int]]) -> SubsetLosses:
        raise NotImplementedError  # abstract: every evaluator overrides it


@dataclass
class OracleEvaluator(SubsetEvaluator):
    """``fn(subset) -> loss``: a known function of the subset, for tests and simulations."""

    fn: Callable[[Sequence[int]], float]
    name: ClassVar[str] = "oracle"

    def evaluate(self, pool, validation, subsets):
        return SubsetLosses(np.array([float(self.fn(list(s))) for s in subsets], dtype=np.float64))


def query_labels(builder: PromptBuilder, validation: Sequence[Example], balance_labels: bool) -> np.ndarray | None:
    """``(Q,)`` label index of each validation query when a subset's loss is label-balanced
    (weights :func:`icl_ssm.evaluate.stats.label_weights`), None for the plain mean (taken as the mean
    itself, so that results do not move in the last bits)."""
    if not balance_labels:
        return None
    if builder.task.kind != "classification":
        raise ValueError(f"balance_labels needs a classification task; task {builder.task.name!r} is "
                         f"{builder.task.kind!r}")
    return np.array([builder.label_index(q) for q in validation])


def split_half(result: SubsetLosses) -> float:
    """Spearman between the subsets' losses on two halves of the validation queries (each
    label's queries alternating between the halves when the losses are label-balanced).

    Near 1: the validation set ranks the subsets the same way whichever half of it is asked,
    so the ranking belongs to the subsets; near 0: it is mostly which queries were drawn, and
    affinity scores built on it select by chance. NaN without per-query losses, with fewer
    than 2 queries or fewer than 3 subsets.
    """
    q = result.query_losses
    if q is None or q.ndim != 2 or q.shape[0] < 3:
        return math.nan
    return split_half_spearman(q, result.query_labels)


def reliability(half: float, queries: int, target: float = RELIABILITY_TARGET) -> dict:
    """What the split-half ``half`` measured on ``queries`` validation queries says of the
    subsets' ranking: ``split_half``; ``reliability``, the whole set's (Spearman-Brown; 0 where
    the halves disagree, ``half <= 0``); and
    ``queries_needed``, the queries Spearman-Brown predicts for a reliability of ``target``
    (None where the halves do not agree at all). All None without a split-half.
    """
    if not math.isfinite(half):
        return {"split_half": None, "reliability": None, "queries_needed": None}
    return {"split_half": half, "reliability": spearman_brown(half) if half > 0 else 0.0,
            "queries_needed": queries_for_reliability(half, queries, target)}


@dataclass
class CacheEvaluator(SubsetEvaluator):
    """Each subset's prefix turned into a cache, every validation query answered after it.

    ``cache``: a :class:`~icl_ssm.compress.builders.CacheBuilder` (:class:`DenseCache`, the
    exact prefix cache computed once per subset and shared by its queries;
    :class:`CompressedCache`; any other), whose ``name`` the evaluator takes. ``batch``
    subsets are encoded together (each row its own cache) and ``query_batch`` (subset, query)
    pairs answered together. Tokens counted: the transformer's input tokens (the prompt for
    dense, the sinks for compressed, plus every query suffix); the SSM reads embeddings.
    ``balance_labels``: a subset's loss is the mean of its per-label mean losses (classification;
    see :func:`icl_ssm.evaluate.stats.label_weights`), so the label mix of the validation queries does
    not decide which subsets look best. ``pack`` (default): a subset's queries are read as
    segments of one sequence after its cache (:func:`icl_ssm.evaluate.answers.answer_logits_packed`)
    instead of each after its own copy of it (``pack=False``, the padded batches of
    :func:`icl_ssm.evaluate.answers.answer_logits`): the same losses up to float rounding, no cache
    copies and no padding (at k = 50 with 16 reviews: half the compressed evaluator's FLOPs,
    half the dense one's seconds; BENCHMARKS.md). A packed row's attention is quadratic in
    ``query_batch`` times the query length: lower ``query_batch`` for long queries.
    ``flops``: ``"sample"`` (default) counts FLOPs with ``FlopCounterMode`` on a few batches and
    interpolates the others by padded length (:class:`icl_ssm.cost.ShapeFlops`), so that the
    seconds are mostly the work's own; ``"count"`` counts every batch inside the timed block
    (the reference); ``"off"`` counts none.
    """

    model: PreTrainedModel
    builder: PromptBuilder
    cache: CacheBuilder
    loss: str = "nll"
    batch: int = 8
    query_batch: int = 32
    balance_labels: bool = False
    pack: bool = True
    flops: str = "sample"
    _flop_samples: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.flops not in FLOP_MODES:
            raise ValueError(f"flops={self.flops!r}; accepted: {', '.join(FLOP_MODES)}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r}; accepted: {', '.join(LOSSES)}")
        if self.batch < 1 or self.query_batch < 1:
            raise ValueError(f"batch={self.batch}, query_batch={self.query_batch}: expected >= 1")
        if not isinstance(self.cache, CacheBuilder):
            raise TypeError(f"cache={self.cache!r}: expected a CacheBuilder (icl_ssm.compress.builders: DenseCache, "
                            "CompressedCache, ...); cache_for(name, model, compressor) makes one from a name")

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.cache.name

    def build(self, ids: Tensor, mask: Tensor) -> PrefixCache:
        return self.cache(ids, mask)

    def evaluate(self, pool, validation, subsets):
        device = self.model.device
        suffix_lengths = tuple(len(self.builder.build_suffix(q).input_ids) for q in validation)
        suffix_tokens = sum(suffix_lengths)
        form = self._flop_samples.setdefault(suffix_lengths, ShapeFlops())  # per (B, T), kept across calls
        labels = query_labels(self.builder, validation, self.balance_labels)
        weights = None if labels is None else label_weights(labels)
        losses, per_query, scores, total, tokens = [], [], [], Cost(), 0
        for start in range(0, len(subsets), self.batch):
            chunk = subsets[start : start + self.batch]
            ids, mask = pad_right([self.builder.build_prefix([pool[i] for i in s]) for s in chunk])
            shape = tuple(ids.shape[:2])
            count = self.flops == "count" or (self.flops == "sample" and form.wants(*shape))
            with torch.no_grad(), measure(device, count_flops=count) as cost:
                prefix = self.build(ids.to(device), mask.to(device))
                ev = evaluate_prefixes(self.model, self.builder, prefix, validation, loss=self.loss,
                                       query_batch=self.query_batch, keep_logits=False, pack=self.pack)
            if self.flops == "sample":
                if count:
                    form.add(*shape, cost.flops)
                else:
                    cost.flops = form.predict(*shape)
            q = ev.loss.double().numpy()
            per_query.append(q)
            scores.append(None if ev.scores is None else ev.scores.double().numpy())
            losses.append(ev.subset_loss().double().numpy() if weights is None else q @ weights)
            total = total + cost
            tokens += self.cache.tokens(mask) + len(chunk) * suffix_tokens
        read = None if not scores or any(x is None for x in scores) else np.concatenate(scores)
        return SubsetLosses(np.concatenate(losses), total, tokens, np.concatenate(per_query), labels, read)


@dataclass
class PerQueryDenseEvaluator(SubsetEvaluator):
    """One full prompt (demonstrations + query) per (subset, query) pair, nothing shared: the
    cost accounting of the paper's dense baseline. Reference for :class:`CacheEvaluator`
    with ``cache="dense"`` (same losses up to float tolerance)."""

    model: PreTrainedModel
    builder: PromptBuilder
    loss: str = "nll"
    batch: int = 8
    balance_labels: bool = False
    name: ClassVar[str] = "dense-per-query"

    def evaluate(self, pool, validation, subsets):
        labels = query_labels(self.builder, validation, self.balance_labels)
        weights = None if labels is None else label_weights(labels)
        losses, rows, total, tokens = [], [], Cost(), 0
        for s in subsets:
            demos = [pool[i] for i in s]
            prompts = [self.builder.build(demos, q) for q in validation]
            with torch.no_grad(), measure(self.model.device) as cost:
                per_query = answer_loss(self.model, self.builder, prompts, list(validation),
                                          normalize=self.loss == "ce", batch_size=self.batch)
            q = per_query.double()
            rows.append(q.numpy())
            losses.append(float(q.mean() if weights is None else q.numpy() @ weights))
            total = total + cost
            tokens += sum(len(p.input_ids) for p in prompts)
        per_query_losses = np.stack(rows) if rows else np.zeros((0, len(validation)))
        return SubsetLosses(np.array(losses, dtype=np.float64), total, tokens, per_query_losses, labels)


def evaluator_for(cfg, model: PreTrainedModel, builder: PromptBuilder,
                  compressor: SSMCompressor | None = None) -> SubsetEvaluator:
    """The subset evaluator a selection config names (``cfg.evaluator``: ``dense-per-query``, one
    full prompt per query, else a :class:`CacheEvaluator` of that cache, ``compressed`` needing
    ``compressor``), with its loss, batch sizes, label balance and query packing."""
    if cfg.evaluator == "dense-per-query":
        return PerQueryDenseEvaluator(model, builder, cfg.loss, cfg.batch, balance_labels=cfg.balance_labels)
    return CacheEvaluator(model, builder, cache_for(cfg.evaluator, model, compressor), loss=cfg.loss, batch=cfg.batch,
                          query_batch=cfg.query_batch, balance_labels=cfg.balance_labels, pack=cfg.pack)


def concat(*parts: SubsetLosses) -> SubsetLosses:
    """The subsets of ``parts`` in order, costs and tokens summed; per-query losses kept only
    when every part has them."""
    per_query = [p.query_losses for p in parts]
    scores = [p.query_scores for p in parts]
    return SubsetLosses(
        np.concatenate([p.losses for p in parts]), sum((p.cost for p in parts), Cost()), sum(p.tokens for p in parts),
        None if any(q is None for q in per_query) else np.concatenate(per_query), parts[0].query_labels,
        None if any(x is None for x in scores) else np.concatenate(scores),
    )

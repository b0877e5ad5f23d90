"""``icl-ssm fidelity``: how well a compressed cache stands in for the dense prompt.

Demonstration selection only needs the compressed cache to *rank* subsets the way the dense
prompt does, so beside the per-query agreement of the answer-position logits (relative L2
error, KL, top-1) this reports the Spearman correlation, over held-out subsets, between each
subset's mean validation loss computed densely and computed from the compressed cache.

The "answer position" is the first token where answers differ: the query is followed by the
tokens every answer starts with (``PromptBuilder.answer_lead``; the space of SmolLM2's
``' ', '4', '2'`` for " 42"), since at a position every prompt answers alike the logits agree
whatever the cache holds.

The core is reusable by distillation and selection:

* :func:`sample_subsets` - ``n`` random ``k``-subsets of a pool (explicit numpy Generator);
* :func:`evaluate_prefixes` - answer ``Q`` queries after each of ``R`` prefix rows: the
  answer-position logits ``(R, Q, V)``, the gold loss and the prediction per (row, query);
  :func:`answer_logits` is its batched fast path, :func:`answer_logits_packed` the one for
  long shared prefixes (a row's queries packed into one sequence), :func:`answer_logits_ref`
  the reference of both;
* :func:`evaluate_paths` - the same subsets through several cache builders (dense, compressed,
  control, window), streaming the logit agreement with the reference path batch by batch so
  that no ``(S, Q, V)`` tensor is ever held;
* :func:`fidelity_report` - the summary dict of one path against the dense one.

Paper: Zhang et al., "Long-Context Demonstration Selection Using State Space Models".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm import atomic
from icl_ssm import cache as K
from icl_ssm import prompts as P
from icl_ssm import tasks as T
from icl_ssm.compressor import SSMCompressor, load_compressor
from icl_ssm.cost import Cost, measure
from icl_ssm.models import DEFAULT_MODEL, load_model, resolve_device

LOSSES = ("nll", "ce")  # gold-verbaliser NLL, or cross-entropy over the label set

# (input_ids (B, T), attention_mask (B, T), right-padded) -> a cache standing for each row
CacheBuilder = Callable[[Tensor, Tensor], K.PrefixCache]


# ----------------------------------------------------------------------------- sampling


def sample_subsets(pool: int | Sequence[Any], k: int, n: int, rng: np.random.Generator) -> list[list[int]]:
    """``n`` subsets of ``k`` distinct pool indices each, in random demonstration order.

    Deterministic for the state of ``rng``. Subsets are drawn independently, so two may
    coincide on a tiny pool.
    """
    size = pool if isinstance(pool, int) else len(pool)
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: expected an integer >= 1 demonstrations per subset")
    if k > size:
        raise ValueError(
            f"k={k} demonstrations requested but the candidate pool has only {size} examples; "
            "lower k or use a task with a larger pool"
        )
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"subsets={n!r}: expected an integer >= 1")
    return [rng.choice(size, size=k, replace=False).tolist() for _ in range(n)]


def pad_right(prompts: Sequence[P.PromptLike], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Right-pad prompts into ``input_ids (B, T)`` long and ``attention_mask (B, T)`` bool."""
    return P.pad_ids([P.as_ids(p) for p in prompts], "right", pad_id)


# ----------------------------------------------------------------------------- statistics


def rankdata(x: Sequence[float] | np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (``scipy.stats.rankdata(method="average")``)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    new = np.r_[True, ordered[1:] != ordered[:-1]]  # first element of each tie group
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], len(x)]
    average = (starts + ends + 1) / 2  # mean of the 1-based ranks start+1 .. end
    ranks = np.empty(len(x))
    ranks[order] = average[np.cumsum(new) - 1]
    return ranks


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation; NaN when either side is constant or has fewer than 2 values."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"pearson needs two 1-D arrays of one length, got {x.shape} and {y.shape}")
    if len(x) < 2:
        return math.nan
    dx, dy = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(np.clip(dx @ dy / denom, -1.0, 1.0)) if denom > 0 else math.nan


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation (Pearson of average ranks); NaN when a side is constant."""
    return pearson(rankdata(x), rankdata(y))


def spearman_ci(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    level: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`spearman` over resampled (x, y) pairs.

    With 30 subsets a Spearman correlation is uncertain by about +-0.3 (95%), which is the
    size of the differences between compressors; the interval says so in the report.
    Resamples with a constant side are dropped; ``(nan, nan)`` when every one is.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"spearman_ci needs two 1-D arrays of one length, got {x.shape} and {y.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected a coverage between 0 and 1")
    if len(x) < 3:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(x), size=(resamples, len(x)))
    return interval(np.array([spearman(x[i], y[i]) for i in draws]), level)


def bootstrap_spearman(
    ref: Tensor | np.ndarray,
    others: dict[str, Tensor | np.ndarray],
    *,
    queries: bool = True,
    labels: Sequence[int] | np.ndarray | None = None,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Bootstrap draws of each path's subset-loss Spearman with the reference path.

    ``ref`` and every ``others[name]`` are ``(S, Q)`` per-query losses on the same subsets and
    queries. Each draw resamples the ``S`` subsets and, with ``queries``, the ``Q`` queries
    too, recomputes every subset's mean loss on the drawn queries and correlates. Every path
    sees the same draws, so ``draws[a] - draws[b]`` is a paired comparison of two paths.

    Resampling the queries matters: a subset's loss is a mean over a handful of queries, and
    which queries were drawn can move a compressor's Spearman as much as which subsets were.
    With ``labels`` (one per query) every draw's subset losses are label-balanced over the
    drawn queries (:func:`label_weights`).
    Returns ``{name: (resamples,) float64}``, NaN where a draw leaves a side constant.
    """
    ref = np.asarray(ref, dtype=np.float64)
    if ref.ndim != 2:
        raise ValueError(f"bootstrap_spearman needs (subsets, queries) losses, got shape {ref.shape}")
    S, Q = ref.shape
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, S, size=(resamples, S))
    counts = np.ones((resamples, Q))  # every query once
    if queries:
        counts = np.stack([np.bincount(c, minlength=Q) for c in rng.integers(0, Q, size=(resamples, Q))]).astype(float)
    if labels is None:
        weights = counts / Q
    else:
        labels = np.asarray(labels)
        if labels.shape != (Q,):
            raise ValueError(f"bootstrap_spearman: {labels.shape[0]} labels for {Q} queries")
        weights = np.zeros((resamples, Q))
        for value in np.unique(labels):
            of = labels == value
            drawn = counts[:, of].sum(1, keepdims=True)  # queries of this label in each draw
            weights[:, of] = np.divide(counts[:, of], drawn, out=np.zeros_like(counts[:, of]), where=drawn > 0)
        weights /= weights.sum(1, keepdims=True)  # each label drawn carries the same weight

    def subset_means(x: np.ndarray) -> np.ndarray:  # (resamples, S): drawn subsets, drawn queries
        return np.einsum("bsq,bq->bs", x[rows], weights)

    ref_means = subset_means(ref)
    draws = {}
    for name, x in others.items():
        x = np.asarray(x, dtype=np.float64)
        if x.shape != ref.shape:
            raise ValueError(f"bootstrap_spearman: losses of {name!r} have shape {x.shape}, the reference {ref.shape}")
        draws[name] = np.array([spearman(a, b) for a, b in zip(ref_means, subset_means(x))])
    return draws


def label_weights(labels: Sequence[int] | np.ndarray) -> np.ndarray:
    """``(Q,)`` query weights summing to 1 that give every label present the same total weight.

    A subset's label balance shifts every answer toward the labels it shows most: queries of
    that label gain, the others lose. Its plain mean loss therefore moves with the label mix of
    the queries that happened to be drawn, and on Rotten Tomatoes at k = 50 the subsets' losses
    on positive and on negative queries rank them in opposite orders (BENCHMARKS.md). Weighted
    this way, a subset's loss is the mean of its per-label mean losses, as on a balanced test set.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not len(labels):
        raise ValueError(f"label_weights needs a non-empty 1-D array of labels, got shape {labels.shape}")
    values, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (len(values) * counts[inverse])


def stratified_halves(labels: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Query indices split in two, each label's queries alternating between the halves."""
    labels = np.asarray(labels)
    first = np.zeros(len(labels), dtype=bool)
    for value in np.unique(labels):
        first[np.flatnonzero(labels == value)[0::2]] = True
    return np.flatnonzero(first), np.flatnonzero(~first)


def split_half_spearman(loss: Tensor | np.ndarray, labels: Sequence[int] | np.ndarray | None = None) -> float:
    """Spearman between the subsets' mean losses on the even and on the odd queries.

    ``loss``: ``(S, Q)`` per-query losses of one path. How much of its ranking of the subsets
    belongs to the subsets rather than to the queries that happened to be drawn, i.e. how far
    it can carry over to other queries from the task. NaN with fewer than 2 queries.
    With ``labels`` (one per query), the halves are label-stratified and each half's loss is
    label-balanced (:func:`label_weights`).
    """
    loss = np.asarray(loss, dtype=np.float64)
    if loss.ndim != 2:
        raise ValueError(f"split_half_spearman needs (subsets, queries) losses, got shape {loss.shape}")
    if loss.shape[1] < 2:
        return math.nan
    if labels is None:
        return spearman(loss[:, 0::2].mean(1), loss[:, 1::2].mean(1))
    labels = np.asarray(labels)
    a, b = stratified_halves(labels)
    if not len(b):
        return math.nan
    return spearman(loss[:, a] @ label_weights(labels[a]), loss[:, b] @ label_weights(labels[b]))


def spearman_brown(half: float, factor: float = 2.0) -> float:
    """Reliability of a mean over ``factor`` times the queries of a half whose split-half
    correlation is ``half``: ``factor * r / (1 + (factor - 1) * r)`` (Spearman-Brown). With the
    default ``factor=2``, the reliability of the whole validation set's ranking. NaN for a NaN
    ``half``; the formula assumes exchangeable queries and is read here for rank correlations,
    as an estimate.
    """
    if not math.isfinite(half):
        return math.nan
    if factor <= 0:
        raise ValueError(f"factor={factor}: expected a positive length ratio")
    return factor * half / (1 + (factor - 1) * half)


def queries_for_reliability(half: float, queries: int, target: float = 0.8) -> int | None:
    """How many validation queries Spearman-Brown predicts a ranking needs to reach reliability
    ``target``, from the split-half correlation ``half`` measured on ``queries`` queries (two
    halves of ``queries / 2``). None when ``half <= 0`` (no length reaches it: the queries do not
    agree on the subsets at all) or is NaN.
    """
    if not 0 < target < 1:
        raise ValueError(f"target={target}: expected a reliability between 0 and 1")
    if queries < 2:
        raise ValueError(f"queries={queries}: a split-half needs at least 2 queries")
    if not math.isfinite(half) or half <= 0:
        return None
    if half >= 1:
        return queries // 2
    factor = target * (1 - half) / (half * (1 - target))
    return max(1, math.ceil(factor * queries / 2 - 1e-9))  # an exact multiple is not rounded up by float error


def interval(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap ``draws``, NaN draws left out; ``(nan, nan)`` if all are."""
    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected a coverage between 0 and 1")
    draws = np.asarray(draws, dtype=np.float64)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return math.nan, math.nan
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


# ----------------------------------------------------------------------------- one path


@dataclass
class PrefixEval:
    """Answers to ``Q`` queries after each of ``R`` prefix rows (one row per subset).

    ``loss``: (R, Q) float32, the per-query loss of the gold answer (gold-verbaliser NLL, or
    the cross-entropy over the label set); ``correct``: (R, Q) float32, the task's metric;
    ``pred``: (R, Q) long, the predicted label index (-1 for generative tasks);
    ``prompt_length``: (R,) long, real tokens of each row's prompt; ``cache_length``: cache
    slots per row; ``logits``: (R, Q, V) float32 answer-position logits, or None once dropped;
    ``cost``: FLOPs and seconds to build the caches and answer the queries (all rows).
    """

    loss: Tensor
    correct: Tensor
    pred: Tensor
    prompt_length: Tensor
    cache_length: int
    logits: Tensor | None = None
    cost: Cost = field(default_factory=Cost)

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
        return PrefixEval(self.loss, self.correct, self.pred, self.prompt_length, self.cache_length, None, self.cost)

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
        )


@dataclass
class LogitAgreement:
    """Per-(row, query) agreement of answer-position logits with a reference path.

    ``rel_err``: (R, Q) ``||z - z_ref||_2 / ||z_ref||_2``; ``kl``: (R, Q)
    ``KL(softmax(z_ref) || softmax(z))`` in nats; ``top1``: (R, Q) bool, equal argmax.
    """

    rel_err: Tensor
    kl: Tensor
    top1: Tensor

    @staticmethod
    def cat(parts: Sequence[LogitAgreement]) -> LogitAgreement:
        return LogitAgreement(*(torch.cat([getattr(p, f) for p in parts]) for f in ("rel_err", "kl", "top1")))


def logit_agreement(z_ref: Tensor, z: Tensor) -> LogitAgreement:
    """Compare logits ``z`` with reference logits ``z_ref``, both ``(..., V)``; results ``(...)``."""
    if z_ref.shape != z.shape:
        raise ValueError(f"logits of shape {tuple(z.shape)} cannot be compared with {tuple(z_ref.shape)}")
    z_ref, z = z_ref.double(), z.double()  # KL of near-equal distributions needs the precision
    rel = (z - z_ref).norm(dim=-1) / z_ref.norm(dim=-1)
    logp_ref, logp = z_ref.log_softmax(-1), z.log_softmax(-1)
    kl = (logp_ref.exp() * (logp_ref - logp)).sum(-1).clamp(min=0.0)  # rounding can dip below 0
    top1 = z.argmax(-1) == z_ref.argmax(-1)
    return LogitAgreement(rel.float(), kl.float(), top1)


def _logits_to_keep(model: PreTrainedModel) -> dict[str, int]:
    return {"logits_to_keep": 1} if P._accepts_logits_to_keep(model) else {}


def answer_logits(
    model: PreTrainedModel, prefixes: K.PrefixCache, suffixes: Sequence[Sequence[int]], rows: Sequence[int]
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
        out = K.forward_with_prefix(model, sub, ids.to(device), mask.to(device), **_logits_to_keep(model))
    return out.logits[:, -1].float()  # (n, V)


def answer_logits_packed(
    model: PreTrainedModel, prefixes: K.PrefixCache, suffixes: Sequence[Sequence[int]], rows: Sequence[int]
) -> Tensor:
    """:func:`answer_logits` with every suffix of a prefix row packed into one sequence
    (:func:`icl_ssm.cache.forward_packed`): the prefix is read once per row instead of copied
    once per query. Same result up to float rounding; ``(n, V)`` float32."""
    with torch.no_grad():
        return K.forward_packed(model, prefixes, suffixes, rows)[0]


def answer_logits_ref(
    model: PreTrainedModel, prefixes: K.PrefixCache, suffixes: Sequence[Sequence[int]], rows: Sequence[int]
) -> Tensor:
    """Reference for :func:`answer_logits`: one unpadded forward per pair. ``(n, V)`` float32."""
    device = prefixes.mask.device
    out = []
    with torch.no_grad():
        for s, r in zip(suffixes, rows, strict=True):
            ids = torch.tensor([list(s)], dtype=torch.long, device=device)  # (1, q)
            out.append(K.forward_with_prefix(model, prefixes.select([r]), ids).logits[0, -1].float())
    return torch.stack(out)  # (n, V)


def answer_scores(
    model: PreTrainedModel,
    builder: P.PromptBuilder,
    prefixes: K.PrefixCache,
    suffixes: Sequence[Sequence[int]],
    rows: Sequence[int],
) -> tuple[Tensor, Tensor]:
    """Answer logits and every label's verbaliser log-likelihood, reading the query only once.

    For multi-token verbalisers (modular_addition's " 0" .. " 96": ``' ', '4', '2'``). One
    forward reads ``suffixes[i] + lead`` after prefix row ``rows[i]`` (``lead`` the tokens every
    answer starts with, :meth:`PromptBuilder.answer_lead`) and keeps its cache; a second
    forward then reads every node of the labels' trie at once (" 4" and " 42" share the node
    '4'; a tree attention mask lets each node see the cache, its ancestors and itself), one
    token a node instead of the whole query again for every label. Returns the
    logits at the first token where answers differ ``(n, V)`` float32 and the scores
    ``(n, n_labels)`` float32, equal to :func:`icl_ssm.prompts.score_labels` (the reference).
    """
    if len(suffixes) != len(rows):
        raise ValueError(f"{len(suffixes)} suffixes but {len(rows)} prefix rows; expected equal")
    lead = builder.answer_lead()
    rest = [ids[len(lead):] for ids in builder.label_ids()]
    device = prefixes.mask.device
    ids, mask = (t.to(device) for t in P.pad_ids([list(s) + lead for s in suffixes], side="left"))
    sub = prefixes.select(list(rows))
    keep = {"logits_to_keep": len(lead) + 1} if _logits_to_keep(model) else {}
    with torch.no_grad():
        out = K.forward_with_prefix(model, sub, ids, mask, **keep)
    logp = torch.log_softmax(out.logits[:, -len(lead) - 1 :].float(), dim=-1)  # (n, lead + 1, V)
    lead_logp = sum((logp[:, j, t] for j, t in enumerate(lead)), logp.new_zeros(len(suffixes)))  # (n,)
    first = logp[:, -1]  # (n, V): where answers differ
    scores = lead_logp[:, None] + first[:, [r[0] for r in rest]]  # (n, n_labels)
    # every further token of a label is read at its node of the labels' trie: one forward of all
    # nodes after the query's cache, each node seeing the cache, its ancestors and itself
    nodes: dict[tuple[int, ...], int] = {}  # a label's first j remaining tokens (j >= 1) -> slot
    for r in rest:
        for j in range(1, len(r)):
            nodes.setdefault(tuple(r[:j]), len(nodes))  # a parent is always entered before its children
    if nodes:
        n, order = len(suffixes), list(nodes)
        extended = sub.extended(P.output_cache(out), mask)
        dtype = extended.keys[0].dtype
        low = torch.finfo(dtype).min
        bias = torch.zeros(extended.mask.shape, dtype=dtype, device=device)
        if extended.bias is not None:
            bias += extended.bias.to(dtype)  # a gated compressor's virtual tokens
        seen = torch.where(extended.mask, bias, torch.full_like(bias, low))  # (n, L)
        sees = torch.tensor([[a[: len(b)] == b for b in order] for a in order], device=device)  # (q, q) a sees b
        tree = torch.zeros(sees.shape, dtype=dtype, device=device).masked_fill(~sees, low)
        q = len(order)
        attention = torch.cat([seen[:, None].expand(n, q, -1), tree[None].expand(n, q, q)], dim=2)[:, None]
        depth = torch.tensor([len(key) - 1 for key in order], device=device)
        with torch.no_grad():
            branch = model(input_ids=torch.tensor([key[-1] for key in order], device=device)[None].expand(n, q),
                           attention_mask=attention, position_ids=extended.next_position[:, None] + depth[None],
                           use_cache=True, **P.with_cache(model, extended.to_dynamic()))
        node_logp = torch.log_softmax(branch.logits.float(), dim=-1)  # (n, q, V)
        for i, r in enumerate(rest):
            for j in range(1, len(r)):
                scores[:, i] += node_logp[:, nodes[tuple(r[:j])], r[j]]
    return out.logits[:, -1].float(), scores


def evaluate_prefixes(
    model: PreTrainedModel,
    builder: P.PromptBuilder,
    prefixes: K.PrefixCache,
    queries: Sequence[T.Example],
    *,
    loss: str = "nll",
    query_batch: int = 16,
    keep_logits: bool = True,
    max_new_tokens: int = 32,
    pack: bool = False,
) -> PrefixEval:
    """Answer every query after every prefix row: ``R = prefixes.batch_size`` rows, ``Q`` queries.

    Classification: the label scores are the verbalisers' log-likelihoods
    (:func:`icl_ssm.prompts.score_labels`; read off the answer-position logits when every
    verbaliser is one token, and by :func:`answer_scores` when not); the prediction is their
    argmax and the loss is the gold verbaliser's NLL (``loss="nll"``, as
    ``answer_loss(normalize=False)``) or the cross-entropy over the label set (``"ce"``, as
    ``answer_loss(normalize=True)``). Generative: the loss is ``answer_loss`` and the metric
    is ``task.score`` of a greedy answer (slow).

    Pairs are processed ``query_batch`` at a time, so memory is that many copies of a row's
    cache; ``pack=True`` reads the answer logits with :func:`answer_logits_packed` instead (the
    pairs of a row as segments of one sequence: no copies, no padding). Returns a
    :class:`PrefixEval` (its ``cost`` is left for the caller to fill).
    """
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r}; accepted: {', '.join(LOSSES)}")
    if not queries:
        raise ValueError("no queries: expected at least one")
    if query_batch < 1:
        raise ValueError(f"query_batch={query_batch}; expected >= 1")
    task = builder.task
    classification = task.kind == "classification"
    if loss == "ce" and not classification:
        raise ValueError(f"loss='ce' (cross-entropy over the label set) needs a classification task; "
                         f"task {task.name!r} is {task.kind!r}: use loss='nll'")
    R, Q = prefixes.batch_size, len(queries)
    suffixes = [builder.build_suffix(q).input_ids for q in queries]
    lead = builder.answer_lead(queries)  # logits are compared where answers differ (see answer_lead)
    pairs = [(r, q) for r in range(R) for q in range(Q)]  # pair r * Q + q
    if classification:
        labels = builder.label_ids()
        gold = torch.tensor([builder.label_index(q) for q in queries])  # (Q,)
        single = all(len(ids) == 1 for ids in labels)
        label_tokens = torch.tensor([ids[0] for ids in labels]) if single else None
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
            sub = prefixes.select(rows)
            examples = [queries[q] for _, q in chunk]
            losses.append(P.answer_loss(model, builder, sfx, examples, prefix=sub, batch_size=query_batch).cpu())
            answers = P.generate_answers(model, builder, sfx, prefix=sub, max_new_tokens=max_new_tokens,
                                         batch_size=query_batch)
            correct.append(torch.tensor([task.score(a, e) for a, e in zip(answers, examples, strict=True)]))
    if classification:
        s = torch.cat(scores).view(R, Q, -1)  # (R, Q, n_labels)
        g = gold[None].expand(R, Q)
        if loss == "nll":
            per_query = -s.gather(-1, g[..., None])[..., 0]
        else:
            per_query = -s.log_softmax(-1).gather(-1, g[..., None])[..., 0]
        pred = s.argmax(-1)  # (R, Q)
        hits = (pred == g).float()
    else:
        per_query = torch.cat(losses).view(R, Q)
        hits = torch.cat(correct).float().view(R, Q)
        pred = torch.full((R, Q), -1, dtype=torch.long)
    return PrefixEval(
        loss=per_query.float(),
        correct=hits,
        pred=pred,
        prompt_length=prefixes.prompt_length.cpu(),
        cache_length=prefixes.length,
        logits=torch.cat(logits).view(R, Q, -1) if keep_logits else None,
    )


# ----------------------------------------------------------------------------- stored reference


def weights_digest(model: torch.nn.Module) -> str:
    """Hash of a model's parameter names, shapes, dtypes and 64 values strided through each.

    Cheap (no full pass over the weights) and changed by any fine-tune, unlike a hash of
    the config alone."""
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        flat = param.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 64)][:64].double().cpu().numpy()
        h.update(f"{name}{tuple(param.shape)}{param.dtype}".encode())
        h.update(sample.tobytes())
    return h.hexdigest()[:16]


class DenseStore:
    """The dense path's answers, one safetensors file per subset row, reused by later runs.

    A row's file is named by a hash of its prompt tokens and of everything else its answers
    depend on: the model's config and :func:`weights_digest`, its dtype and device type, every
    query's tokens and gold answer, the answer lead, the labels and the loss. A run on the same
    queries reads every row it finds and computes only the rest (the prefill over ``k``
    demonstrations is most of a fidelity run's time); a killed run keeps the rows it finished.
    Nothing is ever reused for different inputs: those have another name. Each file is
    written atomically. A row costs ``4 x vocabulary x queries`` bytes (its logits).
    """

    def __init__(self, root: str | Path, model: PreTrainedModel, builder: P.PromptBuilder,
                 queries: Sequence[T.Example], loss: str):
        task = builder.task
        blob = {
            "config": model.config.to_dict(), "weights": weights_digest(model), "dtype": str(model.dtype),
            "device": model.device.type, "loss": loss, "kind": task.kind,
            "queries": [[builder.build_suffix(q).input_ids, str(q.target)] for q in queries],
            "lead": builder.answer_lead(queries),
            "labels": builder.label_ids() if task.kind == "classification" else None,
        }
        for volatile in ("_name_or_path", "transformers_version"):
            blob["config"].pop(volatile, None)
        key = hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]
        self.directory = atomic.prepare_dir(Path(root) / key, "dense store")
        self.reused = 0  # rows read back so far

    def _path(self, ids: Sequence[int]) -> Path:
        return self.directory / f"{hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:24]}.st"

    def get(self, prompts: Sequence[P.PromptLike]) -> PrefixEval | None:
        """The stored answers after every prompt, rows in order, or None if any row is missing."""
        paths = [self._path(P.as_ids(p)) for p in prompts]
        if not all(path.exists() for path in paths):
            return None
        from safetensors.torch import load_file

        rows = []
        for path in paths:
            t = load_file(path)
            cost = Cost(int(t["flops"]), float(t["seconds"]))
            rows.append(PrefixEval(t["loss"], t["correct"], t["pred"], t["prompt_length"],
                                   int(t["cache_length"]), t["logits"], cost))
        self.reused += len(rows)
        return PrefixEval.cat(rows)

    def put(self, prompts: Sequence[P.PromptLike], ev: PrefixEval) -> None:
        """Store ``ev`` (with logits), one file per row; each row is charged an equal share of the cost."""
        if ev.logits is None or ev.rows != len(prompts):
            raise ValueError(f"DenseStore.put needs one evaluated row with logits per prompt ({len(prompts)})")
        from safetensors.torch import save

        for r, prompt in enumerate(prompts):
            t = {"loss": ev.loss[r : r + 1], "correct": ev.correct[r : r + 1], "pred": ev.pred[r : r + 1],
                 "prompt_length": ev.prompt_length[r : r + 1], "logits": ev.logits[r : r + 1],
                 "cache_length": torch.tensor(ev.cache_length),
                 "flops": torch.tensor(ev.cost.flops // ev.rows), "seconds": torch.tensor(ev.cost.seconds / ev.rows,
                                                                                         dtype=torch.float64)}
            data = save({name: v.contiguous().cpu() for name, v in t.items()})
            atomic.write_with(self._path(P.as_ids(prompt)), lambda f, data=data: f.write(data))


# ----------------------------------------------------------------------------- several paths


def cache_paths(
    model: PreTrainedModel,
    compressor: SSMCompressor,
    *,
    control: SSMCompressor | None = None,
    n_window: int | None = None,
    also: dict[str, SSMCompressor] | None = None,
) -> dict[str, CacheBuilder]:
    """The cache builders ``icl-ssm fidelity`` compares: ``dense`` (the teacher's own K/V),
    ``compressed``, ``control`` (when given), ``window`` (the compressor's sinks + the last
    ``n_window`` prompt tokens, default its ``num_virtual + num_recent``: the same cache size,
    same position convention) and one path per compressor in ``also`` (other compressors
    compared on the same subsets and queries, e.g. the variants of an ablation)."""
    c = compressor.config
    clash = sorted(set(also or ()) & {"dense", "compressed", "control", "window"})
    if clash:
        raise ValueError(f"also: the names {clash} are taken by the built-in paths; choose other names")
    n_window = c.num_virtual + c.num_recent if n_window is None else n_window
    if n_window < 0:
        raise ValueError(f"n_window={n_window}: expected >= 0 prompt tokens")
    paths: dict[str, CacheBuilder] = {
        "dense": lambda ids, mask: K.exact_cache(model, ids, mask),
        "compressed": lambda ids, mask: K.compressed_cache(model, compressor, ids, mask),
    }
    if control is not None:
        paths["control"] = lambda ids, mask: K.compressed_cache(model, control, ids, mask)
    paths["window"] = lambda ids, mask: K.window_cache(model, ids, mask, c.num_sink, n_window, c.position)
    for name, other in (also or {}).items():
        paths[name] = lambda ids, mask, other=other: K.compressed_cache(model, other, ids, mask)
    return paths


def evaluate_paths(
    model: PreTrainedModel,
    builder: P.PromptBuilder,
    prefixes: Sequence[P.PromptLike],
    queries: Sequence[T.Example],
    paths: dict[str, CacheBuilder],
    *,
    reference: str = "dense",
    loss: str = "nll",
    batch: int = 4,
    query_batch: int = 16,
    progress: Callable[[int], None] | None = None,
    store: DenseStore | None = None,
) -> dict[str, tuple[PrefixEval, LogitAgreement | None]]:
    """Every prefix (one per subset) through every cache builder, ``batch`` subsets at a time.

    Returns, per path, its :class:`PrefixEval` (without logits) and its
    :class:`LogitAgreement` with the ``reference`` path (None for the reference itself).
    Each path's ``cost`` covers building its caches and answering all queries; the logit
    comparison is not counted. ``progress(n)`` is called after each batch of ``n`` subsets.
    With a ``store``, the reference path's rows are read from it where present (their cost is
    the one stored with them) and stored where computed.
    """
    if reference not in paths:
        raise ValueError(f"reference path {reference!r} is not among the paths {', '.join(paths)}")
    if not prefixes:
        raise ValueError("no subsets: expected at least one prefix")
    if batch < 1:
        raise ValueError(f"batch={batch}; expected >= 1 subsets per batch")
    order = [reference, *(name for name in paths if name != reference)]
    pad_id = getattr(model.config.get_text_config(), "pad_token_id", None)
    pad_id = pad_id if isinstance(pad_id, int) and pad_id >= 0 else 0  # masked anyway
    device = model.device
    with torch.no_grad():  # warm-up: lazily built state (the SSM's powers) is not timed
        ids, mask = pad_right(prefixes[:1], pad_id)
        for name in order[1:] if store is not None else order:
            paths[name](ids.to(device), mask.to(device))
    evals: dict[str, list[PrefixEval]] = {name: [] for name in order}
    agreements: dict[str, list[LogitAgreement]] = {name: [] for name in order}
    for start in range(0, len(prefixes), batch):
        rows = prefixes[start : start + batch]
        ids, mask = pad_right(rows, pad_id)  # (B, T) each
        ids, mask = ids.to(device), mask.to(device)
        ref_logits = None
        for name in order:
            ev = store.get(rows) if store is not None and name == reference else None
            if ev is None:
                with torch.no_grad(), measure(device) as cost:
                    cache = paths[name](ids, mask)
                    ev = evaluate_prefixes(model, builder, cache, queries, loss=loss, query_batch=query_batch)
                ev.cost = cost
                if store is not None and name == reference:
                    store.put(rows, ev)
            if name == reference:
                ref_logits = ev.logits
            else:
                agreements[name].append(logit_agreement(ref_logits, ev.logits))
            evals[name].append(ev.without_logits())
        if progress is not None:
            progress(ids.shape[0])
    return {
        name: (PrefixEval.cat(evals[name]), LogitAgreement.cat(agreements[name]) if agreements[name] else None)
        for name in order
    }


@dataclass
class ReportSetting:
    """What a saved ``icl-ssm fidelity --json`` report evaluated, rebuilt so that other caches
    can be evaluated on the same held-out subsets and queries (``scripts/recency.py``,
    ``blocks.py``, ``tail_readout.py``). ``dense``: the report's dense subset losses ``(S,)``."""

    builder: P.PromptBuilder
    pool: list[T.Example]
    subsets: list[list[int]]
    prompts: list[P.Prompt]
    queries: list[T.Example]
    dense: np.ndarray


def report_setting(report: dict, model: PreTrainedModel, tokenizer, subsets: int | None = None) -> ReportSetting:
    """The setting of ``report`` (its first ``subsets`` held-out subsets, or all) for ``model``."""
    cfg = report["config"]
    task = T.get_task(cfg["task"])
    splits = T.split(task, seed=report["seed"])
    builder = P.PromptBuilder.for_model(model, tokenizer, task, chat=cfg["chat"])
    ids = report["per_subset"]["ids"][:subsets]
    off = report.get("query_offset", 0)
    return ReportSetting(
        builder=builder, pool=list(splits.pool), subsets=ids,
        prompts=[builder.build_prefix([splits.pool[i] for i in s]) for s in ids],
        queries=list(splits.validation[off : off + report["queries"]]),
        dense=np.array(report["per_subset"]["loss"]["dense"])[: len(ids)],
    )


def _num(value: float | Tensor) -> float | None:
    """A finite float for JSON, None for NaN (e.g. a correlation with a constant side)."""
    value = float(value)
    return value if math.isfinite(value) else None


def fidelity_report(
    dense: PrefixEval,
    other: PrefixEval,
    agreement: LogitAgreement | None = None,
    labels: Sequence[int] | None = None,
) -> dict:
    """Summary of ``other`` against ``dense`` over the same subsets and queries.

    ``agreement``: the per-pair logit comparison, if already computed (streamed); else it is
    computed from both evaluations' logits. Keys: ``rel_logit_err``, ``kl``, ``top1_agree``,
    ``label_agree`` (same predicted label; None for generative tasks), ``acc_dense``,
    ``acc_compressed``, ``subset_loss_spearman`` (with ``subset_loss_spearman_ci95``, a
    bootstrap interval over subsets, and ``subset_loss_spearman_ci95_queries``, over subsets
    and queries: the wider and more honest one), ``subset_loss_pearson`` (None when a side is
    constant over the subsets, as a control's is), ``dense_subset_loss_mean``/``_std``,
    ``dense_subset_acc_min``/``_max``, ``dense_split_half_spearman`` (see
    :func:`split_half_spearman`), ``compressed_subset_loss_mean``, ``flops_*`` and
    ``seconds_*`` (per subset: build its caches and answer all its queries). With the queries'
    gold ``labels`` (classification), also ``subset_loss_spearman_balanced`` and
    ``dense_split_half_spearman_balanced``: the same with label-balanced subset losses
    (:func:`label_weights`), which do not move with the label mix of the queries drawn.
    """
    if dense.loss.shape != other.loss.shape:
        raise ValueError(f"evaluations of shape {tuple(dense.loss.shape)} and {tuple(other.loss.shape)} "
                         "cover different subsets or queries")
    if agreement is None:
        if dense.logits is None or other.logits is None:
            raise ValueError("fidelity_report needs the logits of both evaluations, or a precomputed agreement")
        agreement = logit_agreement(dense.logits, other.logits)
    S = dense.rows
    dense_loss, other_loss = dense.subset_loss().numpy(), other.subset_loss().numpy()
    dense_acc = dense.subset_acc()
    both = bootstrap_spearman(dense.loss, {"other": other.loss})["other"] if S >= 3 else np.array([math.nan])
    balanced = (bootstrap_spearman(dense.loss, {"other": other.loss}, labels=labels)["other"]
                if S >= 3 and labels is not None else np.array([math.nan]))
    out = {
        "rel_logit_err": _num(agreement.rel_err.mean()),
        "kl": _num(agreement.kl.mean()),
        "top1_agree": _num(agreement.top1.float().mean()),
        "label_agree": _num((dense.pred == other.pred).float().mean()) if (dense.pred >= 0).all() else None,
        "acc_dense": _num(dense.correct.mean()),
        "acc_compressed": _num(other.correct.mean()),
        "subset_loss_spearman": _num(spearman(dense_loss, other_loss)),
        "subset_loss_spearman_ci95": [_num(v) for v in spearman_ci(dense_loss, other_loss)],
        "subset_loss_spearman_ci95_queries": [_num(v) for v in interval(both)],
        "subset_loss_pearson": _num(pearson(dense_loss, other_loss)),
        "dense_subset_loss_mean": _num(dense_loss.mean()),
        "dense_subset_loss_std": _num(dense_loss.std(ddof=1)) if S > 1 else None,
        "dense_subset_acc_min": _num(dense_acc.min()),
        "dense_subset_acc_max": _num(dense_acc.max()),
        "dense_split_half_spearman": _num(split_half_spearman(dense.loss)),
        "compressed_subset_loss_mean": _num(other_loss.mean()),
        "flops_dense": dense.cost.flops / S,
        "flops_compressed": other.cost.flops / S,
        "seconds_dense": dense.cost.seconds / S,
        "seconds_compressed": other.cost.seconds / S,
    }
    if labels is not None:
        w = label_weights(labels)
        out["subset_loss_spearman_balanced"] = _num(spearman(dense.loss.double().numpy() @ w,
                                                             other.loss.double().numpy() @ w))
        out["subset_loss_spearman_balanced_ci95_queries"] = [_num(v) for v in interval(balanced)]
        out["dense_split_half_spearman_balanced"] = _num(split_half_spearman(dense.loss, labels))
    return out


# keys of fidelity_report that describe the other path, and their names under a prefix
_OTHER_KEYS = {
    "rel_logit_err": "rel_logit_err", "kl": "kl", "top1_agree": "top1_agree", "label_agree": "label_agree",
    "acc_compressed": "acc", "subset_loss_spearman": "subset_loss_spearman",
    "subset_loss_spearman_ci95": "subset_loss_spearman_ci95",
    "subset_loss_spearman_ci95_queries": "subset_loss_spearman_ci95_queries",
    "subset_loss_spearman_balanced": "subset_loss_spearman_balanced",
    "subset_loss_spearman_balanced_ci95_queries": "subset_loss_spearman_balanced_ci95_queries",
    "subset_loss_pearson": "subset_loss_pearson", "compressed_subset_loss_mean": "subset_loss_mean",
    "flops_compressed": "flops", "seconds_compressed": "seconds",
}  # fmt: skip


# ----------------------------------------------------------------------------- the command


@dataclass
class FidelityConfig:
    """Everything ``icl-ssm fidelity`` was asked; saved in its report."""

    model: str = DEFAULT_MODEL
    task: str = ""
    k: int = 8
    compressor: str = ""
    control: str | None = None
    subsets: int = 30
    queries: int = 32
    query_offset: int = 0  # the queries are validation[query_offset : query_offset + queries]
    seed: int = 0
    loss: str = "nll"
    n_window: int | None = None  # default: the compressor's num_virtual + num_recent (the same cache size)
    also: dict[str, str] = field(default_factory=dict)  # name -> another compressor directory, same subsets
    batch: int = 4  # subsets per cache batch
    query_batch: int = 16  # (subset, query) pairs per forward
    reuse_dense: bool = False  # keep the dense answers in a DenseStore under the cache dir, and reuse them
    chat: bool = False
    device: str = "auto"  # "auto": the GPU when there is one

    def check(self) -> None:
        if self.subsets < 1:
            raise ValueError(f"--subsets {self.subsets}: expected at least 1 subset")
        if self.queries < 1:
            raise ValueError(f"--queries {self.queries}: expected at least 1 query")
        if self.query_offset < 0:
            raise ValueError(f"--query-offset {self.query_offset}: expected >= 0 (the first validation query used)")
        if self.loss not in LOSSES:
            raise ValueError(f"--loss {self.loss!r}; accepted: {', '.join(LOSSES)}")
        if self.n_window is not None and self.n_window < 0:
            raise ValueError(f"--n-window {self.n_window}: expected >= 0 prompt tokens")
        resolve_device(self.device)
        if self.batch < 1 or self.query_batch < 1:
            raise ValueError(f"--batch {self.batch} / --query-batch {self.query_batch}: expected >= 1")


def run_fidelity(
    config: FidelityConfig,
    *,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> dict:
    """Load what ``config`` names, evaluate every path and return the report dict.

    ``on_start(total_subsets)`` is called once the work is known, ``progress(n)`` after each
    batch of ``n`` subsets.
    """
    config.check()
    model, tokenizer = load_model(config.model, device=resolve_device(config.device))
    compressor = load_compressor(config.compressor, model.config).to(model.device)
    control = None
    if config.control is not None:
        control = load_compressor(config.control, model.config).to(model.device)
        if not control.config.control:
            raise ValueError(
                f"--control {config.control!r} is not a control compressor (its config has control=False); "
                "expected a prompt-independent compressor saved with SSMCompressorConfig(control=True)"
            )
    task = T.get_task(config.task)
    splits = T.split(task, seed=config.seed)
    end = config.query_offset + config.queries
    if end > len(splits.validation):
        raise ValueError(f"--queries {config.queries} from --query-offset {config.query_offset}: task {task.name!r} "
                         f"has only {len(splits.validation)} validation examples; ask for at most that many in all")
    queries = splits.validation[config.query_offset : end]  # the validation split is already shuffled
    rng = np.random.default_rng(config.seed)
    subsets = sample_subsets(splits.pool, config.k, config.subsets, rng)
    builder = P.PromptBuilder.for_model(model, tokenizer, task, chat=config.chat)
    prefixes = [builder.build_prefix([splits.pool[i] for i in subset]) for subset in subsets]
    also = {name: load_compressor(path, model.config).to(model.device) for name, path in config.also.items()}
    paths = cache_paths(model, compressor, control=control, n_window=config.n_window, also=also)
    if on_start is not None:
        on_start(len(prefixes))
    store = None
    if config.reuse_dense:
        from icl_ssm.assets import cache_dir

        store = DenseStore(cache_dir() / "dense", model, builder, queries, config.loss)
    results = evaluate_paths(model, builder, prefixes, queries, paths, loss=config.loss, batch=config.batch,
                             query_batch=config.query_batch, progress=progress, store=store)
    dense = results["dense"][0]
    c = compressor.config
    report: dict[str, Any] = {
        "model": config.model,
        "task": task.name,
        "k": config.k,
        "subsets": len(subsets),
        "queries": len(queries),
        "query_offset": config.query_offset,
        "seed": config.seed,
        "loss": config.loss,
        "prompt_tokens_mean": _num(dense.prompt_length.float().mean()),
        "cache_tokens": c.cache_length,
        "num_sink": c.num_sink,
        "num_virtual": c.num_virtual,
        "position": c.position,
        "n_window": c.num_virtual + c.num_recent if config.n_window is None else config.n_window,
        "compressor_control": bool(c.control),
        "dense_reused_subsets": store.reused if store is not None else 0,  # their flops/seconds are as stored
    }
    labels = [builder.label_index(q) for q in queries] if task.kind == "classification" else None
    report.update(fidelity_report(dense, *results["compressed"], labels=labels))
    for name in ("control", "window"):
        if name in results:
            sub = fidelity_report(dense, *results[name], labels=labels)
            report.update({f"{name}_{new}": sub[old] for old, new in _OTHER_KEYS.items() if old in sub})
    if also:
        report["also"] = {}
        for name, other in also.items():
            sub = fidelity_report(dense, *results[name], labels=labels)
            report["also"][name] = {"cache_tokens": other.config.cache_length,
                                    **{new: sub[old] for old, new in _OTHER_KEYS.items() if old in sub}}
    report["paired"] = paired_spearman(dense.loss, {name: ev.loss for name, (ev, _) in results.items()},
                                       labels=labels)
    # per subset (and query), so the rankings can be plotted or re-analysed without rerunning anything
    report["per_subset"] = {
        "ids": [list(map(int, subset)) for subset in subsets],
        "loss": {name: [_num(v) for v in results[name][0].subset_loss()] for name in results},
        "acc": {name: [_num(v) for v in results[name][0].subset_acc()] for name in results},
        "query_labels": labels,  # each query's gold label index (None for generative tasks)
        "query_loss": {name: [[_num(v) for v in row] for row in results[name][0].loss] for name in results},
    }
    report["config"] = asdict(config)
    return report


def paired_spearman(dense: Tensor, losses: dict[str, Tensor], *, labels: Sequence[int] | None = None,
                    resamples: int = 2000, seed: int = 0) -> dict:
    """Paired bootstrap differences of subset-loss Spearman between the paths of one run.

    ``dense``: the ``(S, Q)`` dense losses; ``losses``: every path's (``dense`` itself is
    skipped). Each trained path (``compressed`` and the ``also`` ones) is compared with the
    comparators ``control`` and ``window``, and each ``also`` path with ``compressed``.
    Returns ``{"A-B": {"diff", "ci95", "ci95_queries"}}``: the Spearman of A minus that of B,
    and bootstrap intervals of the difference over the same resampled subsets (and queries)
    for both paths, which are far narrower than comparing the two paths' own intervals. With
    ``labels``, also ``diff_balanced`` and ``ci95_balanced`` (subsets and queries resampled) on
    label-balanced subset losses.
    """
    losses = {name: x for name, x in losses.items() if name != "dense"}
    if dense.shape[0] < 3:
        return {}
    trained = [name for name in losses if name not in ("control", "window")]
    pairs = [(a, b) for a in trained for b in ("control", "window") if b in losses]
    pairs += [(a, "compressed") for a in trained if a != "compressed" and "compressed" in losses]
    rho = {name: spearman(dense.mean(1).numpy(), x.mean(1).numpy()) for name, x in losses.items()}
    out = {f"{a}-{b}": {"diff": _num(rho[a] - rho[b])} for a, b in pairs}
    runs = [("ci95", False, None), ("ci95_queries", True, None)]
    if labels is not None:
        w = label_weights(labels)
        rho = {name: spearman(dense.double().numpy() @ w, x.double().numpy() @ w) for name, x in losses.items()}
        for a, b in pairs:
            out[f"{a}-{b}"]["diff_balanced"] = _num(rho[a] - rho[b])
        runs.append(("ci95_balanced", True, labels))
    for key, queries, weigh in runs:
        draws = bootstrap_spearman(dense, losses, queries=queries, labels=weigh, resamples=resamples, seed=seed)
        for a, b in pairs:
            out[f"{a}-{b}"][key] = [_num(v) for v in interval(draws[a] - draws[b])]
    return out


def parse_also(items: Sequence[str] | None) -> dict[str, str]:
    """``--also NAME=DIR ...`` -> {NAME: DIR}."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, path = item.partition("=")
        if not (sep and name and path):
            raise ValueError(f"--also {item!r}: expected NAME=DIR (a name for the report and a compressor directory)")
        if name in out:
            raise ValueError(f"--also: the name {name!r} is given twice")
        out[name] = path
    return out


def _main(args: argparse.Namespace) -> int:
    config = FidelityConfig(
        model=args.model, task=args.task, k=args.k, compressor=args.compressor, control=args.control,
        subsets=args.subsets, queries=args.queries, query_offset=args.query_offset, seed=args.seed, loss=args.loss,
        n_window=args.n_window, also=parse_also(args.also), batch=args.batch, query_batch=args.query_batch,
        reuse_dense=args.reuse_dense, chat=args.chat, device=args.device,
    )  # fmt: skip
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    stderr = Console(stderr=True)
    with Progress(TextColumn("fidelity"), BarColumn(), MofNCompleteColumn(), TextColumn("subsets"),
                  TimeElapsedColumn(), console=stderr, transient=True) as bar:
        job = bar.add_task("subsets", total=None)

        def advance(n: int) -> None:
            bar.advance(job, n)
            if not stderr.is_terminal:  # a log file gets a line per batch instead of a live bar
                done = bar.tasks[0]
                stderr.print(f"fidelity: {int(done.completed)}/{int(done.total or 0)} subsets, "
                             f"{done.elapsed or 0:.0f} s")

        report = run_fidelity(config, on_start=lambda n: bar.update(job, total=n), progress=advance)
    report["argv"] = getattr(args, "argv", None)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    from rich.table import Table

    table = Table(title=f"{report['model']} - {report['task']} - k={report['k']} - fidelity", show_header=False)
    rows = [(k, v) for k, v in report.items() if k not in ("config", "argv", "also", "per_subset", "paired")]
    rows += [(f"{name}_{k}", v) for name, sub in report.get("also", {}).items() for k, v in sub.items()]
    rows += [(f"spearman {pair}", f"{d['diff']:+.3f} {d['ci95']} / {d['ci95_queries']}")
             for pair, d in report["paired"].items() if d["diff"] is not None]
    for key, value in rows:
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console().print(table)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fidelity",
        help="how closely a compressed cache reproduces the dense prompt on held-out subsets",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help="embedded name, hub id or local directory")
    p.add_argument("--task", required=True, help="task whose pool the subsets come from")
    p.add_argument("--k", type=int, default=8, help="demonstrations per subset")
    p.add_argument("--compressor", required=True, help="directory of a saved compressor")
    p.add_argument("--control", help="directory of a control compressor (config control=True) to report beside it")
    p.add_argument("--subsets", type=int, default=30, help="held-out demonstration subsets")
    p.add_argument("--queries", type=int, default=32, help="validation queries per subset")
    p.add_argument("--query-offset", type=int, default=0,
                   help="first validation query used: another offset gives another query set on the same subsets")
    p.add_argument("--seed", type=int, default=0, help="splits and subsets")
    p.add_argument("--loss", choices=LOSSES, default="nll",
                   help="per-query loss: gold-verbaliser NLL, or cross-entropy over the label set")
    p.add_argument("--n-window", type=int, default=None,
                   help="prompt tokens the window comparator keeps (default: the compressor's num_virtual + "
                        "num_recent, the same cache size)")
    p.add_argument("--also", nargs="+", metavar="NAME=DIR",
                   help="further compressors to evaluate on the same subsets and queries (an ablation), "
                        "reported under 'also'")
    p.add_argument("--batch", type=int, default=4, help="subsets per cache batch")
    p.add_argument("--query-batch", type=int, default=16, help="(subset, query) pairs per forward")
    p.add_argument("--reuse-dense", action="store_true",
                   help="keep the dense path's answers on disk (under $ICL_SSM_CACHE/dense, 4 bytes x vocabulary "
                        "per subset and query) and reuse those of earlier runs on the same queries and model")
    p.add_argument("--chat", action="store_true", help="format through the tokenizer's chat template")
    p.add_argument("--device", default="auto", help="'auto' (the GPU when there is one), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument("--json", action="store_true", help="print only the JSON report on stdout")
    p.set_defaults(func=_main)


__all__ = [
    "LOSSES",
    "CacheBuilder",
    "DenseStore",
    "FidelityConfig",
    "LogitAgreement",
    "PrefixEval",
    "answer_logits",
    "answer_logits_packed",
    "answer_logits_ref",
    "bootstrap_spearman",
    "cache_paths",
    "evaluate_paths",
    "evaluate_prefixes",
    "fidelity_report",
    "interval",
    "label_weights",
    "logit_agreement",
    "pad_right",
    "paired_spearman",
    "pearson",
    "queries_for_reliability",
    "rankdata",
    "sample_subsets",
    "spearman",
    "spearman_brown",
    "spearman_ci",
    "split_half_spearman",
    "stratified_halves",
    "weights_digest",
]

"""Answer logits after a prefix cache: the batched, packed and reference paths (tested equal), the
per-query losses and label scores read from them, and :func:`evaluate_prefixes`, which scores
many prefixes (subsets) against many queries."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache, forward_with_prefix
from icl_ssm.compress.packed import forward_packed
from icl_ssm.cost import Cost
from icl_ssm.data.tasks import Example
from icl_ssm.lm.batch import PromptLike, as_ids, pad_ids
from icl_ssm.lm.generation import generate_answers
from icl_ssm.lm.hf import accepts_logits_to_keep, output_cache, slot_positions, windowed_mask, with_cache
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import answer_loss

LOSSES = ("nll", "ce")  # gold-verbaliser NLL, or cross-entropy over the label set


# (input_ids (B, T), attention_mask (B, T), right-padded) -> a cache standing for each row
CacheBuilder = Callable[[Tensor, Tensor], PrefixCache]


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


def answer_scores(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prefixes: PrefixCache,
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
    ``(n, n_labels)`` float32, equal to :func:`icl_ssm.lm.scoring.score_labels` (the reference).
    """
    if len(suffixes) != len(rows):
        raise ValueError(f"{len(suffixes)} suffixes but {len(rows)} prefix rows; expected equal")
    lead = builder.answer_lead()
    rest = [ids[len(lead):] for ids in builder.label_ids()]
    device = prefixes.mask.device
    ids, mask = (t.to(device) for t in pad_ids([list(s) + lead for s in suffixes], side="left"))
    sub = prefixes.select(list(rows))
    keep = {"logits_to_keep": len(lead) + 1} if _logits_to_keep(model) else {}
    with torch.no_grad():
        out = forward_with_prefix(model, sub, ids, mask, **keep)
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
        extended = sub.extended(output_cache(out), mask)
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
        before, start = slot_positions(extended.mask, extended.positions)
        node_positions = start[:, None] + depth[None]  # (n, q): where each node's token stands in the prompt
        attention = windowed_mask(model, attention, node_positions, torch.cat([before, node_positions], dim=1))
        with torch.no_grad():
            branch = model(input_ids=torch.tensor([key[-1] for key in order], device=device)[None].expand(n, q),
                           attention_mask=attention, position_ids=extended.next_position[:, None] + depth[None],
                           use_cache=True, **with_cache(model, extended.to_dynamic()))
        node_logp = torch.log_softmax(branch.logits.float(), dim=-1)  # (n, q, V)
        for i, r in enumerate(rest):
            for j in range(1, len(r)):
                scores[:, i] += node_logp[:, nodes[tuple(r[:j])], r[j]]
    return out.logits[:, -1].float(), scores


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
    verbaliser is one token, and by :func:`answer_scores` when not); the prediction is their
    argmax and the loss is the gold verbaliser's NLL (``loss="nll"``, as
    ``answer_loss(normalize=False)``) or the cross-entropy over the label set (``"ce"``, as
    ``answer_loss(normalize=True)``). Generative: the loss is ``answer_loss`` and the metric
    is ``task.score`` of a greedy answer (slow).

    Pairs are processed ``query_batch`` at a time, so memory is that many copies of a row's
    cache; ``pack=True`` reads the answer logits with :func:`answer_logits_packed` instead (the
    pairs of a row as segments of one sequence: no copies, no padding). ``labelled=False``
    (classification): the queries have no labels; only ``scores`` and ``pred`` are read, ``loss``
    and ``correct`` are NaN. Returns a :class:`PrefixEval` (its ``cost`` is left for the caller to
    fill).
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
        gold = torch.tensor([builder.label_index(q) if labelled else 0 for q in queries])  # (Q,)
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
            losses.append(answer_loss(model, builder, sfx, examples, prefix=sub, batch_size=query_batch).cpu())
            answers = generate_answers(model, builder, sfx, prefix=sub, max_new_tokens=max_new_tokens,
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
        if not labelled:
            per_query, hits = torch.full_like(per_query, math.nan), torch.full_like(hits, math.nan)
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

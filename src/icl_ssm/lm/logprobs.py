"""Log-probabilities of continuations after contexts, with or without a prefix cache: the batched
fast path and its reference.

:func:`continuation_logprobs` is the batched fast path (padding, attention masks, explicit
position ids, rows shared between continuations of one context);
:func:`continuation_logprobs_ref` is the obviously-correct reference (one unpadded forward
per pair). Both take an optional ``prefix`` standing before the prompts, so that the
demonstrations come from a (compressed) KV cache and only the query suffix is fed: a
:class:`~icl_ssm.lm.prefix.PrefixLike` (``icl_ssm.compress.cache.PrefixCache``) or a plain
transformers ``Cache`` of batch 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from icl_ssm.lm.batch import PADDING_SIDES, PromptLike, as_ids, pad_batch
from icl_ssm.lm.hf import accepts_logits_to_keep
from icl_ssm.lm.prefix import AfterPrefix, PrefixLike, prefix_inputs, prefix_row_map

# a request: (context ids, continuation ids); a shared row: (prefix row, input ids)
_Request = tuple[list[int], list[int]]


def continuation_logprobs(
    model: PreTrainedModel,
    contexts: Sequence[PromptLike],
    continuations: Sequence[Sequence[int]],
    *,
    prefix: PrefixLike | Any = None,
    prefix_rows: Sequence[int] | None = None,
    position_offset: int | None = None,
    batch_size: int = 16,
    padding_side: str = "left",
) -> torch.Tensor:
    """Sum of log p(continuation tokens | [prefix +] context), batched: the fast path.

    Args:
        contexts: ``n`` prompts (each (ctx_len,), ctx_len >= 1).
        continuations: ``n`` token lists (each (cont_len,), cont_len >= 1).
        prefix: what stands before every context, if anything: a :class:`PrefixLike`
            (``icl_ssm.compress.cache.PrefixCache``, its rows may hold different demonstration
            subsets) or a plain transformers ``Cache`` of batch size 1 (copied, never
            modified). The contexts are then the query suffixes.
        prefix_rows: ``n`` prefix rows, one per context. Default: row 0 for a one-row
            prefix, row ``i`` for context ``i`` when the prefix has ``n`` rows.
        position_offset: for a plain ``Cache`` only: position id of the first context token
            (default: the cache length). A :class:`PrefixLike` carries ``next_position``.
        batch_size: rows per forward pass.
        padding_side: ``"left"`` or ``"right"``; the result does not depend on it.

    Returns:
        (n,) float32 log-probabilities on the model's device.

    Requests with the same context (and prefix row) share rows: a continuation is read off
    the row of a longer one when its tokens minus the last are a prefix of that row's
    (single-token verbalisers -> one row per prompt).
    """
    requests = _requests(contexts, continuations)
    rows_of = prefix_row_map(prefix, len(requests), prefix_rows)
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side={padding_side!r}; accepted: {', '.join(PADDING_SIDES)}")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}; expected a positive int")
    rows, where, requests_of_row = _shared_rows(requests, rows_of)
    device = model.device
    out = torch.zeros(len(requests), dtype=torch.float32, device=device)
    for start in range(0, len(rows), batch_size):
        batch_rows = range(start, min(start + batch_size, len(rows)))
        input_ids, mask, positions, shift = pad_batch([rows[r][1] for r in batch_rows], padding_side, model)
        gathers = _gathers(requests, where, requests_of_row, batch_rows, shift)
        keep = sorted({g[1] for g in gathers})
        column = {p: k for k, p in enumerate(keep)}
        prefixed = prefix_inputs(prefix, [rows[r][0] for r in batch_rows], position_offset, device)
        logprobs = _forward_logprobs(model, input_ids, mask, positions, prefixed, keep)  # (batch, len(keep), vocab)
        b_idx, p_idx, t_idx, r_idx = (
            torch.tensor(x, device=device)
            for x in zip(*[(b, column[p], t, i) for b, p, t, i in gathers], strict=True)
        )
        out.index_add_(0, r_idx, logprobs[b_idx, p_idx, t_idx])  # sum over tokens
    return out


def _shared_rows(
    requests: list[_Request], rows_of: list[int]
) -> tuple[list[tuple[int, list[int]]], list[tuple[int, int]], dict[int, list[int]]]:
    """The rows :func:`continuation_logprobs` feeds, shared as its docstring says, and where
    each request is read off them.

    Returns ``rows``: (prefix row, input ids) each; ``where``: per request, (its row, the
    position of its first target); and the requests read off each row.
    """
    rows: list[tuple[int, list[int]]] = []
    where: list[tuple[int, int]] = [(-1, -1)] * len(requests)
    by_context: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i in sorted(range(len(requests)), key=lambda i: -len(requests[i][1])):
        ctx, cont = requests[i]
        needed = ctx + cont[:-1]
        candidates = by_context.setdefault((rows_of[i], tuple(ctx)), [])
        row = next((r for r in candidates if rows[r][1][: len(needed)] == needed), None)
        if row is None:
            row = len(rows)
            rows.append((rows_of[i], needed))
            candidates.append(row)
        where[i] = (row, len(ctx) - 1)
    requests_of_row: dict[int, list[int]] = {}
    for i, (row, _) in enumerate(where):
        requests_of_row.setdefault(row, []).append(i)
    return rows, where, requests_of_row


def _gathers(
    requests: list[_Request],
    where: list[tuple[int, int]],
    requests_of_row: dict[int, list[int]],
    batch_rows: range,
    shift: list[int],
) -> list[tuple[int, int, int, int]]:
    """(row in batch, position in the padded row, target token, request), one per target token
    of every request read off the rows ``batch_rows``; ``shift``: where each padded row starts."""
    return [
        (b, shift[b] + where[i][1] + j, tok, i)
        for b, r in enumerate(batch_rows)
        for i in requests_of_row[r]
        for j, tok in enumerate(requests[i][1])
    ]


def continuation_logprobs_ref(
    model: PreTrainedModel,
    contexts: Sequence[PromptLike],
    continuations: Sequence[Sequence[int]],
    *,
    prefix: PrefixLike | Any = None,
    prefix_rows: Sequence[int] | None = None,
    position_offset: int | None = None,
) -> torch.Tensor:
    """Reference for :func:`continuation_logprobs`: one unpadded forward per pair, no row
    sharing, the whole continuation fed. Returns (n,) float32 on the model's device."""
    requests = _requests(contexts, continuations)
    rows_of = prefix_row_map(prefix, len(requests), prefix_rows)
    device = model.device
    out = torch.empty(len(requests), dtype=torch.float32, device=device)
    for i, (ctx, cont) in enumerate(requests):
        ids = torch.tensor([ctx + cont], device=device)  # (1, seq)
        after = prefix_inputs(prefix, [rows_of[i]], position_offset, device)
        positions = after.positions(torch.arange(ids.shape[1], device=device)[None])  # (1, seq)
        check_positions(model, int(positions.max()) + 1)
        with torch.no_grad():
            logits = model(input_ids=ids, **after.forward_kwargs(model, torch.ones_like(ids), positions)).logits
        logprobs = logits[0].float().log_softmax(-1)  # (seq, vocab)
        steps = torch.arange(len(cont), device=device)
        out[i] = logprobs[len(ctx) - 1 + steps, torch.tensor(cont, device=device)].sum()
    return out


def check_positions(model: PreTrainedModel, needed: int) -> None:
    """Raise ValueError unless the model's context (``config.max_position_embeddings``, if it
    has one) holds ``needed`` positions."""
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and needed > limit:
        raise ValueError(
            f"scoring needs {needed} positions but the model's context "
            f"(config.max_position_embeddings) is {limit}; use a shorter prompt"
        )


def _requests(contexts: Sequence[PromptLike], continuations: Sequence[Sequence[int]]) -> list[_Request]:
    if len(contexts) != len(continuations):
        raise ValueError(
            f"{len(contexts)} contexts but {len(continuations)} continuations; expected equal"
        )
    requests = []
    for i, (ctx, cont) in enumerate(zip(contexts, continuations, strict=True)):
        ctx_ids, cont_ids = as_ids(ctx), [int(t) for t in cont]
        if not ctx_ids:
            raise ValueError(f"context {i} is empty; expected at least one token")
        if not cont_ids:
            raise ValueError(f"continuation {i} is empty; expected at least one token")
        requests.append((ctx_ids, cont_ids))
    return requests


def _forward_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    after: AfterPrefix,
    keep: list[int],
) -> torch.Tensor:
    """Log-softmax of the logits at positions ``keep``: (batch, len(keep), vocab) float32.

    ``input_ids``, ``attention_mask``, ``position_ids``: (batch, seq), positions counted from
    0; ``after``: the prefix before the batch (:class:`~icl_ssm.lm.prefix.AfterPrefix`).
    """
    positions = after.positions(position_ids)  # (batch, seq)
    check_positions(model, int(positions.max()) + 1)
    kwargs = after.forward_kwargs(model, attention_mask, positions)
    keep_t = torch.tensor(keep, device=input_ids.device)
    with torch.no_grad():
        if accepts_logits_to_keep(model):
            logits = model(input_ids=input_ids, logits_to_keep=keep_t, **kwargs).logits
        else:
            logits = model(input_ids=input_ids, **kwargs).logits[:, keep_t]
    return logits.float().log_softmax(-1)  # (batch, len(keep), vocab)

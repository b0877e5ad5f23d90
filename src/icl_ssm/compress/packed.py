"""The packed query path: short suffixes read after the rows of a :class:`~icl_ssm.compress.cache.PrefixCache`,
every suffix of a row laid end to end as a segment of one sequence.

:func:`forward_packed` is the fast path; its reference is :func:`~icl_ssm.lm.prefix.forward_with_prefix`
on :meth:`~icl_ssm.compress.cache.PrefixCache.select` (each suffix after its own copy of its row's cache),
and the two are held equal in ``tests/test_architectures.py``. A segment sees the prefix and its own
earlier tokens (a block-diagonal causal mask), its position ids restart at the prefix's
``next_position``, and the outputs are read at each segment's last token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache
from icl_ssm.lm.hf import accepts_logits_to_keep, sliding_window, slot_positions, windowed_mask, with_cache


@dataclass(frozen=True)
class Packing:
    """``n`` suffixes laid out in ``B`` packed rows of ``S`` slots: ``B`` the distinct prefix rows (in
    order of first appearance), ``S`` the longest packed row's total suffix length."""

    rows: list[int]  # (B,) the prefix row each packed row reads after
    ids: Tensor  # (B, S) long: the suffixes' tokens, 0 in padding
    segment: Tensor  # (B, S) long: which suffix each slot holds; -1: padding
    offset: Tensor  # (B, S) long: a slot's index inside its segment
    keep: Tensor  # (B, S) bool: segment ends, where the outputs are read
    order: list[int]  # (n,) the suffix of each kept slot, in row-major order


def pack(suffixes: Sequence[Sequence[int]], rows: Sequence[int]) -> Packing:
    """Lay ``suffixes[i]`` (token ids, at least one each) after prefix row ``rows[i]``: the suffixes
    of one row end to end, in their order, on the CPU."""
    if len(suffixes) != len(rows):
        raise ValueError(f"{len(suffixes)} suffixes but {len(rows)} prefix rows; expected equal")
    groups: dict[int, list[int]] = {}  # prefix row -> its pairs, in order
    for i, (s, r) in enumerate(zip(suffixes, rows, strict=True)):
        if not s:
            raise ValueError(f"suffix {i} is empty; expected at least one token")
        groups.setdefault(int(r), []).append(i)
    width = max(sum(len(suffixes[i]) for i in pairs) for pairs in groups.values())
    B = len(groups)
    ids = torch.zeros((B, width), dtype=torch.long)
    segment = torch.full((B, width), -1, dtype=torch.long)
    offset = torch.zeros((B, width), dtype=torch.long)
    keep = torch.zeros((B, width), dtype=torch.bool)
    order = []
    for b, pairs in enumerate(groups.values()):
        at = 0
        for i in pairs:
            s = list(suffixes[i])
            ids[b, at : at + len(s)] = torch.tensor(s, dtype=torch.long)
            segment[b, at : at + len(s)] = i
            offset[b, at : at + len(s)] = torch.arange(len(s))
            keep[b, at + len(s) - 1] = True
            order.append(i)
            at += len(s)
    return Packing(list(groups), ids, segment, offset, keep, order)


def packed_attention(model: PreTrainedModel, sub: PrefixCache, packing: Packing) -> Tensor:
    """The additive attention mask ``(B, 1, S, L + S)`` of the packed rows after ``sub`` (the prefix
    rows ``packing.rows``, ``L`` slots): each slot sees the prefix's real slots (plus their bias)
    and its own segment up to itself; sliding-window layers also by where each slot stands."""
    device = sub.mask.device
    segment, offset = packing.segment, packing.offset
    B, width = segment.shape
    dtype = sub.keys[0].dtype
    low = torch.finfo(dtype).min
    bias = torch.zeros(sub.mask.shape, dtype=dtype, device=device) if sub.bias is None else sub.bias.to(dtype)
    seen = torch.where(sub.mask, bias, torch.full_like(bias, low))  # (B, L)
    causal = torch.arange(width)[None, :] <= torch.arange(width)[:, None]  # (S, S) j <= i
    sees = (segment[:, :, None] == segment[:, None, :]) & causal[None] & (segment[:, None, :] >= 0)  # (B, S, S)
    own = torch.zeros(sees.shape, dtype=dtype).masked_fill(~sees, low).to(device)
    attention = torch.cat([seen[:, None].expand(B, width, -1), own], dim=2)[:, None]  # (B, 1, S, L + S)
    if sliding_window(model.config) is not None:  # a segment's tokens stand after the prefix, each from its start
        before, start = slot_positions(sub.mask, sub.positions)
        at = start[:, None] + offset.to(device)  # (B, S)
        attention = windowed_mask(model, attention, at, torch.cat([before, at], dim=1))
    return attention


def forward_packed(
    model: PreTrainedModel,
    prefixes: PrefixCache,
    suffixes: Sequence[Sequence[int]],
    rows: Sequence[int],
    output_hidden_states: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The last token of every ``suffixes[i]`` read after prefix row ``rows[i]``, with every
    suffix of a row packed into one sequence (:func:`pack`).

    Batching each suffix with its own copy of its row's cache (the reference) copies a long
    prefix once per query, at every layer; here the prefix is read once per row and nothing is
    padded but the ends of shorter rows. Same result as the reference up to float rounding; the
    attention between segments is computed and masked, so the work grows with the square of a
    row's packed length (keep the suffixes a row moderate).

    Returns the logits there ``(n, V)`` float32 and, with ``output_hidden_states``, every
    layer's hidden state there ``(n, m, H)`` (the embeddings left out), else None. Gradients
    flow as the caller's grad mode allows.
    """
    packing = pack(suffixes, rows)
    device = prefixes.mask.device
    sub = prefixes.select(packing.rows)
    attention = packed_attention(model, sub, packing)
    positions = sub.next_position[:, None] + packing.offset.to(device)
    keep = packing.keep.to(device)
    extra = {"logits_to_keep": keep} if accepts_logits_to_keep(model) else {}
    out = model(input_ids=packing.ids.to(device), attention_mask=attention, position_ids=positions, use_cache=True,
                output_hidden_states=output_hidden_states, **with_cache(model, sub.to_dynamic()), **extra)
    z = out.logits if extra else out.logits[keep]  # (n, V), row-major over kept positions
    order = packing.order
    where = torch.empty(len(suffixes), dtype=torch.long, device=z.device)
    where[torch.tensor(order, device=z.device)] = torch.arange(len(order), device=z.device)
    logits = z.reshape(len(order), -1).float()[where]
    if not output_hidden_states:
        return logits, None
    hidden = torch.stack([h[keep] for h in out.hidden_states[1:]], dim=1)  # (n, m, H), row-major
    return logits, hidden[where.to(hidden.device)]

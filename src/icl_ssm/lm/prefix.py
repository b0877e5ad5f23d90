"""A forward pass after a prefix, the one place its inputs are made: what stands before the
prompts (a :class:`PrefixLike`, ``icl_ssm.compress.cache.PrefixCache``: K/V rows, slot mask, next
position, one row shared by all prompts or one per prompt; or a plain transformers ``Cache`` of
batch 1), its rows mapped onto the prompts (:func:`prefix_row_map`), and :class:`AfterPrefix`,
which turns them into the forward's cache, attention mask and position ids; and a query's forward
after a prefix cache (:func:`query_inputs`, :func:`forward_with_prefix`). Label scores, answer
losses, generation (:mod:`.logprobs`, :mod:`.generation`), the answer logits of
``icl_ssm.evaluate.answers`` and distillation's targets all read a prefix through this module."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.lm.hf import cache_batch_size, cache_length, prefix_mask_for, repeated_cache, tokens_arg, with_cache


class PrefixLike(Protocol):
    """A (compressed) demonstration prefix in front of the prompts, e.g.
    ``icl_ssm.compress.cache.PrefixCache``: per-layer K/V for ``B`` rows of ``L`` cache slots."""

    mask: torch.Tensor  # (B, L) bool: which cache slots are real
    next_position: torch.Tensor  # (B,) long: position id of the first token after the prefix

    @property
    def batch_size(self) -> int: ...

    def select(self, index: torch.Tensor | list[int]) -> PrefixLike: ...

    def to_dynamic(self) -> Any: ...  # a fresh transformers Cache holding the selected K/V


def prefix_row_map(prefix: Any, n: int, prefix_rows: Sequence[int] | None) -> list[int]:
    """Which prefix row each of ``n`` contexts follows."""
    if prefix is None:
        if prefix_rows is not None:
            raise ValueError("prefix_rows given without a prefix")
        return [0] * n
    size = _prefix_batch_size(prefix)
    if prefix_rows is None:
        if size == 1:
            return [0] * n
        if size == n:
            return list(range(n))
        raise ValueError(
            f"prefix has {size} rows for {n} prompts; expected 1 (shared) or {n} (one per "
            "prompt), or pass prefix_rows"
        )
    rows = [int(r) for r in prefix_rows]
    if len(rows) != n or any(not 0 <= r < size for r in rows):
        raise ValueError(
            f"prefix_rows must be {n} row indices in [0, {size}); got {len(rows)} rows "
            f"spanning {min(rows, default=None)}..{max(rows, default=None)}"
        )
    return rows


def _is_prefix_like(prefix: Any) -> bool:
    return all(hasattr(prefix, a) for a in ("mask", "next_position", "select", "to_dynamic"))


def _prefix_batch_size(prefix: Any) -> int:
    if _is_prefix_like(prefix):
        return int(prefix.mask.shape[0])
    size = cache_batch_size(prefix)  # a transformers Cache
    if size != 1:
        raise ValueError(
            f"a plain transformers Cache as prefix must have batch size 1, got {size}; "
            "use a PrefixLike (icl_ssm.compress.cache.PrefixCache) for one prefix per prompt"
        )
    return size


@dataclass(frozen=True)
class AfterPrefix:
    """A prefix ready for one forward pass of ``B`` rows: ``cache`` (a fresh transformers cache, or
    None without a prefix), ``mask (B, L)`` long its real slots, ``next_position (B,)`` the position
    of the first token after it, ``bias (B, L)`` an additive attention bias on its slots or None,
    ``slots (B, L)`` where each slot stands in the prompt or None (the real slots in order)."""

    cache: Any
    mask: Tensor
    next_position: Tensor
    bias: Tensor | None = None
    slots: Tensor | None = None

    def positions(self, relative: Tensor) -> Tensor:
        """``(B, q)`` positions counted from 0 after the prefix -> the model's position ids."""
        return relative + self.next_position[:, None]

    def forward_kwargs(self, model: PreTrainedModel, seen_mask: Tensor, position_ids: Tensor, *,
                       num_new: int | None = None, dtype: torch.dtype | None = None, cache: Any = None,
                       keep_cache: bool = False) -> dict:
        """``model``'s ``attention_mask``, ``position_ids``, ``use_cache`` and cache arguments for the
        tokens after the prefix: ``seen_mask (B, S)`` those read so far, the last ``num_new`` (None:
        all) this forward's; ``position_ids`` theirs (absolute, :meth:`positions`); ``cache``: the
        cache a previous step returned (None: this prefix's own); ``keep_cache``: the forward returns
        its cache even without a prefix (a generation's next step reads it)."""
        cache = self.cache if cache is None else cache
        mask = prefix_mask_for(model, self.mask, seen_mask, self.bias, num_new, dtype or model.dtype,
                               positions=self.slots)
        return {"attention_mask": mask, "position_ids": position_ids, "use_cache": keep_cache or cache is not None,
                **with_cache(model, cache)}


def prefix_inputs(
    prefix: Any, rows: Sequence[int] | None, position_offset: int | None, device: torch.device
) -> AfterPrefix:
    """``prefix`` (None, a :class:`PrefixLike` or a plain transformers Cache) for one forward over
    the prefix rows ``rows`` (one per sequence; None: a :class:`PrefixLike`'s rows as they are).
    ``position_offset``: where the tokens after a plain Cache start (None: its length).
    A plain transformers Cache is copied and repeated per row through :mod:`icl_ssm.lm.hf`.
    """
    if rows is None and not _is_prefix_like(prefix):
        raise ValueError("rows=None needs a PrefixLike prefix (its rows as they are)")
    n = 0 if rows is None else len(rows)
    if prefix is None:
        start = torch.full((n,), position_offset or 0, dtype=torch.long, device=device)
        return AfterPrefix(None, torch.zeros(n, 0, dtype=torch.long, device=device), start)
    if _is_prefix_like(prefix):
        if position_offset is not None:
            raise ValueError(
                "position_offset applies to a plain transformers Cache; this prefix sets the "
                "positions itself (next_position)"
            )
        sub = prefix if rows is None else prefix.select(torch.tensor(list(rows), dtype=torch.long))
        return AfterPrefix(sub.to_dynamic(), sub.mask.long().to(device), sub.next_position.long().to(device),
                           _to(getattr(sub, "bias", None), device), _to(getattr(sub, "positions", None), device))
    cache = repeated_cache(prefix, n)  # a copy: forward passes append to a cache in place
    length = cache_length(cache)
    start = length if position_offset is None else position_offset
    mask = torch.ones(n, length, dtype=torch.long, device=device)
    return AfterPrefix(cache, mask, torch.full((n,), start, dtype=torch.long, device=device))


def _to(t: Tensor | None, device: torch.device) -> Tensor | None:
    return None if t is None else t.to(device)


def query_inputs(model: PreTrainedModel, prefix: PrefixLike, input_ids: Tensor,
                 attention_mask: Tensor | None = None) -> dict:
    """``model``'s kwargs to run ``input_ids: (B, q)`` (or ``(B, q, F)``) after ``prefix`` (same batch size).

    The query may be left- or right-padded: position ids count its real tokens from
    ``prefix.next_position``.
    """
    if input_ids.shape[0] != prefix.batch_size:
        raise ValueError(
            f"query batch ({input_ids.shape[0]}) must equal the prefix batch ({prefix.batch_size}); "
            "use PrefixCache.select or repeat_interleave"
        )
    qmask = (torch.ones(input_ids.shape[:2], dtype=torch.bool, device=input_ids.device) if attention_mask is None
             else attention_mask.bool())
    after = prefix_inputs(prefix, None, None, prefix.mask.device)
    positions = after.positions((qmask.long().cumsum(1) - 1).clamp(min=0))
    return {**tokens_arg(model, input_ids),
            **after.forward_kwargs(model, qmask, positions, dtype=prefix.keys[0].dtype)}


def forward_with_prefix(
    model: PreTrainedModel,
    prefix: PrefixLike,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    **kwargs,
):
    """``model(...)`` on the query ``input_ids: (B, q)`` (or ``(B, q, F)``) after ``prefix``: a
    language model's output has logits ``(B, q, vocab)``, a regression teacher's predictions ``(B, q)``."""
    return model(**query_inputs(model, prefix, input_ids, attention_mask), **kwargs)  # use_cache: query_inputs

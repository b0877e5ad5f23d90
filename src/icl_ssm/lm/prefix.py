"""What stands before the prompts when they are scored after a prefix: a :class:`PrefixLike`
(``icl_ssm.compress.cache.PrefixCache``: K/V rows, slot mask, next position; one row shared by
all prompts or one per prompt) or a plain transformers ``Cache`` of batch 1, its rows mapped
onto the prompts and turned into a forward pass's inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from icl_ssm.lm.hf import cache_batch_size, cache_length, repeated_cache


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


def prefix_inputs(
    prefix: Any, rows: Sequence[int], position_offset: int | None, device: torch.device
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(fresh cache or None, prefix attention mask (B, L) long, next position (B,) long,
    additive attention bias of the prefix slots (B, L) or None, where each slot stands in the
    prompt (B, L) long or None for the real slots in order).

    A plain transformers Cache is copied and repeated per row through :mod:`icl_ssm.lm.hf`.
    """
    n = len(rows)
    if prefix is None:
        start = torch.full((n,), position_offset or 0, dtype=torch.long, device=device)
        return None, torch.zeros(n, 0, dtype=torch.long, device=device), start, None, None
    if _is_prefix_like(prefix):
        if position_offset is not None:
            raise ValueError(
                "position_offset applies to a plain transformers Cache; this prefix sets the "
                "positions itself (next_position)"
            )
        sub = prefix.select(torch.tensor(list(rows), dtype=torch.long))
        bias, positions = getattr(sub, "bias", None), getattr(sub, "positions", None)
        return (sub.to_dynamic(), sub.mask.long().to(device), sub.next_position.long().to(device),
                None if bias is None else bias.to(device), None if positions is None else positions.to(device))
    cache = repeated_cache(prefix, n)  # a copy: forward passes append to a cache in place
    length = cache_length(cache)
    start = length if position_offset is None else position_offset
    mask = torch.ones(n, length, dtype=torch.long, device=device)
    return cache, mask, torch.full((n,), start, dtype=torch.long, device=device), None, None

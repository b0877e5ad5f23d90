"""The long-context baselines measured beside the compressor, at the same cache size.

* :func:`streaming_cache` - StreamingLLM (Xiao et al., 2024): the attention sinks and the last
  ``n_window`` tokens of the dense cache;
* :func:`lm_infinite_cache` - LM-Infinite (Han et al., 2024): the same slots after a prefill
  under its Lambda-shaped mask (:func:`lambda_mask`).

Both keep the slots :func:`~icl_ssm.compress.cache.sink_window_slots` names, as the untrained
:func:`~icl_ssm.compress.cache.window_cache` does, and answer through the same query path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache, _check_prompt, dense_cache, sink_window_slots
from icl_ssm.lm.hf import kv_from_cache, new_cache, output_cache, rerotate_keys, tokens_arg, with_cache


def streaming_cache(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    num_sink: int,
    n_window: int,
    position: str = "original",
) -> PrefixCache:
    """StreamingLLM (Xiao et al., 2024): the attention sinks and the last ``n_window`` tokens of
    the *dense* cache, whose K/V were computed with the whole prompt in view (unlike
    :func:`window_cache`, which encodes those tokens alone).

    ``position="original"``: the kept keys keep their positions and the query continues at the
    prompt's length (what evicting entries from a cache gives). ``"compressed"``: the recent keys
    are re-rotated (:func:`~icl_ssm.lm.hf.rerotate_keys`) to sit right after the sinks, and the
    query continues after the kept tokens, as StreamingLLM assigns positions within its cache.
    Rows no longer than ``num_sink + n_window`` keep their whole prompt (left-padded in the slot
    mask, as in :func:`window_cache`).
    """
    if position not in ("original", "compressed"):
        raise ValueError(f"position={position!r}; accepted: 'original', 'compressed'")
    mask = _check_prompt(input_ids, attention_mask)
    dense = dense_cache(model, input_ids, mask)
    lengths = mask.sum(1)
    index, slot = sink_window_slots(lengths, num_sink, n_window)
    keys, values = gather_slots(dense.keys, index), gather_slots(dense.values, index)
    if position == "original":
        return PrefixCache(keys, values, slot, next_position=lengths, prompt_length=lengths)
    # the recent tokens move back to just after the sinks (rows that kept everything do not move)
    L = num_sink + n_window
    shift = torch.zeros_like(index)
    shift[:, num_sink:] = -(lengths - L).clamp(min=0)[:, None]
    keys = tuple(rerotate_keys(model, k, shift) for k in keys)
    return PrefixCache(keys, values, slot, next_position=slot.sum(1), prompt_length=lengths)


def gather_slots(tensors: Sequence[Tensor], index: Tensor) -> tuple[Tensor, ...]:
    """Each ``(B, H, T, d)`` tensor at the positions ``index: (B, L)`` -> ``(B, H, L, d)``."""
    at = index[:, None, :, None]
    return tuple(t.gather(2, at.expand(-1, t.shape[1], -1, t.shape[3])) for t in tensors)


def lambda_mask(mask: Tensor, num_global: int, n_local: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """LM-Infinite's Lambda-shaped attention over right-padded prompts ``mask: (B, T)``: token
    ``i`` sees token ``j <= i`` when ``j < num_global`` or ``i - j < n_local``. The additive 4D
    mask ``(B, 1, T, T)`` that transformers passes to attention as-is."""
    T = mask.shape[1]
    i = torch.arange(T, device=mask.device)[:, None]
    j = torch.arange(T, device=mask.device)[None]
    allowed = (j <= i) & ((j < num_global) | (i - j < n_local))  # (T, T)
    allowed = allowed[None] & mask.bool()[:, None, :]  # keys must be real tokens
    allowed = allowed | torch.eye(T, dtype=torch.bool, device=mask.device)[None]  # padding rows see themselves
    low = torch.finfo(dtype).min
    return torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill(~allowed, low)[:, None]


def lm_infinite_cache(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    num_sink: int,
    n_window: int,
) -> PrefixCache:
    """LM-Infinite (Han et al., 2024) without its distance cap: the prompt is prefilled under the
    Lambda-shaped mask (:func:`lambda_mask`: the ``num_sink`` first tokens and the last
    ``n_window`` before each token), and the answer reads the sinks and the last ``n_window``
    prompt tokens at their original positions. The distance cap (positions beyond the local
    window clipped to its size) needs a relative position per query-key pair, which rotary
    attention as transformers computes it does not take; within the model's context it changes
    nothing for the local tokens and only the sinks' apparent distance for the others."""
    mask = _check_prompt(input_ids, attention_mask)
    position_ids = (mask.long().cumsum(1) - 1).clamp(min=0)
    dtype = next(model.parameters()).dtype
    out = model(**tokens_arg(model, input_ids), attention_mask=lambda_mask(mask, num_sink, n_window, dtype),
                position_ids=position_ids, use_cache=True, **with_cache(model, new_cache()))
    keys, values = kv_from_cache(output_cache(out))
    lengths = mask.sum(1)
    index, slot = sink_window_slots(lengths, num_sink, n_window)
    return PrefixCache(gather_slots(keys, index), gather_slots(values, index), slot, next_position=lengths,
                       prompt_length=lengths)

"""The prefix caches: :class:`PrefixCache` and the functions that build one from a prompt, and the
query after one is read by :func:`icl_ssm.lm.prefix.forward_with_prefix`. Built on this module:
:mod:`.baselines` (the StreamingLLM and LM-Infinite caches), :mod:`.generate` and :mod:`.packed`
(many short suffixes read after one prefix row, ``forward_with_prefix`` its reference). The
transformers Cache API itself is reached only through :mod:`icl_ssm.lm.hf`.

A :class:`PrefixCache` is what stands in front of a query: per-layer keys and values
``(B, H_kv, L, d)`` (post-RoPE, as the teacher's own cache holds them), which of the ``L``
slots are real, and the position id the query starts at. It is immutable: each forward
gets a fresh ``DynamicCache`` built from it (``DynamicCache.update`` appends in place), so one
prefix serves any number of query batches, and every row of a batch may be a different
demonstration subset.

Three ways to build one, sharing the query path:

* :func:`dense_cache` - the teacher's own K/V of the whole prompt (a dense prefill). Queries
  answered from it reproduce dense logits: the check that injection is right.
* :func:`compressed_cache` - exact K/V of the first ``num_sink`` prompt tokens (attention
  sinks) followed by the compressor's ``num_virtual`` virtual tokens (and, for a hybrid
  compressor, the last ``num_recent`` prompt tokens re-encoded on top of them).
* :func:`window_cache` - the untrained comparator of the same size: the sinks plus the
  last ``n_window`` prompt tokens, re-encoded on their own (StreamingLLM-style).

Position convention for the query (``SSMCompressorConfig.position``): ``"compressed"``
starts it at the cache length ``num_sink + num_virtual`` (the paper's code), ``"original"``
at the uncompressed prompt's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.compressor import SSMCompressor
from icl_ssm.lm.hf import (
    hidden_after_layers,
    kv_from_cache,
    new_cache,
    output_cache,
    real_positions,
    slot_positions,
    tokens_arg,
    with_cache,
)
from icl_ssm.lm.prefix import forward_with_prefix


@dataclass(frozen=True)
class PrefixCache:
    """``keys``/``values``: one ``(B, H_kv, L, d)`` tensor per layer; ``mask: (B, L)`` bool;
    ``next_position: (B,)`` long, the position id of the first token after the prefix;
    ``prompt_length: (B,)`` long, real tokens in the prompt the prefix stands for;
    ``bias: (B, L)`` float or None, added to the attention logits of every slot (a gated
    compressor's virtual tokens; 0 for real tokens); ``positions: (B, L)`` long or None, where
    each slot stands in the prompt (None: the real slots are the prompt's tokens in order), by
    which sliding-window layers decide what they see (:func:`icl_ssm.lm.hf.prefix_mask_for`)."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    mask: Tensor
    next_position: Tensor
    prompt_length: Tensor
    bias: Tensor | None = None
    positions: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def select(self, index: Tensor | list[int]) -> PrefixCache:
        """Rows ``index`` (repeats allowed): e.g. one row per (subset, query) pair."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.mask.device)
        return PrefixCache(
            keys=tuple(k.index_select(0, index) for k in self.keys),
            values=tuple(v.index_select(0, index) for v in self.values),
            mask=self.mask.index_select(0, index),
            next_position=self.next_position.index_select(0, index),
            prompt_length=self.prompt_length.index_select(0, index),
            bias=None if self.bias is None else self.bias.index_select(0, index),
            positions=None if self.positions is None else self.positions.index_select(0, index),
        )

    def repeat_interleave(self, n: int) -> PrefixCache:
        """Each row ``n`` times in a row: ``(B, ...) -> (B * n, ...)``."""
        return self.select(torch.arange(self.batch_size).repeat_interleave(n))

    def extended(self, cache: Any, mask: Tensor) -> PrefixCache:
        """This prefix followed by the tokens a forward after it has just read.

        ``cache``: that forward's cache (these ``length`` slots, then ``q`` new ones);
        ``mask: (B, q)`` its real tokens (padding slots stay masked). A gate bias stays on the
        old slots; the new ones are real tokens (bias 0). Reading a shared query once and then
        only what differs (one branch per label) rests on this.
        """
        keys, values = kv_from_cache(cache)
        mask = mask.bool().to(self.mask.device)
        if keys[0].shape[2] != self.length + mask.shape[1]:
            raise ValueError(f"the cache holds {keys[0].shape[2]} slots; expected this prefix's {self.length} "
                             f"+ {mask.shape[1]} new ones")
        bias = None if self.bias is None else torch.cat([self.bias, self.bias.new_zeros(mask.shape)], dim=1)
        positions = None
        if self.positions is not None:
            _, start = slot_positions(self.mask, self.positions)
            positions = torch.cat([self.positions, real_positions(mask, start)], dim=1)
        return PrefixCache(keys=keys, values=values, mask=torch.cat([self.mask, mask], dim=1),
                           next_position=self.next_position + mask.sum(1), prompt_length=self.prompt_length,
                           bias=bias, positions=positions)

    def to_dynamic(self) -> Any:
        """A fresh transformers ``DynamicCache`` holding these keys and values."""
        return new_cache(self.keys, self.values)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def _check_prompt(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """The bool mask ``(B, T)`` of right-padded prompts: token ids ``(B, T)``, or value tokens
    ``(B, T, F)`` for a teacher that reads vectors (its ``main_input_name`` is not ``input_ids``)."""
    if input_ids.ndim not in (2, 3) or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty (batch, T) tensor of token ids or (batch, T, F) of value "
                         f"tokens, got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        return torch.ones(input_ids.shape[:2], dtype=torch.bool, device=input_ids.device)
    if attention_mask.shape != input_ids.shape[:2]:
        raise ValueError(
            f"attention_mask must have shape {tuple(input_ids.shape[:2])} (batch, T), got {tuple(attention_mask.shape)}"
        )
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    if (lengths == 0).any():
        raise ValueError(f"prompt rows {(lengths == 0).nonzero().flatten().tolist()} are empty (no real tokens)")
    # right padding: real tokens first. Anything else is ambiguous for the sinks.
    if not torch.equal(mask, torch.arange(mask.shape[1], device=mask.device)[None] < lengths[:, None]):
        raise ValueError("prompts must be right-padded (real tokens first, then padding)")
    return mask


def teacher_forward(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    **kwargs,
):
    """Dense forward that keeps its cache; position ids count real tokens only. ``input_ids``
    goes to the model under its ``main_input_name`` (``values`` for a regression teacher)."""
    mask = _check_prompt(input_ids, None) if attention_mask is None else attention_mask.bool()
    position_ids = (mask.long().cumsum(1) - 1).clamp(min=0)
    return model(**tokens_arg(model, input_ids), attention_mask=mask.long(), position_ids=position_ids,
                 use_cache=True, **with_cache(model, new_cache()), **kwargs)


def dense_cache(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor | None = None) -> PrefixCache:
    """The teacher's own K/V of the whole (right-padded) prompt ``input_ids: (B, T)`` (or value
    tokens ``(B, T, F)``)."""
    mask = _check_prompt(input_ids, attention_mask)
    out = teacher_forward(model, input_ids, mask)
    keys, values = kv_from_cache(output_cache(out))
    lengths = mask.sum(1)
    return PrefixCache(keys, values, mask, next_position=lengths, prompt_length=lengths)



exact_cache = dense_cache  # the earlier name of dense_cache, kept for code written against it


def sink_kv(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor | None, num_sink: int):
    """Exact K/V of the first ``num_sink`` tokens of each prompt (they attend only to each
    other, so a forward over them alone is exact)."""
    mask = _check_prompt(input_ids, attention_mask)
    lengths = mask.sum(1)
    if (lengths < num_sink).any():
        short = (lengths < num_sink).nonzero().flatten().tolist()
        raise ValueError(
            f"prompt rows {short} have {lengths[short].tolist()} tokens, fewer than num_sink={num_sink}"
        )
    if num_sink == 0:
        return None
    out = teacher_forward(model, input_ids[:, :num_sink])
    return kv_from_cache(output_cache(out))


def summary_inputs(model: PreTrainedModel, compressor: SSMCompressor, input_ids: Tensor,
                   attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """What the compressor reads of right-padded prompts: the token embeddings ``(B, T, H)`` (or,
    with ``ssm_input="layer:l"``, the teacher's hidden states after its first ``l`` layers) and
    the mask ``(B, T)`` of the tokens before the ``num_recent`` exact ones (all real tokens
    when there are none)."""
    c = compressor.config
    mask = _check_prompt(input_ids, attention_mask)
    lengths = mask.sum(1)
    if c.num_recent:
        if (lengths < c.num_sink + c.num_recent).any():
            raise ValueError(
                f"prompts of {lengths.min().item()} tokens are shorter than num_sink + num_recent = "
                f"{c.num_sink} + {c.num_recent}"
            )
        # the SSM reads everything before the recent tokens
        mask = torch.arange(mask.shape[1], device=mask.device)[None] < (lengths - c.num_recent)[:, None]
    embeds = model.get_input_embeddings()(input_ids)
    layer = c.input_layer
    if layer:  # causal: the states before the recent tokens are those of the prompt without them
        embeds = hidden_after_layers(model, embeds, _check_prompt(input_ids, attention_mask), layer)
    return embeds, mask


def summary_states(model: PreTrainedModel, compressor: SSMCompressor, input_ids: Tensor,
                   attention_mask: Tensor | None = None) -> Tensor:
    """The compressor's SSM final states ``(B, G, N)`` of right-padded prompts: what its head
    turns into virtual tokens (probes read them directly)."""
    embeds, mask = summary_inputs(model, compressor, input_ids, attention_mask)
    return compressor.states(embeds.to(compressor.dtype), mask)


def compressed_cache(
    model: PreTrainedModel,
    compressor: SSMCompressor,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
) -> PrefixCache:
    """Sinks + virtual tokens for the prompts ``input_ids: (B, T)`` or ``(B, T, F)`` (right-padded).

    Cost: the teacher on ``num_sink`` tokens, one embedding lookup, the SSM scan and the
    head; no dense prefill.
    """
    c = compressor.config
    mask = _check_prompt(input_ids, attention_mask)
    sinks = sink_kv(model, input_ids, mask, c.num_sink)
    lengths = mask.sum(1)
    embeds, summary_mask = summary_inputs(model, compressor, input_ids, mask)
    virtual = compressor(embeds.to(compressor.dtype), summary_mask)
    dtype = embeds.dtype
    keys = [virtual.keys[l].to(dtype) for l in range(c.teacher_num_layers)]
    values = [virtual.values[l].to(dtype) for l in range(c.teacher_num_layers)]
    if sinks is not None:
        keys = [torch.cat([s, v], dim=2) for s, v in zip(sinks[0], keys)]
        values = [torch.cat([s, v], dim=2) for s, v in zip(sinks[1], values)]
    B = input_ids.shape[0]
    summary = c.num_sink + c.num_virtual
    slot_mask = torch.ones(B, summary, dtype=torch.bool, device=input_ids.device)
    # a gated compressor's virtual tokens take no positions: with its gates closed, the cache is
    # exactly the sinks (+ recent tokens) of window_cache
    taken = c.num_sink if c.gate else summary
    start = torch.full_like(lengths, taken) if c.position == "compressed" else lengths - c.num_recent
    bias = compressor.slot_bias(B).to(dtype) if c.gate else None  # (B, summary)
    # where the slots stand in the prompt (what sliding-window layers see): the sinks where they
    # were, the virtual tokens at the end of the span they summarise, the recent tokens after it
    summarised_end = (lengths - c.num_recent - 1)[:, None]  # (B, 1)
    slot_at = torch.cat([torch.arange(c.num_sink, device=lengths.device)[None].expand(B, -1),
                         summarised_end.expand(B, c.num_virtual)], dim=1)  # (B, summary)
    prefix = PrefixCache(tuple(keys), tuple(values), slot_mask, next_position=start, prompt_length=lengths,
                         bias=bias, positions=slot_at)
    if not c.num_recent:
        return prefix
    # hybrid: re-encode the last num_recent real tokens on top of sinks + virtual tokens
    cols = (lengths - c.num_recent)[:, None] + torch.arange(c.num_recent, device=input_ids.device)[None]
    recent = input_ids[torch.arange(B, device=input_ids.device)[:, None], cols]  # (B, w) or (B, w, F)
    out = forward_with_prefix(model, prefix, recent)
    keys, values = kv_from_cache(output_cache(out))
    full_mask = torch.ones(B, c.cache_length, dtype=torch.bool, device=input_ids.device)
    if bias is not None:
        bias = torch.cat([bias, bias.new_zeros(B, c.num_recent)], dim=1)
    recent_at = (lengths - c.num_recent)[:, None] + torch.arange(c.num_recent, device=lengths.device)[None]
    return PrefixCache(keys, values, full_mask, next_position=start + c.num_recent, prompt_length=lengths,
                       bias=bias, positions=torch.cat([slot_at, recent_at], dim=1))


def compress_demonstrations(model: PreTrainedModel, compressor: SSMCompressor, builder, demos) -> PrefixCache:
    """One row: the compressed cache of the prompt ``builder.build_prefix(demos)`` (the
    header and the demonstrations, as selection evaluates them)."""
    ids = torch.tensor([builder.build_prefix(list(demos)).input_ids], device=model.device)  # (1, T)
    with torch.no_grad():
        return compressed_cache(model, compressor, ids)


def window_cache(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    num_sink: int,
    n_window: int,
    position: str = "compressed",
) -> PrefixCache:
    """Sinks + the last ``n_window`` real prompt tokens, encoded on their own.

    Rows shorter than ``num_sink + n_window`` keep their whole prompt (left-padded in the
    slot mask so that every row has the same cache length).
    """
    mask = _check_prompt(input_ids, attention_mask)
    lengths = mask.sum(1)
    index, slot = sink_window_slots(lengths, num_sink, n_window)
    ids = input_ids[torch.arange(input_ids.shape[0], device=index.device)[:, None], index]  # (B, L) or (B, L, F)
    ids = ids * slot.view(*slot.shape, *[1] * (ids.ndim - 2)).to(ids.dtype)  # empty slots hold zeros
    out = teacher_forward(model, ids, slot)
    keys, values = kv_from_cache(output_cache(out))
    start = slot.sum(1) if position == "compressed" else lengths
    return PrefixCache(keys, values, slot, next_position=start, prompt_length=lengths)


def sink_window_slots(lengths: Tensor, num_sink: int, n_window: int) -> tuple[Tensor, Tensor]:
    """For prompts of ``lengths: (B,)`` tokens, the positions ``(B, num_sink + n_window)`` of the
    sinks and the last ``n_window`` tokens, and the bool mask of the slots that hold one; a
    prompt no longer than that keeps all its tokens, left-padded in the slots."""
    B, L = lengths.shape[0], num_sink + n_window
    index = torch.zeros(B, L, dtype=torch.long, device=lengths.device)
    slot = torch.zeros(B, L, dtype=torch.bool, device=lengths.device)
    for b in range(B):
        n = int(lengths[b])
        keep = list(range(n)) if n <= L else [*range(num_sink), *range(n - n_window, n)]
        index[b, L - len(keep):] = torch.tensor(keep, device=lengths.device)
        slot[b, L - len(keep):] = True
    return index, slot

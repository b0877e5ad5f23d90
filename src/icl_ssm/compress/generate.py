"""Generation after a prefix cache: ``model.generate`` from a :class:`~icl_ssm.compress.cache.PrefixCache`,
and greedy decoding where ``generate`` cannot extend the mask: a gated prefix (a 4D attention
mask) or a model with sliding-window layers (whose window ``generate`` would count in cache
slots, padding included)."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache
from icl_ssm.lm.generation import greedy_generate
from icl_ssm.lm.hf import sliding_window
from icl_ssm.lm.prefix import query_inputs


def generate_with_prefix(
    model: PreTrainedModel,
    prefix: PrefixCache,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    **generate_kwargs,
) -> Tensor:
    """``model.generate`` from ``prefix`` and a left-padded query; returns the new tokens ``(B, n)``.

    ``generate`` takes the whole sequence and skips what the cache holds, so the prefix is
    stood for by placeholder ids that are never embedded; position ids follow the prefix's
    convention.

    A gated prefix (``bias``) needs a 4D attention mask that ``model.generate`` cannot extend
    step by step, and a sliding-window model a window counted over real slots: both are decoded
    greedily by :func:`icl_ssm.lm.generation.greedy_generate` (which rebuilds the mask each step),
    and the output is padded like ``generate``'s (with ``pad_token_id``) after an
    end-of-sequence token; sampling and other generation options are refused for them.
    """
    if prefix.bias is not None or sliding_window(model.config) is not None:
        return _greedy_after_prefix(model, prefix, input_ids, attention_mask, **generate_kwargs)
    inputs = query_inputs(model, prefix, input_ids, attention_mask)
    B, L = prefix.batch_size, prefix.length
    placeholder = torch.zeros(B, L, dtype=input_ids.dtype, device=input_ids.device)
    positions = torch.cat([torch.zeros(B, L, dtype=torch.long, device=input_ids.device),
                           inputs["position_ids"]], dim=1)
    out = model.generate(
        input_ids=torch.cat([placeholder, input_ids], dim=1),
        attention_mask=inputs["attention_mask"],
        position_ids=positions,
        **{name: inputs[name] for name in ("cache", "past_key_values") if name in inputs},
        **generate_kwargs,
    )
    return out[:, L + input_ids.shape[1]:]


GATED_GENERATE_OPTIONS = ("max_new_tokens", "do_sample", "eos_token_id", "pad_token_id")


def _greedy_after_prefix(model: PreTrainedModel, prefix: PrefixCache, input_ids: Tensor,
                       attention_mask: Tensor | None, **generate_kwargs) -> Tensor:
    unsupported = sorted(set(generate_kwargs) - set(GATED_GENERATE_OPTIONS))
    if generate_kwargs.get("do_sample") or unsupported:
        raise ValueError(
            f"generate_with_prefix: a gated prefix (compressor with gate=True) or a sliding-window model is decoded "
            f"greedily; got "
            f"{'do_sample=True' if generate_kwargs.get('do_sample') else ', '.join(unsupported)}. Accepted: "
            f"{', '.join(GATED_GENERATE_OPTIONS)} (do_sample=False)"
        )
    config = model.generation_config
    eos = generate_kwargs.get("eos_token_id", config.eos_token_id)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    pad = generate_kwargs.get("pad_token_id", config.pad_token_id)
    pad = pad if pad is not None else (eos[0] if eos else 0)
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    prompts = [row[m].tolist() for row, m in zip(input_ids, mask)]
    limit = generate_kwargs.get("max_new_tokens", config.max_new_tokens or 20)
    new = greedy_generate(model, prompts, prefix=prefix, eos_token_ids=eos, max_new_tokens=limit)
    # like generate: a row that stopped early ends with its end-of-sequence token, padding follows
    rows = [seq + eos[:1] if eos and len(seq) < limit else seq for seq in new]
    width = max(map(len, rows), default=0)
    out = torch.full((len(rows), width), pad, dtype=input_ids.dtype, device=input_ids.device)
    for b, seq in enumerate(rows):
        out[b, : len(seq)] = torch.tensor(seq, dtype=input_ids.dtype)
    return out

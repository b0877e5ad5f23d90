"""The one module that touches the transformers forward and Cache API: the cache argument's name,
the returned cache, ``logits_to_keep``, the attention mask over a prefix, a ``DynamicCache`` made
from K/V (or empty), its K/V, length and batch read back, and a copy of it repeated per row. A
transformers release that renames these breaks this file alone; every other module reaches the
Cache API through these functions."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel


def prefix_attention_mask(
    prefix_mask: torch.Tensor,
    seen_mask: torch.Tensor,
    bias: torch.Tensor | None = None,
    num_new: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The ``attention_mask`` for a forward after a prefix.

    ``prefix_mask: (B, L)`` real prefix slots; ``seen_mask: (B, S)`` the tokens after the
    prefix so far, the last ``num_new`` (default: all) being this forward's inputs. Without
    ``bias`` this is the usual 2D mask ``(B, L + S)``. ``bias: (B, L)`` adds a float to the
    attention logits of every prefix slot (a gated compressed cache): the mask becomes the 4D
    additive float mask ``(B, 1, num_new, L + S)`` that transformers passes to attention as-is,
    causal over the tokens after the prefix.
    """
    if bias is None:
        return torch.cat([prefix_mask.long(), seen_mask.long()], dim=1)
    B, S = seen_mask.shape
    q = S if num_new is None else num_new
    low = torch.finfo(dtype).min
    prefix = torch.where(prefix_mask.bool(), bias.to(dtype), torch.full_like(bias, low, dtype=dtype))  # (B, L)
    rows = torch.arange(S - q, S, device=seen_mask.device)[:, None]  # (q, 1): absolute index of each new token
    allowed = (torch.arange(S, device=seen_mask.device)[None] <= rows)[None] & seen_mask.bool()[:, None]  # (B, q, S)
    after = torch.zeros(B, q, S, dtype=dtype, device=seen_mask.device).masked_fill(~allowed, low)
    return torch.cat([prefix[:, None].expand(B, q, -1), after], dim=2)[:, None]  # (B, 1, q, L + S)


def decoder_stack(model: PreTrainedModel):
    """The module that holds a model's decoder ``layers`` and final ``norm`` (``model.model`` of
    a causal LM, ``backbone`` of a regression teacher)."""
    for name in ("backbone", "model"):
        inner = getattr(model, name, None)
        if inner is not None and hasattr(inner, "layers") and hasattr(inner, "norm"):
            return inner
    raise ValueError(f"{type(model).__name__} has no decoder stack with .layers and .norm that the SSM could read "
                     "a layer of; use ssm_input='embeddings'")


def hidden_after_layers(model: PreTrainedModel, inputs_embeds: Tensor, mask: Tensor, layers: int) -> Tensor:
    """The hidden states ``(B, T, H)`` after the first ``layers`` decoder layers (before the final
    norm) of right-padded prompts ``inputs_embeds: (B, T, H)`` with ``mask: (B, T)``: the
    decoder stack run with its later layers and its norm left out, which costs ``layers / L``
    of a dense prefill."""
    inner = decoder_stack(model)
    if not 1 <= layers < len(inner.layers):
        raise ValueError(f"layers={layers}: expected 1..{len(inner.layers) - 1} of the model's {len(inner.layers)}")
    all_layers, norm = inner.layers, inner.norm
    position_ids = (mask.long().cumsum(1) - 1).clamp(min=0)
    try:
        inner.layers, inner.norm = torch.nn.ModuleList(list(all_layers)[:layers]), torch.nn.Identity()
        out = inner(inputs_embeds=inputs_embeds, attention_mask=mask.long(), position_ids=position_ids,
                    use_cache=False)
    finally:
        inner.layers, inner.norm = all_layers, norm
    return out.last_hidden_state


def rerotate_keys(model: PreTrainedModel, keys: Tensor, shift: Tensor) -> Tensor:
    """Keys ``(B, H, L, d)`` stored rotated at their positions, rotated as if each sat ``shift``
    ``(B, L)`` positions later (negative: earlier). Rotary embeddings compose, so this is the
    key computed at the new position; it rotates the halves of each head (``rotate_half``, the
    transformers convention for Llama and Qwen), not interleaved pairs. Refuses rotary
    embeddings that scale their cos/sin (whose rotations do not compose)."""
    rotary = getattr(decoder_stack(model), "rotary_emb", None)
    if rotary is None:
        raise ValueError(f"{type(model).__name__} has no rotary embedding to re-rotate keys with")
    if getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise ValueError("the rotary embedding scales cos/sin (attention_scaling != 1): rotations do not compose")
    cos, sin = rotary(keys, position_ids=shift.long())  # (B, L, d)
    cos, sin = cos[:, None].to(keys.dtype), sin[:, None].to(keys.dtype)
    half = keys.shape[-1] // 2
    rotated = torch.cat([-keys[..., half:], keys[..., :half]], dim=-1)
    return keys * cos + rotated * sin


_LOGITS_TO_KEEP: dict[type, bool] = {}


def accepts_logits_to_keep(model: PreTrainedModel) -> bool:
    cls = type(model)
    if cls not in _LOGITS_TO_KEEP:
        _LOGITS_TO_KEEP[cls] = "logits_to_keep" in inspect.signature(model.forward).parameters
    return _LOGITS_TO_KEEP[cls]


_CACHE_ARGUMENT: dict[type, str] = {}


def with_cache(model: PreTrainedModel, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model(...)`` and ``model.generate(...)``: transformers 5.24 renamed
    the forward's ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40), so the
    name is read from the model's signature once per class."""
    cls = type(model)
    if cls not in _CACHE_ARGUMENT:
        params = inspect.signature(model.forward).parameters
        _CACHE_ARGUMENT[cls] = "cache" if "cache" in params else "past_key_values"
    return {_CACHE_ARGUMENT[cls]: cache}


def output_cache(out: Any) -> Any:
    """The cache a forward returned, under the name of the installed transformers."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def kv_from_cache(cache: DynamicCache) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Per layer, the cache's keys and values ``(B, H_kv, L, d)``."""
    return tuple(layer.keys for layer in cache.layers), tuple(layer.values for layer in cache.layers)


def new_cache(keys: Sequence[Tensor] = (), values: Sequence[Tensor] = ()) -> DynamicCache:
    """A fresh ``DynamicCache``: empty, or holding per layer ``keys[i], values[i]``
    ``(B, H_kv, L, d)`` (a forward appends to it in place, so each forward gets its own)."""
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} layers of keys but {len(values)} of values")
    return DynamicCache(ddp_cache_data=list(zip(keys, values))) if keys else DynamicCache()


def cache_length(cache: Any) -> int:
    """How many positions a transformers cache holds."""
    return int(cache.get_seq_length())


def cache_batch_size(cache: Any) -> int:
    """How many rows a transformers cache holds."""
    size = getattr(cache, "batch_size", None)
    return size if isinstance(size, int) and size > 0 else int(cache.layers[0].keys.shape[0])


def repeated_cache(cache: Any, n: int) -> Any:
    """A copy of a batch-1 transformers cache with its row repeated ``n`` times (the original
    is left as it was: a forward appends to a cache in place)."""
    out = copy.deepcopy(cache)
    if n > 1:
        out.batch_repeat_interleave(n)
    return out


def logits_to_keep_kwargs(model: PreTrainedModel, keep: int | Tensor) -> dict:
    """``logits_to_keep`` where the model accepts it, so no (B, L, vocab) logits are built."""
    return {"logits_to_keep": keep} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


# ------------------------------------------------------------------ sliding-window layers
# A sliding layer lets a token see the tokens less than ``window`` positions back (transformers'
# ``kv_idx > q_idx - window``). transformers measures that distance in cache slots, which is
# right for a dense prompt and wrong after a right-padded or compressed prefix, and a 4D mask
# passed in is used as-is, with no window at all. So every forward after a prefix builds its
# masks here, the window measured in positions of the prompt the prefix stands for: a padded
# slot counts for nothing, a compressed cache's slots stand where their tokens stood (its
# virtual tokens at the end of the span they summarise).


def sliding_window(config: Any) -> int | None:
    """The window of the model's sliding-window layers, None when it has none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    if not window or getattr(text, "use_sliding_window", True) is False:
        return None
    types = getattr(text, "layer_types", None)
    if types is not None and not any("sliding" in t for t in types):
        return None
    return int(window)


def mixed_layer_types(config: Any) -> list[str] | None:
    """``config.layer_types`` when the model mixes sliding and full layers and so takes one mask
    per layer type; None when every layer is of one kind (one 4D mask serves them all)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    return list(types) if types and len(set(types)) > 1 else None


def real_positions(mask: Tensor, start: Tensor | int = 0) -> Tensor:
    """``(B, L)`` long: each slot's index among the real slots of its row, plus ``start`` ``(B,)``
    (padded slots get their left neighbour's index; they are masked anyway)."""
    start = torch.as_tensor(start, device=mask.device).reshape(-1, 1)
    return start + (mask.long().cumsum(1) - 1).clamp(min=0)


def windowed_mask(model: PreTrainedModel, mask: Tensor, q_positions: Tensor, kv_positions: Tensor):
    """The ``attention_mask`` argument for ``model`` from a 4D additive ``mask: (B, 1, q, K)``:
    ``mask`` itself for a model without sliding layers; for one whose layers all slide, ``mask``
    with every slot at least ``window`` real positions behind the query masked; for a model that
    mixes them, ``{layer_type: mask}``. ``q_positions: (B, q)`` and ``kv_positions: (B, K)`` count
    real slots (:func:`real_positions`)."""
    window = sliding_window(model.config)
    if window is None:
        return mask
    far = (q_positions[:, :, None] - kv_positions[:, None, :]) >= window  # (B, q, K)
    sliding = mask.masked_fill(far[:, None], torch.finfo(mask.dtype).min)
    types = mixed_layer_types(model.config)
    if types is None:
        return sliding
    return {t: (sliding if "sliding" in t else mask) for t in set(types)}


def slot_positions(prefix_mask: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(positions (B, L), next (B,))``: where each prefix slot stands in the prompt it stands
    for, and the position of the first token after it. ``positions`` None: the slots are the
    prompt's real tokens in order (:func:`real_positions`)."""
    if positions is None:
        return real_positions(prefix_mask), prefix_mask.long().sum(1)
    positions = positions.to(prefix_mask.device).long()
    last = positions.masked_fill(~prefix_mask.bool(), -1).amax(1) if positions.shape[1] else positions.new_full(
        positions.shape[:1], -1)
    return positions, last + 1


def prefix_mask_for(
    model: PreTrainedModel,
    prefix_mask: Tensor,
    seen_mask: Tensor,
    bias: Tensor | None = None,
    num_new: int | None = None,
    dtype: torch.dtype = torch.float32,
    positions: Tensor | None = None,
):
    """:func:`prefix_attention_mask` for ``model``: the same mask for a model without sliding
    layers; for one with them, the 4D mask (or one per layer type) whose sliding layers see only
    what lies less than ``window`` positions back (:func:`windowed_mask`), positions taken from
    ``positions: (B, L)`` of the prefix slots (:func:`slot_positions`; None: the real slots in
    order) and counted on over the real tokens after it."""
    if sliding_window(model.config) is None:
        return prefix_attention_mask(prefix_mask, seen_mask, bias, num_new, dtype)
    if bias is None:
        bias = torch.zeros(prefix_mask.shape, dtype=dtype, device=prefix_mask.device)
    mask = prefix_attention_mask(prefix_mask, seen_mask, bias, num_new, dtype)  # (B, 1, q, L + S)
    q = seen_mask.shape[1] if num_new is None else num_new
    before, start = slot_positions(prefix_mask.bool(), positions)
    kv_positions = torch.cat([before, real_positions(seen_mask, start)], dim=1)  # (B, L + S)
    return windowed_mask(model, mask, kv_positions[:, -q:], kv_positions)


def tokens_arg(model: PreTrainedModel, tokens: Tensor) -> dict[str, Tensor]:
    """``{model.main_input_name: tokens}``: ``input_ids`` for a language model."""
    return {getattr(model, "main_input_name", "input_ids"): tokens}

"""Whether the KV compressor can serve a model, read from its config (or the model itself).

The KV compressor replaces the keys and values of a prompt prefix by a few virtual tokens, so
it needs a decoder-only model whose layers attend to the prefix through a KV cache: full
attention, or a sliding window (whose masks :mod:`icl_ssm.lm.hf` builds over real slots).
:func:`validate_supported` refuses the rest (chunked or linear-attention layers, encoder-decoder
models, stateful/recurrent models, encoders, models without an LM head).
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig, PreTrainedModel


class UnsupportedModelError(ValueError):
    """The model's architecture cannot be served by the KV-cache compressor."""


# the end of every refusal: what the compressor can serve
SERVED = ("The KV compressor needs a decoder-only causal LM whose every layer is full or sliding-window "
          "attention over a KV cache (e.g. Llama, Qwen2/3, Mistral, Gemma 2/3, SmolLM2).")
SERVED_LAYER_TYPES = ("full_attention", "sliding_attention")


def validate_supported(model_or_config: PreTrainedModel | PretrainedConfig) -> None:
    """Raise :class:`UnsupportedModelError` unless the KV compressor can serve this model.

    Accepted: decoder-only causal LMs whose every layer is full (global) or sliding-window
    attention over a KV cache. Refused, each with the reason: encoder-decoder models, encoders
    (BERT-like without ``is_decoder``), chunked / linear-attention layers (any layer type
    outside :data:`SERVED_LAYER_TYPES`), stateful (recurrent) models, and models without a
    language-model head.
    """
    is_model = isinstance(model_or_config, torch.nn.Module)
    config = model_or_config.config if is_model else model_or_config
    if not isinstance(config, PretrainedConfig):
        raise TypeError(
            f"validate_supported expects a PreTrainedModel or a PretrainedConfig, "
            f"got {type(model_or_config).__name__}"
        )
    reason = _kind_refusal(config)
    if reason is None:
        text = config.get_text_config()
        reason = _layers_refusal(text) or _cache_refusal(model_or_config, config, text)
    if reason is not None:
        model_type = getattr(config, "model_type", "") or ""
        raise UnsupportedModelError(f"model type {model_type!r} is not supported: {reason}. {SERVED}")


def _kind_refusal(config: PretrainedConfig) -> str | None:
    """Why the model is not a decoder-only causal LM (encoder-decoder, no causal-LM class, a
    bidirectional encoder), or None."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", "") or ""
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model (config.is_encoder_decoder=True)"
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "it is not a causal language model (no AutoModelForCausalLM class)"
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        return "it is a bidirectional encoder (config.is_decoder is not set)"
    return None


def _layers_refusal(text: PretrainedConfig) -> str | None:
    """Why the layers of the text config ``text`` are not all full or sliding-window attention
    over a KV cache (another layer type, sliding layers without a window, chunked attention), or None."""
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        other = sorted({t for t in layer_types if t not in SERVED_LAYER_TYPES})
        if other:
            positions = [i for i, t in enumerate(layer_types) if t not in SERVED_LAYER_TYPES]
            shown = ", ".join(map(str, positions[:8])) + (", ..." if len(positions) > 8 else "")
            return (
                f"{len(positions)} of {len(layer_types)} layers ({shown}) have attention type "
                f"{other} (config.layer_types); "
                f"served: {', '.join(repr(t) for t in SERVED_LAYER_TYPES)}"
            )
        if "sliding_attention" in layer_types and not getattr(text, "sliding_window", None):
            return "config.layer_types has sliding layers but config.sliding_window is not set"
    for attr in ("attention_chunk_size", "chunk_size_feed_forward_attention"):
        if getattr(text, attr, None):
            return f"it uses chunked attention (config.{attr}={getattr(text, attr)})"
    return None


def _cache_refusal(
    model_or_config: PreTrainedModel | PretrainedConfig, config: PretrainedConfig, text: PretrainedConfig
) -> str | None:
    """Why the model has no standard KV cache (a stateful model, no ``use_cache``) or, for a
    model, no language-model head; else None."""
    is_model = isinstance(model_or_config, torch.nn.Module)
    cls = type(model_or_config) if is_model else _causal_lm_class(config)
    if cls is not None and getattr(cls, "_is_stateful", False):
        return "it is a stateful (recurrent) model without a standard KV cache"
    if not hasattr(text, "use_cache"):
        return "it has no KV cache (its config has no use_cache)"
    if is_model and (
        not hasattr(model_or_config, "get_output_embeddings") or model_or_config.get_output_embeddings() is None
    ):
        return f"{type(model_or_config).__name__} has no language-model head; load it with AutoModelForCausalLM"
    return None


def _causal_lm_class(config: PretrainedConfig) -> type | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (KeyError, ImportError, ValueError):
        return None

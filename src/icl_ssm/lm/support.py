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
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    is_model = isinstance(model_or_config, torch.nn.Module)
    config = model_or_config.config if is_model else model_or_config
    if not isinstance(config, PretrainedConfig):
        raise TypeError(
            f"validate_supported expects a PreTrainedModel or a PretrainedConfig, "
            f"got {type(model_or_config).__name__}"
        )
    model_type = getattr(config, "model_type", "") or ""
    what = f"model type {model_type!r}"

    def refuse(reason: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{what} is not supported: {reason}. {SERVED}")

    if getattr(config, "is_encoder_decoder", False):
        raise refuse("it is an encoder-decoder model (config.is_encoder_decoder=True)")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise refuse("it is not a causal language model (no AutoModelForCausalLM class)")
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        raise refuse("it is a bidirectional encoder (config.is_decoder is not set)")

    text = config.get_text_config()
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        other = sorted({t for t in layer_types if t not in SERVED_LAYER_TYPES})
        if other:
            positions = [i for i, t in enumerate(layer_types) if t not in SERVED_LAYER_TYPES]
            shown = ", ".join(map(str, positions[:8])) + (", ..." if len(positions) > 8 else "")
            raise refuse(
                f"{len(positions)} of {len(layer_types)} layers ({shown}) have attention type "
                f"{other} (config.layer_types); "
                f"served: {', '.join(repr(t) for t in SERVED_LAYER_TYPES)}"
            )
        if "sliding_attention" in layer_types and not getattr(text, "sliding_window", None):
            raise refuse("config.layer_types has sliding layers but config.sliding_window is not set")
    for attr in ("attention_chunk_size", "chunk_size_feed_forward_attention"):
        if getattr(text, attr, None):
            raise refuse(f"it uses chunked attention (config.{attr}={getattr(text, attr)})")

    cls = type(model_or_config) if is_model else _causal_lm_class(config)
    if cls is not None and getattr(cls, "_is_stateful", False):
        raise refuse("it is a stateful (recurrent) model without a standard KV cache")
    if not hasattr(text, "use_cache"):
        raise refuse("it has no KV cache (its config has no use_cache)")
    if is_model:
        if not hasattr(model_or_config, "get_output_embeddings") or (
            model_or_config.get_output_embeddings() is None
        ):
            raise refuse(
                f"{type(model_or_config).__name__} has no language-model head; "
                "load it with AutoModelForCausalLM"
            )


def _causal_lm_class(config: PretrainedConfig) -> type | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (KeyError, ImportError, ValueError):
        return None

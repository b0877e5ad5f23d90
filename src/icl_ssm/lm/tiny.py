"""Tiny random models and tokenizers built from a config, no download: the teachers of the unit
tests (``tiny-llama``, ``tiny-qwen2``)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Phi3Config,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

TINY_CORPUS = (
    "the movie was great and I loved every minute of it",
    "a great film with a great cast , great fun",
    "the plot was terrible and the acting was terrible too",
    "a terrible , boring film that I hated",
    "it was fine , not great and not terrible",
    "Review: the movie was great\nSentiment: positive",
    "Review: the film was terrible\nSentiment: negative",
    "Review: it was fine\nSentiment: neutral",
    "Classify the sentiment of each review.",
    "Answer the question.",
    "Question: what is two plus two\nAnswer: four",
    "Question: what is the capital of France\nAnswer: Paris",
    "Input: the food was good\nOutput: yes",
    "Input: the service was bad\nOutput: no",
    "\n\n",
)


TINY_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")


# SmolLM2-like: a default system turn when the conversation does not start with one
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|system|>\\nYou are a tiny model.<|end|>\\n' }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


TINY_CONFIGS: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "llama": (
        LlamaConfig,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        ),
    ),
    "qwen2": (
        Qwen2Config,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=512,
        ),
    ),
    # the architecture matrix: each shape's own twist, at the same tiny size
    "qwen3": (  # q/k norms
        Qwen3Config,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=512,
        ),
    ),
    "mistral": (  # every layer slides (a window shorter than the tests' prompts)
        MistralConfig,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=512, sliding_window=12,
        ),
    ),
    "phi3": (  # fused qkv and gate/up projections
        Phi3Config,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, original_max_position_embeddings=512,
        ),
    ),
    "gemma2": (  # sliding and full layers alternating, logit soft-capping
        Gemma2Config,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=512, sliding_window=12, query_pre_attn_scalar=16,
        ),
    ),
    "gemma3": (  # five sliding layers to one full, a local rope base of its own
        Gemma3TextConfig,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=512, sliding_window=12, query_pre_attn_scalar=16,
        ),
    ),
    "olmo2": (  # norms after attention and MLP, q/k norms over the heads
        Olmo2Config,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512,
        ),
    ),
    "granite": (  # embedding, residual, attention and logit multipliers
        GraniteConfig,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, embedding_multiplier=2.0, residual_multiplier=0.5,
            attention_multiplier=0.25, logits_scaling=4.0,
        ),
    ),
    "llama3-rope": (  # Llama 3.1's frequency-scaled rotary embedding
        LlamaConfig,
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=64),
        ),
    ),
}  # fmt: skip

# the architectures whose layers (some or all) attend through a sliding window
SLIDING_TINY = ("mistral", "gemma2", "gemma3")


def tiny_tokenizer(*, vocab_size: int = 400, add_bos: bool = True) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained in-process on :data:`TINY_CORPUS` (no download).

    Like GPT-2/Llama-3 tokenizers, a leading space is part of the word (``" great"`` is one
    token, ``"great"`` another) and ``"\\n\\n"`` can merge. Specials: ``<s>`` (bos, prepended
    when ``add_bos``), ``</s>`` (eos), ``<pad>``, ``<unk>`` and chat markers used by
    :data:`TINY_CHAT_TEMPLATE`. Training is deterministic.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(TINY_CORPUS * 4, trainer)
    if add_bos:
        bos_id = backend.token_to_id("<s>")
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        chat_template=TINY_CHAT_TEMPLATE,
        model_max_length=512,
    )


def tiny_config(arch: str = "llama", **overrides: Any) -> PretrainedConfig:
    """Config of a tiny model (``arch`` in :data:`TINY_CONFIGS`), vocabulary of the tiny tokenizer.

    ``overrides`` replace any config field (``num_hidden_layers=4``, ``head_dim=8``, ...).
    """
    if arch not in TINY_CONFIGS:
        raise ValueError(f"tiny arch {arch!r} is not known; accepted: {', '.join(TINY_CONFIGS)}")
    cls, defaults = TINY_CONFIGS[arch]
    tok = tiny_tokenizer()
    kwargs: dict[str, Any] = dict(
        defaults,
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    return cls(**kwargs)


def tiny_model(arch: str = "llama", *, seed: int = 0, **overrides: Any) -> PreTrainedModel:
    """A tiny randomly initialised causal LM (eval mode, float32), same weights for a seed.

    The global RNG is left untouched: initialisation runs inside ``torch.random.fork_rng``.
    """
    config = tiny_config(arch, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()

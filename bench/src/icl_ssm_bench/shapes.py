"""Random-weight models of published shapes, and synthetic prompts of a task's typical length:
what ``icl-ssm bench scale`` and ``bench answer --shape`` measure cost on, never quality.

Each named shape in :data:`SHAPES` is a model built from its published config (layers, hidden
size, heads, KV heads, head_dim, vocabulary), first on the meta device and then given memory on
the target device with ``to_empty`` and the model's own seeded initialisation: no weights are
downloaded. Beside it, the compressors measured at that shape (:func:`compressor_shapes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.data.tasks import Example, Task
from icl_ssm.distill.config import DistillConfig

GiB = 1024**3



@dataclass(frozen=True)
class Shape:
    """A model's published shape: its ``model_type`` and config fields, the parameter count its
    model card gives, and where the config was read."""

    model_type: str
    config: dict[str, Any]
    published_params: float | None  # None: a test shape of no published model
    source: str


SHAPES: dict[str, Shape] = {
    "smollm2-135m": Shape("llama", dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
    ), 135e6, "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "qwen2.5-0.5b": Shape("qwen2", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
    ), 0.49e9, "Qwen/Qwen2.5-0.5B-Instruct"),
    "qwen2.5-1.5b": Shape("qwen2", dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
    ), 1.54e9, "Qwen/Qwen2.5-1.5B-Instruct"),
    "qwen2.5-3b": Shape("qwen2", dict(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
    ), 3.09e9, "Qwen/Qwen2.5-3B-Instruct"),
    "qwen2.5-7b": Shape("qwen2", dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=False,
    ), 7.61e9, "Qwen/Qwen2.5-7B-Instruct"),
    "llama-3.1-8b": Shape("llama", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
    ), 8.03e9, "meta-llama/Llama-3.1-8B-Instruct"),
    # five sliding-window layers (512 tokens) to one full layer
    "gemma-3-1b": Shape("gemma3_text", dict(
        hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
        head_dim=256, vocab_size=262144, max_position_embeddings=32768, sliding_window=512, query_pre_attn_scalar=256,
        rope_theta=1e6, rope_local_base_freq=10000.0, tie_word_embeddings=True,
    ), 1.0e9, "google/gemma-3-1b-it"),
    # test shapes: the command end to end in seconds
    "tiny-qwen2": Shape("qwen2", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=2048, max_position_embeddings=1024, tie_word_embeddings=True,
    ), None, "test shape"),
    "tiny-gemma3": Shape("gemma3_text", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=2048, max_position_embeddings=1024, sliding_window=48, query_pre_attn_scalar=16,
        tie_word_embeddings=True,
    ), None, "test shape"),
}  # fmt: skip

PAPER_SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "llama-3.1-8b", "gemma-3-1b")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RANDOM_WEIGHTS = "Weights are random (the published shapes, no checkpoint): the figures are cost, not quality."


def shape_config(name: str) -> PretrainedConfig:
    """The config of shape ``name`` (:data:`SHAPES`)."""
    if name not in SHAPES:
        raise ValueError(f"shape {name!r} is not known; accepted: {', '.join(SHAPES)}")
    shape = SHAPES[name]
    return AutoConfig.for_model(shape.model_type, **shape.config)


def meta_model(config: PretrainedConfig) -> PreTrainedModel:
    """The model of ``config`` on the meta device: its parameters have shapes and no memory."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def build_model(config: PretrainedConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                seed: int = 0) -> PreTrainedModel:
    """The model of ``config`` with random weights on ``device``: built on the meta device, given
    memory there by ``to_empty`` and initialised by the model's own ``init_weights`` (normal
    weights, unit norms, the rotary tables) under ``seed``; eval mode, no gradients."""
    device = torch.device(device)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.to_empty(device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model.init_weights()  # on meta it was skipped; the non-persistent buffers (rotary tables) too
    return model.eval().requires_grad_(False)


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def window_of(config: PretrainedConfig) -> int | None:
    """The window of the model's sliding-window layers; None when every layer attends to all."""
    text = config.get_text_config()
    types = getattr(text, "layer_types", None) or ()
    window = getattr(text, "sliding_window", None)
    return int(window) if window and any("sliding" in t for t in types) else None


def compressor_shapes(config: PretrainedConfig) -> dict[str, dict]:
    """The compressors measured beside a model: ``recipe`` (the measured recipe's shape),
    ``paper`` (the paper's: 16 virtual tokens, 4 sinks, no exact recent tokens) and, for a model
    with sliding layers, ``window`` (the recipe with ``max(num_recent, window)`` exact recent
    tokens: a sliding layer reads its last ``window`` tokens exactly)."""
    recipe = DistillConfig().compressor_overrides()
    out = {"recipe": recipe, "paper": DistillConfig.recipe("paper").compressor_overrides()}
    window = window_of(config)
    if window is not None:
        out["window"] = {**recipe, "num_recent": max(recipe["num_recent"], window)}
    return out


def build_compressor(config: PretrainedConfig, overrides: dict, device: torch.device | str = "cpu",
                     seed: int = 0) -> SSMCompressor:
    """A randomly initialised compressor (float32) of shape ``overrides`` for a model of ``config``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        compressor = SSMCompressor(SSMCompressorConfig.for_teacher(config, **overrides))
    return compressor.to(device).eval()


# ---------------------------------------------------------------- synthetic prompts

@dataclass(frozen=True)
class SyntheticPrompts:
    """Demonstrations and queries of random word tokens, the lengths of Rotten Tomatoes' with its
    template under SmolLM2's tokenizer (``bench select-cost``: 1,676 prompt tokens at k = 50):
    ``demo_tokens`` per demonstration (``Review: ... Sentiment: positive``), ``query_tokens`` per
    query (``Review: ... Sentiment:``), a 7-word instruction and BOS before them."""

    demo_tokens: int = 34
    query_tokens: int = 30
    words: int = 1000  # token ids below every shape's vocabulary

    def __post_init__(self):
        if self.demo_tokens < 6 or self.query_tokens < 5:
            raise ValueError(f"demo_tokens={self.demo_tokens}, query_tokens={self.query_tokens}: a demonstration "
                             "needs >= 6 tokens (its template has 5), a query >= 5 (its template has 4)")

    def header_tokens(self) -> int:
        return 1 + len(SyntheticReviews.instruction.replace(".", " .").split())

    def prompt_tokens(self, k: int) -> int:
        return self.header_tokens() + k * self.demo_tokens

    def max_k(self, context: int) -> int:
        """The most demonstrations whose prompt and one query fit ``context`` tokens."""
        return (context - self.header_tokens() - self.query_tokens) // self.demo_tokens

    def examples(self, n: int, tokens: int, rng: np.random.Generator, prefix: str) -> list[Example]:
        """``n`` examples whose demonstration (``tokens = demo_tokens``) or query
        (``tokens = query_tokens``) piece has exactly ``tokens`` tokens."""
        words = tokens - (5 if tokens == self.demo_tokens else 4)
        labels = SyntheticReviews.labels
        return [Example(f"{prefix}-{i}", " ".join(f"w{w}" for w in rng.integers(self.words, size=words)),
                        labels[int(rng.integers(len(labels)))]) for i in range(n)]

    def tokenizer(self):
        """A word-level tokenizer of the template's words and ``w0 .. w{words-1}``, BOS prepended."""
        from tokenizers import Tokenizer, models, pre_tokenizers, processors
        from transformers import PreTrainedTokenizerFast

        t = SyntheticReviews
        template = {w for text in (t.instruction, t.input_prefix, t.output_prefix, *t.labels)
                    for w in text.replace(".", " .").replace(":", " :").split()}
        names = ["<pad>", "<s>", "</s>", "<unk>", *sorted(template), *(f"w{i}" for i in range(self.words))]
        vocab = {name: i for i, name in enumerate(names)}
        backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
        return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                       unk_token="<unk>")


class SyntheticReviews(Task):
    """Rotten Tomatoes' template over synthetic reviews (no data: :class:`SyntheticPrompts` draws them)."""

    name = "synthetic-reviews"
    labels = ("negative", "positive")
    verbalizers = {"negative": "negative", "positive": "positive"}
    instruction = "Classify the sentiment of each review."
    input_prefix = "Review: "
    output_prefix = "Sentiment: "

    def load(self) -> list[Example]:
        return []

"""``icl-ssm bench scale``: what selection costs at the paper's model sizes, on random weights.

Each named shape in :data:`SHAPES` is a model built from its published config (layers, hidden
size, heads, KV heads, head_dim, vocabulary), first on the meta device and then given memory on
the target device with ``to_empty`` and the model's own seeded initialisation: no weights are
downloaded, and the figures are cost, never quality. Beside it, the compressor of the measured
recipe (:class:`~icl_ssm.distill.config.DistillConfig`'s defaults) and the paper's (16 virtual
tokens and 4 sinks, no exact recent tokens), and on a shape with sliding-window layers a third:
the recipe with the last ``window`` prompt tokens kept exact, which a sliding layer needs.

Per ``k`` and per evaluated subset, with demonstrations and queries of synthetic tokens of
Rotten Tomatoes' typical length (:class:`SyntheticPrompts`): FLOPs (counted), wall seconds and
peak memory of the subset evaluators of ``bench select-cost``
(:func:`icl_ssm.bench.select_cost.evaluator_rows`), the cache build alone, and one distillation
step (stage 2, forward and backward). Beside the measurements, FLOPs projected from the shape
(:func:`projected_flops`), which also stand in for a shape that cannot be measured here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from icl_ssm.bench.select_cost import compare, evaluator_rows
from icl_ssm.bench.selection import log
from icl_ssm.compress.cache import PrefixCache, compressed_cache, exact_cache, teacher_forward
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, head_dim, kv_heads
from icl_ssm.cost import flop_counter, measure, peak_rss, rss_bytes, rss_peak, track_freed_memory
from icl_ssm.data.tasks import Example, Task
from icl_ssm.distill.config import DistillConfig
from icl_ssm.distill.train import group_losses
from icl_ssm.evaluate.answers import pad_right
from icl_ssm.lm.hf import kv_from_cache, output_cache
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.evaluators import CacheEvaluator, PerQueryDenseEvaluator, SubsetEvaluator
from icl_ssm.select.sampling import balanced_subsets

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
        return 1 + len(_Reviews.instruction.replace(".", " .").split())

    def prompt_tokens(self, k: int) -> int:
        return self.header_tokens() + k * self.demo_tokens

    def max_k(self, context: int) -> int:
        """The most demonstrations whose prompt and one query fit ``context`` tokens."""
        return (context - self.header_tokens() - self.query_tokens) // self.demo_tokens

    def examples(self, n: int, tokens: int, rng: np.random.Generator, prefix: str) -> list[Example]:
        """``n`` examples whose demonstration (``tokens = demo_tokens``) or query
        (``tokens = query_tokens``) piece has exactly ``tokens`` tokens."""
        words = tokens - (5 if tokens == self.demo_tokens else 4)
        labels = _Reviews.labels
        return [Example(f"{prefix}-{i}", " ".join(f"w{w}" for w in rng.integers(self.words, size=words)),
                        labels[int(rng.integers(len(labels)))]) for i in range(n)]

    def tokenizer(self):
        """A word-level tokenizer of the template's words and ``w0 .. w{words-1}``, BOS prepended."""
        from tokenizers import Tokenizer, models, pre_tokenizers, processors
        from transformers import PreTrainedTokenizerFast

        template = {w for text in (_Reviews.instruction, _Reviews.input_prefix, _Reviews.output_prefix,
                                   *_Reviews.labels) for w in text.replace(".", " .").replace(":", " :").split()}
        names = ["<pad>", "<s>", "</s>", "<unk>", *sorted(template), *(f"w{i}" for i in range(self.words))]
        vocab = {name: i for i, name in enumerate(names)}
        backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
        return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                       unk_token="<unk>")


class _Reviews(Task):
    """Rotten Tomatoes' template over synthetic reviews (no data: :class:`SyntheticPrompts` draws them)."""

    name = "synthetic-reviews"
    labels = ("negative", "positive")
    verbalizers = {"negative": "negative", "positive": "positive"}
    instruction = "Classify the sentiment of each review."
    input_prefix = "Review: "
    output_prefix = "Sentiment: "

    def load(self) -> list[Example]:
        return []


# ---------------------------------------------------------------- FLOPs projected from the shape

@dataclass(frozen=True)
class Projection:
    """What :func:`projected_flops` reads of a model: ``linear``, the FLOPs of its decoder layers'
    linear maps per token (2 per weight); ``attention``, per (query, key) pair over all layers
    (``4 * heads * head_dim`` per layer); ``head``, the LM head per position (``2 * hidden * vocab``)."""

    linear: int
    attention: int
    head: int

    @classmethod
    def of(cls, config: PretrainedConfig) -> Projection:
        model = meta_model(config)
        head = model.get_output_embeddings()
        layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
        text = config.get_text_config()
        return cls(linear=2 * sum(m.weight.numel() for m in layers),
                   attention=4 * text.num_hidden_layers * text.num_attention_heads * head_dim(text),
                   head=2 * text.hidden_size * text.vocab_size)

    def forward(self, rows: int, new: int, cache: int, logits: int) -> int:
        """A forward of ``new`` tokens in each of ``rows`` rows after ``cache`` slots, the LM head
        at ``logits`` positions a row; attention counted over every (query, key) pair, masked or
        not, as ``FlopCounterMode`` counts SDPA."""
        return rows * (new * self.linear + self.attention * new * (cache + new) + self.head * logits)


def projected_flops(p: Projection, evaluator: str, prompt: int, query: int, queries: int,
                    cache: SSMCompressorConfig | None = None, ssm: int = 0) -> int:
    """FLOPs per evaluated subset of ``evaluator`` (a name of :func:`evaluators_for`, with
    ``cache`` the compressor's config and ``ssm`` its counted FLOPs on the prompt for the
    compressed ones) for a ``prompt``-token prefix and ``queries`` queries of ``query`` tokens.

    The reference of the counted rows (the two agree on the shapes measured; a test holds them
    together), and the projection where a shape is not measured. The dense prefix computes the LM
    head at every prompt token (:func:`~icl_ssm.compress.cache.exact_cache`), the lean one at the
    last; the packed paths read a subset's queries as one row after the prefix."""
    packed = evaluator.endswith("-packed")
    after = ((1, queries * query) if packed else (queries, query))  # rows, tokens a row

    def answers(slots: int) -> int:
        return p.forward(after[0], after[1], slots, queries if packed else 1)

    if evaluator == "dense-per-query":
        return queries * p.forward(1, prompt + query, 0, 1)
    if evaluator.startswith("dense"):
        return p.forward(1, prompt, 0, 1 if "lean" in evaluator else prompt) + answers(prompt)
    if cache is None:
        raise ValueError(f"evaluator {evaluator!r} needs the compressor's config")
    s, v, r = cache.num_sink, cache.num_virtual, cache.num_recent
    build = p.forward(1, s, 0, s) + ssm + (p.forward(1, r, s + v, r) if r else 0)
    return build + answers(s + v + r)


def ssm_flops(compressor: SSMCompressor, prompt: int) -> int:
    """FLOPs of ``compressor`` (SSM and head) on one ``prompt``-token prompt, counted on random
    embeddings (the part of a compressed cache that is not the teacher's)."""
    c = compressor.config
    device = next(compressor.parameters()).device
    embeds = torch.randn(1, prompt, c.teacher_hidden_size, device=device)
    mask = torch.arange(prompt, device=device)[None] < prompt - c.num_recent
    counter = flop_counter()
    with torch.no_grad(), counter:
        compressor(embeds, mask)
    return counter.get_total_flops()


# ---------------------------------------------------------------- memory

def estimate_bytes(config: PretrainedConfig, dtype: torch.dtype, prompt: int, batch: int = 1,
                   train_tokens: int = 0) -> dict:
    """A rough upper estimate of memory: ``weights`` and ``working``, the most a case adds to
    them: the dense prefix of ``batch`` prompts of ``prompt`` tokens (its K/V at every layer, the
    LM head's logits at every prompt token, one layer's activations) or, with ``train_tokens``,
    a distillation step's activations kept for the backward pass over that many query tokens.
    Refusals read it; the measured peaks are printed beside it."""
    text = config.get_text_config()
    b = torch.finfo(dtype).bits // 8
    H, I, L, V = text.hidden_size, text.intermediate_size, text.num_hidden_layers, text.vocab_size
    kv = 2 * L * kv_heads(text) * head_dim(text)
    params = parameter_count(meta_model(config))
    prefill = batch * prompt * (kv + V + 4 * H + 3 * I) * b
    train = train_tokens * (L * (12 * H + 4 * I) * b + V * (b + 8)) + 4 * prompt * kv * b
    return {"weights": params * b, "working": int(1.25 * max(prefill, train))}


def memory_limit(device: torch.device) -> int:
    """Bytes a run may use on ``device``: free GPU memory, or the CPU's ``MemAvailable``."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: no refusal


# ---------------------------------------------------------------- the benchmark

@dataclass
class ScaleConfig:
    """One ``icl-ssm bench scale`` run. ``k`` holds demonstration counts or ``"max"``, the most
    whose prompt and one query fit the shape's context (capped at ``max_prompt_tokens``)."""

    shapes: tuple[str, ...] = ("qwen2.5-0.5b",)
    k: tuple[int | str, ...] = (20, 50)
    queries: int = 8  # validation queries per subset: `run`'s default (RunConfig.queries)
    prompts: SyntheticPrompts = field(default_factory=SyntheticPrompts)
    subsets: int = 1  # measured subsets per evaluator
    batch: int = 1  # subsets encoded together; 0: as many as the free GPU memory holds (<= subsets)
    query_batch: int = 32
    per_query_queries: int = 2  # queries the per-query evaluator is run on; its cost is scaled to `queries`
    per_query_max_k: int | None = 50
    device: str = "cpu"
    dtype: str = "float32"
    memory: bool = True  # peak memory: in process on a GPU, a child process on the CPU
    max_memory_gib: float | None = None  # refuse a shape or k beyond this (default: the free memory)
    max_prompt_tokens: int | None = None
    time_budget_s: float | None = None  # cases left when it is spent are skipped, and say so
    distill: bool = True
    project_only: bool = False  # no model built: the projected FLOPs alone
    seed: int = 0

    def __post_init__(self):
        self.shapes, self.k = tuple(self.shapes), tuple(self.k)
        for name in self.shapes:
            if name not in SHAPES:
                raise ValueError(f"--shapes {name!r}; accepted: {', '.join(SHAPES)}")
        for k in self.k:
            if k != "max" and not (isinstance(k, int) and k >= 1):
                raise ValueError(f"--k {k!r}: expected a positive integer or 'max'")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}; accepted: {', '.join(DTYPES)}")
        for name in ("queries", "subsets", "query_batch", "per_query_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.batch < 0:
            raise ValueError(f"--batch {self.batch}: expected >= 1, or 0 (as many as fit)")
        torch.device(self.device)  # a clear error for a bad device name

    def resolve_k(self, config: PretrainedConfig) -> list[int]:
        context = config.get_text_config().max_position_embeddings
        if self.max_prompt_tokens:
            context = min(context, self.max_prompt_tokens + self.prompts.query_tokens)
        top = self.prompts.max_k(context)
        out = [top if k == "max" else k for k in self.k]
        too_long = [k for k in out if k > top]
        if too_long:
            raise ValueError(f"--k {too_long}: prompts longer than the {context}-token context; at most {top} "
                             "demonstrations fit (or give 'max')")
        return list(dict.fromkeys(out))


@dataclass
class _Bench:
    """One shape, built: the model, its compressors and the synthetic data every case reads."""

    cfg: ScaleConfig
    name: str
    config: PretrainedConfig
    model: PreTrainedModel
    compressors: dict[str, SSMCompressor]
    builder: PromptBuilder
    pool: list[Example]
    validation: list[Example]

    @classmethod
    def build(cls, cfg: ScaleConfig, name: str, ks: Sequence[int]) -> _Bench:
        config = shape_config(name)
        device = torch.device(cfg.device)
        model = build_model(config, device, DTYPES[cfg.dtype], cfg.seed)
        compressors = {c: build_compressor(config, o, device, cfg.seed) for c, o in compressor_shapes(config).items()}
        rng = np.random.default_rng(cfg.seed)
        p = cfg.prompts
        pool = p.examples(max(ks) + 1, p.demo_tokens, rng, "demo")
        validation = p.examples(cfg.queries, p.query_tokens, rng, "query")
        builder = PromptBuilder.for_model(model, p.tokenizer(), _Reviews())
        return cls(cfg, name, config, model, compressors, builder, pool, validation)

    def subsets(self, k: int) -> list[list[int]]:
        # the first is never measured (evaluator_rows' warm-up place; the counted pass warms up here)
        return balanced_subsets(len(self.pool), k, self.cfg.subsets + 1, np.random.default_rng([self.cfg.seed, k]))

    def evaluators(self, k: int, batch: int) -> dict[str, SubsetEvaluator]:
        """Every evaluator measured at ``k`` (names as in ``bench select-cost``; ``paper-`` and
        ``window-`` for the other compressors, ``dense-lean`` without the LM head over the prompt).
        The dense prefix is measured on the packed query path alone (``select``'s default)."""
        m, b, qb = self.model, self.builder, self.cfg.query_batch
        out: dict[str, SubsetEvaluator] = {
            "dense-packed": CacheEvaluator(m, b, "dense", batch=batch, query_batch=qb, pack=True),
            "dense-lean-packed": CacheEvaluator(m, b, self.lean_dense, batch=batch, query_batch=qb, pack=True),
            "compressed": CacheEvaluator(m, b, "compressed", self.compressors["recipe"], batch=batch,
                                         query_batch=qb, pack=False),
        }
        for c, compressor in self.compressors.items():
            prefix = "" if c == "recipe" else f"{c}-"
            out[f"{prefix}compressed-packed"] = CacheEvaluator(m, b, "compressed", compressor, batch=batch,
                                                                query_batch=qb, pack=True)
        return out

    def per_query(self) -> PerQueryDenseEvaluator:
        return PerQueryDenseEvaluator(self.model, self.builder, batch=self.cfg.query_batch)

    def lean_dense(self, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache:
        """The dense prefix of :func:`exact_cache` without the LM head over the prompt."""
        out = teacher_forward(self.model, input_ids, attention_mask, logits_to_keep=1)
        keys, values = kv_from_cache(output_cache(out))
        lengths = attention_mask.sum(1)
        return PrefixCache(keys, values, attention_mask.bool(), next_position=lengths, prompt_length=lengths)

    def builds(self) -> dict[str, Callable[[Tensor, Tensor], PrefixCache]]:
        """The cache builds measured alone: ``(ids, mask) -> PrefixCache``."""
        out = {"dense": lambda ids, mask: exact_cache(self.model, ids, mask), "dense-lean": self.lean_dense}
        for c, compressor in self.compressors.items():
            out["compressed" if c == "recipe" else f"{c}-compressed"] = (
                lambda ids, mask, comp=compressor: compressed_cache(self.model, comp, ids, mask))
        return out

    def prompt_batch(self, k: int, batch: int) -> tuple[Tensor, Tensor]:
        """``batch`` right-padded prompts of ``k`` demonstrations, on the model's device."""
        subsets = self.subsets(k)[1:][:batch]
        ids, mask = pad_right([self.builder.build_prefix([self.pool[i] for i in s]) for s in subsets])
        return ids.to(self.model.device), mask.to(self.model.device)

    def distill_step(self, k: int) -> Callable[[], None]:
        """One stage-2 step of the recipe's compressor (forward and backward, no optimiser) on a
        group of ``DistillConfig().group_size`` prompts of ``k`` demonstrations and as many
        queries as ``DistillConfig().queries``; the teacher's targets are random tensors of the
        shapes a teacher cache stores (their values do not change the cost)."""
        dcfg = DistillConfig(k=k)
        compressor = self.compressors["recipe"]
        text = self.config.get_text_config()
        gen = torch.Generator().manual_seed(self.cfg.seed)
        rng = np.random.default_rng([self.cfg.seed, k, 1])
        p = self.cfg.prompts
        labels = torch.tensor([ids[0] for ids in self.builder.label_ids()])
        queries = p.examples(dcfg.queries, p.query_tokens, rng, "train-query")
        episodes = []
        for s in balanced_subsets(len(self.pool), k, dcfg.group_size, rng):
            Q = dcfg.queries
            gold = labels[torch.randint(len(labels), (Q,), generator=gen)]
            top = torch.randn(Q, dcfg.topk, generator=gen).log_softmax(-1).sort(dim=-1, descending=True).values
            episodes.append({
                "prompt_ids": torch.tensor(self.builder.build_prefix([self.pool[i] for i in s]).input_ids),
                "query_ids": [torch.tensor(self.builder.build_suffix(q).input_ids) for q in queries],
                "top_idx": torch.stack([torch.randperm(text.vocab_size, generator=gen)[: dcfg.topk]
                                        for _ in range(Q)]).int(),
                "top_logp": top, "gold_token": gold, "gold_logp": top[:, 0],
                "label_tokens": labels, "label_logp": top[:, : len(labels)],
                "hidden": torch.randn(Q, text.num_hidden_layers, text.hidden_size, generator=gen).half(),
            })

        def step() -> None:
            compressor.train()
            try:
                group_losses(self.model, compressor, episodes, dcfg, stage=2)["loss"].backward()
            finally:
                compressor.zero_grad(set_to_none=True)
                compressor.eval()

        return step


def _cuda_batch(bench: _Bench, k: int) -> int:
    """Subsets per forward on a GPU: as many as its free memory holds now, the model built (at
    most ``subsets``; within ``max_memory_gib`` when it is given)."""
    cfg, device = bench.cfg, bench.model.device
    free = torch.cuda.mem_get_info(device)[0]
    if cfg.max_memory_gib:
        free = min(free, int(cfg.max_memory_gib * GiB) - torch.cuda.memory_allocated(device))
    per = estimate_bytes(bench.config, DTYPES[cfg.dtype], cfg.prompts.prompt_tokens(k))["working"]
    return max(1, min(cfg.subsets, int(0.8 * free // per)))


def _case_row(k: int, case: str, n: int, counted, timed, **extra) -> dict:
    row = {"k": k, "case": case, "flops": counted.flops / n, "seconds": timed.seconds / n,
           "seconds_counting": counted.seconds / n, **extra}
    if timed.peak_bytes is not None:
        row["peak_bytes"] = timed.peak_bytes
    return row


def run_shape(cfg: ScaleConfig, name: str, say: Callable[[str], None] = log,
              deadline: float | None = None) -> dict:
    """Every measurement of one shape (see the module docstring): a dict with the shape, the
    compressors, ``rows`` (per evaluator and k), ``builds``, ``distill``, ``projected`` and
    ``skipped``; or ``refused`` with the reason, when the model cannot be served or would not fit."""
    from icl_ssm.lm.support import UnsupportedModelError, validate_supported

    config = shape_config(name)
    text = config.get_text_config()
    device = torch.device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    ks = cfg.resolve_k(config)
    out: dict[str, Any] = {"shape": name, "source": SHAPES[name].source, **_shape_fields(name, config),
                           "window": window_of(config), "k": ks, "dtype": cfg.dtype, "device": str(device)}
    out["compressors"] = {}
    for c, overrides in compressor_shapes(config).items():
        with torch.device("meta"):
            n = parameter_count(SSMCompressor(SSMCompressorConfig.for_teacher(config, **overrides)))
        out["compressors"][c] = {"overrides": overrides, "params": n, "bytes": 4 * n,
                                 "cache_slots": overrides["num_sink"] + overrides["num_virtual"]
                                 + overrides["num_recent"]}
    out["projected"] = _projections(cfg, config, ks)
    if cfg.project_only:
        return out
    try:
        validate_supported(config)
    except UnsupportedModelError as err:
        out["refused"] = f"not served: {err}"
        say(f"{name}: {out['refused']}")
        return out
    limit = int(cfg.max_memory_gib * GiB) if cfg.max_memory_gib else memory_limit(device)
    dcfg = DistillConfig()
    train = dcfg.group_size * dcfg.queries * cfg.prompts.query_tokens if cfg.distill else 0

    def need(k: int) -> dict:
        return estimate_bytes(config, dtype, cfg.prompts.prompt_tokens(k), max(cfg.batch, 1), train)

    given = "were given (--max-memory-gib)" if cfg.max_memory_gib else "are free"
    out["estimate_bytes"] = {k: need(k) for k in ks}
    least = need(min(ks))
    if least["weights"] + least["working"] > limit:
        out["refused"] = (f"would not fit: {name} in {cfg.dtype} needs about {_gib(least['weights'])} GiB of weights "
                          f"and {_gib(least['working'])} GiB more at k = {min(ks)}, and {_gib(limit)} GiB {given} on "
                          f"{device}; use a smaller k, a narrower dtype or a larger device")
        say(f"{name}: refused, {out['refused']}")
        return out
    out["refused_k"] = {k: (f"would not fit: {_gib(need(k)['weights'] + need(k)['working'])} GiB needed at k = {k}, "
                            f"{_gib(limit)} GiB {given}") for k in ks if sum(need(k).values()) > limit}
    ks = [k for k in ks if k not in out["refused_k"]]
    out["k"] = ks
    t0 = time.perf_counter()
    bench = _Bench.build(cfg, name, ks)
    out["build_seconds"] = time.perf_counter() - t0
    if device.type == "cuda":  # what the cases' peaks are measured above
        out["weights_allocated_bytes"] = torch.cuda.memory_allocated(device)
    say(f"{name}: built in {out['build_seconds']:.1f} s ({text.num_hidden_layers} layers, "
        f"{parameter_count(bench.model) / 1e9:.3f} B parameters, {cfg.dtype} on {device})")
    rows, builds, distill, skipped = [], [], [], []

    def budget_left(what: str) -> bool:
        if deadline is not None and time.perf_counter() > deadline:
            skipped.append(what)
            return False
        return True

    for k in ks:
        batch = cfg.batch or (_cuda_batch(bench, k) if device.type == "cuda" else 1)
        subsets = bench.subsets(k)
        prompt = float(np.mean([len(bench.builder.build_prefix([bench.pool[i] for i in s]).input_ids)
                                for s in subsets[1:]]))
        for ev_name, ev in bench.evaluators(k, batch).items():
            if budget_left(f"k={k} {ev_name}"):
                rows += [{**r, "batch": batch} for r in evaluator_rows({ev_name: ev}, bench.pool, bench.validation,
                                                                       subsets, k, prompt, warmup=False, say=say)]
        if (cfg.per_query_max_k is None or k <= cfg.per_query_max_k) and budget_left(f"k={k} dense-per-query"):
            m = min(cfg.per_query_queries, cfg.queries)
            (row,) = evaluator_rows({"dense-per-query": bench.per_query()}, bench.pool, bench.validation[:m],
                                    subsets, k, prompt, warmup=False,
                                    say=lambda line: say(f"{line} on {m} of {cfg.queries} queries"))
            scale = cfg.queries / m  # nothing is shared between a subset's queries: linear in them
            rows.append({**row, "flops_per_subset": row["flops_per_subset"] * scale,
                         "seconds_per_subset": row["seconds_per_subset"] * scale,
                         "seconds_per_subset_counting": row["seconds_per_subset_counting"] * scale,
                         "tokens_per_subset": row["tokens_per_subset"] * scale, "queries_measured": m,
                         "batch": batch})
        ids, mask = bench.prompt_batch(k, batch)
        for case, fn in bench.builds().items():
            if budget_left(f"k={k} build {case}"):
                with torch.no_grad(), measure(device) as counted:
                    fn(ids, mask)
                with torch.no_grad(), measure(device, count_flops=False) as timed:
                    fn(ids, mask)
                builds.append(_case_row(k, case, ids.shape[0], counted, timed, prompt_tokens=ids.shape[1]))
                say(f"k={k} build {case}: {counted.flops / ids.shape[0] / 1e9:.1f} GFLOP, "
                    f"{timed.seconds / ids.shape[0]:.3f} s per prompt")
        if cfg.distill and budget_left(f"k={k} distillation step"):
            step = bench.distill_step(k)
            with measure(device) as counted:
                step()
            with measure(device, count_flops=False) as timed:
                step()
            distill.append(_case_row(k, "distillation step", 1, counted, timed, group_size=dcfg.group_size,
                                     queries=dcfg.queries))
            say(f"k={k} distillation step: {counted.flops / 1e9:.1f} GFLOP, {timed.seconds:.2f} s")
    compare(rows)
    if cfg.memory and device.type == "cpu" and rows + builds + distill:
        try:
            peaks = peak_rss(memory_pass, cfg, name, [(r["k"], r["evaluator"]) for r in rows],
                             [(b["k"], b["case"]) for b in builds], [d["k"] for d in distill], baseline=False)
        except RuntimeError as err:  # no /proc/self/clear_refs (not Linux), or the child ran out of memory
            out["memory_not_measured"] = str(err)
            say(f"{name}: memory not measured: {err}")
        else:
            for part, measured in (("rows", rows), ("builds", builds), ("distill", distill)):
                for row, peak in zip(measured, peaks["result"][part], strict=True):
                    row.update(peak)
            out["weights_rss_bytes"] = peaks["result"]["weights_rss_bytes"]
    out.update(rows=rows, builds=builds, distill=distill, skipped=skipped,
               weights_bytes=parameter_count(bench.model) * torch.finfo(dtype).bits // 8)
    return out


def memory_pass(cfg: ScaleConfig, name: str, rows: list[tuple[int, str]], builds: list[tuple[int, str]],
                distill: list[int]) -> dict:
    """Run in a fresh process (:func:`icl_ssm.cost.peak_rss`): every case of :func:`run_shape`
    once more, each inside :func:`icl_ssm.cost.rss_peak`, in the same order. Returns per case
    ``peak_bytes`` (the process's resident set at its highest, weights included) and
    ``working_bytes`` (that above the resident set before the case)."""
    track_freed_memory()
    config = shape_config(name)
    ks = cfg.resolve_k(config)
    bench = _Bench.build(cfg, name, ks)
    batch = cfg.batch or 1
    out: dict[str, Any] = {"rows": [], "builds": [], "distill": [], "weights_rss_bytes": rss_bytes()}

    def peak(fn: Callable[[], Any]) -> dict:
        with rss_peak() as p:
            fn()
        return {"peak_bytes": p["peak_bytes"], "working_bytes": p["peak_bytes"] - p["start_bytes"]}

    for k, ev_name in rows:
        subsets = bench.subsets(k)
        if ev_name == "dense-per-query":
            m = min(cfg.per_query_queries, cfg.queries)
            out["rows"].append(peak(lambda: bench.per_query().evaluate(bench.pool, bench.validation[:m], subsets[1:])))
        else:
            ev = replace(bench.evaluators(k, batch)[ev_name], flops="off")
            out["rows"].append(peak(lambda ev=ev: ev.evaluate(bench.pool, bench.validation, subsets[1:])))
    for k, case in builds:
        ids, mask = bench.prompt_batch(k, batch)
        fn = bench.builds()[case]
        with torch.no_grad():
            out["builds"].append(peak(lambda fn=fn, ids=ids, mask=mask: fn(ids, mask)))
    for k in distill:
        out["distill"].append(peak(bench.distill_step(k)))
    return out


def _shape_fields(name: str, config: PretrainedConfig) -> dict:
    text = config.get_text_config()
    return {"layers": text.num_hidden_layers, "hidden": text.hidden_size, "heads": text.num_attention_heads,
            "kv_heads": kv_heads(text), "head_dim": head_dim(text), "vocab": text.vocab_size,
            "context": text.max_position_embeddings, "params": parameter_count(meta_model(config)),
            "published_params": SHAPES[name].published_params}


def _projections(cfg: ScaleConfig, config: PretrainedConfig, ks: Sequence[int]) -> list[dict]:
    """Projected FLOPs per evaluated subset (:func:`projected_flops`) at every ``k``, the compressors'
    own FLOPs counted on the CPU."""
    p = Projection.of(config)
    shapes = {c: SSMCompressorConfig.for_teacher(config, **o) for c, o in compressor_shapes(config).items()}
    out = []
    for k in ks:
        prompt = cfg.prompts.prompt_tokens(k)
        q, Q = cfg.prompts.query_tokens, cfg.queries
        row = {"k": k, "prompt_tokens": prompt}
        for ev in ("dense", "dense-packed", "dense-lean-packed", "dense-per-query"):
            row[ev] = projected_flops(p, ev, prompt, q, Q)
        for c, cc in shapes.items():
            ssm = ssm_flops(build_compressor(config, compressor_shapes(config)[c], cfg.device), prompt)
            prefix = "" if c == "recipe" else f"{c}-"
            for pack in (False, True):
                if pack or c == "recipe":
                    name = f"{prefix}compressed{'-packed' if pack else ''}"
                    row[name] = projected_flops(p, name, prompt, q, Q, cc, ssm)
        out.append(row)
    return out


def _gib(n: float) -> str:
    return f"{n / GiB:.1f}"


def run_scale(cfg: ScaleConfig, say: Callable[[str], None] = log) -> dict:
    """Every shape of ``cfg`` (:func:`run_shape`), in order, within ``cfg.time_budget_s``."""
    deadline = None if cfg.time_budget_s is None else time.perf_counter() + cfg.time_budget_s
    t0 = time.perf_counter()
    shapes = []
    for name in cfg.shapes:
        shapes.append(run_shape(cfg, name, say, deadline))
    settings = asdict(cfg)
    return {"settings": settings, "threads": torch.get_num_threads(), "shapes": shapes,
            "wall_seconds": time.perf_counter() - t0, "note": RANDOM_WEIGHTS}



# ---------------------------------------------------------------- tables

TARGET_K, TARGET_FLOP_SAVING, TARGET_GAP = 50, 4.0, 1.5  # issue #47: at k = 50, >= 4x FLOPs, time within 1.5x


def savings(shape: dict) -> list[dict]:
    """Per ``k``, compressor and dense reference of a measured shape: the FLOP and time saving of
    the packed compressed evaluator against the packed dense one (prefix shared by the queries),
    their ratio ``gap`` (FLOP saving / time saving), and the projected FLOP saving beside them."""
    rows = {(r["k"], r["evaluator"]): r for r in shape.get("rows", [])}
    projected = {p["k"]: p for p in shape["projected"]}
    out = []
    for k in shape["k"]:
        for c, info in shape["compressors"].items():
            name = "compressed-packed" if c == "recipe" else f"{c}-compressed-packed"
            for dense in ("dense-packed", "dense-lean-packed"):
                d, m = rows.get((k, dense)), rows.get((k, name))
                flops = time_ = gap = None
                if d and m:
                    flops = d["flops_per_subset"] / m["flops_per_subset"]
                    time_ = d["seconds_per_subset"] / m["seconds_per_subset"]
                    gap = flops / time_
                out.append({"k": k, "compressor": c, "cache_slots": info["cache_slots"], "dense": dense,
                            "flop_saving": flops, "time_saving": time_, "gap": gap,
                            "projected_flop_saving": projected[k][dense] / projected[k][name]})
    return out


def target(shape: dict) -> dict | None:
    """Issue #47's target on a measured shape, at k = 50, the recipe's compressor against the packed
    dense evaluator (both dense references): FLOP saving >= 4x, time saving within 1.5x of it."""
    out = {}
    for s in savings(shape):
        if s["k"] == TARGET_K and s["compressor"] == "recipe" and s["flop_saving"] is not None:
            out[s["dense"]] = {"flop_saving": s["flop_saving"], "time_saving": s["time_saving"], "gap": s["gap"],
                               "met": s["flop_saving"] >= TARGET_FLOP_SAVING and s["gap"] <= TARGET_GAP}
    return out or None


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


def _x(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}x"


def _g(v: float | None) -> str:
    return "—" if v is None else f"{v / 1e9:.1f}"


def _mem(v: float | None) -> str:
    return "—" if v is None else f"{v / GiB:.2f}"


def scale_markdown(result: dict) -> str:
    """The run as markdown: shapes and compressors, the savings, every evaluator per subset, the
    cache builds and the distillation step; refusals and skipped cases said in words."""
    st = result["settings"]
    p = st["prompts"]
    memory = ("peak memory: `torch.cuda.max_memory_allocated` in the timed pass" if st["device"].startswith("cuda")
              else "peak memory: the resident set of a child process that runs every case once more (the kernel's "
                   "high-water mark reset before each case, freed memory returned to the system)")
    lines = [f"**{RANDOM_WEIGHTS}**", "",
             f"{st['device']}, {st['dtype']}, {result['threads']} torch threads. Per evaluated subset: "
             f"{st['queries']} queries of {p['query_tokens']} tokens, demonstrations of {p['demo_tokens']} tokens "
             f"(synthetic tokens, Rotten Tomatoes' lengths); {st['subsets']} measured subset(s) a case, "
             f"{st['batch'] or 'as many as fit'} a batch; FLOPs counted (`FlopCounterMode`, attention included) in "
             "a pass of their own, seconds from a pass without the counter; dense per query measured on "
             f"{st['per_query_queries']} queries and scaled to {st['queries']}; {memory}. `dense-lean`: the dense "
             "prefix without the LM head over the prompt (`select`'s dense evaluator computes it at every prompt "
             "token). Projected: FLOPs from the shape (`projected_flops`).", ""]
    lines += ["| shape | layers | hidden | heads / KV | head_dim | vocab | context | window | parameters | "
              "weights GiB | compressors: params (cache slots) |",
              "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for sh in result["shapes"]:
        published = f" ({_count(sh['published_params'])} published)" if sh["published_params"] else ""
        comps = "; ".join(f"{c} {i['params'] / 1e6:.1f} M ({i['cache_slots']})" for c, i in sh["compressors"].items())
        weights = sh.get("weights_bytes") or sh.get("estimate_bytes", {}).get("weights")
        lines.append(f"| {sh['shape']} | {sh['layers']} | {sh['hidden']} | {sh['heads']} / {sh['kv_heads']} | "
                     f"{sh['head_dim']} | {sh['vocab']} | {sh['context']} | {sh['window'] or '—'} | "
                     f"{_count(sh['params'])}{published} | {_mem(weights)} | {comps} |")
    refused = [sh for sh in result["shapes"] if sh.get("refused")]
    for sh in refused:
        lines += ["", f"**{sh['shape']}: refused**, {sh['refused']}."]
    for sh in result["shapes"]:
        for k, why in sh.get("refused_k", {}).items():
            lines += ["", f"**{sh['shape']}, k = {k}: refused**, {why}."]
    measured = [sh for sh in result["shapes"] if sh.get("rows")]
    if measured:
        lines += ["", "Savings per evaluated subset, packed compressed against packed dense (prefix shared by the "
                  "queries); FLOPs / time: how far the time saving falls short of the FLOP saving.", "",
                  "| shape | k | prompt tokens | compressor (slots) | against | FLOP saving | time saving | "
                  "FLOPs / time | projected FLOP saving |", "|---|---:|---:|---|---|---:|---:|---:|---:|"]
        for sh in measured:
            prompts = {p["k"]: p["prompt_tokens"] for p in sh["projected"]}
            for s in savings(sh):
                lines.append(f"| {sh['shape']} | {s['k']} | {prompts[s['k']]} | {s['compressor']} "
                             f"({s['cache_slots']}) | {s['dense']} | {_x(s['flop_saving'])} | {_x(s['time_saving'])} | "
                             f"{_x(s['gap'], 2)} | {_x(s['projected_flop_saving'])} |")
        lines += ["", "Per evaluated subset, every evaluator (against the compressed evaluator on the same query "
                  "path: `-packed` rows against `compressed-packed`, the others against `compressed`).", "",
                  "| shape | k | evaluator | batch | GFLOP | projected GFLOP | s | peak GiB | above weights GiB | "
                  "FLOPs vs compressed | time vs compressed |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for sh in measured:
            projected = {p["k"]: p for p in sh["projected"]}
            for r in sh["rows"]:
                note = f" ({r['queries_measured']} queries, scaled)" if "queries_measured" in r else ""
                lines.append(f"| {sh['shape']} | {r['k']} | {r['evaluator']}{note} | {r['batch']} | "
                             f"{_g(r['flops_per_subset'])} | {_g(projected[r['k']].get(r['evaluator']))} | "
                             f"{r['seconds_per_subset']:.3f} | {_mem(r.get('peak_bytes'))} | "
                             f"{_mem(_above(sh, r))} | {r['flops_vs_compressed']:.1f}x | "
                             f"{r['seconds_vs_compressed']:.1f}x |")
        lines += ["", "The cache build alone, per prompt.", "",
                  "| shape | k | cache | GFLOP | s | peak GiB | above weights GiB |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for sh in measured:
            for b in sh["builds"]:
                lines.append(f"| {sh['shape']} | {b['k']} | {b['case']} | {_g(b['flops'])} | {b['seconds']:.3f} | "
                             f"{_mem(b.get('peak_bytes'))} | {_mem(_above(sh, b))} |")
        steps = [(sh, d) for sh in measured for d in sh["distill"]]
        if steps:
            d0 = steps[0][1]
            lines += ["", f"One distillation step of the recipe's compressor (stage 2, forward and backward, "
                      f"{d0['group_size']} prompts x {d0['queries']} queries, teacher targets cached).", "",
                      "| shape | k | GFLOP | s | peak GiB | above weights GiB |", "|---|---:|---:|---:|---:|---:|"]
            for sh, d in steps:
                lines.append(f"| {sh['shape']} | {d['k']} | {_g(d['flops'])} | {d['seconds']:.3f} | "
                             f"{_mem(d.get('peak_bytes'))} | {_mem(_above(sh, d))} |")
    for sh in result["shapes"]:
        if sh.get("memory_not_measured"):
            lines += ["", f"{sh['shape']}: memory not measured ({sh['memory_not_measured']})."]
        if sh.get("skipped"):
            lines += ["", f"{sh['shape']}: skipped when the time budget ran out: {', '.join(sh['skipped'])}."]
    lines += ["", "Projected FLOPs per evaluated subset (GFLOP; from the shape, the compressors counted).", "",
              "| shape | k | prompt tokens | dense-packed | dense-lean-packed | dense-per-query | compressed-packed | "
              "paper-compressed-packed | window-compressed-packed | saving, packed (recipe / paper / window) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for sh in result["shapes"]:
        for pr in sh["projected"]:
            ratio = " / ".join(_x(pr["dense-packed"] / pr[n]) if n in pr else "—"
                               for n in ("compressed-packed", "paper-compressed-packed", "window-compressed-packed"))
            gflops = " | ".join(_g(pr.get(n)) for n in ("dense-packed", "dense-lean-packed", "dense-per-query",
                                                        "compressed-packed", "paper-compressed-packed",
                                                        "window-compressed-packed"))
            lines.append(f"| {sh['shape']} | {pr['k']} | {pr['prompt_tokens']} | {gflops} | {ratio} |")
    for sh in measured:
        t = target(sh)
        if t:
            lines += ["", f"Target at k = {TARGET_K} on {sh['shape']} (recipe, packed; >= {TARGET_FLOP_SAVING:.0f}x "
                      f"FLOPs, time within {TARGET_GAP}x of it): " + "; ".join(
                          f"against {d}: {v['flop_saving']:.1f}x FLOPs, {v['time_saving']:.1f}x time, "
                          f"{'met' if v['met'] else 'not met'}" for d, v in t.items()) + "."]
    return "\n".join(lines)


def _above(shape: dict, row: dict) -> float | None:
    """Memory a case adds to the weights: measured on the CPU (``working_bytes``), the peak less
    the memory allocated before the run on a GPU."""
    if "working_bytes" in row:
        return row["working_bytes"]
    base = shape.get("weights_allocated_bytes")
    return None if base is None or row.get("peak_bytes") is None else row["peak_bytes"] - base

"""FLOPs projected from a model's shape, and memory estimated from it: the reference of
``bench scale``'s counted rows, and the figures for shapes that cannot be measured here."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, head_dim, kv_heads
from icl_ssm.cost import flop_counter
from icl_ssm_bench.shapes import meta_model, parameter_count


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
    head at every prompt token (:func:`~icl_ssm.compress.cache.dense_cache`), the lean one at the
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

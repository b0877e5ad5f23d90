"""FLOP counting: attention is counted on the CPU as on the GPU."""

import pytest
import torch
import torch.nn.functional as F

from icl_ssm.cost import measure
from icl_ssm.lm.tiny import tiny_model


def test_attention_is_counted_on_the_cpu_with_grouped_query_heads():
    B, Hq, Hkv, Sq, Sk, d = 2, 6, 2, 5, 11, 8
    q = torch.randn(B, Hq, Sq, d, requires_grad=True)
    k = torch.randn(B, Hkv, Sk, d, requires_grad=True)
    v = torch.randn(B, Hkv, Sk, d, requires_grad=True)
    with measure() as fwd:
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert fwd.flops == 2 * (2 * B * Hq * Sq * Sk * d)  # scores, then their product with the values
    with measure() as bwd:
        out.sum().backward()
    assert bwd.flops > fwd.flops


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_forward_costs_the_same_with_sdpa_and_eager_attention(arch):
    """Eager attention is plain matrix products, which were always counted; SDPA's CPU kernel
    now gets the same count, so a model's FLOPs do not depend on its attention implementation."""
    ids = torch.randint(3, 100, (2, 13))
    counts = {}
    for impl in ("eager", "sdpa"):
        model = tiny_model(arch, attn_implementation=impl)
        assert model.config._attn_implementation == impl
        with torch.no_grad(), measure() as cost:
            model(input_ids=ids)
        counts[impl] = cost.flops
    assert counts["sdpa"] == counts["eager"] > 0

"""The dense cache: the teacher's own K/V of the whole prompt."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache, dense_cache


@dataclass(frozen=True)
class DenseCache:
    """One dense prefill per prompt row; queries answered after it reproduce the dense prompt's
    logits (the reference every other cache is compared with)."""

    model: PreTrainedModel
    name: str = "dense"

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache:
        return dense_cache(self.model, input_ids, attention_mask)

    def tokens(self, attention_mask: Tensor) -> int:
        return int(attention_mask.sum())

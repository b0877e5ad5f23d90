"""StreamingLLM's cache (Xiao et al., 2024): the sinks and the last dense slots."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.baselines import streaming_cache
from icl_ssm.compress.cache import PrefixCache


@dataclass(frozen=True)
class StreamingCache:
    """The dense prefill's K/V of the first ``num_sink`` and last ``n_window`` prompt tokens."""

    model: PreTrainedModel
    num_sink: int
    n_window: int
    name: str = "streaming"

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache:
        return streaming_cache(self.model, input_ids, attention_mask, self.num_sink, self.n_window)

    def tokens(self, attention_mask: Tensor) -> int:
        return int(attention_mask.sum())

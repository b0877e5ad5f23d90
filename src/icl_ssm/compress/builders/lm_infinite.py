"""LM-Infinite's cache (Han et al., 2024): the streaming slots after a Lambda-masked prefill."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.baselines import lm_infinite_cache
from icl_ssm.compress.cache import PrefixCache


@dataclass(frozen=True)
class LMInfiniteCache:
    """The prompt prefilled under the Lambda mask (``num_sink`` first tokens, ``n_window``
    before each token); the answer reads the sinks and the last ``n_window`` tokens."""

    model: PreTrainedModel
    num_sink: int
    n_window: int
    name: str = "lm-infinite"

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache:
        return lm_infinite_cache(self.model, input_ids, attention_mask, self.num_sink, self.n_window)

    def tokens(self, attention_mask: Tensor) -> int:
        return int(attention_mask.sum())

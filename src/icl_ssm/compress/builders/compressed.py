"""The compressed cache: exact sinks + the SSM compressor's virtual tokens (the paper's cache)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache, compressed_cache
from icl_ssm.compress.compressor import SSMCompressor


@dataclass(frozen=True)
class CompressedCache:
    """``compressor``'s cache of each prompt row: no dense prefill of the prompt, only its
    ``num_sink`` first tokens (and a hybrid compressor's ``num_recent`` last ones)."""

    model: PreTrainedModel
    compressor: SSMCompressor
    name: str = "compressed"

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache:
        return compressed_cache(self.model, self.compressor, input_ids, attention_mask)

    def tokens(self, attention_mask: Tensor) -> int:
        c = self.compressor.config  # the sinks, and a hybrid compressor's recent tokens re-encoded
        return attention_mask.shape[0] * (c.num_sink + c.num_recent)

"""The control cache: a compressor of the same shape whose head reads a learned constant instead
of the SSM state, so its virtual tokens cannot depend on the prompt (only its sinks and recent
tokens do). A compressor that ranks prompts no better than its control has not learned to
read them."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache, compressed_cache
from icl_ssm.compress.compressor import SSMCompressor


@dataclass(frozen=True)
class ControlCache:
    """``compressor`` must be a control (``config.control``); otherwise a ValueError."""

    model: PreTrainedModel
    compressor: SSMCompressor
    name: str = "control"

    def __post_init__(self) -> None:
        if not self.compressor.config.control:
            raise ValueError("ControlCache: the compressor given is not a control (its config.control is False); "
                             "use CompressedCache for a trained compressor")

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache:
        return compressed_cache(self.model, self.compressor, input_ids, attention_mask)

    def tokens(self, attention_mask: Tensor) -> int:
        c = self.compressor.config  # the sinks, and a hybrid compressor's recent tokens re-encoded
        return attention_mask.shape[0] * (c.num_sink + c.num_recent)

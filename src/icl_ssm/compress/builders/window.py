"""The window cache: the untrained comparator of the compressor's size."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache, window_cache
from icl_ssm.compress.compressor import SSMCompressor


@dataclass(frozen=True)
class WindowCache:
    """The first ``num_sink`` and the last ``n_window`` prompt tokens, re-encoded on their own;
    the query starts at ``position`` (``SSMCompressorConfig.position``)."""

    model: PreTrainedModel
    num_sink: int
    n_window: int
    position: str = "compressed"
    name: str = "window"

    def __post_init__(self) -> None:
        if self.n_window < 0 or self.num_sink < 0:
            raise ValueError(f"WindowCache: num_sink={self.num_sink}, n_window={self.n_window}: expected >= 0 tokens")

    @classmethod
    def like(cls, model: PreTrainedModel, compressor: SSMCompressor, n_window: int | None = None) -> WindowCache:
        """The window of ``compressor``'s size (``num_virtual + num_recent`` tokens unless
        ``n_window``), its sinks and position convention."""
        c = compressor.config
        return cls(model, c.num_sink, c.num_virtual + c.num_recent if n_window is None else n_window, c.position)

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache:
        return window_cache(self.model, input_ids, attention_mask, self.num_sink, self.n_window, self.position)

    def tokens(self, attention_mask: Tensor) -> int:
        lengths = attention_mask.sum(1)
        return int((lengths.clamp(max=self.num_sink) + (lengths - self.num_sink).clamp(min=0, max=self.n_window)).sum())

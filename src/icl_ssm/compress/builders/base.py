"""The contract every cache builder keeps, and the one place a cache is named by a string."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from icl_ssm.compress.cache import PrefixCache
    from icl_ssm.compress.compressor import SSMCompressor


@runtime_checkable
class CacheBuilder(Protocol):
    """``name``: how records and reports call this cache; ``tokens``: the prompt tokens the
    transformer reads to build it. Called on ``input_ids: (B, T)`` (or
    value tokens ``(B, T, F)``) right-padded, and ``attention_mask: (B, T)``, it returns the
    :class:`~icl_ssm.compress.cache.PrefixCache` every query of row ``b`` is answered after."""

    name: str

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache: ...

    def tokens(self, attention_mask: Tensor) -> int:
        """The prompt tokens the transformer reads to build the caches of these rows (what the
        cost accounting counts; the SSM reads embeddings and is not counted here)."""
        ...


CACHES = ("dense", "compressed")  # the caches a command line names ("exact" reads as "dense")


def cache_for(name: str, model: PreTrainedModel, compressor: SSMCompressor | None = None) -> CacheBuilder:
    """The builder a command line's ``name`` (:data:`CACHES`; ``exact``, the earlier name of the
    dense cache, accepted) stands for; ``compressed`` needs ``compressor``."""
    from icl_ssm.compress.builders.compressed import CompressedCache
    from icl_ssm.compress.builders.dense import DenseCache

    name = "dense" if name == "exact" else name
    if name == "dense":
        return DenseCache(model)
    if name == "compressed":
        if compressor is None:
            raise ValueError("cache 'compressed' needs a compressor (load one with load_compressor)")
        return CompressedCache(model, compressor)
    raise ValueError(f"cache {name!r}; accepted: {', '.join(CACHES)} (or pass a CacheBuilder)")

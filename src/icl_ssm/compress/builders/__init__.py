"""The cache builders: what stands in front of a query, one small class per file, each a
:class:`CacheBuilder` (``name``; called on right-padded prompts ``(B, T)`` and their mask, it
returns a :class:`~icl_ssm.compress.cache.PrefixCache`).

* :class:`DenseCache` - the teacher's own K/V of the whole prompt (the reference);
* :class:`CompressedCache` - sinks + the SSM compressor's virtual tokens;
* :class:`ControlCache` - the same, from a prompt-blind control compressor;
* :class:`WindowCache` - sinks + the last prompt tokens re-encoded, the compressor's size;
* :class:`StreamingCache` - StreamingLLM: sinks + the last dense slots;
* :class:`LMInfiniteCache` - LM-Infinite: the same slots after a Lambda-masked prefill.

:func:`cache_for` is the one place a cache is chosen by its command-line name
(:data:`CACHES`); code passes builders. Imports only :mod:`icl_ssm.compress` modules and the
layers below them.
"""

from icl_ssm.compress.builders.base import CACHES, CacheBuilder, cache_for
from icl_ssm.compress.builders.compressed import CompressedCache
from icl_ssm.compress.builders.control import ControlCache
from icl_ssm.compress.builders.dense import DenseCache
from icl_ssm.compress.builders.lm_infinite import LMInfiniteCache
from icl_ssm.compress.builders.streaming import StreamingCache
from icl_ssm.compress.builders.window import WindowCache

__all__ = ["CACHES", "CacheBuilder", "CompressedCache", "ControlCache", "DenseCache", "LMInfiniteCache",
           "StreamingCache", "WindowCache", "cache_for"]

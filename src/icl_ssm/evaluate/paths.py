"""The fidelity run's core: held-out subsets, the cache paths compared, and every subset
through every path.

* :func:`sample_subsets` - ``n`` random ``k``-subsets of a pool (explicit numpy Generator);
* :func:`cache_paths` - the cache builders compared (dense, compressed, control, window, the
  long-context :data:`BASELINES`, other compressors);
* :func:`evaluate_paths` - the same subsets through several cache builders, streaming the logit
  agreement with the reference path batch by batch so that no ``(S, Q, V)`` tensor is ever held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.builders import (
    CacheBuilder,
    CompressedCache,
    ControlCache,
    DenseCache,
    LMInfiniteCache,
    StreamingCache,
    WindowCache,
)
from icl_ssm.compress.compressor import SSMCompressor
from icl_ssm.cost import measure
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.answers import (
    LogitAgreement,
    PrefixEval,
    evaluate_prefixes,
    logit_agreement,
    pad_right,
)
from icl_ssm.evaluate.dense_store import DenseStore
from icl_ssm.evaluate.stats import COMPARATORS
from icl_ssm.lm.batch import PromptLike
from icl_ssm.lm.prompts import PromptBuilder


def sample_subsets(pool: int | Sequence[Any], k: int, n: int, rng: np.random.Generator) -> list[list[int]]:
    """``n`` subsets of ``k`` distinct pool indices each, in random demonstration order.

    Deterministic for the state of ``rng``. Subsets are drawn independently, so two may
    coincide on a tiny pool.
    """
    size = pool if isinstance(pool, int) else len(pool)
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: expected an integer >= 1 demonstrations per subset")
    if k > size:
        raise ValueError(
            f"k={k} demonstrations requested but the candidate pool has only {size} examples; "
            "lower k or use a task with a larger pool"
        )
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"subsets={n!r}: expected an integer >= 1")
    return [rng.choice(size, size=k, replace=False).tolist() for _ in range(n)]


BASELINES = ("streaming", "lm-infinite")  # long-context methods measured beside the compressor (cache_paths)


def cache_paths(
    model: PreTrainedModel,
    compressor: SSMCompressor,
    *,
    control: SSMCompressor | None = None,
    n_window: int | None = None,
    also: dict[str, SSMCompressor] | None = None,
    baselines: Sequence[str] = (),
) -> dict[str, CacheBuilder]:
    """The cache builders ``icl-ssm fidelity`` compares: ``dense`` (the teacher's own K/V),
    ``compressed``, ``control`` (when given), ``window`` (the compressor's sinks + the last
    ``n_window`` prompt tokens, default its ``num_virtual + num_recent``: the same cache size,
    same position convention), the long-context ``baselines`` asked for (:data:`BASELINES`:
    ``streaming``, the sinks and the last ``n_window`` tokens of the dense cache; ``lm-infinite``,
    the same slots after a Lambda-masked prefill) and one path per compressor in ``also`` (other
    compressors compared on the same subsets and queries, e.g. the variants of an ablation)."""
    unknown = sorted(set(baselines) - set(BASELINES))
    if unknown:
        raise ValueError(f"baselines {unknown}; accepted: {', '.join(BASELINES)}")
    c = compressor.config
    clash = sorted(set(also or ()) & {"dense", "compressed", *COMPARATORS})
    if clash:
        raise ValueError(f"also: the names {clash} are taken by the built-in paths; choose other names")
    n_window = c.num_virtual + c.num_recent if n_window is None else n_window
    if n_window < 0:
        raise ValueError(f"n_window={n_window}: expected >= 0 prompt tokens")
    builders: list[CacheBuilder] = [DenseCache(model), CompressedCache(model, compressor)]
    if control is not None:
        builders.append(ControlCache(model, control))
    builders.append(WindowCache(model, c.num_sink, n_window, c.position))
    if "streaming" in baselines:
        builders.append(StreamingCache(model, c.num_sink, n_window))
    if "lm-infinite" in baselines:
        builders.append(LMInfiniteCache(model, c.num_sink, n_window))
    builders += [CompressedCache(model, other, name=name) for name, other in (also or {}).items()]
    paths = {b.name: b for b in builders}
    return paths


def evaluate_paths(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prefixes: Sequence[PromptLike],
    queries: Sequence[Example],
    paths: dict[str, CacheBuilder],
    *,
    reference: str = "dense",
    loss: str = "nll",
    batch: int = 4,
    query_batch: int = 16,
    progress: Callable[[int], None] | None = None,
    store: DenseStore | None = None,
) -> dict[str, tuple[PrefixEval, LogitAgreement | None]]:
    """Every prefix (one per subset) through every cache builder, ``batch`` subsets at a time.

    Returns, per path, its :class:`PrefixEval` (without logits) and its
    :class:`LogitAgreement` with the ``reference`` path (None for the reference itself).
    Each path's ``cost`` covers building its caches and answering all queries; the logit
    comparison is not counted. ``progress(n)`` is called after each batch of ``n`` subsets.
    With a ``store``, the reference path's rows are read from it where present (their cost is
    the one stored with them) and stored where computed.
    """
    _validate_paths(paths, reference, prefixes, batch)
    order = [reference, *(name for name in paths if name != reference)]
    pad_id = getattr(model.config.get_text_config(), "pad_token_id", None)
    pad_id = pad_id if isinstance(pad_id, int) and pad_id >= 0 else 0  # masked anyway
    device = model.device
    with torch.no_grad():  # warm-up: lazily built state (the SSM's powers) is not timed
        ids, mask = pad_right(prefixes[:1], pad_id)
        for name in order[1:] if store is not None else order:
            paths[name](ids.to(device), mask.to(device))
    evals: dict[str, list[PrefixEval]] = {name: [] for name in order}
    agreements: dict[str, list[LogitAgreement]] = {name: [] for name in order}
    for start in range(0, len(prefixes), batch):
        rows = prefixes[start : start + batch]
        ids, mask = pad_right(rows, pad_id)  # (B, T) each
        ids, mask = ids.to(device), mask.to(device)
        ref_logits = None
        for name in order:
            ev = _answer_batch(model, builder, paths[name], rows, ids, mask, queries, loss=loss,
                               query_batch=query_batch, store=store if name == reference else None)
            if name == reference:
                ref_logits = ev.logits
            else:
                agreements[name].append(logit_agreement(ref_logits, ev.logits))
            evals[name].append(ev.without_logits())
        if progress is not None:
            progress(ids.shape[0])
    return {
        name: (PrefixEval.cat(evals[name]), LogitAgreement.cat(agreements[name]) if agreements[name] else None)
        for name in order
    }


def _validate_paths(paths: dict[str, CacheBuilder], reference: str, prefixes: Sequence[PromptLike], batch: int) -> None:
    """:func:`evaluate_paths`'s arguments, each refused with what would be accepted."""
    if reference not in paths:
        raise ValueError(f"reference path {reference!r} is not among the paths {', '.join(paths)}")
    if not prefixes:
        raise ValueError("no subsets: expected at least one prefix")
    if batch < 1:
        raise ValueError(f"batch={batch}; expected >= 1 subsets per batch")


def _answer_batch(
    model: PreTrainedModel,
    builder: PromptBuilder,
    build: CacheBuilder,
    rows: Sequence[PromptLike],
    ids: Tensor,
    mask: Tensor,
    queries: Sequence[Example],
    *,
    loss: str,
    query_batch: int,
    store: DenseStore | None,
) -> PrefixEval:
    """One batch of prefixes ``rows`` (padded: ``ids``, ``mask`` ``(B, T)`` on the model's device)
    through one cache builder, with logits; its ``cost`` measures building the caches and
    answering the queries. With a ``store``, read from it where present and stored where computed."""
    ev = store.get(rows) if store is not None else None
    if ev is None:
        with torch.no_grad(), measure(model.device) as cost:
            cache = build(ids, mask)
            ev = evaluate_prefixes(model, builder, cache, queries, loss=loss, query_batch=query_batch)
        ev.cost = cost
        if store is not None:
            store.put(rows, ev)
    return ev

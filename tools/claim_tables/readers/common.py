"""What the readers share: a stored bootstrap or a bare value as a :class:`~icl_ssm.records.Metric`, and
:func:`combined`, one record joined from several (a summary row that reads more than one record)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from icl_ssm.records import Metric, Record

from ..base import sd

# what a stored bootstrap's "resampled" meant, in the words a table prints
RESAMPLED = {"rows": "test examples", "examples": "test examples", "subsets": "subsets",
             "subsets and queries": "subsets and queries", "runs": "runs"}


def difference(stats: dict | None, unit: str = "accuracy difference", resampled: str = "rows") -> Metric:
    """A stored paired difference ``{"mean", "ci95", "resampled", "n"}`` as a metric; ``resampled``:
    what the family's bootstraps resampled where the record does not say (a trust run's: test examples)."""
    if not stats or stats.get("mean") is None:
        return Metric(None, unit=unit)
    interval = stats.get("ci95")
    what = stats.get("resampled", resampled)
    return Metric(stats["mean"], None if interval is None else tuple(interval), stats.get("n"),
                  RESAMPLED.get(what, what) if interval is not None else None, unit, stats.get("level", 0.95))


def accuracy(value: float | None, n: int | None) -> Metric:
    """A test accuracy over ``n`` examples, without an interval."""
    return Metric(value, n=n, unit="accuracy")


# the statistics :func:`combined` computes over metrics, by name
STATISTICS: dict[str, Callable[[list[float]], float]] = {
    "mean": statistics.fmean, "sd": sd,
    "min": min, "max": max, "minus": lambda xs: xs[0] - xs[1], "plus": lambda xs: xs[0] + xs[1]}


def combined(name: str, sources: dict[str, Record], stats: dict[str, tuple[str, list[str]]] | None = None,
             config: dict[str, Any] | None = None, *, derived: dict[str, Metric] | None = None) -> Record:
    """One record of several (a summary table's row that reads more than one record): each source's metrics
    as ``{alias}.X``, its config under ``config["sources"][alias]`` beside the settings ``config``, its
    provenance as ``{alias}: {part}``; ``derived``: metrics the caller computed from the sources (a statistic
    :data:`STATISTICS` does not hold, such as a Spearman-Brown projection), kept under their own names; then
    each statistic ``stats[out] = (what, [metric, ...])`` over the metrics named (a source's, a derived one or
    one computed before it): ``mean``, ``sd`` (sample sd, n - 1), ``min``, ``max`` (n = how many), ``minus``
    (the first less the second) or ``plus``; values alone, no interval."""
    metrics = {f"{alias}.{k}": m for alias, r in sources.items() for k, m in r.metrics.items()} | (derived or {})
    for out, (what, keys) in (stats or {}).items():
        missing = [k for k in keys if k not in metrics]
        if missing:
            raise KeyError(f"{name!r}: no metric {missing[0]!r} in its records ({', '.join(sources)}) for {out!r}")
        used = [metrics[k] for k in keys]
        unit = used[0].unit + (" difference" if what == "minus" else "")
        n = len(used) if what in ("mean", "sd", "min", "max") else used[0].n
        metrics[out] = Metric(STATISTICS[what]([m.value for m in used]), n=n, unit=unit)
    provenance = {f"{alias}: {part}": p for alias, r in sources.items() for part, p in r.provenance.items()}
    return Record(provenance, {"sources": {a: r.config for a, r in sources.items()}, **(config or {})}, metrics,
                  {}, name)

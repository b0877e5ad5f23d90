"""What the readers share: a stored bootstrap or a bare value as a :class:`~icl_ssm.records.Metric`."""

from __future__ import annotations

from icl_ssm.records import Metric

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
    return Metric(value, n=n, unit="accuracy")

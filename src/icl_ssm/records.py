"""One schema for every published record: what was run, how it was made, what it measured.

A :class:`Record` is ``{"schema", "provenance", "config", "metrics", "example_ids"}``:

* ``provenance``: per part of the work (a stage, the test scoring, the whole process), the
  :func:`~icl_ssm.provenance.environment` it ran under (commit, date, machine with its torch
  threads, library versions);
* ``config``: the settings it ran with, as JSON;
* ``metrics``: name -> :class:`Metric` (a value; where it is an estimate, its interval, the count it
  rests on and what the interval resamples), computed when the record is written, so that no
  table computes a statistic;
* ``example_ids``: per split, the ids of the examples it was measured on.

:func:`write_record` writes one atomically; :func:`read_record` reads one back and refuses a file
that is not one, naming the file, the key and what is accepted. Records stored before this
schema are read through one adapter (``tools/claim_tables/adapt.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icl_ssm.atomic import write_json

SCHEMA = "icl-ssm-record/1"


@dataclass(frozen=True)
class Metric:
    """``value``; ``interval`` ``(low, high)`` at ``level`` (0.95) where the value is an estimate;
    ``n``: how many units it rests on (examples, runs, subsets); ``resamples``: what the interval
    resamples ("test examples", "subsets and queries", "runs"); ``unit``: how to read the value
    ("accuracy", "points", "spearman", "count", "seconds", ...)."""

    value: float | None
    interval: tuple[float, float] | None = None
    n: int | None = None
    resamples: str | None = None
    unit: str = ""
    level: float = 0.95

    def __post_init__(self) -> None:
        if self.value is not None and not isinstance(self.value, int | float):
            raise TypeError(f"Metric value={self.value!r}: expected a number or None")
        if self.interval is not None:
            low, high = self.interval
            if not (low <= high):
                raise ValueError(f"Metric interval={self.interval!r}: expected (low, high) with low <= high")
            if self.resamples is None:
                raise ValueError(f"Metric interval={self.interval!r} says nothing of what it resamples; "
                                 "give resamples=")
            object.__setattr__(self, "interval", (float(low), float(high)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value}
        if self.interval is not None:
            out.update(interval=list(self.interval), level=self.level, resamples=self.resamples)
        out.update({k: v for k, v in (("n", self.n), ("unit", self.unit)) if v not in (None, "")})
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "metric") -> Metric:
        unknown = sorted(set(data) - {"value", "interval", "level", "resamples", "n", "unit"})
        if unknown or "value" not in data:
            raise ValueError(f"{where}: keys {sorted(data)}; accepted: value (required), interval, level, "
                             "resamples, n, unit")
        interval = data.get("interval")
        return cls(data["value"], None if interval is None else tuple(interval), data.get("n"),
                   data.get("resamples"), data.get("unit", ""), data.get("level", 0.95))


@dataclass(frozen=True)
class Record:
    """One published record (module docstring); ``name``: where it is stored, relative to the
    records' folder (not written into the file)."""

    provenance: dict[str, dict[str, Any] | None]
    config: dict[str, Any]
    metrics: dict[str, Metric]
    example_ids: dict[str, list[str]] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if not self.provenance:
            raise ValueError(f"record {self.name!r}: no provenance; every record says how it was made")
        for key, metric in self.metrics.items():
            if not isinstance(metric, Metric):
                raise TypeError(f"record {self.name!r}: metric {key!r} is {type(metric).__name__}, not a Metric")

    def __getitem__(self, key: str) -> Metric:
        if key not in self.metrics:
            raise KeyError(f"record {self.name!r} has no metric {key!r}; it has: {', '.join(self.metrics)}")
        return self.metrics[key]

    def part(self, prefix: str) -> Record:
        """The part of this record named ``prefix`` (an arm, a method, a cache) as a record of its
        own: the metrics ``prefix.X`` as ``X``, the same provenance and example ids, the config
        with ``part = prefix``; one row of a table whose rows are the parts of one record."""
        start = f"{prefix}."
        metrics = {k[len(start):]: m for k, m in self.metrics.items() if k.startswith(start)}
        if not metrics:
            raise KeyError(f"record {self.name!r} has no part {prefix!r} (no metric named {start}...)")
        return Record(self.provenance, {**self.config, "part": prefix}, metrics, self.example_ids, self.name)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "provenance": self.provenance, "config": self.config,
                "metrics": {k: m.to_dict() for k, m in self.metrics.items()}, "example_ids": self.example_ids}

    @classmethod
    def from_dict(cls, data: dict[str, Any], name: str = "") -> Record:
        where = f"record {name!r}" if name else "record"
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{where}: schema {data.get('schema')!r}; accepted: {SCHEMA!r} (older records are read "
                             "through tools/claim_tables/adapt.py)")
        missing = [k for k in ("provenance", "config", "metrics") if k not in data]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        metrics = {k: Metric.from_dict(m, f"{where}, metric {k!r}") for k, m in data["metrics"].items()}
        return cls(data["provenance"], data["config"], metrics, data.get("example_ids") or {}, name)


def write_record(path: str | Path, record: Record) -> Path:
    """``record`` as JSON at ``path``, complete or not at all (written beside it, then renamed).
    A non-finite value is refused: JSON has none, and a table would print it as a number."""
    for key, metric in record.metrics.items():
        numbers = [metric.value, *(metric.interval or ())]
        if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
            raise ValueError(f"record {record.name or str(path)!r}, metric {key!r}: {numbers} is not finite; "
                             "store None for a value that could not be measured")
    return write_json(path, record.to_dict())


def read_record(path: str | Path) -> Record:
    """The record stored at ``path`` (:func:`write_record`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{str(path)!r} is not a readable JSON record: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r}: a record is a JSON object, found {type(data).__name__}")
    return Record.from_dict(data, path.name)

"""The one renderer of record tables: rows are records (:class:`icl_ssm.records.Record`), columns
name a setting or a metric, and every cell prints what the record holds, an interval beside its
value. Below the table, one line says what each interval resamples and how many units it rests on,
so that no number appears without what it rests on. It computes no statistic: a statistic is the
record's (written with it, or named by ``tools/claim_tables/adapt.py`` for an older record).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from icl_ssm.records import Metric, Record

from .base import p_text, table

FORMATS: dict[str, Callable[[float], str]] = {
    "acc": lambda x: f"{x:.3f}",
    "diff": lambda x: f"{x:+.3f}",
    "rho": lambda x: f"{x:.2f}",
    "int": lambda x: f"{x:.0f}",
    "pct": lambda x: f"{100 * x:.1f}",
    "points": lambda x: f"{100 * x:+.1f}",
    "p": p_text,
    "ratio": lambda x: f"{x:.1f}x",
    "seconds": lambda x: f"{x:.0f} s",
}


@dataclass(frozen=True)
class Column:
    """``header``; the cell is the record's ``metric`` (printed by ``fmt``, one of :data:`FORMATS` or
    a function of the number, with its interval), its ``config`` setting, or ``cell(record)`` for what
    neither holds (a link, who made it)."""

    header: str
    metric: str | None = None
    config: str | None = None
    fmt: str | Callable[[float], str] = "acc"
    cell: Callable[[Record], str] | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.metric, self.config, self.cell)) != 1:
            raise ValueError(f"column {self.header!r}: give one of metric, config or cell")
        if not callable(self.fmt) and self.fmt not in FORMATS:
            raise ValueError(f"column {self.header!r}: fmt={self.fmt!r}; accepted: {', '.join(FORMATS)}")

    def render(self, record: Record) -> str:
        if self.cell is not None:
            return self.cell(record)
        if self.config is not None:
            value = record.config.get(self.config)
            return "-" if value is None else str(value)
        return metric_text(record[self.metric], self.fmt if callable(self.fmt) else FORMATS[self.fmt])


def metric_text(metric: Metric, show: Callable[[float], str]) -> str:
    """``value [low, high]``, the value alone without an interval, ``-`` where there is none."""
    if metric.value is None:
        return "-"
    if metric.interval is None:
        return show(metric.value)
    return f"{show(metric.value)} [{show(metric.interval[0])}, {show(metric.interval[1])}]"


def intervals_note(records: Sequence[Record], columns: Sequence[Column]) -> str:
    """What each column's intervals resample and over how many units: one sentence, columns that rest on the
    same (level, what, count) named together; empty where no cell has an interval."""
    groups: dict[str, list[str]] = {}
    for col in columns:
        if col.metric is None:
            continue
        shown = [r[col.metric] for r in records if col.metric in r.metrics and r[col.metric].interval is not None]
        if not shown:
            continue
        what = sorted({m.resamples for m in shown})
        levels = sorted({m.level for m in shown})
        counts = sorted({m.n for m in shown if m.n is not None})
        n = "" if not counts else f", n = {counts[0]}" if len(counts) == 1 else f", n = {counts[0]}-{counts[-1]}"
        level = "/".join(f"{100 * x:g}%" for x in levels)
        groups.setdefault(f"{level} intervals over {' / '.join(what)}{n}", []).append(f"'{col.header}'")
    parts = [f"{_listed(headers)}: {rest}" for rest, headers in groups.items()]
    return ("Intervals: " + "; ".join(parts) + ".") if parts else ""


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def render(records: Sequence[Record], columns: Sequence[Column]) -> str:
    """The markdown table of ``records`` (one row each, in order) under ``columns``, and the line
    that says what its intervals rest on."""
    body = table([c.header for c in columns], [[c.render(r) for c in columns] for r in records])
    note = intervals_note(records, columns)
    return body + (f"\n\n{note}" if note else "")

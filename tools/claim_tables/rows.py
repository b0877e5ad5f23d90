"""A summary table's rows: a row reads one or more records through the adapter, :func:`row` joins them into
one record (:func:`~claim_tables.readers.common.combined`: each record's metrics under its alias, the statistics
the row states over them), and :func:`render_rows` renders the rows by the one renderer: a cell is the row's
setting of that column (a label, a command, the links to its records) or its text, written from the record's
metrics (:func:`est` prints a value with its interval, :func:`val` the value, :func:`interval` the interval).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from icl_ssm.records import Metric, Record

from .adapt import read
from .base import Records
from .readers.common import combined
from .render import Column, metric_text, render

Cell = Callable[[Record], str]


@dataclass(frozen=True)
class Row:
    """One row of a summary table: its record (:func:`row`) and the text of the columns written from its
    metrics (the others are the record's settings of that name)."""

    record: Record
    cells: dict[str, Cell] = field(default_factory=dict)


def row(records: Records, name: str, sources: dict[str, str], labels: dict[str, str], cells: dict[str, Cell],
        stats: dict[str, tuple[str, list[str]]] | None = None) -> Row:
    """The row ``name``: the records ``sources`` (alias -> record name) read through the adapter and joined
    (their metrics as ``{alias}.X``, ``stats`` computed over them), its ``labels`` as settings."""
    return Row(combined(name, {alias: read(records, n) for alias, n in sources.items()}, stats, labels), cells)


def render_rows(rows: list[Row], headers: list[str]) -> str:
    """The rows under ``headers`` by the one renderer: a cell is the row's text for that column or its setting."""
    cells = {r.record.name: r.cells for r in rows}
    if len(cells) != len(rows):
        raise ValueError("two rows of one table share a name")

    def column(header: str) -> Column:
        def cell(r: Record) -> str:
            text = cells[r.name].get(header)
            return text(r) if text else str(r.config[header])
        return Column(header, cell=cell)

    return render([r.record for r in rows], [column(h) for h in headers])


def est(metric: Metric, spec: str = ".2f") -> str:
    """A metric's value and its interval (``0.55 [0.16, 0.80]``), the value alone where it has none."""
    return metric_text(metric, lambda x: format(x, spec))


def val(metric: Metric, spec: str = ".2f") -> str:
    return format(metric.value, spec)


def interval(metric: Metric, spec: str = ".2f") -> str:
    low, high = metric.interval
    return f"[{format(low, spec)}, {format(high, spec)}]"

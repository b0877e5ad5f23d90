"""What every table shares: the records' folder, the reader a renderer is handed, and how numbers print.

:class:`Records` is the face of ``tools/claims.py``'s reader (it reads a record under :data:`RESULTS` by
name, checks its provenance and notes that the table read it), so that no renderer imports the entry point.
Beside it: numbers as the tables print them (:func:`pct`, :func:`p_text`), the markdown table (:func:`table`;
the summary tables' columns :data:`BENCH` and their record column :func:`cite`), the sample sd, the paired t-test
and Spearman-Brown, and the two stand-ins for a table whose records are not stored (:func:`no_record_yet`,
:func:`pending`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from scipy.stats import ttest_1samp

RESULTS = "docs/results"


class Records(Protocol):
    """What a renderer is handed: ``tools/claims.py``'s ``Records``, which reads a record under
    ``root/docs/results`` by name, checks its provenance and remembers that the table read it."""

    root: Path

    def __call__(self, name: str) -> dict: ...

    def glob(self, pattern: str) -> list[tuple[str, dict]]: ...

    def link(self, name: str, depth: int = 0) -> str: ...


def pct(x: float, digits: int = 1) -> str:
    """A share in %, ``digits`` decimals: ``65.2``."""
    return f"{100 * x:.{digits}f}"


def sd(values: list[float]) -> float:
    """Sample standard deviation (n - 1), 0 for one value."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table of ``rows`` (cells as printed) under ``header``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def paired_p(diffs: list[float]) -> float:
    """Two-sided p-value of a paired t-test, given the per-pair differences."""
    return float(ttest_1samp(diffs, 0.0).pvalue)


def p_text(p: float) -> str:
    """A p-value as the tables print it: two decimals, one significant digit below 0.01 (``2e-4``)."""
    if p >= 0.01:
        return f"{p:.2f}"
    mantissa, exponent = f"{p:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def spearman_brown(r: float, factor: float) -> float:
    """The reliability ``r`` of a measure predicted for ``factor`` times as many items."""
    return factor * r / (1 + (factor - 1) * r)


BENCH = ["measure", "command", "machine", "measured", "goal", "record"]


def cite(records: Records, pages: str, *names: str) -> str:
    """The record column: the research pages, then a link to every record the row reads."""
    return ", ".join([pages, *(records.link(n) for n in names)])


def no_record_yet(how: str) -> Callable[[Records], str]:
    """A section none of whose rows is stored as a record yet: the line saying so (its rows follow as prose)."""
    def line(records: Records) -> str:
        return f"No measurement of this section is stored as a record under docs/results/ yet; the rows below {how}."
    return line


def pending(render: Callable[[Records], str], *names: str) -> Callable[[Records], str]:
    """``render``, or where one of its records ``names`` is not stored yet, a line saying so (a
    table waiting for its measurement, not a failure)."""
    def table_or_note(records: Records) -> str:
        absent = [n for n in names if not (records.root / RESULTS / n).is_file()]
        if absent:
            return "Not measured yet: " + ", ".join(f"`{RESULTS}/{n}`" for n in absent) + " not stored."
        return render(records)
    return table_or_note

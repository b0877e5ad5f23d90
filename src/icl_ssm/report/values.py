"""Reading a run's result dict: where each value is (the handed-over prompt, the test size, the
methods, zero-shot, a stage's title) and how a value reads in the report ("—" when it is
missing, FLOPs with their SI prefix, an accuracy with its Wilson interval, rows of cells as a
markdown table)."""

from __future__ import annotations

import math
from typing import Any

from icl_ssm.evaluate.stats import wilson_interval

DASH = "—"
NOT_COUNTED = "n/a"
ZERO_SHOT = "zero-shot"  # the stage name of the prompt without demonstrations (select.check.ZERO_SHOT)

_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def format_flops(n: int | float | None) -> str:
    """``1234 -> "1.23 kFLOP"``, ``3.2e12 -> "3.20 TFLOP"``, ``None -> "—"``."""
    if not _is_num(n) or not math.isfinite(n):
        return DASH
    x, i = float(n), 0
    while abs(x) >= 999.995 and i < len(_PREFIXES) - 1:  # so that 999_999 reads "1.00 MFLOP"
        x, i = x / 1000, i + 1
    if i == 0:
        return f"{x:.0f} FLOP" if x == int(x) else f"{x:.2f} FLOP"
    return f"{x:.2f} {_PREFIXES[i]}FLOP"


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _fmt(x: Any, spec: str = ".3f") -> str:
    return f"{x:{spec}}" if _is_num(x) else DASH


def _cell(x: Any) -> str:
    return DASH if x is None else str(x).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: the header, its rule and one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _flops_counted(row: dict) -> bool:
    """Whether ``row["flops"]`` is a count: a method that scored prompts on the model (``subsets``)
    but reports 0 FLOPs did not count them (the search); 0 for one that ran no model is a count."""
    flops = row.get("flops")
    return _is_num(flops) and not (flops == 0 and row.get("subsets"))


def _wilson(acc: Any, n: Any) -> tuple[float, float] | None:
    """The Wilson 95% interval of an accuracy over ``n`` examples; None when either is unknown."""
    if not (_is_num(acc) and isinstance(n, int) and n > 0 and 0 <= acc <= 1):
        return None
    return wilson_interval(round(acc * n), n)


def _acc_ci(acc: Any, n: Any) -> str:
    """``0.733 [0.66, 0.80]``: an accuracy over ``n`` examples with its Wilson 95% interval."""
    ci = _wilson(acc, n)
    return _fmt(acc) if ci is None else f"{acc:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def _title(report: dict, name: str | None) -> str:
    """A stage name as the report shows it: the method's title, ``random prompt #i``, zero-shot."""
    titles = {s.get("name"): s.get("method") for s in report.get("selections") or [] if s.get("name")}
    if name in titles and titles[name]:
        return str(titles[name])
    if name == ZERO_SHOT:
        return "zero-shot (no demonstrations)"
    if isinstance(name, str) and name.startswith("random-") and name[7:].isdigit():
        return f"random prompt #{name[7:]}"
    return _cell(name)


def _handed(report: dict) -> dict:
    """What was handed over (the check's record when it ran, else the pipeline's)."""
    check = report.get("check") or {}
    return check.get("handed_over") or report.get("handed_over") or {}


def _test_accuracy(report: dict, name: str | None) -> Any:
    if name == ZERO_SHOT:
        return (report.get("check") or {}).get("zero_shot_test_accuracy")
    if isinstance(name, str) and name.startswith("random-") and name[7:].isdigit():
        randoms = (report.get("check") or {}).get("random") or []
        i = int(name[7:])
        return randoms[i].get("test_accuracy") if i < len(randoms) else None
    return next((s.get("test_accuracy") for s in report.get("selections") or [] if s.get("name") == name), None)


def _test_size(report: dict) -> Any:
    size = (report.get("check") or {}).get("test_size")
    return size if size is not None else next((s["test_size"] for s in report.get("selections") or []
                                               if isinstance(s.get("test_size"), int)), None)


def _methods(report: dict) -> list[dict]:
    """The selection rows that are methods (zero-shot, the reference, left out)."""
    return [s for s in report.get("selections") or [] if s.get("name") != ZERO_SHOT and s.get("method") != ZERO_SHOT]


def _zero_shot(report: dict) -> Any:
    zero = (report.get("check") or {}).get("zero_shot_test_accuracy")
    if _is_num(zero):
        return zero
    return next((s.get("test_accuracy") for s in report.get("selections") or []
                 if s.get("name") == ZERO_SHOT or s.get("method") == ZERO_SHOT), None)

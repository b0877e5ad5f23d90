"""The one adapter from the records stored before the record schema (:mod:`icl_ssm.records`) to it.

:func:`as_record` returns a :class:`~icl_ssm.records.Record` for a record of the schema (read as it is)
or of a family listed in :data:`FAMILIES` (its folder under ``docs/results/``), whose statistics it takes
from the stored record and names: each metric's value, its interval and what the interval resamples, the
count it rests on. A record of any other family is refused, naming it; a family joins by adding its
reader here, and its table then renders through :func:`claim_tables.render.render`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from icl_ssm.records import SCHEMA, Metric, Record

# what a stored bootstrap's "resampled" meant, in the words a table prints
RESAMPLED = {"rows": "test examples", "examples": "test examples", "subsets": "subsets",
             "subsets and queries": "subsets and queries", "runs": "runs"}


def _difference(stats: dict | None, unit: str = "accuracy difference", resampled: str = "rows") -> Metric:
    """A stored paired difference ``{"mean", "ci95", "resampled", "n"}`` as a metric; ``resampled``:
    what the family's bootstraps resampled where the record does not say (a trust run's: test examples)."""
    if not stats or stats.get("mean") is None:
        return Metric(None, unit=unit)
    interval = stats.get("ci95")
    what = stats.get("resampled", resampled)
    return Metric(stats["mean"], None if interval is None else tuple(interval), stats.get("n"),
                  RESAMPLED.get(what, what) if interval is not None else None, unit, stats.get("level", 0.95))


def _accuracy(value: float | None, n: int | None) -> Metric:
    return Metric(value, n=n, unit="accuracy")


def _prompts(block: dict | None, n: int | None, kind: str) -> dict[str, Metric]:
    """A run's random prompts of one ``kind`` (16, their test accuracies): the median, and how many of
    them the handed-over prompt is at or above in correct test answers (a tie is at)."""
    block = block or {}
    count = block.get("count")
    return {f"{kind}_median": _accuracy(block.get("median"), n),
            f"{kind}_at_or_above": Metric(block.get("at_or_above"), n=count, unit="random prompts (of n)"),
            f"{kind}_vs_median": _difference(block.get("vs_median_prompt"))}


def trust_run(raw: dict[str, Any], name: str) -> Record:
    """One run of ``bench trust`` (``docs/results/trust*/``)."""
    n = raw.get("test_size")
    room = raw.get("headroom") or {}
    metrics = {
        "handed": _accuracy(raw.get("handed_test_accuracy"), n),
        "handed_raw": _accuracy(raw.get("handed_raw_test_accuracy"), n),
        "zero_shot": _accuracy(raw.get("zero_shot_test_accuracy"), n),
        "calibrated_zero_shot": _accuracy(raw.get("calibrated_zero_shot_test_accuracy"), n),
        "vs_calibrated_zero_shot": _difference(raw.get("vs_calibrated_zero_shot")),
        "searched": Metric(None if not room else float(bool(room.get("search"))), unit="yes (1) or no (0)"),
        "headroom_reliability": Metric(room.get("reliability"), unit="split-half reliability (Spearman-Brown)"),
    }
    for kind in ("plain", "balanced", "calibrated_plain", "calibrated_balanced"):
        metrics.update(_prompts(raw.get(kind), n, kind))
    provenance = dict(raw.get("stages_made_by") or {})
    if raw.get("scored_on_test_by"):
        provenance["test scoring"] = raw["scored_on_test_by"]
    config = {"task": raw.get("task"), "seed": raw.get("seed"), "k": raw.get("k"), "test_size": n,
              "command": raw.get("command"), "run": raw.get("config") or {}}
    return Record(provenance or {"process": raw.get("environment")}, config, metrics,
                  {"test": list(raw.get("test_ids") or [])}, name)


FAMILIES: dict[str, Callable[[dict[str, Any], str], Record]] = {
    "trust-calibrated": trust_run,
}


def as_record(name: str, raw: dict[str, Any]) -> Record:
    """``raw`` (the JSON stored at ``docs/results/<name>``) as a :class:`Record`."""
    if raw.get("schema") == SCHEMA:
        return Record.from_dict(raw, name)
    family = name.split("/")[0] if "/" in name else ""
    if family not in FAMILIES:
        raise ValueError(f"record {name!r}: neither of the record schema ({SCHEMA}) nor of a family the adapter "
                         f"reads ({', '.join(FAMILIES)}); add its reader to tools/claim_tables/adapt.py")
    return FAMILIES[family](raw, name)

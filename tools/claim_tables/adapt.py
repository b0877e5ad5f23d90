"""The one adapter from the records stored before the record schema (:mod:`icl_ssm.records`) to it.

:func:`as_record` returns a :class:`~icl_ssm.records.Record` for a record of the schema (read as it is)
or of a family listed in :data:`FAMILIES`, whose statistics it takes from the stored record and names:
each metric's value, its interval and what the interval resamples, the count it rests on. A family is
named by the start of its records' names under ``docs/results/``; a record of any other family is
refused, naming it. A family joins by adding its reader here, and its tables then render through
:func:`claim_tables.render.render`.
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


def calibration_headroom(raw: dict[str, Any], name: str) -> Record:
    """One task's ``bench headroom --calibrations`` (``docs/results/*/headroom-*``): per calibration
    ``m``, its random prompts' test accuracies (``m.median``, ``m.sd``, ``m.min``, ``m.max``), how well
    validation ranks them (``m.spearman``, ``m.split_half``), the prompt best on validation over the
    median (``m.best_minus_median``, over test examples) and zero-shot (``m.zero_shot``); the dense
    pass's cost per prompt where recorded (``dense_seconds``, ``prompt_tokens``)."""
    tasks = raw.get("tasks") or {}
    if len(tasks) != 1:
        raise ValueError(f"record {name!r}: the adapter reads a headroom record of one task; it holds {len(tasks)}")
    [(task, t)] = tasks.items()
    cfg = raw.get("config") or {}
    n, prompts = len(t.get("test_ids") or []) or cfg.get("test_size"), cfg.get("prompts")
    metrics: dict[str, Metric] = {}
    for m, s in (t.get("summary") or {}).items():
        metrics |= {f"{m}.median": _accuracy(s.get("median"), n), f"{m}.sd": Metric(s.get("std"), n=prompts),
                    f"{m}.min": _accuracy(s.get("min"), n), f"{m}.max": _accuracy(s.get("max"), n),
                    f"{m}.spearman": Metric(s.get("validation_test_spearman"), n=prompts, unit="spearman"),
                    f"{m}.split_half": Metric(s.get("validation_split_half"), n=cfg.get("validation"),
                                              unit="spearman"),
                    f"{m}.best_minus_median": _difference(s.get("best_minus_median")),
                    f"{m}.zero_shot": _accuracy(s.get("zero_shot"), n)}
    cost = t.get("dense_pass") or {}
    metrics |= {"dense_seconds": Metric(cost.get("median_seconds"), n=prompts, unit="seconds per prompt"),
                "prompt_tokens": Metric(cost.get("median_prompt_tokens"), n=prompts, unit="tokens")}
    return Record({"process": raw.get("provenance")}, {"task": task, **cfg}, metrics,
                  {"validation": list(t.get("validation_ids") or []), "test": list(t.get("test_ids") or [])}, name)


# a family: the start of its records' names under docs/results/
FAMILIES: dict[str, Callable[[dict[str, Any], str], Record]] = {
    "trust-calibrated/": trust_run,
    "calibration/headroom-": calibration_headroom,
    "fair-trial/headroom-": calibration_headroom,
}


def as_record(name: str, raw: dict[str, Any]) -> Record:
    """``raw`` (the JSON stored at ``docs/results/<name>``) as a :class:`Record`."""
    if raw.get("schema") == SCHEMA:
        return Record.from_dict(raw, name)
    family = next((start for start in FAMILIES if name.startswith(start)), None)
    if family is None:
        raise ValueError(f"record {name!r}: neither of the record schema ({SCHEMA}) nor of a family the adapter "
                         f"reads ({', '.join(FAMILIES)}); add its reader to tools/claim_tables/adapt.py")
    return FAMILIES[family](raw, name)

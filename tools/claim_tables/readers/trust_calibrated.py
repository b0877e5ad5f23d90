"""The calibrated trust evaluation's runs (``docs/results/trust-calibrated/``): one record per run."""

from __future__ import annotations

from typing import Any

from icl_ssm.records import Metric, Record

from .common import accuracy, difference


def _prompts(block: dict | None, n: int | None, kind: str) -> dict[str, Metric]:
    """A run's random prompts of one ``kind`` (16, their test accuracies): the median, and how many of
    them the handed-over prompt is at or above in correct test answers (a tie is at)."""
    block = block or {}
    count = block.get("count")
    return {f"{kind}_median": accuracy(block.get("median"), n),
            f"{kind}_at_or_above": Metric(block.get("at_or_above"), n=count, unit="random prompts (of n)"),
            f"{kind}_vs_median": difference(block.get("vs_median_prompt"))}


def trust_run(raw: dict[str, Any], name: str) -> Record:
    """One run of ``bench trust`` (``docs/results/trust*/``)."""
    n = raw.get("test_size")
    room = raw.get("headroom") or {}
    metrics = {
        "handed": accuracy(raw.get("handed_test_accuracy"), n),
        "handed_raw": accuracy(raw.get("handed_raw_test_accuracy"), n),
        "zero_shot": accuracy(raw.get("zero_shot_test_accuracy"), n),
        "calibrated_zero_shot": accuracy(raw.get("calibrated_zero_shot_test_accuracy"), n),
        "vs_calibrated_zero_shot": difference(raw.get("vs_calibrated_zero_shot")),
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


FAMILIES = {"trust-calibrated/": trust_run}

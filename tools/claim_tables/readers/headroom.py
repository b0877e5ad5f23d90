"""One task's ``bench headroom --calibrations`` record (``calibration/headroom-*``, ``fair-trial/headroom-*``)."""

from __future__ import annotations

from typing import Any

from icl_ssm.records import Metric, Record

from .common import accuracy, difference


def calibration_headroom(raw: dict[str, Any], name: str) -> Record:
    """One task's ``bench headroom --calibrations`` (``docs/results/*/headroom-*``): per calibration
    ``m``, its random prompts' test accuracies (``m.median``, ``m.sd``, ``m.min``, ``m.max``), how well
    validation ranks them (``m.spearman``, ``m.split_half``), the prompt best on validation over the
    median (``m.best_minus_median``, over test examples) and its test accuracy (``m.best_test``), zero-shot
    (``m.zero_shot``); the dense
    pass's cost per prompt where recorded (``dense_seconds``, ``prompt_tokens``)."""
    tasks = raw.get("tasks") or {}
    if len(tasks) != 1:
        raise ValueError(f"record {name!r}: the adapter reads a headroom record of one task; it holds {len(tasks)}")
    [(task, t)] = tasks.items()
    cfg = raw.get("config") or {}
    n, prompts = len(t.get("test_ids") or []) or cfg.get("test_size"), cfg.get("prompts")
    metrics: dict[str, Metric] = {}
    for m, s in (t.get("summary") or {}).items():
        metrics |= {f"{m}.median": accuracy(s.get("median"), n), f"{m}.sd": Metric(s.get("std"), n=prompts),
                    f"{m}.min": accuracy(s.get("min"), n), f"{m}.max": accuracy(s.get("max"), n),
                    f"{m}.spearman": Metric(s.get("validation_test_spearman"), n=prompts, unit="spearman"),
                    f"{m}.split_half": Metric(s.get("validation_split_half"), n=cfg.get("validation"),
                                              unit="spearman"),
                    f"{m}.best_minus_median": difference(s.get("best_minus_median")),
                    f"{m}.zero_shot": accuracy(s.get("zero_shot"), n),
                    f"{m}.best_test": accuracy(s.get("best_on_validation_test"), n)}
    cost = t.get("dense_pass") or {}
    metrics |= {"dense_seconds": Metric(cost.get("median_seconds"), n=prompts, unit="seconds per prompt"),
                "prompt_tokens": Metric(cost.get("median_prompt_tokens"), n=prompts, unit="tokens")}
    return Record({"process": raw.get("provenance")}, {"task": task, **cfg}, metrics,
                  {"validation": list(t.get("validation_ids") or []), "test": list(t.get("test_ids") or [])}, name)


FAMILIES = {"calibration/headroom-": calibration_headroom, "fair-trial/headroom-": calibration_headroom}

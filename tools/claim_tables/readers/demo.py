"""The cold runs of ``make demo`` from a fresh clone (``docs/results/demo-cold-*.json``, written by
``tools/time_demo.sh``), and the runs at the newest commit among them as one record (:func:`newest_runs`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icl_ssm.records import Metric, Record

SECONDS, MINUTES = "seconds", "minutes"


def demo_cold(raw: dict[str, Any], name: str) -> Record:
    """One cold run (``demo-cold-*``): its times (``install_seconds``, ``demo_seconds``, ``total_seconds``), the
    handed-over prompt's test accuracy (``handed``; ``handed_raw`` before its calibration, where stored; n: the test
    examples where the record says), the prompt search's budget and wall time (``search_budget_seconds``,
    ``search_wall_seconds``; None where no search ran). Config: ``commit``, ``date``, ``handed_over``,
    ``calibration``, ``screen``, ``verdict``: what the shipped compressor's fidelity verdict did (``dense``: failed
    it, the search ran without a screen; ``compressed``: passed it; ``unused``: no method read it); a record from
    before ``time_demo.sh`` stored the verdict is read from its search (no screen: the verdict failed)."""
    search = raw.get("search") or {}
    n = (raw.get("calibrated") or {}).get("test_size")
    verdict = ("unused" if raw.get("compressor_source") == "unused" else
               raw.get("fidelity_verdict") or ("dense" if search.get("screen") in ("none", None) else "compressed"))
    metrics = {f"{part}_seconds": Metric(raw.get(f"{part}_seconds"), unit=SECONDS)
               for part in ("install", "demo", "total")}
    metrics |= {"handed": Metric(raw.get("handed_test_accuracy"), n=n, unit="accuracy"),
                "handed_raw": Metric(raw.get("handed_raw_test_accuracy"), n=n, unit="accuracy"),
                "search_budget_seconds": Metric(search.get("budget_seconds"), unit=SECONDS),
                "search_wall_seconds": Metric(search.get("wall_seconds"), unit=SECONDS)}
    provenance = raw.get("provenance") or {}
    config = {"commit": provenance.get("commit"), "date": provenance.get("date"),
              "handed_over": raw.get("handed_over"), "calibration": raw.get("calibration"),
              "screen": search.get("screen"), "verdict": verdict,
              "selections": raw.get("selections"), "handed_indices": raw.get("handed_indices")}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def same_selection(before: Record, after: Record) -> Record:
    """Whether two cold runs chose the same prompts: per method of ``before`` (and ``handed``, the prompt handed
    over) ``<method>.same`` 1 where ``after`` chose the same pool indices in the same order, else 0, and
    ``<method>.size`` the prompt's length in ``before``. Config: both runs' ``commit`` and ``handed_over``, the
    ``methods`` compared. Refuses a run that stored no selections (a record from before ``time_demo.sh`` kept them)."""
    for r in (before, after):
        if not r.config.get("selections"):
            raise ValueError(f"record {r.name!r} stores no selections; rerun it with today's tools/time_demo.sh")
    chosen = {"handed": (before.config["handed_indices"], after.config["handed_indices"])}
    chosen |= {m: (ix, after.config["selections"].get(m)) for m, ix in before.config["selections"].items()}
    metrics = {}
    for m, (a, b) in chosen.items():
        metrics[f"{m}.same"] = Metric(float(a == b), unit="yes (1) or no (0)")
        metrics[f"{m}.size"] = Metric(None if a is None else len(a), unit="demonstrations")
    config = {"before": before.config["commit"], "after": after.config["commit"], "methods": list(chosen),
              "handed_over": (before.config["handed_over"], after.config["handed_over"])}
    return Record({before.name: before.provenance.get("process"), after.name: after.provenance.get("process")},
                  config, metrics, {}, f"{before.name} vs {after.name}")


def newest_runs(runs: Sequence[Record]) -> Record:
    """The :func:`demo_cold` runs made at the newest commit among ``runs`` (given in date order: the last run's
    commit) as one record: how many (``runs``, of ``stored``), their total times' range (``total_low``,
    ``total_high``, in minutes) and its width (``spread_seconds``). Config: ``commit``, ``names`` (theirs)."""
    latest = runs[-1].config["commit"] if runs else None
    same = [r for r in runs if r.config["commit"] == latest]
    totals = [r["total_seconds"].value / 60 for r in same]
    low, high = (min(totals), max(totals)) if totals else (None, None)
    metrics = {"runs": Metric(len(same), unit="count"), "stored": Metric(len(runs), unit="count"),
               "total_low": Metric(low, n=len(same), unit=MINUTES),
               "total_high": Metric(high, n=len(same), unit=MINUTES),
               "spread_seconds": Metric(None if low is None else 60 * (high - low), n=len(same), unit=SECONDS)}
    provenance = {r.name: r.provenance.get("process") for r in same} or {"none": None}
    return Record(provenance, {"commit": latest, "names": [r.name for r in same]}, metrics, {}, "demo-cold-*")


FAMILIES = {"demo-cold-": demo_cold}

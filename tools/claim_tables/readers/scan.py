"""The state space scan's benchmarks: ``icl-ssm bench scan --json`` (``scan-cpu``), ``icl-ssm bench legs-kernel``
(``legs-kernel-``) and the Legendre spectrum of the dense cache (``icl-ssm bench legendre``, ``legendre-``)."""

from __future__ import annotations

from typing import Any

from icl_ssm.records import Metric, Record


def _machine(raw: dict[str, Any]) -> dict[str, Any]:
    return {"command": raw.get("command"), "threads": (raw.get("machine") or {}).get("threads")}


def scan(raw: dict[str, Any], name: str) -> Record:
    """``icl-ssm bench scan --json``: at the target size (config ``T``, ``N``), per batch (``batch_1``,
    ``batch_8``) the ratios of the best-of-repeats seconds ``fast_over_projection`` (the fast scan over the bare
    projection GEMM), ``reference_over_fast`` and ``paper_over_fast``; ``fast.max_rel_diff``: the largest
    relative difference of the fast scan from the reference over every shape measured (n = shapes), and
    ``fast.shapes``, their count."""
    targets = raw["targets"]
    metrics = {f"{batch}.{key}": Metric(value, unit="ratio of seconds")
               for batch in ("batch_1", "batch_8") for key, value in targets[batch].items()}
    fast = [row for row in raw["rows"] if row["impl"] == "fast"]
    metrics |= {"fast.max_rel_diff": Metric(max(row["max_rel_diff"] for row in fast), n=len(fast),
                                            unit="relative difference (float32)"),
                "fast.shapes": Metric(len(fast), unit="count")}
    return Record({"process": raw.get("provenance")}, _machine(raw) | {"T": targets["T"], "N": targets["N"]},
                  metrics, {}, name)


def legs_kernel(raw: dict[str, Any], name: str) -> Record:
    """``icl-ssm bench legs-kernel``: the slab builder of the scale-invariant LegS kernel against the reference
    builder, ``speedup`` (reference seconds over slab seconds) and ``max_rel_diff`` (their largest relative
    difference); config ``T``, ``N``."""
    metrics = {"speedup": Metric(raw["speedup"], unit="ratio of seconds"),
               "max_rel_diff": Metric(raw["max_rel_diff"], unit="relative difference")}
    return Record({"process": raw.get("provenance")}, _machine(raw) | {"T": raw["T"], "N": raw["N"]}, metrics,
                  {}, name)


def legendre(raw: dict[str, Any], name: str) -> Record:
    """``icl-ssm bench legendre``: per kind (``keys``, ``values``), the share of the dense cache's energy its
    first n Legendre coefficients hold, lowest and highest over the layer groups (n = groups), at n = 1
    (``keys.first_min``, ``keys.first_max``) and at n = the degrees measured (``keys.all_min``,
    ``keys.all_max``; config ``degrees``)."""
    groups, last = raw["groups"], raw["degrees"]
    metrics = {}
    for kind in ("keys", "values"):
        for at, n in (("first", 1), ("all", last)):
            shares = [g[kind][n - 1] for g in groups]
            metrics |= {f"{kind}.{at}_min": Metric(min(shares), n=len(groups), unit="share of the energy"),
                        f"{kind}.{at}_max": Metric(max(shares), n=len(groups), unit="share of the energy")}
    provenance = raw.get("provenance") or {}
    config = {k: raw.get(k) for k in ("model", "task", "k", "prompts", "degrees")}
    return Record({"process": provenance}, config | {"groups": len(groups), "command": provenance.get("command"),
                                                     "machine": provenance.get("machine")}, metrics, {}, name)


FAMILIES = {"scan-cpu": scan, "legs-kernel-": legs_kernel, "legendre-": legendre}

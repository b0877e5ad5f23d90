"""The synthetic in-context regression study's records (``docs/results/synthetic-*.json``), one reader per layout.

``icl-ssm synthetic select`` (test MSE per k, method and seed), ``synthetic fidelity`` (one k, or one per k under
``k20``, ``k40``, ...), ``synthetic probe`` (the flipped-target probe) and ``synthetic evaluate`` (the teacher
against least squares, ridge and zero per k): :func:`synthetic_record` tells them apart by what they hold.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from icl_ssm.records import Metric, Record

from ..base import sd

METHODS = ("random", "topk", "affinity-dense", "affinity-compressed")
WITHIN = 0.10  # "compressed close to dense": its mean test MSE at most 10% above the dense evaluator's
MARGIN = 0.05  # "compressed below a baseline": by more than this (about one standard error of a mean over 5 seeds)
PATHS = ("compressed", "window", "control")


def synthetic_mse(record: dict) -> dict[tuple[int, str], list[float]]:
    """Per ``(k, method)`` of a ``synthetic select`` record, the test MSE of each seed (seeds in order)."""
    out = defaultdict(list)
    for r in sorted(record["rows"], key=lambda r: (r["k"], r["seed"])):
        for method in METHODS:
            out[r["k"], method].append(r[method]["mse"])
    return dict(out)


def from_k(ks: list[int], holds: Callable[[int], bool]) -> int | None:
    """The smallest k from which ``holds`` is true at every larger k measured (None if not at the largest)."""
    first = None
    for k in sorted(ks, reverse=True):
        if not holds(k):
            break
        first = k
    return first


def select_record(raw: dict[str, Any], name: str) -> Record:
    """A ``synthetic select`` record: per k and method (``k20.topk.mse``), the mean test MSE over the seeds
    (``mse``, n = seeds), its sample sd over the seeds (``mse_sd``) and the mean D1 share of the pick
    (``d1_share``); per k, the compressed evaluator's MSE over the dense one's minus 1 (``gap``, a share) and
    top-k's mean MSE minus the dense evaluator's (``topk_minus_dense``); over the ks, the smallest k from which
    at every larger k both affinity evaluators are below random and top-k (``below_from``), compressed is within
    :data:`WITHIN` of dense (``close_from``, with the largest ``gap`` from there on, ``close_gap_max``), and
    compressed is more than :data:`MARGIN` below random / top-k (``below_random_from``, ``below_topk_from``);
    None where it does not hold at the largest k. ``pool_d1_share``: the pool's share of D1 examples. No
    intervals: the spread over seeds is the sd."""
    per_seed = synthetic_mse(raw)
    acc = {key: statistics.fmean(v) for key, v in per_seed.items()}
    ks = sorted({k for k, _ in acc})
    metrics: dict[str, Metric] = {"pool_d1_share": Metric(raw.get("d1_share"), unit="share")}
    for k in ks:
        seeds = [r for r in raw["rows"] if r["k"] == k]
        for method in METHODS:
            values = per_seed[k, method]
            metrics[f"k{k}.{method}.mse"] = Metric(acc[k, method], n=len(values), unit="test MSE")
            metrics[f"k{k}.{method}.mse_sd"] = Metric(sd(values), n=len(values), unit="test MSE (sd over seeds)")
            metrics[f"k{k}.{method}.d1_share"] = Metric(statistics.fmean(r[method]["d1_share"] for r in seeds),
                                                        n=len(seeds), unit="share")
        metrics[f"k{k}.gap"] = Metric(acc[k, "affinity-compressed"] / acc[k, "affinity-dense"] - 1,
                                      n=len(per_seed[k, "random"]), unit="share (compressed over dense, minus 1)")
        metrics[f"k{k}.topk_minus_dense"] = Metric(acc[k, "topk"] - acc[k, "affinity-dense"], unit="test MSE")
    gap = {k: metrics[f"k{k}.gap"].value for k in ks}
    below = from_k(ks, lambda k: max(acc[k, "affinity-dense"], acc[k, "affinity-compressed"])
                   < min(acc[k, "random"], acc[k, "topk"]))
    close = from_k(ks, lambda k: gap[k] <= WITHIN)
    metrics |= {
        "below_from": Metric(below, unit="k"), "close_from": Metric(close, unit="k"),
        "close_gap_max": Metric(None if close is None else max(gap[k] for k in ks if k >= close), unit="share"),
        **{f"below_{b}_from": Metric(from_k(ks, lambda k, b=b: acc[k, b] - acc[k, "affinity-compressed"] > MARGIN),
                                     unit="k") for b in ("random", "topk")}}
    config = {key: raw.get(key) for key in ("teacher", "compressor", "task", "pool_size", "queries", "test_size",
                                            "subsets", "estimator")}
    return Record({"process": raw.get("provenance")}, {**config, "ks": ks, "within": WITHIN, "margin": MARGIN},
                  metrics, {}, name)


def _fidelity_metrics(run: dict[str, Any], prefix: str = "") -> dict[str, Metric]:
    """One k of a ``synthetic fidelity`` record (module docstring of :func:`fidelity_record`)."""
    n = run.get("subsets")
    metrics: dict[str, Metric] = {}
    for path in (*PATHS, "dense"):
        p = run.get(path)
        if p is None:
            continue
        if "spearman" in p:
            interval = p.get("ci95")
            metrics[f"{prefix}{path}.spearman"] = Metric(p["spearman"], None if interval is None else tuple(interval),
                                                         n, "subsets" if interval is not None else None, "spearman")
        for key in ("mean_loss", "mean_relative_loss_error"):
            if key in p:
                metrics[f"{prefix}{path}.{key}"] = Metric(p[key], n=n, unit="loss" if key == "mean_loss" else "share")
        for key in ("flops_per_subset", "cache_flops_per_subset"):
            if key in p:
                metrics[f"{prefix}{path}.{key}"] = Metric(p[key], unit="FLOPs")
    for pair, d in (run.get("paired") or {}).items():
        a, b = pair.split("-", 1)
        for key, what, suffix in (("ci95", "subsets", ""), ("ci95_queries", "subsets and queries", "_over_queries")):
            interval = d.get(key)
            metrics[f"{prefix}{a}_minus_{b}{suffix}"] = Metric(
                d.get("diff"), None if interval is None else tuple(interval), n,
                what if interval is not None else None, "spearman difference")
    for key in ("flop_ratio", "cache_flop_ratio"):
        metrics[f"{prefix}{key}"] = Metric(run.get(key), unit="ratio (dense over compressed)")
    return metrics


def fidelity_record(raw: dict[str, Any], name: str) -> Record:
    """A ``synthetic fidelity`` record: per path (``compressed``, ``window``, ``control``) its subset-loss
    Spearman with dense (``compressed.spearman``, interval over the held-out subsets, n = subsets), mean loss
    and relative loss error; per path and ``dense``, FLOPs per subset of the whole evaluation and of the cache
    alone; each stored paired difference of Spearman (``compressed_minus_control``, interval over
    subsets; ``..._over_queries``, over subsets and queries); the dense-over-compressed FLOP ratios (``flop_ratio``,
    ``cache_flop_ratio``). A record of several ks holds these per k (``k20.compressed.spearman``, read a k with
    ``record.part("k20")``) and, over its ks, the smallest and largest compressed and control Spearman and
    compressed-minus-control difference (``compressed_spearman_min``, ``..._max``, ``control_spearman_min``,
    ``compressed_minus_control_min``, ...)."""
    keys = [key for key in raw if key.startswith("k") and key[1:].isdigit() and isinstance(raw[key], dict)]
    if not keys:
        config = {key: raw.get(key) for key in ("k", "subsets", "queries", "seed", "cache_slots", "prompt_tokens")}
        return Record({"process": raw.get("provenance")}, config, _fidelity_metrics(raw), {}, name)
    runs = sorted((raw[key] for key in keys), key=lambda r: r["k"])
    metrics: dict[str, Metric] = {}
    for run in runs:
        metrics |= _fidelity_metrics(run, f"k{run['k']}.")
    over = {"compressed_spearman": [r["compressed"]["spearman"] for r in runs],
            "control_spearman": [r["control"]["spearman"] for r in runs if "control" in r],
            "compressed_minus_control": [r["paired"]["compressed-control"]["diff"] for r in runs
                                         if "compressed-control" in (r.get("paired") or {})]}
    for key, values in over.items():
        unit = "spearman difference" if "minus" in key else "spearman"
        metrics[f"{key}_min"] = Metric(min(values) if values else None, n=len(values), unit=unit)
        metrics[f"{key}_max"] = Metric(max(values) if values else None, n=len(values), unit=unit)
    first = runs[0]
    config = {"ks": [r["k"] for r in runs], **{key: first.get(key) for key in ("subsets", "queries", "seed")}}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def probe_record(raw: dict[str, Any], name: str) -> Record:
    """A ``synthetic probe`` record: per path (``dense``, ``compressed``) the mean loss with the right targets
    (``right``) and with another cluster's (``flipped``), the mean rise (``rise``, interval over the pairs,
    n = pairs) and the share of pairs whose loss rose (``higher_share``); ``state_separability``: held-out
    accuracy of a linear read-out telling the two versions apart from the SSM state (Wilson interval over
    the held-out predictions, two per pair)."""
    n = raw.get("pairs")
    metrics: dict[str, Metric] = {}
    for path in ("dense", "compressed"):
        p = raw.get(path) or {}
        interval = p.get("ci95")
        metrics |= {f"{path}.right": Metric(p.get("right"), n=n, unit="loss"),
                    f"{path}.flipped": Metric(p.get("flipped"), n=n, unit="loss"),
                    f"{path}.rise": Metric(p.get("diff"), None if interval is None else tuple(interval), n,
                                           "pairs" if interval is not None else None, "loss"),
                    f"{path}.higher_share": Metric(p.get("higher_share"), n=n, unit="share of pairs")}
    sep = raw.get("state_separability")
    if sep:
        pairs = sep.get("pairs")
        metrics["state_separability"] = Metric(sep.get("accuracy"), tuple(sep["ci95"]) if sep.get("ci95") else None,
                                               None if pairs is None else 2 * pairs,
                                               "held-out predictions (Wilson)" if sep.get("ci95") else None,
                                               "accuracy")
    config = {key: raw.get(key) for key in ("k", "pairs", "queries")}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def teacher_record(raw: dict[str, Any], name: str) -> Record:
    """A ``synthetic evaluate`` record: per k of prompt (``k40.teacher``), the mean test MSE over the prompts
    (n = prompts) of the teacher, least squares, ridge and the zero predictor, and each one's standard error
    (``k40.teacher_se``). The mixed-cluster rows are not read."""
    n = raw.get("prompts")
    metrics: dict[str, Metric] = {}
    for row in raw.get("by_k") or []:
        for model in ("teacher", "least_squares", "ridge", "zero"):
            if model in row:
                metrics[f"k{row['k']}.{model}"] = Metric(row[model], n=n, unit="test MSE")
                metrics[f"k{row['k']}.{model}_se"] = Metric(row.get(f"{model}_se"), n=n, unit="test MSE (se)")
    return Record({"process": raw.get("provenance")}, {"prompts": n, "seed": raw.get("seed")}, metrics, {}, name)


def synthetic_record(raw: dict[str, Any], name: str) -> Record:
    """Any ``synthetic-*.json`` record, by its layout: select (``rows``), evaluate (``by_k``), probe
    (``pairs``), fidelity (``paired``, or one per k under ``k20``, ...)."""
    if "rows" in raw:
        return select_record(raw, name)
    if "by_k" in raw:
        return teacher_record(raw, name)
    if "pairs" in raw:
        return probe_record(raw, name)
    if "paired" in raw or any(isinstance(v, dict) and "paired" in v for v in raw.values()):
        return fidelity_record(raw, name)
    raise ValueError(f"record {name!r}: not a synthetic select, evaluate, probe or fidelity record "
                     f"(keys: {', '.join(sorted(raw))})")


FAMILIES = {"synthetic-": synthetic_record}

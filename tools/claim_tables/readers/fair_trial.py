"""The SSM's fair trial (``docs/results/fair-trial/``, docs/research/fair-trial.md): which cheap ranker carries the
subset ranking once the label lean is out. The headroom records (``fair-trial/headroom-*``) are read by
:mod:`.headroom`."""

from __future__ import annotations

from typing import Any

from icl_ssm.records import Metric, Record

from .calibration import spearman

# the rankers, by the short name a table asks for
RANKERS = {"cache: compressed": "compressed", "cache: control": "control", "cache: window": "window",
           "label statistics": "label_statistics", "dense 4+4": "dense_probe", "dense, lean left in": "dense_lean_in"}


# the pairs always present (no value where the record holds none): the pre-registered comparison
PAIRS = (("compressed", "control"),)


def _key(ranker: str) -> str:
    return RANKERS.get(ranker, ranker)


def fair_trial_rankers(raw: dict[str, Any], name: str) -> Record:
    """``research/fair_trial.py``'s record (``fair-trial/rankers-*``): per task (part ``task``; settings ``record``,
    ``k``, ``subsets``, ``target_queries``, ``probe_queries``), each ranker's Spearman with the dense prompt's
    label-balanced loss with the lean removed (``spearman.R``, R a short name of :data:`RANKERS`, always present,
    or the ranker's own name), paired differences ``A_minus_B`` (Spearman A minus Spearman B; those of
    :data:`PAIRS` always present), each with its 95% interval resampling what the record's bootstrap says
    (subsets, and the queries within each label), n the subsets; the target's own split-half Spearman over the
    target queries (``target_split_half``) and its Spearman-Brown reliability (``target_reliability``)."""
    cfg = raw.get("config") or {}
    what = (cfg.get("bootstrap") or {}).get("resampled", "subsets")
    metrics: dict[str, Metric] = {}
    parts: dict[str, dict[str, Any]] = {}
    for r in raw.get("records") or []:
        task, n, queries = r["task"], r.get("subsets"), r.get("queries") or {}
        parts[task] = {"record": r.get("record"), "k": r.get("k"), "subsets": n,
                       "target_queries": queries.get("target"), "probe_queries": queries.get("probe")}
        metrics |= {f"{task}.spearman.{key}": Metric(None, unit="spearman") for key in RANKERS.values()}
        metrics |= {f"{task}.{a}_minus_{b}": Metric(None, unit="spearman difference") for a, b in PAIRS}
        for s in r.get("spearman") or []:
            metrics[f"{task}.spearman.{_key(s['ranker'])}"] = spearman(s.get("spearman"), s.get("ci95"), n, what)
        for p in r.get("paired") or []:
            diff = spearman(p.get("difference"), p.get("ci95"), n, what)
            metrics[f"{task}.{_key(p['ranker'])}_minus_{_key(p['minus'])}"] = Metric(
                diff.value, diff.interval, n, diff.resamples, "spearman difference")
        metrics |= {f"{task}.target_split_half": Metric(r.get("target_split_half"), n=queries.get("target"),
                                                        unit="spearman"),
                    f"{task}.target_reliability": Metric(r.get("target_reliability"), n=queries.get("target"),
                                                         unit="reliability (Spearman-Brown)")}
    return Record({"process": raw.get("provenance")}, {**cfg, "parts": parts}, metrics, {}, name)


# the learned rankers of research/per_demo_ranker.py, by short name
LEARNED = {"per-demonstration encodings": "encodings", "label counts": "label_counts", "both": "both"}


def per_demo_ranker(raw: dict[str, Any], name: str) -> Record:
    """``research/per_demo_ranker.py``'s record (``fair-trial/per-demo-ranker-*``): per task (part ``task``;
    settings ``record``, ``k``, ``subsets``, ``pool``, ``target_queries``), each learned ranker's out-of-fold
    Spearman with the same target as :func:`fair_trial_rankers` (``spearman.R``, R a short name of
    :data:`LEARNED`) and ``encodings_minus_label_counts``, each with its 95% interval over resampled subsets
    (the out-of-fold predictions held fixed), n the subsets."""
    cfg = raw.get("config") or {}
    what = (cfg.get("bootstrap") or {}).get("resampled", "subsets")
    metrics: dict[str, Metric] = {}
    parts: dict[str, dict[str, Any]] = {}
    for r in raw.get("records") or []:
        task, n = r["task"], r.get("subsets")
        parts[task] = {key: r.get(key) for key in ("record", "k", "subsets", "pool", "target_queries")}
        for s in r.get("spearman") or []:
            metrics[f"{task}.spearman.{LEARNED.get(s['ranker'], s['ranker'])}"] = spearman(
                s.get("spearman"), s.get("ci95"), n, what)
        p = r.get("paired") or {}
        diff = spearman(p.get("difference"), p.get("ci95"), n, what)
        metrics[f"{task}.encodings_minus_label_counts"] = Metric(diff.value, diff.interval, n, diff.resamples,
                                                                 "spearman difference")
    return Record({"process": raw.get("provenance")}, {**cfg, "parts": parts}, metrics, {}, name)


FAMILIES = {"fair-trial/rankers-": fair_trial_rankers, "fair-trial/per-demo-ranker-": per_demo_ranker}

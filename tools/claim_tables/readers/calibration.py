"""Calibration's research records (``docs/results/calibration/``, docs/research/calibration.md): the label lean in
the stored subset losses, the pre-registered equal-time experiment, the cache paths' subset ranking with the lean
removed, and Algorithm 2's reliability on the raw and the calibrated target. The headroom records
(``calibration/headroom-*``) are read by :mod:`.headroom`.

A record whose rows are its parts (a stored record per row, an arm, a seed and target) says in ``config["parts"]``
which parts it has, in the stored order, each with its own settings (``{part: {setting: value}}``); a row is
``record.part(part)``.
"""

from __future__ import annotations

from typing import Any

from icl_ssm.records import Metric, Record

from .common import difference


def spearman(value: float | None, interval: list | None, n: int | None, resamples: str | None) -> Metric:
    """A stored Spearman with its stored 95% interval (dropped where either end is missing)."""
    whole = interval is not None and None not in interval
    return Metric(value, tuple(interval) if whole else None, n, resamples if whole else None, "spearman")


# the label-lean record's rankers, by the short name a table asks for; a cache path ("cache path: X") is X
LEAN_RANKERS = {"recency-weighted label count, score^2 (w_i = i/k)": "recency_count2",
                "plain label count, count^2": "count2", "cache path: compressed": "compressed",
                "cache path: control": "control"}


def label_lean(raw: dict[str, Any], name: str) -> Record:
    """``research/label_lean.py``'s record (``calibration/label-lean-*``): per stored subset-loss record ``row``
    (its file name without ``.json``; settings ``record``, ``k``, ``subsets``, ``queries`` and
    ``dense_same_as_or_nested_in``, the record whose dense losses it repeats), how much of the label-balanced
    dense loss the label lean explains (``row.r2_quadratic``, ``row.r2_linear``: R^2 over the subsets) and each
    ranker's Spearman with that loss (``row.spearman.R``, R one of :data:`LEAN_RANKERS`' short names, always
    present, else the cache path's name; ``row.spearman_abs_lean``: the lean's own size, a reference, not a
    ranker), its 95% interval resampling what the record's bootstrap says (subsets, the queries held fixed)."""
    cfg = raw.get("config") or {}
    what = (cfg.get("bootstrap") or {}).get("resampled", "subsets")
    metrics: dict[str, Metric] = {}
    parts: dict[str, dict[str, Any]] = {}
    for r in raw.get("records") or []:
        row, n = r["record"].split("/")[-1].removesuffix(".json"), r.get("n_subsets")
        parts[row] = {"record": r["record"], "k": r.get("k"), "subsets": n, "queries": r.get("n_queries"),
                      "dense_same_as_or_nested_in": r.get("dense_same_as_or_nested_in")}
        metrics |= {f"{row}.r2_quadratic": Metric(r.get("r2_quadratic"), n=n, unit="R^2, loss quadratic in lean"),
                    f"{row}.r2_linear": Metric(r.get("r2_linear"), n=n, unit="R^2, loss linear in lean")}
        metrics |= {f"{row}.spearman.{key}": Metric(None, unit="spearman") for key in LEAN_RANKERS.values()}
        for s in r.get("spearman") or []:
            key = LEAN_RANKERS.get(s["ranker"], s["ranker"].removeprefix("cache path: "))
            metrics[f"{row}.spearman.{key}"] = spearman(s.get("spearman"), s.get("ci95"), n, what)
        ref = r.get("reference_not_a_ranker") or {}
        metrics[f"{row}.spearman_abs_lean"] = spearman(ref.get("spearman"), ref.get("ci95"), n, what)
    return Record({"process": raw.get("provenance")}, {**cfg, "parts": parts}, metrics, {}, name)


# what the equal-time bootstrap's rows and columns are
RUN_AXES = {"rows": "runs", "rows and columns": "runs and their test examples"}


def _vs_best(stats: dict | None) -> Metric:
    """An arm minus the best arm, its interval resampling the runs (the rows of the paired bootstrap's runs x test
    examples grid) and, where it says ``rows and columns``, their test examples."""
    if stats:
        what = stats.get("resampled", "rows")
        stats = {**stats, "resampled": RUN_AXES.get(what, what)}
    return difference(stats)


def calibrate_equal_time(raw: dict[str, Any], name: str) -> Record:
    """``bench calibrate``'s record (``calibration/calibrate-equal-time*``): per arm (``config["parts"]``, the
    summary's order), ``arm.accuracy`` (mean test accuracy as handed over, its calibration applied) and
    ``arm.raw`` (without it) over ``arm.runs`` runs, ``arm.wall_mean`` and ``arm.wall_max`` (seconds per run),
    ``arm.vs_best`` (minus the best arm: mean difference in test accuracy, 95% interval over the runs and their
    test examples; no value for the best arm itself); the cost target's ``cost.accuracy_gap`` (the default
    minus the raw search it is held against) and ``cost.wall_ratio`` (its mean wall time over that search's).
    ``config["decision"]``: the rule's ``best``, ``default``, ``why`` and, where set, ``cost_target``
    (``against``, ``met``)."""
    summary = raw.get("summary") or {}
    arms = summary.get("arms") or {}
    metrics: dict[str, Metric] = {}
    for arm, e in arms.items():
        runs = e.get("runs")
        metrics |= {f"{arm}.accuracy": Metric(e.get("mean"), n=runs, unit="test accuracy, mean over runs"),
                    f"{arm}.raw": Metric(e.get("raw_mean"), n=runs, unit="test accuracy, mean over runs"),
                    f"{arm}.runs": Metric(runs, unit="count"),
                    f"{arm}.wall_mean": Metric(e.get("wall_mean"), n=runs, unit="seconds"),
                    f"{arm}.wall_max": Metric(e.get("wall_max"), n=runs, unit="seconds"),
                    f"{arm}.vs_best": _vs_best(e.get("vs_best"))}
    d = summary.get("decision") or {}
    cost = d.get("cost_target") or {}
    metrics |= {"cost.accuracy_gap": Metric(cost.get("accuracy_gap"), unit="accuracy difference"),
                "cost.wall_ratio": Metric(cost.get("wall_ratio"), unit="ratio of mean wall times")}
    decision = {"best": d.get("best"), "default": d.get("default"), "why": d.get("why"),
                "cost_target": {"against": cost.get("raw_search"), "met": cost.get("met")} if cost else None}
    tests = {f"{r.get('task')} seed {r.get('seed')}": list(r.get("test_ids") or []) for r in raw.get("runs") or []}
    config = {**(raw.get("config") or {}), "parts": {arm: {} for arm in arms}, "decision": decision}
    return Record({"process": raw.get("provenance")}, config, metrics, tests, name)


# the fidelity record's cache paths and the start of their keys in it
CACHES = {"compressed": "", "control": "control_", "window": "window_"}


def fidelity_calibrated(raw: dict[str, Any], name: str) -> Record:
    """``icl-ssm fidelity``'s record with the lean-removed target (``calibration/fidelity-calibrated-*``): per cache
    path ``c`` of :data:`CACHES`, its subset ranking's Spearman with the dense prompt's on the raw loss
    (``c.spearman``), the label-balanced loss (``c.spearman_balanced``) and that loss with the lean removed by
    batch calibration per subset (``c.spearman_calibrated``), each with its 95% interval over subsets and queries;
    the dense ranking's own split-half Spearman on each (``dense.split_half``, ``dense.split_half_balanced``,
    ``dense.split_half_calibrated``)."""
    n = raw.get("subsets")
    metrics: dict[str, Metric] = {}
    for cache, start in CACHES.items():
        for kind in ("", "_balanced", "_calibrated"):
            key = f"{start}subset_loss_spearman{kind}"
            metrics[f"{cache}.spearman{kind}"] = spearman(raw.get(key), raw.get(f"{key}_ci95_queries"), n,
                                                          "subsets and queries")
    for kind in ("", "_balanced", "_calibrated"):
        metrics[f"dense.split_half{kind}"] = Metric(raw.get(f"dense_split_half_spearman{kind}"), n=n,
                                                    unit="spearman")
    settings = {k: raw.get(k) for k in ("model", "task", "k", "subsets", "queries", "seed", "loss")}
    return Record({"process": raw.get("provenance")}, {**(raw.get("config") or {}), **settings}, metrics, {}, name)


def algorithm2_calibrated(raw: dict[str, Any], name: str) -> Record:
    """``research/algorithm2_calibrated.py``'s record (``calibration/algorithm2-calibrated-*``): per seed and
    target (part ``seed{S}.{target}``, settings ``seed``, ``target``, ``subsets``, ``queries``): the subset
    losses' split-half Spearman over label-stratified halves of the queries (``subset_loss_split_half``, its
    Spearman-Brown ``subset_loss_reliability``), the candidates' scores' over alternate permutation blocks of the
    subsets (``score_split_half``, ``score_reliability``), the subsets Spearman-Brown projects for reliability 0.8
    (``subsets_for_0_8``; none where the split-half is <= 0), the scores' Spearman with the candidate's own label
    (``score_label_spearman``, over the pool) and, for a target other than raw, how many of its top-k candidates
    the raw target's top-k shares (``top_k_shared_with_raw``)."""
    metrics: dict[str, Metric] = {}
    parts: dict[str, dict[str, Any]] = {}
    for run in raw.get("runs") or []:
        seed, subsets, queries = run.get("seed"), run.get("subsets"), run.get("queries")
        for target, t in (run.get("targets") or {}).items():
            p = f"seed{seed}.{target}"
            parts[p] = {"seed": seed, "target": target, "subsets": subsets, "queries": queries}
            shared = None if target == "raw" else run.get("top_k_overlap")
            metrics |= {
                f"{p}.subset_loss_split_half": Metric(t.get("subset_loss_split_half"), n=queries, unit="spearman"),
                f"{p}.subset_loss_reliability": Metric(t.get("subset_loss_reliability"), n=queries,
                                                       unit="reliability (Spearman-Brown)"),
                f"{p}.score_split_half": Metric(t.get("score_split_half"), n=subsets, unit="spearman"),
                f"{p}.score_reliability": Metric(t.get("score_reliability"), n=subsets,
                                                 unit="reliability (Spearman-Brown)"),
                f"{p}.subsets_for_0_8": Metric(t.get("subsets_for_0_8"), unit="subsets"),
                f"{p}.score_label_spearman": Metric(t.get("score_label_spearman"), n=raw.get("pool_size"),
                                                    unit="spearman"),
                f"{p}.top_k_shared_with_raw": Metric(shared, n=raw.get("k"), unit="candidates")}
    config = {**(raw.get("settings") or {}), **{k: raw.get(k) for k in ("model", "task", "k", "pool_size")},
              "parts": parts}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


FAMILIES = {"calibration/label-lean-": label_lean, "calibration/calibrate-equal-time": calibrate_equal_time,
            "calibration/fidelity-calibrated-": fidelity_calibrated,
            "calibration/algorithm2-calibrated-": algorithm2_calibrated}

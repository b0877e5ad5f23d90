"""The records behind the paper's artefacts: ``icl-ssm fidelity`` reports of the n_v and transfer runs
(``nv-*``, ``transfer-*``, and the single-k ``long-context-*-k50.json``), ``bench long-context``
(``long-context-*-k50-k75.json``), ``bench length`` (``length-*``) and per-query retrieval (``per-query-*``,
a list of ``select --per-query`` runs).

A fidelity report is read as the fidelity reports of :mod:`.fidelity` are (its paths ``compressed``,
``control``, ``window`` and the ``--also`` ones: ``nv4``, ``from-cr``, ``as-is-cr``), with the differences
between its paths that the paper's rows state. Ranges over ks or runs are taken within one record; the
transfer matrix over the transfer reports of several targets is :func:`transfer_matrix`.
"""

from __future__ import annotations

import statistics
from typing import Any

from icl_ssm.records import Metric, Record

from .fidelity import fidelity_report as fidelity_paths


def _interval(value: Any, interval: list | None, n: int | None, what: str, unit: str) -> Metric:
    ok = interval is not None and None not in interval and value is not None
    return Metric(value, tuple(interval) if ok else None, n, what if ok else None, unit)


def _differences(record: Record) -> dict[str, Metric]:
    """Per path of a fidelity report, its accuracy minus dense's, its KL minus the compressed path's and the
    window's, its output MSE minus the control's (a path is not compared with itself)."""
    m, n = record.metrics, record.config.get("subsets")
    base = {("acc", "dense"): "accuracy difference", ("kl", "compressed"): "nats", ("kl", "window"): "nats",
            ("logit_mse", "control"): "output MSE"}
    out = {}
    for path in record.config.get("paths") or []:
        for (key, other), unit in base.items():
            mine, theirs = m.get(f"{path}.{key}"), m.get(f"{other}.{key}")
            if path != other and mine and theirs and mine.value is not None and theirs.value is not None:
                out[f"{path}.{key}_minus_{other}"] = Metric(mine.value - theirs.value, n=n, unit=unit)
    return out


def fidelity_report(raw: dict[str, Any], name: str) -> Record:
    """An ``icl-ssm fidelity`` report as :func:`.fidelity.fidelity_report` reads it (per path, ``kl``,
    ``logit_mse``, ``acc``, ``spearman`` with its interval over subsets, ...; ``dense.acc``; the paired
    Spearman differences ``a_minus_b``), and per path its accuracy minus dense (``nv4.acc_minus_dense``), its
    KL minus the compressed path's and the window's (``from-cr.kl_minus_compressed``, ``kl_minus_window``) and
    its output MSE minus the control's (``logit_mse_minus_control``), n = subsets, no intervals."""
    record = fidelity_paths(raw, name)
    return Record(record.provenance, record.config, record.metrics | _differences(record), record.example_ids, name)


def _ranges(metrics: dict[str, Metric], keys: list[str], name: str, unit: str) -> dict[str, Metric]:
    """``name_min`` and ``name_max`` over the values of ``keys`` present (None where none is)."""
    values = [metrics[key].value for key in keys if key in metrics and metrics[key].value is not None]
    return {f"{name}_min": Metric(min(values) if values else None, n=len(values), unit=unit),
            f"{name}_max": Metric(max(values) if values else None, n=len(values), unit=unit)}


def long_context(raw: dict[str, Any], name: str) -> Record:
    """A ``bench long-context`` record (``results``, one per k), or a single-k ``icl-ssm fidelity`` report of
    the long-context runs (read by :func:`fidelity_report`). Per k and path (``dense``, ``compressed``,
    ``window``, ``streaming``, ``lm-infinite``, ``control``): ``k50.compressed.kl``, ``rel_logit_err``, ``acc``,
    ``slots``, ``flops``, ``cache_mib``, ``flops_vs_dense`` and the subset-loss ``spearman`` with dense (interval
    over subsets and queries, n = subsets); per path, the smallest and largest of ``kl``, ``rel_logit_err``,
    ``cache_mib`` and ``flops_vs_dense`` over the ks (``compressed.kl_min``, ``dense.cache_mib_max``);
    ``spearman_intervals_overlap``: 1 where at every k the compressed path's Spearman interval overlaps that
    of each other compressed-size path (window, streaming, lm-infinite) present, else 0. Config: ``task``,
    ``ks``, ``paths``, ``subsets``, ``queries``."""
    if "results" not in raw:
        return fidelity_report(raw, name)
    units = {"kl": "KL", "rel_logit_err": "share", "acc": "accuracy", "slots": "cache slots", "flops": "FLOPs",
             "cache_mib": "MiB", "flops_vs_dense": "share of dense FLOPs"}
    metrics: dict[str, Metric] = {}
    paths: list[str] = []
    results = sorted(raw["results"], key=lambda r: r["k"])
    for result in results:
        n = result.get("subsets")
        for row in result["rows"]:
            path, at = row["path"], f"k{result['k']}.{row['path']}"
            paths += [path] if path not in paths else []
            metrics |= {f"{at}.{key}": Metric(row.get(key), n=n, unit=unit) for key, unit in units.items()
                        if row.get(key) is not None}
            metrics[f"{at}.spearman"] = _interval(row.get("spearman"), row.get("spearman_ci95"), n,
                                                  "subsets and queries", "spearman")
    ks = [r["k"] for r in results]
    for path in paths:
        for key in ("kl", "rel_logit_err", "cache_mib", "flops_vs_dense"):
            metrics |= _ranges(metrics, [f"k{k}.{path}.{key}" for k in ks], f"{path}.{key}", units[key])

    def overlap(k: int, other: str) -> bool:
        a, b = metrics[f"k{k}.compressed.spearman"].interval, metrics[f"k{k}.{other}.spearman"].interval
        return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]

    others = [p for p in ("window", "streaming", "lm-infinite") if p in paths]
    metrics["spearman_intervals_overlap"] = Metric(float(all(overlap(k, p) for k in ks for p in others)),
                                                   n=len(ks) * len(others), unit="yes (1) or no (0)")
    tasks = sorted({r.get("task") for r in results})
    config = {"task": tasks[0] if len(tasks) == 1 else tasks, "ks": ks, "paths": paths,
              "subsets": raw.get("subsets"), "queries": raw.get("queries"), "model": raw.get("model")}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def length(raw: dict[str, Any], name: str) -> Record:
    """A ``bench length`` record: per k (``k50.``), the prompt's tokens (``prompt_tokens``), whether it fits
    the model's context (``in_context``, 1 or 0), the compressed and dense paths' ``seconds``, ``accuracy`` and
    ``flops`` (``k50.compressed.flops``; dense only inside the context), and inside it ``kl`` and
    ``rel_logit_err`` against dense; over the ks, the smallest and largest compressed FLOPs per prompt
    (``compressed.flops_min``, ``_max``), KL inside the context (``kl_min``, ``kl_max``) and the most prompt
    tokens (``prompt_tokens_max``). Config: ``trained_k``, ``context``, ``ks``, ``ks_in_context``,
    ``ks_past_context``."""
    rows = sorted(raw.get("rows") or [], key=lambda r: r["k"])
    metrics: dict[str, Metric] = {}
    for row in rows:
        at, n = f"k{row['k']}", row.get("subsets")
        metrics[f"{at}.prompt_tokens"] = Metric(row.get("prompt_tokens"), n=n, unit="tokens (mean)")
        metrics[f"{at}.in_context"] = Metric(float(bool(row.get("in_context"))), unit="yes (1) or no (0)")
        for path in ("compressed", "dense"):
            for key, unit in (("seconds", "seconds"), ("accuracy", "accuracy"), ("flops", "FLOPs")):
                if (row.get(path) or {}).get(key) is not None:
                    metrics[f"{at}.{path}.{key}"] = Metric(row[path][key], n=n, unit=unit)
        for key, unit in (("kl", "KL"), ("rel_logit_err", "share")):
            if row.get(key) is not None:
                metrics[f"{at}.{key}"] = Metric(row[key], n=n, unit=unit)
    at = [f"k{r['k']}" for r in rows]
    metrics |= _ranges(metrics, [f"{k}.compressed.flops" for k in at], "compressed.flops", "FLOPs")
    metrics |= _ranges(metrics, [f"{k}.kl" for k in at], "kl", "KL")
    tokens = [r["prompt_tokens"] for r in rows if r.get("prompt_tokens") is not None]
    metrics["prompt_tokens_max"] = Metric(max(tokens) if tokens else None, n=len(tokens), unit="tokens (mean)")
    config = {key: raw.get(key) for key in ("model", "task", "trained_k", "context")}
    config |= {"ks": [r["k"] for r in rows], "ks_in_context": [r["k"] for r in rows if r.get("in_context")],
               "ks_past_context": [r["k"] for r in rows if not r.get("in_context")]}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def per_query(raw: list[dict[str, Any]], name: str) -> Record:
    """A list of ``select --per-query`` runs (one per method and seed): per method (``bm25``, ``topk``: the
    stored method without " (per query)"), the mean test accuracy over its seeds (``bm25.accuracy``, n = seeds)
    and its sample sd (``accuracy_sd``); over every run, the smallest and largest FLOPs and seconds to answer
    the test inputs (``answer_flops_min``, ``answer_seconds_max``). Config: ``task``, ``k``, ``test_size``,
    ``methods``, ``seeds``; provenance per run."""
    runs = sorted(raw, key=lambda r: r["seed"])
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["method"].removesuffix(" (per query)"), []).append(r)
    metrics: dict[str, Metric] = {}
    for method, rs in by.items():
        accs = [r["test_accuracy"] for r in rs]
        metrics[f"{method}.accuracy"] = Metric(statistics.fmean(accs), n=len(accs), unit="accuracy (mean over seeds)")
        metrics[f"{method}.accuracy_sd"] = Metric(statistics.stdev(accs) if len(accs) > 1 else 0.0, n=len(accs),
                                                  unit="accuracy (sd over seeds)")
    for key, unit in (("answer_flops", "FLOPs"), ("answer_seconds", "seconds")):
        values = [r[key] for rs in by.values() for r in rs]
        metrics |= {f"{key}_min": Metric(min(values), n=len(values), unit=unit),
                    f"{key}_max": Metric(max(values), n=len(values), unit=unit)}
    first = runs[0] if runs else {}
    config = {key: first.get(key) for key in ("model", "task", "k", "test_size", "pool_size")}
    config |= {"methods": list(by), "seeds": sorted({r["seed"] for r in runs})}
    provenance = {f"{r['method']} seed {r['seed']}": r.get("provenance") for r in runs}
    return Record(provenance or {"process": None}, config, metrics, {}, name)


def transfer_matrix(reports: list[Record], name: str = "transfer-matrix") -> Record:
    """The transfer reports of several target tasks (:func:`fidelity_report`, one per target, config ``task``;
    its paths ``from-<source>``: the source's compressor after stage 2 on the target, ``as-is-<source>``: without
    it) as one matrix: each report's metrics as ``<task>.X``; ``transfers`` (the ``from-`` paths) and
    ``at_or_below`` (those whose KL is at or below the target's own compressor's); ``above_min`` and
    ``above_max`` (the smallest and largest KL excess, nats, of the rest); ``as_is`` (the ``as-is-`` paths) and
    ``as_is_worse`` (those whose KL is above the target's window). Config: ``tasks`` (the reports' order),
    ``met_into`` (sorted: the targets every transfer into which is at or below), ``subsets`` and ``queries`` (the
    first report's). Counts and ranges over the records, no intervals; provenance per report."""
    excess: dict[tuple[str, str], float] = {}
    worse: list[bool] = []
    for r in reports:
        for path in r.config.get("paths") or []:
            if path.startswith("from-"):
                excess[path[5:], r.config["task"]] = r[f"{path}.kl_minus_compressed"].value
            elif path.startswith("as-is-"):
                worse.append(r[f"{path}.kl_minus_window"].value > 0)
    above = [d for d in excess.values() if d > 0]
    met_into = sorted({t for (_, t), d in excess.items() if d <= 0
                       and all(e <= 0 for (_, u), e in excess.items() if u == t)})
    metrics = {f"{r.config['task']}.{k}": m for r in reports for k, m in r.metrics.items()}
    count = lambda v, n=None: Metric(v, n=n, unit="count")  # noqa: E731
    metrics |= {"transfers": count(len(excess)), "at_or_below": count(sum(d <= 0 for d in excess.values()),
                                                                       len(excess)),
                "above_min": Metric(min(above) if above else None, n=len(above), unit="nats"),
                "above_max": Metric(max(above) if above else None, n=len(above), unit="nats"),
                "as_is": count(len(worse)), "as_is_worse": count(sum(worse), len(worse))}
    first = reports[0].config if reports else {}
    config = {"tasks": [r.config["task"] for r in reports], "met_into": met_into,
              "subsets": first.get("subsets"), "queries": first.get("queries")}
    provenance = {f"{r.name}: {stage}": p for r in reports for stage, p in r.provenance.items()}
    return Record(provenance or {"process": None}, config, metrics, {}, name)


FAMILIES = {"length-": length, "long-context-": long_context, "nv-": fidelity_report, "per-query-": per_query,
            "transfer-": fidelity_report}

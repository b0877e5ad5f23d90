"""The records behind BENCHMARKS' trust targets, besides the trust runs (:mod:`.trust_search`): whole prompts'
validation against test (``prompt-correctness-*``), the hand-over and fidelity-verdict simulations
(``handover-simulation-*``, ``verdict-simulation-*``), the prompt search at equal time (``search-equal-time*``,
the pooled decision and its per-task records, joined by :func:`equal_time`), ``select --budget``'s reliability
(``budget3-*``, ``budget10-*``) and ``bench select-cost``'s wall time against FLOPs (``select-cost-wall-*``).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from icl_ssm.records import Metric, Record

from .common import accuracy, difference

DEFAULT_CELL = (128, 8)  # the hand-over check `run` makes: 128 held-out examples against 8 random prompts
EQUAL_TIME_RESAMPLED = "(task, seed) runs and test examples"  # what bench search's "rows and columns" are


def _process(raw: dict[str, Any]) -> dict[str, dict | None]:
    return {"process": raw.get("provenance")}


def _rate(value: float | None, draws: int | None) -> Metric:
    return Metric(value, n=draws, unit="share of draws")


def prompt_correctness(raw: dict[str, Any], name: str) -> Record:
    """``research/prompt_correctness.py``'s record: ``prompts`` (count), ``spearman_loss`` and
    ``spearman_accuracy`` (Spearman of the label-balanced validation loss / validation accuracy with test
    accuracy, over the prompts), ``test_min``, ``test_median``, ``test_max`` (the prompts' test accuracies)."""
    tests = [p["test_accuracy"] for p in raw.get("prompts") or []]
    n, prompts = raw.get("test_size"), len(tests)
    metrics = {"prompts": Metric(prompts, unit="prompts"),
               "spearman_loss": Metric(raw.get("spearman_validation_loss_vs_test"), n=prompts, unit="spearman"),
               "spearman_accuracy": Metric(raw.get("spearman_validation_accuracy_vs_test"), n=prompts,
                                           unit="spearman"),
               "test_min": accuracy(min(tests) if tests else None, n),
               "test_median": accuracy(statistics.median(tests) if tests else None, n),
               "test_max": accuracy(max(tests) if tests else None, n)}
    config = {k: raw.get(k) for k in ("model", "task", "k", "seed", "pool_size", "validation_size", "test_size")}
    return Record(_process(raw), config, metrics, {}, name)


def handover_simulation(raw: dict[str, Any], name: str) -> Record:
    """``research/handover_simulation.py``'s record: per cell ``<check_size>x<random_prompts>``, the rates over
    its draws (``.equal_new_rate``, ``.equal_old_rate``: an equally good pick replaced, by the new and the old
    rule; ``.better_new_rate``, ``.better_old_rate``: a prompt 10 points better handed over); over the cells,
    ``equal_new_min``/``_max`` and ``equal_old_min``/``_max``; ``half_width``: the widest 95% binomial
    half-width (normal approximation) of the rates a table quotes: every ``equal_new_rate`` and the
    ``better_new_rate`` of the default cell (config ``default_cell``) and of the larger checks against as
    many random prompts (config ``larger_cells``)."""
    rows = raw.get("rows") or []
    draws = rows[0]["draws"] if rows else None
    cell = lambda r: f"{r['check_size']}x{r['random_prompts']}"  # noqa: E731
    metrics = {f"{cell(r)}.{key}": _rate(r[key], r["draws"]) for r in rows
               for key in ("equal_new_rate", "equal_old_rate", "better_new_rate", "better_old_rate")}
    check, prompts = DEFAULT_CELL
    larger = [cell(r) for r in sorted(rows, key=lambda r: r["check_size"])
              if r["random_prompts"] == prompts and r["check_size"] > check]
    default = f"{check}x{prompts}"
    for rule in ("new", "old"):
        equal = [r[f"equal_{rule}_rate"] for r in rows]
        metrics |= {f"equal_{rule}_min": _rate(min(equal), draws), f"equal_{rule}_max": _rate(max(equal), draws)}
    quoted = [r["equal_new_rate"] for r in rows] + [metrics[f"{c}.better_new_rate"].value for c in [default, *larger]
                                                    if f"{c}.better_new_rate" in metrics]
    widest = max((1.96 * (p * (1 - p) / draws) ** 0.5 for p in quoted), default=None) if draws else None
    metrics["half_width"] = Metric(widest, n=draws, unit="share of draws")
    config = {"source": raw.get("source"), "draws": draws, "cells": [cell(r) for r in rows],
              "default_cell": default, "larger_cells": larger}
    return Record(_process(raw), config, metrics, {}, name)


def verdict_simulation(raw: dict[str, Any], name: str) -> Record:
    """``research/verdict_simulation.py``'s record: per scenario ``s`` and size ``<subsets>x<queries>``,
    ``s.<size>.new_pass_rate`` and ``s.<size>.old_pass_rate`` (the share of draws the new / old verdict
    passed); per scenario, ``s.fails_min`` (the lowest share failed by the new verdict over the sizes) and
    ``s.old_pass_min`` (the lowest share passed by the old one)."""
    sizes, metrics = raw.get("sizes") or [], {}
    for r in raw.get("rows") or []:
        at = f"{r['scenario']}.{r['subsets']}x{r['queries']}"
        metrics |= {f"{at}.new_pass_rate": _rate(r["new_pass_rate"], r["draws"]),
                    f"{at}.old_pass_rate": _rate(r["old_pass_rate"], r["draws"])}
    for s in raw.get("scenarios") or {}:
        new = [metrics[f"{s}.{z}.new_pass_rate"].value for z in sizes]
        old = [metrics[f"{s}.{z}.old_pass_rate"].value for z in sizes]
        metrics |= {f"{s}.fails_min": _rate(min(1 - x for x in new), raw.get("draws")),
                    f"{s}.old_pass_min": _rate(min(old), raw.get("draws"))}
    config = {"source": raw.get("source"), "sizes": sizes, "draws": raw.get("draws"),
              "scenarios": raw.get("scenarios") or {}}
    return Record(_process(raw), config, metrics, {}, name)


def _budgets(summary: dict) -> dict[str, Metric]:
    """A bench search summary's arms per budget ``m`` (minutes): ``m.arm.mean`` (mean test accuracy over
    ``m.arm.runs``), ``m.arm.wall_max_over_budget``, ``m.arm.vs_none`` (the paired difference with no
    screen, its interval over (task, seed) runs and test examples)."""
    metrics = {}
    for minutes, arms in (summary.get("budgets") or {}).items():
        for arm, s in arms.items():
            at = f"{float(minutes):g}.{arm}"
            metrics |= {f"{at}.mean": accuracy(s["mean"], s["runs"]), f"{at}.runs": Metric(s["runs"], unit="runs"),
                        f"{at}.wall_max_over_budget": Metric(s["wall_max_over_budget"], unit="wall time / budget")}
            if "vs_cheapest" in s:
                vs = difference(s["vs_cheapest"])
                metrics[f"{at}.vs_none"] = dataclasses.replace(vs, resamples=vs.resamples and EQUAL_TIME_RESAMPLED)
    return metrics


def equal_time_search(raw: dict[str, Any], name: str) -> Record:
    """A record of ``bench search`` at equal time: the pooled decision (``search-equal-time.json``; config
    ``records``, ``runs``, ``default_screen``, ``why``) or one task's runs at one budget (config ``task``,
    ``seeds``, ``test_size``, ``runs``; ``distill.compressed`` / ``distill.control``: the seconds its
    compressor and control took to make, where it made them); both with :func:`_budgets`'s metrics."""
    summary = raw.get("summary") or {}
    metrics = _budgets(summary)
    minutes = [f"{float(m):g}" for m in summary.get("budgets") or {}]
    config: dict[str, Any] = {"command": raw.get("command"), "minutes": minutes}
    if "records" in raw:
        decision = summary.get("decision") or {}
        config |= {"records": list(raw["records"]), "runs": raw.get("runs"),
                   "default_screen": decision.get("default_screen"), "why": decision.get("why")}
    else:
        runs = raw.get("runs") or []
        config |= {"task": runs[0]["task"], "seeds": sorted({r["seed"] for r in runs}), "runs": len(runs),
                   "test_size": len(runs[0]["correct"])}
        for arm, c in (raw.get("compressors") or {}).items():
            metrics[f"distill.{arm}"] = Metric(sum(c["distill_seconds"].values()), unit="seconds")
    return Record(_process(raw), config, metrics, {}, name)


def equal_time(pooled: Record, parts: list[Record]) -> Record:
    """The pooled decision joined with the per-task records it names (:func:`equal_time_search`): the pooled
    metrics; ``<task>.<m>.<arm>.mean`` per task; ``<task>.distill.<arm>`` where the task's records made a
    compressor (the last of them); ``wall_max`` (the longest search over its budget, every arm and budget).
    Config: ``tasks`` (rotten_tomatoes first), ``distilled`` (their tasks), ``seeds``, ``test_size``,
    ``minutes``, ``records``, ``default_screen``, ``why``, ``command``. A pooled record whose run count differs
    from its parts' is refused."""
    runs = sum(p.config["runs"] for p in parts)
    if runs != pooled.config["runs"]:
        raise ValueError(f"{pooled.name} pools {pooled.config['runs']} runs; the records it names hold {runs}")
    metrics = dict(pooled.metrics)
    distilled: list[str] = []
    for p in parts:
        task = p.config["task"]
        metrics |= {f"{task}.{k}": m for k, m in p.metrics.items() if k.endswith(".mean") or k.startswith("distill.")}
        if any(k.startswith("distill.") for k in p.metrics) and task not in distilled:
            distilled.append(task)
    walls = [m.value for k, m in pooled.metrics.items() if k.endswith(".wall_max_over_budget")]
    metrics["wall_max"] = Metric(max(walls), n=len(walls), unit="wall time / budget")
    tasks = sorted({p.config["task"] for p in parts}, key=lambda t: (t != "rotten_tomatoes", t))
    config = {**pooled.config, "tasks": tasks, "distilled": distilled, "test_size": parts[0].config["test_size"],
              "seeds": sorted({s for p in parts for s in p.config["seeds"]})}
    provenance = {**pooled.provenance, **{p.name: p.provenance.get("process") for p in parts}}
    return Record(provenance, config, metrics, {}, pooled.name)


def budget_run(raw: dict[str, Any], name: str) -> Record:
    """``icl-ssm select --budget``'s record: ``reliability`` (the subset losses' split-half reliability,
    Spearman-Brown corrected, over ``subsets``), ``score_reliability`` (the candidates' scores'), ``subsets``,
    ``queries_used``, ``budget_seconds``, ``wall_seconds``; ``subsets_to_target`` and ``seconds_to_target``:
    the subsets, and this CPU's seconds, Spearman-Brown puts the scores' reliability at the target (config
    ``target``) with (None where it is 0)."""
    budget, subsets = raw.get("budget") or {}, raw.get("subsets")
    target, r = budget.get("target"), raw.get("score_reliability")
    factor = target * (1 - r) / (r * (1 - target)) if r and target else None
    metrics = {"reliability": Metric(raw.get("reliability"), n=subsets, unit="split-half reliability"),
               "score_reliability": Metric(r, n=subsets, unit="split-half reliability"),
               "subsets": Metric(subsets, unit="subsets"),
               "queries_used": Metric(raw.get("queries_used"), unit="queries"),
               "budget_seconds": Metric(budget.get("budget_seconds"), unit="seconds"),
               "wall_seconds": Metric(raw.get("wall_seconds"), unit="seconds"),
               "subsets_to_target": Metric(None if factor is None else subsets * factor, unit="subsets"),
               "seconds_to_target": Metric(None if factor is None else raw["wall_seconds"] * factor, unit="seconds")}
    config = {k: raw.get(k) for k in ("task", "k", "estimator", "evaluator", "pool_size", "test_size")}
    return Record(_process(raw), config | {"target": target}, metrics, {}, name)


def select_cost_wall(raw: dict[str, Any], name: str) -> Record:
    """``bench select-cost``'s timing record: per k and evaluator, ``<k>.<evaluator>.flops_vs_compressed`` and
    ``.seconds_vs_compressed`` (its FLOPs and wall time over the compressed evaluator's); per k and dense path
    (``dense``, ``dense-packed``), ``<k>.<path>.apart``: the FLOP saving over the wall-time saving."""
    metrics: dict[str, Metric] = {}
    for r in raw.get("rows") or []:
        at = f"{r['k']}.{r['evaluator']}"
        metrics |= {f"{at}.flops_vs_compressed": Metric(r["flops_vs_compressed"], unit="ratio"),
                    f"{at}.seconds_vs_compressed": Metric(r["seconds_vs_compressed"], unit="ratio")}
    ks = sorted({r["k"] for r in raw.get("rows") or []})
    for k in ks:
        for path in ("dense", "dense-packed"):
            at = f"{k}.{path}"
            apart = metrics[f"{at}.flops_vs_compressed"].value / metrics[f"{at}.seconds_vs_compressed"].value
            metrics[f"{at}.apart"] = Metric(apart, unit="ratio")
    config = {"ks": ks, "queries": raw.get("queries"), "subsets": raw.get("subsets"), "task": raw.get("task")}
    return Record(_process(raw), config, metrics, {}, name)


FAMILIES = {"prompt-correctness-": prompt_correctness, "handover-simulation-": handover_simulation,
            "verdict-simulation-": verdict_simulation, "search-equal-time": equal_time_search,
            "budget3-": budget_run, "budget10-": budget_run, "select-cost-wall-": select_cost_wall}

"""The selection records: ``bench select-order`` (each selected set in random and fixed prompt orders), the order
searches of ``research/order_search.py`` and ``research/order_evaluators.py``, ``bench headroom`` at k = 20, the
k = 50 ``bench select-quality`` runs (the dense ranking's split-half), ``bench estimators`` and ``bench select-cost``;
and the records a table row derives from several of them (:func:`paired_sets`, :func:`reliability_growth`,
:func:`pooled_estimators`).

A set is one method's selection at one seed, its metrics named ``{method}.seed{s}.X``. A mean over seeds is ``X``
with its sample standard deviation ``X_sd`` (0 for one seed), both with ``n`` the seeds; no interval is stored:
three seeds are too few for one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from scipy.stats import f_oneway

from icl_ssm.records import Metric, Record

from ..base import paired_p, sd, spearman_brown
from .common import combined

ACC, DIFF, COUNT = "accuracy", "accuracy difference", "count"


def random_orders(order: dict, report: str | None = None) -> dict[tuple[str, int], list[float]]:
    """Per selected set ``(method, seed)``, its test accuracies in the random prompt orders of a
    ``bench select-order`` record (only the sets of ``report`` when the record joins several)."""
    per = defaultdict(list)
    for r in order["rows"]:
        if r["order"] == "random" and report in (None, r["report"]):
            per[r["method"], r["seed"]].append(r["test_accuracy"])
    return dict(per)


def orders_averaged(order: dict, report: str | None = None) -> dict[str, list[float]]:
    """Per method, each seed's test accuracy averaged over its random prompt orders."""
    out = defaultdict(list)
    for (method, _), accs in sorted(random_orders(order, report).items(), key=lambda kv: kv[0][1]):
        out[method].append(statistics.fmean(accs))
    return dict(out)


def one_order(order: dict, name: str, report: str | None = None) -> dict[str, list[float]]:
    """Per method, each seed's test accuracy in the one prompt order ``name`` (score, interleave)."""
    out = defaultdict(list)
    for r in sorted(order["rows"], key=lambda r: r["seed"]):
        if r["order"] == name and report in (None, r["report"]):
            out[r["method"]].append(r["test_accuracy"])
    return dict(out)


def search_gains(search: dict) -> list[tuple[str, int, float]]:
    """Per set ``(method, seed, gain)``: the searched order's test accuracy minus the set's mean over
    the random orders among the candidates (the order averaged out)."""
    out = []
    for r in search["results"]:
        rand = [c["test_accuracy"] for c in r["candidates"] if c["order"] == "random"]
        out.append((r["method"], r["seed"], r["candidates"][r["chosen"]]["test_accuracy"] - statistics.fmean(rand)))
    return out


def over_seeds(key: str, values: list[float]) -> dict[str, Metric]:
    """``key``: the mean of one accuracy per seed, ``key_sd``: its sample standard deviation; n: the seeds."""
    return {key: Metric(statistics.fmean(values), n=len(values), unit=ACC),
            f"{key}_sd": Metric(sd(values), n=len(values), unit="accuracy (sd over seeds)")}


def _report(raw: dict[str, Any], rep: str) -> dict[str, Metric]:
    """One report's metrics of a ``bench select-order`` record (:func:`select_order`), named without ``rep.``."""
    sets = random_orders(raw, rep)
    out = {f"{m}.seed{s}.averaged": Metric(statistics.fmean(accs), n=len(accs), unit=ACC)
           for (m, s), accs in sets.items()}
    fixed = [r for r in raw["rows"] if r["report"] == rep and r["order"] != "random"]
    out |= {f"{r['method']}.seed{r['seed']}.{r['order']}": Metric(r["test_accuracy"], unit=ACC) for r in fixed}
    averaged = orders_averaged(raw, rep)
    for method, values in averaged.items():
        out |= over_seeds(f"{method}.averaged", values)
    for name in dict.fromkeys(r["order"] for r in fixed):
        for method, values in one_order(raw, name, rep).items():
            out |= over_seeds(f"{method}.{name}", values)
    means = [statistics.fmean(v) for v in averaged.values()]
    out |= {"averaged_low": Metric(min(means), n=len(means), unit=ACC),
            "averaged_high": Metric(max(means), n=len(means), unit=ACC),
            "sets": Metric(len(sets), unit=COUNT)}
    if len(sets) > 1 and all(len(v) > 1 for v in sets.values()):
        out["anova_p"] = Metric(float(f_oneway(*sets.values()).pvalue), n=len(sets),
                                unit="p (one-way ANOVA over the sets' random orders)")
    return out


def select_order(raw: dict[str, Any], name: str) -> Record:
    """``bench select-order`` (``select-order-*``): per report ``rep`` the record joins (read one with
    ``record.part(rep)``) and method ``m``: each set's test accuracy averaged over its random prompt orders
    (``rep.m.seed{s}.averaged``, n: the orders) and in each fixed order ``o`` (``rep.m.seed{s}.o``); over the seeds
    (:func:`over_seeds`) ``rep.m.averaged`` and ``rep.m.o``; the lowest and highest method mean
    (``rep.averaged_low``, ``rep.averaged_high``), how many sets (``rep.sets``) and a one-way ANOVA over the sets'
    random orders (``rep.anova_p``, where every set has two or more). Config: ``sets`` (per report, its sets
    ``[method, seed]`` in the record's order), ``methods`` (per report), ``seeds`` (of every report),
    ``permutations``, ``test_examples``."""
    reports = list(dict.fromkeys(r["report"] for r in raw["rows"]))
    metrics = {f"{rep}.{k}": m for rep in reports for k, m in _report(raw, rep).items()}
    sets = {rep: [[m, s] for m, s in random_orders(raw, rep)] for rep in reports}
    provenance = raw.get("provenance") or {}
    config = {"model": raw.get("model"), "permutations": raw.get("permutations"),
              "test_examples": provenance.get("test_examples"), "seeds": sorted({r["seed"] for r in raw["rows"]}),
              "sets": sets, "methods": {rep: list(dict.fromkeys(m for m, _ in s)) for rep, s in sets.items()}}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def order_search(raw: dict[str, Any], name: str) -> Record:
    """``research/order_search.py`` (``order-search-*``): per set the test accuracy of the order chosen on the
    validation queries (``m.seed{s}.searched``) and its gain over the set's mean random candidate order
    (``m.seed{s}.gain``, n: the random candidates); per method ``m.searched`` over the seeds (:func:`over_seeds`);
    over the sets the mean gain (``gain``), its paired t-test (``gain_p``) and how many sets gained
    (``sets_better``), n: the sets. Config: ``queries``, ``candidates``, ``sets`` (``[method, seed]``)."""
    results = raw["results"]
    chosen = {(r["method"], r["seed"]): r["candidates"][r["chosen"]]["test_accuracy"] for r in results}
    metrics = {f"{m}.seed{s}.searched": Metric(acc, unit=ACC) for (m, s), acc in chosen.items()}
    by_method = defaultdict(list)
    for r in sorted(results, key=lambda r: r["seed"]):
        by_method[r["method"]].append(chosen[r["method"], r["seed"]])
    for method, values in by_method.items():
        metrics |= over_seeds(f"{method}.searched", values)
    draws = {(r["method"], r["seed"]): sum(c["order"] == "random" for c in r["candidates"]) for r in results}
    gains = search_gains(raw)
    metrics |= {f"{m}.seed{s}.gain": Metric(d, n=draws[m, s], unit=DIFF) for m, s, d in gains}
    diffs = [d for *_, d in gains]
    metrics |= {"gain": Metric(statistics.fmean(diffs), n=len(diffs), unit=DIFF),
                "gain_p": Metric(paired_p(diffs), n=len(diffs), unit="p (paired t-test over the sets)"),
                "sets_better": Metric(sum(d > 0 for d in diffs), n=len(diffs), unit="sets")}
    config = {"queries": raw.get("queries"), "candidates": raw.get("candidates"),
              "sets": [[m, s] for m, s, _ in gains]}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def order_evaluators(raw: dict[str, Any], name: str) -> Record:
    """``research/order_evaluators.py`` (``order-evaluators-*``): per evaluator ``e`` (dense, compressed, control),
    its chosen order's test accuracy over the mean random order (``e.minus_mean_random``), how often it chose the
    dense evaluator's order (``e.same_choice_as_dense``), its mean Spearman with the dense losses over the orders
    (``e.spearman_with_dense``), and but for dense, its chosen order's test accuracy minus the dense choice's
    (``e.minus_dense``) with the sets where it is above or below (``e.better_than_dense``, ``e.worse_than_dense``);
    n: the sets. Config: ``queries``, ``candidates`` (orders per set), ``sets``, ``pool_size``."""
    rows, summary = raw["rows"], raw["summary"]
    n = summary["sets"]
    metrics: dict[str, Metric] = {}
    for ev, s in ((k, v) for k, v in summary.items() if isinstance(v, dict)):
        metrics |= {f"{ev}.minus_mean_random": Metric(s["minus_mean_random_order"], n=n, unit=DIFF),
                    f"{ev}.same_choice_as_dense": Metric(s["same_choice_as_dense"], n=n, unit="sets"),
                    f"{ev}.spearman_with_dense": Metric(s.get("mean_spearman_with_dense"), n=n, unit="spearman")}
        if ev == "dense":
            continue
        diff = [r["test_accuracy"][r["chosen"][ev]] - r["test_accuracy"][r["chosen"]["dense"]] for r in rows]
        metrics |= {f"{ev}.minus_dense": Metric(statistics.fmean(diff), n=len(diff), unit=DIFF),
                    f"{ev}.better_than_dense": Metric(sum(d > 1e-9 for d in diff), n=len(diff), unit="sets"),
                    f"{ev}.worse_than_dense": Metric(sum(d < -1e-9 for d in diff), n=len(diff), unit="sets")}
    config = {"queries": raw.get("queries"), "candidates": len(rows[0]["test_accuracy"]), "sets": n,
              "pool_size": raw.get("pool_size"), "searched": raw.get("record")}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def headroom_k20(raw: dict[str, Any], name: str) -> Record:
    """``bench headroom`` at k = 20 (``headroom-k20*``, not its calibrated kin): per task ``t``, the random sets'
    test accuracies (``t.mean``, ``t.sd``, ``t.min``, ``t.max``, n: the sets) and the best set over the mean
    (``t.best_minus_mean``); how many sets (``t.sets``), test queries (``t.queries``) and the test size asked for
    (``t.test_size``). Config: ``tasks`` (in the record's order), ``k``, ``seed``, ``pool_size``, ``test_size``."""
    metrics: dict[str, Metric] = {}
    for task, t in raw["tasks"].items():
        sets = t.get("sets")
        metrics |= {f"{task}.mean": Metric(t.get("mean"), n=sets, unit=ACC),
                    f"{task}.sd": Metric(t.get("std"), n=sets, unit="accuracy (sd over sets)"),
                    f"{task}.min": Metric(t.get("min"), n=sets, unit=ACC),
                    f"{task}.max": Metric(t.get("max"), n=sets, unit=ACC),
                    f"{task}.best_minus_mean": Metric(t.get("best_minus_mean"), n=sets, unit=DIFF),
                    f"{task}.sets": Metric(sets, unit=COUNT), f"{task}.queries": Metric(t.get("queries"), unit=COUNT),
                    f"{task}.test_size": Metric(raw.get("test_size"), unit=COUNT)}
    config = {"tasks": list(raw["tasks"]), **{k: raw.get(k) for k in ("model", "k", "seed", "pool_size", "test_size")}}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def select_k50(raw: dict[str, Any], name: str) -> Record:
    """``bench select-quality`` at k = 50 (``select-k50-*``): each run's test accuracy (``m.seed{s}.test_accuracy``),
    the dense ranking's split-half reliability per seed where measured (``seed{s}.dense_split_half``, n: the
    subsets) and its range over the seeds (``dense_split_half_low``, ``dense_split_half_high``, n: the seeds).
    Config: ``k``, ``queries``, ``subsets``, ``pool_size``, ``split_half_seeds``."""
    metrics = {f"{r['method']}.seed{r['seed']}.test_accuracy": Metric(r["test_accuracy"], unit=ACC)
               for r in raw.get("runs") or []}
    settings = raw.get("settings") or {}
    split = {a["seed"]: a["dense_split_half"] for a in raw.get("agreement") or []
             if a.get("dense_split_half") is not None}
    metrics |= {f"seed{s}.dense_split_half": Metric(v, n=settings.get("subsets"), unit="spearman (split-half)")
                for s, v in split.items()}
    if split:
        metrics |= {"dense_split_half_low": Metric(min(split.values()), n=len(split), unit="spearman (split-half)"),
                    "dense_split_half_high": Metric(max(split.values()), n=len(split), unit="spearman (split-half)")}
    config = {"k": raw.get("k"), **{k: settings.get(k) for k in ("queries", "subsets", "pool_size", "test_size")},
              "split_half_seeds": list(split)}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def estimators(raw: dict[str, Any], name: str) -> Record:
    """``bench estimators`` (``estimators-*``): per seed, subset budget ``b`` and estimator ``e``, the selected
    set's test accuracy (``seed{s}.budget{b}.{e}``; the last row where the record repeats one). Config: ``pairs``
    (``[seed, budget]``), ``estimators``, ``k``, ``evaluator``, ``task``."""
    cells = {(r["seed"], r["subsets"], r["estimator"]): r["test_accuracy"] for r in raw["rows"]}
    test = (raw.get("settings") or {}).get("test_size")
    metrics = {f"seed{s}.budget{b}.{e}": Metric(acc, n=test, unit=ACC) for (s, b, e), acc in cells.items()}
    config = {"pairs": [list(p) for p in dict.fromkeys((s, b) for s, b, _ in cells)],
              "estimators": list(dict.fromkeys(e for *_, e in cells)),
              **{k: raw.get(k) for k in ("k", "evaluator", "task")}}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def select_cost(raw: dict[str, Any], name: str) -> Record:
    """``bench select-cost`` (``select-cost-attention``, ``select-cost-packed``): per prompt size ``k`` and evaluator
    ``e``, the FLOPs per scored subset (``k{k}.{e}.flops``) and as a multiple of the compressed evaluator's
    (``k{k}.{e}.flops_ratio``), the seconds likewise (``k{k}.{e}.seconds``, ``k{k}.{e}.seconds_ratio``).
    Config: ``queries``, ``subsets``, ``model``, ``task``."""
    metrics: dict[str, Metric] = {}
    for r in raw["rows"]:
        at = f"k{r['k']}.{r['evaluator']}"
        metrics |= {f"{at}.flops": Metric(r.get("flops_per_subset"), unit="FLOPs per subset"),
                    f"{at}.flops_ratio": Metric(r.get("flops_vs_compressed"), unit="x the compressed FLOPs"),
                    f"{at}.seconds": Metric(r.get("seconds_per_subset"), unit="seconds per subset"),
                    f"{at}.seconds_ratio": Metric(r.get("seconds_vs_compressed"), unit="x the compressed seconds")}
    config = {k: raw.get(k) for k in ("queries", "subsets", "model", "task")}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


def paired_sets(plain: Record, other: Record) -> Record:
    """Two ``bench select-order`` reports of the same sets (:func:`select_order`'s ``record.part(rep)``), paired set
    by set over the order averaged out: ``other`` minus ``plain``, its mean (``minus``) and paired t-test
    (``minus_p``), n: the sets; per seed the mean over the methods (``seed{s}.minus``). Config: ``plain``'s,
    with ``methods`` and ``seeds`` of the pairs and ``other`` (its report)."""
    sets = plain.config["sets"][plain.config["part"]]
    diffs = {(m, s): other[f"{m}.seed{s}.averaged"].value - plain[f"{m}.seed{s}.averaged"].value for m, s in sets}
    seeds = sorted({s for _, s in diffs})
    metrics = {"minus": Metric(statistics.fmean(diffs.values()), n=len(diffs), unit=DIFF),
               "minus_p": Metric(paired_p(list(diffs.values())), n=len(diffs), unit="p (paired t-test over the sets)")}
    for seed in seeds:
        at = [d for (_, s), d in diffs.items() if s == seed]
        metrics[f"seed{seed}.minus"] = Metric(statistics.fmean(at), n=len(at), unit=DIFF)
    config = {**plain.config, "methods": list(dict.fromkeys(m for m, _ in diffs)), "seeds": seeds,
              "other": other.config["part"]}
    return Record({**plain.provenance, **other.provenance}, config, metrics, {}, f"{plain.name} + {other.name}")


def reliability_growth(fewer: Record, more: Record, seed: int = 0) -> Record:
    """Two :func:`select_k50` records at fewer and more queries, :func:`~.common.combined` as ``fewer`` and
    ``more``, with the split-half the Spearman-Brown formula predicts at ``more``'s queries from ``fewer``'s at
    ``seed`` (``predicted``, n: ``more``'s queries)."""
    factor = more.config["queries"] / fewer.config["queries"]
    predicted = spearman_brown(fewer[f"seed{seed}.dense_split_half"].value, factor)
    return combined(f"{fewer.name} + {more.name}", {"fewer": fewer, "more": more}, derived={
        "predicted": Metric(predicted, n=more.config["queries"], unit="spearman (split-half, predicted)")})


def pooled_estimators(records: list[Record], a: str = "ridge", b: str = "mean") -> Record:
    """:func:`estimators` records pooled (a later record's ``[seed, budget]`` replaces an earlier one's): estimator
    ``a`` minus ``b`` over the pairs (``{a}_minus_{b}``, n: the pairs). Config: ``seeds``, ``budgets``."""
    cells: dict[tuple[int, int], float] = {}
    for r in records:
        for s, budget in r.config["pairs"]:
            cells[s, budget] = r[f"seed{s}.budget{budget}.{a}"].value - r[f"seed{s}.budget{budget}.{b}"].value
    diffs = [cells[p] for p in sorted(cells)]
    provenance = {f"{r.name}: {stage}": p for r in records for stage, p in r.provenance.items()}
    config = {"seeds": sorted({s for s, _ in cells}), "budgets": sorted({b for _, b in cells})}
    return Record(provenance, config, {f"{a}_minus_{b}": Metric(statistics.fmean(diffs), n=len(diffs), unit=DIFF)},
                  {}, " + ".join(r.name for r in records))


FAMILIES = {"select-order-": select_order, "order-search-": order_search, "order-evaluators-": order_evaluators,
            "headroom-k20": headroom_k20, "select-k50-": select_k50, "estimators-": estimators,
            "select-cost-attention": select_cost, "select-cost-packed": select_cost}

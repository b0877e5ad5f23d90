"""The pre-registered trust evaluation (``docs/results/trust-search/``): one record per run of ``bench trust``
(:func:`trust_search_run`), and the evaluation over the runs (:func:`evaluation`): how many runs meet each
target, the gains over the median random prompt, the share of the headroom captured, the search's time.

A run's handed-over prompt is placed among its random and retrieval prompts in correct test answers (the
per-example answers its record stores, ``prompts_on_test``), a tie counting as at; a record storing no
answers is placed by the counts it stores (:func:`placed`).
"""

from __future__ import annotations

import statistics
from typing import Any

from icl_ssm.provenance import made_by_summary
from icl_ssm.records import Metric, Record

from .common import accuracy, difference

RETRIEVAL = ("bm25", "topk", "bm25 (per query)")
RT_CR = ("rotten_tomatoes", "cr")  # the tasks on which the runs are to be shown better than the median prompt
FLAG = "yes (1) or no (0)"


def correct_answers(run: dict) -> dict[str, int]:
    """Each prompt's count of correct test answers in a trust run's record (``prompts_on_test``)."""
    return {name: sum(row["correct"]) for name, row in (run.get("prompts_on_test") or {}).items()}


def best_retrieval(answers: dict) -> int | None:
    """The most correct test answers of a run's retrieval prompts (``None`` if it scored none)."""
    retrieval = [answers[n] for n in RETRIEVAL if n in answers]
    return max(retrieval) if retrieval else None


def placed(run: dict) -> dict:
    """Where a trust run's handed-over prompt stands, counted in correct test answers (a tie is
    "at"): ``{"plain": n at or above, "plain_count", "balanced", "balanced_count", "retrieval": bool}``.
    From the per-example answers a record stores (``prompts_on_test``), else its stored counts."""
    answers = correct_answers(run)
    if "handed-over" not in answers:
        plain, balanced = run.get("plain") or {}, run.get("balanced") or {}
        return {"plain": plain.get("at_or_above"), "plain_count": plain.get("count"),
                "balanced": balanced.get("at_or_above"), "balanced_count": balanced.get("count"),
                "retrieval": bool(run.get("at_or_above_retrieval"))}
    mine = answers["handed-over"]
    out = {}
    for kind in ("plain", "balanced"):
        group = [v for n, v in answers.items() if n.startswith(f"{kind}-")]
        out[kind], out[f"{kind}_count"] = sum(mine >= v for v in group), len(group)
    retrieval = best_retrieval(answers)
    out["retrieval"] = retrieval is not None and mine >= retrieval
    return out


def headroom(run: dict) -> dict | None:
    """The oracle a trust run could not see: the best of its plain random prompts on test, their
    median, and the share of the gap between the two the handed-over prompt captured, all in
    correct test answers (``None`` where the record stores no answers or the gap is 0)."""
    answers = correct_answers(run)
    plain = [v for n, v in answers.items() if n.startswith("plain-")]
    if "handed-over" not in answers or not plain:
        return None
    n = len(run["prompts_on_test"]["handed-over"]["correct"])
    oracle, median = max(plain), statistics.median(plain)
    gap = oracle - median
    return {"oracle": oracle / n, "median": median / n,
            "captured": (answers["handed-over"] - median) / gap if gap else None}


def budget_ratio(run: dict) -> float | None:
    """A trust run's search wall time over its budget (``None`` where the record has no search)."""
    search = run.get("search") or {}
    if not search.get("wall_seconds") or not search.get("budget_seconds"):
        return None
    return search["wall_seconds"] / search["budget_seconds"]


def retrieval_tie(run: dict) -> bool:
    """Whether a trust run's handed-over prompt ties the best retrieval prompt in correct test answers."""
    answers = correct_answers(run)
    return "handed-over" in answers and answers["handed-over"] == best_retrieval(answers)


def _flag(value: Any) -> Metric:
    return Metric(None if value is None else float(bool(value)), unit=FLAG)


def _against(kind: str, block: dict, where: dict, n: int | None) -> dict[str, Metric]:
    """The handed-over prompt against a run's ``kind`` random prompts (plain or label-balanced)."""
    vs = block.get("vs_median_prompt")
    count = where.get(f"{kind}_count")
    return {f"{kind}_median": accuracy(block.get("median"), n),
            f"{kind}_at_or_above": Metric(where.get(kind), n=count, unit="random prompts (of n)"),
            f"{kind}_count": Metric(count, unit="random prompts"),
            f"{kind}_vs_median": difference(vs),
            f"{kind}_shown_better": _flag(bool(block.get("shown_better")) if block or kind == "balanced" else None),
            f"{kind}_shown_worse": _flag(bool(vs and vs.get("ci95") and vs["ci95"][1] < 0))}


def trust_search_run(raw: dict[str, Any], name: str) -> Record:
    """One run of ``bench trust`` (``docs/results/trust-search/<task>-s<seed>.json``): ``handed``,
    ``zero_shot``, ``retrieval_best`` (the best retrieval prompt's stored accuracy) as accuracies over the
    test examples; per kind of random prompts (``plain``, ``balanced``), ``K_median`` (accuracy),
    ``K_at_or_above`` of ``K_count`` (correct test answers, a tie at), ``K_vs_median`` (the paired difference
    with the median prompt, its interval over test examples), ``K_shown_better`` / ``K_shown_worse`` (1 where
    that interval lies above / below 0; ``plain_shown_better`` is None where the record holds no plain
    prompts); ``at_or_above_retrieval`` and ``retrieval_tie`` (1 or 0); ``search_seconds``,
    ``budget_seconds`` and ``budget_ratio`` (the search's wall time over its budget); ``oracle`` and
    ``oracle_median`` (the best and median plain random prompt's test accuracy) and ``captured`` (the share
    of the gap between them the handed-over prompt captured), None where the record stores no answers."""
    n = raw.get("test_size")
    plain, balanced = raw.get("plain") or {}, raw.get("balanced") or {}
    where = placed(raw) if plain else {}
    room = headroom(raw) or {}
    search, retrieval = raw.get("search") or {}, raw.get("retrieval") or {}
    metrics = {
        "handed": accuracy(raw.get("handed_test_accuracy"), n),
        "zero_shot": accuracy(raw.get("zero_shot_test_accuracy"), n),
        "retrieval_best": accuracy(max(retrieval.values()) if retrieval else None, n),
        "at_or_above_retrieval": _flag(where.get("retrieval")),
        "retrieval_tie": _flag(retrieval_tie(raw)),
        "search_seconds": Metric(search.get("wall_seconds"), unit="seconds"),
        "budget_seconds": Metric(search.get("budget_seconds"), unit="seconds"),
        "budget_ratio": Metric(budget_ratio(raw), unit="wall time / budget"),
        "oracle": accuracy(room.get("oracle"), n),
        "oracle_median": accuracy(room.get("median"), n),
        "captured": Metric(room.get("captured"), unit="share of the median-to-oracle gap"),
    }
    metrics |= _against("plain", plain, where, n) | _against("balanced", balanced, where, n)
    provenance = dict(raw.get("stages_made_by") or {})
    if raw.get("scored_on_test_by"):
        provenance["test scoring"] = raw["scored_on_test_by"]
    config = {"task": raw.get("task"), "seed": raw.get("seed"), "k": raw.get("k"), "test_size": n,
              "handed_over": raw.get("handed_over"), "command": raw.get("command"), "run": raw.get("config") or {}}
    return Record(provenance or {"process": raw.get("environment")}, config, metrics,
                  {"test": list(raw.get("test_ids") or [])}, name)


def counts(runs: list[Record]) -> dict[str, int]:
    """How many of the runs (read by :func:`trust_search_run`) meet each target: at or above half, and
    three quarters, of their plain (label-balanced) random prompts; at or above the best retrieval prompt;
    shown better than the median plain (balanced) prompt, over all runs and over rotten_tomatoes and cr."""
    where = [r for r in runs if r["plain_at_or_above"].value is not None]
    shown = [r for r in runs if r["plain_shown_better"].value is not None and r.config.get("task") in RT_CR]
    balanced = [r for r in where if r["balanced_count"].value]
    value = lambda r, key: r[key].value  # noqa: E731
    return {"runs": len(runs),
            "at_or_above_median": sum(value(r, "plain_at_or_above") >= value(r, "plain_count") / 2 for r in where),
            "at_or_above_three_quarters": sum(value(r, "plain_at_or_above") >= 0.75 * value(r, "plain_count")
                                              for r in where),
            "at_or_above_three_quarters_balanced": sum(value(r, "balanced_at_or_above")
                                                       >= 0.75 * value(r, "balanced_count") for r in balanced),
            "runs_balanced": len(balanced),
            "at_or_above_retrieval": sum(bool(value(r, "at_or_above_retrieval")) for r in where),
            "shown_better": sum(bool(value(r, "plain_shown_better")) for r in runs),
            "shown_better_rt_cr": sum(bool(value(r, "plain_shown_better")) for r in shown),
            "shown_better_balanced_rt_cr": sum(bool(value(r, "balanced_shown_better")) for r in shown),
            "runs_rt_cr": len(shown)}


def shown_worse_runs(runs: list[Record]) -> list[tuple[str, int, float]]:
    """``(task, seed, paired gain)`` of the runs whose handed-over prompt is shown worse than the median plain
    random prompt (the paired interval's upper end below 0)."""
    return [(r.config["task"], r.config["seed"], r["plain_vs_median"].value) for r in runs
            if r["plain_shown_worse"].value]


def gains(runs: list[Record]) -> dict | None:
    """The handed-over prompt's paired gain over the median plain random prompt on rotten_tomatoes and cr:
    ``{"mean", "tasks": {task: mean}, "low", "low_run", "high"}`` (``None`` without such a run)."""
    shown = sorted(((r.config["task"], r.config["seed"], r["plain_vs_median"].value) for r in runs
                    if r.config.get("task") in RT_CR and r["plain_vs_median"].value is not None),
                   key=lambda x: (x[2], x[0], x[1]))
    if not shown:
        return None
    tasks = sorted({t for t, _, _ in shown})
    return {"mean": statistics.fmean(g for _, _, g in shown), "n": len(shown),
            "tasks": {t: statistics.fmean(g for u, _, g in shown if u == t) for t in tasks},
            "low": shown[0][2], "low_run": f"{shown[0][0]} seed {shown[0][1]}", "high": shown[-1][2]}


def evaluation(runs: list[Record], name: str = "trust-search/") -> Record:
    """The evaluation over the runs: each of :func:`counts` (unit runs); ``shown_worse`` (runs);
    ``gain_mean``, ``gain_low``, ``gain_high`` and ``gain.<task>`` (the paired gain over the median plain
    prompt on rotten_tomatoes and cr, averaged over those runs; config ``gain_tasks``, ``gain_low_run``);
    ``captured_median`` (the median share of the median-to-oracle gap, over the runs with a gap);
    ``budget_ratio_max`` (the longest search over its budget) over the ``timed`` runs; ``ties`` (runs at the
    best retrieval by an exact tie); ``worse.<task>-s<seed>``: the paired difference of each run shown worse
    (config ``worse``: their task and seed), its interval over test examples. Config ``made_by``: each run's
    :func:`~icl_ssm.provenance.made_by_summary` by its name. The counts and summaries have no interval."""
    c, g = counts(runs), gains(runs)
    ratios = [r["budget_ratio"].value for r in runs if r["budget_ratio"].value is not None]
    shares = [r["captured"].value for r in runs if r["captured"].value is not None]
    metrics = {key: Metric(v, unit="runs") for key, v in c.items()}
    metrics |= {"shown_worse": Metric(len(shown_worse_runs(runs)), unit="runs"),
                "captured_median": Metric(statistics.median(shares) if shares else None, n=len(shares),
                                          unit="share of the median-to-oracle gap"),
                "budget_ratio_max": Metric(max(ratios) if ratios else None, n=len(ratios), unit="wall time / budget"),
                "timed": Metric(len(ratios), unit="runs"),
                "ties": Metric(sum(bool(r["retrieval_tie"].value) for r in runs), unit="runs")}
    gain = lambda v: Metric(v, n=None if g is None else g["n"], unit="accuracy difference")  # noqa: E731
    metrics |= {f"gain_{key}": gain(g and g[key]) for key in ("mean", "low", "high")}
    metrics |= {f"gain.{t}": gain(m) for t, m in (g["tasks"] if g else {}).items()}
    worse = [r for r in runs if r["plain_shown_worse"].value]
    metrics |= {f"worse.{r.config['task']}-s{r.config['seed']}": r["plain_vs_median"] for r in worse}
    provenance = {f"{r.name} {stage}": env for r in runs for stage, env in r.provenance.items()}
    config = {"runs": [r.name for r in runs], "gain_tasks": list(g["tasks"]) if g else [],
              "gain_low_run": g and g["low_run"], "worse": [[r.config["task"], r.config["seed"]] for r in worse],
              "made_by": {r.name.split("/")[-1].removesuffix(".json"): made_by_summary(r.provenance) for r in runs}}
    return Record(provenance or {"process": None}, config, metrics, {}, name)


FAMILIES = {"trust-search/": trust_search_run}

"""Does the compressed screen earn its place? The prompt search at equal wall time, four arms:

- ``compressed``: screen on the compressor's caches, then the dense confirmation;
- ``control``: screen on the control compressor's caches (a prompt-independent state);
- ``none``: no screen, random prompts straight into the dense confirmation (random search);
- ``dense``: screen on dense caches, then the dense confirmation.

Every arm gets the same ``budget`` minutes for screen + confirmation + order search, the same
pool, validation queries and seeds; its prompt is scored on the test split (answers kept per
example). The decision rule (fixed before any run): ``run``'s default screen is the arm with the
highest mean test accuracy at the largest budget, unless its paired difference with the cheapest
arm (``none``: it needs no compressor) has a 95% interval containing 0, in which case the
cheapest arm. The interval resamples the (task, seed) runs and the test examples
(:func:`~icl_ssm.evaluate.stats.paired_bootstrap` on a runs x examples grid).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from icl_ssm import atomic
from icl_ssm.compress.builders import cache_for
from icl_ssm.compress.compressor import check_compressor_dir, load_compressor
from icl_ssm.compress.pretrained import find_pretrained
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import paired_bootstrap
from icl_ssm.lm.models import DEFAULT_MODEL, load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm.select.search import PromptSearch
from icl_ssm.select.subset_losses import CacheEvaluator

ARMS = ("compressed", "control", "none", "dense")
CHEAPEST = "none"


def search_arm(arm: str, model, builder, compressors: dict[str, Any], budget_seconds: float, *,
               screen_queries: int = 32, confirm_queries: int = 64, batch: int = 8,
               query_batch: int = 32) -> PromptSearch:
    """The search of one arm: its screen evaluator (``compressors[arm]`` for the compressed and
    control arms), the dense confirmation, label balance where the task has labels."""
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r}; accepted: {', '.join(ARMS)}")
    labels = tuple(builder.task.labels) if builder.task.kind == "classification" else ()

    def ev(cache: str, compressor=None) -> CacheEvaluator:
        return CacheEvaluator(model, builder, cache_for(cache, model, compressor), batch=batch, query_batch=query_batch,
                              balance_labels=bool(labels), flops="off")

    screen = None
    if arm in ("compressed", "control"):
        screen = ev("compressed", compressors[arm])
    elif arm == "dense":
        screen = ev("dense")
    confirm = ev("dense")
    confirm.batch = 1
    return PromptSearch(confirm=confirm, screen=screen, budget=budget_seconds, screen_queries=screen_queries,
                        confirm_queries=confirm_queries, labels=labels, screen_name=arm)


def run_search_bench(tasks: Sequence[str], seeds: Sequence[int], budgets: Sequence[float], out: str | Path, *,
                     model_name: str = DEFAULT_MODEL, k: int = 20, arms: Sequence[str] = ARMS, pool_size: int = 100,
                     test_size: int = 400, validation_size: int = 64,
                     compressors: dict[str, dict[str, str]] | None = None,
                     say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every (budget, task, seed, arm): the search, its prompt on the test split. ``compressors``:
    ``{task: {"compressed": DIR, "control": DIR}}``, each over the one shipped for the model, task
    and ``k``. Each finished run is appended to ``out/runs.jsonl`` and read back on a rerun;
    ``out/search.json`` holds the runs and the summary (:func:`summarize`)."""
    out = atomic.prepare_dir(out)
    log = out / "runs.jsonl"
    done = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    have = {(r["budget"], r["task"], r["seed"], r["arm"]) for r in done}
    model, tokenizer = load_model(model_name)
    for budget in budgets:
        for task_name in tasks:
            task = get_task(task_name)
            builder = PromptBuilder.for_model(model, tokenizer, task)
            dirs = {**_shipped(model_name, task_name, k), **(compressors or {}).get(task_name, {})}
            loaded = {arm: load_compressor(path, model.config) for arm, path in dirs.items()}
            for seed in seeds:
                splits = split(task, pool_size=pool_size, seed=seed, fit=True, k=k, min_val_size=validation_size)
                validation, test = splits.validation[:validation_size], splits.test[:test_size]
                for arm in arms:
                    if (budget, task_name, seed, arm) in have:
                        continue
                    if arm in ("compressed", "control") and arm not in loaded:
                        raise ValueError(f"arm {arm!r} needs a {arm} compressor for task {task_name!r}; none is "
                                         "shipped, pass one")
                    search = search_arm(arm, model, builder, loaded, 60.0 * budget)
                    t0 = time.perf_counter()
                    sel = search.select(splits.pool, validation, k, np.random.default_rng([seed, 3]))
                    wall = time.perf_counter() - t0
                    res = evaluate_selection(model, builder, sel.examples(splits.pool), test, per_query=True)
                    row = {"budget": budget, "task": task_name, "seed": seed, "arm": arm, "indices": sel.indices,
                           "test_accuracy": res["accuracy"], "correct": [int(c) for c in res["correct"]],
                           "wall_seconds": wall, **{key: sel.details.get(key) for key in (
                               "screened", "screen_reliability", "screen_vs_confirm_spearman", "winner_source",
                               "plan", "phases")}}
                    with log.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    done.append(row)
                    say(f"{budget:g} min, {task_name} seed {seed}, {arm}: test {res['accuracy']:.3f} "
                        f"({sel.details.get('screened')} screened, {wall:.0f} s)")
    summary = summarize(done)
    atomic.write_json(out / "search.json", {"runs": done, "summary": summary})
    atomic.write_text(out / "search.md", search_markdown(summary))
    return {"runs": done, "summary": summary}


def arm_compressors(tasks: Sequence[str], compressed: dict[str, str], control: dict[str, str]
                    ) -> dict[str, dict[str, str]]:
    """``--compressor TASK=DIR`` and ``--control TASK=DIR`` -> ``{task: {"compressed": DIR,
    "control": DIR}}`` for :func:`run_search_bench`; a task outside ``tasks`` or a directory
    without a compressor's files is refused before the model loads."""
    out: dict[str, dict[str, str]] = {}
    for arm, given, flag in (("compressed", compressed, "--compressor"), ("control", control, "--control")):
        for task, path in given.items():
            if task not in tasks:
                raise ValueError(f"{flag} {task}={path}: the task {task!r} is not among --tasks {list(tasks)}")
            try:
                check_compressor_dir(path)
            except ValueError as err:
                raise ValueError(f"{flag} {task}={path}: not a compressor directory ({err})") from None
            out.setdefault(task, {})[arm] = str(path)
    return out


def _shipped(model: str, task: str, k: int) -> dict[str, str]:
    root = find_pretrained(model, task, k)
    if root is None:
        return {}
    found = {"compressed": root / "compressor", "control": root / "control"}
    return {arm: str(path) for arm, path in found.items() if path.is_dir()}


def summarize(runs: Sequence[dict]) -> dict[str, Any]:
    """Per budget and arm: mean test accuracy over the (task, seed) runs, and the paired
    difference with the cheapest arm (interval over runs and test examples); then the rule."""
    by_budget: dict[float, dict[str, Any]] = {}
    for budget in sorted({r["budget"] for r in runs}):
        rows = [r for r in runs if r["budget"] == budget]
        keys = sorted({(r["task"], r["seed"]) for r in rows})
        table: dict[str, Any] = {}
        for arm in ARMS:
            mine = {(r["task"], r["seed"]): r for r in rows if r["arm"] == arm}
            if not mine:
                continue
            entry = {"mean": float(np.mean([m["test_accuracy"] for m in mine.values()])), "runs": len(mine),
                     "wall_max_over_budget": max(m["wall_seconds"] for m in mine.values()) / (60 * budget)}
            base = {(r["task"], r["seed"]): r for r in rows if r["arm"] == CHEAPEST}
            both = [key for key in keys if key in mine and key in base]
            if arm != CHEAPEST and both:
                grid = np.array([np.asarray(mine[key]["correct"], float) - np.asarray(base[key]["correct"], float)
                                 for key in both])
                entry["vs_cheapest"] = paired_bootstrap(grid)
            table[arm] = entry
        by_budget[budget] = table
    decision = None
    if by_budget:
        largest = by_budget[max(by_budget)]
        best = max(largest, key=lambda arm: largest[arm]["mean"])
        chosen, why = best, f"{best} has the highest mean test accuracy at {max(by_budget):g} min"
        versus = largest[best].get("vs_cheapest")
        if best != CHEAPEST and (versus is None or versus["ci95"][0] <= 0 <= versus["ci95"][1]):
            chosen = CHEAPEST
            why += f", but its paired difference with {CHEAPEST} has an interval containing 0, so {CHEAPEST}"
        decision = {"default_screen": chosen, "why": why}
    return {"budgets": {str(b): t for b, t in by_budget.items()}, "decision": decision}


def search_markdown(summary: dict) -> str:
    lines = ["| budget (min) | screen | mean test accuracy | runs | minus no screen [95% CI: runs x test examples] "
             "| longest wall / budget |", "|---:|---|---:|---:|---|---:|"]
    for budget, table in summary["budgets"].items():
        for arm, e in table.items():
            vs = e.get("vs_cheapest")
            diff = "-" if vs is None else f"{vs['mean']:+.3f} [{vs['ci95'][0]:+.3f}, {vs['ci95'][1]:+.3f}]"
            lines.append(f"| {budget} | {arm} | {e['mean']:.3f} | {e['runs']} | {diff} | "
                         f"{e['wall_max_over_budget']:.2f} |")
    if summary.get("decision"):
        lines += ["", f"Rule: {summary['decision']['why']}; `run`'s default screen: "
                      f"**{summary['decision']['default_screen']}**."]
    return "\n".join(lines) + "\n"

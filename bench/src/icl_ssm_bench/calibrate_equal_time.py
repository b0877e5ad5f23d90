"""Calibrate, then select? Five arms at their own wall time, on the same pool, validation and test:

- ``raw-search``: the prompt search as ``run`` ran it before calibration (no screen, raw losses);
- ``calibrated-random``: one label-balanced random prompt, batch-calibrated, no search;
- ``calibrated-search``: the search over (prompt, calibration) pairs (none, batch), the winner's
  calibration handed over with it;
- ``calibrated-bm25``, ``calibrated-topk``: the retrieval baselines' one prompt, batch-calibrated;
- ``calibrated-zero-shot``: no demonstrations, batch-calibrated.

A calibrated arm's bias is estimated on the run's validation inputs (their labels unread) and
applied to the test answers, as ``selection.json`` hands it to ``icl-ssm answer``. Every arm's
test answers are kept raw and calibrated, example by example, with the test example ids.

The rule, fixed in :func:`decide` before any run: over all arms and budgets, take the arm with
the highest mean test accuracy (its calibrated accuracy, raw for ``raw-search``); then, in
increasing order of mean wall time, the first arm whose paired difference from that best arm
has a 95% interval that does not lie wholly below 0 (:func:`~icl_ssm.evaluate.stats.paired_bootstrap`
over the (task, seed) runs and the test examples) is ``run``'s default. The cost target compares
that arm with ``raw-search`` at the same budget.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icl_ssm import atomic
from icl_ssm.calibrate import NONE, no_calibration
from icl_ssm.calibrate.losses import SEARCHED
from icl_ssm.compress.builders import DenseCache
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import paired_bootstrap
from icl_ssm.lm.models import DEFAULT_MODEL, load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.provenance import environment, provenance
from icl_ssm.select.base import SELECTORS
from icl_ssm.select.check import random_prompts
from icl_ssm.select.held_out import calibrate_prompt, prompt_scores
from icl_ssm.select.search import PromptSearch
from icl_ssm.select.subset_losses import CacheEvaluator

SEARCHES = ("raw-search", "calibrated-search")  # the arms that spend a budget
FIXED = ("calibrated-zero-shot", "calibrated-random", "calibrated-bm25", "calibrated-topk")  # one cost whatever it
ARMS = (*SEARCHES, *FIXED)


def arm_prompt(arm: str, model, builder: PromptBuilder, pool, validation, k: int, budget_seconds: float,
               rng: np.random.Generator) -> tuple[list[int], str, dict[str, Any]]:
    """``(pool indices in prompt order, calibration method, details)`` of one arm's prompt."""
    labels = tuple(builder.task.labels)
    if arm in SEARCHES:
        confirm = CacheEvaluator(model, builder, DenseCache(model), batch=1, query_batch=32, balance_labels=True,
                                 flops="off")
        search = PromptSearch(confirm=confirm, budget=budget_seconds, labels=labels, screen_name="none",
                              confirm_queries=min(64, len(validation)),
                              calibrations=SEARCHED if arm == "calibrated-search" else ())
        sel = search.select(pool, validation, k, rng)
        method = sel.details.get("calibration") or NONE
        return list(sel.indices), method, {key: sel.details.get(key) for key in (
            "calibration", "calibration_losses", "winner_source", "plan", "phases", "stopped")}
    if arm == "calibrated-zero-shot":
        return [], "batch", {}
    if arm == "calibrated-random":
        return random_prompts(len(pool), k, 1, rng, labels=[e.target for e in pool])[0], "batch", {}
    name = arm.removeprefix("calibrated-")
    selector = SELECTORS[name].from_config(None, model, builder) if name == "topk" else SELECTORS[name]()
    return list(selector.select(pool, validation, k, rng).indices), "batch", {}


def run_arm(arm: str, model, builder: PromptBuilder, splits, validation, test, k: int, budget: float,
            seed: int) -> dict[str, Any]:
    """One arm on one (task, seed): its prompt, its calibration estimated on ``validation``, its test
    answers raw and calibrated (0/1 per example) and its wall time (prompt and calibration)."""
    t0 = time.perf_counter()
    indices, method, details = arm_prompt(arm, model, builder, splits.pool, validation, k, 60.0 * budget,
                                          np.random.default_rng([seed, 3]))
    demos = [splits.pool[i] for i in indices]
    calibration = (no_calibration(builder.task.labels) if method == NONE else
                   calibrate_prompt(model, builder, demos, method, validation))
    wall = time.perf_counter() - t0
    scores = prompt_scores(model, builder, demos, test).double()
    gold = torch.tensor([builder.label_index(e) for e in test])
    raw = (scores.argmax(-1) == gold).int().tolist()
    cal = (calibration.apply(scores).argmax(-1) == gold).int().tolist()
    return {"indices": indices, "calibration": calibration.to_dict(), "wall_seconds": wall,
            "correct": cal, "raw_correct": raw, "test_accuracy": float(np.mean(cal)),
            "raw_test_accuracy": float(np.mean(raw)), "details": details}


def run_calibrate_bench(tasks: Sequence[str], seeds: Sequence[int], budgets: Sequence[float], out: str | Path, *,
                        model_name: str = DEFAULT_MODEL, k: int = 20, arms: Sequence[str] = ARMS,
                        pool_size: int = 100, test_size: int = 400, validation_size: int = 64,
                        say: Callable[[str], None] = print, command: str = "icl-ssm bench calibrate"
                        ) -> dict[str, Any]:
    """Every (task, seed, arm) and, for a search arm, every budget. Each finished run is appended
    to ``out/runs.jsonl`` with its provenance (commit, date, torch threads, machine) and read back
    on a rerun; ``out/calibrate.json`` holds the runs and the summary (:func:`decide`)."""
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"arms {unknown}; accepted: {', '.join(ARMS)}")
    out = atomic.prepare_dir(out)
    log = out / "runs.jsonl"
    done = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    have = {(r["budget"], r["task"], r["seed"], r["arm"]) for r in done}
    model, tokenizer = load_model(model_name)
    made_by = environment()  # this process's code: read once, so a commit made while it runs is not claimed
    started = provenance(command)  # ... and the files that differed from it then
    for task_name in tasks:
        task = get_task(task_name)
        builder = PromptBuilder.for_model(model, tokenizer, task)
        for seed in seeds:
            splits = split(task, pool_size=pool_size, seed=seed, fit=True, k=k, min_val_size=validation_size)
            validation, test = splits.validation[:validation_size], splits.test[:test_size]
            for arm in arms:
                for budget in (budgets if arm in SEARCHES else [None]):
                    if (budget, task_name, seed, arm) in have:
                        continue
                    row = run_arm(arm, model, builder, splits, validation, test, k, budget or 0.0, seed)
                    row |= {"budget": budget, "task": task_name, "seed": seed, "arm": arm,
                            "test_ids": [e.id for e in test], "provenance": made_by}
                    with log.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    done.append(row)
                    say(f"{task_name} seed {seed}, {arm}" + (f" at {budget:g} min" if budget else "")
                        + f": test {row['test_accuracy']:.3f} (raw {row['raw_test_accuracy']:.3f}, "
                        f"calibration {row['calibration']['method']}, {row['wall_seconds']:.0f} s)")
    summary = decide(done)
    record = {"provenance": started,
              "config": {"tasks": list(tasks), "seeds": list(seeds),
              "budgets": list(budgets), "model": model_name, "k": k, "arms": list(arms), "pool_size": pool_size,
              "test_size": test_size, "validation_size": validation_size}, "runs": done, "summary": summary}
    atomic.write_json(out / "calibrate.json", record)
    atomic.write_text(out / "calibrate.md", calibrate_markdown(summary))
    return record


def arm_name(run: dict[str, Any]) -> str:
    return run["arm"] if run["budget"] is None else f"{run['arm']} {run['budget']:g} min"


def decide(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rule of the module docstring. Per arm (a search arm once per budget): mean test
    accuracy (as handed over) and raw, runs, mean and longest wall seconds, and the paired
    difference from the best arm (interval over runs x test examples); then the chosen arm and
    the cost target against ``raw-search`` at the chosen arm's budget (or the largest)."""
    names = sorted({arm_name(r) for r in runs}, key=lambda n: (ARMS.index(n.split(" ")[0]), n))
    table: dict[str, dict[str, Any]] = {}
    by = {name: {(r["task"], r["seed"]): r for r in runs if arm_name(r) == name} for name in names}
    for name, mine in by.items():
        table[name] = {"mean": float(np.mean([r["test_accuracy"] for r in mine.values()])),
                       "raw_mean": float(np.mean([r["raw_test_accuracy"] for r in mine.values()])),
                       "runs": len(mine), "wall_mean": float(np.mean([r["wall_seconds"] for r in mine.values()])),
                       "wall_max": float(max(r["wall_seconds"] for r in mine.values()))}
    if not table:
        return {"arms": {}, "decision": None}
    keys = sorted(set.intersection(*(set(m) for m in by.values())))
    best = max(table, key=lambda n: table[n]["mean"])
    for name in table:
        if name != best and keys:
            grid = np.array([np.asarray(by[name][key]["correct"], float) - np.asarray(by[best][key]["correct"], float)
                             for key in keys])
            table[name]["vs_best"] = paired_bootstrap(grid)
    order = sorted(table, key=lambda n: table[n]["wall_mean"])
    chosen = next(n for n in order if n == best or table[n]["vs_best"]["ci95"][1] >= 0)
    why = (f"{best} has the highest mean test accuracy ({table[best]['mean']:.3f}); {chosen} is the cheapest arm "
           "whose paired difference from it is not shown below 0" if chosen != best else
           f"{best} has the highest mean test accuracy ({table[best]['mean']:.3f}) and every cheaper arm is shown "
           "below it")
    decision: dict[str, Any] = {"best": best, "default": chosen, "why": why, "shared_runs": len(keys)}
    budget = chosen.split(" ")[1] if " " in chosen else None
    raw = [n for n in table if n.startswith("raw-search") and (budget is None or n.split(" ")[1] == budget)]
    if raw:
        ref = max(raw, key=lambda n: float(n.split(" ")[1]))
        decision["cost_target"] = {
            "raw_search": ref, "accuracy_gap": table[chosen]["mean"] - table[ref]["mean"],
            "wall_ratio": table[chosen]["wall_mean"] / table[ref]["wall_mean"],
            "met": table[chosen]["mean"] >= table[ref]["mean"] - 0.01
            and table[chosen]["wall_mean"] <= 0.5 * table[ref]["wall_mean"]}
    return {"arms": table, "decision": decision}


def calibrate_markdown(summary: dict[str, Any]) -> str:
    lines = ["| arm | test accuracy (handed over) | raw | runs | mean wall s | minus the best [95% CI: runs x test "
             "examples] |", "|---|---:|---:|---:|---:|---|"]
    for name, e in summary["arms"].items():
        vs = e.get("vs_best")
        diff = "best" if vs is None else f"{100 * vs['mean']:+.1f} [{100 * vs['ci95'][0]:+.1f}, " \
                                         f"{100 * vs['ci95'][1]:+.1f}]"
        lines.append(f"| {name} | {100 * e['mean']:.1f} | {100 * e['raw_mean']:.1f} | {e['runs']} | "
                     f"{e['wall_mean']:.0f} | {diff} |")
    d = summary.get("decision")
    if d:
        lines += ["", f"Rule: {d['why']}; `run`'s default: **{d['default']}**."]
        c = d.get("cost_target")
        if c:
            lines.append(f"Cost target against {c['raw_search']}: accuracy {100 * c['accuracy_gap']:+.1f} points, "
                         f"wall time {c['wall_ratio']:.2f}x: {'met' if c['met'] else 'not met'}.")
    return "\n".join(lines) + "\n"

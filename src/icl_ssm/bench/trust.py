"""Can a user trust the prompt ``icl-ssm run`` hands over? ``run`` with its default settings
over several tasks and seeds, each handed-over prompt set beside random prompts of the same size
on the test split.

For every (task, seed): the pipeline (:func:`icl_ssm.pipeline.run_pipeline`), then ``random``
random k-prompts from the same pool scored on the same test examples (a random draw of its
own, not the check's prompts, which the hand-over may have picked from). A run counts as
*at or above the median* when the handed-over prompt's test accuracy is >= the median of those
random prompts, and as *low* when it is below their 25th percentile; a low run without the
check's warning is the failure the check exists to prevent.

Runs after a task's first reuse the compressor its first run found or distilled (``reuse``),
so a task without a shipped compressor is distilled once, not once per seed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from icl_ssm import atomic
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.pipeline import RunConfig, run_pipeline
from icl_ssm.select.evaluate import evaluate_selection


def random_test_accuracies(cfg: RunConfig, count: int, model, tokenizer) -> list[float]:
    """Test accuracies of ``count`` random k-prompts from ``cfg``'s pool, on ``cfg``'s test examples."""
    task = get_task(cfg.task, **cfg.task_options)
    splits = split(task, pool_size=cfg.pool_size, seed=cfg.seed, fit=True, k=cfg.k, min_val_size=cfg.queries)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    test = splits.test[: cfg.test_size]
    rng = np.random.default_rng([cfg.seed, 7])
    accs = []
    for _ in range(count):
        demos = [splits.pool[i] for i in rng.choice(len(splits.pool), cfg.k, replace=False)]
        accs.append(evaluate_selection(model, builder, demos, test, query_batch=cfg.query_batch)["accuracy"])
    return accs


def trust_row(report: dict, random_accs: Sequence[float], seconds: float) -> dict[str, Any]:
    """One run's line: what was handed over, its test accuracy against the random prompts'."""
    handed, check = report["handed_over"], report.get("check") or {}
    accs = np.asarray(random_accs, dtype=float)
    acc = handed.get("test_accuracy")
    if acc is None:  # no check ran: the method's own pick
        acc = next(s["test_accuracy"] for s in report["selections"] if s["indices"] == handed["indices"])
    median, p25 = float(np.median(accs)), float(np.percentile(accs, 25))
    method = next((s for s in report["selections"] if s["method"] == "affinity"), None)
    gate = report.get("gate") or {}
    return {
        "task": report["task"], "seed": report["seed"], "k": report["k"], "handed_over": handed["name"],
        "handed_test_accuracy": acc, "method_test_accuracy": method["test_accuracy"] if method else None,
        "method_evaluator": method.get("evaluator") if method else None, "gate": gate.get("verdict"),
        "zero_shot_test_accuracy": check.get("zero_shot_test_accuracy"),
        "random_test_accuracies": [float(a) for a in accs],
        "random_median": median, "random_p25": p25, "at_or_above_median": bool(acc >= median),
        "below_p25": bool(acc < p25),
        "warned": not handed.get("beats_random", True) or not handed.get("shown_better", True),
        "method_at_or_above_median": bool(method and method["test_accuracy"] >= median),
        "test_size": check.get("test_size"), "seconds": seconds,
    }


def run_trust(tasks: Sequence[str], seeds: Sequence[int], out: str | Path, *, random: int = 8,
              base: RunConfig | None = None, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every (task, seed) run into ``out/<task>-s<seed>``, its line in ``out/trust.json``
    (rewritten after each run; a finished run is read back, not redone)."""
    out = atomic.prepare_dir(out)
    base = base or RunConfig()
    rows: list[dict] = []
    path = out / "trust.json"
    done = {(r["task"], r["seed"]): r for r in json.loads(path.read_text())["runs"]} if path.exists() else {}
    model = tokenizer = None
    compressors = {task: base.compressor for task in tasks}
    for seed in seeds:  # seeds outermost: a run stopped early has every task at the first seeds
        for task in tasks:
            run_dir = out / f"{Path(task).stem}-s{seed}"
            if (task, seed) in done and (run_dir / "report.json").exists():
                rows.append(done[(task, seed)])
                stored = json.loads((run_dir / "report.json").read_text())["compressor"]["compressor"]
                if stored and Path(stored).is_dir():  # a run's compressor moved with its checkout is found anew
                    compressors[task] = compressors[task] or stored
                continue
            cfg = replace(base, task=task, seed=seed, compressor=compressors[task])
            t0 = time.perf_counter()
            report = run_pipeline(cfg, run_dir)
            if model is None:
                model, tokenizer = load_model(cfg.model)
            accs = random_test_accuracies(cfg, random, model, tokenizer)
            rows.append(trust_row(report, accs, time.perf_counter() - t0))
            compressors[task] = compressors[task] or report["compressor"]["compressor"]
            say(f"{task} seed {seed}: handed over {rows[-1]['handed_over']} {rows[-1]['handed_test_accuracy']:.3f}, "
                f"random median {rows[-1]['random_median']:.3f}, {rows[-1]['seconds'] / 60:.1f} min")
            atomic.write_json(path, {"config": asdict(base), "random": random, "runs": rows})
    summary = summarize_trust(rows)
    atomic.write_json(path, {"config": asdict(base), "random": random, "runs": rows, "summary": summary})
    atomic.write_text(out / "trust.md", trust_markdown(rows, summary))
    return {"runs": rows, "summary": summary}


def summarize_trust(rows: Sequence[dict]) -> dict[str, Any]:
    return {
        "runs": len(rows),
        "handed_at_or_above_median": sum(r["at_or_above_median"] for r in rows),
        "handed_below_p25": sum(r["below_p25"] for r in rows),
        "handed_below_p25_unwarned": sum(r["below_p25"] and not r["warned"] for r in rows),
        "method_at_or_above_median": sum(r["method_at_or_above_median"] for r in rows),
        "warned": sum(r["warned"] for r in rows),
    }


def trust_markdown(rows: Sequence[dict], summary: dict) -> str:
    lines = ["| task | seed | handed over | its test acc | affinity's pick (evaluator) | random median [p25] "
             "| zero-shot | warned |", "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        pick = ("-" if r["method_test_accuracy"] is None
                else f"{r['method_test_accuracy']:.3f} ({r['method_evaluator']})")
        zero = "-" if r["zero_shot_test_accuracy"] is None else f"{r['zero_shot_test_accuracy']:.3f}"
        lines.append(f"| {r['task']} | {r['seed']} | {r['handed_over']} | {r['handed_test_accuracy']:.3f} | {pick} | "
                     f"{r['random_median']:.3f} [{r['random_p25']:.3f}] | {zero} | {'yes' if r['warned'] else 'no'} |")
    s = summary
    lines += ["", f"Handed-over prompt at or above the median random prompt: {s['handed_at_or_above_median']} of "
              f"{s['runs']} runs; below the 25th percentile: {s['handed_below_p25']} ({s['handed_below_p25_unwarned']} "
              f"without the warning). Affinity's own pick at or above the median: {s['method_at_or_above_median']} "
              f"of {s['runs']}; the check warned in {s['warned']}."]
    return "\n".join(lines) + "\n"

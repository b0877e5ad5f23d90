"""Can a user trust the prompt ``icl-ssm run`` hands over? ``run`` with its default settings over
several tasks and seeds, each handed-over prompt set on the test split beside what a user would
otherwise do.

For every (task, seed): the pipeline (:func:`icl_ssm.pipeline.run_pipeline`), then on the same
test examples, each answer kept per example: ``random`` plain random k-prompts and ``random``
label-balanced ones (draws of their own, not the check's), the zero-shot prompt, the bm25 and
topk picks of the run, and per-query retrieval (bm25: k demonstrations retrieved for each test
input). Where the run calibrates (``--calibrate``), every random prompt and zero-shot is also
answered batch-calibrated (its bias estimated on the validation inputs the run's selection read,
as the handed-over prompt's was), and the handed-over prompt answers as handed over. The test
split is used for nothing else, so a paired bootstrap over its examples tells whether the
handed-over prompt is better than the median random prompt.

Each run's record is written to ``records/<task>-s<seed>.json`` under ``out`` (settings, commit,
machine, check, the random prompts on test, the handed-over prompt, timings); a finished run is
read back, not redone. Runs after a task's first reuse the compressor its first run found or
distilled, so a task without a shipped compressor is distilled once, not once per seed.
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
from icl_ssm.calibrate import Calibration, no_calibration
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import paired_bootstrap
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.pipeline import RunConfig, held_out_start, run_pipeline, run_splits
from icl_ssm.provenance import environment, record_made_by
from icl_ssm.select.check import random_prompts
from icl_ssm.select.held_out import calibrate_prompt, evaluate_calibrated, evaluate_selection
from icl_ssm.select.per_query import per_query_selection

AT_OR_ABOVE_SHARE = 0.75  # a run "holds" when the handed-over prompt is at or above 12 of 16 random prompts


def test_rows(cfg: RunConfig, model, tokenizer, prompts: dict[str, list[int]],
              calibrated: dict[str, Calibration | None] | None = None) -> dict[str, dict]:
    """Per-example test correctness of each named prompt (pool indices in prompt order). With
    ``calibrated`` (classification), each prompt it names is answered after its calibration
    (None: batch calibration estimated now on the validation inputs the run's selection read) and
    gains the row ``calibrated <name>`` beside its raw one."""
    task = get_task(cfg.task, **cfg.task_options)
    splits = run_splits(cfg, task)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    test = splits.test[: cfg.test_size]
    read = splits.validation[: held_out_start(cfg)]
    calibrated = calibrated if task.kind == "classification" else {}
    out = {}
    for name, indices in prompts.items():
        demos = [splits.pool[i] for i in indices]
        if calibrated and name in calibrated:
            cal = calibrated[name] or calibrate_prompt(model, builder, demos, "batch", read,
                                                       query_batch=cfg.query_batch)
            res = evaluate_calibrated(model, builder, demos, test, cal, query_batch=cfg.query_batch)
            out[name] = {"indices": list(indices), "accuracy": res["raw_accuracy"], "correct": res["raw_correct"]}
            out[f"calibrated {name}"] = {"indices": list(indices), "accuracy": res["accuracy"],
                                         "correct": res["correct"], "calibration": cal.to_dict()}
            continue
        res = evaluate_selection(model, builder, demos, test, per_query=True, query_batch=cfg.query_batch)
        out[name] = {"indices": list(indices), "accuracy": res["accuracy"], "correct": [int(c) for c in res["correct"]]}
    return out


def trust_run(cfg: RunConfig, report: dict, model, tokenizer, count: int, seconds: float) -> dict[str, Any]:
    """One run's record: the handed-over prompt on test beside ``count`` plain and ``count``
    label-balanced random prompts, zero-shot, the run's bm25 / topk picks and per-query bm25."""
    task = get_task(cfg.task, **cfg.task_options)
    splits = run_splits(cfg, task)
    rng = np.random.default_rng([cfg.seed, 7])
    prompts = {f"plain-{i}": p for i, p in enumerate(random_prompts(len(splits.pool), cfg.k, count, rng))}
    if task.kind == "classification":
        labels = [e.target for e in splits.pool]
        balanced = random_prompts(len(splits.pool), cfg.k, count, rng, labels=labels)
        prompts |= {f"balanced-{i}": p for i, p in enumerate(balanced)}
    handed = report["handed_over"]
    prompts["handed-over"] = list(handed["indices"])
    prompts["zero-shot"] = []
    for row in report["selections"]:
        if row.get("name") in ("bm25", "topk") and row.get("indices"):
            prompts[row["name"]] = list(row["indices"])
    calibrated = None
    if cfg.calibrate != "none":  # every random prompt and zero-shot calibrated too; the handed-over prompt as handed
        saved = handed.get("calibration")
        calibrated = {name: None for name in prompts if name.startswith(("plain-", "balanced-", "zero-shot"))}
        calibrated["handed-over"] = Calibration.from_dict(saved) if saved else no_calibration(task.labels)
    rows = test_rows(cfg, model, tokenizer, prompts, calibrated)
    if calibrated:  # the handed-over prompt answers as handed over: its calibrated row is the one judged
        rows["handed-over (raw)"], rows["handed-over"] = rows["handed-over"], rows.pop("calibrated handed-over")
    builder = PromptBuilder.for_model(model, tokenizer, task)
    test = splits.test[: cfg.test_size]
    retrieval = per_query_selection("bm25", model, builder, splits.pool, test, cfg.k)
    rows["bm25 (per query)"] = {"accuracy": retrieval["test_accuracy"],
                                "correct": [int(c) for c in retrieval["correct"]]}
    return {**summarize_run(rows), "task": report["task"], "seed": report["seed"], "k": report["k"],
            "handed_over": handed["name"], "check": {key: handed.get(key) for key in
                                                     ("reason", "replaced", "beats_random", "at_or_above",
                                                      "random_prompts", "vs_random", "shown_better")},
            "search": report.get("search") and {key: report["search"].get(key) for key in
                                               ("screen", "budget_seconds", "wall_seconds", "screened",
                                                "screen_reliability", "winner_source")},
            "fidelity_verdict": (report.get("fidelity_verdict") or {}).get("verdict"),
            "headroom": report.get("headroom") and {key: report["headroom"].get(key) for key in
                                                   ("search", "why", "reliability", "split_half",
                                                    "calibrated_spread")},
            "stages_made_by": report.get("stages_made_by"), "scored_on_test_by": environment(),
            "seconds": seconds, "test_size": len(test), "test_ids": [e.id for e in test], "prompts_on_test": rows}


def summarize_run(rows: dict[str, dict]) -> dict[str, Any]:
    """The run's figures from the per-example test rows (``rows[name]["correct"]``): the
    handed-over prompt's accuracy, how many plain / balanced random prompts it is at or above,
    whether it is at or above the best of bm25 / topk / per-query bm25, its paired difference
    with the median plain random prompt (bootstrap over the test examples) and the headroom
    (best plain random prompt on test: an oracle; the share of the median-to-oracle gap taken)."""
    mine = np.asarray(rows["handed-over"]["correct"], dtype=float)
    acc = float(mine.mean())
    out: dict[str, Any] = {"handed_test_accuracy": acc, "zero_shot_test_accuracy": rows["zero-shot"]["accuracy"]}
    for kind, prefix in (("plain", "plain-"), ("balanced", "balanced-"), ("calibrated_plain", "calibrated plain-"),
                         ("calibrated_balanced", "calibrated balanced-")):
        group = [rows[n] for n in rows if n.startswith(prefix)]
        if not group:
            continue
        accs = np.array([_accuracy(g) for g in group])
        order = np.argsort(accs, kind="stable")
        median_row = group[int(order[len(order) // 2])]
        versus = paired_bootstrap(mine - np.asarray(median_row["correct"], float))
        out[kind] = {"accuracies": accs.tolist(), "at_or_above": int((acc >= accs).sum()), "count": len(accs),
                     "median": float(np.median(accs)), "best": float(accs.max()),
                     "vs_median_prompt": versus, "shown_better": versus["ci95"][0] > 0}
        if kind == "plain":
            gap = float(accs.max() - np.median(accs))
            out["headroom"] = {"oracle": float(accs.max()), "median": float(np.median(accs)),
                               "captured": None if gap <= 0 else (acc - float(np.median(accs))) / gap}
    if "calibrated zero-shot" in rows:
        zero = np.asarray(rows["calibrated zero-shot"]["correct"], float)
        out["calibrated_zero_shot_test_accuracy"] = float(zero.mean())
        out["vs_calibrated_zero_shot"] = paired_bootstrap(mine - zero)
    if "handed-over (raw)" in rows:
        out["handed_raw_test_accuracy"] = _accuracy(rows["handed-over (raw)"])
    retrieval = {n: _accuracy(rows[n]) for n in ("bm25", "topk", "bm25 (per query)") if n in rows}
    out["retrieval"] = retrieval
    out["at_or_above_retrieval"] = bool(retrieval) and acc >= max(retrieval.values())
    return out


def _accuracy(row: dict) -> float:
    """A prompt's test accuracy from its per-example answers, in the precision the handed-over
    prompt's is computed in: a tie in correct answers compares equal (a float32 accuracy would not)."""
    return float(np.mean(row["correct"])) if row.get("correct") is not None else float(row["accuracy"])


def run_trust(tasks: Sequence[str], seeds: Sequence[int], out: str | Path, *, random: int = 16,
              base: RunConfig | None = None, say: Callable[[str], None] = print,
              records: str | Path | None = None) -> dict[str, Any]:
    """Every (task, seed) run into ``out/<task>-s<seed>``, its record in ``records`` (default
    ``out/records``) as ``<task>-s<seed>.json``, and the summary in ``out/trust.json`` and
    ``out/trust.md``."""
    out = atomic.prepare_dir(out)
    records = atomic.prepare_dir(records or out / "records")
    base = base or RunConfig()
    env = environment()
    rows: list[dict] = []
    model = tokenizer = None
    compressors = {task: base.compressor for task in tasks}
    for seed in seeds:  # seeds outermost: a run stopped early has every task at the first seeds
        for task in tasks:
            name = f"{Path(task).stem}-s{seed}"
            record_path = records / f"{name}.json"
            if record_path.exists():
                rows.append(json.loads(record_path.read_text()))
                stored = rows[-1].get("compressor")
                if stored and Path(stored).is_dir():  # a run's compressor moved with its checkout is found anew
                    compressors[task] = compressors[task] or stored
                continue
            cfg = replace(base, task=task, seed=seed, compressor=compressors[task])
            t0 = time.perf_counter()
            report = run_pipeline(cfg, out / name)
            seconds = time.perf_counter() - t0
            if model is None:
                model, tokenizer = load_model(cfg.model)
            row = trust_run(cfg, report, model, tokenizer, random, seconds)
            row.update(config=asdict(cfg), environment=env, compressor=report["compressor"]["compressor"],
                       command="icl-ssm bench trust")
            atomic.write_json(record_path, row)
            rows.append(json.loads(record_path.read_text()))  # as a later call reads it back
            compressors[task] = compressors[task] or report["compressor"]["compressor"]
            plain = row.get("plain", {})
            say(f"{task} seed {seed}: handed over {row['handed_over']} {row['handed_test_accuracy']:.3f}, at or above "
                f"{plain.get('at_or_above')} of {plain.get('count')} random prompts, {seconds / 60:.1f} min")
    summary = summarize_trust(rows)
    atomic.write_json(out / "trust.json", {"config": asdict(base), "random": random, "environment": env,
                                           "runs": [r["task"] + f"-s{r['seed']}" for r in rows], "summary": summary})
    atomic.write_text(out / "trust.md", trust_markdown(rows, summary))
    return {"runs": rows, "summary": summary}


def summarize_trust(rows: Sequence[dict]) -> dict[str, Any]:
    """The counts the targets are read from, over the runs."""
    def holds(r: dict, kind: str) -> bool:
        g = r.get(kind)
        return bool(g) and g["at_or_above"] >= AT_OR_ABOVE_SHARE * g["count"]

    shown = [r for r in rows if r.get("plain") and r["task"] in ("rotten_tomatoes", "cr")]
    search = [r["search"] for r in rows if r.get("search")]
    return {
        "runs": len(rows),
        "at_or_above_three_quarters_plain": sum(holds(r, "plain") for r in rows),
        "at_or_above_three_quarters_balanced": sum(holds(r, "balanced") for r in rows),
        "at_or_above_retrieval": sum(bool(r.get("at_or_above_retrieval")) for r in rows),
        "shown_better_than_median_plain_rt_cr": sum(r["plain"]["shown_better"] for r in shown),
        "shown_better_than_median_balanced_rt_cr": sum(bool(r.get("balanced", {}).get("shown_better"))
                                                       for r in shown),
        "runs_rt_cr": len(shown),
        "search_within_1_1_budget": sum(s["wall_seconds"] <= 1.1 * s["budget_seconds"] for s in search),
        "search_runs": len(search),
        "headroom_captured_median": _median([(r.get("headroom") or {}).get("captured") for r in rows]),
    }


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.median(kept)) if kept else None


def trust_markdown(rows: Sequence[dict], summary: dict) -> str:
    lines = ["| task | seed | handed over | test acc | plain random: at or above / median / best | balanced random: "
             "at or above / median | vs median plain prompt [95% CI, test examples] | best retrieval | zero-shot "
             "| gap taken |", "|---|---:|---|---:|---|---|---|---:|---:|---:|"]
    for r in rows:
        p, b = r.get("plain") or {}, r.get("balanced") or {}
        vs = p.get("vs_median_prompt") or {}
        ci = vs.get("ci95") or [None, None]
        retrieval = max(r["retrieval"].values()) if r.get("retrieval") else None
        taken = (r.get("headroom") or {}).get("captured")
        lines.append(
            f"| {r['task']} | {r['seed']} | {r['handed_over']} | {r['handed_test_accuracy']:.3f} | "
            f"{p.get('at_or_above', '-')}/{p.get('count', '-')} / {_f(p.get('median'))} / {_f(p.get('best'))} | "
            + (f"{b['at_or_above']}/{b['count']} / {_f(b['median'])}" if b else "-")
            + f" | {_f(vs.get('mean'), '+.3f')} [{_f(ci[0], '+.3f')}, {_f(ci[1], '+.3f')}] | {_f(retrieval)} | "
            f"{_f(r.get('zero_shot_test_accuracy'))} | {_f(taken, '.0%')} |")
    s = summary
    lines += ["", f"Handed-over prompt at or above 3/4 of the plain random prompts on test: "
              f"{s['at_or_above_three_quarters_plain']} of {s['runs']} runs (label-balanced ones: "
              f"{s['at_or_above_three_quarters_balanced']}); at or above the best retrieval: "
              f"{s['at_or_above_retrieval']}; shown better than the median plain random prompt on "
              f"rotten_tomatoes and cr: {s['shown_better_than_median_plain_rt_cr']} of {s['runs_rt_cr']} (balanced: "
              f"{s['shown_better_than_median_balanced_rt_cr']}); the search within 1.1x its budget in "
              f"{s['search_within_1_1_budget']} of {s['search_runs']}."]
    mixed = [f"{r['task']} seed {r['seed']} {m}" for r in rows if (m := record_made_by(r)["mixed"])]
    if mixed:
        lines += ["", "Runs made by more than one commit or thread count: " + "; ".join(mixed) + "."]
    return "\n".join(lines) + "\n"


def _f(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)

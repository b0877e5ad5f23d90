"""The report stage: ``report.md``, ``report.json``, plots, ``selected.jsonl``, ``prompt.txt`` and
``selection.json``."""

from __future__ import annotations

from dataclasses import asdict

from icl_ssm import atomic
from icl_ssm.calibrate import Calibration
from icl_ssm.pipeline.check import preferred_pick
from icl_ssm.pipeline.compressor import CompressorChoice
from icl_ssm.pipeline.config import QUICK, held_out_start
from icl_ssm.pipeline.context import Run
from icl_ssm.pipeline.evaluator import EvaluatorChoice
from icl_ssm.select.check import ZERO_SHOT
from icl_ssm.select.outputs import selected_rows
from icl_ssm.select.selected import SelectedPrompt, pool_spec
from icl_ssm.select.selection_parts import compressor_fidelity

_SEARCH_KEYS = ("screen", "plan", "budget_seconds", "wall_seconds", "phases", "screened", "sources",
                "screen_queries", "confirm_queries", "screen_split_half", "screen_reliability",
                "screen_vs_confirm_spearman", "rungs", "stopped", "slower_than_pilot", "winner_source",
                "winner_confirm_loss", "order_search")
_ROW_KEYS = ("method", "evaluator", "test_accuracy", "flops", "wall_seconds", "subsets", "indices", "labels",
             "test_size", "test_accuracy_orders", "test_accuracy_order_mean", "test_accuracy_std", "reliability",
             "queries_used", "validation_size", "score_reliability")


def report_rows(selections: dict[str, dict], check: dict | None) -> list[dict]:
    """The report's rows, one per selection method (the search, the quick calibrated prompt and
    affinity's runs first, each titled for what it is; affinity with its dense run's cost beside it)
    and zero-shot last where the check measured it (what the prompt is measured against)."""
    dense = selections.get("affinity-dense")
    titles = {QUICK: "calibrated random prompt", "affinity-dense": "affinity (dense)",
              "affinity-equal-cost": "affinity (dense's time)",
              "search": "search (whole prompts)"}
    first = ["search", QUICK, "affinity", "affinity-dense", "affinity-equal-cost"]
    rows = []
    for name in first + [n for n in selections if n not in first]:
        if name not in selections:
            continue
        s = selections[name]
        row = {key: s.get(key) for key in _ROW_KEYS} | {"method": titles.get(name, s.get("method")), "name": name}
        if name == "affinity" and dense is not None:
            row.update(dense_flops=dense["flops"], dense_wall_seconds=dense["wall_seconds"],
                       dense_test_accuracy=dense["test_accuracy"])
        rows.append(row)
    if check and check.get("zero_shot_test_accuracy") is not None:
        rows.append({"method": "zero-shot", "name": ZERO_SHOT, "evaluator": None,
                     "test_accuracy": check["zero_shot_test_accuracy"], "test_size": check.get("test_size"),
                     "flops": 0, "wall_seconds": None, "indices": []})
    return rows


def write_outputs(run: Run, comp: CompressorChoice, fidelity: dict | None, selections: dict[str, dict],
                  check: dict | None = None, verdict: EvaluatorChoice | None = None,
                  headroom: dict | None = None) -> dict:
    """selected.jsonl + prompt.txt (the prompt handed over: the method's pick when it passed the
    check against random prompts, else the best-checked prompt) and the report."""
    from icl_ssm.report.write import write_report

    cfg, out, pool = run.cfg, run.out, run.splits.pool
    preferred = (check or {}).get("preferred") or preferred_pick(selections)
    pick = selections[preferred]
    handed = (check or {}).get("handed_over") or {"name": preferred, "indices": pick["indices"]}
    scores = pick.get("scores") if handed["indices"] == pick["indices"] else None
    scores = scores or [None] * len(pool)
    atomic.write_jsonl(out / "selected.jsonl", selected_rows(pool, handed["indices"], scores))
    made = pool_spec(pool, size=cfg.pool_size, seed=cfg.seed, k=cfg.k,
                     min_validation=held_out_start(cfg) + cfg.check_size)
    calibration = Calibration.from_dict(handed["calibration"]) if handed.get("calibration") else None
    measured = None if verdict is None else verdict.as_dict()
    handed_over = SelectedPrompt.from_pool(pool, handed["indices"], model=cfg.model, task=run.task,
                                           method=handed["name"], task_options=cfg.task_options, pool_made=made,
                                           compressor=comp.compressor,
                                           fidelity=compressor_fidelity(comp.compressor, measured),
                                           calibration=calibration)
    handed_over.save(out)  # selection.json: what icl-ssm answer loads
    atomic.write_text(out / "prompt.txt", run.builder.build_prefix([pool[i] for i in handed["indices"]]).text)
    search = selections.get("search")
    report = {
        "model": cfg.model, "task": cfg.task, "k": cfg.k, "seed": cfg.seed,
        "compressor": comp.as_dict(),
        "fidelity": None if fidelity is None else {k: v for k, v in fidelity.items() if k not in ("config", "argv")},
        "selections": report_rows(selections, check),
        "affinity_scores": selections["affinity"]["scores"] if "affinity" in selections else None,
        "picks": {name: s["indices"] for name, s in selections.items()}, "preferred": preferred,
        "prompt_file": "prompt.txt", "selected_file": "selected.jsonl",
        "pool_size": len(pool), "run_config": asdict(cfg), "check": check, "handed_over": handed,
        "fidelity_verdict": measured,
        "search": None if search is None else {key: search.get(key) for key in _SEARCH_KEYS},
        "headroom": headroom, **run.stages.provenance(),
    }
    write_report(out, report)
    return report

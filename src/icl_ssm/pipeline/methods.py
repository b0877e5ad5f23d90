"""The selection stages' settings beyond the plain methods: the prompt search's, affinity at
equal cost, the headroom after calibration and the calibrated random prompt handed over
without a search."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np

from icl_ssm.pipeline.config import QUICK, RunConfig
from icl_ssm.pipeline.context import Run
from icl_ssm.pipeline.evaluator import EvaluatorChoice
from icl_ssm.pipeline.stages import say, stage_bar, stage_key
from icl_ssm.select.base import Hooks
from icl_ssm.select.config import EVALUATED, SelectConfig
from icl_ssm.select.headroom import HEADROOM_PROMPTS, MIN_RELIABILITY, can_add, measure_headroom
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm.select.stage import select_demonstrations


def method_configs(cfg: RunConfig, base: SelectConfig, verdict: EvaluatorChoice) -> list[tuple[str, SelectConfig]]:
    """``(stage name, settings)`` of every plain method asked (the search comes later): affinity
    and BRIDGE on the verdict's evaluator and, with ``--dense-evaluator`` where that is the
    compressed one, affinity again on dense caches right after it."""
    runs = [(m, replace(base, method=m, stratify=cfg.stratify and m == "affinity")) for m in cfg.methods
            if m != "search"]
    runs = [(m, replace(s, evaluator=verdict.evaluator) if m in EVALUATED else s) for m, s in runs]
    if cfg.dense_evaluator and "affinity" in cfg.methods and verdict.compressed:
        at = next(i for i, (m, _) in enumerate(runs) if m == "affinity") + 1
        runs.insert(at, ("affinity-dense", replace(base, method="affinity", evaluator="dense", stratify=cfg.stratify)))
    return runs


def selection_stages(run: Run, base: SelectConfig, verdict: EvaluatorChoice, compressor,
                     room: dict | None) -> dict[str, dict]:
    """Stage 3, ``select-<name>`` for every method asked, each stored as it ends: the plain methods,
    then (last, so that their picks are among the prompts it screens) the search, or, where the
    headroom says no search can add, a calibrated random prompt at once; then affinity at the
    dense evaluator's cost when asked."""
    cfg = run.cfg
    selections: dict[str, dict] = {}
    if room is not None and not room["search"]:
        selections[QUICK] = quick_selection(run, room)
    for name, scfg in method_configs(cfg, base, verdict):
        selections[name] = select_stage(run, name, scfg, compressor)
    if "search" in cfg.methods and QUICK not in selections:
        selections["search"] = select_stage(run, "search", search_config(cfg, base, verdict, selections), compressor)
    if cfg.equal_cost and "affinity-dense" in selections and verdict.compressed:
        selections["affinity-equal-cost"] = equal_cost_stage(run, base, selections["affinity-dense"], compressor)
    return selections


def select_stage(run: Run, name: str, scfg: SelectConfig, compressor) -> dict:
    """One method's selection and its test score (:func:`~icl_ssm.select.stage.select_demonstrations`),
    kept as ``select-<name>`` under the key of its settings (skipped when kept before)."""
    key = stage_key([asdict(scfg), scfg.compressor])
    result = run.stages.get(f"select-{name}", key)
    if result is not None:
        say(f"select {name}: done before, skipped")
        return result
    with stage_bar(f"select {name}", "subsets") as (on_start, advance):
        hooks = Hooks(lambda line: say(f"select {name}: {line}"), advance, on_start)
        selection, summary, _ = select_demonstrations(scfg, run.model, run.tokenizer, compressor, splits=run.splits,
                                                      builder=run.builder, hooks=hooks)
    summary["scores"] = [None if s != s else float(s) for s in selection.scores.tolist()]
    return run.stages.put(f"select-{name}", key, summary)


def search_config(cfg: RunConfig, base: SelectConfig, verdict: EvaluatorChoice,
                  selections: dict[str, dict]) -> SelectConfig:
    """The prompt search's settings: its screen (``none`` by default, i.e. random search into the
    dense confirmation; ``auto``: the compressed caches where the fidelity verdict trusts them, else
    none) and the other methods' picks as seeds."""
    screen = cfg.screen
    if screen == "auto":
        screen = "compressed" if verdict.compressed else "none"
        why = ("the fidelity verdict passed the compressed caches" if screen == "compressed" else
               "no compressor" if not base.compressor else "the fidelity verdict failed the compressed caches")
        say(f"search: screen {screen} ({why}; --screen chooses)")
    elif screen == "none":
        say("search: no screen, random prompts straight into the dense confirmation (at equal time no screen beat "
            "this in the pre-registered experiment; --screen auto screens on compressed caches that pass the "
            "fidelity verdict)")
    seeds = {name: list(s["indices"]) for name, s in selections.items() if s.get("indices")}
    calibrations = {"search": ("none", "batch"), "batch": ("batch",), "none": ()}[cfg.calibrate]
    return replace(base, method="search", screen=screen, search_minutes=cfg.search_minutes,
                   screen_queries=cfg.screen_queries, confirm_queries=cfg.confirm_queries, seeds=seeds,
                   test_orders=cfg.test_orders, search_calibrations=calibrations)


def equal_cost_stage(run: Run, base: SelectConfig, dense: dict, compressor) -> dict:
    """Affinity on compressed caches given the dense evaluator's wall time as its budget
    (:mod:`icl_ssm.select.budget`): what the cheaper evaluation buys in subsets, queries and
    reliability. Its queries may grow beyond ``cfg.queries`` into the validation examples after
    the check's (never into them)."""
    cfg, splits = run.cfg, run.splits
    spare = splits.validation[: cfg.queries] + splits.validation[cfg.queries + cfg.check_size:]
    minutes = dense["wall_seconds"] / 60
    scfg = replace(base, method="affinity", evaluator="compressed", subsets=None, budget=minutes,
                   queries=len(spare), stratify=cfg.stratify)
    key = stage_key([asdict(scfg), scfg.compressor])
    result = run.stages.get("select-affinity-equal-cost", key)
    if result is not None:
        say("select affinity at the dense evaluator's cost: done before, skipped")
        return result
    say(f"select affinity on compressed caches in the dense evaluator's time ({dense['wall_seconds']:.0f} s)")
    with stage_bar("select affinity (equal cost)", "subsets") as (on_start, advance):
        selection, summary, _ = select_demonstrations(
            scfg, run.model, run.tokenizer, compressor, splits=replace(splits, validation=spare), builder=run.builder,
            hooks=Hooks(lambda line: say(f"select affinity (equal cost): {line}"), advance, on_start))
    summary["scores"] = [None if s != s else float(s) for s in selection.scores.tolist()]
    return run.stages.put("select-affinity-equal-cost", key, summary)


def headroom_stage(run: Run) -> dict | None:
    """Before the search: how far calibrated random prompts still differ, and whether validation can
    rank them (:mod:`icl_ssm.select.headroom`); the rule there decides whether the search runs.
    None where it is not measured (no calibration, no search, ``--no-headroom``, a generative task)."""
    cfg = run.cfg
    if cfg.calibrate == "none" or "search" not in cfg.methods or not cfg.headroom or not run.classification:
        return None
    read = run.read
    key = stage_key([cfg.model, cfg.task, cfg.task_options, cfg.k, cfg.seed, cfg.pool_size, [e.id for e in read],
                HEADROOM_PROMPTS, MIN_RELIABILITY])
    done = run.stages.get("headroom", key)
    if done is None:
        with stage_bar("headroom after calibration", "prompts") as (on_start, advance):
            on_start(HEADROOM_PROMPTS)
            done = measure_headroom(run.model, run.builder, run.splits.pool, read, cfg.k,
                                    np.random.default_rng([cfg.seed, 5]), query_batch=cfg.query_batch)
            advance(HEADROOM_PROMPTS)
        search, why = can_add(done)
        done = run.stages.put("headroom", key, {**done, "search": search, "why": why})
    say(f"headroom: {done['why']}")
    return done


def quick_selection(run: Run, room: dict) -> dict:
    """The prompt handed over where the headroom says a search cannot add: the first of the headroom's
    label-balanced random prompts (not the best on validation, which cannot rank them), batch-calibrated."""
    cfg, test = run.cfg, run.test
    indices = list(room["prompts"][0])
    scored = evaluate_selection(run.model, run.builder, [run.splits.pool[i] for i in indices], test,
                                query_batch=cfg.query_batch)
    return {"method": "calibrated random prompt", "indices": indices, "test_accuracy": scored["accuracy"],
            "test_size": len(test), "flops": None, "wall_seconds": room["seconds"],
            "calibrations": ["batch"], "calibration": "batch", "labels": None}

"""The selection stages' settings beyond the plain methods: the prompt search's, affinity at
equal cost, the headroom after calibration and the calibrated random prompt handed over
without a search."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np

from icl_ssm.data.splits import Splits
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.pipeline.config import RunConfig, held_out_start
from icl_ssm.pipeline.stages import Stages, say, stage_bar, stage_key
from icl_ssm.select.base import Hooks
from icl_ssm.select.config import SelectConfig
from icl_ssm.select.evaluate import evaluate_selection
from icl_ssm.select.headroom import HEADROOM_PROMPTS, MIN_RELIABILITY, can_add, measure_headroom
from icl_ssm.select.run import select_demonstrations


def search_config(cfg: RunConfig, base: SelectConfig, verdict: dict, selections: dict[str, dict]) -> SelectConfig:
    """The prompt search's settings: its screen (``none`` by default, i.e. random search into the
    dense confirmation; ``auto``: the compressed caches where the fidelity verdict trusts them, else
    none) and the other methods' picks as seeds."""
    screen = cfg.screen
    if screen == "auto":
        screen = "compressed" if verdict["evaluator"] == "compressed" else "none"
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


def equal_cost_stage(cfg: RunConfig, stages: Stages, base: SelectConfig, dense: dict, splits: Splits, model,
                     tokenizer, compressor, comp: dict) -> dict:
    """Affinity on compressed caches given the dense evaluator's wall time as its budget
    (:mod:`icl_ssm.select.budget`): what the cheaper evaluation buys in subsets, queries and
    reliability. Its queries may grow beyond ``cfg.queries`` into the validation examples after
    the check's (never into them)."""
    spare = splits.validation[: cfg.queries] + splits.validation[cfg.queries + cfg.check_size:]
    minutes = dense["wall_seconds"] / 60
    scfg = replace(base, method="affinity", evaluator="compressed", subsets=None, budget=minutes,
                   queries=len(spare), stratify=cfg.stratify)
    key = stage_key([asdict(scfg), comp["compressor"]])
    result = stages.get("select-affinity-equal-cost", key)
    if result is not None:
        say("select affinity at the dense evaluator's cost: done before, skipped")
        return result
    say(f"select affinity on compressed caches in the dense evaluator's time ({dense['wall_seconds']:.0f} s)")
    with stage_bar("select affinity (equal cost)", "subsets") as (on_start, advance):
        selection, summary, _ = select_demonstrations(
            scfg, model, tokenizer, compressor, splits=replace(splits, validation=spare),
            hooks=Hooks(lambda line: say(f"select affinity (equal cost): {line}"), advance, on_start))
    summary["scores"] = [None if s != s else float(s) for s in selection.scores.tolist()]
    return stages.put("select-affinity-equal-cost", key, summary)


def headroom_stage(cfg: RunConfig, stages: Stages, splits: Splits, model, tokenizer) -> dict | None:
    """Before the search: how far calibrated random prompts still differ, and whether validation can
    rank them (:mod:`icl_ssm.select.headroom`); the rule there decides whether the search runs.
    None where it is not measured (no calibration, no search, ``--no-headroom``, a generative task)."""
    task = get_task(cfg.task, **cfg.task_options)
    if cfg.calibrate == "none" or "search" not in cfg.methods or not cfg.headroom or task.kind != "classification":
        return None
    read = splits.validation[: held_out_start(cfg)]
    key = stage_key([cfg.model, cfg.task, cfg.task_options, cfg.k, cfg.seed, cfg.pool_size, [e.id for e in read],
                HEADROOM_PROMPTS, MIN_RELIABILITY])
    done = stages.get("headroom", key)
    if done is None:
        builder = PromptBuilder.for_model(model, tokenizer, task)
        with stage_bar("headroom after calibration", "prompts") as (on_start, advance):
            on_start(HEADROOM_PROMPTS)
            done = measure_headroom(model, builder, splits.pool, read, cfg.k, np.random.default_rng([cfg.seed, 5]),
                                    query_batch=cfg.query_batch)
            advance(HEADROOM_PROMPTS)
        search, why = can_add(done)
        done = stages.put("headroom", key, {**done, "search": search, "why": why})
    say(f"headroom: {done['why']}")
    return done


def quick_selection(cfg: RunConfig, room: dict, splits: Splits, model, tokenizer) -> dict:
    """The prompt handed over where the headroom says a search cannot add: the first of the headroom's
    label-balanced random prompts (not the best on validation, which cannot rank them), batch-calibrated."""
    task = get_task(cfg.task, **cfg.task_options)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    indices = list(room["prompts"][0])
    scored = evaluate_selection(model, builder, [splits.pool[i] for i in indices], splits.test[: cfg.test_size],
                                query_batch=cfg.query_batch)
    return {"method": "calibrated random prompt", "indices": indices, "test_accuracy": scored["accuracy"],
            "test_size": min(cfg.test_size, len(splits.test)), "flops": None, "wall_seconds": room["seconds"],
            "calibrations": ["batch"], "calibration": "batch", "labels": None}

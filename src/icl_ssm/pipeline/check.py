"""The check stage: every pick, zero-shot and random prompts, raw and calibrated, on held-out
examples, and the prompt handed over."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from icl_ssm.calibrate import no_calibration
from icl_ssm.pipeline.config import QUICK, held_out_start
from icl_ssm.pipeline.context import Run
from icl_ssm.pipeline.stages import say, stage_key
from icl_ssm.select.check import CALIBRATED, ZERO_SHOT, check_prompts, hand_over
from icl_ssm.select.held_out import calibrate_prompt, evaluate_calibrated, evaluate_selection


def pick_calibration(run: Run, selection: dict):
    """A pick's calibration, estimated on the inputs selection read (:attr:`Run.read`, labels
    unread): the search's winner keeps the calibration it won with (with ``--calibrate search``);
    every other pick is batch-calibrated."""
    method = selection.get("calibration") if selection.get("calibrations") else "batch"
    method = method or "none"
    demos = [run.splits.pool[i] for i in selection["indices"]]
    return None if method == "none" else calibrate_prompt(run.model, run.builder, demos, method, run.read,
                                                          query_batch=run.cfg.query_batch)


def calibration_summary(handed: dict, randoms: list[dict], zero: dict, test_size: int) -> dict:
    """What calibration and selection each earned on the test split: the handed-over prompt raw and
    as handed over, the median random prompt raw and batch-calibrated, zero-shot raw and
    calibrated, and the gain over the median raw random prompt split into calibration (the median
    calibrated minus the median raw random prompt) and selection (the handed-over prompt minus the
    median calibrated random prompt)."""
    raw = float(np.median([r["test_accuracy"] for r in randoms]))
    cal = float(np.median([r["calibrated_test_accuracy"] for r in randoms]))
    return {"test_size": test_size, "random_prompts": len(randoms), "handed": handed["test_accuracy"],
            "handed_raw": handed["raw_test_accuracy"], "random_median_raw": raw, "random_median_calibrated": cal,
            "zero_shot_raw": zero["raw_accuracy"], "zero_shot_calibrated": zero["accuracy"],
            "gain_over_random_raw": handed["test_accuracy"] - raw, "from_calibration": cal - raw,
            "from_selection": handed["test_accuracy"] - cal}


def preferred_pick(selections: dict[str, dict]) -> str:
    """The stage whose pick the check judges: the search, else the quick calibrated prompt, else
    affinity, else the first run."""
    return next((m for m in ("search", QUICK, "affinity") if m in selections), next(iter(selections)))


def random_test_accuracies(run: Run, randoms: list[dict], calibrate: bool) -> None:
    """Each random prompt's ``test_accuracy`` on the test split (the spread a user meets without
    selection), raw; with ``calibrate`` also its ``calibrated_test_accuracy``, batch-calibrated on
    the test inputs (what calibrating a random prompt gives). ``randoms``: the check's rows, updated."""
    for row in randoms:
        demos = [run.splits.pool[i] for i in row["indices"]]
        if calibrate:
            scored = evaluate_calibrated(run.model, run.builder, demos, run.test, query_batch=run.cfg.query_batch)
            row["test_accuracy"], row["calibrated_test_accuracy"] = scored["raw_accuracy"], scored["accuracy"]
        else:
            row["test_accuracy"] = evaluate_selection(run.model, run.builder, demos, run.test,
                                                      query_batch=run.cfg.query_batch)["accuracy"]


def calibrated_hand_over(run: Run, handed: dict, calibrations: dict) -> None:
    """The handed-over prompt's ``calibration`` and its ``test_accuracy`` as handed over (with that
    calibration) and raw (``raw_test_accuracy``), into ``handed``: a pick keeps its own calibration
    (``calibrations``); a calibrated random prompt or zero-shot is batch-calibrated on the inputs
    selection read."""
    name = handed["name"]
    chosen = calibrations.get(name)
    demos = [run.splits.pool[i] for i in handed["indices"]]
    if name.startswith(CALIBRATED):  # a calibrated random prompt or zero-shot: its bias on the inputs read
        chosen = calibrate_prompt(run.model, run.builder, demos, "batch", run.read)
    handed["calibration"] = None if chosen is None else chosen.to_dict()
    scored = evaluate_calibrated(run.model, run.builder, demos, run.test, chosen or no_calibration(run.task.labels),
                                 query_batch=run.cfg.query_batch)
    handed["test_accuracy"], handed["raw_test_accuracy"] = scored["accuracy"], scored["raw_accuracy"]


def raw_test_accuracy(name: str, selections: dict[str, dict], zero: float, randoms: list[dict]) -> float:
    """The test accuracy of the prompt handed over raw, as measured before: its method's, zero-shot's
    (``zero``) or its random prompt's (``random-i``: ``randoms[i]``)."""
    if name in selections:
        return selections[name]["test_accuracy"]
    if name == ZERO_SHOT:
        return zero
    return randoms[int(name.split("-")[1])]["test_accuracy"]


def check_stage(run: Run, selections: dict[str, dict]) -> dict:
    """Every method's pick, zero-shot and ``cfg.random_prompts`` random prompts (drawn under the
    run's ``--per-label`` and ``--order`` rules) on held-out validation examples (those after the
    ones selection read), then which prompt to hand over and why
    (:func:`~icl_ssm.select.check.hand_over`); also the test accuracy of zero-shot and of every
    random prompt (the spread a user would meet without selection)."""
    preferred = preferred_pick(selections)
    # the search screened and confirmed the other picks already: only its own is checked beside random prompts
    names = [preferred] if preferred in ("search", QUICK) else list(selections)
    candidates = {name: selections[name]["indices"] for name in names}
    cfg, stages, splits, test = run.cfg, run.stages, run.splits, run.test
    key = stage_key([candidates, asdict(cfg), "check-v3"])
    done = stages.get("check", key)
    if done is not None:
        say("check: done before, skipped")
        return done
    zero = evaluate_selection(run.model, run.builder, [], test, query_batch=cfg.query_batch)["accuracy"]
    start = held_out_start(cfg)
    held_out = splits.validation[start: start + cfg.check_size]
    if not held_out:
        say(f"warning: no validation examples are left after the {start} selection read, so the chosen "
            "prompt is not checked against random prompts; use a larger file or fewer --queries")
        return stages.put("check", key, {"skipped": True, "zero_shot_test_accuracy": zero, "test_size": len(test)})
    if len(held_out) < cfg.check_size:
        say(f"warning: only {len(held_out)} validation examples are left for the check (--check-size "
            f"{cfg.check_size}); it can tell only large differences apart")
    labels = [e.target for e in splits.pool] if cfg.per_label else None
    calibrate = cfg.calibrate != "none" and run.classification
    calibrations = {name: pick_calibration(run, selections[name]) for name in candidates} if calibrate else {}
    result = check_prompts(run.model, run.builder, splits.pool, held_out, candidates, cfg.k,
                           np.random.default_rng([cfg.seed, 1]), random_count=cfg.random_prompts,
                           query_batch=cfg.query_batch, labels=labels, order=cfg.order, calibrations=calibrations,
                           calibrated_alternatives=calibrate)
    handed = hand_over(result, preferred, keep=cfg.keep_selection)
    random_test_accuracies(run, result["random"], calibrate)
    if calibrate:
        calibrated_hand_over(run, handed, calibrations)
        zero_cal = evaluate_calibrated(run.model, run.builder, [], test, query_batch=cfg.query_batch)
        result["calibrated"] = calibration_summary(handed, result["random"], zero_cal, len(test))
    else:
        handed["test_accuracy"] = raw_test_accuracy(handed["name"], selections, zero, result["random"])
    if handed["zero_shot_best"]:
        say("warning: the zero-shot prompt scored above every k-shot prompt checked; demonstrations may not help "
            "this model on this task")
    return stages.put("check", key, {**result, "preferred": preferred, "handed_over": handed,
                                     "zero_shot_test_accuracy": zero, "test_size": len(test),
                                     "held_out": [start, start + len(held_out)]})

"""The hand-over check: before a prompt is handed over, every candidate prompt, the zero-shot prompt
and ``R`` random prompts of the same size are scored on held-out examples that selection never
saw, and :func:`hand_over` names the prompt to hand over and why.

A selection is worth handing over only if it beats what a user would otherwise do. Two rules keep
the check honest:

- **no selection bias in a replacement.** The pick (``preferred``) is replaced only when another
  checked prompt beats it by a one-sided lower bound above 0 that holds *simultaneously* for
  every alternative (:func:`~icl_ssm.evaluate.stats.simultaneous_lower_bounds`: the maximum is
  bootstrapped), so looking at all the alternatives and taking the best one does not make a
  replacement of an equally good pick likely;
- **the pick is compared with random prompts as a whole**: per check example, the pick's
  correctness minus the mean correctness of all the random prompts, with a paired bootstrap
  interval over the examples (``vs_random``), rather than with the one prompt that happens to be
  the median.

The random prompts are drawn under the same rules as the picks (``labels``: label-balanced;
``order``: interleaved, or a random order), so that the comparison is with what the user would
get from the same settings without selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from icl_ssm.calibrate import Calibration
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import paired_bootstrap, simultaneous_lower_bounds, wilson_interval
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.base import arrange
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm.select.sampling import stratified_subsets

ZERO_SHOT = "zero-shot"
CALIBRATED = "calibrated-"  # the prefix of a random or zero-shot prompt checked batch-calibrated
LEVEL = 0.975  # the simultaneous one-sided coverage a replacement needs (research/handover_simulation.py)


def random_prompts(pool_size: int, k: int, count: int, rng: np.random.Generator, *,
                   labels: Sequence[str] | None = None, order: str = "random") -> list[list[int]]:
    """``count`` random prompts of ``k`` distinct pool indices each.

    ``labels`` (the pool's, one per candidate): every prompt label-balanced
    (:func:`~icl_ssm.select.sampling.stratified_subsets`), as ``--per-label`` picks are;
    ``order``: ``"interleave"`` spreads each label over the prompt (``--order interleave``),
    anything else leaves the random order."""
    if not 1 <= k <= pool_size:
        raise ValueError(f"k={k}: expected 1 <= k <= the pool size {pool_size}")
    if labels is None:
        prompts = [rng.permutation(pool_size)[:k].tolist() for _ in range(count)]
    else:
        if len(labels) != pool_size:
            raise ValueError(f"{len(labels)} labels for a pool of {pool_size}")
        prompts = [[int(i) for i in p] for p in stratified_subsets(labels, k, count, rng)]
    if order == "interleave" and labels is not None:
        prompts = [arrange(p, [labels[i] for i in p], "interleave", rng) for p in prompts]
    return prompts


def check_prompts(model: Any, builder: PromptBuilder, pool: Sequence[Example], check: Sequence[Example],
                  candidates: dict[str, Sequence[int]], k: int, rng: np.random.Generator, *,
                  random_count: int = 16, query_batch: int = 32, labels: Sequence[str] | None = None,
                  order: str = "random", calibrations: dict[str, Calibration | None] | None = None,
                  calibrated_alternatives: bool = False) -> dict[str, Any]:
    """Score each candidate prompt (name -> pool indices in prompt order), the zero-shot prompt
    and ``random_count`` random ``k``-prompts (drawn by :func:`random_prompts` with ``labels``
    and ``order``) on the ``check`` examples with the real, dense prompt.

    ``calibrations``: a candidate's calibration (name -> :class:`~icl_ssm.calibrate.Calibration`),
    applied to its answers, as it will answer. ``calibrated_alternatives`` (classification): every
    random prompt and zero-shot is also checked batch-calibrated, its bias the mean label
    log-probability over the check inputs (labels unread), as rows ``calibrated-random-i`` and
    ``calibrated-zero-shot`` among the named prompts, so that a calibrated random prompt can be
    handed over in place of the pick.

    Returns ``{"check_size", "random": [row...], "random_mean", "random_median",
    "random_interval", "prompts": {name: row}}`` (:func:`compare_prompts`); every row holds
    ``indices``, ``accuracy``, its Wilson ``interval``, ``correct`` (0/1 per example) and its
    ``calibration`` (a method name, or None for raw answers)."""
    if not check:
        raise ValueError("no check examples: the validation split holds nothing that selection did not use")
    if random_count < 1:
        raise ValueError(f"random_count={random_count}: expected >= 1 random prompts")
    calibrations = calibrations or {}
    classification = builder.task.kind == "classification"
    gold = np.array([builder.label_index(e) for e in check]) if classification else None

    def score(indices: Sequence[int], calibration: Calibration | None = None) -> list[dict[str, Any]]:
        res = evaluate_selection(model, builder, [pool[i] for i in indices], check, per_query=True,
                                 query_batch=query_batch)
        rows = [{"indices": list(indices), "correct": [int(c) for c in res["correct"]], "calibration": None}]
        if classification and calibration is not None and not calibration.is_none:
            rows[0] = _calibrated_row(indices, res["scores"], gold, calibration)
        if classification and calibrated_alternatives:
            rows.append(_calibrated_row(indices, res["scores"], gold, None))
        return rows

    randoms, shifted = [], {}
    for i, ix in enumerate(random_prompts(len(pool), k, random_count, rng, labels=labels, order=order)):
        rows = score(ix)
        randoms.append(rows[0])
        if len(rows) > 1:
            shifted[f"{CALIBRATED}random-{i}"] = rows[1]
    prompts = {name: score(indices, calibrations.get(name))[0] for name, indices in candidates.items()}
    zero = score([])
    prompts[ZERO_SHOT] = zero[0]
    if len(zero) > 1:
        shifted[CALIBRATED + ZERO_SHOT] = zero[1]
    return compare_prompts({**prompts, **shifted}, randoms)


def _calibrated_row(indices: Sequence[int], scores: list[list[float]], gold: np.ndarray,
                    calibration: Calibration | None) -> dict[str, Any]:
    """A check row answered after ``calibration`` (None: batch calibration on these inputs)."""
    s = torch.tensor(scores, dtype=torch.float64)  # (n, L)
    if calibration is None:
        logp = torch.log_softmax(s, -1)
        shifted, method = logp - logp.mean(0), "batch (on the check inputs)"
    else:
        shifted, method = calibration.apply(s), calibration.method
    return {"indices": list(indices), "correct": (shifted.argmax(-1).numpy() == gold).astype(int).tolist(),
            "calibration": method}


def compare_prompts(prompts: dict[str, dict[str, Any]], randoms: Sequence[dict[str, Any]], *,
                    seed: int = 0) -> dict[str, Any]:
    """The check's statistics from per-example correctness (``row["correct"]``, 0/1, the same
    examples in every row): each row gains ``accuracy`` and its Wilson ``interval``; each named
    prompt also ``beats_random`` (the share of random prompts it scores strictly above),
    ``at_or_above`` (how many it scores at or above) and ``vs_random`` (its per-example
    correctness minus the random prompts' mean correctness on that example:
    :func:`~icl_ssm.evaluate.stats.paired_bootstrap` over the examples)."""
    if not randoms:
        raise ValueError("compare_prompts needs at least one random prompt")
    grid = np.array([r["correct"] for r in randoms], dtype=np.float64)  # (R, n)
    n = grid.shape[1]
    for row in [*randoms, *prompts.values()]:
        if len(row["correct"]) != n:
            raise ValueError(f"a checked prompt has {len(row['correct'])} answers, the random ones {n}")
        row["accuracy"] = float(np.mean(row["correct"]))
        row["interval"] = list(wilson_interval(int(np.sum(row["correct"])), n))
    accs = grid.mean(1)
    random_mean = grid.mean(0)  # (n,) per example
    shifted = [row for name, row in prompts.items() if name.startswith(f"{CALIBRATED}random-")]
    shifted_mean = np.array([r["correct"] for r in shifted], dtype=np.float64).mean(0) if shifted else None
    for row in prompts.values():
        row["beats_random"] = float((row["accuracy"] > accs).mean())
        row["at_or_above"] = int((row["accuracy"] >= accs).sum())
        row["vs_random"] = paired_bootstrap(np.asarray(row["correct"], dtype=np.float64) - random_mean, seed=seed)
        if shifted_mean is not None:  # ... and against what calibrating a random prompt gives
            row["vs_calibrated_random"] = paired_bootstrap(np.asarray(row["correct"], dtype=np.float64)
                                                           - shifted_mean, seed=seed)
    return {"check_size": n, "random": list(randoms), "random_mean": float(accs.mean()),
            "random_median": float(np.median(accs)), "random_interval": [float(accs.min()), float(accs.max())],
            "prompts": prompts}


def hand_over(result: dict[str, Any], preferred: str, *, keep: bool = False, level: float = LEVEL,
              seed: int = 0) -> dict[str, Any]:
    """The prompt to hand over, and why.

    ``preferred`` (the method's pick) stays unless another checked prompt (another pick, a random
    prompt, or zero-shot) beats it on the check examples by a simultaneous one-sided lower bound
    above 0 at ``level`` (:func:`~icl_ssm.evaluate.stats.simultaneous_lower_bounds`); then the
    alternative with the highest accuracy replaces it, unless ``keep``. Returns ``{"name",
    "indices", "reason", "replaced", "beats_random" (share), "at_or_above", "random_prompts",
    "vs_random" (the handed-over prompt's, as :func:`compare_prompts` gives it), "shown_better"
    (its ``vs_random`` interval lies above 0), "zero_shot_best" (zero-shot scores above every
    k-shot prompt checked)}``."""
    rows = result["prompts"]
    if preferred not in rows:
        raise ValueError(f"preferred={preferred!r}: expected one of the checked prompts {', '.join(rows)}")
    mine = rows[preferred]
    options = {name: row for name, row in rows.items() if name != preferred}
    options |= {f"random-{i}": row for i, row in enumerate(result["random"])}
    names = list(options)
    gains = np.array([options[m]["correct"] for m in names], dtype=np.float64) - np.asarray(mine["correct"], float)
    means, lower = simultaneous_lower_bounds(gains, level=level, seed=seed)
    best = int(np.argmax(means))
    n, total = result["check_size"], len(result["random"])
    shots = [r["accuracy"] for name, r in rows.items() if name != ZERO_SHOT] + [r["accuracy"] for r in result["random"]]
    zero_best = ZERO_SHOT in rows and rows[ZERO_SHOT]["accuracy"] > max(shots)
    where = (f"{preferred} scored {mine['accuracy']:.3f} on {n} held-out examples, at or above "
             f"{mine['at_or_above']} of {total} random prompts (their mean {result['random_mean']:.3f})")
    bound = f"{means[best]:+.3f}, simultaneous {level:.1%} lower bound {lower[best]:+.3f}"
    if lower[best] > 0 and not keep:
        name = names[best]
        reason = (f"{where}; {name} beats it by more than the check can tell ({options[name]['accuracy']:.3f}: "
                  f"{bound}), so {name} is handed over (--keep-selection hands over the pick)")
        chosen = options[name]
    else:
        name, chosen = preferred, mine
        reason = (f"{where}; no checked prompt beats it by more than the check can tell (the best, {names[best]}: "
                  f"{bound}); kept") if lower[best] <= 0 else (
            f"{where}; {names[best]} beats it ({bound}) but --keep-selection keeps the pick")
    compared = total
    if name in rows and "vs_random" in chosen:
        versus = chosen["vs_random"]
        beats, at_or_above = chosen["beats_random"], chosen["at_or_above"]
    else:  # a random prompt handed over: compared with the others
        others = [r for r in result["random"] if r is not chosen]
        compared = len(others)
        grid = np.array([r["correct"] for r in others] or [chosen["correct"]], dtype=np.float64)
        versus = paired_bootstrap(np.asarray(chosen["correct"], float) - grid.mean(0), seed=seed)
        accs = grid.mean(1)
        beats, at_or_above = float((chosen["accuracy"] > accs).mean()), int((chosen["accuracy"] >= accs).sum())
    out = {"name": name, "indices": list(chosen["indices"]), "reason": reason, "replaced": name != preferred,
           "beats_random": beats, "at_or_above": at_or_above, "random_prompts": compared, "vs_random": versus,
           "shown_better": versus["ci95"][0] > 0, "zero_shot_best": bool(zero_best)}
    if "vs_calibrated_random" in chosen:
        out["vs_calibrated_random"] = chosen["vs_calibrated_random"]
        out["shown_better_than_calibrated"] = chosen["vs_calibrated_random"]["ci95"][0] > 0
    return out

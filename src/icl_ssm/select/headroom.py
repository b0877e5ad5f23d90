"""Is there anything left to select once the label lean is out? Measured before a search spends
its budget, from validation alone (no test label is read).

:func:`measure_headroom` scores ``R`` label-balanced random prompts on the validation queries and
batch-calibrates each one on those same inputs (labels unread). It then asks two questions:
- Do the calibrated prompts still differ? This is the spread of their calibrated accuracies.
- Does validation tell them apart? This is the split-half Spearman of their calibrated per-query
  cross-entropies over label-stratified halves of the queries, and its Spearman-Brown
  reliability.

:func:`can_add` is the rule that decides whether ``run`` searches: the reliability must reach
:data:`MIN_RELIABILITY`. Where it does not, validation cannot rank calibrated prompts, so a search
would choose among noise. A calibrated random prompt is then handed over at once, and the run says
so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from icl_ssm.calibrate.losses import calibrated_query_losses
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import spearman_brown, split_half_spearman
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.check import random_prompts
from icl_ssm.select.held_out import prompt_scores

HEADROOM_PROMPTS = 8  # random prompts the headroom is measured on
MIN_RELIABILITY = 0.5  # the reliability of the calibrated validation ranking a search needs


def headroom_summary(scores: np.ndarray, gold: np.ndarray) -> dict[str, Any]:
    """From ``scores (R, Q, L)`` (R prompts' label log-likelihoods on Q validation queries) and
    ``gold (Q,)``: each prompt's raw and batch-calibrated accuracy, the calibrated accuracies'
    spread, the split-half Spearman of the calibrated cross-entropies (label-stratified halves) and
    its reliability (0 where the halves disagree; None with too few prompts or queries)."""
    logp = torch.log_softmax(torch.as_tensor(scores, dtype=torch.float64), -1)  # (R, Q, L)
    calibrated = logp - logp.mean(1, keepdim=True)
    g = torch.as_tensor(gold)
    raw_acc = (logp.argmax(-1) == g).double().mean(1).numpy()
    cal_acc = (calibrated.argmax(-1) == g).double().mean(1).numpy()
    half = split_half_spearman(calibrated_query_losses(scores, gold, "batch"), gold)
    reliability = None if not math.isfinite(half) else (spearman_brown(half) if half > 0 else 0.0)
    return {"raw_accuracy": raw_acc.tolist(), "calibrated_accuracy": cal_acc.tolist(),
            "calibrated_spread": float(cal_acc.std()), "raw_spread": float(raw_acc.std()),
            "split_half": None if not math.isfinite(half) else float(half), "reliability": reliability}


def can_add(summary: dict[str, Any], min_reliability: float = MIN_RELIABILITY) -> tuple[bool, str]:
    """The rule: search only where validation ranks calibrated prompts with a reliability of at
    least ``min_reliability``. Returns ``(search, why)``."""
    r = summary.get("reliability")
    queries = summary.get("queries")
    if r is None:
        return True, "the headroom could not be measured (too few prompts or queries), so the search runs"
    if r >= min_reliability:
        return True, (f"validation ranks calibrated random prompts with reliability {r:.2f} (split-half "
                      f"{summary['split_half']:+.2f} over {queries} queries; at least {min_reliability} needed), so "
                      "selection can still add beyond calibration")
    return False, (f"validation ranks calibrated random prompts with reliability only {r:.2f} (split-half "
                   f"{summary['split_half']:+.2f} over {queries} queries; {min_reliability} needed): for this model "
                   "and task, selection is not shown to add anything measurable beyond calibration, so a calibrated "
                   "label-balanced random prompt is handed over without a search")


def measure_headroom(model: Any, builder: PromptBuilder, pool: Sequence[Example], validation: Sequence[Example],
                     k: int, rng: np.random.Generator, *, prompts: int = HEADROOM_PROMPTS,
                     query_batch: int = 32) -> dict[str, Any]:
    """:func:`headroom_summary` of ``prompts`` label-balanced random ``k``-prompts on ``validation``,
    with the prompts (pool indices), the queries and the seconds it took."""
    builder._require_classification("the headroom after calibration")
    t0 = time.perf_counter()
    drawn = random_prompts(len(pool), k, prompts, rng, labels=[e.target for e in pool])
    scores = np.stack([prompt_scores(model, builder, [pool[i] for i in p], validation,
                                     query_batch=query_batch).double().numpy() for p in drawn])
    gold = np.array([builder.label_index(q) for q in validation])
    return {**headroom_summary(scores, gold), "prompts": drawn, "queries": len(validation),
            "seconds": time.perf_counter() - t0}

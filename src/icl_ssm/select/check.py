"""The check before a prompt is handed over: every candidate prompt, the zero-shot prompt and
``R`` random prompts of the same size, scored on held-out examples that selection never saw.

A selection is worth handing over only if it beats what a user would otherwise do. On small
models a prompt's label mix and order can matter more than which demonstrations it holds, so a
selector's pick can land below a random prompt; :func:`check_prompts` measures where each
candidate stands among the random prompts, with a paired bootstrap interval over the check
examples, and :func:`hand_over` names the prompt to hand over and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import wilson_interval
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.evaluate import evaluate_selection

ZERO_SHOT = "zero-shot"


def random_prompts(pool_size: int, k: int, count: int, rng: np.random.Generator) -> list[list[int]]:
    """``count`` random prompts: ``k`` distinct pool indices each, in a random order."""
    if not 1 <= k <= pool_size:
        raise ValueError(f"k={k}: expected 1 <= k <= the pool size {pool_size}")
    return [rng.permutation(pool_size)[:k].tolist() for _ in range(count)]


def paired_bootstrap(diff: np.ndarray, rng: np.random.Generator, draws: int = 2000,
                     level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean of ``diff`` (per-example paired differences, ``(n,)``)."""
    diff = np.asarray(diff, dtype=np.float64)
    idx = rng.integers(0, len(diff), size=(draws, len(diff)))
    means = diff[idx].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def check_prompts(model: Any, builder: PromptBuilder, pool: Sequence[Example], check: Sequence[Example],
                  candidates: dict[str, Sequence[int]], k: int, rng: np.random.Generator, *,
                  random_count: int = 8, query_batch: int = 32) -> dict[str, Any]:
    """Score each candidate prompt (name -> pool indices in prompt order), the zero-shot prompt
    and ``random_count`` random ``k``-prompts on the ``check`` examples (real, dense prompts).

    Returns ``{"check_size", "random": [{"indices", "accuracy"}...], "random_median",
    "prompts": {name: row}}``; each row holds ``accuracy``, its Wilson ``interval``, ``correct``
    (per example, 0/1), and for the candidates and zero-shot: ``beats_random`` (share of the
    random prompts it scores strictly above), ``vs_median`` (accuracy minus the median random
    prompt's) and ``vs_median_interval`` (paired bootstrap over the check examples, 95%)."""
    if not check:
        raise ValueError("no check examples: the validation split holds nothing that selection did not use")
    if random_count < 1:
        raise ValueError(f"random_count={random_count}: expected >= 1 random prompts")

    def score(indices: Sequence[int]) -> dict[str, Any]:
        res = evaluate_selection(model, builder, [pool[i] for i in indices], check, per_query=True,
                                 query_batch=query_batch)
        correct = np.asarray(res["correct"], dtype=np.float64)
        lo, hi = wilson_interval(int(correct.sum()), len(correct))
        return {"indices": list(indices), "accuracy": float(correct.mean()), "interval": [lo, hi],
                "correct": correct.tolist()}

    randoms = [score(ix) for ix in random_prompts(len(pool), k, random_count, rng)]
    accs = np.array([r["accuracy"] for r in randoms])
    median = int(np.argsort(accs, kind="stable")[len(accs) // 2])  # the (upper) median random prompt
    median_row, median_acc = np.asarray(randoms[median]["correct"]), float(accs[median])
    prompts: dict[str, dict[str, Any]] = {}
    for name, indices in {**candidates, ZERO_SHOT: []}.items():
        row = score(indices)
        correct = np.asarray(row["correct"])
        row["beats_random"] = float((row["accuracy"] > accs).mean())
        row["vs_median"] = float(row["accuracy"] - median_acc)  # the mean of the paired differences below
        row["vs_median_interval"] = list(paired_bootstrap(correct - median_row, rng))
        prompts[name] = row
    return {"check_size": len(check), "random": randoms, "random_median": median_acc,
            "random_interval": [float(accs.min()), float(accs.max())], "prompts": prompts}


def hand_over(result: dict[str, Any], preferred: str, *, keep: bool = False) -> tuple[str, list[int], str]:
    """``(name, indices, reason)`` of the prompt to hand over.

    ``preferred`` (the method's pick) is handed over when it scores above the median random
    prompt on the check examples, or when ``keep``. Otherwise the best-checked prompt among the
    candidates and the random prompts replaces it, but only when it beats the pick by a paired
    bootstrap interval over the check examples that excludes 0: where the check examples cannot
    tell the two apart (a task on which no prompt does better than another), the pick stays and
    the reason says so. ``reason`` always says why."""
    rows = result["prompts"]
    if preferred not in rows:
        raise ValueError(f"preferred={preferred!r}: expected one of the checked prompts {', '.join(rows)}")
    mine = rows[preferred]
    median = result["random_median"]
    if mine["accuracy"] > median:
        return preferred, mine["indices"], (f"{preferred} scored {mine['accuracy']:.3f} on {result['check_size']} "
                                            f"held-out examples, above the median random prompt's {median:.3f}")
    if keep:
        return preferred, mine["indices"], (f"kept as asked although {preferred} scored {mine['accuracy']:.3f}, not "
                                            f"above the median random prompt's {median:.3f}")
    options = {name: row for name, row in rows.items() if name != ZERO_SHOT}
    options |= {f"random-{i}": row for i, row in enumerate(result["random"])}
    best = max(options, key=lambda name: options[name]["accuracy"])
    gain = np.asarray(options[best]["correct"]) - np.asarray(mine["correct"])
    lo, hi = paired_bootstrap(gain, np.random.default_rng(0))
    if lo <= 0:
        return preferred, mine["indices"], (
            f"{preferred} scored {mine['accuracy']:.3f} on {result['check_size']} held-out examples, not above the "
            f"median random prompt's {median:.3f}, but no checked prompt beats it by more than those examples can "
            f"tell (the best, {best}, {options[best]['accuracy']:.3f}: {gain.mean():+.3f} [{lo:+.3f}, {hi:+.3f}], "
            "paired 95%); kept")
    return best, options[best]["indices"], (
        f"{preferred} scored {mine['accuracy']:.3f} on {result['check_size']} held-out examples, not above the "
        f"median random prompt's {median:.3f}; handing over {best} ({options[best]['accuracy']:.3f}, "
        f"{gain.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] paired 95%), the best prompt on those examples "
        "(--keep-selection hands over the method's pick instead)")

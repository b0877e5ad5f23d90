"""Should selection trust the compressed caches? A verdict from a fidelity report.

Affinity selection on compressed caches is only as good as the caches' ranking of subsets.
:func:`fidelity_gate` reads a report of :func:`icl_ssm.evaluate.fidelity.run_fidelity` (held-out
subsets, every path against the dense prompt) and says which evaluator the measurement
supports:

- ``compressed`` when none of the checks below fails;
- ``dense`` when one does. The dense prompt is the reference every path is measured against,
  so it is the evaluator a failed check always leaves standing (at its full cost).

The checks, each on the same held-out subsets and queries:

1. **ranking at all**: the compressed cache's subset-loss Spearman against the dense prompt
   has a 95% interval (over subsets) whose lower end is above 0;
2. **ranking against the window**: the compressed cache does not rank worse than the window of
   the same size (the last tokens alone) by a paired interval that excludes 0;
3. **answers**: the compressed cache's accuracy is not below the dense prompt's by more than
   ``max_accuracy_drop``, by a paired bootstrap interval over subsets that excludes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from icl_ssm.evaluate.stats import interval

GATE_EVALUATORS = ("auto", "compressed", "dense")


def paired_accuracy_gap(acc: dict[str, list], a: str, b: str, *, resamples: int = 2000,
                        seed: int = 0) -> tuple[float, tuple[float, float]] | None:
    """Mean per-subset accuracy of path ``a`` minus path ``b`` and its 95% paired bootstrap
    interval over subsets; ``acc`` maps a path to its per-subset accuracies (``None`` entries
    are dropped pairwise). None when fewer than 3 subsets have both."""
    if a not in acc or b not in acc:
        return None
    pairs = [(x, y) for x, y in zip(acc[a], acc[b], strict=True) if x is not None and y is not None]
    if len(pairs) < 3:
        return None
    diff = np.array([x - y for x, y in pairs], dtype=float)
    rng = np.random.default_rng(seed)
    draws = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    return float(diff.mean()), interval(draws)


def fidelity_gate(report: dict[str, Any], *, max_accuracy_drop: float = 0.05) -> dict[str, Any]:
    """``{"evaluator": "compressed" | "dense", "reason": str | None, "checks": [...]}``.

    Each check is ``{"name", "passed", "value", "ci95", "detail"}``; a check whose numbers the
    report lacks (fewer than 3 subsets, no window path) is recorded with ``passed=None`` and
    does not fail the gate. ``reason`` is one sentence naming every failed check and its numbers.
    """
    if not 0 <= max_accuracy_drop < 1:
        raise ValueError(f"max_accuracy_drop={max_accuracy_drop}; expected a share in [0, 1)")
    checks: list[dict[str, Any]] = []
    rho, ci = report.get("subset_loss_spearman"), report.get("subset_loss_spearman_ci95") or [None, None]
    ok = None if rho is None or ci[0] is None else ci[0] > 0
    checks.append({"name": "ranks held-out subsets", "passed": ok, "value": rho, "ci95": ci,
                   "detail": f"subset-loss Spearman against the dense prompt {_num(rho)} (95% CI {_ci(ci)})"})
    pair = (report.get("paired") or {}).get("compressed-window") or {}
    diff, ci = pair.get("diff"), pair.get("ci95") or [None, None]
    ok = None if diff is None or ci[1] is None else not ci[1] < 0
    checks.append({"name": "ranks at least as well as the window", "passed": ok, "value": diff, "ci95": ci,
                   "detail": f"Spearman minus the window's {_num(diff, sign=True)} (paired 95% CI {_ci(ci)})"})
    gap = paired_accuracy_gap((report.get("per_subset") or {}).get("acc") or {}, "compressed", "dense")
    if gap is None:
        checks.append({"name": "answers like the dense prompt", "passed": None, "value": None, "ci95": [None, None],
                       "detail": "too few subsets for an accuracy interval"})
    else:
        value, (lo, hi) = gap
        checks.append({"name": "answers like the dense prompt", "passed": not hi < -max_accuracy_drop,
                       "value": value, "ci95": [lo, hi],
                       "detail": f"accuracy {_num(report.get('acc_compressed'))} against the dense prompt's "
                                 f"{_num(report.get('acc_dense'))}: {_num(value, sign=True)} (paired 95% CI "
                                 f"{_ci([lo, hi])}; allowed drop {max_accuracy_drop:.2f})"})
    failed = [c for c in checks if c["passed"] is False]
    reason = None
    if failed:
        reason = ("the compressed caches failed their fidelity check (" + "; ".join(
            f"{c['name']}: no, {c['detail']}" for c in failed) + "), so affinity scores subsets on dense caches")
    return {"evaluator": "dense" if failed else "compressed", "reason": reason, "checks": checks,
            "max_accuracy_drop": max_accuracy_drop}


def _num(x: float | None, sign: bool = False) -> str:
    return "n/a" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")


def _ci(ci) -> str:
    return "n/a" if ci is None or None in ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"

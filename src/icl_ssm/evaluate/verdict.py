"""Should selection trust the compressed caches? A verdict from a fidelity report.

Affinity selection on compressed caches is only as good as the caches' ranking of subsets.
:func:`fidelity_verdict` reads a report of :func:`icl_ssm.evaluate.fidelity.run_fidelity`
(held-out subsets, every path against the dense prompt) and says which evaluator the
measurement supports:

- ``compressed`` when every check below is passed, or not run for lack of its path;
- ``dense`` when one is not passed. The dense prompt is the reference every path is measured
  against, so it is the evaluator a failed check always leaves standing (at its full cost).

Every check asks for the compressed cache to be *shown* close to its reference, by the lower
end of a 95% bootstrap interval on the same held-out subsets and queries; a check whose numbers
are missing (a constant ranking, too few subsets) is not shown, and fails:

1. **ranks held-out subsets**: the subset-loss Spearman of the compressed cache against the dense
   prompt has a lower end above 0;
2. **ranks about as well as the window** (the sinks and the last tokens alone, the same cache
   size): the compressed cache's Spearman minus the window's has a lower end above
   ``-rank_margin``;
3. **ranks about as well as the control** (a prompt-independent compressor): the same against
   the control, when one ran;
4. **answers like the dense prompt**: the compressed cache's accuracy minus the dense prompt's
   has a lower end above ``-max_accuracy_drop`` (a paired bootstrap over subsets, and over
   queries too where the report keeps per-(subset, query) correctness).

The ranking intervals are the report's that resample queries as well as subsets
(``*_ci95_queries``) where it has them, else the ones over subsets. A comparator whose subset
losses are constant (a control with no exact recent tokens) ranks nothing: its Spearman is taken
as 0, and its check reads the compressed cache's own interval.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from icl_ssm.evaluate.stats import paired_bootstrap

VERDICT_EVALUATORS = ("auto", "compressed", "dense")
# Spearman a compressed cache may lose to a comparator: the widest margin at which a cache ranking clearly below
# the control still fails its check (tests/test_verdict.py, on reports resampled from a stored one)
RANK_MARGIN = 0.2


def paired_accuracy_gap(per_subset: dict[str, Any], a: str, b: str, *, resamples: int = 2000,
                        seed: int = 0) -> dict[str, Any] | None:
    """Accuracy of path ``a`` minus path ``b`` with its 95% paired bootstrap interval
    (:func:`~icl_ssm.evaluate.stats.paired_bootstrap`).

    ``per_subset`` is a report's: ``acc[path]``, ``(S,)`` per-subset accuracies, and, where the
    report keeps them, ``query_correct[path]``, ``(S, Q)`` per-(subset, query) correctness. With
    the latter for both paths the interval resamples subsets and queries; else it resamples
    subsets (``None`` entries dropped pairwise). Returns ``paired_bootstrap``'s dict
    (``mean``, ``ci95``, ``resampled``, ``n``), None when fewer than 3 subsets have both paths.
    """
    grid = per_subset.get("query_correct") or {}
    if a in grid and b in grid:
        xa, xb = np.asarray(grid[a], dtype=np.float64), np.asarray(grid[b], dtype=np.float64)  # (S, Q) each
        if xa.shape != xb.shape or xa.ndim != 2:
            raise ValueError(f"per_subset['query_correct']: {a!r} has shape {xa.shape}, {b!r} {xb.shape}; "
                             "expected one (subsets, queries) grid for both")
        diff = xa - xb
        diff = diff[np.isfinite(diff).any(1)]  # subsets with at least one query answered by both
        return paired_bootstrap(diff, resamples=resamples, seed=seed) if len(diff) >= 3 else None
    acc = per_subset.get("acc") or {}
    if a not in acc or b not in acc:
        return None
    pairs = [(x, y) for x, y in zip(acc[a], acc[b], strict=True) if x is not None and y is not None]
    if len(pairs) < 3:
        return None
    return paired_bootstrap(np.array([x - y for x, y in pairs]), resamples=resamples, seed=seed)  # (S,)


FAITHFUL = "the compressed caches are faithful enough to the dense prompt"
NOT_FAITHFUL = "the compressed caches are not faithful enough to the dense prompt"


def failed_checks(checks: list[dict[str, Any]]) -> str:
    """``name: no, detail; ...`` for each failed check (``passed is False``) of a verdict."""
    return "; ".join(f"{c.get('name')}: no, {c.get('detail')}" for c in checks if c.get("passed") is False)


def fidelity_verdict(report: dict[str, Any], *, max_accuracy_drop: float = 0.05, rank_margin: float = RANK_MARGIN,
                     resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """``{"evaluator": "compressed" | "dense", "reason": str | None, "summary": str, "checks": [...],
    "max_accuracy_drop", "rank_margin"}``.

    Each check is ``{"name", "passed", "value", "ci95", "detail"}``. ``passed`` is None only for
    a comparison whose path the report lacks (no window, no control), which does not fail the
    verdict; its detail says so. ``reason`` is one sentence naming every failed check and its
    numbers (None when none failed); ``summary`` is one sentence either way, ready to print.
    ``resamples`` and ``seed`` drive the accuracy interval.
    """
    if not 0 <= max_accuracy_drop < 1:
        raise ValueError(f"max_accuracy_drop={max_accuracy_drop}; expected a share in [0, 1)")
    if not 0 <= rank_margin < 2:
        raise ValueError(f"rank_margin={rank_margin}; expected a Spearman difference in [0, 2)")
    checks = [_ranks(report), *(_against(report, name, rank_margin) for name in ("window", "control")),
              _answers(report, max_accuracy_drop, resamples, seed)]
    failed = [c for c in checks if c["passed"] is False]
    reason = summary = None
    if failed:
        reason = summary = f"{NOT_FAITHFUL} ({failed_checks(checks)}), so affinity scores subsets on dense caches"
    else:
        summary = (f"{FAITHFUL} (" + "; ".join(
            f"{c['name']}: {'yes' if c['passed'] else 'not run'}, {c['detail']}" for c in checks)
            + "), so affinity scores subsets on them")
    return {"evaluator": "dense" if failed else "compressed", "reason": reason, "summary": summary, "checks": checks,
            "max_accuracy_drop": max_accuracy_drop, "rank_margin": rank_margin}


def _spearman_interval(report: dict[str, Any], prefix: str = "") -> tuple[list, str]:
    """A path's subset-loss Spearman interval, the one over subsets and queries where present."""
    ci = report.get(f"{prefix}subset_loss_spearman_ci95_queries")
    if ci and None not in ci:
        return list(ci), "over subsets and queries"
    return list(report.get(f"{prefix}subset_loss_spearman_ci95") or [None, None]), "over subsets"


def _ranks(report: dict[str, Any]) -> dict[str, Any]:
    rho = report.get("subset_loss_spearman")
    ci, over = _spearman_interval(report)
    check = {"name": "ranks held-out subsets", "value": rho, "ci95": ci}
    if rho is None:
        return check | {"passed": False, "detail": "no subset-loss Spearman against the dense prompt (the compressed "
                                                   "cache's or the dense prompt's subset losses are constant, so they "
                                                   "rank nothing)"}
    if ci[0] is None:
        return check | {"passed": False, "detail": f"subset-loss Spearman against the dense prompt {_num(rho)} with "
                                                   "no interval (fewer than 3 subsets)"}
    return check | {"passed": ci[0] > 0, "detail": f"subset-loss Spearman against the dense prompt {_num(rho)} "
                                                   f"(95% CI {over} {_ci(ci)}; needs a lower end above 0)"}


def _against(report: dict[str, Any], name: str, margin: float) -> dict[str, Any]:
    """Check 2 or 3: the compressed cache's Spearman minus the comparator ``name``'s."""
    check = {"name": f"ranks about as well as the {name}", "value": None, "ci95": [None, None]}
    pair = (report.get("paired") or {}).get(f"compressed-{name}")
    if pair is None:
        ran = "window path" if name == "window" else "control compressor (fidelity --control)"
        return check | {"passed": None, "detail": f"not measured: the report has no {ran}"}
    needs = f"needs a lower end above {-margin:+.2f}"
    diff = pair.get("diff")
    ci, over = pair.get("ci95_queries"), "over subsets and queries"
    if not ci or None in ci:
        ci, over = pair.get("ci95") or [None, None], "over subsets"
    rho = report.get("subset_loss_spearman")
    if diff is None and rho is not None and report.get(f"{name}_subset_loss_spearman", 0.0) is None:
        ci, over = _spearman_interval(report)  # a constant comparator ranks nothing: its Spearman is 0
        ok = ci[0] is not None and ci[0] > -margin
        return check | {"passed": ok, "value": rho, "ci95": ci,
                        "detail": f"the {name}'s subset losses are constant (it ranks nothing, Spearman taken as 0): "
                                  f"Spearman {_num(rho)} (95% CI {over} {_ci(ci)}; {needs})"}
    if diff is None or ci[0] is None:
        return check | {"passed": False, "value": diff, "ci95": list(ci),
                        "detail": f"Spearman minus the {name}'s {_num(diff, sign=True)} with no interval (the "
                                  "compressed cache ranks nothing, or fewer than 3 subsets)"}
    return check | {"passed": ci[0] > -margin, "value": diff, "ci95": list(ci),
                    "detail": f"Spearman minus the {name}'s {_num(diff, sign=True)} (paired 95% CI {over} "
                              f"{_ci(ci)}; {needs})"}


def _answers(report: dict[str, Any], drop: float, resamples: int, seed: int) -> dict[str, Any]:
    check = {"name": "answers like the dense prompt", "value": None, "ci95": [None, None]}
    gap = paired_accuracy_gap(report.get("per_subset") or {}, "compressed", "dense", resamples=resamples, seed=seed)
    if gap is None:
        return check | {"passed": False, "detail": "no accuracy interval (fewer than 3 subsets with per-subset "
                                                   "accuracies of both paths)"}
    lo, hi = gap["ci95"]
    over = "over subsets and queries" if gap["resampled"] == "rows and columns" else "over subsets"
    return check | {"passed": lo > -drop, "value": gap["mean"], "ci95": [lo, hi],
                    "detail": f"accuracy {_num(report.get('acc_compressed'))} against the dense prompt's "
                              f"{_num(report.get('acc_dense'))}: {_num(gap['mean'], sign=True)} (paired 95% CI "
                              f"{over} {_ci([lo, hi])}; needs a lower end above {-drop:+.2f})"}


def _num(x: float | None, sign: bool = False) -> str:
    return "n/a" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")


def _ci(ci) -> str:
    return "n/a" if ci is None or None in ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"

"""``icl-ssm select``: choose ``k`` demonstrations from a task's pool and score them on its test set.

``--method affinity`` is Algorithm 2 (``--evaluator compressed``: the distilled compressor's
caches; ``dense``: exact prefix caches shared by the queries of a subset; ``dense-per-query``:
one full prompt per query, the paper's accounting); ``random``, ``bm25``, ``topk`` and
``gradce`` are the baselines. Under ``accelerate launch -m icl_ssm select ...`` the subsets are
sharded across processes and every process ends with the same selection.

This module runs a :class:`~icl_ssm.select.config.SelectConfig`: split the task, build the
registered selector, choose, put the chosen demonstrations in prompt order, score them on the
test split. :mod:`icl_ssm.select.outputs` writes the result and :mod:`icl_ssm.select.notices`
says what it warns about.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from icl_ssm.calibrate import no_calibration
from icl_ssm.compress.builders import DenseCache
from icl_ssm.compress.compressor import SSMCompressor
from icl_ssm.data.splits import Splits, split, split_notes
from icl_ssm.data.tasks import Example, Task, get_task
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.base import (
    SELECTORS,
    Hooks,
    Selection,
    Selector,
    arrange,
    order_rng,
    per_label,
    validate_selection_inputs,
)
from icl_ssm.select.config import EVALUATED, SelectConfig, selection_queries
from icl_ssm.select.held_out import calibrate_prompt, evaluate_calibrated, evaluate_selection
from icl_ssm.select.order import search_order
from icl_ssm.select.per_query import per_query_selection
from icl_ssm.select.subset_losses import CacheEvaluator


def make_selector(cfg: SelectConfig, model, builder: PromptBuilder, compressor: SSMCompressor | None = None,
                  hooks: Hooks | None = None) -> Selector:
    """The selector ``cfg.method`` names in the registry, built by its ``from_config``."""
    return SELECTORS[cfg.method].from_config(cfg, model, builder, compressor, hooks or Hooks())


@dataclass
class _Run:
    """One selection's resolved inputs: ``validation`` (the first :func:`selection_queries` of
    the validation split) is what the selector reads, ``test`` what the chosen prompt is scored
    on; ``notes``: what the splits and the task say of themselves, for the summary."""

    cfg: SelectConfig
    model: Any
    task: Task
    builder: PromptBuilder
    splits: Splits
    validation: list[Example]
    test: list[Example]
    notes: list[str]

    @property
    def pool(self) -> list[Example]:
        return self.splits.pool


def select_demonstrations(
    cfg: SelectConfig,
    model,
    tokenizer,
    compressor: SSMCompressor | None = None,
    *,
    splits: Splits | None = None,
    builder: PromptBuilder | None = None,
    hooks: Hooks | None = None,
) -> tuple[Selection, dict[str, Any], list[Example]]:
    """Run the selection ``cfg`` describes and evaluate it on the test split.

    Returns ``(selection, summary, pool)``; ``selection.indices`` are pool positions in prompt
    order and ``summary`` has the keys of ``--json``. ``splits``: the task's splits when the
    caller made them (else :func:`~icl_ssm.data.splits.split` with ``cfg``'s sizes); ``builder``:
    the prompt builder when the caller made it (its task is then the run's; else built here).
    ``hooks`` (:class:`~icl_ssm.select.base.Hooks`): ``total`` the evaluations planned, before
    the selector starts (0 for the baselines; with a budget the pilot's, and again once the plan
    is made); ``progress(n)`` after every ``n`` evaluated; ``say(line)`` the pilot's findings
    and the plan before the main round is spent.
    """
    cfg.validate()
    if cfg.calibrate != "none" and cfg.method == "search" and not cfg.search_calibrations:
        cfg = replace(cfg, search_calibrations=("none", "batch") if cfg.calibrate == "search" else ("batch",))
    run = _resolve(cfg, model, tokenizer, splits, builder)
    hooks = hooks or Hooks()
    selector = make_selector(cfg, model, run.builder, compressor, hooks)
    _check_pool(run)
    hooks.total(selector.planned(len(run.pool), cfg.k))
    selection, wall, searched = _choose(run, selector)
    result = evaluate_selection(model, run.builder, selection.examples(run.pool), run.test, loss=cfg.loss,
                                query_batch=cfg.query_batch)
    orders = order_accuracies(model, run.builder, run.pool, selection.indices, run.test, cfg, result["accuracy"])
    summary = _summary(run, selection, result, wall, orders, searched, selector)
    if cfg.calibrate != "none" and run.task.kind == "classification":  # its bias on the validation inputs read
        summary.update(_calibrated(run, selection, summary))
    return selection, summary, list(run.pool)


def _resolve(cfg: SelectConfig, model, tokenizer, splits: Splits | None, builder: PromptBuilder | None) -> _Run:
    """The task, its splits (made here when not given; refused when they hold too few validation
    queries), the slices the selection reads and the prompt builder (the caller's, when given)."""
    task = get_task(cfg.task, **cfg.task_options) if builder is None else builder.task
    queries = selection_queries(cfg)
    if splits is None:  # a file too small for the default sizes gets splits sized to it (splits.note says so)
        splits = split(task, pool_size=cfg.pool_size, seed=cfg.seed, fit=True, k=cfg.k, min_val_size=queries)
    elif queries > len(splits.validation):
        raise ValueError(f"--queries {queries}: task {task.name!r} has only {len(splits.validation)} "
                         "validation examples; ask for at most that many")
    validation, test = splits.validation[:queries], splits.test[: cfg.test_size]
    notes = split_notes(splits, task)
    builder = builder or PromptBuilder.for_model(model, tokenizer, task, chat=cfg.chat)
    return _Run(cfg, model, task, builder, splits, validation, test, notes)


def _check_pool(run: _Run) -> None:
    """Refuse a pool and validation set no selection of ``k`` can use, and a per-label quota
    over more labels than ``k`` places."""
    cfg = run.cfg
    validate_selection_inputs(run.pool, run.validation, cfg.k)
    kinds = {e.target for e in run.pool}
    if (cfg.per_label or cfg.stratify) and len(kinds) > cfg.k:
        flag = "--stratify" if cfg.stratify else "--per-label"
        raise ValueError(f"{flag} shares the k={cfg.k} places out over the pool's labels, but task {run.task.name!r} "
                         f"has {len(kinds)} distinct labels in its pool; use it with at most k labels")


def _choose(run: _Run, selector: Selector) -> tuple[Selection, float, dict[str, Any] | None]:
    """``(selection, wall seconds, order search)``: the selector's choice (re-chosen per label
    when asked), put in ``cfg.order``; the order search's record is None unless ``--order search``."""
    cfg, pool = run.cfg, run.pool
    t0 = time.perf_counter()
    selection = selector.select(pool, run.validation, cfg.k, np.random.default_rng(cfg.seed))
    if cfg.per_label and not selector.balances_labels:
        selection = per_label(selection, pool)
    wall = time.perf_counter() - t0
    labels = [pool[i].target for i in selection.indices]
    searched = None
    if cfg.order == "search":  # the real prompt in each candidate order, on the validation queries
        dense = CacheEvaluator(run.model, run.builder, DenseCache(run.model), loss=cfg.loss, batch=1,
                               query_batch=cfg.query_batch, balance_labels=cfg.balance_labels, pack=True)
        selection.indices, searched = search_order(dense, pool, run.validation, selection.indices, labels,
                                                   cfg.order_candidates, order_rng(cfg.seed))
    else:
        selection.indices = arrange(selection.indices, labels, cfg.order, order_rng(cfg.seed))
    return selection, wall, searched


def _summary(run: _Run, selection: Selection, result: dict[str, Any], wall: float, orders: dict[str, Any] | None,
             searched: dict[str, Any] | None, selector: Selector) -> dict[str, Any]:
    """The ``--json`` summary of a chosen prompt: what was chosen, its test score (``result``) and
    the ``orders`` it was also scored in, what it cost, and the selector's findings
    (:meth:`~icl_ssm.select.base.Selector.findings`: the search's plan, screen and rungs)."""
    cfg, pool, details = run.cfg, run.pool, selection.details
    summary = {
        "method": cfg.method, "k": cfg.k, "indices": selection.indices, "notes": run.notes,
        "ids": [pool[i].id for i in selection.indices],
        "test_accuracy": result["accuracy"], "test_loss": result["loss"],
        "flops": selection.cost.flops, "wall_seconds": wall, "subsets": selection.subsets or None,
        "tokens": selection.tokens, "unseen": len(selection.unseen),
        "order": cfg.order, "per_label": cfg.per_label or cfg.stratify, "stratified": cfg.stratify,
        "evaluator": cfg.evaluator if cfg.method in EVALUATED else None,
        "estimator": cfg.estimator if cfg.method == "affinity" else None,
        "model": cfg.model, "task": run.task.name, "seed": cfg.seed, "pool_size": len(pool),
        "validation_size": len(run.validation), "test_size": len(run.test),
    }
    if orders is not None:
        summary.update(orders)
    kinds = {e.target for e in pool}
    if len(kinds) <= cfg.k:  # a task with a few labels: how the chosen ones share them
        labels = [pool[i].target for i in selection.indices]
        summary["labels"] = {y: labels.count(y) for y in sorted(kinds)}
    if searched is not None:
        summary["order_search"] = searched
    summary.update(selector.findings(details))
    return summary


def _calibrated(run: _Run, selection: Selection, summary: dict[str, Any]) -> dict[str, Any]:
    """The chosen prompt's calibration (the search's winning pair, else batch calibration on the
    validation inputs) and its test accuracy: the summary's ``calibration``,
    ``saved_calibration`` and ``calibrated_test_accuracy``."""
    cfg, model, builder = run.cfg, run.model, run.builder
    method = (summary.get("calibration") or "none") if cfg.method == "search" else "batch"
    demos = selection.examples(run.pool)
    calibration = (no_calibration(run.task.labels) if method == "none" else
                   calibrate_prompt(model, builder, demos, method, run.validation, query_batch=cfg.query_batch))
    scored = evaluate_calibrated(model, builder, demos, run.test, calibration, query_batch=cfg.query_batch)
    return {"calibration": method, "saved_calibration": calibration.to_dict(),
            "calibrated_test_accuracy": scored["accuracy"]}


def select_per_query(cfg: SelectConfig, model, tokenizer) -> tuple[dict[str, Any], list[Example], list[Example]]:
    """``cfg.method`` (bm25 or topk) retrieving ``cfg.k`` demonstrations for each test input
    (:func:`~icl_ssm.select.per_query.per_query_selection`); returns ``(summary, pool, test)``."""
    cfg.validate()
    task = get_task(cfg.task, **cfg.task_options)
    splits = split(task, pool_size=cfg.pool_size, seed=cfg.seed, fit=True, k=cfg.k, min_val_size=cfg.queries)
    test = splits.test[: cfg.test_size]
    builder = PromptBuilder.for_model(model, tokenizer, task, chat=cfg.chat)
    summary = per_query_selection(cfg.method, model, builder, splits.pool, test, cfg.k)
    notes = [n for n in (splits.note, *task.notes()) if n]
    summary.update(model=cfg.model, task=task.name, seed=cfg.seed, pool_size=len(splits.pool), notes=notes,
                   per_query=True)
    return summary, list(splits.pool), list(test)


def order_accuracies(model, builder: PromptBuilder, pool: Sequence[Example], indices: list[int],
                     test: Sequence[Example], cfg: SelectConfig, chosen: float) -> dict[str, Any] | None:
    """The chosen set's test accuracy in its own order and in ``cfg.test_orders`` random ones:
    ``test_accuracy_orders`` (the chosen order's first), their mean and standard deviation
    (``test_accuracy_order_mean``, ``test_accuracy_std``). None when no further order is asked."""
    if cfg.test_orders < 1 or len(indices) < 2:
        return None
    rng = np.random.default_rng([cfg.seed, 2])
    labels = [pool[i].target for i in indices]
    accs = [chosen]
    for _ in range(cfg.test_orders):
        order = arrange(indices, labels, "random", rng)
        accs.append(evaluate_selection(model, builder, [pool[i] for i in order], test, loss=cfg.loss,
                                       query_batch=cfg.query_batch)["accuracy"])
    return {"test_accuracy_orders": accs, "test_accuracy_order_mean": float(np.mean(accs)),
            "test_accuracy_std": float(np.std(accs, ddof=1))}

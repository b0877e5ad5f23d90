"""``icl-ssm select``: choose ``k`` demonstrations from a task's pool and score them on its test set.

``--method affinity`` is Algorithm 2 (``--evaluator compressed``: the distilled compressor's
caches; ``dense``: exact prefix caches shared by the queries of a subset; ``dense-per-query``:
one full prompt per query, the paper's accounting); ``random``, ``bm25``, ``topk`` and
``gradce`` are the baselines. Writes ``selected.jsonl`` (id, text, label, score),
``prompt.txt``, ``summary.json`` and ``select_config.json`` into ``--out``. Under
``accelerate launch -m icl_ssm select ...`` the subsets are sharded across processes and
every process ends with the same selection; the first one writes the files.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from icl_ssm import atomic
from icl_ssm.calibrate import Calibration, no_calibration
from icl_ssm.compress.compressor import SSMCompressor
from icl_ssm.compress.pretrained import find_pretrained
from icl_ssm.data.splits import DEFAULT_POOL_SIZE, Splits, label_warning, split
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.evaluate.answers import LOSSES
from icl_ssm.lm.models import DEFAULT_MODEL
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.affinity import AffinitySelector, search_order
from icl_ssm.select.base import (
    ARRANGE_ORDERS,
    SELECTORS,
    Selection,
    Selector,
    arrange,
    order_rng,
    per_label,
    validate_selection_inputs,
)
from icl_ssm.select.bridge import BridgeSelector
from icl_ssm.select.estimators import ESTIMATORS
from icl_ssm.select.evaluate import calibrate_prompt, evaluate_calibrated, evaluate_selection
from icl_ssm.select.evaluators import RELIABILITY_TARGET, CacheEvaluator
from icl_ssm.select.per_query import PER_QUERY_METHODS, per_query_selection
from icl_ssm.select.search import SCREENS, PromptSearch
from icl_ssm.select.selected import SelectedPrompt, compressor_fidelity, pool_spec

EVALUATORS = ("compressed", "dense", "dense-per-query")
EVALUATED = ("affinity", "bridge")  # the methods that score subsets with an evaluator (--evaluator)


# the selection settings of the paper's code: M = 1.5 n subsets, 50 validation queries
SELECT_RECIPES = ("measured", "paper")
PAPER_SUBSETS_PER_CANDIDATE = 1.5
PAPER_QUERIES = 50


def apply_recipe(cfg, recipe: str, given: set[str]):
    """``cfg`` (a :class:`SelectConfig` or a run's config with ``subsets``, ``queries`` and
    ``pool_size``) with the ``recipe``'s selection settings for the fields not in ``given``:
    ``paper`` is the authors' code (``subsets = 1.5 * pool_size``, 50 queries); ``measured``
    changes nothing."""
    if recipe not in SELECT_RECIPES:
        raise ValueError(f"--recipe {recipe!r}; accepted: {', '.join(SELECT_RECIPES)}")
    if recipe == "measured":
        return cfg
    changes = {}
    if "subsets" not in given:
        changes["subsets"] = math.ceil(PAPER_SUBSETS_PER_CANDIDATE * cfg.pool_size)
    if "queries" not in given:
        changes["queries"] = PAPER_QUERIES
    return replace(cfg, **changes)


def given_flags(argv: list[str] | None) -> set[str]:
    """The config fields an argv sets explicitly (``--pool-size 5`` -> ``pool_size``)."""
    return {a[2:].split("=")[0].replace("-", "_") for a in argv or () if a.startswith("--")}


CALIBRATE = ("search", "batch", "none")  # the chosen prompt's calibration: the search's pair, batch, or raw
ORDERS = (*ARRANGE_ORDERS, "search")  # search: chosen among candidate orders by the dense validation loss


@dataclass
class SelectConfig:
    model: str = DEFAULT_MODEL
    task: str = "rotten_tomatoes"
    k: int = 20
    method: str = "affinity"
    compressor: str | None = None  # directory; needed by --evaluator compressed
    evaluator: str = "compressed"
    estimator: str = "mean"
    subsets: int | None = None  # None: subsets_for(n, k, eps)
    eps: float = 0.5
    coverage: int = 1
    adaptive: float = 0.0
    queries: int = 32  # validation queries every subset is scored on
    test_size: int | None = None  # None: the whole test split
    pool_size: int = DEFAULT_POOL_SIZE
    seed: int = 0
    loss: str = "nll"
    batch: int = 8
    query_batch: int = 32
    pack: bool = True  # a subset's queries read as segments of one sequence after its cache (see CacheEvaluator)
    balance_labels: bool = False  # a subset's loss: the mean of its per-label mean validation losses
    per_label: bool = False  # the k places shared out evenly over the pool's labels (top_k_per_label)
    stratify: bool = False  # affinity: every subset with the labels in even shares (stratified_subsets); per label
    order: str = "score"  # prompt order of the chosen demonstrations: ORDERS
    order_candidates: int = 10  # --order search: orders scored on the validation queries
    per_query: bool = False  # bm25/topk: k demonstrations retrieved for each test input (select.per_query)
    test_orders: int = 0  # further random orders of the chosen set scored on the test split (order-averaged)
    budget: float | None = None  # minutes: affinity sizes queries (up to `queries`) and subsets to the target
    target_reliability: float = RELIABILITY_TARGET  # with a budget: split-half reliability aimed at
    search_minutes: float = 2.0  # --method search: wall time of screen + confirm + order
    screen: str = "none"  # --method search: compressed or dense caches, or none (random search; the default)
    screen_queries: int = 32  # --method search: label-balanced validation queries of the screen
    confirm_queries: int = 64  # --method search: validation queries of the last successive-halving rung
    seeds: dict[str, list[int]] = field(default_factory=dict)  # --method search: named prompts screened too
    # --method search: calibrations paired with every prompt (select.calibrated.SEARCHED); () raw losses
    search_calibrations: tuple[str, ...] = ()
    # the chosen prompt's calibration, saved with it: none, batch, or search (the search's winning pair)
    calibrate: str = "none"
    chat: bool = False
    task_options: dict[str, Any] = field(default_factory=dict)  # get_task's options (-o KEY=VALUE, --skip-empty)

    def validate(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"--k {self.k}: expected >= 1 demonstrations")
        if self.pool_size < 1:
            raise ValueError(f"--pool-size {self.pool_size}: expected >= 1 candidates")
        if self.seed < 0:
            raise ValueError(f"--seed {self.seed}: expected an integer >= 0")
        if self.method not in SELECTORS:
            raise ValueError(f"--method {self.method!r}; accepted: {', '.join(SELECTORS)}")
        if self.evaluator not in EVALUATORS:
            raise ValueError(f"--evaluator {self.evaluator!r}; accepted: {', '.join(EVALUATORS)}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"--estimator {self.estimator!r}; accepted: {', '.join(ESTIMATORS)}")
        if self.order not in ORDERS:
            raise ValueError(f"--order {self.order!r}; accepted: {', '.join(ORDERS)}")
        if self.order_candidates < 2:
            raise ValueError(f"--order-candidates {self.order_candidates}: expected >= 2 (score, interleave, "
                             "then random orders)")
        if self.loss not in LOSSES:
            raise ValueError(f"--loss {self.loss!r}; accepted: {', '.join(LOSSES)}")
        if self.method == "search" and self.screen == "compressed" and not self.compressor:
            raise ValueError("--method search --screen compressed needs --compressor DIR; --screen dense or "
                             "--screen none search without one")
        if self.method in EVALUATED and self.evaluator == "compressed" and not self.compressor:
            shipped = find_pretrained(self.model, self.task, self.k)
            where = (f"the one shipped for them is {shipped / 'compressor'}" if shipped else
                     f"none is shipped for --model {self.model} and --task {self.task}; train one with "
                     "`icl-ssm distill`")
            raise ValueError(f"--method {self.method} --evaluator compressed needs --compressor DIR ({where}), "
                             "or use --evaluator dense")
        for name in ("queries", "batch", "query_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.budget is not None and not self.budget > 0:
            raise ValueError(f"--budget {self.budget}: expected a positive number of minutes")
        if self.budget is not None and self.subsets is not None:
            raise ValueError(f"--budget {self.budget} sizes the subsets from a pilot round; give it without "
                             f"--subsets {self.subsets}")
        if not 0 < self.target_reliability < 1:
            raise ValueError(f"--target-reliability {self.target_reliability}: expected a value between 0 and 1")
        if self.per_query and self.method not in PER_QUERY_METHODS:
            raise ValueError(f"--per-query retrieves for each test input; --method {self.method!r} chooses one set "
                             f"(accepted with --per-query: {', '.join(PER_QUERY_METHODS)})")
        if self.test_orders < 0:
            raise ValueError(f"--test-orders {self.test_orders}: expected >= 0 further orders")
        if self.test_size is not None and self.test_size < 1:
            raise ValueError(f"--test-size {self.test_size}: expected >= 1")
        if not self.search_minutes > 0:
            raise ValueError(f"--search-minutes {self.search_minutes}: expected a positive number of minutes")
        if self.screen not in SCREENS:
            raise ValueError(f"--screen {self.screen!r}; accepted: {', '.join(SCREENS)}")
        if min(self.screen_queries, self.confirm_queries) < 1:
            raise ValueError(f"--screen-queries {self.screen_queries}, --confirm-queries {self.confirm_queries}: "
                             "expected >= 1")
        if self.calibrate not in CALIBRATE:
            raise ValueError(f"--calibrate {self.calibrate!r}; accepted: {', '.join(CALIBRATE)}")
        if self.calibrate == "search" and self.method != "search":
            raise ValueError(f"--calibrate search pairs every searched prompt with a calibration; --method "
                             f"{self.method} searches no prompts (use --calibrate batch)")
        if self.stratify and self.method != "affinity":
            raise ValueError(f"--stratify draws affinity's subsets with the labels in even shares; --method "
                             f"{self.method!r} samples no subsets (use --per-label to share its places out)")


def uses_compressor(cfg: SelectConfig) -> bool:
    """Whether the selection reads compressed caches (affinity or BRIDGE on them, the search's screen)."""
    if cfg.method == "search":
        return cfg.screen == "compressed"
    return cfg.method in EVALUATED and cfg.evaluator == "compressed"


def selection_queries(cfg: SelectConfig) -> int:
    """The validation queries a selection reads: ``cfg.queries``, or for the search the larger of
    its screen's and its last rung's."""
    if cfg.method == "search":
        return max(cfg.confirm_queries, cfg.screen_queries if cfg.screen != "none" else 0)
    return cfg.queries


def make_selector(cfg: SelectConfig, model, builder: PromptBuilder, compressor: SSMCompressor | None = None,
                  progress: Callable[[int], None] | None = None) -> Selector:
    """The selector ``cfg.method`` names in the registry, built by its ``from_config``."""
    return SELECTORS[cfg.method].from_config(cfg, model, builder, compressor, progress)


def select_demonstrations(
    cfg: SelectConfig,
    model,
    tokenizer,
    compressor: SSMCompressor | None = None,
    *,
    splits: Splits | None = None,
    on_start: Callable[[int], None] | None = None,
    progress: Callable[[int], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[Selection, dict[str, Any], list[Example]]:
    """Run the selection ``cfg`` describes and evaluate it on the test split.

    Returns ``(selection, summary, pool)``; ``summary`` has the keys of ``--json``.
    ``on_start(total_subsets)`` once the affinity budget is known (0 for baselines; with
    ``cfg.budget``, the pilot's and again once the plan is made); ``say(line)`` the pilot's
    findings and the plan before the main round is spent.
    """
    cfg.validate()
    if cfg.calibrate != "none" and cfg.method == "search" and not cfg.search_calibrations:
        cfg = replace(cfg, search_calibrations=("none", "batch") if cfg.calibrate == "search" else ("batch",))
    task = get_task(cfg.task, **cfg.task_options)
    if splits is None:  # a file too small for the default sizes gets splits sized to it (splits.note says so)
        splits = split(task, pool_size=cfg.pool_size, seed=cfg.seed, fit=True, k=cfg.k,
                       min_val_size=selection_queries(cfg))
    elif selection_queries(cfg) > len(splits.validation):
        raise ValueError(f"--queries {selection_queries(cfg)}: task {task.name!r} has only {len(splits.validation)} "
                         "validation examples; ask for at most that many")
    validation, test = splits.validation[: selection_queries(cfg)], splits.test[: cfg.test_size]
    task_labels = task.labels if task.kind == "classification" else ()
    notes = [n for n in (splits.note, *task.notes(), label_warning(splits.pool, task_labels)) if n]
    builder = PromptBuilder.for_model(model, tokenizer, task, chat=cfg.chat)
    selector = make_selector(cfg, model, builder, compressor, progress)
    if isinstance(selector, AffinitySelector):
        selector.say, selector.on_total = say, on_start  # a budget's pilot findings, plan and total
    if isinstance(selector, PromptSearch):
        selector.say, selector.on_total = say, on_start
    validate_selection_inputs(splits.pool, validation, cfg.k)
    kinds = {e.target for e in splits.pool}
    if (cfg.per_label or cfg.stratify) and len(kinds) > cfg.k:
        flag = "--stratify" if cfg.stratify else "--per-label"
        raise ValueError(f"{flag} shares the k={cfg.k} places out over the pool's labels, but task {task.name!r} "
                         f"has {len(kinds)} distinct labels in its pool; use it with at most k labels")
    if on_start is not None:
        if isinstance(selector, AffinitySelector):
            on_start(sum(selector.plan(len(splits.pool), cfg.k)))
        else:
            on_start(selector.plan(len(splits.pool), cfg.k) if isinstance(selector, BridgeSelector) else 0)
    t0 = time.perf_counter()
    selection = selector.select(splits.pool, validation, cfg.k, np.random.default_rng(cfg.seed))
    if cfg.per_label and not isinstance(selector, PromptSearch):  # the search's balanced prompts are its own
        selection = per_label(selection, splits.pool)
    wall = time.perf_counter() - t0
    labels = [splits.pool[i].target for i in selection.indices]
    searched = None
    if cfg.order == "search":  # the real prompt in each candidate order, on the validation queries
        dense = CacheEvaluator(model, builder, "dense", loss=cfg.loss, batch=1, query_batch=cfg.query_batch,
                                 balance_labels=cfg.balance_labels, pack=True)
        selection.indices, searched = search_order(dense, splits.pool, validation, selection.indices, labels,
                                                     cfg.order_candidates, order_rng(cfg.seed))
    else:
        selection.indices = arrange(selection.indices, labels, cfg.order, order_rng(cfg.seed))
    result = evaluate_selection(model, builder, selection.examples(splits.pool), test, loss=cfg.loss,
                                  query_batch=cfg.query_batch)
    orders = order_accuracies(model, builder, splits.pool, selection.indices, test, cfg, result["accuracy"])
    summary = {
        "method": cfg.method, "k": cfg.k, "indices": selection.indices, "notes": notes,
        "ids": [splits.pool[i].id for i in selection.indices],
        "test_accuracy": result["accuracy"], "test_loss": result["loss"],
        "flops": selection.cost.flops, "wall_seconds": wall, "subsets": selection.subsets or None,
        "tokens": selection.tokens, "unseen": len(selection.unseen),
        "order": cfg.order, "per_label": cfg.per_label or cfg.stratify, "stratified": cfg.stratify,
        "evaluator": cfg.evaluator if cfg.method in EVALUATED else None,
        "estimator": cfg.estimator if cfg.method == "affinity" else None,
        "model": cfg.model, "task": task.name, "seed": cfg.seed, "pool_size": len(splits.pool),
        "validation_size": len(validation), "test_size": len(test),
    }
    if orders is not None:
        summary.update(orders)
    if len(kinds) <= cfg.k:  # a task with a few labels: how the chosen ones share them
        summary["labels"] = {y: labels.count(y) for y in sorted(kinds)}
    if "budget" in selection.details:
        summary["budget"] = selection.details["budget"]
        summary["queries_used"] = selection.details["budget"]["queries"]
    for key in ("min_coverage", "split_half", "reliability", "queries_needed", "score_split_half",
                "score_reliability"):
        if key in selection.details:
            summary[key] = selection.details[key]
    if searched is not None:
        summary["order_search"] = searched
    if isinstance(selector, PromptSearch):  # its plan, screen, rungs and order search, for the report
        summary.update({key: value for key, value in selection.details.items() if key != "order_search"},
                       order_search=selection.details.get("order_search"))
    if cfg.calibrate != "none" and task.kind == "classification":  # its bias on the validation inputs read
        method = (summary.get("calibration") or "none") if cfg.method == "search" else "batch"
        demos = selection.examples(splits.pool)
        calibration = (no_calibration(task.labels) if method == "none" else
                       calibrate_prompt(model, builder, demos, method, validation, query_batch=cfg.query_batch))
        scored = evaluate_calibrated(model, builder, demos, test, calibration, query_batch=cfg.query_batch)
        summary.update(calibration=method, saved_calibration=calibration.to_dict(),
                       calibrated_test_accuracy=scored["accuracy"])
    return selection, summary, list(splits.pool)


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


def reliability_lines(summary: dict) -> list[str]:
    """What the split-half of the subset losses says, for stderr: its value, the whole validation
    set's reliability, and a warning with the queries it would take when that is below target."""
    split = summary.get("split_half")
    if split is None:
        return []
    used = summary.get("queries_used") or summary["validation_size"]
    lines = [f"split-half of the subset losses: {split:.2f} (Spearman between the subsets' losses on two halves of "
             f"the {used} validation queries); reliability of the whole set "
             f"{summary['reliability']:.2f} (Spearman-Brown)"]
    if split <= 0:
        lines.append("warning: the two halves of the validation set do not agree on which subsets are better, so "
                     "the affinity scores are mostly noise; use more validation queries (--queries) or "
                     "--balance-labels")
    elif summary["reliability"] < RELIABILITY_TARGET:
        lines.append(f"warning: the validation set orders the subsets with reliability {summary['reliability']:.2f}; "
                     f"about {summary['queries_needed']} queries (--queries) would give "
                     f"{RELIABILITY_TARGET} (Spearman-Brown)")
    if summary.get("score_reliability") is not None:
        lines.append(f"reliability of the candidates' affinity scores: {summary['score_reliability']:.2f} (scores from "
                     f"two halves of the {summary.get('subsets')} subsets, Spearman-Brown)"
                     + ("" if summary["score_reliability"] >= RELIABILITY_TARGET else
                        "; --budget MINUTES grows the subsets toward " + str(RELIABILITY_TARGET)))
    return lines


LEAN = 1.3  # lean_lines warns when one label holds more than this times its even share of the k places


def lean_lines(summary: dict) -> list[str]:
    """A warning, for stderr, when the chosen demonstrations lean to one label (more than
    ``LEAN`` times its even share of ``k``) and ``--per-label`` was not asked for."""
    counts = summary.get("labels")
    if not counts or summary.get("per_label") or len(counts) < 2:
        return []
    label, top = max(counts.items(), key=lambda kv: kv[1])
    if top <= LEAN * summary["k"] / len(counts):
        return []
    return [f"warning: {top} of the {summary['k']} chosen demonstrations are {label!r}; a prompt that leans to one "
            "label pulls the answers toward it, and --per-label shares the places out evenly (BENCHMARKS.md, "
            "\"One label's share of the prompt\")"]


def selected_rows(pool, indices: list[int], scores: list[float | None]) -> list[dict]:
    """The lines of ``selected.jsonl``: id, text, label and score of each chosen candidate."""
    return [{"id": pool[i].id, "text": pool[i].input, "label": pool[i].target, "score": scores[i]} for i in indices]


def write_selection(out: Path, selection: Selection, summary: dict, pool, builder_text: str, config: dict) -> None:
    """selected.jsonl, prompt.txt, summary.json, select_config.json and selection.json (the
    :class:`~icl_ssm.select.selected.SelectedPrompt` that ``icl-ssm answer`` loads), each written
    atomically."""
    scores = [float(x) if np.isfinite(x) else None for x in selection.scores]
    atomic.write_jsonl(out / "selected.jsonl", selected_rows(pool, selection.indices, scores))
    atomic.write_text(out / "prompt.txt", builder_text)
    atomic.write_json(out / "select_config.json", config)
    atomic.write_json(out / "summary.json", summary)
    chosen = selected_prompt(SelectConfig(**{k: v for k, v in config.items()
                                            if k in SelectConfig.__dataclass_fields__}), pool, selection.indices)
    saved = summary.get("saved_calibration")
    if saved and saved["method"] != "none":
        chosen.calibration = Calibration.from_dict(saved)
    chosen.save(out)


def selected_prompt(cfg: SelectConfig, pool: Sequence[Example], indices: Sequence[int]) -> SelectedPrompt:
    """The chosen ``indices`` of ``pool`` (prompt order) as a :class:`SelectedPrompt`, with the
    model, task, pool and compressor of ``cfg``."""
    task = get_task(cfg.task, **cfg.task_options)
    compressor = cfg.compressor if uses_compressor(cfg) else None
    made = pool_spec(pool, size=cfg.pool_size, seed=cfg.seed, k=cfg.k, min_validation=selection_queries(cfg))
    return SelectedPrompt.from_pool(pool, indices, model=cfg.model, task=task, method=cfg.method,
                                    task_options=cfg.task_options, chat=cfg.chat, pool_made=made,
                                    compressor=compressor, fidelity=compressor_fidelity(compressor))


def with_shipped_compressor(cfg: SelectConfig) -> SelectConfig:
    """``cfg`` with ``compressor`` set to the one shipped for its model and task (trained at the
    shot count nearest ``k``) when affinity on compressed caches was asked for without one."""
    if cfg.compressor or not uses_compressor(cfg):
        return cfg
    shipped = find_pretrained(cfg.model, cfg.task, cfg.k)
    if shipped is None:
        return cfg
    k = json.loads((shipped / "recipe.json").read_text()).get("k")
    print(f"icl-ssm select: no --compressor given; using the one shipped for {cfg.model} / {cfg.task} "
          f"({shipped.name}, trained at k={k})", file=sys.stderr)
    return replace(cfg, compressor=str(shipped / "compressor"))

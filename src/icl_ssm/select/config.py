"""The settings of one selection: :class:`SelectConfig`, the flags of ``icl-ssm select``, its
validation, the paper's recipe of selection settings, and what a config implies (whether it reads
a compressor, how many validation queries it reads, the compressor shipped for it).

:func:`~icl_ssm.select.stage.select_demonstrations` runs a config; the command line maps its flags
onto one (``--pool-size`` -> ``pool_size``) and saves it as ``select_config.json``.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from icl_ssm.compress.pretrained import find_pretrained
from icl_ssm.data.splits import DEFAULT_POOL_SIZE
from icl_ssm.evaluate.answers import LOSSES
from icl_ssm.lm.models import DEFAULT_MODEL
from icl_ssm.select.base import ARRANGE_ORDERS, SELECTORS
from icl_ssm.select.estimators import ESTIMATORS
from icl_ssm.select.per_query import PER_QUERY_METHODS
from icl_ssm.select.search import SCREENS
from icl_ssm.select.subset_losses import RELIABILITY_TARGET

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
    """The settings of one selection, one field per flag of ``icl-ssm select``: which selector
    (``method``), on which model, task and pool, and how the chosen prompt is ordered, calibrated
    and tested. Saved as ``select_config.json`` beside the selection."""

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
        """Refuse settings no selection can run, naming the flag, its value and what is accepted."""
        _validate_choices(self)
        _validate_compressor(self)
        _validate_sizes(self)
        _validate_search(self)
        _validate_combinations(self)


def _validate_choices(cfg: SelectConfig) -> None:
    """The sizes that come first, then every flag that names one of a fixed set."""
    if not isinstance(cfg.k, int) or cfg.k < 1:
        raise ValueError(f"--k {cfg.k}: expected >= 1 demonstrations")
    if cfg.pool_size < 1:
        raise ValueError(f"--pool-size {cfg.pool_size}: expected >= 1 candidates")
    if cfg.seed < 0:
        raise ValueError(f"--seed {cfg.seed}: expected an integer >= 0")
    if cfg.method not in SELECTORS:
        raise ValueError(f"--method {cfg.method!r}; accepted: {', '.join(SELECTORS)}")
    if cfg.evaluator not in EVALUATORS:
        raise ValueError(f"--evaluator {cfg.evaluator!r}; accepted: {', '.join(EVALUATORS)}")
    if cfg.estimator not in ESTIMATORS:
        raise ValueError(f"--estimator {cfg.estimator!r}; accepted: {', '.join(ESTIMATORS)}")
    if cfg.order not in ORDERS:
        raise ValueError(f"--order {cfg.order!r}; accepted: {', '.join(ORDERS)}")
    if cfg.order_candidates < 2:
        raise ValueError(f"--order-candidates {cfg.order_candidates}: expected >= 2 (score, interleave, "
                         "then random orders)")
    if cfg.loss not in LOSSES:
        raise ValueError(f"--loss {cfg.loss!r}; accepted: {', '.join(LOSSES)}")


def _validate_compressor(cfg: SelectConfig) -> None:
    """A selection that reads compressed caches needs ``--compressor``; the error names the
    compressor shipped for the model and task, where there is one."""
    if cfg.method == "search" and cfg.screen == "compressed" and not cfg.compressor:
        raise ValueError("--method search --screen compressed needs --compressor DIR; --screen dense or "
                         "--screen none search without one")
    if cfg.method in EVALUATED and cfg.evaluator == "compressed" and not cfg.compressor:
        shipped = find_pretrained(cfg.model, cfg.task, cfg.k)
        where = (f"the one shipped for them is {shipped / 'compressor'}" if shipped else
                 f"none is shipped for --model {cfg.model} and --task {cfg.task}; train one with "
                 "`icl-ssm distill`")
        raise ValueError(f"--method {cfg.method} --evaluator compressed needs --compressor DIR ({where}), "
                         "or use --evaluator dense")


def _validate_sizes(cfg: SelectConfig) -> None:
    """Batch and query counts, the budget and its target, test orders and size."""
    for name in ("queries", "batch", "query_batch"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: expected >= 1")
    if cfg.budget is not None and not cfg.budget > 0:
        raise ValueError(f"--budget {cfg.budget}: expected a positive number of minutes")
    if cfg.budget is not None and cfg.subsets is not None:
        raise ValueError(f"--budget {cfg.budget} sizes the subsets from a pilot round; give it without "
                         f"--subsets {cfg.subsets}")
    if not 0 < cfg.target_reliability < 1:
        raise ValueError(f"--target-reliability {cfg.target_reliability}: expected a value between 0 and 1")
    if cfg.per_query and cfg.method not in PER_QUERY_METHODS:
        raise ValueError(f"--per-query retrieves for each test input; --method {cfg.method!r} chooses one set "
                         f"(accepted with --per-query: {', '.join(PER_QUERY_METHODS)})")
    if cfg.test_orders < 0:
        raise ValueError(f"--test-orders {cfg.test_orders}: expected >= 0 further orders")
    if cfg.test_size is not None and cfg.test_size < 1:
        raise ValueError(f"--test-size {cfg.test_size}: expected >= 1")


def _validate_search(cfg: SelectConfig) -> None:
    """The prompt search's time, screen and query counts."""
    if not cfg.search_minutes > 0:
        raise ValueError(f"--search-minutes {cfg.search_minutes}: expected a positive number of minutes")
    if cfg.screen not in SCREENS:
        raise ValueError(f"--screen {cfg.screen!r}; accepted: {', '.join(SCREENS)}")
    if min(cfg.screen_queries, cfg.confirm_queries) < 1:
        raise ValueError(f"--screen-queries {cfg.screen_queries}, --confirm-queries {cfg.confirm_queries}: "
                         "expected >= 1")


def _validate_combinations(cfg: SelectConfig) -> None:
    """The calibration asked for, and the flags that only some methods take."""
    if cfg.calibrate not in CALIBRATE:
        raise ValueError(f"--calibrate {cfg.calibrate!r}; accepted: {', '.join(CALIBRATE)}")
    if cfg.calibrate == "search" and cfg.method != "search":
        raise ValueError(f"--calibrate search pairs every searched prompt with a calibration; --method "
                         f"{cfg.method} searches no prompts (use --calibrate batch)")
    if cfg.stratify and cfg.method != "affinity":
        raise ValueError(f"--stratify draws affinity's subsets with the labels in even shares; --method "
                         f"{cfg.method!r} samples no subsets (use --per-label to share its places out)")


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

"""What ``icl-ssm run`` is asked (:class:`RunConfig`, its defaults and why) and the splits it
runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from icl_ssm.compress.shape import RECIPE  # the shape distilled when none is shipped
from icl_ssm.data.splits import Splits, split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.verdict import VERDICT_EVALUATORS
from icl_ssm.lm.models import DEFAULT_MODEL
from icl_ssm.select.base import SELECTORS
from icl_ssm.select.config import CALIBRATE, SelectConfig
from icl_ssm.select.subset_losses import RELIABILITY_TARGET

DEFAULT_METHODS = ("search", "affinity", "random", "bm25", "topk")
SEARCH_SCREENS = ("auto", "compressed", "dense", "none")  # auto: compressed unless the fidelity verdict is dense
# the default screen, chosen by the pre-registered equal-time experiment's rule (``bench search``):
# no screen was shown to beat random search over whole prompts (docs/research/prompt-search.md)
DEFAULT_SCREEN = "none"
# by the pre-registered equal-time rule and the mapping committed before its results (docs/research/calibration.md)
DEFAULT_CALIBRATE = "search"
QUICK = "calibrated-random"  # the prompt handed over without a search where the headroom says none can add


@dataclass
class RunConfig:
    """Everything ``icl-ssm run`` was asked; the defaults are sized for ``make demo``."""

    model: str = DEFAULT_MODEL
    task: str = "rotten_tomatoes"
    k: int = 20
    seed: int = 0
    compressor: str | None = None  # a trained compressor directory; default: shipped or distilled
    control: str | None = None  # a control compressor (prompt-independent) for the fidelity comparison
    distill: bool = False  # distil a compressor first (even when one is shipped; without one, run uses dense caches)
    distill_samples: int = 64
    distill_epochs: float = 1.0
    state_size: int = RECIPE.state_size
    num_virtual: int = RECIPE.num_virtual
    num_sink: int = RECIPE.num_sink
    latent_size: int = RECIPE.latent_size
    num_recent: int = RECIPE.num_recent
    gate: bool = RECIPE.gate
    pool_size: int = 100
    queries: int = 8  # validation queries per subset
    test_size: int = 150
    test_orders: int = 0  # further random orders of every chosen set scored on the test split
    subsets: int | None = None  # affinity budget; default n / (k eps^2)
    budget: float | None = None  # minutes per affinity run, sized to target_reliability (select --budget)
    target_reliability: float = RELIABILITY_TARGET
    estimator: str = "mean"
    per_label: bool = False  # every method's k places shared out over the labels (select --per-label)
    stratify: bool = False  # affinity's subsets drawn with the labels in even shares (select --stratify)
    order: str = "score"  # prompt order of every method's chosen demonstrations (select --order)
    methods: tuple[str, ...] = DEFAULT_METHODS
    dense_evaluator: bool = True  # also run affinity on dense caches (cost and quality beside)
    equal_cost: bool = False  # with dense_evaluator: affinity on compressed caches given the dense run's time
    evaluator: str = "auto"  # affinity: auto (compressed unless the fidelity verdict fails them), compressed or dense
    max_accuracy_drop: float = 0.05  # the fidelity verdict: accuracy the compressed caches may lose to the dense prompt
    search_minutes: float = 2.0  # the prompt search's wall time (screen + confirm + order)
    screen: str = DEFAULT_SCREEN  # the search's screen: SEARCH_SCREENS
    screen_queries: int = 32  # label-balanced validation queries of the screen
    confirm_queries: int = 64  # validation queries of the search's last successive-halving rung
    check_size: int = 128  # held-out validation examples the check scores every prompt on
    random_prompts: int = 8  # random k-prompts the chosen prompt is checked against
    keep_selection: bool = False  # hand over the method's pick even when it does not beat random prompts
    calibrate: str = DEFAULT_CALIBRATE  # CALIBRATE: the label-score calibration selected and handed over
    headroom: bool = True  # with a calibration: search only where validation can rank calibrated prompts
    fidelity_subsets: int = 30
    fidelity_queries: int = 4
    batch: int = 8
    query_batch: int = 32
    task_options: dict[str, Any] = field(default_factory=dict)  # get_task's options (-o KEY=VALUE, --skip-empty)

    def validate(self) -> None:
        unknown = [m for m in self.methods if m not in SELECTORS]
        if unknown:
            raise ValueError(f"--methods {unknown}: accepted: {', '.join(SELECTORS)}")
        if self.k < 1:
            raise ValueError(f"--k {self.k}: expected >= 1 demonstrations")
        for name in ("pool_size", "queries", "test_size", "batch", "query_batch", "fidelity_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.seed < 0 or self.test_orders < 0:
            raise ValueError(f"--seed {self.seed}, --test-orders {self.test_orders}: expected integers >= 0")
        if self.random_prompts < 1 or self.check_size < 1:
            raise ValueError(f"--random-prompts {self.random_prompts}, --check-size {self.check_size}: expected >= 1")
        if self.evaluator not in VERDICT_EVALUATORS:
            raise ValueError(f"--evaluator {self.evaluator!r}; accepted: {', '.join(VERDICT_EVALUATORS)}")
        if not 0 <= self.max_accuracy_drop < 1:
            raise ValueError(f"--max-accuracy-drop {self.max_accuracy_drop}: expected a share in [0, 1)")
        if self.calibrate not in CALIBRATE:
            raise ValueError(f"--calibrate {self.calibrate!r}; accepted: {', '.join(CALIBRATE)}")
        if self.screen not in SEARCH_SCREENS:
            raise ValueError(f"--screen {self.screen!r}; accepted: {', '.join(SEARCH_SCREENS)}")
        if not self.search_minutes > 0:
            raise ValueError(f"--search-minutes {self.search_minutes}: expected a positive number of minutes")
        if self.fidelity_subsets < 2:
            raise ValueError(f"--fidelity-subsets {self.fidelity_subsets}: a rank correlation needs >= 2 subsets")

    def select_config(self, compressor: str | None) -> SelectConfig:
        """The settings every selection stage starts from (each stage sets its method and evaluator)."""
        return SelectConfig(model=self.model, task=self.task, k=self.k, compressor=compressor,
                            estimator=self.estimator, subsets=self.subsets, queries=self.queries,
                            test_size=self.test_size, pool_size=self.pool_size, seed=self.seed, batch=self.batch,
                            query_batch=self.query_batch, per_label=self.per_label, order=self.order,
                            task_options=self.task_options, budget=self.budget,
                            target_reliability=self.target_reliability, test_orders=self.test_orders)


def run_splits(cfg: RunConfig, task=None) -> Splits:
    """The pool, validation and test splits of a run: validation large enough for the selection's
    queries and the check's examples (a small file gets splits sized to it; ``Splits.note`` says so)."""
    task = task or get_task(cfg.task, **cfg.task_options)
    return split(task, pool_size=cfg.pool_size, seed=cfg.seed, fit=True, k=cfg.k,
                 min_val_size=held_out_start(cfg) + cfg.check_size)


def held_out_start(cfg: RunConfig) -> int:
    """Validation examples the selection methods read (the first ones); the check's come after."""
    search = max(cfg.confirm_queries, cfg.screen_queries) if "search" in cfg.methods else 0
    return max(cfg.queries, search)

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

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from icl_ssm import atomic
from icl_ssm import baselines as _baselines  # noqa: F401  (registers bm25, topk, gradce)
from icl_ssm import prompts as P
from icl_ssm import selection as S
from icl_ssm import tasks as T
from icl_ssm.compressor import SSMCompressor, find_pretrained, load_compressor
from icl_ssm.fidelity import LOSSES
from icl_ssm.models import DEFAULT_MODEL, load_model

EVALUATORS = ("compressed", "dense", "dense-per-query")
ORDERS = (*S.ORDERS, "search")  # search: chosen among candidate orders by the dense validation loss


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
    pool_size: int = T.DEFAULT_POOL_SIZE
    seed: int = 0
    loss: str = "nll"
    batch: int = 8
    query_batch: int = 32
    pack: bool = True  # a subset's queries read as segments of one sequence after its cache (see CacheEvaluator)
    balance_labels: bool = False  # a subset's loss: the mean of its per-label mean validation losses
    per_label: bool = False  # the k places shared out evenly over the pool's labels (S.top_k_per_label)
    stratify: bool = False  # affinity: every subset with the labels in even shares (S.stratified_subsets); per label
    order: str = "score"  # prompt order of the chosen demonstrations: ORDERS
    order_candidates: int = 10  # --order search: orders scored on the validation queries
    chat: bool = False

    def check(self) -> None:
        if self.method not in S.SELECTORS:
            raise ValueError(f"--method {self.method!r}; accepted: {', '.join(S.SELECTORS)}")
        if self.evaluator not in EVALUATORS:
            raise ValueError(f"--evaluator {self.evaluator!r}; accepted: {', '.join(EVALUATORS)}")
        if self.estimator not in S.ESTIMATORS:
            raise ValueError(f"--estimator {self.estimator!r}; accepted: {', '.join(S.ESTIMATORS)}")
        if self.order not in ORDERS:
            raise ValueError(f"--order {self.order!r}; accepted: {', '.join(ORDERS)}")
        if self.order_candidates < 2:
            raise ValueError(f"--order-candidates {self.order_candidates}: expected >= 2 (score, interleave, "
                             "then random orders)")
        if self.loss not in LOSSES:
            raise ValueError(f"--loss {self.loss!r}; accepted: {', '.join(LOSSES)}")
        if self.method == "affinity" and self.evaluator == "compressed" and not self.compressor:
            shipped = find_pretrained(self.model, self.task, self.k)
            where = (f"the one shipped for them is {shipped / 'compressor'}" if shipped else
                     f"none is shipped for --model {self.model} and --task {self.task}; train one with "
                     "`icl-ssm distill`")
            raise ValueError(f"--method affinity --evaluator compressed needs --compressor DIR ({where}), "
                             "or use --evaluator dense")
        for name in ("queries", "batch", "query_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.test_size is not None and self.test_size < 1:
            raise ValueError(f"--test-size {self.test_size}: expected >= 1")
        if self.stratify and self.method != "affinity":
            raise ValueError(f"--stratify draws affinity's subsets with the labels in even shares; --method "
                             f"{self.method!r} samples no subsets (use --per-label to share its places out)")


def make_selector(cfg: SelectConfig, model, builder: P.PromptBuilder, compressor: SSMCompressor | None = None,
                  progress: Callable[[int], None] | None = None) -> S.Selector:
    """The selector ``cfg.method`` names, wired to ``model`` (and ``compressor``)."""
    if cfg.method == "affinity":
        if cfg.evaluator == "dense-per-query":
            evaluator: S.SubsetEvaluator = S.PerQueryDenseEvaluator(model, builder, cfg.loss, cfg.batch,
                                                                    balance_labels=cfg.balance_labels)
        else:
            evaluator = S.CacheEvaluator(model, builder, cfg.evaluator, compressor, loss=cfg.loss, batch=cfg.batch,
                                         query_batch=cfg.query_batch, balance_labels=cfg.balance_labels,
                                         pack=cfg.pack)
        return S.AffinitySelector(evaluator, subsets=cfg.subsets, estimator=cfg.estimator, coverage=cfg.coverage,
                                  adaptive=cfg.adaptive, eps=cfg.eps, stratify=cfg.stratify, chunk=cfg.batch,
                                  progress=progress)
    cls = S.SELECTORS[cfg.method]
    return cls(model, builder) if cfg.method in ("topk", "gradce") else cls()


def select_demonstrations(
    cfg: SelectConfig,
    model,
    tokenizer,
    compressor: SSMCompressor | None = None,
    *,
    splits: T.Splits | None = None,
    on_start: Callable[[int], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[S.Selection, dict[str, Any], list[T.Example]]:
    """Run the selection ``cfg`` describes and evaluate it on the test split.

    Returns ``(selection, summary, pool)``; ``summary`` has the keys of ``--json``.
    ``on_start(total_subsets)`` once the affinity budget is known (0 for baselines).
    """
    cfg.check()
    task = T.get_task(cfg.task)
    splits = splits or T.split(task, pool_size=cfg.pool_size, seed=cfg.seed)
    if cfg.queries > len(splits.validation):
        raise ValueError(f"--queries {cfg.queries}: task {task.name!r} has only {len(splits.validation)} "
                         "validation examples; ask for at most that many")
    validation, test = splits.validation[: cfg.queries], splits.test[: cfg.test_size]
    builder = P.PromptBuilder.for_model(model, tokenizer, task, chat=cfg.chat)
    selector = make_selector(cfg, model, builder, compressor, progress)
    S.check_selection_inputs(splits.pool, validation, cfg.k)
    kinds = {e.target for e in splits.pool}
    if (cfg.per_label or cfg.stratify) and len(kinds) > cfg.k:
        flag = "--stratify" if cfg.stratify else "--per-label"
        raise ValueError(f"{flag} shares the k={cfg.k} places out over the pool's labels, but task {task.name!r} "
                         f"has {len(kinds)} distinct labels in its pool; use it with at most k labels")
    if on_start is not None:
        on_start(sum(selector.plan(len(splits.pool), cfg.k)) if isinstance(selector, S.AffinitySelector) else 0)
    t0 = time.perf_counter()
    selection = selector.select(splits.pool, validation, cfg.k, np.random.default_rng(cfg.seed))
    if cfg.per_label:
        selection = S.per_label(selection, splits.pool)
    wall = time.perf_counter() - t0
    labels = [splits.pool[i].target for i in selection.indices]
    searched = None
    if cfg.order == "search":  # the real prompt in each candidate order, on the validation queries
        dense = S.CacheEvaluator(model, builder, "dense", loss=cfg.loss, batch=1, query_batch=cfg.query_batch,
                                 balance_labels=cfg.balance_labels, pack=True)
        selection.indices, searched = S.search_order(dense, splits.pool, validation, selection.indices, labels,
                                                     cfg.order_candidates, S.order_rng(cfg.seed))
    else:
        selection.indices = S.arrange(selection.indices, labels, cfg.order, S.order_rng(cfg.seed))
    result = S.evaluate_selection(model, builder, selection.examples(splits.pool), test, loss=cfg.loss,
                                  query_batch=cfg.query_batch)
    summary = {
        "method": cfg.method, "k": cfg.k, "indices": selection.indices,
        "ids": [splits.pool[i].id for i in selection.indices],
        "test_accuracy": result["accuracy"], "test_loss": result["loss"],
        "flops": selection.cost.flops, "wall_seconds": wall, "subsets": selection.subsets or None,
        "tokens": selection.tokens, "unseen": len(selection.unseen),
        "order": cfg.order, "per_label": cfg.per_label or cfg.stratify, "stratified": cfg.stratify,
        "evaluator": cfg.evaluator if cfg.method == "affinity" else None,
        "estimator": cfg.estimator if cfg.method == "affinity" else None,
        "model": cfg.model, "task": task.name, "seed": cfg.seed, "pool_size": len(splits.pool),
        "validation_size": len(validation), "test_size": len(test),
    }
    if len(kinds) <= cfg.k:  # a task with a few labels: how the chosen ones share them
        summary["labels"] = {y: labels.count(y) for y in sorted(kinds)}
    for key in ("min_coverage", "split_half", "reliability", "queries_needed"):
        if key in selection.details:
            summary[key] = selection.details[key]
    if searched is not None:
        summary["order_search"] = searched
    return selection, summary, list(splits.pool)


def reliability_lines(summary: dict) -> list[str]:
    """What the split-half of the subset losses says, for stderr: its value, the whole validation
    set's reliability, and a warning with the queries it would take when that is below target."""
    split = summary.get("split_half")
    if split is None:
        return []
    lines = [f"split-half of the subset losses: {split:.2f} (Spearman between the subsets' losses on two halves of "
             f"the {summary['validation_size']} validation queries); reliability of the whole set "
             f"{summary['reliability']:.2f} (Spearman-Brown)"]
    if split <= 0:
        lines.append("warning: the two halves of the validation set do not agree on which subsets are better, so "
                     "the affinity scores are mostly noise; use more validation queries (--queries) or "
                     "--balance-labels")
    elif summary["reliability"] < S.RELIABILITY_TARGET:
        lines.append(f"warning: the validation set orders the subsets with reliability {summary['reliability']:.2f}; "
                     f"about {summary['queries_needed']} queries (--queries) would give "
                     f"{S.RELIABILITY_TARGET} (Spearman-Brown)")
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


def write_selection(out: Path, selection: S.Selection, summary: dict, pool, builder_text: str, config: dict) -> None:
    """selected.jsonl, prompt.txt, summary.json and select_config.json, each written atomically."""
    scores = [float(x) if np.isfinite(x) else None for x in selection.scores]
    atomic.write_jsonl(out / "selected.jsonl", selected_rows(pool, selection.indices, scores))
    atomic.write_text(out / "prompt.txt", builder_text)
    atomic.write_json(out / "select_config.json", config)
    atomic.write_json(out / "summary.json", summary)


def with_shipped_compressor(cfg: SelectConfig) -> SelectConfig:
    """``cfg`` with ``compressor`` set to the one shipped for its model and task (trained at the
    shot count nearest ``k``) when affinity on compressed caches was asked for without one."""
    if cfg.compressor or cfg.method != "affinity" or cfg.evaluator != "compressed":
        return cfg
    shipped = find_pretrained(cfg.model, cfg.task, cfg.k)
    if shipped is None:
        return cfg
    k = json.loads((shipped / "recipe.json").read_text()).get("k")
    print(f"icl-ssm select: no --compressor given; using the one shipped for {cfg.model} / {cfg.task} "
          f"({shipped.name}, trained at k={k})", file=sys.stderr)
    return replace(cfg, compressor=str(shipped / "compressor"))


def _main(args: argparse.Namespace) -> int:
    cfg = with_shipped_compressor(SelectConfig(**{f.name: getattr(args, f.name) for f in fields(SelectConfig)}))
    cfg.check()
    out = atomic.prepare_dir(args.out) if args.out else None
    import torch
    from accelerate import PartialState
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    state = PartialState(cpu=not torch.cuda.is_available())  # sets up torch.distributed under accelerate launch
    main = state.is_main_process
    model, tokenizer = load_model(cfg.model, device=state.device)
    compressor = None
    if cfg.method == "affinity" and cfg.evaluator == "compressed":
        compressor = load_compressor(cfg.compressor, model.config).to(state.device)
    stderr = Console(stderr=True)
    with Progress(TextColumn(f"select {cfg.method}"), BarColumn(), MofNCompleteColumn(), TextColumn("subsets"),
                  TimeRemainingColumn(), console=stderr, transient=True, disable=not main) as bar:
        job = bar.add_task("subsets", total=None)

        def advance(n: int) -> None:
            bar.advance(job, n)
            if main and not stderr.is_terminal:
                t = bar.tasks[0]
                stderr.print(f"select: {int(t.completed)}/{int(t.total or 0)} subsets, {t.elapsed or 0:.0f} s")

        selection, summary, pool = select_demonstrations(
            cfg, model, tokenizer, compressor, on_start=lambda n: bar.update(job, total=n or None), progress=advance)
    summary["argv"] = getattr(args, "argv", None)
    if main and out is not None:
        task = T.get_task(cfg.task)
        builder = P.PromptBuilder.for_model(model, tokenizer, task, chat=cfg.chat)
        text = builder.build_prefix(selection.examples(pool)).text
        write_selection(out, selection, summary, pool, text, {**asdict(cfg), "argv": summary["argv"]})
    if not main:
        return 0
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"{cfg.method}: test accuracy {summary['test_accuracy']:.3f} with k={cfg.k} "
          f"({summary['flops'] / 1e12:.3g} TFLOP, {summary['wall_seconds']:.1f} s)"
          + (f"; written to {out}" if out else ""), file=sys.stderr)
    for line in reliability_lines(summary) + lean_lines(summary):
        print(line, file=sys.stderr)
    for i in selection.indices:
        print(json.dumps({"id": pool[i].id, "label": pool[i].target, "text": pool[i].input[:100]}))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("select", help="choose k demonstrations from a task's pool (Algorithm 2 and baselines)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = SelectConfig()
    p.add_argument("--model", default=d.model, help="embedded name, hub id or local directory")
    p.add_argument("--task", default=d.task, help="task name, or a .jsonl/.csv file of your own")
    p.add_argument("--k", type=int, default=d.k, help="demonstrations to choose")
    p.add_argument("--method", default=d.method, help="affinity, random, bm25, topk or gradce")
    p.add_argument("--compressor", default=d.compressor, help="compressor directory (affinity, compressed evaluator)")
    p.add_argument("--evaluator", default=d.evaluator, choices=EVALUATORS, help="how affinity scores a subset")
    p.add_argument("--estimator", default=d.estimator, choices=S.ESTIMATORS,
                   help="mean: the paper's mean over containing subsets; ridge: a datamodel fitted to the losses")
    p.add_argument("--subsets", type=int, default=d.subsets, help="subsets M (default: n / (k eps^2))")
    p.add_argument("--eps", type=float, default=d.eps, help="target standard error that sets the default M")
    p.add_argument("--coverage", type=int, default=d.coverage, help="minimum subsets containing each candidate")
    p.add_argument("--adaptive", type=float, default=d.adaptive,
                   help="fraction of M spent on a second round near the top-k boundary")
    p.add_argument("--queries", type=int, default=d.queries, help="validation queries per subset")
    p.add_argument("--test-size", type=int, default=d.test_size, help="test examples scored (default: all)")
    p.add_argument("--pool-size", type=int, default=d.pool_size, help="candidate pool size")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--loss", default=d.loss, choices=LOSSES, help="per-query loss: gold NLL or label-set CE")
    p.add_argument("--batch", type=int, default=d.batch, help="subsets encoded together")
    p.add_argument("--query-batch", type=int, default=d.query_batch, help="(subset, query) pairs answered together")
    p.add_argument("--no-pack", dest="pack", action="store_false",
                   help="answer each (subset, query) pair after its own copy of the subset's cache (padded batches) "
                        "instead of a subset's queries packed into one sequence after one copy")
    p.add_argument("--balance-labels", action="store_true",
                   help="affinity: a subset's loss is the mean of its per-label mean validation losses, so the "
                        "label mix of the validation queries does not decide (classification tasks)")
    p.add_argument("--per-label", action="store_true",
                   help="share the k places out evenly over the pool's labels, each filled with its best-scored "
                        "candidates (any method; classification tasks with at most k labels)")
    p.add_argument("--stratify", action="store_true",
                   help="affinity: draw every subset with the pool's labels in even shares, each label from its own "
                        "balanced stream, and choose the k with the same shares (implies --per-label)")
    p.add_argument("--order", default=d.order, choices=ORDERS,
                   help="prompt order of the chosen demonstrations: score (the paper's, best last), interleave "
                        "(each label spread evenly, better ones later), random, or search (the candidate order "
                        "with the lowest dense validation loss)")
    p.add_argument("--order-candidates", type=int, default=d.order_candidates,
                   help="--order search: score, interleave and this many minus two random orders")
    p.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    p.add_argument("--out", help="directory for selected.jsonl, prompt.txt, summary.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=_main)

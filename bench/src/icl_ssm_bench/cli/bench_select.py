"""The selection kinds of ``icl-ssm bench`` (select-cost, scale, select-quality, estimators,
select-order, headroom): their flags, over the modules of :mod:`icl_ssm_bench.selection`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from icl_ssm import atomic
from icl_ssm.lm.models import DEFAULT_MODEL
from icl_ssm.pipeline import RunConfig
from icl_ssm.provenance import provenance
from icl_ssm.select.base import ARRANGE_ORDERS
from icl_ssm.select.config import ORDERS
from icl_ssm.select.estimators import ESTIMATORS
from icl_ssm_bench.calibration import METHODS as CALIBRATIONS
from icl_ssm_bench.calibration import CalibrationHeadroomConfig, calibration_headroom, calibration_markdown
from icl_ssm_bench.estimators import (
    EstimatorsConfig,
    EstimatorsSimConfig,
    estimators,
    estimators_markdown,
    estimators_sim,
)
from icl_ssm_bench.headroom import HeadroomConfig, headroom, headroom_markdown
from icl_ssm_bench.scale import ScaleConfig, run_scale
from icl_ssm_bench.scale_report import scale_markdown
from icl_ssm_bench.select_cost import SelectCostConfig, select_cost, select_cost_markdown
from icl_ssm_bench.select_order import SelectOrderConfig, select_order, select_order_markdown
from icl_ssm_bench.select_quality import SelectQualityConfig, select_quality, select_quality_markdown
from icl_ssm_bench.shapes import PAPER_SHAPES, SHAPES, SyntheticPrompts


def _run(fn: Callable[[argparse.Namespace], dict], markdown: Callable[[dict], str]):
    """The handler of a kind whose ``fn`` builds the harness's config from the flags and runs it:
    the record (with the command line) written to ``--json-out``, its table printed."""

    def go(args: argparse.Namespace) -> int:
        result = fn(args)
        result["argv"] = getattr(args, "argv", None)
        if args.json_out:
            atomic.write_json(args.json_out, result)
        print(markdown(result))
        return 0

    return go


def _save_partial(args: argparse.Namespace) -> Callable[[dict], None] | None:
    """Writes a partial record (with the command line) to ``--json-out``; None without the flag."""
    if not args.json_out:
        return None
    return lambda record: atomic.write_json(args.json_out, {**record, "argv": getattr(args, "argv", None)})


def _select_cost(args: argparse.Namespace) -> dict:
    return select_cost(SelectCostConfig(
        model=args.model, compressor=args.compressor, task=args.task, k=tuple(args.k), queries=args.queries,
        subsets=args.subsets, query_batch=args.query_batch, per_query_max_k=args.per_query_max_k, seed=args.seed))


def _select_quality(args: argparse.Namespace) -> dict:
    return select_quality(SelectQualityConfig(
        model=args.model, compressor=args.compressor, also=tuple(args.also), tasks=tuple(args.tasks),
        methods=tuple(args.methods), k=args.k, seeds=tuple(args.seeds), pool_size=args.pool_size,
        queries=args.queries, test_size=args.test_size, subsets=args.subsets, estimator=args.estimator,
        balance_labels=args.balance_labels, order=args.order, per_label=args.per_label, batch=args.batch,
        query_batch=args.query_batch))


def _select_order(args: argparse.Namespace) -> dict:
    return select_order(SelectOrderConfig(model=args.model, reports=tuple(args.reports), orders=tuple(args.orders),
                                          permutations=args.permutations, query_batch=args.query_batch))


def _estimators(args: argparse.Namespace) -> dict:
    cfg = EstimatorsConfig(
        model=args.model, compressor=args.compressor, task=args.task, evaluator=args.evaluator, k=args.k,
        seeds=tuple(args.seeds), budgets=tuple(args.budgets), pool_size=args.pool_size, queries=args.queries,
        test_size=args.test_size, permutations=args.permutations, balance_labels=args.balance_labels,
        per_label=args.per_label, adaptive=args.adaptive, sampling=args.sampling, batch=args.batch,
        query_batch=args.query_batch)
    return estimators(cfg, save_partial=_save_partial(args))


def _estimators_sim(args: argparse.Namespace) -> dict:
    return estimators_sim(EstimatorsSimConfig(pool_size=args.pool_size, k=args.k, signal=args.signal,
                                              noise=args.noise, seeds=tuple(args.seeds), budgets=tuple(args.budgets)))


def _headroom(args: argparse.Namespace) -> dict:
    cfg = HeadroomConfig(model=args.model, tasks=tuple(args.tasks), k=args.k, sets=args.sets_given or 30,
                         pool_size=args.pool_size, test_size=args.test_size, seed=args.seed,
                         query_batch=args.query_batch)
    return headroom(cfg, save_partial=_save_partial(args))


def _run_headroom(args: argparse.Namespace) -> int:
    if args.calibrations is None:
        return _run(_headroom, headroom_markdown)(args)
    from icl_ssm.lm.models import load_model
    from icl_ssm_bench.selection import log

    cfg = CalibrationHeadroomConfig(tasks=tuple(args.tasks), k=args.k, prompts=args.sets_given or 12,
                                    pool_size=args.pool_size, validation=args.validation, test_size=args.test_size,
                                    seed=args.seed, methods=tuple(args.calibrations), imbalance=args.imbalance,
                                    query_batch=args.query_batch)
    cfg.validate()
    if args.json_out:
        atomic.prepare_dir(Path(args.json_out).parent)
    made_by = provenance(" ".join(["icl-ssm", *(getattr(args, "argv", None) or ["bench", "headroom"])]))  # at start
    model, tokenizer = load_model(args.model)
    result = calibration_headroom(cfg, model, tokenizer, log=log)
    result["provenance"] = made_by
    if args.json_out:
        atomic.write_json(args.json_out, result)
    print(calibration_markdown(result))
    return 0


def _k(value: str) -> int | str:
    return value if value == "max" else int(value)


def _run_scale(args: argparse.Namespace) -> int:
    shapes = [s for name in args.shapes for s in (PAPER_SHAPES if name == "paper" else (name,))]
    cfg = ScaleConfig(shapes=tuple(shapes), k=tuple(args.k), queries=args.queries,
                      prompts=SyntheticPrompts(args.demo_tokens, args.query_tokens), subsets=args.subsets,
                      batch=args.batch, query_batch=args.query_batch, per_query_queries=args.per_query_queries,
                      per_query_max_k=args.per_query_max_k, device=args.device, dtype=args.dtype, memory=args.memory,
                      max_memory_gib=args.max_memory_gib, max_prompt_tokens=args.max_prompt_tokens,
                      time_budget_s=args.time_budget_s, distill=args.distill, project_only=args.project_only,
                      seed=args.seed)
    if args.out:
        atomic.prepare_dir(args.out)  # a bad --out is refused before the minutes of the run
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_scale(cfg)
    result["provenance"] = provenance(" ".join(["icl-ssm", *getattr(args, "argv", ["bench", "scale"])]), cfg.device)
    text = atomic.write_result(args.out, "scale", result, scale_markdown) if args.out else scale_markdown(result)
    print(text)
    return 0


def add_kinds(kinds: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default=DEFAULT_MODEL)
    common.add_argument("--compressor", help="compressor directory (the compressed evaluator)")
    common.add_argument("--queries", type=int, default=32, help="validation queries per subset")
    common.add_argument("--batch", type=int, default=8)
    common.add_argument("--query-batch", type=int, default=32)
    common.add_argument("--json-out", help="also write the full result as JSON here")

    p = kinds.add_parser("select-cost", parents=[common], formatter_class=fmt,
                         help="FLOPs and seconds per subset of the compressed, dense and per-query evaluators")
    p.add_argument("--task", default="rotten_tomatoes")
    p.add_argument("--k", type=int, nargs="+", default=[20, 50, 200])
    p.add_argument("--subsets", type=int, default=2, help="timed subsets per evaluator (after one warm-up)")
    p.add_argument("--per-query-max-k", type=int, default=50, help="largest k the per-query evaluator runs at")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run(_select_cost, select_cost_markdown))

    p = kinds.add_parser("scale", formatter_class=fmt,
                         help="selection cost at the paper's model sizes on random weights: FLOPs, seconds and memory "
                              "per subset, the cache build, a distillation step")
    p.add_argument("--shapes", nargs="+", default=["qwen2.5-0.5b"], choices=[*SHAPES, "paper"], metavar="SHAPE",
                   help=f"model shapes (paper: {' '.join(PAPER_SHAPES)}); accepted: {', '.join(SHAPES)}")
    p.add_argument("--k", type=_k, nargs="+", default=[20, 50],
                   help="demonstrations per prompt; 'max': the most that fit the context (and --max-prompt-tokens)")
    p.add_argument("--queries", type=int, default=RunConfig.queries, help="validation queries per subset (run's)")
    p.add_argument("--demo-tokens", type=int, default=SyntheticPrompts.demo_tokens, help="tokens per demonstration")
    p.add_argument("--query-tokens", type=int, default=SyntheticPrompts.query_tokens, help="tokens per query")
    p.add_argument("--subsets", type=int, default=1, help="measured subsets per case")
    p.add_argument("--batch", type=int, default=1, help="subsets encoded together (0: as many as fit, GPU)")
    p.add_argument("--query-batch", type=int, default=32)
    p.add_argument("--per-query-queries", type=int, default=2,
                   help="queries the dense per-query evaluator runs on (its cost scaled to --queries)")
    p.add_argument("--per-query-max-k", type=int, default=50, help="largest k the per-query evaluator runs at")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--no-memory", dest="memory", action="store_false",
                   help="no peak memory (on the CPU it costs a child process that runs every case again)")
    p.add_argument("--max-memory-gib", type=float, default=None,
                   help="refuse a shape that would need more (default: the memory free on the device)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="cap of --k max")
    p.add_argument("--time-budget-s", type=float, default=None, help="cases left when it is spent are skipped")
    p.add_argument("--no-distill", dest="distill", action="store_false", help="no distillation step")
    p.add_argument("--project-only", action="store_true", help="build no model: the FLOPs projected from the shapes")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="directory for scale.json and scale.md (written atomically)")
    p.set_defaults(func=_run_scale)

    p = kinds.add_parser("select-quality", parents=[common], formatter_class=fmt,
                         help="test accuracy of every selection method over tasks and seeds")
    p.add_argument("--tasks", nargs="+", default=["rotten_tomatoes", "cr", "coin_flip", "modular_addition",
                                                  "edge_existence"])
    p.add_argument("--methods", nargs="+", default=["affinity", "affinity:dense", "random", "bm25", "topk"],
                   help="METHOD or affinity:EVALUATOR (compressed, dense, or a NAME from --also)")
    p.add_argument("--also", nargs="+", metavar="NAME=DIR", default=[],
                   help="more compressors, each an evaluator for a method affinity:NAME (same subsets per seed)")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--pool-size", type=int, default=100)
    p.add_argument("--test-size", type=int, default=200)
    p.add_argument("--subsets", type=int, default=None)
    p.add_argument("--estimator", default="mean", choices=ESTIMATORS)
    p.add_argument("--balance-labels", action="store_true",
                   help="affinity: a subset's loss is the mean of its per-label mean validation losses "
                        "(classification tasks)")
    p.add_argument("--order", default="score", choices=ORDERS, help="prompt order of the chosen demonstrations")
    p.add_argument("--per-label", action="store_true",
                   help="every method: the k places shared out evenly over the pool's labels (select --per-label)")
    p.set_defaults(func=_run(_select_quality, select_quality_markdown))

    p = kinds.add_parser("select-order", formatter_class=fmt,
                         help="earlier selections scored again on the test set in each prompt order")
    p.add_argument("--reports", nargs="+", required=True, help="select-quality --json-out files")
    p.add_argument("--orders", nargs="+", default=list(ARRANGE_ORDERS), help="the first is the baseline of the diffs")
    p.add_argument("--permutations", type=int, default=1,
                   help="random orders drawn per selection; their mean averages the order out")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--query-batch", type=int, default=32)
    p.add_argument("--json-out", help="also write the full result as JSON here")
    p.set_defaults(func=_run(_select_order, select_order_markdown))

    p = kinds.add_parser("headroom", formatter_class=fmt,
                         help="how far random demonstration sets move a task's test accuracy: what there is to select")
    p.add_argument("--tasks", nargs="+", default=["rotten_tomatoes", "cr", "coin_flip", "modular_addition",
                                                  "edge_existence"])
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--sets", dest="sets_given", type=int, default=None,
                   help="random subsets of the pool, each scored on the test set (default 30)")
    p.add_argument("--pool-size", type=int, default=100)
    p.add_argument("--test-size", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--query-batch", type=int, default=32)
    p.add_argument("--calibrations", nargs="+", choices=CALIBRATIONS, default=None,
                   help="measure the headroom left after each calibration instead: every prompt scored once on "
                        "--validation inputs and the test examples, each calibration applied to its label scores "
                        "(spread, validation-test Spearman, split-half on validation); with it --sets defaults to 12")
    p.add_argument("--validation", type=int, default=64, help="with --calibrations: validation inputs per prompt")
    p.add_argument("--imbalance", type=float, default=None,
                   help="with --calibrations: test examples drawn so the first label holds this share")
    p.add_argument("--json-out", help="also write the full result as JSON here")
    p.set_defaults(func=_run_headroom)

    p = kinds.add_parser("estimators", parents=[common], formatter_class=fmt,
                         help="selected-set test accuracy against subsets: mean, ridge, adaptive")
    p.add_argument("--task", default="rotten_tomatoes")
    p.add_argument("--evaluator", default="compressed", choices=("compressed", "dense"))
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budgets", type=int, nargs="+", default=[10, 20, 40, 80])
    p.add_argument("--pool-size", type=int, default=100)
    p.add_argument("--test-size", type=int, default=200)
    p.add_argument("--permutations", type=int, default=0,
                   help="score each selected set in this many random orders and average (0: its own order)")
    p.add_argument("--balance-labels", action="store_true",
                   help="a subset's loss is the mean of its per-label mean validation losses (classification)")
    p.add_argument("--per-label", action="store_true",
                   help="also rows mean/per-label and ridge/per-label: the same scores, the k places shared out "
                        "evenly over the pool's labels")
    p.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                   help="leave out adaptive sampling (its second rounds cost subsets of their own)")
    p.add_argument("--sampling", default="uniform", choices=("uniform", "stratified", "both"),
                   help="subsets drawn uniformly (rows mean, ridge), with the pool's labels in even shares (rows "
                        "mean/stratified, ridge/stratified, chosen per label: select --stratify), or both streams")
    p.set_defaults(func=_run(_estimators, estimators_markdown))

    p = kinds.add_parser("estimators-sim", formatter_class=fmt,
                         help="recall of planted best demonstrations against subsets: mean, ridge, adaptive")
    p.add_argument("--pool-size", type=int, default=1500)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--signal", type=float, default=0.2, help="std of subset losses from the planted effects")
    p.add_argument("--noise", type=float, default=0.1, help="std of the evaluation noise per subset")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budgets", type=int, nargs="+", default=[150, 300, 600, 1200, 2400])
    p.add_argument("--json-out", help="also write the full result as JSON here")
    p.set_defaults(func=_run(_estimators_sim, estimators_markdown))

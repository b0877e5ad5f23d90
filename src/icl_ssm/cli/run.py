"""``icl-ssm run``: parse the flags into a :class:`~icl_ssm.pipeline.RunConfig`, call
:func:`~icl_ssm.pipeline.run_pipeline`, print where the report is."""

from __future__ import annotations

import argparse
from pathlib import Path

from icl_ssm.cli.options import add_budget_flags, add_recipe_flag, add_search_flags, add_target, task_options
from icl_ssm.evaluate.verdict import VERDICT_EVALUATORS
from icl_ssm.pipeline import CALIBRATE, SEARCH_SCREENS, RunConfig, run_pipeline, say
from icl_ssm.report.markdown import calibration_lines, check_lines, verdict_lines
from icl_ssm.select.config import ORDERS, apply_recipe, given_flags
from icl_ssm.select.estimators import ESTIMATORS


def _main(args: argparse.Namespace) -> int:
    args.task_options = task_options(args)
    cfg = RunConfig(**{f: getattr(args, f) for f in RunConfig.__dataclass_fields__})
    cfg = apply_recipe(cfg, args.recipe, given_flags(getattr(args, "argv", None)))
    cfg.methods = tuple(cfg.methods)
    report = run_pipeline(cfg, args.out)
    for line in calibration_lines(report) + verdict_lines(report) + check_lines(report):
        say(line)
    say(f"prompt: {Path(args.out) / 'prompt.txt'}; report: {Path(args.out) / 'report.md'}")
    print(Path(args.out) / "report.md")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="the whole pipeline: compressor, fidelity, selection, baselines, report",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = RunConfig()
    add_target(p, model=d.model, task=d.task, k=d.k)
    p.add_argument("--out", default="icl-ssm-run", help="directory for the report and every stage's results")
    p.add_argument("--seed", type=int, default=d.seed)
    _add_compressor_flags(p, d)
    _add_selection_flags(p, d)
    _add_evaluator_flags(p, d)
    _add_check_flags(p, d)
    p.add_argument("--fidelity-subsets", type=int, default=d.fidelity_subsets)
    p.add_argument("--fidelity-queries", type=int, default=d.fidelity_queries)
    p.add_argument("--batch", type=int, default=d.batch, help="subsets encoded together")
    p.add_argument("--query-batch", type=int, default=d.query_batch, help="(subset, query) pairs answered together")
    p.set_defaults(func=_main)


def _add_compressor_flags(p: argparse.ArgumentParser, d: RunConfig) -> None:
    """The compressor a run uses, or distils first, and the shape it distils."""
    p.add_argument("--compressor", default=d.compressor, help="a trained compressor directory to use")
    p.add_argument("--control", default=d.control, help="a control compressor directory for the fidelity table")
    p.add_argument("--distill", action="store_true",
                   help="distil a compressor first (without one shipped for the model and task, run selects on dense "
                        "caches)")
    p.add_argument("--distill-samples", type=int, default=d.distill_samples, help="training subsets when distilling")
    p.add_argument("--distill-epochs", type=float, default=d.distill_epochs, help="epochs of each stage")
    for name in ("state_size", "num_virtual", "num_sink", "latent_size", "num_recent"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name),
                       help="compressor shape when distilling")
    p.add_argument("--gate", action=argparse.BooleanOptionalAction, default=d.gate,
                   help="when distilling: gated virtual tokens beside the exact recent tokens")


def _add_selection_flags(p: argparse.ArgumentParser, d: RunConfig) -> None:
    """The candidate pool, the selection methods and their budgets, and the test evaluation."""
    p.add_argument("--pool-size", type=int, default=d.pool_size, help="candidates to select from")
    add_budget_flags(p, d)
    add_search_flags(p, d, SEARCH_SCREENS)
    p.add_argument("--test-size", type=int, default=d.test_size, help="test examples per evaluation")
    p.add_argument("--test-orders", type=int, default=d.test_orders,
                   help="further random orders of every chosen set scored on the test split (order-averaged)")
    p.add_argument("--subsets", type=int, default=d.subsets, help="affinity subsets (default n / (k eps^2))")
    p.add_argument("--estimator", default=d.estimator, choices=ESTIMATORS)
    add_recipe_flag(p)
    p.add_argument("--per-label", action="store_true",
                   help="every method: the k places shared out evenly over the pool's labels (select --per-label)")
    p.add_argument("--stratify", action="store_true",
                   help="affinity: every subset drawn with the pool's labels in even shares, the k chosen with the "
                        "same shares (select --stratify)")
    p.add_argument("--order", default=d.order, choices=ORDERS,
                   help="prompt order of every method's chosen demonstrations (select --order)")
    p.add_argument("--methods", nargs="+", default=list(d.methods), help="selection methods to compare")


def _add_evaluator_flags(p: argparse.ArgumentParser, d: RunConfig) -> None:
    """Which caches affinity scores subsets on, and the fidelity verdict that decides it."""
    p.add_argument("--dense-evaluator", action=argparse.BooleanOptionalAction, default=d.dense_evaluator,
                   help="also run affinity on dense caches")
    p.add_argument("--equal-cost", action=argparse.BooleanOptionalAction, default=d.equal_cost,
                   help="with --dense-evaluator: also run affinity on compressed caches with the dense run's wall time "
                        "as its budget (what the cheaper evaluation buys)")
    p.add_argument("--evaluator", default=d.evaluator, choices=VERDICT_EVALUATORS,
                   help="how affinity scores subsets: auto = on compressed caches unless they fail their fidelity "
                        "check (then dense, with the reason in the report)")
    p.add_argument("--max-accuracy-drop", type=float, default=d.max_accuracy_drop,
                   help="fidelity verdict: accuracy the compressed caches may lose to the dense prompt")


def _add_check_flags(p: argparse.ArgumentParser, d: RunConfig) -> None:
    """The check before a prompt is handed over, and the calibration chosen with it."""
    p.add_argument("--check-size", type=int, default=d.check_size,
                   help="held-out validation examples every method's pick, zero-shot and the random prompts are "
                        "checked on before a prompt is handed over")
    p.add_argument("--random-prompts", type=int, default=d.random_prompts,
                   help="random prompts of the same size the pick is checked against")
    p.add_argument("--calibrate", default=d.calibrate, choices=CALIBRATE,
                   help="the label-score calibration selected with the prompt and saved in selection.json: search "
                        "(every searched prompt scored raw and batch-calibrated, the better pair kept; other picks "
                        "batch-calibrated), batch (every pick batch-calibrated) or none (raw answers); with either "
                        "of the first two the check also weighs calibrated random prompts and zero-shot")
    p.add_argument("--no-headroom", dest="headroom", action="store_false",
                   help="with --calibrate search or batch: search even where validation cannot rank calibrated "
                        "random prompts (by default run measures that first and, where it cannot, hands over a "
                        "calibrated random prompt at once)")
    p.add_argument("--keep-selection", action="store_true",
                   help="hand over the search's (else affinity's) pick even when another checked prompt beats it")

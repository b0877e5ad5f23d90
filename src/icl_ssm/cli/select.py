"""``icl-ssm select``: parse the flags into a :class:`~icl_ssm.select.config.SelectConfig`, call
:func:`~icl_ssm.select.stage.select_demonstrations`, write and print the result."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from dataclasses import asdict, fields

from icl_ssm import atomic
from icl_ssm.cli.options import add_budget_flags, add_recipe_flag, add_search_flags, add_target, task_options
from icl_ssm.compress.compressor import load_compressor
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.answers import LOSSES
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lock import one_writer
from icl_ssm.select.base import SELECTORS, Hooks
from icl_ssm.select.config import (
    CALIBRATE,
    EVALUATORS,
    ORDERS,
    SelectConfig,
    apply_recipe,
    given_flags,
    uses_compressor,
    with_shipped_compressor,
)
from icl_ssm.select.estimators import ESTIMATORS
from icl_ssm.select.notices import lean_lines, reliability_lines
from icl_ssm.select.outputs import write_selection
from icl_ssm.select.search import SCREENS
from icl_ssm.select.stage import select_demonstrations, select_per_query


def _main(args: argparse.Namespace) -> int:
    args.task_options = task_options(args)
    cfg = SelectConfig(**{f.name: getattr(args, f.name) for f in fields(SelectConfig) if hasattr(args, f.name)})
    cfg = with_shipped_compressor(apply_recipe(cfg, args.recipe, given_flags(getattr(args, "argv", None))))
    cfg.validate()
    out = atomic.prepare_dir(args.out) if args.out else None
    first = os.environ.get("RANK", "0") == "0"  # under accelerate launch, the first process holds the lock
    with one_writer(out, "icl-ssm select") if out is not None and first else nullcontext():
        return _select(cfg, out, args)


def _select(cfg: SelectConfig, out, args: argparse.Namespace) -> int:
    if cfg.per_query:
        return _per_query(cfg, out, args)
    import torch
    from accelerate import PartialState
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    state = PartialState(cpu=not torch.cuda.is_available())  # sets up torch.distributed under accelerate launch
    main = state.is_main_process
    model, tokenizer = load_model(cfg.model, device=state.device)
    compressor = None
    if uses_compressor(cfg):
        compressor = load_compressor(cfg.compressor, model.config).to(state.device)
    builder = PromptBuilder.for_model(model, tokenizer, get_task(cfg.task, **cfg.task_options), chat=cfg.chat)
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
            cfg, model, tokenizer, compressor, builder=builder,
            hooks=Hooks(on_say=(lambda line: stderr.print(f"select: {line}", highlight=False, soft_wrap=True))
                        if main else None, on_progress=advance, on_total=lambda n: bar.update(job, total=n or None)))
    summary["argv"] = getattr(args, "argv", None)
    if main and out is not None:
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
    if summary.get("saved_calibration"):
        print(f"calibration {summary['calibration']} (saved in selection.json; {summary['saved_calibration']['source']}"
              f"): test accuracy {summary['calibrated_test_accuracy']:.3f}, raw {summary['test_accuracy']:.3f}",
              file=sys.stderr)
    for line in summary["notes"] + reliability_lines(summary) + lean_lines(summary):
        print(line, file=sys.stderr)
    for i in selection.indices:
        print(json.dumps({"id": pool[i].id, "label": pool[i].target, "text": pool[i].input[:100]}))
    return 0


def _per_query(cfg: SelectConfig, out, args: argparse.Namespace) -> int:
    """``--per-query``: a prompt per test input; prompts.jsonl holds each input's demonstrations."""
    model, tokenizer = load_model(cfg.model)
    summary, pool, test = select_per_query(cfg, model, tokenizer)
    summary["argv"] = getattr(args, "argv", None)
    if out is not None:
        atomic.write_jsonl(out / "prompts.jsonl", [{"test_id": q.id, "demonstrations": [pool[i].id for i in p]}
                                                   for q, p in zip(test, summary["prompts"], strict=True)])
        atomic.write_json(out / "summary.json", summary)
        atomic.write_json(out / "select_config.json", {**asdict(cfg), "argv": summary["argv"]})
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"{summary['method']}: test accuracy {summary['test_accuracy']:.3f} with k={cfg.k} on {len(test)} inputs, "
          f"a prompt each ({(summary['flops'] + summary['answer_flops']) / 1e12:.3g} TFLOP with the answers)"
          + (f"; written to {out}" if out else ""), file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("select", help="choose k demonstrations from a task's pool (Algorithm 2 and baselines)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = SelectConfig()
    add_target(p, model=d.model, task=d.task, k=d.k)
    p.add_argument("--method", default=d.method, help="a registered selector: " + ", ".join(SELECTORS))
    p.add_argument("--compressor", default=d.compressor, help="compressor directory (affinity, compressed evaluator)")
    p.add_argument("--evaluator", default=d.evaluator, choices=EVALUATORS, help="how affinity scores a subset")
    p.add_argument("--estimator", default=d.estimator, choices=ESTIMATORS,
                   help="mean: the paper's mean over containing subsets; ridge: a datamodel fitted to the losses")
    p.add_argument("--subsets", type=int, default=d.subsets, help="subsets M (default: n / (k eps^2))")
    p.add_argument("--eps", type=float, default=d.eps, help="target standard error that sets the default M")
    p.add_argument("--coverage", type=int, default=d.coverage, help="minimum subsets containing each candidate")
    p.add_argument("--adaptive", type=float, default=d.adaptive,
                   help="fraction of M spent on a second round near the top-k boundary")
    add_budget_flags(p, d)
    p.add_argument("--test-size", type=int, default=d.test_size, help="test examples scored (default: all)")
    p.add_argument("--test-orders", type=int, default=d.test_orders,
                   help="further random orders of the chosen set scored on the test split (order-averaged accuracy)")
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
    add_recipe_flag(p)
    p.add_argument("--per-query", action="store_true",
                   help="bm25, topk: retrieve k demonstrations for each test input (its own prompt), as the paper "
                        "and OpenICL do, instead of one set for the task")
    p.add_argument("--per-label", action="store_true",
                   help="share the k places out evenly over the pool's labels, each filled with its best-scored "
                        "candidates (any method; classification tasks with at most k labels)")
    p.add_argument("--stratify", action="store_true",
                   help="affinity: draw every subset with the pool's labels in even shares, each label from its own "
                        "balanced stream, and choose the k with the same shares (implies --per-label)")
    p.add_argument("--calibrate", default=d.calibrate, choices=CALIBRATE,
                   help="the chosen prompt's label-score calibration, saved in selection.json for icl-ssm answer: "
                        "batch (the mean label log-probability over the validation inputs read), search (--method "
                        "search: every prompt scored raw and batch-calibrated, the better pair kept) or none")
    p.add_argument("--order", default=d.order, choices=ORDERS,
                   help="prompt order of the chosen demonstrations: score (the paper's, best last), interleave "
                        "(each label spread evenly, better ones later), random, or search (the candidate order "
                        "with the lowest dense validation loss)")
    p.add_argument("--order-candidates", type=int, default=d.order_candidates,
                   help="--order search: score, interleave and this many minus two random orders")
    add_search_flags(p, d, SCREENS)
    p.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    p.add_argument("--out", help="directory for selected.jsonl, prompt.txt, summary.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=_main)

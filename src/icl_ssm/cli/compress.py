"""``icl-ssm compress``: parse the flags into a
:class:`~icl_ssm.compress.side_by_side.SideBySideConfig`, load the model, answer a query from
the compressed cache and, beside it, from the dense prompt
(:func:`~icl_ssm.compress.side_by_side.side_by_side`), and print the two side by side."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from icl_ssm.cli.options import add_target, task_options
from icl_ssm.compress.side_by_side import SideBySideConfig, side_by_side
from icl_ssm.lm.models import load_model


def _main(args: argparse.Namespace) -> int:
    cfg = SideBySideConfig(**{f.name: getattr(args, f.name) for f in fields(SideBySideConfig) if hasattr(args, f.name)})
    cfg.validate()
    model, tokenizer = load_model(cfg.model)
    if cfg.demos is None or cfg.task:  # the task is loaded by name: its -o / --skip-empty apply
        cfg.task_options = task_options(args)
    result = side_by_side(cfg, model, tokenizer)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['model']} - {result['task']} - {result['mode']} cache", show_header=False)
    for key, value in result.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console().print(table)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = SideBySideConfig()
    p = sub.add_parser(
        "compress",
        help="answer a query from a compressed cache and from the dense prompt, side by side",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_target(p, model=d.model, task=d.task, k=d.k,
               task_help="take demonstrations from this task's pool (or format --demos with it)",
               k_help="demonstrations drawn from --task's pool")
    p.add_argument("--demos", help='JSONL file, one {"input": ..., "target": ...} per line')
    p.add_argument("--query", help="the query text (default with --task: its first test example)")
    p.add_argument("--compressor", help="directory of a trained compressor (default: an untrained one)")
    p.add_argument("--dense", "--exact", dest="dense", action="store_true",
                   help="put the teacher's own K/V (the dense prompt's cache) in the cache path instead")
    p.add_argument("--chat", action="store_true", help="format through the tokenizer's chat template")
    p.add_argument("--memory", action="store_true",
                   help="also measure peak memory of each path (fresh subprocesses: slower)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_main)

"""``icl-ssm distill``: every :class:`~icl_ssm.distill.config.DistillConfig` field is a flag; a
flag not given takes its value from ``--recipe`` (``measured``, the default; ``paper``: the
paper's settings). Runs as-is in one process and under ``accelerate launch -m icl_ssm distill``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from icl_ssm.cli.options import add_task_option_flags, task_options
from icl_ssm.distill.config import FIELD_HELP, RECIPES, DistillConfig
from icl_ssm.distill.run import fill_teacher_cache, train_compressor
from icl_ssm.distill.train import TrainingDiverged


def config_from_args(args: argparse.Namespace) -> DistillConfig:
    """The run ``icl-ssm distill`` was asked for: ``--recipe``'s values under the flags given."""
    given = {f.name: getattr(args, f.name) for f in fields(DistillConfig) if hasattr(args, f.name)}
    cfg = DistillConfig.recipe(getattr(args, "recipe", "measured"), **given)
    options = task_options(args)
    if options:  # -o / --skip-empty apply to every --task
        cfg.task_options = {name: dict(options) for name in cfg.tasks}
    return cfg


def run_distill(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.teacher_only:
        fill_teacher_cache(cfg, args.teacher_cache)
        return 0
    if not args.out:
        raise ValueError("--out is required: the directory for the compressor (or pass --teacher-only)")
    try:
        train_compressor(cfg, args.out, resume=args.resume, teacher_cache=args.teacher_cache,
                         stop_after=args.stop_after)
    except TrainingDiverged as err:
        print(f"icl-ssm distill: {err}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="distil an SSM compressor from the teacher (Algorithm 1)")
    p.add_argument("--recipe", choices=list(RECIPES), default="measured",
                   help="the values of the flags not given: measured (the best recipe measured, BENCHMARKS.md) "
                        "or paper (the paper's settings) (default: measured)")
    measured, paper = DistillConfig(), DistillConfig.recipe("paper")
    for f in fields(DistillConfig):
        if f.name == "task_options":  # -o KEY=VALUE and --skip-empty below
            continue
        flag = "--" + ("task" if f.name == "tasks" else f.name.replace("_", "-"))
        default = getattr(measured, f.name)
        shown = " ".join(default) if f.name == "tasks" else default
        help_ = f"{FIELD_HELP[f.name]} (default: {shown}" + (
            f"; paper: {getattr(paper, f.name)})" if getattr(paper, f.name) != default else ")")
        kwargs = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_}  # not given: from --recipe
        if f.name == "tasks":
            p.add_argument(flag, nargs="+", **kwargs)
        elif isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        else:
            p.add_argument(flag, type=type(default), **kwargs)
    add_task_option_flags(p)
    p.add_argument("--out", help="directory for the compressor, its config and checkpoints (required unless "
                   "--teacher-only)")
    p.add_argument("--resume", action="store_true",
                   help="require an unfinished run in --out to continue (one with the same settings continues "
                        "without it)")
    p.add_argument("--teacher-cache", default=None,
                   help="teacher cache directory (default: keyed by settings under $ICL_SSM_CACHE/teacher)")
    p.add_argument("--teacher-only", action="store_true",
                   help="compute (or finish) the teacher cache for these settings and stop, training nothing")
    p.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)  # tests: simulate an interruption
    p.set_defaults(func=run_distill)

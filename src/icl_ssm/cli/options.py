"""Options that several subcommands share, declared once.

``add_target`` declares what a run is about (``--model``, ``--task``, ``--k``, and the task's
own options ``-o KEY=VALUE`` / ``--skip-empty``); ``task_options`` reads the task options back
into the dictionary that :func:`icl_ssm.data.tasks.get_task` takes.
"""

from __future__ import annotations

import argparse
from typing import Any

from icl_ssm.lm.models import DEFAULT_MODEL


def add_target(
    p: argparse.ArgumentParser,
    *,
    model: str = DEFAULT_MODEL,
    task: str | None = None,
    k: int = 8,
    task_help: str = "task name, or a .jsonl/.csv file of your own",
    k_help: str = "demonstrations to choose",
    task_required: bool = False,
    task_flags: bool = True,
) -> None:
    """``--model``, ``--task``, ``--k`` with the caller's defaults; with ``task_flags`` also
    ``-o/--option`` and ``--skip-empty``."""
    p.add_argument("--model", default=model, help="embedded name, hub id or local directory")
    if task_required:
        p.add_argument("--task", required=True, help=task_help)
    else:
        p.add_argument("--task", default=task, help=task_help)
    p.add_argument("--k", type=int, default=k, help=k_help)
    if task_flags:
        add_task_option_flags(p)


def add_task_option_flags(p: argparse.ArgumentParser) -> None:
    """``-o/--option KEY=VALUE`` (repeatable) and ``--skip-empty``; read them with :func:`task_options`."""
    p.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task option, repeatable (e.g. -o size=50, -o input_field=text, "
        "-o subjects=college_physics,college_biology)",
    )
    p.add_argument(
        "--skip-empty",
        action="store_true",
        help="a user file: skip rows whose text or label is empty (their lines are reported) "
        "instead of refusing the file; the same as -o skip_empty=true",
    )


def task_options(args: argparse.Namespace) -> dict[str, Any]:
    """``get_task``'s options from :func:`add_task_option_flags`' flags."""
    options = parse_options(getattr(args, "option", None) or [])
    if getattr(args, "skip_empty", False):
        options["skip_empty"] = True
    return options


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``["size=50", "label_field=y"]`` -> ``{"size": 50, "label_field": "y"}``."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {pair!r}: expected KEY=VALUE, e.g. size=50")
        options[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value
    return options


def add_budget_flags(p: argparse.ArgumentParser, defaults: Any) -> None:
    """``--queries``, ``--budget`` and ``--target-reliability`` with ``defaults``' values (a
    :class:`~icl_ssm.select.config.SelectConfig` or a run's config)."""
    p.add_argument("--queries", type=int, default=defaults.queries,
                   help="validation queries per subset (with --budget: the most it may use)")
    p.add_argument("--budget", type=float, default=defaults.budget,
                   help="minutes for each affinity run: a pilot round measures the reliability of the scores, then "
                        "queries and subsets grow toward --target-reliability within this time (instead of --subsets)")
    p.add_argument("--target-reliability", type=float, default=defaults.target_reliability,
                   help="with --budget: split-half reliability (Spearman-Brown) of the subset losses and of the "
                        "candidates' scores aimed at")


def add_search_flags(p: argparse.ArgumentParser, defaults: Any, screens: tuple[str, ...]) -> None:
    """``--search-minutes``, ``--screen``, ``--screen-queries`` and ``--confirm-queries`` of the
    prompt search (:mod:`icl_ssm.select.search`) with ``defaults``' values."""
    p.add_argument("--search-minutes", type=float, default=defaults.search_minutes,
                   help="the prompt search's wall time: screen, dense confirmation and order search together")
    p.add_argument("--screen", default=defaults.screen, choices=screens,
                   help="the search's cheap screen: compressed caches, dense ones, or none (random prompts straight "
                        "into the dense confirmation)" + ("; auto: compressed unless the fidelity verdict fails them"
                                                           if "auto" in screens else ""))
    p.add_argument("--screen-queries", type=int, default=defaults.screen_queries,
                   help="label-balanced validation queries every screened prompt is scored on")
    p.add_argument("--confirm-queries", type=int, default=defaults.confirm_queries,
                   help="validation queries of the last successive-halving rung of the dense confirmation")


def add_recipe_flag(p: argparse.ArgumentParser) -> None:
    """``--recipe measured|paper``: the selection settings of the flags not given."""
    from icl_ssm.select.config import SELECT_RECIPES

    p.add_argument("--recipe", choices=SELECT_RECIPES, default="measured",
                   help="paper: the authors' selection settings for the flags not given (--subsets 1.5 x the pool, "
                        "--queries 50)")

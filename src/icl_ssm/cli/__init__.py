"""The `icl-ssm` command line: one subcommand per stage of the pipeline.

Each subcommand lives beside the code it drives and exposes ``add_parser(subparsers)``,
which registers its options and sets ``func`` (called with the parsed namespace, returning
an exit code). This module only collects them: the stages' own, then those another installed
package adds through the ``icl_ssm.commands`` entry points (``icl-ssm bench`` and ``icl-ssm
synthetic``, from the repository's ``bench/`` package, which the installed library never imports).

Nothing in the library imports it (``tests/test_layout.py``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

from icl_ssm.data.tasks import HubUnavailableError

# module path of each subcommand, in the order of the data flow
SUBCOMMANDS = {
    "data": "icl_ssm.cli.data",
    "compress": "icl_ssm.cli.compress",
    "fidelity": "icl_ssm.cli.fidelity",
    "distill": "icl_ssm.cli.distill",
    "select": "icl_ssm.cli.select",
    "run": "icl_ssm.cli.run",
    "answer": "icl_ssm.cli.answer",
    "export": "icl_ssm.cli.export",
}
# commands another installed package adds (``[project.entry-points."icl_ssm.commands"]``, each an
# ``add_parser(subparsers)``): the benchmarks and the synthetic study of the repository's ``bench/``
PLUGINS = "icl_ssm.commands"
ELSEWHERE = {"bench": "the benchmarks behind BENCHMARKS.md", "synthetic": "the in-context regression study"}


def plugin_parsers() -> dict[str, Callable[[argparse._SubParsersAction], None]]:
    """``{command: add_parser}`` of the installed packages that add commands to ``icl-ssm``."""
    return {entry.name: entry.load() for entry in entry_points(group=PLUGINS)}


def add_missing(sub: argparse._SubParsersAction, name: str, what: str) -> None:
    """A command whose package is not installed: it parses anything and says how to install it."""

    def refuse(args: argparse.Namespace) -> int:
        print(f"icl-ssm {name}: {what} live in the package `icl-ssm-bench`, which is not installed; from a clone "
              "of the repository: pip install -e bench/ (make install installs it)", file=sys.stderr)
        return 2

    parser = sub.add_parser(name, help=f"{what} (needs `pip install -e bench/`)", add_help=False)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(func=refuse)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="icl-ssm",
        description="Demonstration selection with state space models distilled from a transformer.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    from icl_ssm import __version__

    parser.add_argument("--version", action="version", version=f"icl-ssm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in SUBCOMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    plugins = plugin_parsers()
    for add in plugins.values():
        add(sub)
    for name, what in ELSEWHERE.items():
        if name not in plugins:
            add_missing(sub, name, what)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # saved beside results so that every number names its command
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, HubUnavailableError) as err:  # bad input, no hub, full disk: no traceback
        print(f"icl-ssm {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"icl-ssm {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

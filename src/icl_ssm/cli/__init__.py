"""The `icl-ssm` command line: one subcommand per stage of the pipeline.

Each subcommand lives beside the code it drives and exposes ``add_parser(subparsers)``,
which registers its options and sets ``func`` (called with the parsed namespace, returning
an exit code). This module only collects them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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
    "bench": "icl_ssm.cli.bench",
    "synthetic": "icl_ssm.cli.synthetic",
}


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

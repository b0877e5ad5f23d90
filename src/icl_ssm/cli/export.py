"""``icl-ssm export``: a selection's demonstrations in the shape another tool loads
(:mod:`icl_ssm.apply.export`), written atomically to ``--out`` or printed."""

from __future__ import annotations

import argparse
import json
import sys

from icl_ssm import atomic
from icl_ssm.apply.export import EXPORTS, calibration_note, export_selection
from icl_ssm.select.selected import SelectedPrompt


def _main(args: argparse.Namespace) -> int:
    selected = SelectedPrompt.load(args.selection)
    data = export_selection(selected, args.to)
    note = calibration_note(selected, args.to)
    if note:
        print(f"icl-ssm export: warning: {note}", file=sys.stderr)
    if args.out:
        atomic.write_json(args.out, data, indent=2)
        print(f"icl-ssm export: {selected.k} demonstrations for {args.to} written to {args.out}", file=sys.stderr)
    else:
        print(json.dumps(data, indent=2))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a selection's demonstrations for DSPy, LangChain or a chat API",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("selection", help="the --out directory of icl-ssm select or icl-ssm run")
    p.add_argument("--to", required=True, choices=list(EXPORTS),
                   help="dspy: a saved dspy.Predict's demos; langchain: a FewShotPromptTemplate file; messages: "
                        "an OpenAI-style chat messages list")
    p.add_argument("--out", help="the JSON file to write (default: print it)")
    p.set_defaults(func=_main)

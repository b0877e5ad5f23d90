"""``icl-ssm fidelity``: parse the flags into a :class:`~icl_ssm.evaluate.fidelity.FidelityConfig`,
call :func:`~icl_ssm.evaluate.fidelity.run_fidelity`, print the report."""

from __future__ import annotations

import argparse
import json

from icl_ssm.cli.options import add_target, task_options
from icl_ssm.evaluate.answers import LOSSES
from icl_ssm.evaluate.fidelity import FidelityConfig, parse_also, run_fidelity
from icl_ssm.evaluate.paths import BASELINES


def _main(args: argparse.Namespace) -> int:
    config = FidelityConfig(
        model=args.model, task=args.task, k=args.k, compressor=args.compressor, control=args.control,
        subsets=args.subsets, queries=args.queries, query_offset=args.query_offset, seed=args.seed, loss=args.loss,
        n_window=args.n_window, also=parse_also(args.also), batch=args.batch, query_batch=args.query_batch,
        reuse_dense=args.reuse_dense, chat=args.chat, device=args.device, task_options=task_options(args),
        baselines=tuple(args.baselines),
    )  # fmt: skip
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from icl_ssm.provenance import provenance

    made_by = provenance(" ".join(["icl-ssm", *(getattr(args, "argv", None) or ["fidelity"])]))  # when it starts

    stderr = Console(stderr=True)
    with Progress(TextColumn("fidelity"), BarColumn(), MofNCompleteColumn(), TextColumn("subsets"),
                  TimeElapsedColumn(), console=stderr, transient=True) as bar:
        job = bar.add_task("subsets", total=None)

        def advance(n: int) -> None:
            bar.advance(job, n)
            if not stderr.is_terminal:  # a log file gets a line per batch instead of a live bar
                done = bar.tasks[0]
                stderr.print(f"fidelity: {int(done.completed)}/{int(done.total or 0)} subsets, "
                             f"{done.elapsed or 0:.0f} s")

        report = run_fidelity(config, on_start=lambda n: bar.update(job, total=n), progress=advance)
    report["argv"] = getattr(args, "argv", None)
    report["provenance"] = made_by
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    from rich.table import Table

    table = Table(title=f"{report['model']} - {report['task']} - k={report['k']} - fidelity", show_header=False)
    rows = [(k, v) for k, v in report.items() if k not in ("config", "argv", "also", "per_subset", "paired")]
    rows += [(f"{name}_{k}", v) for name, sub in report.get("also", {}).items() for k, v in sub.items()]
    rows += [(f"spearman {pair}", f"{d['diff']:+.3f} {d['ci95']} / {d['ci95_queries']}")
             for pair, d in report["paired"].items() if d["diff"] is not None]
    for key, value in rows:
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console().print(table)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fidelity",
        help="how closely a compressed cache reproduces the dense prompt on held-out subsets",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = FidelityConfig()
    add_target(p, model=d.model, k=d.k, task_required=True, task_help="task whose pool the subsets come from",
               k_help="demonstrations per subset")
    p.add_argument("--compressor", required=True, help="directory of a saved compressor")
    p.add_argument("--control", help="directory of a control compressor (config control=True) to report beside it")
    p.add_argument("--baselines", nargs="*", default=[], choices=BASELINES,
                   help="long-context methods measured beside the compressor at the same cache size: streaming "
                        "(sinks + the last tokens of the dense cache), lm-infinite (the same after a Lambda-masked "
                        "prefill)")
    p.add_argument("--subsets", type=int, default=30, help="held-out demonstration subsets")
    p.add_argument("--queries", type=int, default=32, help="validation queries per subset")
    p.add_argument("--query-offset", type=int, default=0,
                   help="first validation query used: another offset gives another query set on the same subsets")
    p.add_argument("--seed", type=int, default=0, help="splits and subsets")
    p.add_argument("--loss", choices=LOSSES, default="nll",
                   help="per-query loss: gold-verbaliser NLL, or cross-entropy over the label set")
    p.add_argument("--n-window", type=int, default=None,
                   help="prompt tokens the window comparator keeps (default: the compressor's num_virtual + "
                        "num_recent, the same cache size)")
    p.add_argument("--also", nargs="+", metavar="NAME=DIR",
                   help="further compressors to evaluate on the same subsets and queries (an ablation), "
                        "reported under 'also'")
    p.add_argument("--batch", type=int, default=4, help="subsets per cache batch")
    p.add_argument("--query-batch", type=int, default=16, help="(subset, query) pairs per forward")
    p.add_argument("--reuse-dense", action="store_true",
                   help="keep the dense path's answers on disk (under $ICL_SSM_CACHE/dense, 4 bytes x vocabulary "
                        "per subset and query) and reuse those of earlier runs on the same queries and model")
    p.add_argument("--chat", action="store_true", help="format through the tokenizer's chat template")
    p.add_argument("--device", default="auto", help="'auto' (the GPU when there is one), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument("--json", action="store_true", help="print only the JSON report on stdout")
    p.set_defaults(func=_main)

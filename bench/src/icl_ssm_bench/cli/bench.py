"""``icl-ssm bench``: the measurements behind BENCHMARKS.md (scan, label scores, LegS kernel) and the
selection harnesses of :mod:`icl_ssm_bench.selection`."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict

import torch

from icl_ssm.compress.cache import dense_cache
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.answers import answer_logits, pad_right
from icl_ssm.evaluate.label_trie import answer_scores
from icl_ssm.evaluate.paths import sample_subsets
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import score_labels
from icl_ssm.pipeline import RunConfig
from icl_ssm.provenance import provenance
from icl_ssm.ssm import scan as S
from icl_ssm.ssm.legs import legs_kernel, legs_kernel_slabs, legs_scan_fast
from icl_ssm_bench.scan import (
    FULL,
    QUICK,
    bench_scan,
    count_flops,
    machine,
    matmul_gflops,
    rel_error,
    summarize,
    time_call,
    time_interleaved,
    to_markdown,
)


def _print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"scan benchmark (matmul {result['matmul_gflops']:.1f} GFLOP/s)")
    for col in ("T", "N", "batch", "impl", "seconds", "x projection", "GFLOP/s", "max rel diff"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        sec = f"{r['seconds']:.4f}" + ("*" if r["extrapolated_from_T"] else "")
        table.add_row(
            str(r["T"]), str(r["N"]), str(r["batch"]), r["impl"], sec,
            f"{r['seconds'] / r['projection_seconds']:.2f}", f"{r['gflops']:.1f}",
            f"{r['max_rel_diff']:.1e}",
        )
    console = Console()
    console.print(table)
    console.print("* timed on a prefix and extrapolated linearly")
    console.print_json(data=result["targets"])


def _run_scan(args: argparse.Namespace) -> int:
    grid = QUICK if args.quick else FULL
    Ts = tuple(args.T or grid["T"])
    Ns = tuple(args.N or grid["N"])
    batches = tuple(args.batch or grid["batch"])
    for name, values in (("--T", Ts), ("--N", Ns), ("--batch", batches)):
        if any(v <= 0 for v in values):
            raise ValueError(f"{name} values must be positive integers, got {list(values)}")
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    status = None if args.json else (lambda msg: print(f"  timing {msg}", file=sys.stderr))
    t0 = time.perf_counter()
    rows = bench_scan(Ts, Ns, batches, tuple(args.impl), args.repeats, args.chunk,
                      args.paper_chunks, args.seed, progress=status)
    result = {
        "rows": [asdict(r) for r in rows],
        "matmul_gflops": matmul_gflops(),
        "targets": summarize(rows),
        "machine": machine(),
        "command": " ".join(["icl-ssm", *getattr(args, "argv", ["bench", "scan"])]),
        "provenance": provenance(" ".join(["icl-ssm", *getattr(args, "argv", ["bench", "scan"])])),
        "wall_seconds": time.perf_counter() - t0,
        "notes": "paper rows are timed on a prefix of extrapolated_from_T tokens and scaled "
        "linearly; seconds are the best of --repeats runs; projection_seconds is the bare "
        "GEMM X Bbar^T of the row's shape timed right after the row; fast rows reuse the "
        "folded weights W across calls with unchanged Bbar (seconds_rebuilding_weights: "
        "rebuilt every call, as in training).",
    }
    if args.json:
        print(json.dumps(result, indent=1))
    elif args.markdown:
        print(to_markdown(result))
    else:
        _print_table(result)
    return 0


def _run_label_scores(args: argparse.Namespace) -> int:
    """Multi-token label scoring after prefix caches: the query read once and the labels' trie
    in one forward (``label_trie.answer_scores``) against answer logits plus ``score_labels``,
    which re-reads the query for every branch (the path ``icl-ssm fidelity`` took before)."""
    import numpy as np

    from icl_ssm.lm.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    task = get_task(args.task)
    splits = split(task, seed=args.seed)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    subsets = sample_subsets(splits.pool, args.k, args.subsets, np.random.default_rng(args.seed))
    cache = dense_cache(model, *pad_right([builder.build_prefix([splits.pool[i] for i in s]) for s in subsets]))
    suffixes = [builder.build_suffix(q).input_ids for q in splits.validation[: args.queries]] * args.subsets
    rows = [r for r in range(args.subsets) for _ in range(args.queries)]
    lead = builder.answer_lead()

    def before():
        z = answer_logits(model, cache, [s + lead for s in suffixes], rows)
        return z, score_labels(model, builder, suffixes, prefix=cache.select(rows), batch_size=len(rows))

    def after():
        return answer_scores(model, builder, cache, suffixes, rows)

    flops = {name: count_flops(fn)[0] for name, fn in (("before", before), ("after", after))}
    seconds = time_interleaved((before, after), args.repeats)
    (z0, s0), (z1, s1) = before(), after()
    result = {
        "task": args.task, "k": args.k, "pairs": len(rows), "labels": len(builder.task.labels),
        "prompt_tokens": int(cache.prompt_length.float().mean()),
        "seconds_before": seconds[0], "seconds_after": seconds[1], "speedup": seconds[0] / seconds[1],
        "flops_before": flops["before"], "flops_after": flops["after"],
        "max_abs_diff_scores": float((s0 - s1).abs().max()), "max_abs_diff_logits": float((z0 - z1).abs().max()),
        "machine": machine(), "command": " ".join(["icl-ssm", *getattr(args, "argv", ["bench", "label-scores"])]),
        "provenance": provenance(" ".join(["icl-ssm", *getattr(args, "argv", ["bench", "label-scores"])])),
    }
    print(json.dumps(result, indent=1))
    return 0


def _run_legs_kernel(args: argparse.Namespace) -> int:
    """The scale-invariant LegS scan's data-independent kernel, one chunk: the reference
    builder (:func:`legs.legs_kernel`) against the slab builder the fast scan uses, then one
    training step's scan (forward and backward, a batch of prompts of distinct lengths)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    L, N, C = args.T, args.N, min(args.chunk, args.T)
    start = max(0, L // 2 - C // 2)

    def reference():
        return legs_kernel(L, N, start, start + C)

    def slabs():
        return legs_kernel_slabs(L, N, start, start + C)

    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, L, args.H, generator=gen)
    Bbar = (torch.randn(4, N, args.H, generator=gen) / math.sqrt(args.H)).requires_grad_()
    mask = torch.ones(args.batch, L, dtype=torch.bool)
    for i in range(args.batch):  # distinct lengths, as in a training batch: one kernel per length
        mask[i, L - 7 * i:] = False

    def step():
        legs_scan_fast(x, Bbar, mask, chunk=args.chunk, check_finite=False).sum().backward()

    reference(), slabs()  # warm-up
    seconds = time_interleaved((reference, slabs), args.repeats)
    scan_seconds = time_call(step, args.repeats)
    ref = reference()
    result = {
        "T": L, "N": N, "chunk": C, "batch": args.batch,
        "seconds_reference_kernel": seconds[0], "seconds_slab_kernel": seconds[1], "speedup": seconds[0] / seconds[1],
        "max_rel_diff": rel_error(slabs(), ref.permute(1, 2, 0)),
        "seconds_scan_step": scan_seconds, "kernel_chunks_per_step": args.batch * math.ceil(L / args.chunk),
        "machine": machine(), "command": " ".join(["icl-ssm", *getattr(args, "argv", ["bench", "legs-kernel"])]),
        "provenance": provenance(" ".join(["icl-ssm", *getattr(args, "argv", ["bench", "legs-kernel"])])),
    }
    print(json.dumps(result, indent=1))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="performance benchmarks (output for BENCHMARKS.md)")
    kinds = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    p = kinds.add_parser(
        "scan",
        help="time the reference, paper and fast scans against the bare projection GEMM",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--quick", action="store_true",
                   help=f"a subset that runs in under a minute: {QUICK}")
    p.add_argument("--T", type=int, nargs="+", help=f"sequence lengths (default {FULL['T']})")
    p.add_argument("--N", type=int, nargs="+", help=f"state sizes (default {FULL['N']})")
    p.add_argument("--batch", type=int, nargs="+", help=f"batch sizes (default {FULL['batch']})")
    p.add_argument("--impl", nargs="+", choices=S.IMPLS, default=list(S.IMPLS))
    p.add_argument("--repeats", type=int, default=5, help="timed runs per row (best is kept)")
    p.add_argument("--chunk", type=int, default=64, help="chunk of the paper's scan (fast plans its own)")
    p.add_argument("--paper-chunks", type=int, default=2,
                   help="chunks of the paper implementation actually timed")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run_scan)
    p = kinds.add_parser(
        "label-scores",
        help="multi-token label scoring after a prefix cache: query read once + label trie vs score_labels",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="modular_addition", help="a classification task with multi-token labels")
    p.add_argument("--k", type=int, default=20, help="demonstrations per subset")
    p.add_argument("--subsets", type=int, default=2, help="prefix cache rows")
    p.add_argument("--queries", type=int, default=8, help="validation queries after each row")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (best is kept)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run_label_scores)
    p = kinds.add_parser(
        "legs-kernel",
        help="the scale-invariant LegS kernel: reference builder vs the slab builder, and one scan training step",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--T", type=int, default=1700, help="prompt tokens (k = 50 on Rotten Tomatoes: about 1700)")
    p.add_argument("--N", type=int, default=256, help="state size")
    p.add_argument("--H", type=int, default=576, help="embedding size")
    p.add_argument("--chunk", type=int, default=256, help="tokens per kernel chunk")
    p.add_argument("--batch", type=int, default=4, help="prompts in the scan step")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (best is kept)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run_legs_kernel)
    p = kinds.add_parser(
        "legendre",
        help="the Legendre spectrum of the dense KV cache per layer group (the paper's figure 2): JSON and PNG",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=RunConfig.model)
    p.add_argument("--task", default="rotten_tomatoes")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--prompts", type=int, default=4, help="random k-shot prompts averaged")
    p.add_argument("--degrees", type=int, default=256, help="Legendre coefficients (the SSM's state size)")
    p.add_argument("--groups", type=int, default=4, help="layer groups")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="directory for spectrum.json and spectrum.png")
    p.set_defaults(func=_run_legendre)
    p = kinds.add_parser(
        "long-context",
        help="the compressed cache against StreamingLLM, LM-Infinite, the window (and a control) per task and k: "
             "error, KL, accuracy, subset-loss Spearman, FLOPs and cache size; JSON, markdown and PNG",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=RunConfig.model)
    p.add_argument("--tasks", nargs="+", default=["rotten_tomatoes"])
    p.add_argument("--k", type=int, nargs="+", default=[50, 75], help="shot counts")
    p.add_argument("--compressor", nargs="*", default=[], metavar="TASK=DIR",
                   help="a compressor per task (default: the one shipped for the task, trained nearest k)")
    p.add_argument("--control", nargs="*", default=[], metavar="TASK=DIR", help="its control, per task")
    p.add_argument("--subsets", type=int, default=20, help="held-out subsets per (task, k)")
    p.add_argument("--queries", type=int, default=16, help="validation queries per subset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="directory: one report per (task, k), long_context.{json,md,png}")
    p.set_defaults(func=_run_long_context)
    p = kinds.add_parser(
        "length",
        help="one compressor at growing k (the paper's length generalisation): error against the dense prompt "
             "while it fits the context, seconds and FLOPs of both paths; JSON, markdown and PNG",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=RunConfig.model)
    p.add_argument("--task", default="rotten_tomatoes")
    p.add_argument("--compressor", default=None,
                   help="compressor directory (default: the one shipped for the task, trained nearest 50)")
    p.add_argument("--k", type=int, nargs="+", default=[50, 100, 150, 250, 400, 1000], help="shot counts")
    p.add_argument("--subsets", type=int, default=3, help="random k-subsets per shot count")
    p.add_argument("--queries", type=int, default=8, help="validation queries per subset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="directory for length.json, length.md and length.png")
    p.set_defaults(func=_run_length)
    p = kinds.add_parser(
        "trust",
        help="run with default settings over tasks and seeds: the handed-over prompt against random prompts",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--tasks", nargs="+", default=["rotten_tomatoes", "cr", "coin_flip"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--random", type=int, default=16,
                   help="plain random prompts, and as many label-balanced ones, scored on each test split")
    p.add_argument("--out", default="runs/trust", help="one run directory per task and seed, trust.json, trust.md")
    p.add_argument("--records", default=None,
                   help="directory for one JSON record per run (default OUT/records; published runs: docs/results/...)")
    p.add_argument("--test-size", type=int, default=RunConfig.test_size, help="test examples per run")
    p.add_argument("--model", default=RunConfig.model)
    p.add_argument("--k", type=int, default=RunConfig.k)
    p.set_defaults(func=_run_trust)
    p = kinds.add_parser(
        "search",
        help="the prompt search at equal wall time: compressed, control, dense or no screen before the dense confirm",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--tasks", nargs="+", default=["rotten_tomatoes", "cr"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budgets", type=float, nargs="+", default=[2.0, 6.0], help="minutes per search")
    p.add_argument("--arms", nargs="+", default=["compressed", "control", "none", "dense"])
    p.add_argument("--test-size", type=int, default=400)
    p.add_argument("--model", default=RunConfig.model)
    p.add_argument("--k", type=int, default=RunConfig.k)
    p.add_argument("--compressor", nargs="*", default=[], metavar="TASK=DIR",
                   help="the compressed arm's compressor per task (default: the one shipped for the task and k)")
    p.add_argument("--control", nargs="*", default=[], metavar="TASK=DIR",
                   help="the control arm's compressor per task (default: the one shipped for the task and k)")
    p.add_argument("--out", default="runs/search", help="runs.jsonl (a line per finished run), search.json, search.md")
    p.set_defaults(func=_run_search)
    p = kinds.add_parser(
        "calibrate",
        help="calibrate, then select? raw search, calibrated search and calibrated random / retrieval / zero-shot "
             "prompts at their own wall time, under a rule fixed before the runs",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--tasks", nargs="+", default=["rotten_tomatoes", "cr"])
    p.add_argument("--seeds", type=int, nargs="+", default=[20, 21, 22])
    p.add_argument("--budgets", type=float, nargs="+", default=[0.5, 2.0], help="minutes per search arm")
    p.add_argument("--arms", nargs="+", default=None, help="default: all")
    p.add_argument("--test-size", type=int, default=400)
    p.add_argument("--model", default=RunConfig.model)
    p.add_argument("--k", type=int, default=RunConfig.k)
    p.add_argument("--out", default="runs/calibrate",
                   help="runs.jsonl (a line per finished run), calibrate.json, calibrate.md")
    p.set_defaults(func=_run_calibrate)
    from icl_ssm_bench.cli.answer import add_parser as add_answer

    add_answer(kinds)
    from icl_ssm_bench.cli.bench_select import add_kinds

    add_kinds(kinds)


def _run_legendre(args: argparse.Namespace) -> int:
    from icl_ssm import atomic
    from icl_ssm_bench.spectrum import plot_spectrum, run_spectrum

    result = run_spectrum(args.model, args.task, args.k, args.prompts, args.degrees, args.seed, args.groups)
    result["provenance"] = provenance(" ".join(["icl-ssm", *getattr(args, "argv", ["bench", "legendre"])]))
    out = atomic.prepare_dir(args.out)
    atomic.write_json(out / "spectrum.json", result)
    plot_spectrum(result, out / "spectrum.png")
    for g in result["groups"]:
        at = {n: (g["keys"][n - 1], g["values"][n - 1]) for n in (4, 16, 64, 256) if n <= len(g["keys"])}
        print(f"layers {g['layers'][0]}-{g['layers'][-1]}: " + ", ".join(
            f"{n} coefficients keep {kv[0]:.1%} of the keys, {kv[1]:.1%} of the values" for n, kv in at.items()))
    return 0


def _run_long_context(args: argparse.Namespace) -> int:
    from icl_ssm.evaluate.fidelity import FidelityConfig, parse_also
    from icl_ssm_bench.long_context import run_long_context

    base = FidelityConfig(model=args.model, subsets=args.subsets, queries=args.queries, seed=args.seed)
    table = run_long_context(args.tasks, args.k, args.out, base=base,
                             compressors=parse_also(args.compressor, "--compressor"),
                             controls=parse_also(args.control, "--control"),
                             say=lambda line: print(line, file=sys.stderr))
    print(json.dumps({"out": args.out, "results": len(table["results"])}))
    return 0


def _run_length(args: argparse.Namespace) -> int:
    from icl_ssm import atomic
    from icl_ssm.compress.pretrained import find_pretrained
    from icl_ssm_bench.length import length_markdown, plot_length, run_length

    compressor = args.compressor
    if compressor is None:
        shipped = find_pretrained(args.model, args.task, 50)
        if shipped is None:
            raise ValueError(f"no compressor is shipped for --model {args.model} and --task {args.task}; "
                             "give one with --compressor DIR")
        compressor = str(shipped / "compressor")
    if args.subsets < 1 or args.queries < 1:
        raise ValueError(f"--subsets {args.subsets} / --queries {args.queries}: expected >= 1")
    atomic.prepare_dir(args.out)  # a bad --out is refused before the minutes of the run
    result = run_length(args.model, args.task, compressor, args.k, subsets=args.subsets, queries=args.queries,
                        seed=args.seed, say=lambda line: print(line, file=sys.stderr))
    print(atomic.write_result(args.out, "length", result, length_markdown, plot_length))
    return 0


def _run_search(args: argparse.Namespace) -> int:
    from icl_ssm.evaluate.fidelity import parse_also
    from icl_ssm.pipeline import say
    from icl_ssm_bench.search import arm_compressors, run_search_bench

    compressors = arm_compressors(args.tasks, parse_also(args.compressor, "--compressor"),
                                  parse_also(args.control, "--control"))
    result = run_search_bench(args.tasks, args.seeds, args.budgets, args.out, model_name=args.model, k=args.k,
                              arms=args.arms, test_size=args.test_size, compressors=compressors, say=say)
    print(json.dumps(result["summary"]["decision"]))
    return 0


def _run_calibrate(args: argparse.Namespace) -> int:
    from icl_ssm.pipeline import say
    from icl_ssm_bench.calibrate_equal_time import ARMS, run_calibrate_bench

    argv = getattr(args, "argv", None) or ["bench", "calibrate"]
    result = run_calibrate_bench(args.tasks, args.seeds, args.budgets, args.out, model_name=args.model, k=args.k,
                                 arms=args.arms or ARMS, test_size=args.test_size, say=say,
                                 command=" ".join(["icl-ssm", *argv]))
    print(json.dumps(result["summary"]["decision"]))
    return 0


def _run_trust(args: argparse.Namespace) -> int:
    from icl_ssm.pipeline import say
    from icl_ssm_bench.trust import run_trust

    result = run_trust(args.tasks, args.seeds, args.out, random=args.random, records=args.records,
                       base=RunConfig(model=args.model, k=args.k, test_size=args.test_size), say=say)
    print(json.dumps(result["summary"]))
    return 0

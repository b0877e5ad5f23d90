"""``icl-ssm bench``: performance measurements whose output goes into BENCHMARKS.md.

``icl-ssm bench scan`` times the three scan implementations against the floor every final
state must pay, the bare projection GEMM ``X Bbar^T`` of the same shape, measured in the
same run (machines are shared and noisy: compare ratios taken together, not seconds taken
apart). FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` on one untimed call of
every row (for ``fast``, after a warm-up that computes the cached powers).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from icl_ssm import hippo
from icl_ssm import scan as S

FULL = {"T": (1024, 4096, 16384), "N": (64, 256, 512), "batch": (1, 8)}
QUICK = {"T": (1024, 4096), "N": (64, 512), "batch": (1, 8)}
H = 576  # SmolLM2-135M's hidden size


@dataclass
class ScanRow:
    T: int
    N: int
    H: int
    batch: int
    impl: str
    seconds: float
    gflops: float  # achieved: counted FLOPs / seconds
    max_rel_diff: float  # max |impl - reference| / max |reference|, same dtype
    projection_seconds: float  # the bare GEMM X Bbar^T of this shape, same run
    flops: int  # counted by FlopCounterMode
    extrapolated_from_T: int | None = None  # paper rows: timed on a prefix of this length
    # fast rows: the folded input weights W (derived from Bbar and the frozen powers) are
    # reused across calls with the same weights; this is the time when they are rebuilt
    # every call, as in training
    seconds_rebuilding_weights: float | None = None


def _time(fn: Callable[[], object], repeats: int) -> float:
    """Best of ``repeats`` wall-clock runs (after the caller's warm-up)."""
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _time_interleaved(fns: tuple[Callable[[], object], ...], repeats: int) -> list[float]:
    """Best of ``repeats`` rounds for each function, the functions taking turns each round."""
    best = [math.inf] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def _count_flops(fn: Callable[[], object]) -> tuple[int, object]:
    with FlopCounterMode(display=False) as counter:
        out = fn()
    return counter.get_total_flops(), out


def matmul_gflops(n: int = 2048, repeats: int = 3) -> float:
    """This machine's float32 GEMM throughput on an n x n x n product."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    return 2 * n**3 / _time(lambda: a @ b, repeats) / 1e9


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def bench_scan(
    Ts=FULL["T"],
    Ns=FULL["N"],
    batches=FULL["batch"],
    impls=S.IMPLS,
    repeats: int = 5,
    chunk: int = 64,
    paper_chunks: int = 2,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[ScanRow]:
    """Time every (T, N, batch, impl). The ``paper`` implementation is timed on its first
    ``paper_chunks`` chunks and extrapolated linearly (its cost per chunk is constant)."""
    gen = torch.Generator().manual_seed(seed)
    rows: list[ScanRow] = []
    for N in Ns:
        A, B = hippo.transition("legs", N)
        for T in Ts:
            # dt = 4/T: the state remembers the whole prompt (dt = 1 forgets all but ~5 tokens)
            Abar = hippo.discretize(A, B, 4.0 / T, "bilinear")[0].float()
            cache = S.PowerCache(Abar)
            for batch in batches:
                x = torch.randn(batch, T, H, generator=gen)
                Bbar = torch.randn(N, H, generator=gen) / math.sqrt(H)
                xf = x.reshape(batch * T, H)
                proj = lambda xf=xf, Bbar=Bbar: xf @ Bbar.T  # noqa: E731
                proj()
                ref_out = None
                for impl in impls:
                    if progress:
                        progress(f"T={T} N={N} batch={batch} {impl}")
                    prefix_T = None
                    if impl == "reference":
                        fn = lambda x=x, Bbar=Bbar: S.scan_reference(x, Bbar, Abar)  # noqa: E731
                        reps = 1 if batch * T * N >= 8 * 4096 * 512 else repeats
                    elif impl == "fast":
                        fn = lambda x=x, Bbar=Bbar: S.scan_fast(x, Bbar, cache)  # noqa: E731
                        reps = repeats
                    else:
                        n_chunks = min(paper_chunks, math.ceil(T / chunk))
                        prefix_T = n_chunks * chunk
                        xp = x[:, : min(prefix_T, T)]
                        fn = lambda xp=xp, Bbar=Bbar: S.scan_paper(xp, Bbar, Abar, chunk=chunk)  # noqa: E731
                        reps = 1
                    if impl == "fast":
                        fn()  # warm-up: one-time frozen powers are not a per-call cost
                    flops, out = _count_flops(fn)
                    rebuild = None
                    if impl == "fast":  # interleaved with the floor, so drift hits both alike
                        cold = lambda x=x, Bbar=Bbar: S.scan_fast(x, Bbar.clone(), cache)  # noqa: E731
                        seconds, projection_seconds, rebuild = _time_interleaved((fn, proj, cold), reps)
                    else:
                        seconds = _time(fn, reps)
                        projection_seconds = _time(proj, repeats)  # the floor, next to the row
                    if impl == "reference":
                        ref_out = out
                    if impl == "paper":
                        scale = T / min(prefix_T, T)
                        seconds, flops = seconds * scale, int(flops * scale)
                        check = S.scan_fast(xp, Bbar, cache)
                        diff = _rel(out, check)
                    else:
                        diff = 0.0 if ref_out is None or impl == "reference" else _rel(out, ref_out)
                    rows.append(
                        ScanRow(
                            T=T, N=N, H=H, batch=batch, impl=impl, seconds=seconds,
                            gflops=flops / seconds / 1e9, max_rel_diff=diff,
                            projection_seconds=projection_seconds, flops=flops,
                            extrapolated_from_T=prefix_T if prefix_T and prefix_T < T else None,
                            seconds_rebuilding_weights=rebuild,
                        )
                    )
    return rows


def summarize(rows: list[ScanRow]) -> dict:
    """Target ratios at the largest (T, N) measured, per batch size."""
    T, N = max(r.T for r in rows), max(r.N for r in rows)
    out = {"T": T, "N": N}
    for batch in sorted({r.batch for r in rows}):
        by = {r.impl: r for r in rows if r.T == T and r.N == N and r.batch == batch}
        if "fast" not in by:
            continue
        fast = by["fast"]
        entry = {"fast_over_projection": fast.seconds / fast.projection_seconds,
                 "fast_rebuilding_weights_over_projection": fast.seconds_rebuilding_weights
                 / fast.projection_seconds}
        for other in ("reference", "paper"):
            if other in by:
                entry[f"{other}_over_fast"] = by[other].seconds / fast.seconds
        out[f"batch_{batch}"] = entry
    return out


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


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


def to_markdown(result: dict) -> str:
    """The scan benchmark as a Markdown table (for BENCHMARKS.md)."""
    lines = [
        "| T | N | batch | impl | seconds | x projection | GFLOP/s | max rel diff |",
        "|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        sec = f"{r['seconds']:.4f}" + (f" (from T={r['extrapolated_from_T']})" if r["extrapolated_from_T"] else "")
        ratio = f"{r['seconds'] / r['projection_seconds']:.2f}"
        if r.get("seconds_rebuilding_weights"):
            ratio += f" ({r['seconds_rebuilding_weights'] / r['projection_seconds']:.2f} rebuilding W)"
        lines.append(f"| {r['T']} | {r['N']} | {r['batch']} | {r['impl']} | {sec} | {ratio} | "
                     f"{r['gflops']:.1f} | {r['max_rel_diff']:.1e} |")
    return "\n".join(lines)


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
    in one forward (``fidelity.answer_scores``) against answer logits plus ``score_labels``,
    which re-reads the query for every branch (the path ``icl-ssm fidelity`` took before)."""
    import numpy as np

    from icl_ssm import cache as K
    from icl_ssm import fidelity as F
    from icl_ssm import prompts as P
    from icl_ssm import tasks as T
    from icl_ssm.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    task = T.get_task(args.task)
    splits = T.split(task, seed=args.seed)
    builder = P.PromptBuilder.for_model(model, tokenizer, task)
    subsets = F.sample_subsets(splits.pool, args.k, args.subsets, np.random.default_rng(args.seed))
    cache = K.exact_cache(model, *F.pad_right([builder.build_prefix([splits.pool[i] for i in s]) for s in subsets]))
    suffixes = [builder.build_suffix(q).input_ids for q in splits.validation[: args.queries]] * args.subsets
    rows = [r for r in range(args.subsets) for _ in range(args.queries)]
    lead = builder.answer_lead()

    def before():
        z = F.answer_logits(model, cache, [s + lead for s in suffixes], rows)
        return z, P.score_labels(model, builder, suffixes, prefix=cache.select(rows), batch_size=len(rows))

    def after():
        return F.answer_scores(model, builder, cache, suffixes, rows)

    flops = {name: _count_flops(fn)[0] for name, fn in (("before", before), ("after", after))}
    seconds = _time_interleaved((before, after), args.repeats)
    (z0, s0), (z1, s1) = before(), after()
    result = {
        "task": args.task, "k": args.k, "pairs": len(rows), "labels": len(builder.task.labels),
        "prompt_tokens": int(cache.prompt_length.float().mean()),
        "seconds_before": seconds[0], "seconds_after": seconds[1], "speedup": seconds[0] / seconds[1],
        "flops_before": flops["before"], "flops_after": flops["after"],
        "max_abs_diff_scores": float((s0 - s1).abs().max()), "max_abs_diff_logits": float((z0 - z1).abs().max()),
        "machine": machine(), "command": " ".join(["icl-ssm", *getattr(args, "argv", ["bench", "label-scores"])]),
    }
    print(json.dumps(result, indent=1))
    return 0


def _run_legs_kernel(args: argparse.Namespace) -> int:
    """The scale-invariant LegS scan's data-independent kernel, one chunk: the reference
    builder (:func:`scan.legs_kernel`) against the slab builder the fast scan uses, then one
    training step's scan (forward and backward, a batch of prompts of distinct lengths)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    L, N, C = args.T, args.N, min(args.chunk, args.T)
    start = max(0, L // 2 - C // 2)

    def reference():
        return S.legs_kernel(L, N, start, start + C)

    def slabs():
        return S.legs_kernel_slabs(L, N, start, start + C)

    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, L, args.H, generator=gen)
    Bbar = (torch.randn(4, N, args.H, generator=gen) / math.sqrt(args.H)).requires_grad_()
    mask = torch.ones(args.batch, L, dtype=torch.bool)
    for i in range(args.batch):  # distinct lengths, as in a training batch: one kernel per length
        mask[i, L - 7 * i:] = False

    def step():
        S.legs_scan_fast(x, Bbar, mask, chunk=args.chunk, check_finite=False).sum().backward()

    reference(), slabs()  # warm-up
    seconds = _time_interleaved((reference, slabs), args.repeats)
    scan_seconds = _time(step, args.repeats)
    ref = reference()
    result = {
        "T": L, "N": N, "chunk": C, "batch": args.batch,
        "seconds_reference_kernel": seconds[0], "seconds_slab_kernel": seconds[1], "speedup": seconds[0] / seconds[1],
        "max_rel_diff": _rel(slabs(), ref.permute(1, 2, 0)),
        "seconds_scan_step": scan_seconds, "kernel_chunks_per_step": args.batch * math.ceil(L / args.chunk),
        "machine": machine(), "command": " ".join(["icl-ssm", *getattr(args, "argv", ["bench", "legs-kernel"])]),
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
    from icl_ssm.bench_select import add_kinds

    add_kinds(kinds)

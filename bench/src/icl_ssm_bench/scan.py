"""``icl-ssm bench``: performance measurements whose output goes into BENCHMARKS.md.

``icl-ssm bench scan`` times the three scan implementations against the floor every final
state must pay, the bare projection GEMM ``X Bbar^T`` of the same shape, measured in the
same run (machines are shared and noisy: compare ratios taken together, not seconds taken
apart). FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` on one untimed call of
every row (for ``fast``, after a warm-up that computes the cached powers).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from icl_ssm.cost import flop_counter
from icl_ssm.ssm import hippo
from icl_ssm.ssm import scan as S
from icl_ssm.ssm.powers import PowerCache

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


def time_call(fn: Callable[[], object], repeats: int) -> float:
    """Best of ``repeats`` wall-clock runs (after the caller's warm-up)."""
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_interleaved(fns: tuple[Callable[[], object], ...], repeats: int) -> list[float]:
    """Best of ``repeats`` rounds for each function, the functions taking turns each round."""
    best = [math.inf] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def count_flops(fn: Callable[[], object]) -> tuple[int, object]:
    with flop_counter() as counter:
        out = fn()
    return counter.get_total_flops(), out


def matmul_gflops(n: int = 2048, repeats: int = 3) -> float:
    """This machine's float32 GEMM throughput on an n x n x n product."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    return 2 * n**3 / time_call(lambda: a @ b, repeats) / 1e9


def rel_error(a: torch.Tensor, ref: torch.Tensor) -> float:
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
            cache = PowerCache(Abar)
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
                    flops, out = count_flops(fn)
                    rebuild = None
                    if impl == "fast":  # interleaved with the floor, so drift hits both alike
                        cold = lambda x=x, Bbar=Bbar: S.scan_fast(x, Bbar.clone(), cache)  # noqa: E731
                        seconds, projection_seconds, rebuild = time_interleaved((fn, proj, cold), reps)
                    else:
                        seconds = time_call(fn, reps)
                        projection_seconds = time_call(proj, repeats)  # the floor, next to the row
                    if impl == "reference":
                        ref_out = out
                    if impl == "paper":
                        scale = T / min(prefix_T, T)
                        seconds, flops = seconds * scale, int(flops * scale)
                        check = S.scan_fast(xp, Bbar, cache)
                        diff = rel_error(out, check)
                    else:
                        diff = 0.0 if ref_out is None or impl == "reference" else rel_error(out, ref_out)
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

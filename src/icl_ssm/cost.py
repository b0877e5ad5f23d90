"""What a call costs: FLOPs (``torch.utils.flop_counter.FlopCounterMode``), wall seconds,
and peak memory (``torch.cuda.max_memory_allocated`` on a GPU; on the CPU the peak resident
set of a fresh subprocess, since a long-lived process's RSS high-water mark never comes down).
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_backward_flop_count, sdpa_flop_count


def _cpu_attention() -> dict:
    """Flop formulas for the CPU kernels of ``scaled_dot_product_attention``.

    ``FlopCounterMode`` registers SDPA's CUDA kernels (flash, memory-efficient, cuDNN) but not
    ``_scaled_dot_product_flash_attention_for_cpu``, so on the CPU it counts attention as zero.
    The CPU kernel gets the CUDA kernels' formula (GQA-aware, causal masks counted in full), so a
    count does not depend on the device it was taken on."""

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:  # shapes, not tensors
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    aten = torch.ops.aten
    mapping = {}
    for name, formula in (("_scaled_dot_product_flash_attention_for_cpu", forward),
                          ("_scaled_dot_product_flash_attention_for_cpu_backward", backward)):
        op = getattr(aten, name, None)
        if op is not None and op not in flop_registry:
            mapping[op] = formula
    return mapping


CPU_ATTENTION = _cpu_attention()


def flop_counter() -> FlopCounterMode:
    """A silent ``FlopCounterMode`` that also counts attention on the CPU (:data:`CPU_ATTENTION`)."""
    return FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION)


@dataclass
class Cost:
    flops: int = 0
    seconds: float = 0.0
    peak_bytes: int | None = None  # GPU only; see peak_rss for the CPU

    def __add__(self, other: Cost) -> Cost:
        peaks = [p for p in (self.peak_bytes, other.peak_bytes) if p is not None]
        return Cost(self.flops + other.flops, self.seconds + other.seconds, max(peaks) if peaks else None)

    def as_dict(self) -> dict:
        return asdict(self)


@contextmanager
def measure(device: torch.device | str | None = None, count_flops: bool = True) -> Iterator[Cost]:
    """``with measure() as cost: ...`` fills ``cost`` when the block ends.

    FLOPs count matrix multiplications and attention as ``FlopCounterMode`` does (2 per
    multiply-add), attention also on the CPU (:func:`flop_counter`); elementwise work is not
    counted.
    """
    cost = Cost()
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    counter = flop_counter() if count_flops else None
    t0 = time.perf_counter()
    try:
        if counter is not None:
            with counter:
                yield cost
        else:
            yield cost
    finally:
        if cuda:
            torch.cuda.synchronize(device)
            cost.peak_bytes = torch.cuda.max_memory_allocated(device)
        cost.seconds = time.perf_counter() - t0
        cost.flops = counter.get_total_flops() if counter is not None else 0


class ShapeFlops:
    """The FLOPs ``FlopCounterMode`` counts for a batch of ``B`` right-padded rows of length
    ``T`` (the work of the cache paths depends on those two alone), learned from a few counted
    batches so that the others need no counter: its Python dispatch costs the many small
    matrix products of a compressed cache up to half their time.

    A batch is counted (:meth:`wants`) while fewer than ``sample`` lengths are known and when
    its length lies outside the counted ones. :meth:`predict` gives the count of a counted
    ``(B, T)`` and otherwise ``B`` times the per-row FLOPs interpolated linearly in ``T``
    between the nearest counted lengths; :attr:`estimated` counts those batches. The FLOPs are
    not polynomial in ``T`` (the scan's fold splits ``T`` by its remainder), so interpolation,
    not a fitted form.
    """

    def __init__(self, sample: int = 3) -> None:
        if sample < 1:
            raise ValueError(f"sample={sample}: expected >= 1")
        self.sample = sample
        self.counted: dict[tuple[int, int], int] = {}
        self.per_row: dict[int, float] = {}  # T -> FLOPs per row
        self.estimated = 0

    def wants(self, batch: int, length: int) -> bool:
        if (batch, length) in self.counted:
            return False
        return len(self.per_row) < self.sample or not min(self.per_row) <= length <= max(self.per_row)

    def add(self, batch: int, length: int, flops: int) -> None:
        self.counted[(batch, length)] = int(flops)
        self.per_row[length] = flops / batch

    def predict(self, batch: int, length: int) -> int:
        if (batch, length) in self.counted:
            return self.counted[(batch, length)]
        if not self.per_row or not min(self.per_row) <= length <= max(self.per_row):
            raise ValueError(f"no FLOPs for B={batch}, T={length} between counted lengths "
                             f"{sorted(self.per_row)}: count this batch (wants() is True)")
        known = sorted(self.per_row)
        self.estimated += 1
        return int(round(batch * float(np.interp(length, known, [self.per_row[t] for t in known]))))


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes; None where there is none (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_bytes() -> int:
    """This process's resident set now, in bytes (0 where ``/proc`` is not there)."""
    return _status_bytes("VmRSS") or 0


def track_freed_memory() -> bool:
    """Make glibc return every allocation of 64 KiB or more to the system when it is freed
    (``mallopt(M_MMAP_THRESHOLD)``), so that the resident set follows the live tensors rather
    than what the heap keeps for reuse. For a process that measures memory, not time (every large
    allocation then maps fresh pages). False where the C library is not glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, 64 * 1024))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


@contextmanager
def rss_peak() -> Iterator[dict]:
    """``with rss_peak() as peak: ...`` fills ``peak["start_bytes"]`` (the resident set as the block
    starts) and ``peak["peak_bytes"]`` (its highest during the block), in bytes, on Linux.

    The kernel's high-water mark (``VmHWM``) is reset as the block starts (``/proc/self/clear_refs``)
    after the heap's free memory is handed back (``malloc_trim``); with :func:`track_freed_memory`
    the resident set then counts live allocations only. Raises OSError where the mark cannot be reset.
    """
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current VmRSS
    out = {"start_bytes": rss_bytes()}
    try:
        yield out
    finally:
        out["peak_bytes"] = _status_bytes("VmHWM") or 0


def _peak_rss_self() -> int:
    """This process's peak RSS in bytes. ``VmHWM`` belongs to the address space, which exec
    replaces; ``ru_maxrss`` survives exec on Linux and would report the parent's peak."""
    peak = _status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(fn: Callable, args: tuple, queue) -> None:
    try:
        result = fn(*args)
        queue.put(("ok", (_peak_rss_self(), result)))
    except BaseException as err:  # reported to the parent, which raises
        queue.put(("error", f"{type(err).__name__}: {err}"))


def _idle() -> None:
    return None


def peak_rss(fn: Callable, *args, baseline: bool = True) -> dict:
    """Peak RSS in bytes of ``fn(*args)`` run in a fresh (spawned) process, and what ``fn``
    returned (``result``; it must pickle).

    ``fn`` and ``args`` must be picklable (a module-level function). With ``baseline``, the
    peak of a process that only imports torch is subtracted as well and reported beside it.
    """
    ctx = mp.get_context("spawn")

    def run(target, target_args) -> tuple[int, object]:
        queue = ctx.Queue()
        proc = ctx.Process(target=_child, args=(target, target_args, queue))
        proc.start()
        while True:  # a child that dies without reporting (killed, out of memory) must not hang the parent
            try:
                status, value = queue.get(timeout=1.0)
                break
            except queue_module.Empty:
                if not proc.is_alive():
                    raise RuntimeError(f"peak_rss child exited with code {proc.exitcode} before reporting") from None
        proc.join()
        if status != "ok":
            raise RuntimeError(f"peak_rss child failed: {value}")
        return value

    peak, result = run(fn, args)
    out = {"peak_rss_bytes": peak, "result": result}
    if baseline:
        base, _ = run(_idle, ())
        out.update(baseline_rss_bytes=base, delta_rss_bytes=peak - base)
    return out

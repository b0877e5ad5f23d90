"""BENCHMARKS' 'State space scan': the scan benchmark's targets at T = 16384, N = 512, H = 576 and its
agreement with the reference over every shape (``icl-ssm bench scan --json``, :data:`SCAN`), and the
scale-invariant LegS kernel's slab builder against the reference (``icl-ssm bench legs-kernel``,
:data:`LEGS_KERNEL`); and the Legendre spectrum of the dense cache (:data:`LEGENDRE`). The records are read
through the adapter (``readers/scan.py``), each row rendered by the one renderer
(:func:`~claim_tables.rows.render_rows`)."""

from __future__ import annotations

from collections.abc import Callable

from icl_ssm.records import Record

from .base import BENCH, Records
from .rows import Row, render_rows, row, val

SCAN = "scan-cpu.json"
LEGS_KERNEL = "legs-kernel-cpu.json"
LEGENDRE = "legendre-k20.json"
# the targets: the fast scan's seconds over the bare GEMM's at most 1.5, its speedups at least 2.5 and 50
TARGETS = {"fast_over_projection": ("<=", 1.5), "reference_over_fast": (">=", 2.5), "paper_over_fast": (">=", 50)}


def _threads(r: Record, alias: str) -> str:
    n = r.config["sources"][alias]["threads"]
    return f"CPU, {n} thread{'s' if n > 1 else ''}"


def _goal(key: str, batches: tuple[str, ...] = ("batch_1",)) -> str:
    """The target of ``key`` and whether the record's batches meet it."""
    def verdict(r: Record) -> str:
        op, target = TARGETS[key]
        values = [r[f"scan.{b}.{key}"].value for b in batches]
        met = all(v <= target if op == "<=" else v >= target for v in values)
        return f"{op} {target}: " + ("met" if met else "not met")
    return verdict


def scan(records: Records) -> str:
    """The scan's speed targets (best of the record's repeats, one run) and its agreement with the reference."""
    link = records.link(SCAN)
    machine = {"machine": lambda r: _threads(r, "scan")}

    def batches(key: str, spec: str) -> Callable[[Record], str]:
        return lambda r: f"{val(r[f'scan.batch_1.{key}'], spec)} ({val(r[f'scan.batch_8.{key}'], spec)})"

    rows: list[Row] = [
        row(records, "fast over GEMM", {"scan": SCAN}, {"record": link}, machine | {
            "measure": lambda r: (f"fast scan / bare projection GEMM, T = {r.config['sources']['scan']['T']}, "
                                  f"N = {r.config['sources']['scan']['N']}, H = 576"),
            "command": lambda r: f"`{r.config['sources']['scan']['command']}`",
            "measured": lambda r: (f"{val(r['scan.batch_1.fast_over_projection'])} (batch 1), "
                                   f"{val(r['scan.batch_8.fast_over_projection'])} (batch 8); best of 5, one run"),
            "goal": _goal("fast_over_projection", ("batch_1", "batch_8"))}),
        row(records, "reference over fast", {"scan": SCAN}, {
            "measure": "reference / fast, same size, batch 1 (batch 8)", "command": "same", "record": link},
            machine | {"measured": batches("reference_over_fast", ".1f"), "goal": _goal("reference_over_fast")}),
        row(records, "paper over fast", {"scan": SCAN}, {
            "measure": "paper's chunked scan / fast, same size, batch 1 (batch 8)", "command": "same", "record": link},
            machine | {"measured": batches("paper_over_fast", ".0f"), "goal": _goal("paper_over_fast")}),
        row(records, "fast vs reference", {"scan": SCAN}, {
            "measure": "fast vs reference, float32", "command": "same", "goal": "agree", "record": link}, machine | {
            "measured": lambda r: (f"max rel diff <= {val(r['scan.fast.max_rel_diff'], '.1e')} over "
                                   f"{r['scan.fast.shapes'].value} shapes")}),
        row(records, "legs kernel", {"kernel": LEGS_KERNEL}, {"goal": "—", "record": records.link(LEGS_KERNEL)}, {
            "measure": lambda r: ("scale-invariant LegS kernel, slab vs reference builder (T = "
                                  f"{r.config['sources']['kernel']['T']}, N = {r.config['sources']['kernel']['N']})"),
            "command": lambda r: f"`{r.config['sources']['kernel']['command']}`",
            "machine": lambda r: _threads(r, "kernel"),
            "measured": lambda r: (f"{val(r['kernel.speedup'], '.1f')}x faster, max rel diff "
                                   f"{val(r['kernel.max_rel_diff'], '.1e')}")}),
    ]
    return render_rows(rows, BENCH)


def legendre(records: Records) -> str:
    """The share of the dense cache's energy its first n Legendre coefficients hold, per layer group."""
    def span(r: Record, kind: str, at: str) -> str:
        return f"{100 * r[f'l.{kind}.{at}_min'].value:.0f}-{100 * r[f'l.{kind}.{at}_max'].value:.0f}%"

    def measured(r: Record) -> str:
        last = r.config["sources"]["l"]["degrees"]
        return (f"keys: {span(r, 'keys', 'first')} at n = 1 (their mean), {span(r, 'keys', 'all')} at {last}; "
                f"values: {span(r, 'values', 'first')} at n = 1, {span(r, 'values', 'all')} at {last}")

    def measure(r: Record) -> str:
        c = r.config["sources"]["l"]
        return (f"energy of the dense cache held by the first n Legendre coefficients, k = {c['k']}, {c['prompts']} "
                f"prompts of {c['task']}, {c['groups']} layer groups")

    spectrum = row(records, "legendre", {"l": LEGENDRE}, {
        "goal": "the paper's figure 2", "record": f"{records.link(LEGENDRE)}, [spectrum](docs/research/legendre-"
                                                   "spectrum.md), [plot](docs/figures/legendre-spectrum-k20.png)"}, {
        "measure": measure, "measured": measured,
        "command": lambda r: f"`{r.config['sources']['l']['command']}`",
        "machine": lambda r: "CPU, " + r.config["sources"]["l"]["machine"].split(", ")[1].replace(
            " torch threads", " thread(s)")})
    return render_rows([spectrum], BENCH)

"""BENCHMARKS' 'State space scan': the scan benchmark's targets at T = 16384, N = 512, H = 576 and its
agreement with the reference over every shape (``icl-ssm bench scan --json``, :data:`SCAN`), and the
scale-invariant LegS kernel's slab builder against the reference (``icl-ssm bench legs-kernel``,
:data:`LEGS_KERNEL`)."""

from __future__ import annotations

from .base import BENCH, Records, table

SCAN = "scan-cpu.json"
LEGS_KERNEL = "legs-kernel-cpu.json"


def _threads(record: dict) -> str:
    n = record["machine"]["threads"]
    return f"CPU, {n} thread{'s' if n > 1 else ''}"


def scan(records: Records) -> str:
    """The scan's speed targets (best of the record's repeats, one run) and its agreement with the reference."""
    r = records(SCAN)
    t = r["targets"]
    b1, b8 = t["batch_1"], t["batch_8"]
    size = f"T = {t['T']}, N = {t['N']}, H = 576"
    cmd, machine, link = f"`{r['command']}`", _threads(r), records.link(SCAN)
    fast = [row for row in r["rows"] if row["impl"] == "fast"]
    worst = max(row["max_rel_diff"] for row in fast)
    repeats = "best of 5, one run"
    rows = [
        [f"fast scan / bare projection GEMM, {size}", cmd, machine,
         f"{b1['fast_over_projection']:.2f} (batch 1), {b8['fast_over_projection']:.2f} (batch 8); {repeats}",
         "<= 1.5: " + ("met" if max(b1["fast_over_projection"], b8["fast_over_projection"]) <= 1.5 else "not met"),
         link],
        ["reference / fast, same size, batch 1 (batch 8)", "same", machine,
         f"{b1['reference_over_fast']:.1f} ({b8['reference_over_fast']:.1f})",
         ">= 2.5: " + ("met" if b1["reference_over_fast"] >= 2.5 else "not met"), link],
        ["paper's chunked scan / fast, same size, batch 1 (batch 8)", "same", machine,
         f"{b1['paper_over_fast']:.0f} ({b8['paper_over_fast']:.0f})",
         ">= 50: " + ("met" if b1["paper_over_fast"] >= 50 else "not met"), link],
        ["fast vs reference, float32", "same", machine,
         f"max rel diff <= {worst:.1e} over {len(fast)} shapes", "agree", link],
    ]
    k = records(LEGS_KERNEL)
    rows.append([f"scale-invariant LegS kernel, slab vs reference builder (T = {k['T']}, N = {k['N']})",
                 f"`{k['command']}`", _threads(k),
                 f"{k['speedup']:.1f}x faster, max rel diff {k['max_rel_diff']:.1e}", "—", records.link(LEGS_KERNEL)])
    return table(BENCH, rows)


LEGENDRE = "legendre-k20.json"


def legendre(records: Records) -> str:
    """The share of the dense cache's energy its first n Legendre coefficients hold, per layer group."""
    r = records(LEGENDRE)
    groups = r["groups"]
    last = r["degrees"]

    def span(kind: str, n: int) -> str:
        shares = [g[kind][n - 1] for g in groups]
        return f"{100 * min(shares):.0f}-{100 * max(shares):.0f}%"

    return table(BENCH, [[
        f"energy of the dense cache held by the first n Legendre coefficients, k = {r['k']}, {r['prompts']} "
        f"prompts of {r['task']}, {len(groups)} layer groups", f"`{r['provenance']['command']}`",
        f"CPU, {r['provenance']['machine'].split(', ')[1].replace(' torch threads', ' thread(s)')}",
        f"keys: {span('keys', 1)} at n = 1 (their mean), {span('keys', last)} at {last}; values: "
        f"{span('values', 1)} at n = 1, {span('values', last)} at {last}", "the paper's figure 2",
        f"{records.link(LEGENDRE)}, [spectrum](docs/research/legendre-spectrum.md), "
        "[plot](docs/figures/legendre-spectrum-k20.png)"]])

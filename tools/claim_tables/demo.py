"""BENCHMARKS' 'Demo': the cold runs of today's pipeline, one row per ``demo-cold-*.json`` record that
``tools/time_demo.sh`` writes (install and demo time, the handed-over prompt's test accuracy, the search)."""

from __future__ import annotations

from .base import BENCH, Records, table


def demo(records: Records) -> str:
    """BENCHMARKS' 'Demo': the cold runs of today's pipeline (``tools/time_demo.sh`` records)."""
    runs = records.glob("demo-cold-*.json")
    rows = []
    for name, r in runs:
        search = r["search"]
        screen = "without a screen" if search["screen"] == "none" else f"with the {search['screen']} screen"
        rows.append([
            "first run from a fresh clone, empty pip and model caches, with the prompt search "
            f"({search['budget_seconds'] / 60:.0f} min) and the hand-over check on 128 examples",
            f"`tools/time_demo.sh OUT.json` (commit {r['provenance']['commit'][:7]})",
            "CPU (AMD EPYC, 2 cores), quiet",
            f"{r['total_seconds'] / 60:.1f} min: install {r['install_seconds']:.0f} s, demo "
            f"{r['demo_seconds'] / 60:.1f} min; test accuracy of the handed-over prompt ({r['handed_over']}) "
            f"{r['handed_test_accuracy']:.3f}; the verdict failed the shipped compressor, so the search ran {screen} "
            f"({search['wall_seconds']:.0f} s of its {search['budget_seconds']:.0f})",
            "<= 15 min",
            f"{records.link(name)}, [report](docs/results/{name.removesuffix('.json')}-report.md)"])
    n = len(rows)
    return table(BENCH, rows) + (f"\n\n{n} cold run{'s' if n > 1 else ''} of today's pipeline stored"
                                 + ("; a second not yet made." if n == 1 else "."))

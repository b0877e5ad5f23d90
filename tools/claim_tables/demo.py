"""BENCHMARKS' 'Demo': the cold runs of today's pipeline, one row per ``demo-cold-*.json`` record that
``tools/time_demo.sh`` writes (install and demo time, the handed-over prompt's test accuracy, the search),
and the spread of the runs made at the newest commit."""

from __future__ import annotations

from .base import BENCH, Records, table

VERDICTS = {"dense": "the verdict failed the shipped compressor, so the search ran without a screen",
            "compressed": "the verdict passed the shipped compressor"}
UNUSED = ("no method of the demo reads the shipped compressor, so its fidelity was not measured, and the search ran "
          "without a screen")


def newest_runs(records: Records) -> list[tuple[str, dict]]:
    """The cold-demo records made at the newest commit among them (file order: by date)."""
    runs = records.glob("demo-cold-*.json")
    latest = runs[-1][1]["provenance"]["commit"] if runs else None
    return [(n, r) for n, r in runs if r["provenance"]["commit"] == latest]


def demo_time(records: Records) -> str:
    """README's sentence on how long ``make demo`` takes from a fresh clone."""
    same = newest_runs(records)
    totals = [r["total_seconds"] / 60 for _, r in same]
    span = f"{totals[0]:.1f} min" if len(totals) == 1 else f"{min(totals):.1f}-{max(totals):.1f} min"
    runs = "one run" if len(same) == 1 else f"{len(same)} runs"
    return (f"From a fresh clone with empty pip and model caches it took {span} on a 2-core CPU, the install "
            f"included ({runs} of commit {same[0][1]['provenance']['commit'][:7]}, `tools/time_demo.sh`; "
            + ", ".join(records.link(n) for n, _ in same) + ").")


def demo(records: Records) -> str:
    """BENCHMARKS' 'Demo': the cold runs of today's pipeline (``tools/time_demo.sh`` records)."""
    runs = records.glob("demo-cold-*.json")
    rows = []
    for name, r in runs:
        search = r["search"]
        # records from before time_demo.sh stored the verdict: a search without a screen means it failed
        verdict = (UNUSED if r.get("compressor_source") == "unused" else
                   VERDICTS[r.get("fidelity_verdict") or ("dense" if search["screen"] in ("none", None)
                                                          else "compressed")])
        searched = search.get("budget_seconds") is not None
        what = (f"with the prompt search ({search['budget_seconds'] / 60:.0f} min)" if searched else
                "without a search (the headroom gate found none to make)")
        cal = r.get("calibration")
        handed = (f"test accuracy of the handed-over prompt ({r['handed_over']}"
                  + (f", {cal}-calibrated" if cal else "") + f") {r['handed_test_accuracy']:.3f}"
                  + (f" (raw {r['handed_raw_test_accuracy']:.3f})" if r.get("handed_raw_test_accuracy") is not None
                     else ""))
        rows.append([
            f"a run from a fresh clone, empty pip and model caches, {what} and the hand-over check on 128 examples",
            f"`tools/time_demo.sh OUT.json` (commit {r['provenance']['commit'][:7]}, {r['provenance']['date']})",
            "CPU (AMD EPYC, 2 cores), quiet",
            f"{r['total_seconds'] / 60:.1f} min: install {r['install_seconds']:.0f} s, demo "
            f"{r['demo_seconds'] / 60:.1f} min; {handed}; {verdict if searched else verdict.split(', so')[0]}"
            + (f" ({search['wall_seconds']:.0f} s of its {search['budget_seconds']:.0f})" if searched else ""),
            "<= 8 min" if r["provenance"]["date"] >= "2026-11-28" else "<= 15 min",
            f"{records.link(name)}, [report](docs/results/{name.removesuffix('.json')}-report.md)"])
    same = [r for _, r in newest_runs(records)]
    latest = same[0]["provenance"]["commit"] if same else None
    totals = [r["total_seconds"] / 60 for r in same]
    if len(same) > 1:
        spread = (f"\n\n{len(same)} cold runs at commit {latest[:7]}: {min(totals):.1f}-{max(totals):.1f} min "
                  f"from a fresh clone, the install included (spread {60 * (max(totals) - min(totals)):.0f} s).")
    else:
        spread = (f"\n\n{len(runs)} cold run{'s' if len(runs) != 1 else ''} stored; a second at the same commit "
                  "not yet made.")
    return table(BENCH, rows) + spread

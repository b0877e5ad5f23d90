"""BENCHMARKS' 'Demo': the cold runs of today's pipeline, one row per ``demo-cold-*.json`` record that
``tools/time_demo.sh`` writes (install and demo time, the handed-over prompt's test accuracy, the search),
and the spread of the runs made at the newest commit; README's sentence on how long ``make demo`` takes; and
whether the library's restructuring changed what the demo selects (two cold runs, before and after).
Each run is read through the one adapter (``readers/demo.py``) and the table rendered by the one renderer."""

from __future__ import annotations

from icl_ssm.records import Record

from .adapt import as_record, read
from .base import Records
from .readers.demo import newest_runs, same_selection
from .render import Column, render

VERDICTS = {"dense": "the verdict failed the shipped compressor, so the search ran without a screen",
            "compressed": "the verdict passed the shipped compressor",
            "unused": "no method of the demo reads the shipped compressor, so its fidelity was not measured, and the "
                      "search ran without a screen"}


def cold_runs(records: Records) -> list[Record]:
    """Every stored cold run, in file order (by date)."""
    return [as_record(name, raw) for name, raw in records.glob("demo-cold-*.json")]


def demo_time(records: Records) -> str:
    """README's sentence on how long ``make demo`` takes from a fresh clone."""
    same = newest_runs(cold_runs(records))
    low, high = same["total_low"].value, same["total_high"].value
    span = f"{low:.1f} min" if same["runs"].value == 1 else f"{low:.1f}-{high:.1f} min"
    runs = "one run" if same["runs"].value == 1 else f"{same['runs'].value} runs"
    return (f"From a fresh clone with empty pip and model caches it took {span} on a 2-core CPU, the install "
            f"included ({runs} of commit {same.config['commit'][:7]}, `tools/time_demo.sh`; "
            + ", ".join(records.link(n) for n in same.config["names"]) + ").")


def searched(r: Record) -> bool:
    return r["search_budget_seconds"].value is not None


def _measure(r: Record) -> str:
    what = (f"with the prompt search ({r['search_budget_seconds'].value / 60:.0f} min)" if searched(r) else
            "without a search (the headroom gate found none to make)")
    return f"a run from a fresh clone, empty pip and model caches, {what} and the hand-over check on 128 examples"


def _measured(r: Record) -> str:
    """The run's times, the handed-over prompt's test accuracy, what the fidelity verdict did to the search."""
    cal, raw = r.config["calibration"], r["handed_raw"].value
    handed = (f"test accuracy of the handed-over prompt ({r.config['handed_over']}"
              + (f", {cal}-calibrated" if cal else "") + f") {r['handed'].value:.3f}"
              + (f" (raw {raw:.3f})" if raw is not None else ""))
    verdict = VERDICTS[r.config["verdict"]]
    return (f"{r['total_seconds'].value / 60:.1f} min: install {r['install_seconds'].value:.0f} s, demo "
            f"{r['demo_seconds'].value / 60:.1f} min; {handed}; {verdict if searched(r) else verdict.split(', so')[0]}"
            + (f" ({r['search_wall_seconds'].value:.0f} s of its {r['search_budget_seconds'].value:.0f})"
               if searched(r) else ""))


COLUMNS = [
    Column("measure", cell=_measure),
    Column("command", cell=lambda r: f"`tools/time_demo.sh OUT.json` (commit {r.config['commit'][:7]}, "
                                     f"{r.config['date']})"),
    Column("machine", cell=lambda r: "CPU (AMD EPYC, 2 cores), quiet"),
    Column("measured", cell=_measured),
    Column("goal", cell=lambda r: "<= 8 min" if r.config["date"] >= "2026-11-28" else "<= 15 min"),
    Column("record", cell=lambda r: f"[record](docs/results/{r.name}), "
                                    f"[report](docs/results/{r.name.removesuffix('.json')}-report.md)"),
]


def demo(records: Records) -> str:
    """BENCHMARKS' 'Demo': the cold runs of today's pipeline (``tools/time_demo.sh`` records)."""
    runs = cold_runs(records)
    same = newest_runs(runs)
    n = same["runs"].value
    if n > 1:
        spread = (f"\n\n{n} cold runs at commit {same.config['commit'][:7]}: {same['total_low'].value:.1f}-"
                  f"{same['total_high'].value:.1f} min from a fresh clone, the install included (spread "
                  f"{same['spread_seconds'].value:.0f} s).")
    else:
        spread = (f"\n\n{len(runs)} cold run{'s' if len(runs) != 1 else ''} stored; a second at the same commit "
                  "not yet made.")
    return render(runs, COLUMNS) + spread


# two cold runs of make demo: at cf9f695 (before the benchmarks left the library, the first step of the
# restructuring into the package that is the method) and at 67a49a0 (after its cache builders, record schema and
# the one place a forward after a prefix gets its inputs), on the same quiet machine
SAME_SELECTION = ("demo-cold-2026-11-28-d.json", "demo-cold-2026-11-28-e.json")


def _same(r: Record) -> str:
    return "same" if r["same"].value == 1 else "**differs**"


def demo_same_selection(records: Records) -> str:
    """Each method's prompt in the two runs of :data:`SAME_SELECTION`: the same pool indices in the same order,
    or not."""
    before, after = (read(records, n) for n in SAME_SELECTION)
    pair = same_selection(before, after)
    rows = [pair.part(m) for m in pair.config["methods"]]
    columns = [Column("method", cell=lambda r: "handed over" if r.config["part"] == "handed" else r.config["part"]),
               Column("demonstrations", "size", fmt="int"),
               Column(f"commit {pair.config['before'][:7]} vs {pair.config['after'][:7]}", cell=_same)]
    differ = [r.config["part"] for r in rows if r["same"].value != 1]
    verdict = "every method chose the same prompt, in the same order" if not differ else (
        f"{', '.join(differ)} chose differently")
    return (render(rows, columns) + "\n\n`make demo` from a fresh clone at each commit "
            "(`REV=... tools/time_demo.sh`), nothing else running: " + verdict
            + ". The search is time-budgeted, so the same choice also rests on the two runs' speed: "
            f"{before['search_wall_seconds'].value:.0f} s and {after['search_wall_seconds'].value:.0f} s of its "
            f"{after['search_budget_seconds'].value:.0f} s. {records.link(SAME_SELECTION[0])}, "
            f"{records.link(SAME_SELECTION[1])}.")

"""BENCHMARKS' 'Calibrate, then select: the trust evaluation': the pre-registered runs of ``bench trust`` with
``run``'s calibrated defaults (``docs/results/trust-calibrated/*.json``), run by run, and the three targets.

The rule, fixed before any of these records was read:

- **Never shown worse.** In no run is the handed-over prompt (as handed over, its calibration applied) shown
  worse than the median batch-calibrated plain random prompt (the 9th of 16 by test accuracy; ``calibrated_plain``)
  or than calibrated zero-shot: the upper end of the paired 95% bootstrap interval over the test examples below 0.
- **The gain.** On rotten_tomatoes and cr, the handed-over prompt's mean test accuracy minus the median of the 16
  *raw* plain random prompts' (``plain``), averaged over the runs, is at least +12 points.
- **Where selection can add.** Among the runs whose own headroom measurement chose to search (``headroom.search``),
  the handed-over prompt is at or above 12 of the 16 calibrated plain random prompts (correct test answers, a tie
  counting as at) in at least 70% of them.

Each run's provenance is read per stage: a run whose stages or test scoring ran from other
commits or thread counts is named (:func:`~icl_ssm.provenance.record_made_by`).
"""

from __future__ import annotations

import statistics

from icl_ssm.provenance import made_by_summary
from icl_ssm.records import Record

from .adapt import as_record
from .base import Records
from .render import Column, render

FOLDER = "trust-calibrated"
PLANNED = 15  # rotten_tomatoes, cr, coin_flip x seeds 15-19
PLANNED_RT_CR = 10
GAIN_TARGET = 0.12
SHARE_TARGET = 0.70
AT_OR_ABOVE = 12  # of 16
COMMAND = ("`icl-ssm bench trust --tasks rotten_tomatoes cr coin_flip --seeds 15 16 17 18 19 --test-size 400 "
           "--records docs/results/trust-calibrated`")


def shown_worse(vs: dict | None) -> bool:
    return bool(vs and vs.get("ci95") and vs["ci95"][1] < 0)


def at_or_above(run: dict, kind: str) -> int | None:
    """How many of the run's ``kind`` random prompts the handed-over prompt is at or above, in correct
    test answers (a tie is at)."""
    rows = run.get("prompts_on_test") or {}
    prefix = {"calibrated_plain": "calibrated plain-", "calibrated_balanced": "calibrated balanced-",
              "plain": "plain-", "balanced": "balanced-"}[kind]
    mine = sum(rows["handed-over"]["correct"]) if "handed-over" in rows else None
    others = [sum(row["correct"]) for name, row in rows.items() if name.startswith(prefix)]
    return None if mine is None or not others else sum(mine >= c for c in others)


def searched(run: dict) -> bool:
    return bool((run.get("headroom") or {}).get("search"))


def evaluate(runs: list[dict]) -> dict:
    """The three targets over the stored runs."""
    worse = [r for r in runs if shown_worse((r.get("calibrated_plain") or {}).get("vs_median_prompt"))
             or shown_worse(r.get("vs_calibrated_zero_shot"))]
    rt_cr = [r for r in runs if r["task"] in ("rotten_tomatoes", "cr") and r.get("plain")]
    gains = [r["handed_test_accuracy"] - r["plain"]["median"] for r in rt_cr]
    search = [r for r in runs if searched(r)]
    held = [r for r in search if (at_or_above(r, "calibrated_plain") or 0) >= AT_OR_ABOVE]
    return {"runs": len(runs), "worse": worse, "gain": statistics.fmean(gains) if gains else None,
            "gain_runs": len(rt_cr), "searched": len(search), "held": len(held),
            "share": len(held) / len(search) if search else None}


def verdicts(e: dict) -> list[str]:
    left = PLANNED - e["runs"]
    so_far = f" so far ({left} of {PLANNED} runs to come)" if left > 0 else ""
    worse = ("**not met**" if e["worse"] else ("met" if left <= 0 else "holding" + so_far))
    def decided(ok: bool) -> str:  # a mean or a share decides only once every run is in
        return ("met" if ok else "**not met**") if left <= 0 else ("at or above" if ok else "below") + " it" + so_far

    gain = "-" if e["gain"] is None else (
        f"{100 * e['gain']:+.1f} points over {e['gain_runs']} runs: {decided(e['gain'] >= GAIN_TARGET)}")
    share = ("no run's headroom measurement chose to search" if e["share"] is None else
             f"{e['held']} of {e['searched']} ({100 * e['share']:.0f}%): {decided(e['share'] >= SHARE_TARGET)}")
    return [f"never shown worse than the median calibrated random prompt or calibrated zero-shot: {worse}"
            + ("; shown worse in " + ", ".join(f"{r['task']} seed {r['seed']}" for r in e["worse"])
               if e["worse"] else ""),
            f"mean gain over the median raw random prompt on rotten_tomatoes and cr (target +12): {gain}",
            f"at or above 12 of the 16 calibrated random prompts where the run chose to search (target 70%): {share}"]


def _chose(r: Record) -> str:
    room = r["headroom_reliability"].value
    return ("search" if r["searched"].value else "calibrated random") + (f" ({room:.2f})" if room is not None else "")


def _made_by(r: Record) -> str:
    who = made_by_summary(r.provenance)
    return (", ".join(who["commits"]) + f"; {'/'.join(map(str, who['threads']))} thr"
            + (f"; {len(who['dirty'])} dirty" if who["dirty"] else ""))


def _at_or_above(r: Record) -> str:
    return f"{r['calibrated_plain_at_or_above'].value} / {r['calibrated_balanced_at_or_above'].value}"


COLUMNS = [
    Column("task", config="task"), Column("seed", config="seed"),
    Column("run chose (headroom reliability)", cell=_chose),
    Column("handed over: test acc", "handed"), Column("its raw", "handed_raw"),
    Column("median raw random", "plain_median"), Column("median calibrated random", "calibrated_plain_median"),
    Column("vs the median calibrated prompt (9th of 16)", "calibrated_plain_vs_median", fmt="diff"),
    Column("vs calibrated zero-shot", "vs_calibrated_zero_shot", fmt="diff"),
    Column("at or above calibrated plain / balanced (of 16)", cell=_at_or_above),
    Column("made by (commits; torch threads)", cell=_made_by),
    Column("record", cell=lambda r: f"[{r.name.split('/')[-1]}](docs/results/{r.name})"),
]


def trust_calibrated(records: Records) -> str:
    """The run-by-run table (the one renderer, over the records read through the one adapter) and the targets."""
    runs = records.glob(f"{FOLDER}/*.json")
    if not runs:
        return (f"No run stored yet. {COMMAND}; the rule and its targets are fixed in "
                "`tools/claim_tables/trust_calibrated.py`.")
    read = [as_record(f"{FOLDER}/{name}", r) for name, r in runs]
    mixed = [f"{r.config['task']} seed {r.config['seed']} {who['mixed']}" for r in read
             if (who := made_by_summary(r.provenance))["mixed"]]
    e = evaluate([r for _, r in runs])
    return (render(read, COLUMNS)
            + f"\n\n{e['runs']} of {PLANNED} runs stored ({COMMAND}). Targets, under the rule fixed before the "
            "runs: " + "; ".join(verdicts(e)) + ". "
            + ("Provenance: " + "; ".join(mixed) + "." if mixed else
               "Every run's stages and test scoring ran from one commit at one thread count."))

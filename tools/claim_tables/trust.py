"""BENCHMARKS' pre-registered trust evaluation run by run: each ``trust-search/*.json`` run's handed-over
prompt placed among its plain and label-balanced random prompts and its retrieval prompts, in correct test
answers (``trust-runs``), and against the label-balanced prompts and the headroom (``trust-balanced``).

Both tables render through the one renderer over the runs read through the one adapter
(:mod:`.readers.trust_search`); the counts and summaries under them are the evaluation's record
(:func:`~.readers.trust_search.evaluation`). The table of targets is :mod:`.trust_targets`.
"""

from __future__ import annotations

from icl_ssm.records import Record

from .adapt import as_record, read
from .base import Records
from .readers.trust_search import evaluation
from .readers.trust_targets import equal_time as join_equal_time
from .render import Column, render

__all__ = ["named", "worse_of", "equal_time_record", "read_trust_runs", "trust_runs", "trust_balanced"]

FOLDER = "trust-search"
EQUAL_TIME = "search-equal-time.json"  # the pooled decision over the per-task records it names
SCREENS = ("compressed", "control", "none", "dense")
SCREEN_NAMES = {"none": "no screen"}
PLANNED_RUNS = 15  # the pre-registered evaluation: seeds 5-9 x rotten_tomatoes, cr, coin_flip
PLANNED_RT_CR = 10
TARGETS = {"at_or_above_three_quarters": 12, "at_or_above_retrieval": 10, "shown_better_rt_cr": 7}
BUDGET_FACTOR = 1.1  # the search's wall time may reach this many times its budget
NO_RUN = "No run of the pre-registered evaluation is stored yet."


def named(worse: list[tuple[str, int, float]]) -> str:
    """`` (coin_flip seed 9, -10.2 points)`` for runs ``(task, seed, paired gain)`` shown worse (:func:`worse_of`);
    empty for none."""
    return " (" + ", ".join(f"{t} seed {seed}, {100 * g:+.1f} points" for t, seed, g in worse) + ")" if worse else ""


def worse_of(e: Record) -> list[tuple[str, int, float]]:
    """``(task, seed, paired gain)`` of the runs the evaluation ``e`` found shown worse, for :func:`named`."""
    return [(task, seed, e[f"worse.{task}-s{seed}"].value) for task, seed in e.config["worse"]]


def stored_runs(n: int) -> str:
    """'So far, of 11 of 15 runs' while the evaluation runs, 'Of the 15 runs' once it is done."""
    return f"So far, of {n} of {PLANNED_RUNS} runs" if n < PLANNED_RUNS else f"Of the {n} runs"


def read_trust_runs(records: Records) -> tuple[list[Record], Record | None]:
    """The stored runs through the one adapter, and their evaluation (None without a run)."""
    runs = [as_record(f"{FOLDER}/{name}", r) for name, r in records.glob(f"{FOLDER}/*.json")]
    return runs, evaluation(runs) if runs else None


def equal_time_record(records: Records) -> Record:
    """The prompt search at equal time: ``search-equal-time.json`` joined with the per-task records it
    names, each read through the one adapter (a pooled run count that differs from theirs is refused)."""
    pooled = read(records, EQUAL_TIME)
    return join_equal_time(pooled, [read(records, name) for name in pooled.config["records"]])


def _of(kind: str):
    return lambda r: f"{r[f'{kind}_at_or_above'].value} of {r[f'{kind}_count'].value}"


def _retrieval(r: Record) -> str:
    best = r["retrieval_best"].value
    return "-" if best is None else f"{best:.3f} ({'yes' if r['at_or_above_retrieval'].value else 'no'})"


def _search(r: Record) -> str:
    wall, budget = r["search_seconds"].value, r["budget_seconds"].value
    return f"{wall:.0f} / {budget:.0f}" if wall and budget else "-"


def _link(r: Record) -> str:
    file = r.name.split("/")[-1]
    return f"[{file}](docs/results/{FOLDER}/{file})"


RUN_COLUMNS = [
    Column("task", config="task"), Column("seed", config="seed"), Column("handed over", config="handed_over"),
    Column("test acc", "handed"), Column("at or above plain random prompts", cell=_of("plain")),
    Column("median random", "plain_median"),
    Column("vs the median prompt (9th of 16)", "plain_vs_median", fmt="diff"),
    Column("at or above balanced random", cell=_of("balanced")),
    Column("best retrieval (at or above it?)", cell=_retrieval), Column("zero-shot", "zero_shot"),
    Column("search s / budget", cell=_search), Column("record", cell=_link),
]


def trust_runs(records: Records) -> str:
    """BENCHMARKS' per-run table of the pre-registered trust evaluation."""
    runs, e = read_trust_runs(records)
    if e is None:
        return NO_RUN
    v = lambda key: e[key].value  # noqa: E731
    gain = "" if v("gain_mean") is None else (
        f" On rotten_tomatoes and cr the handed-over prompt scored on average {100 * v('gain_mean'):+.1f} points "
        "above the median prompt (" + ", ".join(f"{t} {100 * v(f'gain.{t}'):+.1f}" for t in e.config["gain_tasks"])
        + f"; from {100 * v('gain_low'):+.1f} at {e.config['gain_low_run']} to {100 * v('gain_high'):+.1f}).")
    return (render(runs, RUN_COLUMNS)
            + f"\n\n{stored_runs(v('runs'))}: at or above 12 of the 16 plain random prompts in "
            f"{v('at_or_above_three_quarters')} (target: 12 of 15); at or above the best retrieval in "
            f"{v('at_or_above_retrieval')} (target: 10 of 15); shown better than the median plain random prompt on "
            f"rotten_tomatoes and cr in {v('shown_better_rt_cr')} of {v('runs_rt_cr')} (target: 7 of 10). Places "
            "are counted in correct test answers, a tie counting as at." + gain
            + f" Shown worse than the median prompt (the interval below 0) in {v('shown_worse')} of {v('runs')}"
            f"{named(worse_of(e))}.")


BALANCED_COLUMNS = [
    Column("task", config="task"), Column("seed", config="seed"), Column("test acc", "handed"),
    Column("median balanced random", "balanced_median"),
    Column("vs the median balanced prompt (9th of 16)", "balanced_vs_median", fmt="diff"),
    Column("shown better?", cell=lambda r: "yes" if r["balanced_shown_better"].value else "no"),
    Column("best plain random (oracle)", "oracle"),
    Column("share of the median-to-oracle gap captured", "captured", fmt=lambda x: f"{100 * x:.0f}%"),
    Column("record", cell=_link),
]


def trust_balanced(records: Records) -> str:
    """BENCHMARKS' second per-run table: each handed-over prompt against the label-balanced random
    prompts, and the headroom (the best plain random prompt on test, an oracle no method sees)."""
    runs, e = read_trust_runs(records)
    if e is None:
        return NO_RUN
    v = lambda key: e[key].value  # noqa: E731
    middle = "-" if v("captured_median") is None else f"{100 * v('captured_median'):.0f}%"
    return (render(runs, BALANCED_COLUMNS)
            + f"\n\nAt or above 12 of the 16 label-balanced random prompts in "
            f"{v('at_or_above_three_quarters_balanced')} of {v('runs_balanced')} runs; shown better than their "
            f"median on rotten_tomatoes and cr in {v('shown_better_balanced_rt_cr')} of {v('runs_rt_cr')}. "
            f"The handed-over prompt captured a median {middle} of the gap between the median plain random prompt "
            f"and the best one (over {e['captured_median'].n} runs; above 100% where it beat every plain random "
            "prompt, below 0 where it fell below their median). Shares are counted in correct test answers; a gap "
            "of 0 has no share.")

"""BENCHMARKS' 'Selection a user can trust': its targets, one row a measure, before the run-by-run tables.

The rows read the records of ``research/prompt_correctness.py``, ``research/handover_simulation.py`` and
``research/verdict_simulation.py`` (rates over draws, :func:`rate`), the prompt search at equal time
(``bench search``), the pre-registered trust runs (:mod:`.trust`), ``select --budget``'s reliability and
``bench select-cost``'s wall time against FLOP savings, each through the one adapter
(:mod:`.readers.trust_targets`, :mod:`.readers.trust_search`), and render through the one renderer: a row is
a record (or records joined), its measure's text built from the record's metrics (:data:`MEASURES`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from icl_ssm.records import Record

from .adapt import read
from .base import Records, cite
from .readers.common import combined
from .render import FORMATS, Column, metric_text, render
from .trust import (
    BUDGET_FACTOR,
    PLANNED_RT_CR,
    PLANNED_RUNS,
    SCREEN_NAMES,
    SCREENS,
    TARGETS,
    equal_time_record,
    named,
    read_trust_runs,
    worse_of,
)

CORRECTNESS = "prompt-correctness-rotten_tomatoes-k20.json"
HANDOVER = "handover-simulation-rotten_tomatoes-k20.json"
VERDICT = "verdict-simulation-rotten_tomatoes-k50.json"
BUDGETS = {"b3": "budget3-rotten_tomatoes-k20.json", "b10": "budget10-rotten_tomatoes-k20.json",
           "ridge": "budget3-ridge-rotten_tomatoes-k20.json"}
WALL = "select-cost-wall-attention.json"


def rate(x: float) -> str:
    """A rate over a few hundred draws in %, as exact as the draws make it (``16``, ``73.5``)."""
    return f"{100 * x:.1f}".removesuffix(".0")


def verdict(count: int, target: int, left: int) -> str:
    """``met`` / ``not met`` once the count decides the target, else how many of the ``left`` runs still to
    come it needs (a count grows by at most one a run)."""
    if count >= target:
        return "met"
    if count + left < target:
        return "**not met**"
    return f"needs {target - count} of the {left} runs to come"


@dataclass(frozen=True)
class Measure:
    """One row's texts: ``target``, ``command`` and ``machine`` (each a text or one of the row's record),
    ``measured`` (of the record's metrics) and ``pages``, the research pages its record column links first."""

    target: str | Callable[[Record], str]
    command: str | Callable[[Record], str]
    machine: str | Callable[[Record], str]
    measured: Callable[[Record], str]
    pages: str


def _correctness(r: Record) -> str:
    v = lambda key: r[key].value  # noqa: E731
    return (f"Spearman with test accuracy: label-balanced validation loss {v('spearman_loss'):.2f}, validation "
            f"accuracy {v('spearman_accuracy'):.2f}; test accuracies {v('test_min'):.3f}-{v('test_max'):.3f} "
            f"(median {v('test_median'):.3f})")


def _handover(r: Record) -> str:
    v = lambda key: r[key].value  # noqa: E731
    check, prompts = r.config["default_cell"].split("x")
    default = v(f"{r.config['default_cell']}.better_new_rate")
    met = v("equal_new_max") <= 0.05 and default >= 0.8
    return (f"replaced {rate(v('equal_new_min'))}-{rate(v('equal_new_max'))}% at every size (the old rule "
            f"{rate(v('equal_old_min'))}-{rate(v('equal_old_max'))}%); the better prompt found {rate(default)}% at "
            f"the default {check} examples x {prompts} random prompts, "
            + ", ".join(f"{rate(v(f'{c}.better_new_rate'))}% at {c.split('x')[0]}" for c in r.config["larger_cells"])
            + f" ({r.config['draws']} draws a cell, a 95% binomial half-width up to ±{v('half_width'):.2f}): "
            + ("met" if met else "**not met at the default size**"))


def _verdict(r: Record) -> str:
    sizes = r.config["sizes"]
    at = lambda s, z, rule="new": r[f"{s}.{z}.{rule}_pass_rate"].value  # noqa: E731
    fails = lambda s: r[f"{s}.fails_min"].value  # noqa: E731
    size = lambda z: z.replace("x", " x ")  # noqa: E731
    first = sizes[0]  # run's default fidelity size
    close = next(z for z in sizes if at("c", z) >= 0.8)
    met = fails("a") == 1 and fails("b") >= 0.95 and at("c", first) >= 0.8
    return (f"constant: fails {rate(fails('a'))}% (old rule: passed {rate(r['a.old_pass_min'].value)}%); "
            f"10 points worse: fails {rate(fails('b'))}% (old: passed {rate(at('b', first, 'old'))}% at "
            f"{size(first)}); close: passes {rate(at('c', first))}% at the default {size(first)}, "
            f"{rate(at('c', close))}% at {size(close)} ("
            + ("met" if met else "**not met at the default size**") + f"; {r.config['draws']} draws a cell)")


def _equal_time(r: Record) -> str:
    acc, diff = FORMATS["acc"], FORMATS["diff"]
    lines = []
    for m in r.config["minutes"]:
        per_task = "; ".join(f"{task} " + ", ".join(f"{a} {acc(r[f'{task}.{m}.{a}.mean'].value)}" for a in SCREENS)
                             for task in r.config["tasks"])
        lines.append(f"**{m} min**, both tasks ({r[f'{m}.none.runs'].value} runs an arm): "
                     + ", ".join(f"{a} {acc(r[f'{m}.{a}.mean'].value)}" for a in SCREENS)
                     + "; minus no screen: "
                     + ", ".join(f"{a} {metric_text(r[f'{m}.{a}.vs_none'], diff)}" for a in SCREENS if a != "none")
                     + f" ({per_task})")
    took = lambda task, arm: f"{r[f'{task}.distill.{arm}'].value:.0f}"  # noqa: E731
    charged = "".join(
        f". No compressor ships for {task}: its compressed arm needed {took(task, 'compressed')} s of distillation "
        f"first, the control {took(task, 'control')} s of training on the same teacher targets, charged to neither "
        "arm's time" for task in r.config["distilled"])
    resamples = next(m.resamples for k, m in r.metrics.items() if k.endswith(".vs_none"))
    seeds, rule = r.config["seeds"], SCREEN_NAMES.get(r.config["default_screen"], r.config["default_screen"])
    return (f"{', '.join(r.config['tasks'])}; seeds {seeds[0]}-{seeds[-1]}; {r.config['test_size']} test examples; "
            f"intervals resample {resamples}. " + ". ".join(lines)
            + f"{charged}. Every search within {r['wall_max'].value:.2f}x its budget. Rule: **{rule}** "
            f"({r.config['why']})")


def _by(e: Record, what: str) -> dict:
    """The runs' names grouped by each value of their provenance's ``what`` (commits, threads)."""
    out: dict = {}
    for name, made in e.config["made_by"].items():
        for value in made[what]:
            out.setdefault(value, []).append(name)
    return out


def commits_of(e: Record) -> str:
    """'from commit 74f7bdc', or each commit with the runs that used it (a run's stages, where they
    are recorded, counted one by one)."""
    by = _by(e, "commits")
    if len(by) == 1:
        return f"from commit {next(iter(by))}"
    main = max(by, key=lambda c: len(by[c]))
    return f"from commit {main}; " + "; ".join(f"{c} in {', '.join(names)}" for c, names in by.items() if c != main)


def threads_text(e: Record) -> str:
    """'2 torch threads', or the counts with the runs that ran at the rarer ones."""
    by = _by(e, "threads")
    if len(by) <= 1:
        return f"{next(iter(by), '?')} torch threads"
    main = max(by, key=lambda t: len(by[t]))
    return f"{main} torch threads; " + "; ".join(f"{t} in {', '.join(names)}" for t, names in by.items() if t != main)


def _within(e: Record, left: int) -> str:
    """Whether every search kept within :data:`BUDGET_FACTOR` times its budget, or how many runs could still not."""
    worst, timed, n = e["budget_ratio_max"].value, e["timed"].value, e["runs"].value
    if worst is not None and worst > BUDGET_FACTOR:
        return "**not met**"
    if left == 0 and timed == n:
        return "met"
    return f"so far; {left + n - timed} runs undecided"  # a run to come, or one without search timings, could go over


def _evaluation(e: Record) -> str:
    v = lambda key: e[key].value  # noqa: E731
    n, rt_cr, ties, worst = v("runs"), v("runs_rt_cr"), v("ties"), v("budget_ratio_max")
    left, left_rt_cr = max(0, PLANNED_RUNS - n), max(0, PLANNED_RT_CR - rt_cr)
    stored = f"{n} of {PLANNED_RUNS} runs" if n < PLANNED_RUNS else f"all {n} runs"
    count = lambda key, runs_left: f"{v(key)} ({verdict(v(key), TARGETS[key], runs_left)}"  # noqa: E731
    return (
        f"{stored} stored. At or above 12 of the 16 plain random prompts in "
        f"{count('at_or_above_three_quarters', left)}); at or above the best retrieval in "
        f"{count('at_or_above_retrieval', left)}" + (f"; {ties} of them by an exact tie" if ties else "") + "); "
        f"shown better than the median plain random prompt on rotten_tomatoes and cr in {v('shown_better_rt_cr')} "
        f"of {rt_cr} ({verdict(v('shown_better_rt_cr'), TARGETS['shown_better_rt_cr'], left_rt_cr)}); "
        f"shown worse than it in {v('shown_worse')}{named(worse_of(e))}. "
        f"Against the 16 label-balanced random prompts: at or above 12 of them in "
        f"{v('at_or_above_three_quarters_balanced')} of {v('runs_balanced')}, shown better than their median on "
        f"rotten_tomatoes and cr in {v('shown_better_balanced_rt_cr')} of {rt_cr}. The search's wall time "
        + ("-" if worst is None else f"at most {worst:.2f}x its budget ({_within(e, left)})")
        + ". Places counted in correct test answers, a tie counting as at")


def _budgets(r: Record) -> str:
    v = lambda key: r[key].value  # noqa: E731
    minutes = lambda p: f"{v(f'{p}.budget_seconds') / 60:.0f} min"  # noqa: E731
    return (f"`run` has no default budget (`--budget` is opt-in). Subset losses: **{v('b3.reliability'):.2f}** with "
            f"{minutes('b3')} ({v('b3.subsets')} subsets x {v('b3.queries_used')} queries), "
            f"{v('b10.reliability'):.2f} with {minutes('b10')} ({v('b10.subsets')} subsets). Candidates' scores: "
            f"{v('b3.score_reliability'):.2f} at {v('b3.subsets')} subsets (ridge at {v('ridge.subsets')}: "
            f"{v('ridge.score_reliability'):.2f}), **{v('b10.score_reliability'):.2f}** at {v('b10.subsets')} subsets "
            f"({v('b10.wall_seconds') / 60:.1f} min); Spearman-Brown puts {r.config['target']} at about "
            f"{round(v('b10.subsets_to_target'), -2):,.0f} subsets, some {5 * round(v('b10.seconds_to_target') / 300)} "
            "min of this CPU: not within any default budget, which is why `run` checks its pick against random prompts")


def _wall(r: Record) -> str:
    ks, x = r.config["ks"], FORMATS["ratio"]
    at = lambda k, path, key: r[f"{k}.{path}.{key}"].value  # noqa: E731
    apart = lambda k, path: x(at(k, path, "apart"))  # noqa: E731
    missed = [k for k in ks if at(k, "dense-packed", "apart") > 1.5]
    return ("timed without the FLOP counter (FLOPs counted in a pass of their own), **attention counted**: packed "
            f"path (`run`'s) FLOP saving {' / '.join(x(at(k, 'dense-packed', 'flops_vs_compressed')) for k in ks)} "
            f"against wall {' / '.join(x(at(k, 'dense-packed', 'seconds_vs_compressed')) for k in ks)} ("
            + ", ".join(f"**{apart(k, 'dense-packed')}**" if k in missed else apart(k, "dense-packed") for k in ks)
            + " apart: " + (f"not met at k = {', '.join(map(str, missed))}" if missed else "met")
            + f"); batched {', '.join(apart(k, 'dense') for k in ks)} apart; {r.config['queries']} queries, "
            f"{r.config['subsets']} timed subsets a row")


MEASURES: dict[str, Measure] = {
    "correctness": Measure(
        lambda r: (f"a whole prompt's validation score predicts its test accuracy ({r['prompts'].value} random "
                   f"prompts, k = {r.config['k']}, {r.config['validation_size']} validation / "
                   f"{r.config['test_size']} test examples, seed {r.config['seed']})"),
        "`python research/prompt_correctness.py OUT --prompts 12 --balanced 4 --validation 256 --test 150`",
        "CPU, 2 threads, other jobs", _correctness,
        "[prompt search](docs/research/prompt-search.md#whole-prompts-are-measurable)"),
    "handover": Measure(
        "hand-over: an equally good pick replaced in <= 5% of draws; a prompt 10 points better handed over in >= 80%",
        "`python research/handover_simulation.py docs/results/prompt-correctness-rotten_tomatoes-k20.json OUT "
        "--sizes 64 128 256 512 768 --random 8 16 --draws 200`",
        "CPU", _handover, "[prompt search](docs/research/prompt-search.md#the-hand-over-rule)"),
    "verdict": Measure(
        "fidelity verdict: a constant-loss cache fails; one 10 points worse fails in >= 95%; one within 2 points at "
        "Spearman >= 0.8 passes in >= 80%",
        "`python research/verdict_simulation.py docs/results/ssm-input-rotten_tomatoes-k50-96x64.json OUT --sizes "
        "30x4 30x8 60x16 60x32 --draws 200`",
        "CPU", _verdict, "[prompt search](docs/research/prompt-search.md#the-fidelity-verdict)"),
    "equal-time": Measure(
        "the prompt search at equal time: compressed, control, dense or no screen before the dense confirmation "
        "(pre-registered rule: the best arm at the largest budget unless its difference with no screen has an "
        "interval containing 0)",
        lambda r: f"`{r.config['command']}` (over the runs of the per-task records)",
        "CPU, 2 threads, quiet", _equal_time,
        "[prompt search](docs/research/prompt-search.md#the-equal-time-experiment-pre-registered)"),
    "trust": Measure(
        "pre-registered trust evaluation (seeds 5-9 x rotten_tomatoes, cr, coin_flip): the handed-over prompt at "
        "or above 12 of 16 plain random prompts in >= 12 of 15 runs; at or above the best retrieval in >= 10; "
        "shown better than the median random prompt on rotten_tomatoes and cr in >= 7 of 10; the search within "
        "1.1x its budget in every run",
        lambda e: "`icl-ssm bench trust --tasks rotten_tomatoes cr coin_flip --seeds 5 6 7 8 9 --test-size 400 "
                  f"--records docs/results/trust-search` ({commits_of(e)})",
        lambda e: f"CPU, {threads_text(e)}", _evaluation,
        "[run by run](#the-pre-registered-trust-evaluation-run-by-run), [records](docs/results/trust-search/)"),
    "budget": Measure(
        lambda r: (f"split-half reliability >= {r.config['target']} within the default budget, Rotten Tomatoes, "
                   f"k = {r.config['k']}"),
        "`icl-ssm select --task rotten_tomatoes --k 20 --pool-size 100 --queries 32 --test-size 150 --budget 3` "
        "(and `--budget 10`, `--estimator ridge`)",
        "CPU, 2 threads", _budgets, "[selection](docs/selection.md#budgets-sized-to-reliability---budget)"),
    "wall": Measure(
        lambda r: ("compressed evaluator's wall-time saving within 1.5x of its FLOP saving, "
                   f"k = {', '.join(map(str, r.config['ks']))}"),
        "`icl-ssm bench select-cost --compressor G --k 8 20 50 --queries 8 --subsets 2 --per-query-max-k 0`",
        "CPU, 2 threads, quiet", _wall, "[cost](docs/research/selection-cost.md#attention-in-the-flop-counts)"),
}


def _text(text: str | Callable[[Record], str], r: Record) -> str:
    return text(r) if callable(text) else text


def _row(record: Record, measure: str, *cites: str) -> Record:
    """``record`` as the row of ``measure``, its record column linking ``cites``."""
    return dataclasses.replace(record, config={**record.config, "measure": measure, "cites": list(cites)})


def trust_targets(records: Records) -> str:
    """BENCHMARKS' 'Selection a user can trust': the targets, before the run-by-run table."""
    equal_time = equal_time_record(records)
    budgets = {part: read(records, name) for part, name in BUDGETS.items()}
    rows = [_row(read(records, CORRECTNESS), "correctness", CORRECTNESS),
            _row(read(records, HANDOVER), "handover", HANDOVER), _row(read(records, VERDICT), "verdict", VERDICT),
            _row(equal_time, "equal-time", equal_time.name, *equal_time.config["records"])]
    _, e = read_trust_runs(records)
    if e is not None:
        rows.append(_row(e, "trust"))
    config = {"k": budgets["b3"].config["k"], "target": budgets["b10"].config["target"]}
    rows += [_row(combined("budget", budgets, config=config), "budget", *BUDGETS.values()),
             _row(read(records, WALL), "wall", WALL)]
    measure = lambda r: MEASURES[r.config["measure"]]  # noqa: E731
    columns = [Column("target", cell=lambda r: _text(measure(r).target, r)),
               Column("command", cell=lambda r: _text(measure(r).command, r)),
               Column("machine", cell=lambda r: _text(measure(r).machine, r)),
               Column("measured", cell=lambda r: measure(r).measured(r)),
               Column("record", cell=lambda r: cite(records, measure(r).pages, *r.config["cites"]))]
    return render(rows, columns)

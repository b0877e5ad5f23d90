"""BENCHMARKS' 'Selection a user can trust': its targets, and the pre-registered evaluation run by run.

The targets read the records of ``research/prompt_correctness.py``, ``research/handover_simulation.py`` and
``research/verdict_simulation.py`` (rates over draws, :func:`rate`), the prompt search at equal time
(``bench search``), ``select --budget``'s reliability and ``bench select-cost``'s wall-time against FLOP
savings; the run table reads each ``trust-search/*.json`` run and places its handed-over prompt among the
random and retrieval prompts in correct test answers (:func:`placed`, :func:`trust_counts`).
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from icl_ssm.provenance import record_made_by as made_by

from .base import Records, ci, cite, table

RETRIEVAL = ("bm25", "topk", "bm25 (per query)")
EQUAL_TIME = "search-equal-time.json"  # the pooled decision over the per-task records it names
SCREENS = ("compressed", "control", "none", "dense")
SCREEN_NAMES = {"none": "no screen"}


def correct_answers(run: dict) -> dict[str, int]:
    """Each prompt's count of correct test answers in a trust run's record (``prompts_on_test``)."""
    return {name: sum(row["correct"]) for name, row in (run.get("prompts_on_test") or {}).items()}


def placed(run: dict) -> dict:
    """Where a trust run's handed-over prompt stands, counted in correct test answers (a tie is
    "at"): ``{"plain": n at or above, "plain_count", "balanced", "balanced_count", "retrieval": bool}``.
    From the per-example answers a record stores (``prompts_on_test``), else its stored counts."""
    answers = correct_answers(run)
    if "handed-over" not in answers:
        return {"plain": run["plain"]["at_or_above"], "plain_count": run["plain"]["count"],
                "balanced": (run.get("balanced") or {}).get("at_or_above"),
                "balanced_count": (run.get("balanced") or {}).get("count"),
                "retrieval": bool(run.get("at_or_above_retrieval"))}
    mine = answers["handed-over"]
    out = {}
    for kind in ("plain", "balanced"):
        group = [v for n, v in answers.items() if n.startswith(f"{kind}-")]
        out[kind], out[f"{kind}_count"] = sum(mine >= v for v in group), len(group)
    retrieval = best_retrieval(answers)
    out["retrieval"] = retrieval is not None and mine >= retrieval
    return out


def best_retrieval(answers: dict) -> int | None:
    """The most correct test answers of a run's retrieval prompts (``None`` if it scored none)."""
    retrieval = [answers[n] for n in RETRIEVAL if n in answers]
    return max(retrieval) if retrieval else None


def headroom(run: dict) -> dict | None:
    """The oracle a trust run could not see: the best of its plain random prompts on test, their
    median, and the share of the gap between the two the handed-over prompt captured, all in
    correct test answers (``None`` where the record stores no answers or the gap is 0)."""
    answers = correct_answers(run)
    plain = [v for n, v in answers.items() if n.startswith("plain-")]
    if "handed-over" not in answers or not plain:
        return None
    n = len(run["prompts_on_test"]["handed-over"]["correct"])
    oracle, median = max(plain), statistics.median(plain)
    gap = oracle - median
    return {"oracle": oracle / n, "median": median / n,
            "captured": (answers["handed-over"] - median) / gap if gap else None}


PLANNED_RUNS = 15  # the pre-registered evaluation: seeds 5-9 x rotten_tomatoes, cr, coin_flip
TARGETS = {"at_or_above_three_quarters": 12, "at_or_above_retrieval": 10, "shown_better_rt_cr": 7}
PLANNED_RT_CR = 10
BUDGET_FACTOR = 1.1  # the search's wall time may reach this many times its budget


def trust_counts(runs: list[dict]) -> dict[str, int]:
    where = [placed(r) for r in runs if r.get("plain")]
    shown = [r for r in runs if r.get("plain") and r.get("task") in ("rotten_tomatoes", "cr")]
    balanced = [w for w in where if w.get("balanced_count")]
    return {"runs": len(runs),
            "at_or_above_median": sum(w["plain"] >= w["plain_count"] / 2 for w in where),
            "at_or_above_three_quarters": sum(w["plain"] >= 0.75 * w["plain_count"] for w in where),
            "at_or_above_three_quarters_balanced": sum(w["balanced"] >= 0.75 * w["balanced_count"] for w in balanced),
            "runs_balanced": len(balanced),
            "at_or_above_retrieval": sum(w["retrieval"] for w in where),
            "shown_better": sum(bool(r["plain"].get("shown_better")) for r in runs if r.get("plain")),
            "shown_better_rt_cr": sum(bool(r["plain"].get("shown_better")) for r in shown),
            "shown_better_balanced_rt_cr": sum(bool((r.get("balanced") or {}).get("shown_better")) for r in shown),
            "runs_rt_cr": len(shown)}


def budget_ratio(run: dict) -> float | None:
    """A trust run's search wall time over its budget (``None`` where the record has no search)."""
    search = run.get("search") or {}
    if not search.get("wall_seconds") or not search.get("budget_seconds"):
        return None
    return search["wall_seconds"] / search["budget_seconds"]


def retrieval_tie(run: dict) -> bool:
    """Whether a trust run's handed-over prompt ties the best retrieval prompt in correct test answers."""
    answers = correct_answers(run)
    return "handed-over" in answers and answers["handed-over"] == best_retrieval(answers)


def verdict(count: int, target: int, left: int) -> str:
    """``met`` / ``not met`` once the count decides the target, else how many of the ``left`` runs still to
    come it needs (a count grows by at most one a run)."""
    if count >= target:
        return "met"
    if count + left < target:
        return "**not met**"
    return f"needs {target - count} of the {left} runs to come"


def trust_evaluation(records: Records) -> list[str]:
    """The pre-registered trust evaluation against its targets, counted over the stored runs."""
    named_runs = records.glob("trust-search/*.json")
    runs = [r for _, r in named_runs]
    c = trust_counts(runs)
    n, rt_cr = c["runs"], c["runs_rt_cr"]
    ratios = [budget_ratio(r) for r in runs]
    timed = [x for x in ratios if x is not None]
    worst = max(timed) if timed else None
    ties = sum(retrieval_tie(r) for r in runs)
    worse = shown_worse(runs)
    stored = f"{n} of {PLANNED_RUNS} runs" if n < PLANNED_RUNS else f"all {n} runs"
    left, left_rt_cr = max(0, PLANNED_RUNS - n), max(0, PLANNED_RT_CR - rt_cr)
    if worst is not None and worst > BUDGET_FACTOR:
        within = "**not met**"
    elif left == 0 and len(timed) == len(ratios):
        within = "met"
    else:  # a run to come, or one whose record holds no search timings, could still go over
        within = f"so far; {left + len(ratios) - len(timed)} runs undecided"
    measured = (
        f"{stored} stored. At or above 12 of the 16 plain random prompts in {c['at_or_above_three_quarters']} "
        f"({verdict(c['at_or_above_three_quarters'], TARGETS['at_or_above_three_quarters'], left)}); "
        f"at or above the best retrieval in {c['at_or_above_retrieval']} "
        f"({verdict(c['at_or_above_retrieval'], TARGETS['at_or_above_retrieval'], left)}"
        + (f"; {ties} of them by an exact tie" if ties else "") + "); "
        f"shown better than the median plain random prompt on rotten_tomatoes and cr in {c['shown_better_rt_cr']} "
        f"of {rt_cr} ({verdict(c['shown_better_rt_cr'], TARGETS['shown_better_rt_cr'], left_rt_cr)}); "
        f"shown worse than it in {len(worse)}{named(worse)}. "
        f"Against the 16 label-balanced random prompts: at or above 12 of them in "
        f"{c['at_or_above_three_quarters_balanced']} of {c['runs_balanced']}, shown better than their median on "
        f"rotten_tomatoes and cr in "
        f"{c['shown_better_balanced_rt_cr']} of {rt_cr}. The search's wall time "
        + ("-" if worst is None else f"at most {worst:.2f}x its budget ({within})")
        + ". Places counted in correct test answers, a tie counting as at")
    return [
        "pre-registered trust evaluation (seeds 5-9 x rotten_tomatoes, cr, coin_flip): the handed-over prompt at "
        "or above 12 of 16 plain random prompts in >= 12 of 15 runs; at or above the best retrieval in >= 10; "
        "shown better than the median random prompt on rotten_tomatoes and cr in >= 7 of 10; the search within "
        "1.1x its budget in every run",
        "`icl-ssm bench trust --tasks rotten_tomatoes cr coin_flip --seeds 5 6 7 8 9 --test-size 400 --records "
        f"docs/results/trust-search` ({commits_of(named_runs)})",
        f"CPU, {threads_text(named_runs)}", measured,
        "[run by run](#the-pre-registered-trust-evaluation-run-by-run), [records](docs/results/trust-search/)"]


def _by_value(named_runs: list[tuple[str, dict]], value) -> dict:
    """The runs' names grouped by ``value(made_by(run))``."""
    out: dict = {}
    for name, run in named_runs:
        for v in value(made_by(run)):
            out.setdefault(v, []).append(name.removesuffix(".json"))
    return out


def commits_of(named_runs: list[tuple[str, dict]]) -> str:
    """'from commit 74f7bdc', or each commit with the runs that used it (a run's stages, where they
    are recorded, counted one by one)."""
    by = _by_value(named_runs, lambda m: m["commits"])
    if len(by) == 1:
        return f"from commit {next(iter(by))}"
    main = max(by, key=lambda c: len(by[c]))
    return f"from commit {main}; " + "; ".join(f"{c} in {', '.join(names)}" for c, names in by.items() if c != main)


def threads_text(named_runs: list[tuple[str, dict]]) -> str:
    """'2 torch threads', or the counts with the runs that ran at the rarer ones."""
    by = _by_value(named_runs, lambda m: m["threads"])
    if len(by) <= 1:
        return f"{next(iter(by), '?')} torch threads"
    main = max(by, key=lambda t: len(by[t]))
    return f"{main} torch threads; " + "; ".join(f"{t} in {', '.join(names)}" for t, names in by.items() if t != main)


def stored_runs(n: int) -> str:
    """'So far, of 11 of 15 runs' while the evaluation runs, 'Of the 15 runs' once it is done."""
    return f"So far, of {n} of {PLANNED_RUNS} runs" if n < PLANNED_RUNS else f"Of the {n} runs"


def trust_runs(records: Records) -> str:
    """BENCHMARKS' per-run table of the pre-registered trust evaluation."""
    rows = []
    runs = records.glob("trust-search/*.json")
    for name, r in runs:
        p, where = r["plain"], placed(r)
        vs = p.get("vs_median_prompt") or {}
        interval = ci(vs["ci95"], "+.3f") if vs.get("ci95") else "-"
        retrieval = max(r["retrieval"].values()) if r.get("retrieval") else None
        search = r.get("search") or {}
        rows.append([r["task"], str(r["seed"]), r["handed_over"], f"{r['handed_test_accuracy']:.3f}",
                     f"{where['plain']} of {where['plain_count']}", f"{p['median']:.3f}",
                     f"{vs.get('mean', float('nan')):+.3f} {interval}",
                     f"{where['balanced']} of {where['balanced_count']}",
                     "-" if retrieval is None else f"{retrieval:.3f} ({'yes' if where['retrieval'] else 'no'})",
                     f"{r['zero_shot_test_accuracy']:.3f}" if r.get("zero_shot_test_accuracy") is not None else "-",
                     (f"{search['wall_seconds']:.0f} / {search['budget_seconds']:.0f}"
                      if search.get("wall_seconds") and search.get("budget_seconds") else "-"),
                     f"[{name}](docs/results/trust-search/{name})"])
    if not rows:
        return "No run of the pre-registered evaluation is stored yet."
    stored = [r for _, r in runs]
    c, gain, worse = trust_counts(stored), gains_over_median_prompt(stored), shown_worse(stored)
    return (table(["task", "seed", "handed over", "test acc", "at or above plain random prompts", "median random",
                   "vs the median prompt (9th of 16) [95% CI, test examples]", "at or above balanced random",
                   "best retrieval (at or above it?)", "zero-shot", "search s / budget", "record"], rows)
            + f"\n\n{stored_runs(c['runs'])}: at or above 12 of the 16 plain random prompts in "
            f"{c['at_or_above_three_quarters']} (target: 12 of 15); at or above the best retrieval in "
            f"{c['at_or_above_retrieval']} (target: 10 of 15); shown better than the median plain random prompt on "
            f"rotten_tomatoes and cr in {c['shown_better_rt_cr']} of {c['runs_rt_cr']} (target: 7 of 10). Places are "
            "counted in correct test answers, a tie counting as at."
            + (f" On rotten_tomatoes and cr the handed-over prompt scored on average {100 * gain['mean']:+.1f} points "
               "above the median prompt (" + ", ".join(f"{t} {100 * m:+.1f}" for t, m in gain["tasks"].items())
               + f"; from {100 * gain['low']:+.1f} at {gain['low_run']} to {100 * gain['high']:+.1f})."
               if gain else "")
            + f" Shown worse than the median prompt (the interval below 0) in {len(worse)} of {c['runs']}"
            f"{named(worse)}.")


def named(worse: list[tuple[str, int, float]]) -> str:
    """`` (coin_flip seed 9, -10.2 points)`` for the runs :func:`shown_worse` returns; empty for none."""
    return " (" + ", ".join(f"{t} seed {seed}, {100 * g:+.1f} points" for t, seed, g in worse) + ")" if worse else ""


def shown_worse(runs: list[dict]) -> list[tuple[str, int, float]]:
    """``(task, seed, paired gain)`` of the runs whose handed-over prompt is shown worse than the median plain
    random prompt (the paired interval's upper end below 0)."""
    return [(r["task"], r["seed"], vs["mean"]) for r in runs
            if (vs := (r.get("plain") or {}).get("vs_median_prompt") or {}).get("ci95") and vs["ci95"][1] < 0]


def gains_over_median_prompt(runs: list[dict]) -> dict | None:
    """The handed-over prompt's paired gain over the median plain random prompt on rotten_tomatoes and cr:
    ``{"mean", "tasks": {task: mean}, "low", "low_run", "high"}`` (``None`` without such a run)."""
    shown = sorted(((r["task"], r["seed"], r["plain"]["vs_median_prompt"]["mean"]) for r in runs
                    if r.get("task") in ("rotten_tomatoes", "cr") and (r.get("plain") or {}).get("vs_median_prompt")),
                   key=lambda x: (x[2], x[0], x[1]))
    if not shown:
        return None
    tasks = sorted({t for t, _, _ in shown})
    return {"mean": statistics.fmean(g for _, _, g in shown),
            "tasks": {t: statistics.fmean(g for u, _, g in shown if u == t) for t in tasks},
            "low": shown[0][2], "low_run": f"{shown[0][0]} seed {shown[0][1]}", "high": shown[-1][2]}


def trust_balanced(records: Records) -> str:
    """BENCHMARKS' second per-run table: each handed-over prompt against the label-balanced random
    prompts, and the headroom (the best plain random prompt on test, an oracle no method sees)."""
    rows, shares = [], []
    runs = records.glob("trust-search/*.json")
    for name, r in runs:
        b, room = r.get("balanced") or {}, headroom(r)
        vs = b.get("vs_median_prompt") or {}
        if room and room["captured"] is not None:
            shares.append(room["captured"])
        rows.append([r["task"], str(r["seed"]), f"{r['handed_test_accuracy']:.3f}",
                     f"{b['median']:.3f}" if b.get("median") is not None else "-",
                     f"{vs['mean']:+.3f} {ci(vs['ci95'], '+.3f')}" if vs.get("ci95") else "-",
                     "yes" if b.get("shown_better") else "no",
                     f"{room['oracle']:.3f}" if room else "-",
                     "-" if not room or room["captured"] is None else f"{100 * room['captured']:.0f}%",
                     f"[{name}](docs/results/trust-search/{name})"])
    if not rows:
        return "No run of the pre-registered evaluation is stored yet."
    c = trust_counts([r for _, r in runs])
    middle = f"{100 * statistics.median(shares):.0f}%" if shares else "-"
    return (table(["task", "seed", "test acc", "median balanced random",
                   "vs the median balanced prompt (9th of 16) [95% CI, test examples]",
                   "shown better?", "best plain random (oracle)", "share of the median-to-oracle gap captured",
                   "record"], rows)
            + f"\n\nAt or above 12 of the 16 label-balanced random prompts in "
            f"{c['at_or_above_three_quarters_balanced']} of {c['runs_balanced']} runs; shown better than their "
            f"median on rotten_tomatoes and cr in {c['shown_better_balanced_rt_cr']} of {c['runs_rt_cr']}. "
            f"The handed-over prompt captured a median "
            f"{middle} of the gap between the median plain random prompt and the best one (over {len(shares)} runs; "
            "above 100% where it beat every plain random prompt, below 0 where it fell below their median). Shares are "
            "counted in correct test answers; a gap of 0 has no share.")


def rate(x: float) -> str:
    """A rate over a few hundred draws in %, as exact as the draws make it (``16``, ``73.5``)."""
    return f"{100 * x:.1f}".removesuffix(".0")


def binomial_half_width(rates: list[float], draws: int) -> float:
    """The widest normal-approximation 95% half-width of the rates, each over ``draws`` draws."""
    return max(1.96 * (p * (1 - p) / draws) ** 0.5 for p in rates)


def sb_factor(r: float, target: float) -> float:
    """How many times the items a reliability ``r`` needs to reach ``target`` (Spearman-Brown)."""
    return target * (1 - r) / (r * (1 - target))


def trust_targets(records: Records) -> str:
    """BENCHMARKS' 'Selection a user can trust': the targets, before the run-by-run table."""
    rows = []
    pc = records("prompt-correctness-rotten_tomatoes-k20.json")
    tests = [p["test_accuracy"] for p in pc["prompts"]]
    rows.append([
        f"a whole prompt's validation score predicts its test accuracy ({len(pc['prompts'])} random prompts, "
        f"k = {pc['k']}, {pc['validation_size']} validation / {pc['test_size']} test examples, seed {pc['seed']})",
        "`python research/prompt_correctness.py OUT --prompts 12 --balanced 4 --validation 256 --test 150`",
        "CPU, 2 threads, other jobs",
        f"Spearman with test accuracy: label-balanced validation loss {pc['spearman_validation_loss_vs_test']:.2f}, "
        f"validation accuracy {pc['spearman_validation_accuracy_vs_test']:.2f}; test accuracies "
        f"{min(tests):.3f}-{max(tests):.3f} (median {statistics.median(tests):.3f})",
        cite(records, "[prompt search](docs/research/prompt-search.md#whole-prompts-are-measurable)",
             "prompt-correctness-rotten_tomatoes-k20.json")])

    ho = records("handover-simulation-rotten_tomatoes-k20.json")
    cell = {(r["check_size"], r["random_prompts"]): r for r in ho["rows"]}
    equal = [r["equal_new_rate"] for r in ho["rows"]]
    old = [r["equal_old_rate"] for r in ho["rows"]]
    default, draws = cell[128, 8], ho["rows"][0]["draws"]
    larger = [cell[n, 8] for n in sorted(n for n, m in cell if m == 8 and n > 128)]
    quoted = [default["better_new_rate"], *(r["better_new_rate"] for r in larger), *equal]
    met = max(equal) <= 0.05 and default["better_new_rate"] >= 0.8
    rows.append([
        "hand-over: an equally good pick replaced in <= 5% of draws; a prompt 10 points better handed over in >= 80%",
        "`python research/handover_simulation.py docs/results/prompt-correctness-rotten_tomatoes-k20.json OUT "
        "--sizes 64 128 256 512 768 --random 8 16 --draws 200`",
        "CPU",
        f"replaced {rate(min(equal))}-{rate(max(equal))}% at every size (the old rule {rate(min(old))}-"
        f"{rate(max(old))}%); the better prompt found {rate(default['better_new_rate'])}% at the default "
        f"{default['check_size']} examples x {default['random_prompts']} random prompts, "
        + ", ".join(f"{rate(r['better_new_rate'])}% at {r['check_size']}" for r in larger)
        + f" ({draws} draws a cell, a 95% binomial half-width up to ±{binomial_half_width(quoted, draws):.2f}): "
        + ("met" if met else "**not met at the default size**"),
        cite(records, "[prompt search](docs/research/prompt-search.md#the-hand-over-rule)",
             "handover-simulation-rotten_tomatoes-k20.json")])

    vs = records("verdict-simulation-rotten_tomatoes-k50.json")
    at = {(r["scenario"], f"{r['subsets']}x{r['queries']}"): r for r in vs["rows"]}
    first = vs["sizes"][0]  # run's default fidelity size
    size = lambda s: s.replace("x", " x ")  # noqa: E731
    fails = lambda s: min(1 - at[s, z]["new_pass_rate"] for z in vs["sizes"])  # noqa: E731
    close = next(z for z in vs["sizes"] if at["c", z]["new_pass_rate"] >= 0.8)
    met = fails("a") == 1 and fails("b") >= 0.95 and at["c", first]["new_pass_rate"] >= 0.8
    old_constant = min(at["a", z]["old_pass_rate"] for z in vs["sizes"])
    rows.append([
        "fidelity verdict: a constant-loss cache fails; one 10 points worse fails in >= 95%; one within 2 points at "
        "Spearman >= 0.8 passes in >= 80%",
        "`python research/verdict_simulation.py docs/results/ssm-input-rotten_tomatoes-k50-96x64.json OUT --sizes "
        "30x4 30x8 60x16 60x32 --draws 200`",
        "CPU",
        f"constant: fails {rate(fails('a'))}% (old rule: passed {rate(old_constant)}%); "
        f"10 points worse: fails {rate(fails('b'))}% (old: passed {rate(at['b', first]['old_pass_rate'])}% at "
        f"{size(first)}); close: passes {rate(at['c', first]['new_pass_rate'])}% at the default {size(first)}, "
        f"{rate(at['c', close]['new_pass_rate'])}% at {size(close)} ("
        + ("met" if met else "**not met at the default size**") + f"; {vs['draws']} draws a cell)",
        cite(records, "[prompt search](docs/research/prompt-search.md#the-fidelity-verdict)",
             "verdict-simulation-rotten_tomatoes-k50.json")])

    rows.append(equal_time_search(records))
    if records.glob("trust-search/*.json"):
        rows.append(trust_evaluation(records))
    rows.append(budget_reliability(records))
    rows.append(wall_against_flops(records))
    return table(["target", "command", "machine", "measured", "record"], rows)


class EqualTime(NamedTuple):
    """The prompt search at equal time: the pooled record (its summary over every (task, seed) run and
    the decision), the per-task records it names, each one's summary by ``(task, minutes)``, the tasks
    (Rotten Tomatoes first) and the test examples every prompt was scored on."""

    pooled: dict
    parts: list[dict]
    by: dict[tuple[str, float], dict]
    tasks: list[str]
    test_size: int


def equal_time(records: Records) -> EqualTime:
    """:class:`EqualTime` from ``search-equal-time.json`` and the records it names (each read once);
    a pooled record whose run count differs from theirs is refused."""
    pooled = records(EQUAL_TIME)
    parts = [records(name) for name in pooled["records"]]
    by: dict[tuple[str, float], dict] = {}
    for rec in parts:
        (minutes, summary), = rec["summary"]["budgets"].items()
        by[rec["runs"][0]["task"], float(minutes)] = summary
    runs = sum(len(rec["runs"]) for rec in parts)
    if runs != pooled["runs"]:
        raise ValueError(f"{EQUAL_TIME} pools {pooled['runs']} runs; the records it names hold {runs}")
    tasks = sorted({task for task, _ in by}, key=lambda t: (t != "rotten_tomatoes", t))
    return EqualTime(pooled, parts, by, tasks, len(parts[0]["runs"][0]["correct"]))


def equal_time_search(records: Records) -> list[str]:
    """The pre-registered prompt search at equal time: every screen at each budget, over both tasks
    and per task, and the rule's decision."""
    pooled, parts, by, tasks, examples = equal_time(records)
    budgets = pooled["summary"]["budgets"]

    def diff(s: dict, arm: str) -> str:
        v = s[arm]["vs_cheapest"]
        return f"{v['mean']:+.3f} {ci(v['ci95'], '+.3f')}"

    lines = []
    for minutes, s in budgets.items():
        per_task = "; ".join(f"{task} " + ", ".join(f"{a} {by[task, float(minutes)][a]['mean']:.3f}" for a in SCREENS)
                             for task in tasks)
        lines.append(
            f"**{float(minutes):g} min**, both tasks ({s['none']['runs']} runs an arm): "
            + ", ".join(f"{a} {s[a]['mean']:.3f}" for a in SCREENS)
            + "; minus no screen: " + ", ".join(f"{a} {diff(s, a)}" for a in SCREENS if a != "none")
            + f" ({per_task})")
    wall = max(e["wall_max_over_budget"] for s in budgets.values() for e in s.values())
    decision = pooled["summary"]["decision"]
    rule = SCREEN_NAMES.get(decision["default_screen"], decision["default_screen"])
    distilled = {rec["runs"][0]["task"]: rec["compressors"] for rec in parts if "compressors" in rec}
    took = lambda c, arm: sum(c[arm]["distill_seconds"].values())  # noqa: E731
    charged = "".join(
        f". No compressor ships for {task}: its compressed arm needed {took(c, 'compressed')} s of distillation "
        f"first, the control {took(c, 'control')} s of training on the same teacher targets, charged to neither "
        "arm's time"
        for task, c in distilled.items())
    seeds = sorted({r["seed"] for rec in parts for r in rec["runs"]})
    return [
        "the prompt search at equal time: compressed, control, dense or no screen before the dense confirmation "
        "(pre-registered rule: the best arm at the largest budget unless its difference with no screen has an "
        "interval containing 0)",
        f"`{pooled['command']}` (over the runs of the per-task records)",
        "CPU, 2 threads, quiet",
        f"{', '.join(tasks)}; seeds {seeds[0]}-{seeds[-1]}; {examples} test examples; intervals resample (task, "
        "seed) runs and test examples. " + ". ".join(lines)
        + f"{charged}. Every search within {wall:.2f}x its budget. Rule: **{rule}** ({decision['why']})",
        cite(records, "[prompt search](docs/research/prompt-search.md#the-equal-time-experiment-pre-registered)",
             EQUAL_TIME, *pooled["records"])]


def budget_reliability(records: Records) -> list[str]:
    """`select --budget`: the split-half reliability reached in 3 and 10 minutes (mean and ridge)."""
    b3, b10 = records("budget3-rotten_tomatoes-k20.json"), records("budget10-rotten_tomatoes-k20.json")
    ridge = records("budget3-ridge-rotten_tomatoes-k20.json")
    minutes = lambda r: f"{r['budget']['budget_seconds'] / 60:.0f} min"  # noqa: E731
    target = b10["budget"]["target"]
    factor = sb_factor(b10["score_reliability"], target)
    return [
        f"split-half reliability >= {target} within the default budget, Rotten Tomatoes, k = {b3['k']}",
        "`icl-ssm select --task rotten_tomatoes --k 20 --pool-size 100 --queries 32 --test-size 150 --budget 3` "
        "(and `--budget 10`, `--estimator ridge`)",
        "CPU, 2 threads",
        f"`run` has no default budget (`--budget` is opt-in). Subset losses: **{b3['reliability']:.2f}** with "
        f"{minutes(b3)} ({b3['subsets']} subsets x {b3['queries_used']} queries), {b10['reliability']:.2f} with "
        f"{minutes(b10)} ({b10['subsets']} subsets). Candidates' scores: {b3['score_reliability']:.2f} at "
        f"{b3['subsets']} subsets (ridge at {ridge['subsets']}: {ridge['score_reliability']:.2f}), "
        f"**{b10['score_reliability']:.2f}** at {b10['subsets']} subsets ({b10['wall_seconds'] / 60:.1f} min); "
        f"Spearman-Brown puts {target} at about {round(b10['subsets'] * factor, -2):,.0f} subsets, some "
        f"{5 * round(b10['wall_seconds'] * factor / 300)} min of this CPU: not within any default budget, which is "
        "why `run` checks its pick against random prompts",
        cite(records, "[selection](docs/selection.md#budgets-sized-to-reliability---budget)",
             "budget3-rotten_tomatoes-k20.json", "budget10-rotten_tomatoes-k20.json",
             "budget3-ridge-rotten_tomatoes-k20.json")]


def wall_against_flops(records: Records) -> list[str]:
    """The compressed evaluator's wall-time saving against its FLOP saving, attention counted."""
    name = "select-cost-wall-attention.json"
    cost = records(name)
    by = {(r["k"], r["evaluator"]): r for r in cost["rows"]}
    ks = sorted({k for k, _ in by})
    flops = {(k, p): by[k, f"dense{p}"]["flops_vs_compressed"] for k in ks for p in ("", "-packed")}
    wall = {(k, p): by[k, f"dense{p}"]["seconds_vs_compressed"] for k in ks for p in ("", "-packed")}
    apart = {kp: flops[kp] / wall[kp] for kp in flops}
    missed = [k for k in ks if apart[k, "-packed"] > 1.5]
    x = lambda v: f"{v:.1f}x"  # noqa: E731
    return [
        f"compressed evaluator's wall-time saving within 1.5x of its FLOP saving, k = {', '.join(map(str, ks))}",
        "`icl-ssm bench select-cost --compressor G --k 8 20 50 --queries 8 --subsets 2 --per-query-max-k 0`",
        "CPU, 2 threads, quiet",
        "timed without the FLOP counter (FLOPs counted in a pass of their own), **attention counted**: packed path "
        f"(`run`'s) FLOP saving {' / '.join(x(flops[k, '-packed']) for k in ks)} against wall "
        f"{' / '.join(x(wall[k, '-packed']) for k in ks)} ("
        + ", ".join(f"**{x(apart[k, '-packed'])}**" if k in missed else x(apart[k, "-packed"]) for k in ks)
        + " apart: " + (f"not met at k = {', '.join(map(str, missed))}" if missed else "met")
        + f"); batched {', '.join(x(apart[k, '']) for k in ks)} apart; {cost['queries']} queries, "
        f"{cost['subsets']} timed subsets a row",
        cite(records, "[cost](docs/research/selection-cost.md#attention-in-the-flop-counts)", name)]

"""``report``: the results of one run as files a person wants to look at.

:func:`write_report` turns the JSON-serialisable result dict of a run into ``report.md``,
``report.json`` (the dict plus the plot names) and PNG plots drawn with
:class:`matplotlib.figure.Figure` (no pyplot, so no global state and no display):

- ``report.md``: the prompt handed over and what the hand-over check found (headline first), the
  fidelity verdict, one row per selection method, the checked prompts, the prompt search, the
  fidelity of the compressed cache, the plots, and the pool indices of what was handed over;
- ``accuracy.png``: which prompt is best on the test split, against the random prompts' spread
  and zero-shot;
- ``cost.png``: what each method's accuracy cost, in seconds and in FLOPs.

Every file is written atomically, the plots first and ``report.json`` last, so a ``report.json``
on disk means the whole report is there. Missing or ``None`` values read "—"; FLOPs that were not
counted read "n/a".
"""

from __future__ import annotations

import json
import math
import re
import statistics
import textwrap
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from icl_ssm import atomic
from icl_ssm.evaluate.stats import wilson_interval

DASH = "—"
NOT_COUNTED = "n/a"
ZERO_SHOT = "zero-shot"  # the stage name of the prompt without demonstrations (select.check.ZERO_SHOT)
HANDED = "C3"  # the handed-over prompt's colour in every figure
_PALETTE = tuple(f"C{i}" for i in range(10) if i != 3)  # method colours: every tab10 colour but HANDED's
_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*")


_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


_FIDELITY_ROWS = (("compressed", ""), ("control", "control_"), ("window", "window_"), ("streaming", "streaming_"),
                  ("lm-infinite", "lm-infinite_"))


_FIDELITY_COLS = (  # (key, header, format)
    ("rel_logit_err", "Relative logit error", ".2%"),
    ("kl", "KL (nats)", ".4f"),
    ("top1_agree", "Top-1 agreement", ".3f"),
    ("subset_loss_spearman", "Subset-loss Spearman", ".3f"),
)


_SOURCES = {  # where the search's candidate prompts came from (select.search.SOURCES), in words
    "random": "random prompts",
    "balanced": "label-balanced random prompts",
    "affinity": "Algorithm 2's top k from the screen's losses",
    "seed": "other methods' picks",
    "swap": "swaps and reorderings of the best screened",
}


def format_flops(n: int | float | None) -> str:
    """``1234 -> "1.23 kFLOP"``, ``3.2e12 -> "3.20 TFLOP"``, ``None -> "—"``."""
    if not _is_num(n) or not math.isfinite(n):
        return DASH
    x, i = float(n), 0
    while abs(x) >= 999.995 and i < len(_PREFIXES) - 1:  # so that 999_999 reads "1.00 MFLOP"
        x, i = x / 1000, i + 1
    if i == 0:
        return f"{x:.0f} FLOP" if x == int(x) else f"{x:.2f} FLOP"
    return f"{x:.2f} {_PREFIXES[i]}FLOP"


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _fmt(x: Any, spec: str = ".3f") -> str:
    return f"{x:{spec}}" if _is_num(x) else DASH


def _ratio(dense: Any, ours: Any) -> str:
    """How many times fewer FLOPs ``ours`` needs than ``dense``."""
    if not (_is_num(dense) and _is_num(ours)) or dense <= 0 or ours <= 0:
        return DASH
    return f"{dense / ours:.1f}x fewer" if dense >= ours else f"{ours / dense:.1f}x more"


def _cell(x: Any) -> str:
    return DASH if x is None else str(x).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _flops_counted(row: dict) -> bool:
    """Whether ``row["flops"]`` is a count: a method that scored prompts on the model (``subsets``)
    but reports 0 FLOPs did not count them (the search); 0 for one that ran no model is a count."""
    flops = row.get("flops")
    return _is_num(flops) and not (flops == 0 and row.get("subsets"))


def _flops_cell(row: dict) -> str:
    return format_flops(row["flops"]) if _flops_counted(row) else NOT_COUNTED


def _validate(report: Any) -> None:
    if not isinstance(report, dict):
        raise ValueError(f"report={type(report).__name__}: expected a dict of run results")
    selections = report.get("selections") or []
    if not isinstance(selections, list) or not all(isinstance(s, dict) for s in selections):
        raise ValueError(f"report['selections']={selections!r:.80}: expected a list of dicts, one per method")
    if report.get("affinity_scores") is not None and not isinstance(report["affinity_scores"], list):
        raise ValueError(f"report['affinity_scores']={report['affinity_scores']!r:.80}: expected a list or None")
    for key in ("fidelity", "fidelity_verdict", "check", "handed_over", "search", "picks"):
        if report.get(key) is not None and not isinstance(report[key], dict):
            raise ValueError(f"report[{key!r}]={report[key]!r:.80}: expected a dict or None")
    size = report.get("pool_size") or len(report.get("affinity_scores") or [])
    prompts = dict(report.get("picks") or {})
    if report.get("handed_over"):
        prompts["handed over"] = report["handed_over"].get("indices") or []
    for name, indices in prompts.items():
        if not isinstance(indices, list):
            raise ValueError(f"pool indices of {name!r}={indices!r:.80}: expected a list")
        bad = [i for i in indices if not isinstance(i, int) or (size and not 0 <= i < size)]
        if bad:
            raise ValueError(f"pool indices of {name!r} hold {bad[:5]}: expected pool indices in [0, {size})")


def _wilson(acc: Any, n: Any) -> tuple[float, float] | None:
    """The Wilson 95% interval of an accuracy over ``n`` examples; None when either is unknown."""
    if not (_is_num(acc) and isinstance(n, int) and n > 0 and 0 <= acc <= 1):
        return None
    return wilson_interval(round(acc * n), n)


def _acc_ci(acc: Any, n: Any) -> str:
    """``0.733 [0.66, 0.80]``: an accuracy over ``n`` examples with its Wilson 95% interval."""
    ci = _wilson(acc, n)
    return _fmt(acc) if ci is None else f"{acc:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def _diff_ci(d: dict | None) -> str:
    """``+0.031 [-0.010, +0.070]``: a paired difference (``paired_bootstrap``'s dict) and its interval."""
    if not d or not _is_num(d.get("mean")):
        return DASH
    lo, hi = d.get("ci95") or (None, None)
    return f"{d['mean']:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if _is_num(lo) and _is_num(hi) else "")


def _title(report: dict, name: str | None) -> str:
    """A stage name as the report shows it: the method's title, ``random prompt #i``, zero-shot."""
    titles = {s.get("name"): s.get("method") for s in report.get("selections") or [] if s.get("name")}
    if name in titles and titles[name]:
        return str(titles[name])
    if name == ZERO_SHOT:
        return "zero-shot (no demonstrations)"
    if isinstance(name, str) and name.startswith("random-") and name[7:].isdigit():
        return f"random prompt #{name[7:]}"
    return _cell(name)


def _handed(report: dict) -> dict:
    """What was handed over (the check's record when it ran, else the pipeline's)."""
    check = report.get("check") or {}
    return check.get("handed_over") or report.get("handed_over") or {}


def _test_accuracy(report: dict, name: str | None) -> Any:
    if name == ZERO_SHOT:
        return (report.get("check") or {}).get("zero_shot_test_accuracy")
    if isinstance(name, str) and name.startswith("random-") and name[7:].isdigit():
        randoms = (report.get("check") or {}).get("random") or []
        i = int(name[7:])
        return randoms[i].get("test_accuracy") if i < len(randoms) else None
    return next((s.get("test_accuracy") for s in report.get("selections") or [] if s.get("name") == name), None)


def _test_size(report: dict) -> Any:
    size = (report.get("check") or {}).get("test_size")
    return size if size is not None else next((s["test_size"] for s in report.get("selections") or []
                                               if isinstance(s.get("test_size"), int)), None)


def _methods(report: dict) -> list[dict]:
    """The selection rows that are methods (zero-shot, the reference, left out)."""
    return [s for s in report.get("selections") or [] if s.get("name") != ZERO_SHOT and s.get("method") != ZERO_SHOT]


def _zero_shot(report: dict) -> Any:
    zero = (report.get("check") or {}).get("zero_shot_test_accuracy")
    if _is_num(zero):
        return zero
    return next((s.get("test_accuracy") for s in report.get("selections") or []
                 if s.get("name") == ZERO_SHOT or s.get("method") == ZERO_SHOT), None)


# -- words ---------------------------------------------------------------------------------------


def verdict_lines(report: dict) -> list[str]:
    """The fidelity verdict, passed or failed, and the evaluator affinity used when it is not the
    one the verdict chose (for the CLI and report.md)."""
    v = report.get("fidelity_verdict")
    if not v:
        return []
    evaluator, verdict = v.get("evaluator"), v.get("verdict", v.get("evaluator"))
    summary = v.get("summary")
    if not summary:  # a report from before the summary was kept
        failed = [c for c in v.get("checks") or [] if c.get("passed") is False]
        summary = ("the compressed caches failed their fidelity check (" + "; ".join(
            f"{c.get('name')}: no, {c.get('detail')}" for c in failed) + ")") if failed or verdict == "dense" else \
            "the compressed caches pass their fidelity check"
    summary = summary.rstrip(".")
    lines = [f"Fidelity verdict: {summary[:1].upper() + summary[1:]}."]
    if evaluator == "compressed" and verdict == "dense":
        lines.insert(0, "Warning: affinity selected on compressed caches that failed their fidelity check "
                        f"({v.get('reason') or '--evaluator compressed was asked for'}).")
    elif evaluator != verdict or str(v.get("reason") or "").startswith("--evaluator"):
        lines.append(f"Affinity evaluator: {evaluator}, because {v.get('reason') or 'it was asked for'}.")
    return lines


def check_lines(report: dict) -> list[str]:
    """The hand-over check in words, headline first (for the CLI and report.md): which prompt is in
    ``prompt.txt`` and its test accuracy beside zero-shot's, warnings (not shown better than random
    prompts; the pick replaced; zero-shot above every k-shot prompt), where it stands among the
    random prompts on the check examples, and why it was handed over."""
    check = report.get("check")
    if not check:
        return []
    handed = _handed(report)
    name = handed.get("name") or report.get("preferred")
    preferred = check.get("preferred") or report.get("preferred") or name
    size = _test_size(report)
    test_acc = handed.get("test_accuracy")
    test_acc = test_acc if _is_num(test_acc) else _test_accuracy(report, name)
    zero = check.get("zero_shot_test_accuracy")
    what = f"in place of the pick of {_title(report, preferred)}" if name != preferred else "the pick the check judged"
    on = f" on {size} test examples" if isinstance(size, int) else ""
    headline = (f"Handed over (prompt.txt): {_title(report, name)}, {what}; test accuracy {_acc_ci(test_acc, size)}"
                f"{on} (zero-shot {_acc_ci(zero, size)}).")
    if check.get("skipped"):
        return [headline, "Warning: it was not checked against random prompts: no held-out validation examples were "
                          "left after selection."]
    n, total = check.get("check_size"), handed.get("random_prompts", len(check.get("random") or []))
    k = report.get("k")
    randoms = f"random prompts of k={k}" if k is not None else "random prompts of the same size"
    if str(name).startswith("random-"):  # a random prompt stands among the others (hand_over counts those)
        randoms = "other " + randoms
    versus = handed.get("vs_random") or {}
    level = versus.get("level", 0.95)
    lines = [headline]
    if not handed.get("shown_better", True):
        lines.append(f"Warning: the handed-over prompt is not shown to be better than a random prompt of the same "
                     f"size: against the mean random prompt it scores {_diff_ci(versus)}, an interval that does not "
                     f"lie above 0.")
    if handed.get("replaced"):
        lines.append(f"Warning: the pick of {_title(report, preferred)} was replaced: {_title(report, name)} beat it "
                     f"on the {n} check examples by more than the check can tell, so prompt.txt holds "
                     f"{_title(report, name)} (--keep-selection hands over the pick).")
    if handed.get("zero_shot_best"):
        prompts = check.get("prompts") or {}
        shots = [r.get("accuracy") for p, r in prompts.items() if p != ZERO_SHOT]
        shots = [a for a in shots + [r.get("accuracy") for r in check.get("random") or []] if _is_num(a)]
        zero_check = (prompts.get(ZERO_SHOT) or {}).get("accuracy")
        scores = f" ({zero_check:.3f} against at most {max(shots):.3f})" if _is_num(zero_check) and shots else ""
        lines.append(f"Warning: zero-shot scored above every k-shot prompt checked on the {n} check examples{scores}: "
                     "demonstrations may not help this model on this task.")
    lines.append(f"On the {n} held-out check examples it scores at or above {handed.get('at_or_above', DASH)} of "
                 f"{total} {randoms}; vs the mean random prompt {_diff_ci(versus)} ({level:.0%} paired bootstrap over "
                 f"the {versus.get('n', n)} check examples).")
    if handed.get("reason"):
        lines.append(f"Why: {handed['reason'].rstrip('.')}.")
    return lines


def _check_md(report: dict) -> list[str]:
    """Every checked prompt on the check examples, and the random prompts' spread."""
    check = report.get("check") or {}
    if not check.get("prompts"):
        return []
    handed, n, size = _handed(report).get("name"), check.get("check_size"), _test_size(report)
    total = len(check.get("random") or [])
    rows = []
    for name, row in check["prompts"].items():
        title = _title(report, name) + (" **(handed over)**" if name == handed else "")
        acc, interval = row.get("accuracy"), row.get("interval")
        acc = (f"{acc:.3f} [{interval[0]:.2f}, {interval[1]:.2f}]" if _is_num(acc) and interval and None not in interval
               else _acc_ci(acc, n))
        rows.append([title, acc, f"{row.get('at_or_above', DASH)} of {total}", _diff_ci(row.get("vs_random")),
                     _acc_ci(_test_accuracy(report, name), size)])
    accs = [r.get("accuracy") for r in check.get("random") or [] if _is_num(r.get("accuracy"))]
    tests = sorted(r.get("test_accuracy") for r in check.get("random") or [] if _is_num(r.get("test_accuracy")))
    if accs:
        spread = f"mean {sum(accs) / len(accs):.3f}, range {min(accs):.3f}-{max(accs):.3f}"
        test = f"median {statistics.median(tests):.3f}, range {tests[0]:.3f}-{tests[-1]:.3f}" if tests else DASH
        rows.append([f"random prompts ({total})", spread, DASH, DASH, test])
    header = ["Prompt", f"Check accuracy on {n} [95% CI]", "At or above (random prompts)",
              "vs mean random prompt [95% CI]", f"Test accuracy on {_cell(size)} [95% CI]"]
    start, end = (check.get("held_out") or [None, None])[:2]
    where = (f" (validation examples {start} to {end - 1}, never read by selection)" if _is_num(start) and _is_num(end)
             else "")
    return [f"Every pick, zero-shot and {total} random prompts on {n} held-out check examples{where}; the "
            "differences are paired bootstrap intervals over the check examples.", "", *_table(header, rows)]


def search_lines(search: dict | None) -> list[str]:
    """The prompt search in words: the plan and the time it took, the prompts screened by source,
    the screen's reliability and its agreement with the dense confirmation, the winner (report.md)."""
    if not search:
        return []
    plan = search.get("plan") or {}
    sec = plan.get("seconds") or {}
    per = plan.get("per_prompt") or {}
    screen = search.get("screen") or "none"
    budget, wall, phases = search.get("budget_seconds"), search.get("wall_seconds"), search.get("phases") or {}
    took = ", ".join(f"{p} {phases[p]:.0f} s" for p in ("pilot", "screen", "confirm", "order")
                     if _is_num(phases.get(p)))
    lines = [f"Budget {_fmt(budget, '.0f')} s, took {_fmt(wall, '.0f')} s" + (f" ({took})." if took else "."), ""]
    rungs = " -> ".join(f"{a} x {q}" for a, q in plan.get("rungs") or [])
    screened_plan = (f"screen {plan.get('screened')} prompts on the {screen} caches "
                     f"({_fmt(sec.get('screen'), '.0f')} s, {_fmt(per.get('screen'), '.2f')} s per prompt), "
                     if screen != "none" and plan.get("screened") else "no screen (random search), ")
    lines.append(f"- Plan: {screened_plan}confirm {_cell(plan.get('arms'))} on dense caches by successive halving "
                 f"({rungs or DASH} prompts x queries, {_fmt(sec.get('confirm'), '.0f')} s), order the survivor over "
                 f"{_cell(plan.get('orders'))} orders ({_fmt(sec.get('order'), '.0f')} s).")
    sources = search.get("sources") or {}
    by_source = ", ".join(f"{_SOURCES.get(s, s)} {c}" for s, c in sorted(sources.items(), key=lambda x: -x[1]))
    sq, cq = search.get("screen_queries"), search.get("confirm_queries")
    if screen != "none":
        lines.append(f"- Screened: {_cell(search.get('screened'))} prompts on the {screen} caches, each on the same "
                     f"{_cell(sq)} label-balanced validation queries; candidates by source: {by_source or DASH}.")
        half, rel = search.get("screen_split_half"), search.get("screen_reliability")
        if _is_num(half):
            halves = f"two halves of {sq // 2} queries" if isinstance(sq, int) else "two halves of its queries"
            lines.append(f"- Screen reliability: split-half Spearman {half:.2f} between the prompts' losses on "
                         f"{halves}, Spearman-Brown {_fmt(rel, '.2f')} for all {_cell(sq)}; over the "
                         f"{_cell(search.get('screened'))} screened prompts.")
        else:
            lines.append("- Screen reliability: not measured (fewer than 3 prompts, or 2 queries, with per-query "
                         "losses).")
        rho, first = search.get("screen_vs_confirm_spearman"), (search.get("rungs") or [{}])[0]
        if _is_num(rho):
            lines.append(f"- Screen vs dense confirmation: Spearman {rho:.2f} between the screen's loss and the dense "
                         f"loss on the first rung's {_cell(first.get('queries'))} queries, over its "
                         f"{_cell(first.get('arms'))} prompts.")
        else:
            lines.append("- Screen vs dense confirmation: not measured (fewer than 3 prompts on the first rung).")
    else:
        lines.append(f"- No screen: candidates went straight into the dense confirmation; by source: "
                     f"{by_source or DASH}.")
    winner = search.get("winner_source")
    loss = search.get("winner_confirm_loss")
    won = f"- Winner: from {_SOURCES.get(winner, _cell(winner))}, dense loss {_fmt(loss)} on {_cell(cq)} queries"
    order = search.get("order_search") or {}
    cands = order.get("candidates") or []
    if cands and isinstance(order.get("chosen"), int) and order["chosen"] < len(cands):
        best = cands[order["chosen"]]
        won += (f"; its order chosen among {len(cands)} on the same queries: {best.get('order')} "
                f"(loss {_fmt(best.get('validation_loss'))})")
    lines.append(won + ".")
    table = []
    for i, r in enumerate(search.get("rungs") or []):
        losses, srcs = r.get("losses") or [], r.get("sources") or []
        kept = ", ".join(srcs[:4]) + (", ..." if len(srcs) > 4 else "")
        table.append([str(i + 1), _cell(r.get("arms")), _cell(r.get("queries")),
                      _fmt(losses[0]) if losses else DASH, kept or DASH])
    if table:
        lines += ["", *_table(["Rung", "Prompts", "Dense queries each", "Best dense loss", "Sources (best first)"],
                              table)]
    return lines


def _fidelity_md(fid: dict | None, verdict: dict | None) -> list[str]:
    if not fid:
        return ["Not measured."]
    rows = []
    for name, prefix in _FIDELITY_ROWS:
        values = [fid.get(prefix + key) for key, _, _ in _FIDELITY_COLS]
        if prefix and all(v is None for v in values):
            continue  # this baseline was not run
        cells = [_fmt(v, spec) for v, (_, _, spec) in zip(values, _FIDELITY_COLS)]
        ci = fid.get(prefix + "subset_loss_spearman_ci95")
        if isinstance(ci, list | tuple) and len(ci) == 2 and all(_is_num(v) for v in ci):
            cells[-1] += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
        rows.append([name] + cells)
    lines = _table(["Cache"] + [h for _, h, _ in _FIDELITY_COLS[:-1]] + ["Subset-loss Spearman [95% CI]"], rows)
    fd, fc = fid.get("flops_dense"), fid.get("flops_compressed")
    lines += [
        "",
        f"- Accuracy: dense prompt {_fmt(fid.get('acc_dense'))}, compressed cache {_fmt(fid.get('acc_compressed'))}",
        f"- FLOPs: dense {format_flops(fd)}, compressed {format_flops(fc)} ({_ratio(fd, fc)})",
        f"- Held-out subsets: {_cell(fid.get('subsets'))}, queries: {_cell(fid.get('queries'))}",
    ]
    passed = {True: "yes", False: "no", None: "not run"}
    for c in (verdict or {}).get("checks") or []:
        lines.append(f"- Verdict check, {c.get('name')}: {passed.get(c.get('passed'), DASH)}, {c.get('detail')}")
    return lines


def _selection_md(selections: list[dict]) -> list[str]:
    if not selections:
        return ["No selection was run."]
    dense = any(s.get("dense_flops") is not None or s.get("dense_wall_seconds") is not None for s in selections)
    orders = max((len(s.get("test_accuracy_orders") or ()) for s in selections), default=0)
    header = ["Method", "Evaluator", "Test accuracy [95% CI]"]
    header += [f"Mean over {orders} orders ± sd"] if orders else []
    header += ["Labels", "FLOPs", "Wall s", "Subsets"]
    reliable = any(_is_num(s.get("reliability")) for s in selections)
    header += ["Queries", "Reliability (losses / scores)"] if reliable else []
    header += ["Dense-evaluator FLOPs", "Dense-evaluator s", "FLOP saving"] if dense else []
    rows = []
    for s in selections:
        acc, std = _acc_ci(s.get("test_accuracy"), s.get("test_size")), s.get("test_accuracy_std")
        labels = s.get("labels")
        labels = " / ".join(f"{k} {v}" for k, v in labels.items()) if isinstance(labels, dict) else DASH
        mean = s.get("test_accuracy_order_mean")
        if orders:  # the spread over orders in its own column
            row = [_cell(s.get("method")), _cell(s.get("evaluator")), acc,
                   f"{mean:.3f} ± {std:.3f}" if _is_num(mean) and _is_num(std) else DASH, labels]
        else:
            row = [_cell(s.get("method")), _cell(s.get("evaluator")),
                   acc + (f" ± {std:.3f}" if _is_num(std) else ""), labels]
        row += [_flops_cell(s), _fmt(s.get("wall_seconds"), ".2f"), _cell(s.get("subsets"))]
        if reliable:
            queries = s.get("queries_used") or (s.get("validation_size") if _is_num(s.get("reliability")) else None)
            rel = _fmt(s.get("reliability"), ".2f") if _is_num(s.get("reliability")) else DASH
            if _is_num(s.get("score_reliability")):
                rel += f" / {s['score_reliability']:.2f}"
            row += [_cell(queries), rel]
        if dense:
            row += [format_flops(s.get("dense_flops")), _fmt(s.get("dense_wall_seconds"), ".2f")]
            row.append(_ratio(s.get("dense_flops"), s.get("flops") if _flops_counted(s) else None))
        rows.append(row)
    return _table(header, rows)


def _prompts_md(report: dict) -> list[str]:
    """What prompt.txt holds and the pick the check judged, each named for what it is."""
    r, handed = report, _handed(report)
    preferred = (r.get("check") or {}).get("preferred") or r.get("preferred")
    pick = (r.get("picks") or {}).get(preferred)
    files = [(label, r.get(key)) for label, key in (("Handed-over demonstrations", "selected_file"),
                                                    ("Handed-over prompt", "prompt_file"))]
    if not (handed.get("indices") is not None or pick is not None or any(f for _, f in files)):
        return []
    lines = ["## Demonstrations handed over", ""]
    lines += [f"- {label}: [{f}]({f})" for label, f in files if f]
    if handed.get("indices") is not None:
        lines.append(f"- Handed over (prompt.txt): {_title(r, handed.get('name'))}, pool indices "
                     f"{', '.join(map(str, handed['indices'])) or 'none (zero-shot)'}")
    if pick is not None:
        lines.append(f"- Pick of {_title(r, preferred)} (the prompt the check judged): pool indices "
                     f"{', '.join(map(str, pick))}")
    return lines


def _markdown(report: dict, plots: dict[str, str]) -> str:
    r = report
    lines = [f"# {_cell(r.get('model'))} on {_cell(r.get('task'))}, k={_cell(r.get('k'))}", ""]
    lines += check_lines(r) + [""] if check_lines(r) else []
    lines += verdict_lines(r) + [""] if verdict_lines(r) else []
    lines += [f"Seed {_cell(r.get('seed'))}.", "", "## Demonstration selection", ""]
    lines += _selection_md(r.get("selections") or [])
    if any(not _flops_counted(s) for s in r.get("selections") or []):
        lines += ["", "FLOPs n/a: that method's FLOPs were not counted."]
    scores = [s for s in r.get("affinity_scores") or [] if s is not None]
    if r.get("affinity_scores"):
        lines += ["", f"Affinity: {len(scores)} of {len(r['affinity_scores'])} pool candidates were sampled and "
                      "scored."]
    lines += ["", "## Plots", ""]
    for name, file in plots.items():  # one paragraph per image, so each renders on its own line
        lines += [f"![{name}]({file})", ""]
    if _check_md(r):
        lines += ["## Hand-over check", "", *_check_md(r)]
    if r.get("search"):
        lines += ["", "## Prompt search", "", *search_lines(r["search"])]
    lines += ["", "## Fidelity of the compressed cache", ""]
    lines += _fidelity_md(r.get("fidelity"), r.get("fidelity_verdict"))
    lines += [""] + _prompts_md(r)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip("\n") + "\n"  # one blank line between blocks


# -- figures -------------------------------------------------------------------------------------


def _wrap(text: str, width: int = 30) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def _about(report: dict) -> str:
    size = _test_size(report)
    on = f", {size} test examples" if isinstance(size, int) else ""
    return f"{report.get('task', DASH)}, k={report.get('k', DASH)}, {report.get('model', DASH)}{on}"


def _accuracy_fig(report: dict) -> Figure:
    """Test accuracy, one row per method (its pick with a Wilson 95% interval), the random prompts'
    spread as a strip, zero-shot as a vertical line; the handed-over prompt in :data:`HANDED`."""
    rows, check = _methods(report), report.get("check") or {}
    handed, size = _handed(report).get("name"), _test_size(report)
    randoms = [(i, r["test_accuracy"]) for i, r in enumerate(check.get("random") or [])
               if _is_num(r.get("test_accuracy"))]
    count = len(rows) + bool(randoms)
    fig = Figure(figsize=(7.5, 2.2 + 0.36 * max(count, 1)), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    names, right = [], []
    for y, s in enumerate(rows):
        acc, n, mine = s.get("test_accuracy"), s.get("test_size") or size, s.get("name") == handed
        colour = HANDED if mine else "C0"
        ci = _wilson(acc, n)
        if ci is not None:
            ax.errorbar(acc, y, xerr=[[acc - ci[0]], [ci[1] - acc]], fmt="o", color=colour, ms=7 if mine else 5,
                        capsize=3, zorder=3)
        elif _is_num(acc):
            ax.plot(acc, y, "o", color=colour, ms=7 if mine else 5, zorder=3)
        names.append(_wrap(str(s.get("method") or s.get("name") or DASH)))
        right.append((_acc_ci(acc, n) if _is_num(acc) else "not measured") + (", handed over" if mine else ""))
    if randoms:
        y, accs = len(rows), sorted(a for _, a in randoms)
        median = statistics.median(accs)
        ax.hlines(y, accs[0], accs[-1], color="0.8", lw=5, zorder=1)
        jitter = [((j * 0.618034) % 1 - 0.5) * 0.44 for j in range(len(randoms))]  # spread, deterministic
        ax.scatter([a for _, a in randoms], [y + d for d in jitter], s=14, color="0.35", zorder=2)
        ax.plot(median, y, marker="|", ms=18, mew=2.5, color="black", zorder=3)
        picked = [(a, y + d) for (i, a), d in zip(randoms, jitter) if handed == f"random-{i}"]
        if picked:
            ax.scatter(*zip(*picked), s=60, color=HANDED, zorder=4)
        names.append(f"random prompts ({len(randoms)})")
        right.append(f"median {median:.3f}, {accs[0]:.3f}-{accs[-1]:.3f}" + (", one handed over" if picked else ""))
    zero = _zero_shot(report)
    handles = [Line2D([], [], color="C0", marker="o", ls="", label="a method's pick, Wilson 95% interval")]
    if randoms:
        handles += [Line2D([], [], color="0.35", marker="o", ms=4, ls="", label="a random prompt; | their median")]
    if _is_num(zero):
        ax.axvline(zero, ls="--", color=HANDED if handed == ZERO_SHOT else "0.45", zorder=0)
        handles.append(Line2D([], [], ls="--", color=HANDED if handed == ZERO_SHOT else "0.45",
                              label=f"zero-shot {zero:.3f}" + (", handed over" if handed == ZERO_SHOT else "")))
    if handed:
        handles.append(Line2D([], [], color=HANDED, marker="o", ms=7, ls="", label="handed over (prompt.txt)"))
    if not count:
        ax.text(0.5, 0.5, "no test accuracy", transform=ax.transAxes, ha="center", va="center", color="0.4")
        ax.set_xlim(0, 1)
    ticks = list(range(count))
    ax.set_yticks(ticks, names, fontsize=8)
    ax.set_ylim(max(count, 1) - 0.5, -0.5)  # the first method on top
    twin = ax.twinx()
    twin.set_ylim(ax.get_ylim())
    twin.set_yticks(ticks, right, fontsize=8)
    twin.tick_params(length=0)
    marked = [s.get("name") == handed for s in rows]  # the row to colour: a method, or the random prompts
    if randoms:
        marked.append(any(handed == f"random-{i}" for i, _ in randoms))
    for side in (ax.get_yticklabels(), twin.get_yticklabels()):
        for label, mine in zip(side, marked):
            if mine:
                label.set_color(HANDED)
                label.set_fontweight("bold")
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel("test accuracy")
    ax.set_title(f"Test accuracy: {_about(report)}", fontsize=10)
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    return fig


def _place_labels(fig: Figure, labels: list[tuple[Any, list]]) -> bool:
    """Move each point's label (an annotation beside its point) up or down, a line at a time,
    until it overlaps no marker and no label placed before it and stays inside its axes; top
    points first. A label right of the axes' middle goes to the left of its point. False when
    some label finds no such place (points too crowded: the caller falls back to a legend)."""
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()  # the layout (the labels are out of it), so that the extents are final
    for ax, anns in labels:
        frame = ax.get_window_extent(renderer)
        marker = 6 * fig.dpi / 72  # pixels: half a marker and a margin
        placed = [Bbox.from_extents(x - marker, y - marker, x + marker, y + marker)
                  for x, y in (ax.transData.transform(a.xy) for a in anns)]
        for ann in sorted(anns, key=lambda a: -ax.transData.transform(a.xy)[1]):
            x = ax.transData.transform(ann.xy)[0]
            dx = 12.0 if ann.get_fontweight() == "bold" else 7.0  # the handed-over one: past its ring
            if x > frame.x0 + 0.55 * frame.width:
                ann.set_horizontalalignment("right")
                ann.set_multialignment("right")
                dx = -dx
            line = ann.get_fontsize() * 1.25  # points
            for step in [0] + [s * j for j in range(1, 16) for s in (-1, 1)]:
                ann.xyann = (dx, step * line)
                box = Text.get_window_extent(ann, renderer).padded(1)
                if frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1) and \
                        not any(box.overlaps(other) for other in placed):
                    placed.append(box)
                    break
            else:
                return False
    return True


def _cost_fig(report: dict) -> Figure:
    """Test accuracy against the selection's cost, in wall seconds and in FLOPs (log axes), each
    method labelled beside its point; a method whose cost is missing, 0 or not counted is left out
    of that panel and named in its note."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows = [s for s in _methods(report) if _is_num(s.get("test_accuracy"))]
    handed, size = _handed(report).get("name"), _test_size(report)
    fig = Figure(figsize=(9.0, 4.8 + 0.15 * max(0, len(rows) - 8)), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)  # a renderer, to place the labels
    axes = fig.subplots(1, 2, sharey=True)

    def seconds(s: dict) -> tuple[Any, str]:
        x = s.get("wall_seconds")
        return (x, "") if _is_num(x) and x > 0 else (None, "0 s" if x == 0 else "no time recorded")

    def flops(s: dict) -> tuple[Any, str]:
        if not _flops_counted(s):
            return None, "FLOPs not counted"
        return (s["flops"], "") if s["flops"] > 0 else (None, "0 FLOP")

    styles = {id(s): (_PALETTE[i % len(_PALETTE)], _MARKERS[(i // len(_PALETTE) + i) % len(_MARKERS)])
              for i, s in enumerate(rows)}
    ring, labels, marks = None, [], {}  # marks: a handle per method, for the legend of a crowded figure
    for ax, cost, label in ((axes[0], seconds, "selection wall time (s, log)"),
                            (axes[1], flops, "selection FLOPs (log)")):
        left_out: dict[str, list[str]] = {}
        anns = []
        for s in rows:
            x, why = cost(s)
            title = str(s.get("method") or s.get("name") or DASH)
            if x is None:
                left_out.setdefault(why, []).append(title)
                continue
            acc, (colour, marker) = s["test_accuracy"], styles[id(s)]
            mine = s.get("name") == handed
            ci = _wilson(acc, s.get("test_size") or size)
            err = None if ci is None else [[acc - ci[0]], [ci[1] - acc]]
            marks[id(s)] = ax.errorbar(x, acc, yerr=err, fmt=marker, color=colour, ms=7, capsize=2, elinewidth=0.8,
                                       zorder=3, label=title)
            if mine:
                ring = ax.scatter([x], [acc], s=320, facecolors="none", edgecolors=HANDED, linewidths=2, zorder=4,
                                  label=f"handed over: {title}")
            anns.append(ax.annotate(_wrap(title + (" (handed over)" if mine else ""), 24), (x, acc),
                                    xytext=(7, 0), textcoords="offset points", va="center", fontsize=7,
                                    color=HANDED if mine else colour, fontweight="bold" if mine else None,
                                    arrowprops=dict(arrowstyle="-", color="0.6", lw=0.5, shrinkA=0, shrinkB=5)))
            anns[-1].set_in_layout(False)  # placed after the layout (_place_labels)
        labels.append((ax, anns))
        if anns:
            ax.set_xscale("log")
            ax.margins(x=0.2, y=0.08)
        else:
            ax.text(0.5, 0.5, "nothing to plot", transform=ax.transAxes, ha="center", va="center", color="0.4")
        note = "; ".join(f"{', '.join(names)} ({why})" for why, names in left_out.items())
        ax.set_xlabel(label + ("\n" + textwrap.fill("not shown: " + note, 60) if note else ""), fontsize=9)
        ax.grid(alpha=0.3)
    zero = _zero_shot(report)
    legend = []
    if _is_num(zero):
        for ax in axes:
            ax.axhline(zero, ls="--", color=HANDED if handed == ZERO_SHOT else "0.45", zorder=0)
        legend.append(Line2D([], [], ls="--", color=HANDED if handed == ZERO_SHOT else "0.45",
                             label=f"zero-shot {zero:.3f}" + (", handed over" if handed == ZERO_SHOT else "")))
    if ring is not None:
        legend.append(ring)
    elif handed and handed != ZERO_SHOT:  # a random prompt: no selection cost to place it at
        legend.append(Line2D([], [], ls="", label=f"handed over: {_title(report, handed)} (see accuracy.png)"))
    axes[0].set_ylabel("test accuracy (Wilson 95% interval)")
    fig.suptitle(f"Accuracy against selection cost: {_about(report)}", fontsize=10)
    key = fig.legend(handles=legend, loc="outside lower center", ncols=len(legend), fontsize=8, frameon=False) \
        if legend else None
    if not _place_labels(fig, labels):  # too crowded to label beside the points: a legend of the methods
        for _, anns in labels:
            for ann in anns:
                ann.remove()
        if key is not None:
            key.remove()
        fig.legend(handles=list(marks.values()) + legend, loc="outside lower center", ncols=3, fontsize=8,
                   frameon=False)
    return fig


def _save_png(fig: Figure, path: Path) -> Path:
    return atomic.write_with(path, lambda f: fig.savefig(f, format="png"))


def write_report(out: str | Path, report: dict) -> dict[str, Path]:
    """Write ``report.md``, ``report.json``, ``accuracy.png`` and ``cost.png`` into directory ``out``.

    ``report`` holds ``model, task, k, seed``, ``selections`` (one dict per method, in display
    order: ``name``, ``method``, ``test_accuracy``, ``test_size``, ``flops``, ``wall_seconds``,
    ...), and optionally ``fidelity``, ``fidelity_verdict``, ``check`` and ``handed_over`` (the
    hand-over check, :mod:`icl_ssm.select.check`), ``picks`` and ``preferred``, ``search`` (the
    prompt search's record), ``affinity_scores``, ``pool_size``, ``prompt_file``/``selected_file``.
    ``report`` itself is not modified. Returns ``{"markdown", "json", "accuracy", "cost"} -> Path``.
    """
    _validate(report)
    out = atomic.prepare_dir(out, what="report directory")
    figures = {"accuracy": _accuracy_fig, "cost": _cost_fig}
    plots = {name: f"{name}.png" for name in figures}
    # Serialise before writing anything, so that a non-JSON value leaves no partial report.
    json_text = json.dumps({**report, "plots": plots}, indent=1) + "\n"
    markdown = _markdown(report, plots)
    written = {name: _save_png(draw(report), out / plots[name]) for name, draw in figures.items()}
    written["markdown"] = atomic.write_text(out / "report.md", markdown)
    written["json"] = atomic.write_text(out / "report.json", json_text)
    return written

"""The report in words: ``report.md`` (:func:`_markdown`) and the lines the CLI prints beside it
(:func:`calibration_lines`, :func:`check_lines`, :func:`verdict_lines`), with the tables of the selection methods,
the checked prompts and the fidelity of the compressed cache; the prompt search's section comes from
:func:`~icl_ssm.report.search.search_lines`."""

from __future__ import annotations

import re
import statistics
from typing import Any

from icl_ssm.evaluate.verdict import FAITHFUL, NOT_FAITHFUL, failed_checks
from icl_ssm.report.search import search_lines
from icl_ssm.report.values import (
    DASH,
    NOT_COUNTED,
    ZERO_SHOT,
    _acc_ci,
    _cell,
    _flops_counted,
    _fmt,
    _handed,
    _is_num,
    _table,
    _test_accuracy,
    _test_size,
    _title,
    format_flops,
)

_FIDELITY_ROWS = (("compressed", ""), ("control", "control_"), ("window", "window_"), ("streaming", "streaming_"),
                  ("lm-infinite", "lm-infinite_"))


_FIDELITY_COLS = (  # (key, header, format)
    ("rel_logit_err", "Relative logit error", ".2%"),
    ("kl", "KL (nats)", ".4f"),
    ("top1_agree", "Top-1 agreement", ".3f"),
    ("subset_loss_spearman", "Subset-loss Spearman", ".3f"),
)


def _ratio(dense: Any, ours: Any) -> str:
    """How many times fewer FLOPs ``ours`` needs than ``dense``."""
    if not (_is_num(dense) and _is_num(ours)) or dense <= 0 or ours <= 0:
        return DASH
    return f"{dense / ours:.1f}x fewer" if dense >= ours else f"{ours / dense:.1f}x more"


def _flops_cell(row: dict) -> str:
    return format_flops(row["flops"]) if _flops_counted(row) else NOT_COUNTED


def _diff_ci(d: dict | None) -> str:
    """``+0.031 [-0.010, +0.070]``: a paired difference (``paired_bootstrap``'s dict) and its interval."""
    if not d or not _is_num(d.get("mean")):
        return DASH
    lo, hi = d.get("ci95") or (None, None)
    return f"{d['mean']:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if _is_num(lo) and _is_num(hi) else "")


def verdict_lines(report: dict) -> list[str]:
    """The fidelity verdict, passed or failed, and the evaluator affinity used when it is not the
    one the verdict chose (for the CLI and report.md)."""
    v = report.get("fidelity_verdict")
    if not v:
        return []
    evaluator, verdict = v.get("evaluator"), v.get("verdict", v.get("evaluator"))
    summary = v.get("summary")
    if not summary:  # a report from before the summary was kept
        failed = failed_checks(v.get("checks") or [])
        summary = f"{NOT_FAITHFUL} ({failed})" if failed or verdict == "dense" else FAITHFUL
    summary = summary.rstrip(".")
    lines = [f"Fidelity verdict: {summary[:1].upper() + summary[1:]}."]
    if evaluator == "compressed" and verdict == "dense":
        lines.insert(0, "Warning: affinity selected on compressed caches that failed the fidelity verdict "
                        f"({v.get('reason') or '--evaluator compressed was asked for'}).")
    elif evaluator != verdict or str(v.get("reason") or "").startswith("--evaluator"):
        lines.append(f"Affinity evaluator: {evaluator}, because {v.get('reason') or 'it was asked for'}.")
    return lines


def versus_calibrated(handed: dict) -> list[str]:
    """The handed-over prompt against the mean calibrated random prompt on the check examples."""
    vs = handed.get("vs_calibrated_random")
    if not vs:
        return []
    verdict = "shown better than" if vs["ci95"][0] > 0 else ("shown worse than" if vs["ci95"][1] < 0 else
                                                               "not told apart from")
    return [f"On the check examples it is {verdict} the mean batch-calibrated random prompt: {_diff_ci(vs)} "
            f"(paired bootstrap over the {vs.get('n', 'check')} check examples)."]


def calibration_lines(report: dict) -> list[str]:
    """What the user gets and what earned it, first (for the CLI and report.md): the handed-over
    prompt's test accuracy as it answers (with its calibration) and raw, beside zero-shot and the
    median random prompt, each raw and calibrated on the same test examples; then the gain over the
    median raw random prompt split into what calibration earned and what selection added."""
    cal = (report.get("check") or {}).get("calibrated")
    if not cal:
        return []
    room = report.get("headroom")
    headroom = [f"Headroom after calibration: {room['why']}."] if room and room.get("why") else []
    handed = _handed(report)
    n = cal["test_size"]
    method = (handed.get("calibration") or {}).get("method")
    how = f"{method}-calibrated" if method else "raw (no calibration was better)"
    pts = lambda x: f"{100 * x:+.1f}"  # noqa: E731  # points
    return [f"You get: {_title(report, handed.get('name'))}, {how}: test accuracy {_acc_ci(cal['handed'], n)} on "
            f"{n} test examples ({cal['handed_raw']:.3f} raw). On the same examples: zero-shot "
            f"{cal['zero_shot_raw']:.3f} raw, {cal['zero_shot_calibrated']:.3f} batch-calibrated; the median of "
            f"{cal['random_prompts']} random prompts {cal['random_median_raw']:.3f} raw, "
            f"{cal['random_median_calibrated']:.3f} batch-calibrated on the test inputs.",
            f"Of the {pts(cal['gain_over_random_raw'])} points over the median raw random prompt, calibration earns "
            f"{pts(cal['from_calibration'])} (the median calibrated minus the median raw random prompt) and "
            f"selection {pts(cal['from_selection'])} (the prompt handed over minus the median calibrated random "
            "prompt); one order of each prompt, one seed.", *versus_calibrated(handed), *headroom]


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
    lines += calibration_lines(r) + [""] if calibration_lines(r) else []
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

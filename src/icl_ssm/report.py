"""``report``: the results of one run as files a person wants to look at.

:func:`write_report` turns the JSON-serialisable result dict of a run (fidelity of the
compressed cache, one row per selection method, the affinity scores of the pool) into
``report.md`` with tables and embedded plots, ``report.json`` (the dict plus the plot names)
and PNG plots drawn with :class:`matplotlib.figure.Figure` (no pyplot, so no global state and
no display). Every file is written atomically, the plots first and ``report.json`` last, so a
``report.json`` on disk means the whole report is there. Missing or ``None`` values read "—".
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from icl_ssm import atomic
from icl_ssm.evaluate.stats import wilson_interval

DASH = "—"


_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


_FIDELITY_ROWS = (("compressed", ""), ("control", "control_"), ("window", "window_"), ("streaming", "streaming_"),
                  ("lm-infinite", "lm-infinite_"))


_FIDELITY_COLS = (  # (key, header, format)
    ("rel_logit_err", "Relative logit error", ".2%"),
    ("kl", "KL (nats)", ".4f"),
    ("top1_agree", "Top-1 agreement", ".3f"),
    ("subset_loss_spearman", "Subset-loss Spearman", ".3f"),
)


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


def _validate(report: Any) -> None:
    if not isinstance(report, dict):
        raise ValueError(f"report={type(report).__name__}: expected a dict of run results")
    selections = report.get("selections") or []
    if not isinstance(selections, list) or not all(isinstance(s, dict) for s in selections):
        raise ValueError(f"report['selections']={selections!r:.80}: expected a list of dicts, one per method")
    for key in ("affinity_scores", "selected"):
        if report.get(key) is not None and not isinstance(report[key], list):
            raise ValueError(f"report[{key!r}]={report[key]!r:.80}: expected a list or None")
    if report.get("fidelity") is not None and not isinstance(report["fidelity"], dict):
        raise ValueError(f"report['fidelity']={report['fidelity']!r:.80}: expected a dict or None")
    scores, selected = report.get("affinity_scores") or [], report.get("selected") or []
    bad = [i for i in selected if not isinstance(i, int) or (scores and not 0 <= i < len(scores))]
    if bad:
        raise ValueError(f"report['selected'] has {bad[:5]}: expected pool indices in [0, {len(scores)})")


def _fidelity_md(fid: dict | None) -> list[str]:
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
    return lines + [
        "",
        f"- Accuracy: dense prompt {_fmt(fid.get('acc_dense'))}, compressed cache {_fmt(fid.get('acc_compressed'))}",
        f"- FLOPs: dense {format_flops(fd)}, compressed {format_flops(fc)} ({_ratio(fd, fc)})",
        f"- Held-out subsets: {_cell(fid.get('subsets'))}, queries: {_cell(fid.get('queries'))}",
    ]


def _acc_ci(acc: Any, n: Any) -> str:
    """``0.733 [0.66, 0.80]``: an accuracy over ``n`` examples with its Wilson 95% interval."""
    if not (_is_num(acc) and isinstance(n, int) and n > 0):
        return _fmt(acc)
    lo, hi = wilson_interval(round(acc * n), n)
    return f"{acc:.3f} [{lo:.2f}, {hi:.2f}]"


def gate_lines(report: dict) -> list[str]:
    """Which evaluator affinity used and why, when it was not the compressed caches."""
    gate = report.get("gate")
    if not gate or gate.get("evaluator") == "compressed" and gate.get("verdict", "compressed") == "compressed":
        return []
    if gate.get("verdict") == "dense" and gate.get("evaluator") == "compressed":
        failed = "; ".join(f"{c['name']}: no, {c['detail']}" for c in gate["checks"] if c.get("passed") is False)
        return [f"Warning: affinity selected on compressed caches that failed their fidelity check ({failed})."]
    return [f"Affinity evaluator: {gate['evaluator']}, because {gate['reason']}."]


def check_lines(report: dict) -> list[str]:
    """What the check against random prompts found, headline first (for the CLI and report.md)."""
    check = report.get("check")
    if not check:
        return []
    if check.get("skipped"):
        return ["Warning: the chosen prompt was not checked against random prompts: no held-out validation "
                "examples were left after selection."]
    mine, handed = check["prompts"][check["preferred"]], check["handed_over"]
    accs = [r["accuracy"] for r in check["random"]]
    lo, hi = mine["vs_median_interval"]
    lines = [] if handed["beats_random"] else [f"Warning: {check['preferred']}'s pick is not better than the median "
                                               f"random prompt. {handed['reason']}."]
    if handed["beats_random"] and not handed.get("shown_better", True):
        lines.append(f"Warning: {check['preferred']}'s pick scored above the median random prompt on the "
                     f"{check['check_size']} check examples, but by less than they can tell ({mine['vs_median']:+.3f} "
                     f"[{lo:+.3f}, {hi:+.3f}]): it is not shown to be better than a random prompt of the same size.")
    lines += [
        f"Check on {check['check_size']} held-out examples: {check['preferred']} "
        f"{_acc_ci(mine['accuracy'], check['check_size'])}, above {mine['beats_random']:.0%} of {len(accs)} random "
        f"prompts of the same size (median {check['random_median']:.3f}, range {min(accs):.3f}-{max(accs):.3f}); "
        f"difference from the median random prompt {mine['vs_median']:+.3f} [{lo:+.3f}, {hi:+.3f}] (paired "
        f"bootstrap, 95%); zero-shot {_acc_ci(check['prompts']['zero-shot']['accuracy'], check['check_size'])}.",
        f"Handed over: {handed['name']}, test accuracy {_acc_ci(handed['test_accuracy'], check.get('test_size'))} "
        f"(zero-shot {_acc_ci(check.get('zero_shot_test_accuracy'), check.get('test_size'))}).",
    ]
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
        row += [format_flops(s.get("flops")), _fmt(s.get("wall_seconds"), ".2f"), _cell(s.get("subsets"))]
        if reliable:
            queries = s.get("queries_used") or (s.get("validation_size") if _is_num(s.get("reliability")) else None)
            rel = _fmt(s.get("reliability"), ".2f") if _is_num(s.get("reliability")) else DASH
            if _is_num(s.get("score_reliability")):
                rel += f" / {s['score_reliability']:.2f}"
            row += [_cell(queries), rel]
        if dense:
            row += [format_flops(s.get("dense_flops")), _fmt(s.get("dense_wall_seconds"), ".2f")]
            row.append(_ratio(s.get("dense_flops"), s.get("flops")))
        rows.append(row)
    return _table(header, rows)


def _markdown(report: dict, plots: dict[str, str]) -> str:
    r = report
    lines = [f"# {_cell(r.get('model'))} on {_cell(r.get('task'))}, k={_cell(r.get('k'))}", ""]
    lines += gate_lines(r) + [""] if gate_lines(r) else []
    lines += check_lines(r) + [""] if r.get("check") else []
    lines += [f"Seed {_cell(r.get('seed'))}.", "", "## Fidelity of the compressed cache", ""]
    lines += _fidelity_md(r.get("fidelity")) + ["", "## Demonstration selection", ""]
    lines += _selection_md(r.get("selections") or []) + ["", "## Plots", ""]
    for name, file in plots.items():  # one paragraph per image, so each renders on its own line
        lines += [f"![{name}]({file})", ""]
    scores = [s for s in r.get("affinity_scores") or [] if s is not None]
    if r.get("affinity_scores"):
        lines += [f"{len(scores)} of {len(r['affinity_scores'])} pool candidates were sampled and scored."]
    files = [(label, r.get(key)) for label, key in (("Selected", "selected_file"), ("Prompt", "prompt_file"))]
    if r.get("selected") or any(f for _, f in files):
        lines += ["", "## Selected demonstrations", ""]
        lines += [f"- {label}: [{f}]({f})" for label, f in files if f]
        if r.get("selected"):
            lines.append(f"- Pool indices (affinity): {', '.join(map(str, r['selected']))}")
    return "\n".join(lines) + "\n"


def _accuracy_fig(report: dict) -> Figure:
    sel = report.get("selections") or []
    fig = Figure(figsize=(6.4, 3.6), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    names = [str(s.get("method", DASH)) for s in sel]
    acc = [s.get("test_accuracy") if _is_num(s.get("test_accuracy")) else math.nan for s in sel]
    std = [s.get("test_accuracy_std") if _is_num(s.get("test_accuracy_std")) else 0.0 for s in sel]
    bars = ax.bar(range(len(sel)), acc, yerr=std if any(std) else None, capsize=4, color="C0")
    labels = [_fmt(a) if not math.isnan(a) else DASH for a in acc]
    ax.bar_label(bars, labels=labels, padding=3, fontsize=8)
    ax.set_xticks(range(len(sel)), names)
    top = max([1.0] + [a + e for a, e in zip(acc, std) if not math.isnan(a)])
    ax.set_ylim(0, top * 1.12)
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Test accuracy by method ({report.get('task', DASH)}, k={report.get('k', DASH)})")
    return fig


def _cost_fig(report: dict) -> Figure:
    sel = report.get("selections") or []
    fig = Figure(figsize=(6.4, 3.6), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    series = [("selection", "flops", "C0")]
    if any(_is_num(s.get("dense_flops")) for s in sel):
        series.append(("dense evaluator", "dense_flops", "C1"))
    width = 0.8 / len(series)
    positive = [s[k] for s in sel for _, k, _ in series if _is_num(s.get(k)) and s[k] > 0]
    if positive:  # a log axis needs a positive value; 0-FLOP methods (random, BM25) are labelled instead
        ax.set_yscale("log")
        ax.set_ylim(min(positive) / 10, max(positive) * 30)
    else:
        ax.set_yticks([])  # nothing measured: the labels along the bottom say so
    for j, (label, key, color) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(sel))]
        ys = [s.get(key) if _is_num(s.get(key)) and s[key] > 0 else math.nan for s in sel]
        ax.bar(xs, ys, width=width, color=color, label=label)
        for x, y, s in zip(xs, ys, sel):
            if math.isnan(y) and (j == 0 or s.get(key) is not None):  # no bar: write the value along the bottom
                ax.text(x, 0.02, format_flops(s.get(key)), transform=ax.get_xaxis_transform(), ha="center", fontsize=7)
            elif not math.isnan(y):
                ax.text(x, y * 1.3, format_flops(y), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(sel)), [str(s.get("method", DASH)) for s in sel])
    ax.set_ylabel("FLOPs")
    ax.set_title("Selection cost")
    if len(series) > 1:
        ax.legend(fontsize=8)
    return fig


def _affinity_fig(report: dict) -> Figure:
    all_scores = report["affinity_scores"]
    scores = [s for s in all_scores if _is_num(s)]
    picked = [all_scores[i] for i in report.get("selected") or [] if _is_num(all_scores[i])]
    fig = Figure(figsize=(6.4, 3.6), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    ax.hist(scores, bins=max(5, min(40, round(math.sqrt(len(scores))))), color="C0", edgecolor="white", label="pool")
    for j, s in enumerate(picked):
        ax.axvline(s, color="C3", lw=1, alpha=0.8, label=f"selected ({len(picked)})" if j == 0 else None)
    ax.set_xlabel("affinity score")
    ax.set_ylabel("candidates")
    ax.set_title(f"Affinity of the {len(scores)} sampled of {len(all_scores)} pool candidates")
    ax.legend(fontsize=8)
    return fig


def _save_png(fig: Figure, path: Path) -> Path:
    return atomic.write_with(path, lambda f: fig.savefig(f, format="png"))


def write_report(out: str | Path, report: dict) -> dict[str, Path]:
    """Write ``report.md``, ``report.json`` and the PNG plots of ``report`` into directory ``out``.

    ``report`` holds ``model, task, k, seed``, optional ``fidelity`` (dict), ``selections``
    (one dict per method, in display order), optional ``affinity_scores`` (one float or None
    per pool candidate), ``selected`` (pool indices) and ``prompt_file``/``selected_file``.
    ``affinity.png`` is drawn only when some affinity score is present. ``report`` itself is
    not modified. Returns ``{"markdown", "json", "accuracy", "cost"[, "affinity"]} -> Path``.
    """
    _validate(report)
    out = atomic.prepare_dir(out, what="report directory")
    figures = {"accuracy": _accuracy_fig, "cost": _cost_fig}
    if any(_is_num(s) for s in report.get("affinity_scores") or []):
        figures["affinity"] = _affinity_fig
    plots = {name: f"{name}.png" for name in figures}
    # Serialise before writing anything, so that a non-JSON value leaves no partial report.
    json_text = json.dumps({**report, "plots": plots}, indent=1) + "\n"
    written = {name: _save_png(draw(report), out / plots[name]) for name, draw in figures.items()}
    written["markdown"] = atomic.write_text(out / "report.md", _markdown(report, plots))
    written["json"] = atomic.write_text(out / "report.json", json_text)
    return written

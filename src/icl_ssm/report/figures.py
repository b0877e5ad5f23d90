"""The report's figures, each a :class:`matplotlib.figure.Figure` (no pyplot): ``accuracy.png``
(:func:`_accuracy_fig`, which prompt is best on the test split against the random prompts'
spread and zero-shot) and ``cost.png`` (:func:`_cost_fig`, each method's accuracy against its
selection cost); the handed-over prompt in :data:`HANDED` in both."""

from __future__ import annotations

import statistics
import textwrap
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from icl_ssm.report.values import (
    DASH,
    ZERO_SHOT,
    _acc_ci,
    _flops_counted,
    _handed,
    _is_num,
    _methods,
    _test_size,
    _title,
    _wilson,
    _zero_shot,
)

HANDED = "C3"  # the handed-over prompt's colour in every figure
_PALETTE = tuple(f"C{i}" for i in range(10) if i != 3)  # method colours: every tab10 colour but HANDED's
_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*")


def _wrap(text: str, width: int = 30) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def _about(report: dict) -> str:
    size = _test_size(report)
    on = f", {size} test examples" if isinstance(size, int) else ""
    return f"{report.get('task', DASH)}, k={report.get('k', DASH)}, {report.get('model', DASH)}{on}"


def _zero_shot_key(zero: float, handed: str | None) -> tuple[str, Line2D]:
    """Zero-shot's reference line: its colour (:data:`HANDED` where zero-shot was handed over)
    and its legend entry."""
    colour = HANDED if handed == ZERO_SHOT else "0.45"
    return colour, Line2D([], [], ls="--", color=colour,
                          label=f"zero-shot {zero:.3f}" + (", handed over" if handed == ZERO_SHOT else ""))


def _method_rows(ax: Any, rows: list[dict], handed: str | None, size: Any) -> tuple[list[str], list[str]]:
    """One row per method on ``ax`` (row ``y`` for the ``y``-th method): its test accuracy with a
    Wilson 95% interval where the test size is known. Returns the rows' names (left) and values
    (right)."""
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
    return names, right


def _random_row(ax: Any, y: int, randoms: list[tuple[int, float]], handed: str | None) -> tuple[str, str, bool]:
    """The random prompts' test accuracies (``(i, accuracy)`` of ``random-i``) as a strip on row
    ``y``, their range as a bar and their median as a tick; a handed-over one in :data:`HANDED`.
    Returns the row's name, its value and whether one of them was handed over."""
    accs = sorted(a for _, a in randoms)
    median = statistics.median(accs)
    ax.hlines(y, accs[0], accs[-1], color="0.8", lw=5, zorder=1)
    jitter = [((j * 0.618034) % 1 - 0.5) * 0.44 for j in range(len(randoms))]  # spread, deterministic
    ax.scatter([a for _, a in randoms], [y + d for d in jitter], s=14, color="0.35", zorder=2)
    ax.plot(median, y, marker="|", ms=18, mew=2.5, color="black", zorder=3)
    picked = [(a, y + d) for (i, a), d in zip(randoms, jitter) if handed == f"random-{i}"]
    if picked:
        ax.scatter(*zip(*picked), s=60, color=HANDED, zorder=4)
    value = f"median {median:.3f}, {accs[0]:.3f}-{accs[-1]:.3f}" + (", one handed over" if picked else "")
    return f"random prompts ({len(randoms)})", value, bool(picked)


def _accuracy_key(ax: Any, report: dict, handed: str | None, randoms: bool) -> list[Line2D]:
    """The accuracy figure's legend entries, and zero-shot's line on ``ax`` where it was measured."""
    handles = [Line2D([], [], color="C0", marker="o", ls="", label="a method's pick, Wilson 95% interval")]
    if randoms:
        handles += [Line2D([], [], color="0.35", marker="o", ms=4, ls="", label="a random prompt; | their median")]
    zero = _zero_shot(report)
    if _is_num(zero):
        colour, line = _zero_shot_key(zero, handed)
        ax.axvline(zero, ls="--", color=colour, zorder=0)
        handles.append(line)
    if handed:
        handles.append(Line2D([], [], color=HANDED, marker="o", ms=7, ls="", label="handed over (prompt.txt)"))
    return handles


def _row_labels(ax: Any, names: list[str], right: list[str], marked: list[bool]) -> None:
    """Each row's name on the left of ``ax`` and its value on the right (a twin axes), the first
    row on top; the ``marked`` row's labels in bold :data:`HANDED`."""
    ticks = list(range(len(names)))
    ax.set_yticks(ticks, names, fontsize=8)
    ax.set_ylim(max(len(names), 1) - 0.5, -0.5)  # the first method on top
    twin = ax.twinx()
    twin.set_ylim(ax.get_ylim())
    twin.set_yticks(ticks, right, fontsize=8)
    twin.tick_params(length=0)
    for side in (ax.get_yticklabels(), twin.get_yticklabels()):
        for label, mine in zip(side, marked):
            if mine:
                label.set_color(HANDED)
                label.set_fontweight("bold")


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
    names, right = _method_rows(ax, rows, handed, size)
    marked = [s.get("name") == handed for s in rows]  # the row to colour: a method, or the random prompts
    if randoms:
        name, value, picked = _random_row(ax, len(rows), randoms, handed)
        names.append(name)
        right.append(value)
        marked.append(picked)
    handles = _accuracy_key(ax, report, handed, bool(randoms))
    if not count:
        ax.text(0.5, 0.5, "no test accuracy", transform=ax.transAxes, ha="center", va="center", color="0.4")
        ax.set_xlim(0, 1)
    _row_labels(ax, names, right, marked)
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


def _seconds(s: dict) -> tuple[Any, str]:
    """A method's selection cost in wall seconds, or None and why it is not plotted."""
    x = s.get("wall_seconds")
    return (x, "") if _is_num(x) and x > 0 else (None, "0 s" if x == 0 else "no time recorded")


def _flops(s: dict) -> tuple[Any, str]:
    """A method's selection cost in FLOPs, or None and why it is not plotted."""
    if not _flops_counted(s):
        return None, "FLOPs not counted"
    return (s["flops"], "") if s["flops"] > 0 else (None, "0 FLOP")


def _cost_point(ax: Any, s: dict, x: Any, style: tuple[str, str], mine: bool, size: Any) -> tuple[Any, Any, Any]:
    """Method ``s`` at (``x``, its test accuracy) with its Wilson 95% interval, in ``style``
    (colour, marker), and its label beside it (placed later, :func:`_place_labels`); the
    handed-over one (``mine``) ringed in :data:`HANDED`. Returns (errorbar, ring or None, label)."""
    title = str(s.get("method") or s.get("name") or DASH)
    acc, (colour, marker) = s["test_accuracy"], style
    ci = _wilson(acc, s.get("test_size") or size)
    err = None if ci is None else [[acc - ci[0]], [ci[1] - acc]]
    mark = ax.errorbar(x, acc, yerr=err, fmt=marker, color=colour, ms=7, capsize=2, elinewidth=0.8, zorder=3,
                       label=title)
    ring = None
    if mine:
        ring = ax.scatter([x], [acc], s=320, facecolors="none", edgecolors=HANDED, linewidths=2, zorder=4,
                          label=f"handed over: {title}")
    ann = ax.annotate(_wrap(title + (" (handed over)" if mine else ""), 24), (x, acc), xytext=(7, 0),
                      textcoords="offset points", va="center", fontsize=7, color=HANDED if mine else colour,
                      fontweight="bold" if mine else None,
                      arrowprops=dict(arrowstyle="-", color="0.6", lw=0.5, shrinkA=0, shrinkB=5))
    ann.set_in_layout(False)  # placed after the layout (_place_labels)
    return mark, ring, ann


def _cost_panel(ax: Any, report: dict, rows: list[dict], cost: Any, label: str, styles: dict,
                marks: dict) -> tuple[list, Any]:
    """One panel of :func:`_cost_fig`: each row whose ``cost`` is known at (cost, accuracy), on a
    log x axis; the rows left out named under the x label ``label``. ``styles`` and ``marks`` are
    keyed by ``id(row)``: the row's (colour, marker), and its errorbar (filled in here, for the
    legend of a crowded figure). Returns the labels beside the points and the handed-over ring
    (None where the handed-over prompt is not in this panel)."""
    handed, size = _handed(report).get("name"), _test_size(report)
    left_out: dict[str, list[str]] = {}
    anns, ring = [], None
    for s in rows:
        x, why = cost(s)
        if x is None:
            left_out.setdefault(why, []).append(str(s.get("method") or s.get("name") or DASH))
            continue
        marks[id(s)], mine_ring, ann = _cost_point(ax, s, x, styles[id(s)], s.get("name") == handed, size)
        ring = mine_ring if mine_ring is not None else ring
        anns.append(ann)
    if anns:
        ax.set_xscale("log")
        ax.margins(x=0.2, y=0.08)
    else:
        ax.text(0.5, 0.5, "nothing to plot", transform=ax.transAxes, ha="center", va="center", color="0.4")
    note = "; ".join(f"{', '.join(names)} ({why})" for why, names in left_out.items())
    ax.set_xlabel(label + ("\n" + textwrap.fill("not shown: " + note, 60) if note else ""), fontsize=9)
    ax.grid(alpha=0.3)
    return anns, ring


def _cost_key(axes: Any, report: dict, ring: Any) -> list:
    """The cost figure's legend entries (zero-shot, the handed-over prompt), and zero-shot's line
    on each of ``axes`` where it was measured."""
    handed, zero = _handed(report).get("name"), _zero_shot(report)
    legend = []
    if _is_num(zero):
        colour, line = _zero_shot_key(zero, handed)
        for ax in axes:
            ax.axhline(zero, ls="--", color=colour, zorder=0)
        legend.append(line)
    if ring is not None:
        legend.append(ring)
    elif handed and handed != ZERO_SHOT:  # a random prompt: no selection cost to place it at
        legend.append(Line2D([], [], ls="", label=f"handed over: {_title(report, handed)} (see accuracy.png)"))
    return legend


def _cost_fig(report: dict) -> Figure:
    """Test accuracy against the selection's cost, in wall seconds and in FLOPs (log axes), each
    method labelled beside its point; a method whose cost is missing, 0 or not counted is left out
    of that panel and named in its note."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rows = [s for s in _methods(report) if _is_num(s.get("test_accuracy"))]
    fig = Figure(figsize=(9.0, 4.8 + 0.15 * max(0, len(rows) - 8)), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)  # a renderer, to place the labels
    axes = fig.subplots(1, 2, sharey=True)
    styles = {id(s): (_PALETTE[i % len(_PALETTE)], _MARKERS[(i // len(_PALETTE) + i) % len(_MARKERS)])
              for i, s in enumerate(rows)}
    ring, labels, marks = None, [], {}  # marks: a handle per method, for the legend of a crowded figure
    for ax, cost, label in ((axes[0], _seconds, "selection wall time (s, log)"),
                            (axes[1], _flops, "selection FLOPs (log)")):
        anns, panel_ring = _cost_panel(ax, report, rows, cost, label, styles, marks)
        ring = panel_ring if panel_ring is not None else ring
        labels.append((ax, anns))
    legend = _cost_key(axes, report, ring)
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


def _calibration_fig(report: dict) -> Figure:
    """Does the handed-over prompt beat what a user would have done anyway? Two rows, raw answers
    and calibrated ones: the random prompts' test accuracies as a strip, their median as a tick,
    zero-shot as a diamond, and the handed-over prompt (as it answers, on the calibrated row, and
    raw) in :data:`HANDED` with its Wilson 95% interval."""
    check = report.get("check") or {}
    cal = check.get("calibrated") or {}
    randoms = check.get("random") or []
    handed = _handed(report)
    n = cal.get("test_size")
    fig = Figure(figsize=(7.5, 3.2), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    rows = (("raw answers", "test_accuracy", cal.get("handed_raw"), cal.get("zero_shot_raw")),
            ("calibrated", "calibrated_test_accuracy", cal.get("handed"), cal.get("zero_shot_calibrated")))
    for y, (_, key, mine, zero) in enumerate(rows):
        accs = [r[key] for r in randoms if _is_num(r.get(key))]
        ax.scatter(accs, [y] * len(accs), s=28, color="0.55", alpha=0.8, zorder=2,
                   label="random prompts" if y == 0 else None)
        if accs:
            ax.plot([statistics.median(accs)] * 2, [y - 0.22, y + 0.22], color="0.25", lw=2, zorder=3,
                    label="their median" if y == 0 else None)
        if _is_num(zero):
            ax.scatter([zero], [y], marker="D", s=52, color="C0", zorder=4, label="zero-shot" if y == 0 else None)
        if _is_num(mine):
            ci = _wilson(mine, n)
            if ci is not None:
                ax.plot(ci, [y + 0.3] * 2, color=HANDED, lw=2, zorder=4)
            ax.scatter([mine], [y + 0.3], marker="*", s=170, color=HANDED, zorder=5,
                       label="handed over (95% interval)" if y == 1 else None)
    ax.set_yticks([0, 1], [r[0] for r in rows])
    ax.set_ylim(-0.6, 1.7)
    ax.set_xlabel("test accuracy")
    ax.grid(axis="x", alpha=0.3)
    method = (handed.get("calibration") or {}).get("method")
    ax.set_title(f"Handed over: {_title(report, handed.get('name'))}, "
                 f"{method + '-calibrated' if method else 'raw'}; beside random prompts and zero-shot\n"
                 f"{_about(report)}", fontsize=9, loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=8, ncols=4, frameon=False)
    return fig

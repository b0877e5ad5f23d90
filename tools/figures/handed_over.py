"""Draw docs/handed-over.png: does the prompt ``icl-ssm run`` hands over beat a random prompt or zero-shot?

One row per pre-registered trust run (``docs/results/trust-search/*.json``, and, when stored,
``docs/results/trust-calibrated/*.json``, any number of runs): the 16 plain random prompts' test
accuracies as a strip over their box, their median as a tick, zero-shot as a diamond and the
handed-over prompt as a star, with how many of the random prompts it is at or above (in correct test
answers, a tie counting as at). In the calibrated evaluation the handed-over prompt answers
calibrated, so it is set beside calibrated random prompts and calibrated zero-shot, and the median
raw random prompt (what pasting a random prompt gives) is marked too.

    .venv/bin/python tools/figures/handed_over.py            # after new records land in docs/results/

Reads JSON only: it runs no model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from icl_ssm.atomic import write_with  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/claim_tables/
from claim_tables.trust_calibrated import at_or_above  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "handed-over.png"
HANDED = "C3"  # the handed-over prompt's colour, as in run's report figures
ZERO = "C0"
TASKS = {"rotten_tomatoes": "Rotten Tomatoes", "cr": "CR", "coin_flip": "coin flip"}
ORDER = tuple(TASKS)
# (folder, panel title, prefix of the random prompts, zero-shot row): the prompts the handed-over one is set beside
EVALUATIONS = (
    ("trust-search", "whole-prompt search, raw answers (run --calibrate none)", "plain-", "zero-shot"),
    ("trust-calibrated", "calibrated search (run's default)", "calibrated plain-", "calibrated zero-shot"),
)


def load_runs(folder: Path) -> list[dict]:
    """The trust runs stored in ``folder``, by task (as :data:`ORDER`) then seed; none when it is absent."""
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return sorted(runs, key=lambda r: (ORDER.index(r["task"]) if r["task"] in ORDER else len(ORDER), r["task"],
                                       r["seed"]))


def accuracy(run: dict, name: str) -> float | None:
    """A prompt's test accuracy from its stored answers (``prompts_on_test``), in %."""
    row = (run.get("prompts_on_test") or {}).get(name)
    return None if row is None else 100 * statistics.fmean(row["correct"])


def accuracies(run: dict, prefix: str) -> list[float]:
    return [accuracy(run, n) for n in run["prompts_on_test"] if n.startswith(prefix) and n[len(prefix):].isdigit()]


def draw(panels: list[tuple[str, list[dict], str, str]]) -> Figure:
    """``panels``: (title, runs, random-prompt prefix, zero-shot row) each; a panel without runs is left out."""
    panels = [p for p in panels if p[1]]
    rows = sum(len(runs) for _, runs, _, _ in panels)
    fig = Figure(figsize=(8.0, 1.7 + 0.34 * rows + 0.45 * len(panels)), dpi=110, layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [len(runs) + 0.6 for _, runs, _, _ in panels]})[:, 0]
    calibrated = False
    for ax, (title, runs, prefix, zero_row) in zip(axes, panels, strict=True):
        labels = []
        for y, run in enumerate(runs):
            accs = accuracies(run, prefix)
            ax.boxplot([accs], positions=[y], orientation="horizontal", widths=0.55, whis=(0, 100),
                       showfliers=False, patch_artist=True, medianprops={"color": "black", "lw": 2},
                       boxprops={"facecolor": "0.9", "edgecolor": "0.6"}, whiskerprops={"color": "0.6"},
                       capprops={"color": "0.6"})
            jitter = [((j * 0.618034) % 1 - 0.5) * 0.4 for j in range(len(accs))]
            ax.scatter(accs, [y + d for d in jitter], s=10, color="0.45", zorder=2)
            if prefix != "plain-":  # what pasting a random prompt, uncalibrated, gives
                calibrated = True
                ax.scatter([statistics.median(accuracies(run, "plain-"))], [y], marker="o", s=60,
                           facecolors="none", edgecolors="0.2", linewidths=1.4, zorder=3)
            zero = accuracy(run, zero_row)
            if zero is not None:
                ax.scatter([zero], [y], marker="D", s=42, color=ZERO, zorder=4)
            ax.scatter([accuracy(run, "handed-over")], [y], marker="*", s=230, color=HANDED,
                       edgecolors="white", linewidths=0.6, zorder=5)
            kind = "plain" if prefix == "plain-" else "calibrated_plain"
            ax.annotate(f"{at_or_above(run, kind)} of {len(accs)}", (1.0, y), xycoords=("axes fraction", "data"),
                        xytext=(6, 0), textcoords="offset points", va="center", fontsize=8.5,
                        color=HANDED, fontweight="bold")
            labels.append(f"{TASKS.get(run['task'], run['task'])}, seed {run['seed']}")
        ax.set_yticks(range(len(runs)), labels, fontsize=8.5)
        ax.set_ylim(len(runs) - 0.4, -0.6)  # first run at the top
        seeds = sorted({r["seed"] for r in runs})
        seen = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}"
        ax.set_title(f"{title}: {len(runs)} run{'s' * (len(runs) != 1)}, {seen}", fontsize=9.5, loc="left")
        ax.annotate("star at or\nabove", (1.0, 1.0), xycoords="axes fraction", xytext=(6, 2),
                    textcoords="offset points", va="bottom", fontsize=7, color="0.3")
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8.5)
    first = panels[0][1][0]
    axes[-1].set_xlabel(f"test accuracy (%), {first['test_size']} test examples per run", fontsize=9)
    key = [Line2D([], [], marker="*", ls="", ms=13, color=HANDED, label="the prompt icl-ssm run hands over"),
           Line2D([], [], marker="o", ls="", ms=4, color="0.45", label="16 random prompts (box: their range, "
                  "quartiles, median)"),
           Line2D([], [], marker="D", ls="", ms=6, color=ZERO, label="zero-shot")]
    if calibrated:
        key.append(Line2D([], [], marker="o", ls="", ms=7, mfc="none", mec="0.2",
                          label="median raw random prompt (calibrated panel)"))
    fig.legend(handles=key, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    model = (first.get("config") or {}).get("model", "the model")
    fig.suptitle(f"Does the handed-over prompt beat a random prompt or zero-shot?\n{model}, k = {first['k']}, "
                 "unseen seeds, pre-registered; the calibrated panel compares calibrated prompts",
                 fontsize=10)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results", help="the records' folder")
    parser.add_argument("--out", type=Path, default=OUT, help="the PNG to write")
    args = parser.parse_args(argv)
    panels = [(title, load_runs(args.results / folder), prefix, zero) for folder, title, prefix, zero in EVALUATIONS]
    if not any(runs for _, runs, _, _ in panels):
        print(f"handed_over: no trust records under {args.results}", file=sys.stderr)
        return 1
    fig = draw(panels)
    write_with(args.out, lambda f: fig.savefig(f, format="png"))
    print(f"handed_over: wrote {args.out} ({sum(len(r) for _, r, _, _ in panels)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

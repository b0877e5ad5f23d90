"""Draw docs/how-it-works.png: the data flow of icl-ssm (run: python docs/figures/how_it_works.py)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "how-it-works.png"

SELECT, DISTILL, DENSE = "#dbe9f6", "#fbe5d6", "#e2efda"


def box(ax, x, y, w, h, text, color, bold_first=True):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=color, ec="#444444", lw=1.0))
    lines = text.split("\n")
    ax.text(x + w / 2, y + h / 2 + 0.12 * (len(lines) - 1) / 2 * 1.6, lines[0], ha="center", va="center",
            fontsize=9.5, weight="bold" if bold_first else "normal")
    for i, line in enumerate(lines[1:], start=1):
        ax.text(x + w / 2, y + h / 2 + 0.12 * (len(lines) - 1) / 2 * 1.6 - 0.2 * i, line,
                ha="center", va="center", fontsize=8.2, color="#222222")


def arrow(ax, start, end, text=None, dashed=False, offset=(0, 0.1)):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, lw=1.1,
                                 color="#333333", linestyle="--" if dashed else "-"))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text,
                ha="center", va="bottom", fontsize=7.8, color="#333333", style="italic")


def main() -> None:
    fig, ax = plt.subplots(figsize=(12, 4.6))
    ax.set_xlim(0, 12)
    ax.set_ylim(0, 4.6)
    ax.axis("off")

    # Once per (model, task, k): distil the compressor from the teacher (icl-ssm distill).
    ax.text(0.1, 4.4, "once per model, task and k:  icl-ssm distill", fontsize=9, weight="bold", color="#8a4b14")
    box(ax, 0.1, 3.05, 3.0, 1.1, "Teacher pass\ndense prompts of k demonstrations:\nK/V, answers, hidden states",
        DENSE)
    box(ax, 3.9, 3.05, 3.3, 1.1, "Train the compressor\nstage 1: align K/V; stage 2: answer\nKL + hidden states + ranking term",
        DISTILL)
    arrow(ax, (3.1, 3.6), (3.9, 3.6), "targets")

    # Per selection: Algorithm 2 on compressed caches (icl-ssm select).
    ax.text(0.1, 2.55, "per selection:  icl-ssm select  (Algorithm 2)", fontsize=9, weight="bold", color="#1f4e79")
    box(ax, 0.1, 0.9, 1.9, 1.3, "Candidate pool\nn examples\nsample M subsets\nof k each", SELECT)
    box(ax, 2.45, 0.9, 2.35, 1.3,
        "Compress each subset\nembeddings, frozen\nHiPPO-LegS scan, head:\nvirtual K/V, no prefill", SELECT)
    box(ax, 5.25, 0.9, 2.05, 1.3, "Compressed cache\n4 sinks + gated virtual\ntokens + last tokens\nexact (36-148 slots)",
        SELECT)
    box(ax, 7.75, 0.9, 2.0, 1.3, "Score the subset\nthe transformer answers\nvalidation queries\nafter the cache: loss", SELECT)
    box(ax, 10.2, 0.9, 1.7, 1.3, "Choose k\ncandidate score:\nmean or ridge over\nits subsets; order", SELECT)
    arrow(ax, (2.0, 1.55), (2.45, 1.55))
    arrow(ax, (4.8, 1.55), (5.25, 1.55))
    arrow(ax, (7.3, 1.55), (7.75, 1.55))
    arrow(ax, (9.75, 1.55), (10.2, 1.55))
    arrow(ax, (5.55, 3.05), (4.2, 2.2), "trained weights", dashed=True, offset=(1.0, -0.12))

    ax.text(10.2, 0.55, "selected.jsonl, prompt.txt", fontsize=8.2, color="#222222")
    ax.text(0.1, 0.2, "The dense evaluator (--evaluator dense) scores the same subsets from the full prompt instead: "
            "the reference the compressed path is measured against.", fontsize=8.2, color="#444444")
    fig.savefig(OUT, dpi=110, bbox_inches="tight")
    print(OUT)


if __name__ == "__main__":
    main()

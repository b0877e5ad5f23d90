"""Paired comparisons across two fidelity reports of the same held-out subsets and queries.

    python research/join_reports.py BASE.json OTHER.json --name NAME [--json OUT]

Two ``icl-ssm fidelity --json`` runs with the same task, k, seed and queries draw the same
subsets in the same order, so the first ``n`` subsets of the longer run are the shorter run's.
This joins them on those ``n`` subsets: every path of BASE, plus OTHER's ``compressed`` path
(under NAME) and its ``also`` paths. It refuses reports whose task, k, seed, queries or subset
ids differ, and reports how far the dense and comparator losses that both runs computed apart
(the same model on the same machine gives 0). Then it prints, per trained path, its Spearman
with the dense losses [95% interval over subsets], and the paired differences against the
comparators and BASE's ``compressed`` path (intervals over subsets; and subsets and queries),
as :func:`icl_ssm.evaluate.stats.paired_spearman` computes them within one run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from icl_ssm import atomic
from icl_ssm.evaluate.stats import COMPARATORS, paired_spearman, spearman, spearman_ci

SAME = ("task", "k", "seed", "queries", "query_offset", "loss")


def join(base: dict, other: dict, name: str) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """``({path: (n, Q) query losses}, {path: max |difference|})`` on the subsets both reports hold."""
    for key in SAME:
        if base.get(key) != other.get(key):
            raise ValueError(f"the reports differ in {key}: {base.get(key)!r} and {other.get(key)!r}")
    n = min(len(base["per_subset"]["ids"]), len(other["per_subset"]["ids"]))
    if base["per_subset"]["ids"][:n] != other["per_subset"]["ids"][:n]:
        raise ValueError("the reports' subsets differ: not the same draw")
    ours = {p: np.asarray(v, dtype=np.float64)[:n] for p, v in base["per_subset"]["query_loss"].items()}
    theirs = {p: np.asarray(v, dtype=np.float64)[:n] for p, v in other["per_subset"]["query_loss"].items()}
    if name in ours:
        raise ValueError(f"--name {name!r} is already a path of BASE; choose another")
    drift = {p: float(np.abs(ours[p] - theirs[p]).max()) for p in ("dense", *COMPARATORS) if p in ours and p in theirs}
    joined = dict(ours)
    joined[name] = theirs["compressed"]
    for p, x in theirs.items():
        if p not in ("dense", "compressed", *COMPARATORS):
            joined[p if p not in joined else f"{name}:{p}"] = x
    return joined, drift


def table(losses: dict[str, np.ndarray]) -> tuple[list[str], dict]:
    """Markdown rows and the paired differences of every trained path."""
    dense = losses["dense"]
    paired = paired_spearman(torch.from_numpy(dense), {p: torch.from_numpy(x) for p, x in losses.items()})
    rows = ["| path | Spearman vs dense [95% CI] | minus control [paired: subsets; and queries] | "
            "minus `compressed` [paired] |", "|---|---:|---:|---:|"]
    for p, x in losses.items():
        if p == "dense":
            continue
        rho = spearman(dense.mean(1), x.mean(1))
        lo, hi = spearman_ci(dense.mean(1), x.mean(1))
        cells = [f"{rho:.2f} [{lo:.2f}, {hi:.2f}]"]
        for b in ("control", "compressed"):
            d = paired.get(f"{p}-{b}")
            cells.append("—" if d is None else f"{d['diff']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}; "
                         f"{d['ci95_queries'][0]:+.2f}, {d['ci95_queries'][1]:+.2f}]")
        rows.append(f"| {p} | " + " | ".join(cells) + " |")
    return rows, paired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("other", type=Path)
    parser.add_argument("--name", required=True, help="the name OTHER's compressed path takes in the join")
    parser.add_argument("--json", type=Path, help="also write the paired differences and the drift here")
    args = parser.parse_args()
    base, other = (json.loads(p.read_text()) for p in (args.base, args.other))
    losses, drift = join(base, other, args.name)
    rows, paired = table(losses)
    n, q = losses["dense"].shape
    print(f"{n} subsets x {q} queries; largest difference between the runs' shared paths: "
          + ", ".join(f"{p} {v:.2g}" for p, v in drift.items()))
    print("\n".join(rows))
    if args.json is not None:
        atomic.write_json(args.json, {"subsets": n, "queries": q, "drift": drift, "paired": paired})


if __name__ == "__main__":
    main()

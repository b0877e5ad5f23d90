"""Which simple facts about a demonstration subset explain its dense loss?

    python research/subset_features.py REPORT.json

REPORT.json: the output of ``icl-ssm fidelity --json`` (its ``per_subset`` section). For a
classification task, prints the Spearman correlation between each subset's dense validation
loss and label statistics of the subset (the share of each label, the label of the last
demonstrations), beside the correlation each evaluated cache path reached, and a
leave-one-out linear fit on the label statistics. A compressor that ranks subsets no better
than "the label of the last demonstration" has not learnt more than that fact.
"""

import json
import sys

import numpy as np

from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import spearman, spearman_ci


def main(path: str) -> None:
    r = json.load(open(path))
    if "per_subset" not in r:
        sys.exit(f"{path}: no per_subset section; rerun icl-ssm fidelity with this version")
    task = get_task(r["config"]["task"])  # as given: a name or a .jsonl path
    splits = split(task, seed=r["seed"])
    labels = sorted({e.target for e in splits.pool})
    if len(labels) > 8:
        sys.exit(f"task {task.name!r} has {len(labels)} distinct targets: label statistics need a classification task")
    ids = r["per_subset"]["ids"]
    dense = np.array(r["per_subset"]["loss"]["dense"])
    lab = np.array([[labels.index(splits.pool[i].target) for i in s] for s in ids], dtype=float)
    share = (lab == 1).mean(1)  # share of the second label (binary tasks: "positive", "yes", ...)
    feats = {
        f"share of {labels[1]!r}": share,
        "imbalance: abs(share - 1/2)": abs(share - 0.5),
        "last label": (lab[:, -1] == 1),
        "last 2 labels": (lab[:, -2:] == 1).mean(1),
        "last 4 labels": (lab[:, -4:] == 1).mean(1),
        "first half's labels": (lab[:, : lab.shape[1] // 2] == 1).mean(1),
    }
    queries = [e.target for e in splits.validation[: r["queries"]]]
    print(f"{r['task']}, k = {r['k']}: {len(ids)} subsets x {r['queries']} queries "
          f"({', '.join(f'{queries.count(x)} {x}' for x in labels)}); dense subset loss std {dense.std(ddof=1):.3f}")
    def row(name: str, x) -> None:
        lo, hi = spearman_ci(np.asarray(x, dtype=float), dense)
        print(f"| {name} | {spearman(x, dense):+.2f} | [{lo:+.2f}, {hi:+.2f}] |")

    print("\n| predictor of the dense subset loss | Spearman | 95% CI (bootstrap over subsets) |\n|---|---:|---:|")
    for name, f in feats.items():
        row(name, f)
    X = np.column_stack([np.ones(len(ids)), share, feats["last label"], feats["last 4 labels"]])
    loo = [X[i] @ np.linalg.lstsq(np.delete(X, i, 0), np.delete(dense, i), rcond=None)[0] for i in range(len(ids))]
    row("leave-one-out linear fit on (share, last label, last 4)", loo)
    for name, losses in r["per_subset"]["loss"].items():
        if name != "dense":
            row(f"cache path: {name}", losses)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Subset rankings of fidelity reports re-read with label-balanced subset losses.

    python research/balanced.py REPORT.json [MORE.json ...] [--rename REPORT.json:OLD=NEW ...]

Each REPORT.json is an ``icl-ssm fidelity --json`` report with per-query losses
(``per_subset.query_loss``). The queries' gold labels come from the report
(``per_subset.query_labels``) or, for reports written before it kept them, from the task's
split (the report's task, seed, ``query_offset`` and ``queries``). Prints, per report, the
dense split-half Spearman (plain and label-stratified) and every path's subset-loss Spearman
with dense, plain and label-balanced (:func:`icl_ssm.evaluate.stats.label_weights`). With several
reports on the same subsets, also the dense agreement between their query sets and each path's
Spearman on the mean of their balanced losses over the query sets (reports on the same query
set are merged, their paths side by side; a path missing from a query set is left out;
``--rename`` gives a path of one report the name it has in another). A report without per-query
losses is read from its per-subset losses when its queries hold every label equally often
(balanced weights are then the plain mean).
"""

import argparse
import json

import numpy as np

from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import label_weights, spearman, spearman_ci, split_half_spearman


def query_labels(report: dict) -> np.ndarray:
    labels = report["per_subset"].get("query_labels")
    if labels is None:
        task = get_task(report["task"])
        if task.kind != "classification":
            raise ValueError(f"{report['task']}: label balance needs a classification task")
        start = report.get("query_offset", 0)
        queries = split(task, seed=report["seed"]).validation[start : start + report["queries"]]
        labels = [task.labels.index(q.target) for q in queries]
    return np.asarray(labels)


def balanced_losses(report: dict) -> dict[str, np.ndarray]:
    """``{path: (S,) label-balanced subset losses}``; the dense path under ``"dense"``."""
    per = report["per_subset"]
    labels = query_labels(report)
    if "query_loss" not in per:
        if len(set(np.bincount(labels)[np.unique(labels)])) != 1:
            raise ValueError("the report has no per-query losses (per_subset.query_loss) and its queries are not "
                             "balanced over the labels: rerun icl-ssm fidelity")
        return {name: np.asarray(v, dtype=np.float64) for name, v in per["loss"].items()}
    w = label_weights(labels)
    return {name: np.asarray(rows, dtype=np.float64) @ w for name, rows in per["query_loss"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--rename", nargs="+", default=[], metavar="REPORT:OLD=NEW")
    args = ap.parse_args()
    reports = [json.load(open(path)) for path in args.reports]
    for item in args.rename:
        path, _, names = item.rpartition(":")
        old, _, new = names.partition("=")
        if path not in args.reports or not new:
            raise ValueError(f"--rename {item!r}: expected REPORT:OLD=NEW with REPORT one of the reports")
        for key in ("loss", "query_loss"):
            per = reports[args.reports.index(path)]["per_subset"]
            if key in per and old in per[key]:
                per[key][new] = per[key].pop(old)
    by_set: dict[tuple[int, int], dict[str, np.ndarray]] = {}  # (offset, queries) -> {path: balanced losses}
    for path, r in zip(args.reports, reports):
        per, labels = r["per_subset"], query_labels(r)
        print(f"{path}: {r['subsets']} subsets x {r['queries']} queries from {r.get('query_offset', 0)}, "
              f"labels {np.bincount(labels).tolist()}")
        if "query_loss" in per:
            dense = np.asarray(per["query_loss"]["dense"])
            print(f"  dense split half plain {split_half_spearman(dense):.2f}, "
                  f"stratified + balanced {split_half_spearman(dense, labels):.2f}")
        bal = balanced_losses(r)
        for name in bal:
            if name != "dense":
                plain = spearman(np.asarray(per["loss"]["dense"]), np.asarray(per["loss"][name]))
                print(f"  {name:20s} plain {plain:6.3f}  balanced {spearman(bal['dense'], bal[name]):6.3f}")
        # reports on the same queries: their paths side by side, the first report's dense path
        by_set.setdefault((r.get("query_offset", 0), r["queries"]), {"dense": bal["dense"]}).update(
            {name: v for name, v in bal.items() if name != "dense"})
    pooled = list(by_set.values())
    if len(pooled) > 1:
        if any(r["per_subset"]["ids"] != reports[0]["per_subset"]["ids"] for r in reports):
            raise ValueError("the reports cover different subsets: pooling needs the same subsets (same --seed, "
                             "--subsets and --k)")
        print("dense agreement between the query sets (balanced):",
              " ".join(f"{spearman(pooled[0]['dense'], b['dense']):.2f}" for b in pooled[1:]))
        names = set.intersection(*(set(b) for b in pooled)) - {"dense"}
        mean = {name: np.mean([b[name] for b in pooled], 0) for name in names | {"dense"}}
        for name in sorted(names):
            lo, hi = spearman_ci(mean["dense"], mean[name])
            print(f"  {name:20s} all query sets, balanced {spearman(mean['dense'], mean[name]):6.3f} "
                  f"[{lo:.2f}, {hi:.2f}]")


if __name__ == "__main__":
    main()

"""How the subsets' ranking firms up with more validation queries, and whether Spearman-Brown
predicted it.

    python research/reliability.py REPORT.json [--counts 16 32 48 64 96] [--base 32]

REPORT.json is an ``icl-ssm bench select-quality --json-out`` report whose affinity runs kept
their per-query losses (``query_losses``; ``query_labels`` when the losses are label-balanced).
For each (task, seed) and each affinity run, on the first q validation queries for every q of
``--counts``: the split-half Spearman of the subset losses, the split-half that Spearman-Brown
predicts for q from the one measured on the first ``--base`` queries, and, for every run beside
the dense evaluator's, the Spearman between its subset losses and the dense ones on the same q
queries and on all of them. Prints a markdown table.
"""

import argparse
import json

import numpy as np

from icl_ssm.evaluate.stats import label_weights, spearman, spearman_brown, split_half_spearman


def subset_loss(q: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
    """(S, Q) per-query losses -> (S,) subset losses, label-balanced when ``labels`` are given."""
    return q.mean(1) if labels is None else q @ label_weights(labels)


def curve(run: dict, dense: dict | None, counts: list[int], base: int) -> list[dict]:
    q = np.asarray(run["query_losses"], dtype=np.float64)
    labels = None if run.get("query_labels") is None else np.asarray(run["query_labels"])
    d = None if dense is None else np.asarray(dense["query_losses"], dtype=np.float64)
    base_half = split_half_spearman(q[:, :base], None if labels is None else labels[:base])
    rows = []
    for n in (c for c in counts if c <= q.shape[1]):
        lab = None if labels is None else labels[:n]
        row = {"queries": n, "split_half": split_half_spearman(q[:, :n], lab),
               "predicted": spearman_brown(base_half, n / base)}
        if d is not None:
            row["vs_dense"] = spearman(subset_loss(q[:, :n], lab), subset_loss(d[:, :n], lab))
            row["vs_dense_all"] = spearman(subset_loss(q[:, :n], lab), subset_loss(d, labels))
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--counts", type=int, nargs="+", default=[16, 32, 48, 64, 96])
    ap.add_argument("--base", type=int, default=32, help="queries whose split-half the predictions start from")
    args = ap.parse_args()
    runs = [r for r in json.load(open(args.report))["runs"]
            if r["method"].startswith("affinity") and r.get("query_losses")]
    if not runs:
        raise SystemExit(f"{args.report}: no affinity run kept its per-query losses (query_losses)")
    f = lambda v: "—" if v is None or not np.isfinite(v) else f"{v:.2f}"  # noqa: E731
    print("| task | seed | method | queries | split-half | predicted from the first "
          f"{args.base} | Spearman vs dense, same queries | vs dense, all queries |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in runs:
        dense = next((x for x in runs if x["method"] == "affinity:dense" and x["task"] == r["task"]
                      and x["seed"] == r["seed"]), None)
        for row in curve(r, None if dense is r else dense, args.counts, args.base):
            print(f"| {r['task']} | {r['seed']} | {r['method']} | {row['queries']} | {f(row['split_half'])} | "
                  f"{f(row['predicted'])} | {f(row.get('vs_dense'))} | {f(row.get('vs_dense_all'))} |")


if __name__ == "__main__":
    main()

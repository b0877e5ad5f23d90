"""`--order search` measured on recorded selections: does the order with the lowest dense
validation loss score better on the test set than the other orders of the same set?

    python research/order_search.py REPORT ORDERS_REPORT OUT [--queries 32] [--candidates 10]

REPORT is a `bench select-quality --json-out` file and ORDERS_REPORT the `bench select-order
--orders score interleave random --permutations P --json-out` file made from it, with
P = candidates - 2: its rows hold the test accuracy of exactly the orders `icl_ssm.select.order.search_order`
draws (the same generator, `order_rng(seed)`), so only the validation losses are computed here
(one dense prompt per candidate order, the first `--queries` validation queries). OUT gets, per
selection, every candidate's order, indices, validation loss and test accuracy, and the one the
search chose; a summary is printed.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from icl_ssm import atomic
from icl_ssm.compress.builders import DenseCache
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.base import order_rng
from icl_ssm.select.order import search_order
from icl_ssm.select.subset_losses import CacheEvaluator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("orders_report")
    ap.add_argument("out")
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("--candidates", type=int, default=10)
    args = ap.parse_args()
    report = json.load(open(args.report))
    orders = json.load(open(args.orders_report))
    if orders.get("permutations", 1) < args.candidates - 2:
        raise SystemExit(f"{args.orders_report}: {orders.get('permutations', 1)} random orders per selection, "
                         f"--candidates {args.candidates} needs {args.candidates - 2}")
    model, tokenizer = load_model(report["model"])
    settings = report["settings"]
    results = []
    for run in report["runs"]:
        task = get_task(run["task"])
        builder = PromptBuilder.for_model(model, tokenizer, task)
        splits = split(task, pool_size=settings["pool_size"], seed=run["seed"])
        dense = CacheEvaluator(model, builder, DenseCache(model), batch=2, query_batch=32, pack=True)
        labels = [splits.pool[i].target for i in run["indices"]]
        t0 = time.perf_counter()
        _, found = search_order(dense, splits.pool, splits.validation[: args.queries], run["indices"], labels,
                                  args.candidates, order_rng(run["seed"]))
        test = {tuple(r["indices"]): r["test_accuracy"] for r in orders["rows"]
                if r["seed"] == run["seed"] and r["method"] == run["method"] and r["task"] == run["task"]}
        for c in found["candidates"]:
            c["test_accuracy"] = test[tuple(c["indices"])]
        results.append({"task": run["task"], "seed": run["seed"], "method": run["method"], **found})
        acc = [c["test_accuracy"] for c in found["candidates"]]
        best = found["candidates"][found["chosen"]]
        print(f"{run['task']} seed {run['seed']} {run['method']}: chosen {best['order']} {acc[found['chosen']]:.3f}, "
              f"mean of the random orders {np.mean(acc[2:]):.3f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    atomic.write_json(args.out, {"queries": args.queries, "candidates": args.candidates, "results": results})
    chosen = np.array([r["candidates"][r["chosen"]]["test_accuracy"] for r in results])
    mean_random = np.array([np.mean([c["test_accuracy"] for c in r["candidates"][2:]]) for r in results])
    print(f"chosen order {100 * chosen.mean():.1f} against the mean random order {100 * mean_random.mean():.1f} "
          f"({int((chosen > mean_random + 1e-9).sum())} better, {int((chosen < mean_random - 1e-9).sum())} worse)")


if __name__ == "__main__":
    main()

"""Which evaluator should rank a prompt's orders? The compressed caches against the dense prompt,
on the orders `--order search` scored in a stored record.

    python research/order_evaluators.py docs/results/order-search-k20-rotten_tomatoes.json OUT \\
        --compressor DIR --control DIR --pool-size 100

The record (`research/order_search.py`) holds, per selection, the candidate orders `--order search`
drew, each order's dense validation loss on the first ``queries`` validation queries and its test
accuracy. Here the same orders are scored on the same queries by each compressed evaluator
(``--compressor``, and ``--control``, its prompt-independent control) with the loss the record used
(unweighted mean NLL, packed queries). Per selection and evaluator: the Spearman between its losses
and the dense ones over the orders, the order it would choose and that order's test accuracy, and
its seconds. ``--verify N`` first recomputes the dense loss of N stored orders and stops if one
differs from the record by more than 1e-3 (the splits or the model are not the record's).
OUT gets every row and a summary; the summary is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from icl_ssm import atomic
from icl_ssm.compress.builders import CompressedCache, DenseCache
from icl_ssm.compress.compressor import load_compressor
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import spearman
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.pipeline import RunConfig
from icl_ssm.provenance import provenance
from icl_ssm.select.subset_losses import CacheEvaluator


def summarize(rows: list[dict], names: list[str]) -> dict:
    """Per evaluator: mean Spearman with the dense losses over the orders, and the test accuracy of the
    order it chooses against the dense choice and the mean random order (orders 2.. of each set)."""
    out = {}
    mean_random = np.array([np.mean(r["test_accuracy"][2:]) for r in rows])
    for name in ["dense", *names]:
        chosen = np.array([r["test_accuracy"][r["chosen"][name]] for r in rows])
        rho = [r["spearman_with_dense"][name] for r in rows] if name != "dense" else []
        out[name] = {
            "chosen_test_accuracy": float(chosen.mean()),
            "minus_mean_random_order": float((chosen - mean_random).mean()),
            "sets_better_than_mean_random": int((chosen > mean_random + 1e-9).sum()),
            "sets_worse_than_mean_random": int((chosen < mean_random - 1e-9).sum()),
            "same_choice_as_dense": int(sum(r["chosen"][name] == r["chosen"]["dense"] for r in rows)),
            "mean_spearman_with_dense": float(np.nanmean(rho)) if rho else None,
            "seconds_per_order": float(np.mean([r["seconds_per_order"][name] for r in rows])),
        }
    out["sets"] = len(rows)
    out["mean_random_order_test_accuracy"] = float(mean_random.mean())
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record")
    ap.add_argument("out")
    ap.add_argument("--compressor", required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--pool-size", type=int, required=True, help="the pool size of the record's selections")
    ap.add_argument("--verify", type=int, default=2, help="stored orders whose dense loss is recomputed first")
    args = ap.parse_args(argv)
    record = json.load(open(args.record))
    queries = record["queries"]
    model, tokenizer = load_model(RunConfig().model)
    compressors = {"compressed": load_compressor(args.compressor, model.config),
                   "control": load_compressor(args.control, model.config)}
    rows, verify = [], args.verify  # the first selection's check stands for all: same model, same split rule
    for res in record["results"]:
        task = get_task(res["task"])
        builder = PromptBuilder.for_model(model, tokenizer, task)
        splits = split(task, pool_size=args.pool_size, seed=res["seed"])
        validation = splits.validation[:queries]
        orders = [c["indices"] for c in res["candidates"]]
        stored = [c["validation_loss"] for c in res["candidates"]]
        if verify > 0:
            dense = CacheEvaluator(model, builder, DenseCache(model), batch=2, query_batch=32, pack=True)
            again = dense.evaluate(splits.pool, validation, orders[:verify]).losses
            if np.max(np.abs(np.asarray(again) - np.asarray(stored[:verify]))) > 1e-3:
                raise SystemExit(f"{res['task']} seed {res['seed']} {res['method']}: dense losses {list(again)} "
                                 f"differ from the record's {stored[:verify]}")
            verify = 0
        row = {"task": res["task"], "seed": res["seed"], "method": res["method"],
               "test_accuracy": [c["test_accuracy"] for c in res["candidates"]],
               "losses": {"dense": stored}, "chosen": {"dense": int(np.argmin(stored))},
               "seconds_per_order": {"dense": res["seconds"] / len(orders)}, "spearman_with_dense": {}}
        for name, compressor in compressors.items():
            ev = CacheEvaluator(model, builder, CompressedCache(model, compressor), batch=8, query_batch=32,
                                pack=True)
            t0 = time.perf_counter()
            losses = [float(x) for x in ev.evaluate(splits.pool, validation, orders).losses]
            row["seconds_per_order"][name] = (time.perf_counter() - t0) / len(orders)
            row["losses"][name] = losses
            row["chosen"][name] = int(np.argmin(losses))
            rho = spearman(losses, stored)
            row["spearman_with_dense"][name] = None if np.isnan(rho) else float(rho)
        rows.append(row)
        print(f"{res['task']} seed {res['seed']} {res['method']}: "
              + ", ".join(f"{n} chose {row['chosen'][n]} ({row['test_accuracy'][row['chosen'][n]]:.3f})"
                          for n in ["dense", *compressors])
              + f"; Spearman with dense {row['spearman_with_dense']}", flush=True)
    summary = summarize(rows, list(compressors))
    atomic.write_json(args.out, {"record": args.record, "queries": queries, "pool_size": args.pool_size,
                                 "summary": summary, "rows": rows,
                                 "provenance": provenance("python research/order_evaluators.py " + " ".join(argv))})
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-example correctness of many random k-prompts, on validation and on test examples.

    python research/prompt_correctness.py OUT.json --task rotten_tomatoes --k 20 --prompts 24 \
        --balanced 8 --validation 320 --test 150 --seed 0

Each prompt (``--prompts`` plain random ones, ``--balanced`` label-balanced ones in a random
order) is scored with the dense prompt on the first ``--validation`` validation examples and the
first ``--test`` test examples; the record keeps every prompt's 0/1 correctness per example, its
label-balanced validation loss, and the Spearman correlations between validation and test
accuracy. The hand-over tests resample these vectors (tests/test_check.py), and the record shows
how far a whole prompt's validation score predicts its test accuracy.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from datetime import date

import numpy as np
import torch

from icl_ssm import atomic
from icl_ssm.compress.builders import DenseCache
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.answers import evaluate_prefixes, pad_right
from icl_ssm.evaluate.stats import label_weights, spearman
from icl_ssm.lm.models import DEFAULT_MODEL, load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.check import random_prompts
from icl_ssm.select.subset_losses import CacheEvaluator


def score(model, builder, demos, examples, query_batch=32):
    ev = CacheEvaluator(model, builder, DenseCache(model), batch=1, query_batch=query_batch)
    ids, mask = pad_right([builder.build_prefix(list(demos))])
    with torch.no_grad():
        res = evaluate_prefixes(model, builder, ev.build(ids, mask), examples, loss="nll", query_batch=query_batch,
                                keep_logits=False, pack=True)
    return res.correct[0].numpy().astype(int), res.loss[0].double().numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--task", default="rotten_tomatoes")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--pool-size", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--balanced", type=int, default=8)
    ap.add_argument("--validation", type=int, default=320)
    ap.add_argument("--test", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    task = get_task(args.task)
    splits = split(task, pool_size=args.pool_size, val_size=args.validation, seed=args.seed)
    model, tokenizer = load_model(args.model)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    val, test = splits.validation[: args.validation], splits.test[: args.test]
    rng = np.random.default_rng([args.seed, 11])
    prompts = [("random", p) for p in random_prompts(len(splits.pool), args.k, args.prompts, rng)]
    pool_labels = [e.target for e in splits.pool]
    prompts += [("balanced", p) for p in random_prompts(len(splits.pool), args.k, args.balanced, rng,
                                                        labels=pool_labels)]
    weights = label_weights([builder.label_index(q) for q in val])
    rows = []
    for kind, p in prompts:
        demos = [splits.pool[i] for i in p]
        vc, vl = score(model, builder, demos, val)
        tc, _ = score(model, builder, demos, test)
        rows.append({"kind": kind, "indices": p, "validation_correct": vc.tolist(), "test_correct": tc.tolist(),
                     "validation_accuracy": float(vc.mean()), "validation_balanced_loss": float(vl @ weights),
                     "test_accuracy": float(tc.mean())})
        print(f"{kind} {len(rows)}/{len(prompts)}: val {vc.mean():.3f} test {tc.mean():.3f}", flush=True)
    zc, _ = score(model, builder, [], val)
    zt, _ = score(model, builder, [], test)
    va = [r["validation_accuracy"] for r in rows]
    vl = [r["validation_balanced_loss"] for r in rows]
    ta = [r["test_accuracy"] for r in rows]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {
        "command": "python research/prompt_correctness.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "commit": commit, "date": date.today().isoformat(), "machine": f"{platform.machine()}, "
        f"{torch.get_num_threads()} torch threads", "torch": torch.__version__,
        "model": args.model, "task": args.task, "k": args.k, "seed": args.seed, "pool_size": len(splits.pool),
        "validation_size": len(val), "test_size": len(test), "prompts": rows,
        "zero_shot": {"validation_correct": zc.tolist(), "test_correct": zt.tolist(),
                      "validation_accuracy": float(zc.mean()), "test_accuracy": float(zt.mean())},
        "spearman_validation_accuracy_vs_test": spearman(va, ta),
        "spearman_validation_loss_vs_test": spearman([-x for x in vl], ta),
        "seconds": time.perf_counter() - t0,
    }
    atomic.write_json(args.out, record)
    print(json.dumps({k: record[k] for k in ("spearman_validation_accuracy_vs_test",
                                             "spearman_validation_loss_vs_test", "seconds")}))


if __name__ == "__main__":
    main()

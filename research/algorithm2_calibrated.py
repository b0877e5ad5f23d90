"""Algorithm 2's reliability on the calibrated target: does its ranking of candidates survive once the
label lean is taken out of the subset losses?

    python research/algorithm2_calibrated.py [--seeds 0 1] [--subsets 192] [--queries 32] [--out OUT.json]

Per seed: ``split(rotten_tomatoes, pool_size=100, seed)``; ``--subsets`` random k = 20 subsets
drawn a permutation block at a time (every candidate in both halves of the score split-half, as
``select --budget`` draws its pilot); each subset's label scores on the first ``--queries``
validation queries from one dense forward pass (the exact prefix cache). From those same scores,
two targets:

* ``raw``: each query's cross-entropy over the label set, a subset's loss the label-balanced mean
  (what Algorithm 2 ranks today);
* ``batch``: the same after batch calibration estimated per subset on its own queries, their labels
  unread (``icl_ssm.select.calibrated.calibrated_losses``; what the search ranks prompts by).

For each target: the subset losses' split-half over queries (label-stratified halves) and its
Spearman-Brown reliability; the candidates' scores (Algorithm 2's mean over the subsets holding a
candidate) split-half over alternate blocks of subsets, its reliability, and the subsets
Spearman-Brown puts at reliability 0.8; how far the candidates' scores follow their own label
(Spearman of score with label: the lean read from the candidates' side); and the overlap of the
two targets' top-20 picks. Runs a model: about 3 min per 100 subsets x 32 queries on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import shlex
import sys

import numpy as np

from icl_ssm import atomic
from icl_ssm.calibrate.losses import calibrated_query_losses
from icl_ssm.compress.builders import DenseCache
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import label_weights, spearman, spearman_brown, split_half_spearman
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.provenance import provenance
from icl_ssm.select.budget import draw_in_blocks, permutation_block, score_split_half, subsets_for_reliability
from icl_ssm.select.calibrated import gold_indices
from icl_ssm.select.estimators import mean_affinity
from icl_ssm.select.sampling import balanced_subsets
from icl_ssm.select.subset_losses import CacheEvaluator

TASK, K, POOL = "rotten_tomatoes", 20, 100
OUT = "docs/results/calibration/algorithm2-calibrated-rotten_tomatoes-k20.json"
TARGETS = ("raw", "batch")


def reliability(subsets: list[list[int]], per_query: np.ndarray, gold: np.ndarray, labels: list[str],
                block: int, second: str, k: int) -> dict:
    """The split-halves and reliabilities of one target's ``(M, Q)`` per-query losses."""
    losses = per_query @ label_weights(gold)
    n = len(labels)
    half = split_half_spearman(per_query, gold)
    score_half = score_split_half(subsets, losses, n, mean_affinity, block)
    scores, _ = mean_affinity(subsets, losses, n)
    label = np.array([float(y == second) for y in labels])  # 1 for the task's second label
    return {"subset_loss_split_half": half, "subset_loss_reliability": spearman_brown(half),
            "score_split_half": score_half, "score_reliability": spearman_brown(score_half),
            "subsets_for_0_8": subsets_for_reliability(score_half, len(subsets)),
            "score_label_spearman": spearman(scores, label), "subset_loss_sd": float(losses.std(ddof=1)),
            "top_k": sorted(np.argsort(scores, kind="stable")[:k].tolist())}


def run_seed(model, tokenizer, seed: int, subsets_n: int, queries: int, k: int = K) -> dict:
    task = get_task(TASK)
    data = split(task, pool_size=POOL, seed=seed, fit=True, k=k, min_val_size=queries)
    pool, validation = data.pool, data.validation[:queries]
    labels = [e.target for e in pool]
    rng = np.random.default_rng([seed, 2])
    block = permutation_block(len(pool), k)
    subsets = draw_in_blocks(lambda m: balanced_subsets(len(pool), k, m, rng), subsets_n, block)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    evaluator = CacheEvaluator(model, builder, DenseCache(model), loss="nll", batch=8, balance_labels=True)
    result = evaluator.evaluate(pool, validation, subsets)
    if result.query_scores is None:
        raise SystemExit("the dense evaluator returned no label scores")
    gold = gold_indices(task.labels, validation)
    per = {target: calibrated_query_losses(result.query_scores, gold, "none" if target == "raw" else target)
           for target in TARGETS}
    out = {"seed": seed, "subsets": len(subsets), "queries": len(validation), "block": block,
           "seconds": result.cost.seconds, "targets": {t: reliability(subsets, per[t], gold, labels, block,
                                                                   task.labels[1], k)
                                                       for t in TARGETS}}
    picks = [set(out["targets"][t]["top_k"]) for t in TARGETS]
    out["top_k_overlap"] = len(picks[0] & picks[1])
    out["subset_loss_spearman_raw_vs_batch"] = spearman(per["raw"].mean(1), per["batch"].mean(1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--subsets", type=int, default=192)
    parser.add_argument("--queries", type=int, default=32)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--k", type=int, default=K)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    command = "python research/algorithm2_calibrated.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    prov = provenance(command)
    model, tokenizer = load_model(args.model)
    runs = []
    for seed in args.seeds:
        runs.append(run_seed(model, tokenizer, seed, args.subsets, args.queries, args.k))
        r = runs[-1]
        print(f"seed {seed}: " + "; ".join(f"{t}: losses {v['subset_loss_reliability']:.2f}, scores "
                                           f"{v['score_reliability']:.2f}, score~label {v['score_label_spearman']:+.2f}"
                                           for t, v in r["targets"].items())
              + f"; top-{args.k} overlap {r['top_k_overlap']}", file=sys.stderr)
    atomic.write_json(args.out, {"provenance": prov, "model": args.model, "task": TASK, "k": args.k, "pool_size": POOL,
                                 "settings": vars(args), "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())

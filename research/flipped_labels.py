"""The flipped-label probe on a language task: do the dense prompt, the compressed cache and its
control give a prompt with every label flipped a different validation loss than the prompt as
it is?  Prints one JSON object (probe.flipped_label_probe per evaluator).

    python research/flipped_labels.py --compressor DIR [--control DIR] [--task rotten_tomatoes]
        [--k 20] [--subsets 24] [--queries 16] [--seed 0]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from probe import flipped_label_probe, state_separability  # research/probe.py

from icl_ssm.compress.builders import CompressedCache, DenseCache
from icl_ssm.compress.compressor import load_compressor
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.models import load_model, resolve_device
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.sampling import balanced_subsets
from icl_ssm.select.subset_losses import CacheEvaluator


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="rotten_tomatoes")
    p.add_argument("--compressor", required=True)
    p.add_argument("--control")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--subsets", type=int, default=24)
    p.add_argument("--queries", type=int, default=16)
    p.add_argument("--pool-size", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--state-subsets", type=int, default=256,
                   help="prompts whose SSM states a linear read-out tries to tell from their flipped copies")
    p.add_argument("--device", default="auto", help="'auto' (the GPU when there is one), 'cpu', 'cuda', ...")
    args = p.parse_args(argv)
    model, tokenizer = load_model(args.model, device=resolve_device(args.device))
    task = get_task(args.task)
    splits = split(task, pool_size=args.pool_size, seed=args.seed)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    compressor = load_compressor(args.compressor, model.config).to(model.device)
    evaluators = {"dense": CacheEvaluator(model, builder, DenseCache(model)),
                  "compressed": CacheEvaluator(model, builder, CompressedCache(model, compressor))}
    if args.control:
        control = load_compressor(args.control, model.config).to(model.device)
        evaluators["control"] = CacheEvaluator(model, builder, CompressedCache(model, control))
    subsets = balanced_subsets(len(splits.pool), args.k, args.subsets, np.random.default_rng([args.seed, 21]))
    out = flipped_label_probe(evaluators, splits.pool, splits.validation[: args.queries], task.labels, subsets)
    more = balanced_subsets(len(splits.pool), args.k, args.state_subsets, np.random.default_rng([args.seed, 22]))
    out["state_separability"] = state_separability(model, compressor, builder, splits.pool, task.labels, more)
    out.update(model=args.model, task=args.task, k=args.k, compressor_dir=args.compressor, control_dir=args.control)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

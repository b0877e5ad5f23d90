"""Does a compressor's summary carry what ranks subsets, and do its virtual tokens use it?

    python research/summary_probe.py --task rotten_tomatoes --k 50 NAME=DIR [NAME=DIR ...]

A compressor is a trained directory, or ``NAME=untrained:KEY=VALUE,...`` for an untrained one
of the default recipe's shape (N = 256, 16 recent tokens, gates) with those config fields
changed, e.g. ``untrained:system=scale_invariant,channels=64``; ``standardize=true`` there
needs ``--teacher-cache DIR`` (the statistics are measured on its training prompts, as
``icl-ssm distill --standardize`` does).

For many random demonstration subsets of the task's pool (no teacher forward: only the
embedding lookup, the SSM and the head), reports for each compressor:

* how far its virtual tokens move with the prompt: the RMS over prompts of each virtual
  K/V entry's deviation from its mean over prompts, relative to the RMS of that mean
  (0 for a control, whose tokens are the same for every prompt);
* how well label statistics of the subset (the share of the second label, the last
  demonstration's label) can be read back, by a ridge fit cross-validated over subsets, from
  (a) the SSM's final states, (b) the virtual K/V, and, as a reference, (c) the mean token
  embedding of the part of the prompt the SSM reads. Cross-validated R^2, so 0 is "carries
  nothing a linear read-out finds" and 1 is "carries it exactly".

The label share ranks Rotten Tomatoes subsets at k = 50 (Spearman 0.62 with the dense loss,
BENCHMARKS.md); a summary that cannot give it back cannot rank by it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from icl_ssm.compress.cache import summary_inputs
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, load_compressor
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.distill.config import COMPRESSOR_FIELDS, DistillConfig
from icl_ssm.distill.train import training_states
from icl_ssm.evaluate.answers import pad_right
from icl_ssm.evaluate.paths import sample_subsets
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder


def cv_r2(X: np.ndarray, y: np.ndarray, folds: int = 5, alphas=(1e-3, 1e-2, 1e-1, 1, 10)) -> float:
    """Best-alpha cross-validated R^2 of a ridge fit (dual form: features may outnumber rows).
    Features are standardised on each training fold; alpha is relative to the mean of diag(X X^T)."""
    n = len(y)
    order = np.random.default_rng(0).permutation(n)
    parts = np.array_split(order, folds)
    best = -np.inf
    for alpha in alphas:
        pred = np.empty(n)
        for test in parts:
            train = np.setdiff1d(order, test)
            mu, sd = X[train].mean(0), X[train].std(0) + 1e-8
            A, B = (X[train] - mu) / sd, (X[test] - mu) / sd
            ym = y[train].mean()
            K = A @ A.T
            coef = np.linalg.solve(K + alpha * np.trace(K) / len(train) * np.eye(len(train)), y[train] - ym)
            pred[test] = B @ (A.T @ coef) + ym
        best = max(best, 1 - ((pred - y) ** 2).sum() / ((y - y.mean()) ** 2).sum())
    return float(best)


def untrained(spec: str, model, model_name: str, teacher_cache: str | None) -> SSMCompressor:
    """``KEY=VALUE,...`` -> an untrained compressor of the default recipe's shape (seed 0)."""
    def parse(value: str):  # 64 -> int, 0.002 -> float, true -> bool, anything else a string
        try:
            return json.loads(value.lower() if value.lower() in ("true", "false") else value)
        except json.JSONDecodeError:
            return value

    fields = {key: parse(value) for key, value in (item.split("=", 1) for item in filter(None, spec.split(",")))}
    base = {name: getattr(DistillConfig(), name) for name in COMPRESSOR_FIELDS}
    base.pop("num_groups")
    config = SSMCompressorConfig.for_teacher(model.config, model_name, **{**base, **fields})
    torch.manual_seed(0)
    comp = SSMCompressor(config)
    if config.standardize:
        if teacher_cache is None:
            raise SystemExit("untrained:...standardize=true needs --teacher-cache DIR (its training prompts)")
        from icl_ssm.distill.teacher import TeacherCache

        comp.fit_standardizer(training_states(model, comp, TeacherCache.open(teacher_cache)))
    return comp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("compressors", nargs="+", metavar="NAME=DIR")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="rotten_tomatoes")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--subsets", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1, help="subset draw (fidelity's held-out subsets use seed 0)")
    ap.add_argument("--teacher-cache", help="teacher cache whose training prompts standardise untrained compressors")
    args = ap.parse_args()
    model, tokenizer = load_model(args.model)
    task = get_task(args.task)
    splits = split(task, seed=0)
    labels = sorted({e.target for e in splits.pool})
    subsets = sample_subsets(splits.pool, args.k, args.subsets, np.random.default_rng(args.seed))
    builder = PromptBuilder.for_model(model, tokenizer, task)
    prompts = [builder.build_prefix([splits.pool[i] for i in s]) for s in subsets]
    lab = np.array([[labels.index(splits.pool[i].target) for i in s] for s in subsets], dtype=float)
    targets = {f"share of {labels[-1]!r}": (lab == len(labels) - 1).mean(1), "last label": lab[:, -1]}
    print(f"{task.name}, k = {args.k}: {len(subsets)} subsets (seed {args.seed}); label share std "
          f"{targets[f'share of {labels[-1]!r}'].std():.3f}\n")
    print("| compressor | virtual tokens' prompt variation | "
          + " | ".join(f"R^2 {t}: states / virtual K/V / mean embedding" for t in targets) + " |")
    print("|---|---:|" + "---:|" * len(targets))
    for item in args.compressors:
        name, path = item.split("=", 1)
        if path.startswith("untrained:"):
            comp = untrained(path.removeprefix("untrained:"), model, args.model, args.teacher_cache).eval()
        else:
            comp = load_compressor(path, model.config).eval()
        states, kv, means = [], [], []
        with torch.no_grad():
            for i in range(0, len(prompts), args.batch):
                emb, summary = summary_inputs(model, comp, *pad_right(prompts[i : i + args.batch]))
                emb = emb.float()
                s = comp.states(emb, summary)
                v = comp.head(s)
                states.append(s.flatten(1).numpy())
                kv.append(torch.cat([v.keys, v.values]).transpose(0, 1).flatten(1).numpy())
                means.append(((emb * summary[..., None]).sum(1) / summary.sum(1, keepdim=True)).numpy())
        S, V, M = (np.concatenate(a).astype(np.float64) for a in (states, kv, means))
        mean = V.mean(0)
        variation = np.sqrt(((V - mean) ** 2).mean()) / np.sqrt((mean**2).mean())
        cells = []
        for y in targets.values():
            r2 = [cv_r2(X, y) if X.std(0).max() > 1e-12 else 0.0 for X in (S, V, M)]
            cells.append(" / ".join(f"{v:.2f}" for v in r2))
        print(f"| {name} | {variation:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

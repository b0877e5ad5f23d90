"""``icl-ssm synthetic``: the paper's in-context regression study. ``train`` a regression
teacher (``evaluate`` it), ``distill`` a compressor (or its control) for it, then ``select`` (test error against
k per method, the D1 share, D1/D2 scores, FLOPs; JSON and PNG), ``fidelity`` (subset-loss
Spearman against the dense prompt beside control and window) and ``probe`` (flipped targets)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from icl_ssm import atomic
from icl_ssm.distill.config import FIELD_HELP


def _train(args: argparse.Namespace) -> int:
    from icl_ssm_bench.synthetic.task import RegressionTask
    from icl_ssm_bench.synthetic.teacher import SHAPE_FIELDS, RegressionTeacherConfig, load_teacher, train_teacher

    # the shape: the --init-from teacher's, the flags given on top; the config's defaults fill the rest
    carried = {}
    if args.init_from:
        base = load_teacher(args.init_from).config
        carried = {name: getattr(base, name) for name in SHAPE_FIELDS}
    flags = (("dims", "n_dims"), ("max_pairs", "max_pairs"), ("layers", "num_hidden_layers"),
             ("hidden_size", "hidden_size"))
    given = {field: getattr(args, flag) for flag, field in flags if hasattr(args, flag)}  # unset flags are absent
    config = RegressionTeacherConfig(**(carried | given))
    task = RegressionTask(args.function, d=config.n_dims, clusters=args.clusters, sigma=args.sigma,
                          seed=args.task_seed)
    train_teacher(config, task, args.out, steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
                  use_curriculum=not args.init_from, init_from=args.init_from,
                  log=lambda line: print(line, file=sys.stderr, flush=True))
    print(args.out)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import numpy as np

    from icl_ssm_bench.synthetic.study import task_of
    from icl_ssm_bench.synthetic.teacher import evaluate_teacher, load_teacher

    teacher = load_teacher(args.teacher)
    pairs = teacher.config.max_pairs
    ks = tuple(k for k in (10, 20, 40, 60) if k <= pairs)
    result = evaluate_teacher(teacher, task_of(args.teacher), np.random.default_rng(args.seed),
                              n_prompts=args.prompts, mixed_ks=ks)
    result.update(prompts=args.prompts, seed=args.seed)
    path = atomic.write_json(Path(args.teacher) / "evaluation.json", result)
    print(f"MSE over {args.prompts} prompts ± its standard error")
    print("| k | teacher | ridge | zero |\n|---:|---:|---:|---:|")
    for row in result["by_k"]:
        if row["k"] in (1, 5, 10, 20, 30, 40, 50, 60):
            print(f"| {row['k']} | " + " | ".join(f"{row[m]:.3f} ± {row[m + '_se']:.3f}" for m in ("teacher", "ridge",
                                                                                                  "zero")) + " |")
    print(path)
    return 0


def _distill(args: argparse.Namespace) -> int:
    from icl_ssm_bench.synthetic.study import distill_synthetic

    overrides = {"ssm_input": args.ssm_input}
    for name in ("state_size", "channels", "num_virtual", "num_sink", "num_recent", "latent_size", "pair_size",
                 "pair_window", "input_rank", "stage1_epochs", "stage2_epochs"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    print(distill_synthetic(args.teacher, args.out, k=args.k, samples=args.samples, seed=args.seed,
                            control=args.control, **overrides))
    return 0


def _select(args: argparse.Namespace) -> int:
    from icl_ssm_bench.synthetic.study import plot_select, select_markdown, select_study

    result = select_study(args.teacher, args.compressor, ks=args.k, seeds=args.seeds, subsets=args.subsets,
                          queries=args.queries, pool_size=args.pool_size, estimator=args.estimator,
                          say=lambda line: print(line, file=sys.stderr, flush=True))
    print(atomic.write_result(args.out, "select", result, select_markdown, plot_select))
    return 0


def _fidelity(args: argparse.Namespace) -> int:
    from icl_ssm_bench.synthetic.study import fidelity_study

    print(json.dumps(fidelity_study(args.teacher, args.compressor, args.control, k=args.k, subsets=args.subsets,
                                    queries=args.queries), indent=1))
    return 0


def _probe(args: argparse.Namespace) -> int:
    from icl_ssm_bench.synthetic.study import flipped_probe

    print(json.dumps(flipped_probe(args.teacher, args.compressor, k=args.k, pairs=args.pairs), indent=1))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("synthetic", help="the paper's in-context regression study: teacher, compressor, "
                            "selection, fidelity, flipped-target probe")
    kinds = parser.add_subparsers(dest="synthetic", metavar="STEP", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = kinds.add_parser("train", help="train a regression teacher on Garg et al.'s prompts, from scratch or "
                         "from another teacher (--init-from)", formatter_class=fmt)
    p.add_argument("--function", choices=("linear", "relu"), default="linear")
    p.add_argument("--out", required=True, help="directory for the teacher")
    p.add_argument("--init-from", metavar="DIR", help="start from this teacher's weights (no curriculum); its "
                   "shape is the default of --dims, --max-pairs, --layers and --hidden-size, which must match it")
    shape = {"default": argparse.SUPPRESS}  # the --init-from teacher's, else the default the help names
    p.add_argument("--dims", type=int, help="input dimension (default: 20)", **shape)
    p.add_argument("--clusters", type=int, default=4, help="fixed functions of the selection setting (D1 is one)")
    p.add_argument("--sigma", type=float, default=0.25, help="noise of the targets")
    p.add_argument("--task-seed", type=int, default=0, help="draws the clusters' functions")
    p.add_argument("--max-pairs", type=int, help="longest prompt trained on, in (x, y) pairs (default: 40)", **shape)
    p.add_argument("--layers", type=int, help="transformer layers (default: 2)", **shape)
    p.add_argument("--hidden-size", type=int, help="width of the backbone (default: 64)", **shape)
    p.add_argument("--steps", type=int, default=28000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_train)
    p = kinds.add_parser("evaluate", help="a teacher's MSE against k beside ridge and zero, and on prompts mixing "
                         "clusters (writes evaluation.json into the teacher's directory)", formatter_class=fmt)
    p.add_argument("--teacher", required=True)
    p.add_argument("--prompts", type=int, default=2000)
    p.add_argument("--seed", type=int, default=2026)
    p.set_defaults(func=_evaluate)
    p = kinds.add_parser("distill", help="distil a compressor (or --control) for a teacher", formatter_class=fmt)
    p.add_argument("--teacher", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--k", type=int, default=20, help="demonstrations per training prompt")
    p.add_argument("--samples", type=int, default=2048, help="training prompts")
    p.add_argument("--ssm-input", default="embeddings", help="embeddings or layer:l")
    p.add_argument("--control", action="store_true", help="the prompt-independent control")
    for name in ("state_size", "channels", "num_virtual", "num_sink", "num_recent", "latent_size"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None, help="default: the synthetic recipe")
    for name in ("pair_size", "pair_window", "input_rank"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None, help=FIELD_HELP[name])
    for name in ("stage1_epochs", "stage2_epochs"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=None, help="default: the synthetic recipe")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_distill)
    p = kinds.add_parser("select", help="test error against k: random, top-k, affinity (dense, compressed)",
                         formatter_class=fmt)
    p.add_argument("--teacher", required=True)
    p.add_argument("--compressor", help="without it, affinity runs on dense caches only")
    p.add_argument("--k", type=int, nargs="+", default=[5, 10, 20, 40])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--subsets", type=int, default=200)
    p.add_argument("--queries", type=int, default=16)
    p.add_argument("--pool-size", type=int, default=200)
    p.add_argument("--estimator", choices=("mean", "ridge"), default="mean",
                   help="candidate scores from subset losses: the paper's mean, or a ridge fit of each "
                   "candidate's effect")
    p.add_argument("--out", required=True, help="directory for select.json, select.md and select.png")
    p.set_defaults(func=_select)
    p = kinds.add_parser("fidelity", help="subset-loss Spearman against the dense prompt, with control and window",
                         formatter_class=fmt)
    p.add_argument("--teacher", required=True)
    p.add_argument("--compressor", required=True)
    p.add_argument("--control")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--subsets", type=int, default=64)
    p.add_argument("--queries", type=int, default=64, help="16 leave the dense ranking itself too noisy to "
                   "correlate with much above 0.8")
    p.set_defaults(func=_fidelity)
    p = kinds.add_parser("probe", help="flipped targets: does the cache see whether the targets are right?",
                         formatter_class=fmt)
    p.add_argument("--teacher", required=True)
    p.add_argument("--compressor", required=True)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--pairs", type=int, default=64)
    p.set_defaults(func=_probe)

"""``icl-ssm bench answer``: its flags, over :mod:`icl_ssm_bench.answer`'s harness."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from icl_ssm import atomic
from icl_ssm_bench.answer import PATHS, AnswerBenchConfig, bench_answer, to_markdown


def add_parser(kinds: Any) -> None:
    """``icl-ssm bench answer``, registered by :mod:`icl_ssm_bench.cli.bench`."""
    p = kinds.add_parser("answer", help="answers per second: the prompt's prefix shared (exact, compressed) against "
                         "re-encoding it per input, with peak memory and agreement",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = AnswerBenchConfig()
    p.add_argument("--model", default=d.model)
    p.add_argument("--shape", default=d.shape, help="a `bench scale` shape with random weights, read through --model's "
                   "tokenizer: rates and memory at that size, no quality (default: --model itself)")
    p.add_argument("--task", default=d.task)
    p.add_argument("--k", type=int, default=d.k, help="demonstrations in the prompt")
    p.add_argument("--inputs", type=int, default=d.inputs, help="inputs every path answers")
    p.add_argument("--reencode-inputs", type=int, default=d.reencode_inputs,
                   help="re-encode the prompt for the first this many inputs only (default: all)")
    p.add_argument("--batch", type=int, default=d.batch, help="inputs per forward, every path")
    p.add_argument("--pool-size", type=int, default=d.pool_size)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--compressor", default=d.compressor, help="default: the one shipped for the model, task and k")
    p.add_argument("--paths", nargs="+", default=list(d.paths), choices=PATHS)
    p.add_argument("--logit-check", type=int, default=d.logit_check,
                   help="inputs whose full-vocabulary logits the exact path compares with the reference")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads in every worker")
    p.add_argument("--out", default="bench-answer", help="directory for the JSON and markdown record")
    p.add_argument("--stem", default=None, help="file name stem (default answer-throughput-TASK-kK[-SHAPE])")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    names = AnswerBenchConfig.__dataclass_fields__
    cfg = AnswerBenchConfig(**{n: getattr(args, n) for n in names if hasattr(args, n)})
    cfg = replace(cfg, paths=tuple(cfg.paths))
    record = bench_answer(cfg, " ".join(["icl-ssm", *getattr(args, "argv", ["bench", "answer"])]),
                          say=lambda line: print(line, file=sys.stderr, flush=True))
    stem = args.stem or f"answer-throughput-{cfg.task}-k{cfg.k}" + (f"-{cfg.shape}" if cfg.shape else "")
    print(atomic.write_result(args.out, stem, record, to_markdown))
    return 0

"""Where the seconds of a packed subset evaluation go at a `bench scale` shape: torch.profiler over
one compressed-packed and one dense-packed evaluation (random weights, synthetic prompts, as
`icl-ssm bench scale` builds them), the time split into the matrix products, attention and the
rest, with each part's FLOPs (FlopCounterMode) and rate.

    python research/scale_profile.py [--shape qwen2.5-0.5b] [--k 50] [--queries 8] [--rows 12] [--out F.json]

It says what bounds the wall-time saving against the FLOP saving: the compressed path's FLOPs
are spent at a lower rate when its time goes to work the counter does not see (the scan's
elementwise steps, copies, small kernels) or to matrix products too small to run fast.
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from icl_ssm_bench import scale, shapes
from torch.profiler import ProfilerActivity, profile

from icl_ssm.cost import flop_counter
from icl_ssm.provenance import provenance

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention",
             "aten::_scaled_dot_product_flash_attention", "aten::scaled_dot_product_attention")


def split(prof) -> dict:
    """Self CPU seconds per kind of op (matrix products, attention, the rest) and the top ops."""
    kinds, ops = defaultdict(float), []
    for e in prof.key_averages():
        seconds = e.self_cpu_time_total / 1e6
        kind = "matmul" if e.key in MATMUL else "attention" if e.key in ATTENTION else "other"
        kinds[kind] += seconds
        ops.append((seconds, e.key, e.count))
    return {"seconds": dict(kinds), "top": sorted(ops, reverse=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=list(shapes.SHAPES))
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--queries", type=int, default=8)
    ap.add_argument("--rows", type=int, default=12, help="top ops printed per path")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (bench scale's CPU record used 1)")
    ap.add_argument("--out", default=None, help="write the JSON record here too (atomically)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = scale.ScaleConfig(shapes=(args.shape,), k=(args.k,), queries=args.queries)
    bench = scale._Bench.build(cfg, args.shape, [args.k])
    evaluators = bench.evaluators(args.k, 1)
    subset = bench.subsets(args.k)[1:2]
    out = {"shape": args.shape, "k": args.k, "queries": args.queries, "threads": torch.get_num_threads()}
    for name in ("compressed-packed", "dense-packed"):
        ev = evaluators[name]
        ev.evaluate(bench.pool, bench.validation, subset)  # warm-up
        counter = flop_counter()
        with counter:
            ev.evaluate(bench.pool, bench.validation, subset)
        by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            ev.evaluate(bench.pool, bench.validation, subset)
        s = split(prof)
        total = sum(s["seconds"].values())
        flops = counter.get_total_flops()
        attention = sum(n for op, n in by_op.items() if "scaled_dot_product" in op)
        out[name] = {"seconds": total, "gflops": flops / 1e9, "gflop_per_s": flops / 1e9 / total,
                     "seconds_by_kind": s["seconds"],
                     "matmul_gflop_per_s": (flops - attention) / 1e9 / max(s["seconds"].get("matmul", 0), 1e-9),
                     "top": [f"{sec:.3f} s {key} x{count}" for sec, key, count in s["top"][: args.rows]]}
    c, d = out["compressed-packed"], out["dense-packed"]
    out["flop_saving"] = d["gflops"] / c["gflops"]
    out["time_saving"] = d["seconds"] / c["seconds"]
    out["provenance"] = provenance("python research/scale_profile.py " + " ".join(sys.argv[1:]))
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(args.out)


if __name__ == "__main__":
    main()

"""Whether an SSM state can hold the input-target relation before any training: a linear
read-out of the states of untrained compressors (several layouts) tells each synthetic prompt
from the same inputs with another cluster's targets (the flipped-target probe's pairs).
Prints one JSON row per layout, with X^T y itself as the ceiling.

    python research/fresh_state_separability.py --teacher runs/regression-teacher-linear [--k 20] [--pairs 256]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from icl_ssm_bench.synthetic.study import SYNTHETIC_RECIPE, flipped_pools, subset_states, task_of
from icl_ssm_bench.synthetic.teacher import load_teacher

from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.evaluate.stats import paired_separability
from icl_ssm.select.sampling import balanced_subsets

LAYOUTS = {
    "embeddings": {},
    "embeddings, 16 channels": {"channels": 16},
    "embeddings, time-invariant": {"system": "time_invariant"},
    "layer 1, 16 channels": {"channels": 16, "ssm_input": "layer:1"},
    "products": {"pair_size": 32},
    "products, 16 channels": {"pair_size": 32, "channels": 16},
    "products, time-invariant": {"pair_size": 32, "system": "time_invariant"},
}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", required=True)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--pairs", type=int, default=256)
    p.add_argument("--seed", type=int, default=200)
    args = p.parse_args(argv)
    teacher, task = load_teacher(args.teacher), task_of(args.teacher)
    split, broken = flipped_pools(task, pool_size := 4 * args.k, 16, args.seed)  # the probe's pools
    subsets = balanced_subsets(pool_size, args.k, args.pairs, np.random.default_rng([args.seed, 16]))
    index = np.asarray(subsets)

    def xty(s):
        return np.einsum("npd,np->nd", s.pool_x[index], s.pool_y[index])

    rows = [{"layout": "X^T y (the ceiling)", **paired_separability(xty(split), xty(broken))}]
    shape = {name: SYNTHETIC_RECIPE[name] for name in ("state_size", "num_virtual", "num_sink", "latent_size",
                                                        "system")}
    for name, layout in LAYOUTS.items():
        torch.manual_seed(0)
        config = SSMCompressorConfig.for_teacher(teacher.config, **{**shape, **layout})
        comp = SSMCompressor(config).eval()
        rows.append({"layout": name, **paired_separability(subset_states(teacher, comp, split, subsets),
                                                           subset_states(teacher, comp, broken, subsets))})
    for row in rows:
        print(json.dumps(row))
    return rows


if __name__ == "__main__":
    main()

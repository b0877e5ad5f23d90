"""The teacher pass with its queries packed against the reference path (each query after its
own copy of the prefix): seconds and FLOPs per episode, both paths in the same run.

    python research/teacher_pack.py [--k 20 50] [--episodes 4] [--queries 8] [--task rotten_tomatoes]

Episodes are drawn as ``icl-ssm distill`` draws them (:func:`icl_ssm.distill.teacher.sample_episodes`);
each is run on both paths in alternation, after a warm-up on the first episode that also counts
its FLOPs (FlopCounterMode); the largest difference of the stored targets between the paths is
printed beside the times.
"""

import argparse
import json

import torch

from icl_ssm.cost import measure
from icl_ssm.distill import spec as SP
from icl_ssm.distill import teacher as TT
from icl_ssm.distill.targets import teacher_targets
from icl_ssm.lm.models import DEFAULT_MODEL, load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--task", default="rotten_tomatoes")
    ap.add_argument("--k", type=int, nargs="+", default=[20, 50])
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--queries", type=int, default=8)
    args = ap.parse_args()
    model, tok = load_model(args.model)
    builders, pools = TT.task_builders(model, tok, [args.task], seed=0, chat=False)
    leads = TT.answer_leads(builders, pools)
    lead = leads[0] if leads else ()
    rows = []
    for k in args.k:
        spec = SP.TeacherSpec(model=args.model, model_fingerprint=SP.model_fingerprint(model), tasks=(args.task,),
                              k=k, episodes=args.episodes, queries=args.queries, answer_leads=leads)
        episodes = TT.sample_episodes([len(pools[0])], spec)
        times = {True: [], False: []}
        flops = {True: 0.0, False: 0.0}
        worst = 0.0
        for n, e in enumerate([episodes[0], *episodes]):  # the first is a warm-up
            demos, queries = [pools[0][i] for i in e.demos], [pools[0][i] for i in e.queries]
            out = {}
            for pack in (True, False):  # the warm-up counts the FLOPs; the timed runs count nothing
                with torch.no_grad(), measure(model.device, count_flops=not n) as cost:
                    out[pack] = teacher_targets(model, builders[0], demos, queries, spec, lead, pack=pack)
                if n:
                    times[pack].append(cost.seconds)
                else:
                    flops[pack] = cost.flops
            if n:
                worst = max(worst, max(float((out[True][name].float() - out[False][name].float()).abs().max())
                                       for name in ("top_logp", "gold_logp", "hidden")))
        row = {"k": k, "prompt_tokens": int(out[True]["prompt_ids"].numel()), "episodes": args.episodes,
               "seconds_packed": sum(times[True]) / args.episodes,
               "seconds_reference": sum(times[False]) / args.episodes,
               "gflop_packed": flops[True] / 1e9, "gflop_reference": flops[False] / 1e9,  # the first episode
               "max_abs_diff": worst}
        row["speedup"] = row["seconds_reference"] / row["seconds_packed"]
        rows.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

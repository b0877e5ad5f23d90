"""One ablation read across several tasks: which variant ranks subsets best on all of them.

    python research/ablation_pooled.py REPORT.json [MORE.json ...] [--base compressed] [--draws 2000]

Each REPORT.json is the ``icl-ssm fidelity --json`` report of one ``research/ablation.sh`` run
(one task). For every path that all reports share (the base compressor is ``compressed``;
``control``, ``window`` and the ``--also`` variants), prints its subset-loss Spearman with dense
on each task, the mean over the tasks, and the mean's difference from the base with a paired
95% bootstrap interval: each draw resamples every task's subsets (the same draw for all paths),
so the interval reflects how much of a difference survives another choice of held-out subsets.
Losses are label-balanced (:func:`icl_ssm.evaluate.stats.label_weights`, as in ``research/balanced.py``)
where the queries hold every label of the task; elsewhere (``modular_addition``: 97 answers) the
plain mean. Also the mean KL over the tasks.
"""

import argparse
import json

import numpy as np
from balanced import balanced_losses, query_labels

from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import interval, spearman


def subset_losses(report: dict) -> dict[str, np.ndarray]:
    """``{path: (S,) subset losses}``: label-balanced when the queries hold every label of the
    task, else the plain mean (``modular_addition``'s 97 answers, say, against 16 queries)."""
    task = get_task(report["task"])
    if task.kind == "classification" and len(np.unique(query_labels(report))) == len(task.labels):
        return balanced_losses(report)
    return {name: np.asarray(v, dtype=np.float64) for name, v in report["per_subset"]["loss"].items()}


def kl_of(report: dict, name: str) -> float:
    if name == "compressed":
        return report["kl"]
    if name in ("control", "window"):
        return report[f"{name}_kl"]
    return report["also"][name]["kl"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--base", default="compressed", help="the path the others are compared with")
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    reports = [json.load(open(path)) for path in args.reports]
    losses = [subset_losses(r) for r in reports]
    names = sorted(set.intersection(*(set(x) for x in losses)) - {"dense"})
    if args.base not in names:
        raise ValueError(f"--base {args.base!r}: not a path of every report; shared paths: {', '.join(names)}")
    tasks = [r["task"] for r in reports]
    rng = np.random.default_rng(args.seed)
    draws = [[rng.integers(0, len(x["dense"]), len(x["dense"])) for x in losses] for _ in range(args.draws)]

    def mean_rho(name: str, pick=None) -> float:
        return float(np.mean([spearman(x["dense"][i], x[name][i]) for x, i in
                              zip(losses, pick or [slice(None)] * len(losses))]))

    base_draws = np.array([mean_rho(args.base, d) for d in draws])
    print("| path | " + " | ".join(tasks) + " | mean | mean - base [95% CI] | mean KL |")
    print("|---|" + "---:|" * (len(tasks) + 3))
    for name in sorted(names, key=lambda n: -mean_rho(n)):
        per_task = [spearman(x["dense"], x[name]) for x in losses]
        diff = "—"
        if name != args.base:
            lo, hi = interval(np.array([mean_rho(name, d) for d in draws]) - base_draws)
            diff = f"{mean_rho(name) - mean_rho(args.base):+.2f} [{lo:.2f}, {hi:.2f}]"
        kl = np.mean([kl_of(r, name) for r in reports])
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in per_task) + f" | {np.mean(per_task):.2f} | {diff} | "
              f"{kl:.3f} |")


if __name__ == "__main__":
    main()

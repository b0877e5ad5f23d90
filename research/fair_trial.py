"""Which cheap ranker carries the subset ranking once the label lean is out?

    python research/fair_trial.py [--records R.json ...] [--out OUT.json]

Reads stored ``icl-ssm fidelity --json`` records of a binary classification task (their
``per_subset`` section: each subset's pool indices in prompt order, every cache path's per-query
calibrated loss, each query's gold label) and runs no model. The rule, fixed before the records
were read:

* **queries**: the first 4 queries of each label, in stored order, are the *probe*; the other
  queries are the *target* set. Every ranker is judged against the same target.
* **target**: the dense prompt's label-balanced loss (the mean of the per-label mean losses) over
  the target queries after batch calibration estimated on those queries (the lean removed).
* **rankers** (a higher value predicts a higher target loss):
  - each stored cache path (compressed, its prompt-blind control, the untrained window): the same
    quantity from its own losses on the target queries (what the fidelity measures);
  - ``dense 4+4``: the dense balanced calibrated loss on the 8 probe queries, calibrated on them:
    the cheap bar a screen must clear at about its cost;
  - ``label statistics``: the square of the recency-weighted count of the demonstrations' labels,
    ``(sum_i (i / k) y_i)^2``, ``y_i = +1`` for label 1 and -1 for label 0 (no parameters);
  - ``dense, lean left in``: the dense balanced loss on the target queries without calibration
    (how much of the raw ranking survives the calibration).
* **intervals**: 2,000 bootstrap replicates, each resampling the subsets and, within each label,
  the target and probe queries; 95% percentile intervals of every Spearman and of the paired
  differences (compressed minus control, every ranker minus ``dense 4+4``).
* **reliability** of the target: the Spearman of the dense ranking on label-stratified halves of
  the target queries, and Spearman-Brown.

With two labels a query's calibrated loss ``l = softplus(-s m)`` (``s = +1`` for a label-1 query,
-1 otherwise) gives its calibrated margin ``m = -s log(expm1(l))``; the margin calibrated on another
query set is ``m - mean(m over that set)``. So the stored losses are recalibrated on any subset of
the queries exactly, without the label scores.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from icl_ssm import atomic
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.stats import interval, spearman, spearman_brown

RECORDS = ["docs/results/calibration/fidelity-calibrated-rotten_tomatoes-k20-32x64.json",
           "docs/results/fair-trial/fidelity-rotten_tomatoes_foobar-k20-96x64.json"]
OUT = "docs/results/fair-trial/rankers-k20-96x64.json"
PROBE_PER_LABEL, RESAMPLES, SEED = 4, 2000, 0


def margins(loss: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(S, Q) calibrated losses -> (S, Q) calibrated margins toward label 1."""
    s = np.where(labels == 1, 1.0, -1.0)
    return -s * np.log(np.expm1(np.maximum(loss, 1e-12)))


def balanced_calibrated(m: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(S,) the label-balanced loss of margins ``m (S, Q)`` recalibrated on their own ``Q`` queries."""
    s = np.where(labels == 1, 1.0, -1.0)
    loss = np.logaddexp(0.0, -s * (m - m.mean(1, keepdims=True)))
    return (loss[:, labels == 0].mean(1) + loss[:, labels == 1].mean(1)) / 2


def balanced_raw(loss: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return (loss[:, labels == 0].mean(1) + loss[:, labels == 1].mean(1)) / 2


def probe_and_target(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    probe = np.concatenate([np.flatnonzero(labels == j)[:PROBE_PER_LABEL] for j in (0, 1)])
    return np.sort(probe), np.setdiff1d(np.arange(len(labels)), probe)


def rankers(cal: dict[str, np.ndarray], raw: np.ndarray, labels: np.ndarray, y: np.ndarray, probe: np.ndarray,
            target: np.ndarray, subsets: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(target (S,), {ranker: (S,)}) on the given subsets and query indices; ``cal``: every path's
    (S, Q) calibrated margins, ``raw``: the dense path's (S, Q) raw losses."""
    dense_m = cal["dense"][subsets]
    truth = balanced_calibrated(dense_m[:, target], labels[target])
    out = {f"cache: {name}": balanced_calibrated(m[subsets][:, target], labels[target])
           for name, m in cal.items() if name != "dense"}
    out["dense 4+4"] = balanced_calibrated(dense_m[:, probe], labels[probe])
    k = y.shape[1]
    out["label statistics"] = (y[subsets] @ (np.arange(1, k + 1) / k)) ** 2
    out["dense, lean left in"] = balanced_raw(raw[subsets][:, target], labels[target])
    return truth, out


def analyse(path: str) -> dict:
    r = json.load(open(path))
    ps = r["per_subset"]
    task = get_task(r["config"]["task"])
    if len(task.labels) != 2 or "query_loss_calibrated" not in ps:
        sys.exit(f"{path}: needs a binary task's record with per-query calibrated losses")
    splits = split(task, seed=r["seed"])
    labels = np.array(ps["query_labels"])
    rebuilt = [list(task.labels).index(e.target) for e in splits.validation[r["query_offset"]:][: r["queries"]]]
    if rebuilt != labels.tolist():
        sys.exit(f"{path}: the stored query labels differ from the rebuilt validation split")
    ids = np.array(ps["ids"])
    y = np.array([[1.0 if splits.pool[i].target == task.labels[1] else -1.0 for i in s] for s in ids])
    S = len(ids)
    probe, target = probe_and_target(labels)
    cal = {name: margins(np.array(v, dtype=np.float64), labels) for name, v in ps["query_loss_calibrated"].items()}
    raw = np.array(ps["query_loss"]["dense"], dtype=np.float64)
    truth, ranked = rankers(cal, raw, labels, y, probe, target, np.arange(S))
    point = {name: spearman(x, truth) for name, x in ranked.items()}
    rng = np.random.default_rng(SEED)
    draws: dict[str, list[float]] = {name: [] for name in ranked}
    for _ in range(RESAMPLES):
        subsets = rng.integers(0, S, S)
        t = np.concatenate([rng.choice(target[labels[target] == j], (labels[target] == j).sum()) for j in (0, 1)])
        p = np.concatenate([rng.choice(probe[labels[probe] == j], (labels[probe] == j).sum()) for j in (0, 1)])
        tr, rk = rankers(cal, raw, labels, y, p, t, subsets)
        for name, x in rk.items():
            draws[name].append(spearman(x, tr))
    d = {name: np.array(v) for name, v in draws.items()}
    rows = [{"ranker": name, "spearman": point[name], "ci95": list(interval(d[name]))} for name in ranked]
    diffs = []
    if "cache: compressed" in d and "cache: control" in d:
        diffs.append(("cache: compressed", "cache: control"))
    diffs += [(name, "dense 4+4") for name in ranked if name != "dense 4+4"]
    paired = [{"ranker": a, "minus": b, "difference": point[a] - point[b], "ci95": list(interval(d[a] - d[b]))}
              for a, b in diffs]
    halves = [target[labels[target] == j] for j in (0, 1)]
    first = np.concatenate([h[0::2] for h in halves])
    second = np.concatenate([h[1::2] for h in halves])
    half = spearman(balanced_calibrated(cal["dense"][:, first], labels[first]),
                    balanced_calibrated(cal["dense"][:, second], labels[second]))
    return {"record": path, "task": task.name, "k": int(ids.shape[1]), "subsets": S,
            "queries": {"target": len(target), "probe": len(probe)},
            "target_split_half": half, "target_reliability": spearman_brown(half),
            "spearman": rows, "paired": paired}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", nargs="+", default=RECORDS)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    from icl_ssm.provenance import environment  # imports torch; no model is run

    results = [analyse(p) for p in args.records]
    command = "python research/fair_trial.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = {"provenance": {"command": command.strip(), **environment()},
           "config": {"records": args.records, "probe_per_label": PROBE_PER_LABEL,
                      "bootstrap": {"resamples": RESAMPLES, "seed": SEED, "level": 0.95,
                                    "resampled": "subsets, and the target and probe queries within each label"},
                      "target": "dense balanced loss, batch-calibrated on the target queries (the lean removed)"},
           "records": results}
    atomic.prepare_dir(Path(args.out).parent)
    atomic.write_json(args.out, out)
    for res in results:
        print(f"{res['task']}: k={res['k']} {res['subsets']} subsets, target {res['queries']['target']} queries, "
              f"split-half {res['target_split_half']:+.2f}")
        for x in res["spearman"]:
            print(f"  {x['spearman']:+.3f} [{x['ci95'][0]:+.2f}, {x['ci95'][1]:+.2f}]  {x['ranker']}")
        for x in res["paired"]:
            print(f"  {x['difference']:+.3f} [{x['ci95'][0]:+.2f}, {x['ci95'][1]:+.2f}]  {x['ranker']} - {x['minus']}")


if __name__ == "__main__":
    main()

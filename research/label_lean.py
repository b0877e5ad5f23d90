"""How much of a subset's dense loss is its label lean, and can the demonstrations' labels rank it?

    python research/label_lean.py [--records R.json ...] [--out OUT.json]

Reads stored ``icl-ssm fidelity --json`` records of a binary classification task (their
``per_subset`` section: each subset's pool indices in prompt order, every path's per-query
loss of the gold answer, each query's gold label index) and runs no model. The pool is
rebuilt with ``split(task, seed=record seed)`` to read the demonstrations' labels; the
record's query labels are checked against the rebuilt validation split. Per record:

* per subset, from the dense losses: ``lean`` = mean loss on label-0 queries minus mean loss
  on label-1 queries (rotten_tomatoes: negative minus positive), and the label-balanced loss
  = the mean of the two per-label means;
* R^2 of least-squares fits ``balanced ~ a + b lean`` and ``balanced ~ a + b lean + c lean^2``;
* Spearman with the balanced dense loss of prompt-only rankers fixed before looking: the
  square of the recency-weighted label count ``score = sum_i (i / k) y_i`` (``y_i`` = +1 for a
  label-1 demonstration, -1 otherwise, ``i = 1..k`` in prompt order) and the square of the
  plain count ``sum_i y_i`` (squared because the loss is about a quadratic in the lean);
* the same Spearman of every stored cache path's balanced loss (compressors, the
  prompt-blind control, the untrained window), for comparison;
* each with a 95% percentile bootstrap interval over subsets (queries held fixed).

Also written, marked as such: ``|lean|`` (uses the dense losses: a ceiling, not a ranker)
and a post hoc sweep of other recency weightings (point estimates only).
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
from icl_ssm.evaluate.stats import spearman, spearman_ci

RECORDS = [f"docs/results/ssm-input-rotten_tomatoes-{s}.json" for s in (
    "k20", "k20-layers", "k20-products", "k20-products-512", "k50", "k50-96x64", "k50-layers12-64x64")]
OUT = "docs/results/calibration/label-lean-rotten_tomatoes.json"
RESAMPLES, SEED = 2000, 0
KIND = {"control": "prompt-blind control", "window": "untrained window (sinks + last tokens)"}


def r2(x: np.ndarray, y: np.ndarray, degree: int) -> float:
    """R^2 of the least-squares polynomial of ``degree`` in ``x`` fitted to ``y``."""
    resid = y - np.polyval(np.polyfit(x, y, degree), x)
    return float(1 - resid @ resid / ((y - y.mean()) @ (y - y.mean())))


def row(name: str, x: np.ndarray, y: np.ndarray, **extra) -> dict:
    lo, hi = spearman_ci(x, y, resamples=RESAMPLES, seed=SEED)
    return {"ranker": name, **extra, "spearman": spearman(x, y), "ci95": [lo, hi]}


def balanced(loss: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S,) label-balanced mean loss and lean (label-0 mean minus label-1 mean)."""
    zero, one = loss[:, labels == 0].mean(1), loss[:, labels == 1].mean(1)
    return (zero + one) / 2, zero - one


def analyse(path: str, pools: dict) -> dict:
    r = json.load(open(path))
    ps = r["per_subset"]
    task = get_task(r["config"]["task"])
    if len(task.labels) != 2:
        sys.exit(f"{path}: task {task.name!r} has {len(task.labels)} labels; this analysis needs a binary task")
    key = (r["config"]["task"], r["seed"])
    if key not in pools:
        pools[key] = split(task, seed=r["seed"])
    splits = pools[key]
    labels = np.array(ps["query_labels"])
    rebuilt = [list(task.labels).index(e.target) for e in splits.validation[r["query_offset"]:][: r["queries"]]]
    if rebuilt != labels.tolist():
        sys.exit(f"{path}: the stored query labels differ from the rebuilt validation split")
    ids = np.array(ps["ids"])  # (S, k) pool indices in prompt order
    y = np.array([[1.0 if splits.pool[i].target == task.labels[1] else -1.0 for i in s] for s in ids])
    S, k = ids.shape
    losses = {name: np.array(v, dtype=np.float64) for name, v in ps["query_loss"].items()}
    dense, lean = balanced(losses["dense"], labels)
    recency = y @ (np.arange(1, k + 1) / k)
    count = y.sum(1)
    blind = "prompt-only, 0 parameters"
    rows = [row("recency-weighted label count, score^2 (w_i = i/k)", recency**2, dense, kind=blind),
            row("plain label count, count^2", count**2, dense, kind=blind)]
    for name, loss in losses.items():
        if name != "dense":
            other = row(f"cache path: {name}", balanced(loss, labels)[0], dense, kind=KIND.get(name, "compressor"))
            stored = (r.get("subset_loss_spearman_balanced") if name == "compressed" else
                      r.get(f"{name}_subset_loss_spearman_balanced", r.get("also", {}).get(name, {})
                            .get("subset_loss_spearman_balanced")))
            other["record_spearman_balanced"] = stored  # the record's own figure, as a check
            rows.append(other)
    i = np.arange(1, k + 1)
    sweep = {"(i/k)^2": (i / k) ** 2, "(i/k)^4": (i / k) ** 4, "2^-(k-i)/2": 0.5 ** ((k - i) / 2),
             "2^-(k-i)/4": 0.5 ** ((k - i) / 4), "2^-(k-i)/8": 0.5 ** ((k - i) / 8), "1/(k-i+1)": 1 / (k - i + 1),
             "last 4 only": (i > k - 4) * 1.0, "last 8 only": (i > k - 8) * 1.0}
    return {
        "record": path,
        "n_subsets": S, "n_queries": len(labels), "k": k,
        "queries_per_label": {task.labels[j]: int((labels == j).sum()) for j in (0, 1)},
        "demonstrations_label1_share": float((y > 0).mean()),
        "lean_definition": f"mean dense loss on {task.labels[0]!r} queries minus that on {task.labels[1]!r} queries",
        "balanced_dense_loss": {"mean": float(dense.mean()), "std": float(dense.std(ddof=1))},
        "lean": {"mean": float(lean.mean()), "std": float(lean.std(ddof=1))},
        "r2_quadratic": r2(lean, dense, 2), "r2_linear": r2(lean, dense, 1),
        "quadratic_coefficients_a_b_c": np.polyfit(lean, dense, 2)[::-1].tolist(),
        "spearman_recency_score_vs_lean": spearman(recency, lean),
        "spearman": rows,
        "reference_not_a_ranker": row("|lean| (from the dense losses themselves)", np.abs(lean), dense),
        "post_hoc_weightings_score2": {name: spearman((y @ w) ** 2, dense) for name, w in sweep.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", nargs="+", default=RECORDS)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    from icl_ssm.provenance import environment  # imports torch; no model is run

    pools: dict = {}
    results = [analyse(p, pools) for p in args.records]
    loaded = [json.load(open(x["record"]))["per_subset"] for x in results]
    for j, a in enumerate(loaded):  # a record whose subsets and dense losses are another's, or nested in them
        S, Q = len(a["ids"]), len(a["query_labels"])
        for m, b in enumerate(loaded):
            size = (len(b["ids"]), len(b["query_labels"]))
            if m == j or size[0] < S or size[1] < Q or (size == (S, Q) and m > j) or a["ids"] != b["ids"][:S]:
                continue
            if np.allclose(np.array(a["query_loss"]["dense"]), np.array(b["query_loss"]["dense"])[:S, :Q], atol=1e-4):
                results[j]["dense_same_as_or_nested_in"] = results[m]["record"]
                break
    command = "python research/label_lean.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = {
        "provenance": {"command": command.strip(), **environment()},
        "config": {"records": args.records, "bootstrap": {"resamples": RESAMPLES, "seed": SEED, "level": 0.95,
                                                          "resampled": "subsets (queries held fixed)"},
                   "recency_weights": "w_i = i / k, i = 1..k in prompt order", "label_sign": "+1 label 1, -1 label 0",
                   "ranker_transform": "score^2, fixed before looking (the loss is about a quadratic in the lean)",
                   "post_hoc": "reference_not_a_ranker and post_hoc_weightings_score2 were added after seeing the "
                               "prespecified ranker's results"},
        "records": results,
    }
    atomic.prepare_dir(Path(args.out).parent)
    atomic.write_json(args.out, out)
    for res in results:
        print(f"{Path(res['record']).stem}: k={res['k']} {res['n_subsets']}x{res['n_queries']} "
              f"R2 quad {res['r2_quadratic']:.3f} lin {res['r2_linear']:.3f}")
        for x in res["spearman"] + [res["reference_not_a_ranker"]]:
            print(f"  {x['spearman']:+.3f} [{x['ci95'][0]:+.2f}, {x['ci95'][1]:+.2f}]  {x['ranker']}")


if __name__ == "__main__":
    main()

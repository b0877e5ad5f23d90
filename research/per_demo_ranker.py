"""Do per-demonstration encodings carry the subset ranking once the label lean is out?

    python research/per_demo_ranker.py [--records R.json ...] [--out OUT.json]

A probe of the fair trial's third candidate design (an SSM over per-demonstration encodings: each
pool demonstration encoded once by the teacher, a subset scored from its k encodings in prompt
order, microseconds a subset). Before training such an SSM, this asks whether any linear readout of
those encodings ranks subsets at all, on the stored fidelity records that ``research/fair_trial.py``
reads (same subsets, same target). The rule, fixed before any of it was run:

* **target**: ``research/fair_trial.py``'s: the dense prompt's label-balanced loss over the target
  queries (the first 4 queries of each label held out as the probe), batch-calibrated on them.
* **encodings**: each pool demonstration rendered alone by the run's prompt builder
  (``build_prefix([demo])``) and read once by the teacher; its encoding is the mean over its tokens
  of the last hidden layer. The pool's encodings are reduced to 16 principal components (fitted on
  the pool alone; no subset and no loss is read).
* **subset features**: the plain mean and the recency-weighted mean (weights ``i / k``, normalised)
  of its demonstrations' components: 32 numbers, the state a diagonal linear scan over the k
  encodings would hold.
* **rankers**, each a ridge regression fitted out of fold:
  - ``per-demonstration encodings``: the 32 subset features;
  - ``label counts``: the plain and recency-weighted counts of the demonstrations' labels and their
    squares (4 numbers): the learned form of the zero-parameter label statistics;
  - ``both``: the 36 together.
  Outer 8-fold cross-validation over the subsets (folds by a permutation with seed 0); in each
  training fold the features are standardised and the ridge penalty chosen from 10^-2 ... 10^3 by
  inner 4-fold mean squared error. Each subset's score is its out-of-fold prediction.
* **judged** by the Spearman of the out-of-fold predictions with the target; 95% percentile
  intervals from 2,000 bootstrap replicates resampling the subsets (the fits are not redone per
  replicate, so the intervals are narrower than a full refit's); the paired difference
  ``per-demonstration encodings`` minus ``label counts`` on the same replicates.

A ranker fitted this way costs one dense evaluation per training subset; a screen built on it pays
those before it saves anything. This probe asks only whether the signal is there.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fair_trial import RECORDS, RESAMPLES, SEED, balanced_calibrated, margins, probe_and_target  # noqa: E402

from icl_ssm import atomic  # noqa: E402
from icl_ssm.data.splits import split  # noqa: E402
from icl_ssm.data.tasks import get_task  # noqa: E402
from icl_ssm.evaluate.stats import interval, spearman  # noqa: E402
from icl_ssm.lm.batch import pad_ids  # noqa: E402
from icl_ssm.lm.models import load_model  # noqa: E402
from icl_ssm.lm.prompts import PromptBuilder  # noqa: E402

OUT = "docs/results/fair-trial/per-demo-ranker-k20.json"
COMPONENTS, OUTER, INNER = 16, 8, 4
PENALTIES = 10.0 ** np.arange(-2, 4)


def encodings(model, builder: PromptBuilder, pool, batch: int = 32) -> np.ndarray:
    """(n, d) each demonstration's mean last-layer hidden state, read alone (right-padded batches;
    the mean runs over its own tokens only)."""
    out = []
    with torch.no_grad():
        for start in range(0, len(pool), batch):
            ids, mask = pad_ids([list(builder.build_prefix([d]).input_ids) for d in pool[start:start + batch]], "right")
            hidden = model(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states[-1]
            m = mask[..., None].double()
            out.append(((hidden.double() * m).sum(1) / m.sum(1)).numpy())  # (b, d)
    return np.concatenate(out)


def components(x: np.ndarray, n: int = COMPONENTS) -> np.ndarray:
    """(n_pool, n) principal component scores of the pool's encodings."""
    centred = x - x.mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    return u[:, :n] * s[:n]


def subset_features(z: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """(S, 2 c): the plain and the recency-weighted mean of each subset's component scores."""
    k = ids.shape[1]
    w = np.arange(1, k + 1) / k
    w = w / w.sum()
    chosen = z[ids]  # (S, k, c)
    return np.concatenate([chosen.mean(1), np.einsum("k,skc->sc", w, chosen)], axis=1)


def label_features(y: np.ndarray) -> np.ndarray:
    """(S, 4): the plain and recency-weighted label counts (y = +-1) and their squares."""
    k = y.shape[1]
    plain, recent = y.mean(1), y @ (np.arange(1, k + 1) / k) / k
    return np.stack([plain, recent, plain ** 2, recent ** 2], axis=1)


def ridge_fit(x: np.ndarray, t: np.ndarray, penalty: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    mu, sd = x.mean(0), x.std(0) + 1e-12
    xs = (x - mu) / sd
    beta = np.linalg.solve(xs.T @ xs + penalty * np.eye(x.shape[1]), xs.T @ (t - t.mean()))
    return mu, sd, beta, float(t.mean())


def ridge_predict(model: tuple, x: np.ndarray) -> np.ndarray:
    mu, sd, beta, c = model
    return ((x - mu) / sd) @ beta + c


def folds(n: int, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    return np.array_split(rng.permutation(n), parts)


def out_of_fold(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """Each subset's prediction from a ridge fitted without its fold; the penalty chosen per fold."""
    pred, chosen = np.zeros(len(t)), []
    for test in folds(len(t), OUTER, np.random.default_rng(SEED)):
        train = np.setdiff1d(np.arange(len(t)), test)
        inner_folds = folds(len(train), INNER, np.random.default_rng(SEED + 1))  # the same for every penalty
        errors = []
        for penalty in PENALTIES:
            err = 0.0
            for inner in inner_folds:
                fit_on = np.setdiff1d(np.arange(len(train)), inner)
                m = ridge_fit(x[train[fit_on]], t[train[fit_on]], penalty)
                err += float(((ridge_predict(m, x[train[inner]]) - t[train[inner]]) ** 2).sum())
            errors.append(err)
        best = float(PENALTIES[int(np.argmin(errors))])
        chosen.append(best)
        pred[test] = ridge_predict(ridge_fit(x[train], t[train], best), x[test])
    return pred, chosen


def analyse(path: str, model, tokenizer) -> dict:
    r = json.load(open(path))
    ps = r["per_subset"]
    task = get_task(r["config"]["task"])
    splits = split(task, seed=r["seed"])
    labels = np.array(ps["query_labels"])
    ids = np.array(ps["ids"])
    builder = PromptBuilder.for_model(model, tokenizer, task)
    z = components(encodings(model, builder, splits.pool))
    y = np.array([[1.0 if splits.pool[i].target == task.labels[1] else -1.0 for i in s] for s in ids])
    probe, target = probe_and_target(labels)
    dense = margins(np.array(ps["query_loss_calibrated"]["dense"], dtype=np.float64), labels)
    truth = balanced_calibrated(dense[:, target], labels[target])
    feats = {"per-demonstration encodings": subset_features(z, ids), "label counts": label_features(y)}
    feats["both"] = np.concatenate(list(feats.values()), axis=1)
    preds, penalties = {}, {}
    for name, x in feats.items():
        preds[name], penalties[name] = out_of_fold(x, truth)
    rng = np.random.default_rng(SEED)
    draws = {name: [] for name in preds}
    for _ in range(RESAMPLES):
        s = rng.integers(0, len(truth), len(truth))
        for name, p in preds.items():
            draws[name].append(spearman(p[s], truth[s]))
    d = {name: np.array(v) for name, v in draws.items()}
    rows = [{"ranker": name, "spearman": spearman(p, truth), "ci95": list(interval(d[name])),
             "penalties": penalties[name]} for name, p in preds.items()]
    a, b = "per-demonstration encodings", "label counts"
    paired = {"ranker": a, "minus": b, "difference": spearman(preds[a], truth) - spearman(preds[b], truth),
              "ci95": list(interval(d[a] - d[b]))}
    return {"record": path, "task": task.name, "k": int(ids.shape[1]), "subsets": len(ids),
            "pool": len(splits.pool), "target_queries": len(target), "spearman": rows, "paired": paired}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", nargs="+", default=RECORDS)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    from icl_ssm.provenance import environment

    torch.manual_seed(SEED)
    model, tokenizer = load_model(json.load(open(args.records[0]))["model"])
    results = [analyse(p, model, tokenizer) for p in args.records]
    command = "python research/per_demo_ranker.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = {"provenance": {"command": command.strip(), **environment()},
           "config": {"records": args.records, "components": COMPONENTS, "outer_folds": OUTER, "inner_folds": INNER,
                      "penalties": PENALTIES.tolist(),
                      "bootstrap": {"resamples": RESAMPLES, "seed": SEED, "level": 0.95,
                                    "resampled": "subsets (out-of-fold predictions held fixed)"},
                      "target": "dense balanced loss, batch-calibrated on the target queries (the lean removed)"},
           "records": results}
    atomic.prepare_dir(Path(args.out).parent)
    atomic.write_json(args.out, out)
    for res in results:
        print(f"{res['task']}: k={res['k']} {res['subsets']} subsets, pool {res['pool']}")
        for x in res["spearman"]:
            print(f"  {x['spearman']:+.3f} [{x['ci95'][0]:+.2f}, {x['ci95'][1]:+.2f}]  {x['ranker']}")
        p = res["paired"]
        print(f"  {p['difference']:+.3f} [{p['ci95'][0]:+.2f}, {p['ci95'][1]:+.2f}]  {p['ranker']} - {p['minus']}")


if __name__ == "__main__":
    main()

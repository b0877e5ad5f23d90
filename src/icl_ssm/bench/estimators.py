"""``icl-ssm bench estimators`` and ``estimators-sim``: the selected set against the number of subsets.

``estimators``: test accuracy and loss of the selected set against the number of subsets, for
the mean and ridge estimators on one stream of subsets and for adaptive sampling
(``--permutations``: each set's order averaged out; ``--per-label``: the same scores with the
places shared out over the labels; ``--sampling stratified|both``: subsets drawn with the
labels in even shares, as ``select --stratify`` draws them). ``estimators-sim``: the same
curve on a planted datamodel, as the recall of the true best ``k``.
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from icl_ssm import atomic
from icl_ssm.bench.selection import load, log
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.affinity import AffinitySelector
from icl_ssm.select.base import order_rng, top_k, top_k_per_label
from icl_ssm.select.estimators import mean_affinity, ridge_affinity
from icl_ssm.select.evaluate import evaluate_selection
from icl_ssm.select.evaluators import CacheEvaluator, OracleEvaluator, SubsetEvaluator, SubsetLosses
from icl_ssm.select.sampling import balanced_subsets, stratified_subsets


class _Memo(SubsetEvaluator):
    """Caches an evaluator's loss per subset, so the estimators share the same evaluations."""

    def __init__(self, inner: SubsetEvaluator):
        self.inner, self.memo, self.name = inner, {}, inner.name

    def evaluate(self, pool, validation, subsets):
        todo = [s for s in subsets if tuple(s) not in self.memo]
        if todo:
            res = self.inner.evaluate(pool, validation, todo)
            self.memo.update(zip(map(tuple, todo), res.losses.tolist()))
        return SubsetLosses(np.array([self.memo[tuple(s)] for s in subsets]))


def _means(rows: list[dict], key: str) -> dict:
    """The mean of ``key`` per estimator and budget (over seeds), budgets ascending."""
    by: dict = {}
    for r in rows:
        by.setdefault(r["estimator"], {}).setdefault(r["subsets"], []).append(r[key])
    return {e: {m: float(np.mean(v)) for m, v in sorted(c.items())} for e, c in by.items()}


def _curve(rows: list[dict], top: int, key: str = "test_accuracy") -> tuple[dict, float, dict]:
    """Mean ``key`` per (estimator, budget); the mean estimator's at the ``top`` budget; and,
    per estimator, the smallest budget that reaches it (at least as high an accuracy, at most
    as high a loss)."""
    sign = -1.0 if key == "test_loss" else 1.0
    curve = _means(rows, key)
    target = (curve["mean"] if "mean" in curve else next(iter(curve.values())))[top]
    needed = {e: next((m for m, a in c.items() if sign * (a - target) >= -1e-9), None) for e, c in curve.items()}
    return curve, target, needed


def estimators(args: argparse.Namespace) -> dict:
    model, tokenizer, compressor = load(args)
    task = get_task(args.task)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    if args.permutations < 0:
        raise ValueError(f"--permutations {args.permutations}; expected >= 0 (0: the selection's own prompt order)")
    inner = CacheEvaluator(model, builder, args.evaluator, compressor, batch=args.batch,
                             query_batch=args.query_batch, balance_labels=args.balance_labels)
    rows = []
    for seed in args.seeds:
        splits = split(task, pool_size=args.pool_size, seed=seed)
        pool, validation, test = splits.pool, splits.validation[: args.queries], splits.test[: args.test_size]
        n = len(pool)
        memo, measured = _Memo(inner), {}

        def test_acc(indices):
            """The set's test accuracy and loss: in its own order, or averaged over the same
            ``--permutations`` random orders for every set of the seed (the order averaged out)."""
            key = tuple(sorted(indices)) if args.permutations else tuple(indices)
            if key not in measured:
                rng = order_rng(seed)
                orders = [list(key)] if not args.permutations else [
                    [key[i] for i in rng.permutation(len(key))] for _ in range(args.permutations)]
                runs = [evaluate_selection(model, builder, [pool[i] for i in o], test,
                                             query_batch=args.query_batch) for o in orders]
                measured[key] = {m: float(np.mean([r[m] for r in runs])) for m in ("accuracy", "loss")}
            return {"test_accuracy": measured[key]["accuracy"], "test_loss": measured[key]["loss"]}

        labels = [e.target for e in pool]
        streams = {}  # the subsets of each sampling, the budgets cut from one stream (paired)
        if args.sampling in ("uniform", "both"):
            streams[""] = balanced_subsets(n, args.k, max(args.budgets), np.random.default_rng(seed))
        if args.sampling in ("stratified", "both"):
            streams["/stratified"] = stratified_subsets(labels, args.k, max(args.budgets),
                                                          np.random.default_rng(seed))
        losses = {kind: memo.evaluate(pool, validation, stream).losses for kind, stream in streams.items()}

        def row(estimator, m, indices):
            return {"seed": seed, "estimator": estimator, "subsets": m, "indices": list(map(int, indices)),
                    "labels": dict(sorted(Counter(labels[i] for i in indices).items())), **test_acc(indices)}

        for m in args.budgets:
            for kind, stream in streams.items():
                for est, fn in (("mean", mean_affinity), ("ridge", ridge_affinity)):
                    scores, _ = fn(stream[:m], losses[kind][:m], n)
                    if kind:  # stratified subsets compare candidates within their label: chosen per label
                        rows.append(row(f"{est}{kind}", m, top_k_per_label(scores, labels, args.k)))
                    else:
                        rows.append(row(est, m, top_k(scores, args.k)))
                        if args.per_label:  # the same scores, the k places shared out over the labels
                            rows.append(row(f"{est}/per-label", m, top_k_per_label(scores, labels, args.k)))
            for kind in streams if args.adaptive else ():
                for est in ("mean", "ridge"):
                    # first round: the stream's first m/2 subsets (memo hits, paired)
                    sel = AffinitySelector(memo, subsets=m, estimator=est, adaptive=0.5, coverage=0,
                                             stratify=bool(kind)).select(pool, validation, args.k,
                                                                         np.random.default_rng(seed))
                    rows.append(row(f"{est}+adaptive{kind}", m, sel.indices))
            log(f"seed {seed} M={m}: " + ", ".join(f"{r['estimator']} {r['test_accuracy']:.3f}"
                                                    for r in rows if r["seed"] == seed and r["subsets"] == m))
        if args.json_out and seed != args.seeds[-1]:  # a long run stopped early keeps the seeds it finished
            atomic.write_json(args.json_out, {**_estimators_report(args, rows), "partial": True,
                                              "argv": getattr(args, "argv", None)})
    return _estimators_report(args, rows)


def _estimators_report(args: argparse.Namespace, rows: list[dict]) -> dict:
    curve, target, needed = _curve(rows, max(args.budgets))
    loss_curve, loss_target, loss_needed = _curve(rows, max(args.budgets), "test_loss")
    return {"model": args.model, "task": args.task, "k": args.k, "evaluator": args.evaluator, "rows": rows,
            "curve": curve, "target": target, "subsets_to_reach_mean_at_max": needed,
            "loss_curve": loss_curve, "loss_target": loss_target, "subsets_to_reach_mean_loss_at_max": loss_needed,
            "seeds_done": sorted({r["seed"] for r in rows}),
            "settings": {k: getattr(args, k) for k in ("pool_size", "queries", "test_size", "seeds", "budgets",
                                                       "permutations", "balance_labels", "per_label", "adaptive",
                                                       "sampling")}}


def estimators_sim(args: argparse.Namespace) -> dict:
    """Planted datamodel: ``L_j = sum_{z in S_j} w_z + noise``; recall of the true best ``k``
    (the most negative ``w``) by each estimator against the number of subsets. The effects
    are scaled so that the subsets' losses spread as ``--signal`` and the noise is
    ``--noise`` (standard deviations), as measured for real subsets in BENCHMARKS.md."""
    rows = []
    n, k = args.pool_size, args.k
    for seed in args.seeds:
        rng = np.random.default_rng(seed)
        w = rng.normal(size=n) * args.signal / np.sqrt(k)
        best = set(np.argsort(w)[:k].tolist())

        def loss(subset, rng=rng, w=w):
            return float(w[list(subset)].sum() + args.noise * rng.normal())

        oracle = OracleEvaluator(loss)
        pool = [Example(str(i), "", "") for i in range(n)]
        val = pool[:1]
        for m in args.budgets:
            for est in ("mean", "ridge"):
                for adaptive in (0.0, 0.5):
                    sel = AffinitySelector(oracle, subsets=m, estimator=est, adaptive=adaptive, coverage=0).select(
                        pool, val, k, np.random.default_rng(seed + 1))
                    name = est + ("+adaptive" if adaptive else "")
                    rows.append({"seed": seed, "estimator": name, "subsets": m,
                                 "test_accuracy": len(best & set(sel.indices)) / k})
    curve, target, needed = _curve(rows, max(args.budgets))
    return {"n": n, "k": k, "signal": args.signal, "noise": args.noise, "rows": rows, "curve": curve,
            "target": target, "subsets_to_reach_mean_at_max": needed, "metric": "recall of the planted best k"}


def estimators_markdown(result: dict) -> str:
    budgets = sorted({m for c in result["curve"].values() for m in c})
    lines = ["| estimator | " + " | ".join(f"M={m}" for m in budgets) + " | subsets to reach mean@max |",
             "|---|" + "---:|" * (len(budgets) + 1)]
    for est, c in result["curve"].items():
        lines.append(f"| {est} | " + " | ".join(f"{100 * c[m]:.1f}" for m in budgets)
                     + f" | {result['subsets_to_reach_mean_at_max'][est]} |")
    if result.get("loss_curve"):  # estimators on a real model: the selected set's mean test loss too
        reach = result.get("subsets_to_reach_mean_loss_at_max", {})
        lines += ["", "| estimator (test loss) | " + " | ".join(f"M={m}" for m in budgets)
                  + " | subsets to reach mean@max |", "|---|" + "---:|" * (len(budgets) + 1)]
        lines += [f"| {est} | " + " | ".join(f"{c[m]:.4f}" for m in budgets) + f" | {reach.get(est, '—')} |"
                  for est, c in result["loss_curve"].items()]
    return "\n".join(lines)

"""``icl-ssm bench select-cost | select-quality | estimators``: the selection numbers of BENCHMARKS.md.

* ``select-cost``: FLOPs (FlopCounterMode, in a pass of their own) and wall seconds (timed
  without the counter, and with it) per subset of the three
  evaluators - compressed caches, dense prefix caches shared by a subset's queries, and one
  full dense prompt per query (the paper's accounting) - at several ``k``, in one run;
* ``select-quality``: test accuracy of every method over tasks and seeds (mean and std);
* ``estimators``: test accuracy and loss of the selected set against the number of subsets,
  for the mean and ridge estimators on one stream of subsets and for adaptive sampling
  (``--permutations``: each set's order averaged out; ``--per-label``: the same scores with the
  places shared out over the labels; ``--sampling stratified|both``: subsets drawn with the
  labels in even shares, as ``select --stratify`` draws them);
* ``select-order``: the selections of earlier ``select-quality`` reports scored again on the
  test set in every prompt order of :func:`icl_ssm.select.base.arrange`;
* ``headroom``: what there is to select on a task: random k-subsets of one pool scored densely
  on the test set, with how far their accuracies spread and how many test answers move at all.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace

import numpy as np

from icl_ssm import atomic
from icl_ssm.compress.compressor import load_compressor
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.evaluate.fidelity import parse_also
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.affinity import AffinitySelector
from icl_ssm.select.base import ARRANGE_ORDERS, arrange, order_rng, top_k, top_k_per_label
from icl_ssm.select.check import ZERO_SHOT
from icl_ssm.select.estimators import mean_affinity, ridge_affinity
from icl_ssm.select.evaluate import evaluate_selection
from icl_ssm.select.evaluators import (
    RELIABILITY_TARGET,
    CacheEvaluator,
    OracleEvaluator,
    PerQueryDenseEvaluator,
    SubsetEvaluator,
    SubsetLosses,
)
from icl_ssm.select.run import SelectConfig, select_demonstrations
from icl_ssm.select.sampling import balanced_subsets, stratified_subsets


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(args):
    model, tokenizer = load_model(args.model)
    compressor = load_compressor(args.compressor, model.config) if args.compressor else None
    return model, tokenizer, compressor


def select_cost(args: argparse.Namespace) -> dict:
    model, tokenizer, compressor = _load(args)
    task = get_task(args.task)
    splits = split(task, seed=args.seed)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    validation = splits.validation[: args.queries]
    rows = []
    for k in args.k:
        subsets = balanced_subsets(len(splits.pool), k, args.subsets + 1, np.random.default_rng(args.seed))
        evaluators = {  # each query path: batched (a cache copy per query, padded) and packed
            f"{cache}{'-packed' if pack else ''}": CacheEvaluator(
                model, builder, cache, compressor if cache == "compressed" else None, batch=1,
                query_batch=args.query_batch, pack=pack)
            for pack in (False, True) for cache in ("compressed", "dense")
        }
        if k <= args.per_query_max_k:
            evaluators["dense-per-query"] = PerQueryDenseEvaluator(model, builder, batch=args.query_batch)
        lengths = [len(builder.build_prefix([splits.pool[i] for i in s]).input_ids) for s in subsets[1:]]
        for name, ev in evaluators.items():
            ev.evaluate(splits.pool, validation, subsets[:1])  # warm-up, not counted
            n = len(subsets) - 1
            counted = _with_flops(ev, "count").evaluate(splits.pool, validation, subsets[1:])  # FLOPs
            timed = _with_flops(ev, "off").evaluate(splits.pool, validation, subsets[1:])  # seconds, no counter
            rows.append({"k": k, "evaluator": name, "prompt_tokens": float(np.mean(lengths)),
                         "flops_per_subset": counted.cost.flops / n, "seconds_per_subset": timed.cost.seconds / n,
                         "seconds_per_subset_counting": counted.cost.seconds / n,
                         "tokens_per_subset": timed.tokens / n})
            _log(f"k={k} {name}: {counted.cost.flops / n / 1e9:.1f} GFLOP, {timed.cost.seconds / n:.2f} s per subset "
                 f"({counted.cost.seconds / n:.2f} s with the FLOP counter)")
    for r in rows:  # against the compressed evaluator on the same query path (per-query: the batched one)
        path = "compressed-packed" if r["evaluator"].endswith("-packed") else "compressed"
        comp = next(c for c in rows if c["k"] == r["k"] and c["evaluator"] == path)
        r["flops_vs_compressed"] = r["flops_per_subset"] / comp["flops_per_subset"]
        r["seconds_vs_compressed"] = r["seconds_per_subset"] / comp["seconds_per_subset"]
    return {"model": args.model, "task": args.task, "queries": len(validation), "subsets": args.subsets,
            "rows": rows}


def _with_flops(ev: SubsetEvaluator, mode: str) -> SubsetEvaluator:
    """``ev`` counting FLOPs as ``mode`` says (CacheEvaluator); the per-query reference always counts."""
    return replace(ev, flops=mode) if isinstance(ev, CacheEvaluator) else ev


def select_quality(args: argparse.Namespace) -> dict:
    model, tokenizer, compressor = _load(args)
    also_dirs = parse_also(args.also)
    clash = sorted(set(also_dirs) & {"compressed", "dense"})
    if clash:
        raise ValueError(f"--also: the names {clash} are taken by the built-in evaluators; choose other names")
    also = {name: load_compressor(path, model.config) for name, path in also_dirs.items()}
    for method in args.methods:
        name, evaluator = _method(method)
        if name == "affinity" and evaluator not in ("compressed", "dense", *also):
            raise ValueError(f"--methods {method!r}: unknown evaluator {evaluator!r}; accepted: compressed, dense"
                             + "".join(f", {a}" for a in also) + " (names from --also NAME=DIR)")
    runs = []
    for task_name in args.tasks:
        task = get_task(task_name)
        for seed in args.seeds:
            splits = split(task, pool_size=args.pool_size, seed=seed)
            base = SelectConfig(model=args.model, task=task_name, k=args.k, compressor=args.compressor,
                                subsets=args.subsets, estimator=args.estimator, queries=args.queries,
                                test_size=args.test_size, pool_size=args.pool_size, seed=seed, batch=args.batch,
                                query_batch=args.query_batch, order=args.order, per_label=args.per_label,
                                balance_labels=args.balance_labels and task.kind == "classification")
            for method in args.methods:
                name, evaluator = _method(method)
                comp = compressor
                if evaluator in also:  # another compressor, the same subsets (same seed)
                    cfg = replace(base, method=name, evaluator="compressed", compressor=also_dirs[evaluator])
                    comp = also[evaluator]
                else:
                    cfg = replace(base, method=name, evaluator=evaluator)
                selection, summary, _ = select_demonstrations(cfg, model, tokenizer, comp, splits=splits)
                runs.append({"task": task_name, "seed": seed, "method": method,
                             "test_accuracy": summary["test_accuracy"], "flops": summary["flops"],
                             "wall_seconds": summary["wall_seconds"], "subsets": summary["subsets"],
                             "indices": list(selection.indices),
                             "scores": [float(x) if np.isfinite(x) else None for x in selection.scores],
                             "subset_losses": selection.details.get("subset_losses"),
                             **{key: selection.details.get(key) for key in
                                ("split_half", "reliability", "queries_needed", "query_losses", "query_labels")}})
                _log(f"{task_name} seed {seed} {method}: {summary['test_accuracy']:.3f} "
                     f"({summary['wall_seconds']:.0f} s)")
            # what a user gets with no demonstration at all, on the same test examples
            zero = evaluate_selection(model, PromptBuilder.for_model(model, tokenizer, task), [],
                                      splits.test[: args.test_size], query_batch=args.query_batch)
            runs.append({"task": task_name, "seed": seed, "method": ZERO_SHOT, "test_accuracy": zero["accuracy"],
                         "flops": 0, "wall_seconds": 0.0, "subsets": None, "indices": [], "scores": [],
                         "subset_losses": None})
    table = {}
    for task_name in args.tasks:
        for method in [*args.methods, ZERO_SHOT]:
            acc = [r["test_accuracy"] for r in runs if r["task"] == task_name and r["method"] == method]
            table.setdefault(task_name, {})[method] = (float(np.mean(acc)), float(np.std(acc)))
    return {"model": args.model, "k": args.k, "seeds": args.seeds, "runs": runs, "table": table,
            "agreement": agreement(runs, args.k),
            "settings": {k: getattr(args, k) for k in ("pool_size", "queries", "test_size", "subsets", "estimator",
                                                       "balance_labels", "order", "per_label")}}


def _method(method: str) -> tuple[str, str]:
    """``METHOD`` or ``affinity:EVALUATOR`` -> (method, evaluator); the evaluator defaults to compressed."""
    name, _, evaluator = method.partition(":")
    return name, evaluator or "compressed"


def agreement(runs: list[dict], k: int) -> list[dict]:
    """How far each compressed affinity run agrees with the dense evaluator on the same subsets.

    For every (task, seed) with an ``affinity:dense`` run, and every other affinity run of that
    (task, seed) that evaluated the same number of subsets (the same seed draws the same
    subsets): the Spearman correlation of the subset losses, of the affinity scores over the
    candidates both scored, and how many of the ``k`` chosen demonstrations the two share.
    """
    from scipy.stats import spearmanr

    out = []
    for ref in (r for r in runs if r["method"] == "affinity:dense" and r["subset_losses"]):
        for r in runs:
            same = r["task"] == ref["task"] and r["seed"] == ref["seed"]
            if not same or r is ref or not r["method"].startswith("affinity") or not r["subset_losses"]:
                continue
            if len(r["subset_losses"]) != len(ref["subset_losses"]):
                continue  # adaptive rounds can differ; only identical subset streams compare
            a, b = (np.array([np.nan if x is None else x for x in run["scores"]]) for run in (r, ref))
            both = np.isfinite(a) & np.isfinite(b)
            out.append({"task": r["task"], "seed": r["seed"], "method": r["method"],
                        "subset_loss_spearman": float(spearmanr(r["subset_losses"], ref["subset_losses"])[0]),
                        "score_spearman": float(spearmanr(a[both], b[both])[0]),
                        "overlap": len(set(r["indices"]) & set(ref["indices"])), "k": k,
                        "split_half": r.get("split_half"), "dense_split_half": ref.get("split_half"),
                        "dense_reliability": ref.get("reliability"), "dense_queries_needed": ref.get("queries_needed")})
    return out


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
    model, tokenizer, compressor = _load(args)
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
            _log(f"seed {seed} M={m}: " + ", ".join(f"{r['estimator']} {r['test_accuracy']:.3f}"
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


def tail_run(labels: list[str]) -> int:
    """How many demonstrations of the last one's label end the prompt."""
    run = 0
    for y in reversed(labels):
        if y != labels[-1]:
            break
        run += 1
    return run


def select_order(args: argparse.Namespace) -> dict:
    """Every selection of the ``--reports`` (``select-quality --json-out`` files) on the test set
    in each ``--orders`` prompt order; the report's own order is ``score``, whose accuracy must
    match the report's (``reproduced``). The ``random`` order is drawn ``--permutations`` times
    (the first is ``select --order random``'s): their mean is the selection's accuracy with the
    order averaged out, the number that compares selections rather than orders."""
    import json
    from pathlib import Path

    for order in args.orders:
        if order not in ARRANGE_ORDERS:
            raise ValueError(f"--orders {order!r}; accepted: {', '.join(ARRANGE_ORDERS)}")
    if args.permutations < 1:
        raise ValueError(f"--permutations {args.permutations}; expected >= 1 (random orders drawn per selection)")
    reports = []
    for path in args.reports:
        try:
            report = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"--reports {path}: not a readable select-quality report ({err})") from None
        if report.get("model") != args.model or "runs" not in report:
            raise ValueError(f"--reports {path}: a select-quality report of model {args.model!r} is expected, found "
                             f"model {report.get('model')!r}" + ("" if "runs" in report else " without runs"))
        if report["settings"].get("order", "score") != "score":
            raise ValueError(f"--reports {path}: its selections were put in {report['settings']['order']!r} order; "
                             "select-order rearranges selections in the score order (select-quality --order score)")
        reports.append((Path(path).stem, report))
    model, tokenizer = load_model(args.model)
    rows = []
    for name, report in reports:
        settings = report["settings"]
        for run in report["runs"]:
            task = get_task(run["task"])
            splits = split(task, pool_size=settings["pool_size"], seed=run["seed"])
            builder = PromptBuilder.for_model(model, tokenizer, task)
            test = splits.test[: settings["test_size"]]
            labels = [splits.pool[i].target for i in run["indices"]]
            zero = None  # the zero-shot row has no order: scored once
            for order in args.orders:
                rng = order_rng(run["seed"])  # successive draws: the permutations of the random order
                for p in range(args.permutations if order == "random" else 1):
                    indices = arrange(run["indices"], labels, order, rng)
                    if indices or zero is None:
                        acc = evaluate_selection(model, builder, [splits.pool[i] for i in indices], test,
                                                 query_batch=args.query_batch)["accuracy"]
                        zero = acc if not indices else None
                    else:
                        acc = zero
                    row = {"report": name, "task": run["task"], "seed": run["seed"], "method": run["method"],
                           "order": order, "indices": indices, "test_accuracy": acc,
                           "tail_run": tail_run([splits.pool[i].target for i in indices])}
                    if order == "random":
                        row["permutation"] = p
                    if order == "score":
                        row["reported"] = run["test_accuracy"]
                        row["reproduced"] = abs(acc - run["test_accuracy"]) < 1e-6
                    rows.append(row)
                    _log(f"{name} seed {run['seed']} {run['method']} {order}"
                         + (f" {p}" if order == "random" else "") + f": {acc:.3f} (tail run {row['tail_run']})")
    return {"model": args.model, "orders": args.orders, "permutations": args.permutations, "rows": rows,
            **order_tables(rows, args.orders)}


def headroom_summary(correct: np.ndarray, pred: np.ndarray, gold: np.ndarray) -> dict:
    """What ``S`` prompts (random subsets of one pool) do to ``Q`` test answers.

    ``correct``, ``pred``: ``(S, Q)`` the task's metric and the predicted label index of every
    set on every question; ``gold``: ``(Q,)`` the gold label indices. The spread of the sets'
    accuracies is what a selector can win over a random set (``best_minus_mean``: the best
    sampled set over the mean, a lower bound on an oracle's gain). ``moved``: the share of
    questions whose answer differs between any two sets; every sampled set's accuracy lies within
    ``fixed_right`` (right whatever the set) and ``fixed_right + moved``. ``some_set_right``: the
    questions at least one set answers right. ``one_answer_share``: the share of its answers a set
    gives with its most frequent one, averaged over the sets (1.0: every set answers one label);
    ``constant_answer``: the accuracy of always answering the most frequent gold label."""
    correct, pred, gold = np.asarray(correct, float), np.asarray(pred), np.asarray(gold)
    if correct.ndim != 2 or correct.shape != pred.shape or correct.shape[1] != len(gold):
        raise ValueError(f"correct {correct.shape} and pred {pred.shape} must be (sets, queries) with queries = "
                         f"len(gold) = {len(gold)}")
    if correct.shape[0] < 2:
        raise ValueError(f"{correct.shape[0]} set(s); the spread needs at least 2")
    acc = correct.mean(1)
    moved = (pred != pred[:1]).any(0)
    share = [np.unique(row, return_counts=True)[1].max() / len(row) for row in pred]
    return {"sets": int(correct.shape[0]), "queries": int(correct.shape[1]), "mean": float(acc.mean()),
            "std": float(acc.std()), "min": float(acc.min()), "max": float(acc.max()),
            "best_minus_mean": float(acc.max() - acc.mean()), "moved": float(moved.mean()),
            "fixed_right": float((correct.min(0) * ~moved).mean()), "some_set_right": float(correct.max(0).mean()),
            "one_answer_share": float(np.mean(share)),
            "constant_answer": float(np.unique(gold, return_counts=True)[1].max() / len(gold))}


def headroom(args: argparse.Namespace) -> dict:
    """``--sets`` random k-subsets of one pool per task (each in its drawn order), every one scored
    densely on the test set: how much choosing the demonstrations can move this model's
    accuracy on the task at all (:func:`headroom_summary`). Every task is checked before the
    first is scored; with ``--json-out`` the report is rewritten after every task (``partial``,
    ``tasks_done``), so a long run that is stopped keeps the tasks it finished."""
    if args.sets < 2:
        raise ValueError(f"--sets {args.sets}; expected >= 2 (the spread of accuracies needs two sets)")
    if args.k < 1:
        raise ValueError(f"--k {args.k}; expected >= 1")
    todo = []
    for task_name in args.tasks:
        task = get_task(task_name)
        if task.kind != "classification":
            raise ValueError(f"--tasks {task_name}: headroom reads predicted labels; the task is {task.kind!r}")
        splits = split(task, pool_size=args.pool_size, seed=args.seed)
        if args.k > len(splits.pool):
            raise ValueError(f"--k {args.k} is larger than {task_name}'s pool of {len(splits.pool)}")
        todo.append((task_name, task, splits))
    model, tokenizer = load_model(args.model)
    tasks = {}
    report = {"model": args.model, "k": args.k, "seed": args.seed, "pool_size": args.pool_size,
              "test_size": args.test_size, "tasks": tasks}
    for n, (task_name, task, splits) in enumerate(todo):
        builder = PromptBuilder.for_model(model, tokenizer, task)
        test = splits.test[: args.test_size]
        rng = np.random.default_rng(args.seed)
        sets, correct, pred = [], [], []
        for j in range(args.sets):
            idx = [int(i) for i in rng.choice(len(splits.pool), size=args.k, replace=False)]
            r = evaluate_selection(model, builder, [splits.pool[i] for i in idx], test,
                                     query_batch=args.query_batch, per_query=True)
            labels = Counter(splits.pool[i].target for i in idx)
            sets.append({"indices": idx, "test_accuracy": r["accuracy"], "test_loss": r["loss"],
                         "labels": dict(labels)})
            correct.append(r["correct"])
            pred.append(r["pred"])
            _log(f"{task_name} set {j}: {r['accuracy']:.3f} ({r['seconds']:.0f} s) labels {dict(labels)}")
        gold = [builder.label_index(e) for e in test]
        tasks[task_name] = {**headroom_summary(np.array(correct), np.array(pred), np.array(gold)), "set_rows": sets}
        if args.json_out and n < len(todo) - 1:
            atomic.write_json(args.json_out, {**report, "partial": True, "tasks_done": list(tasks),
                                              "argv": getattr(args, "argv", None)})
    return report


def order_tables(rows: list[dict], orders: list[str]) -> dict:
    """``table``: per order, the statistics over selections of each selection's accuracy (its
    mean over the random order's permutations), paired against the first order; ``methods``:
    per report and method, each order's mean and std over seeds."""
    per: dict = {}  # (report, seed, method) -> order -> accuracies
    for r in rows:
        per.setdefault((r["report"], r["seed"], r["method"]), {}).setdefault(r["order"], []).append(r["test_accuracy"])
    keys = list(per)
    acc = {o: np.array([np.mean(per[key][o]) for key in keys]) for o in orders}
    table = {}
    for order in orders:
        a = acc[order]
        table[order] = {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "selections": len(a)}
        draws = [len(per[key][order]) for key in keys]
        if max(draws) > 1:  # how far the order alone moves one selection's accuracy
            table[order]["within_std"] = float(np.mean([np.std(per[key][order]) for key in keys]))
            table[order]["draws"] = max(draws)
        if order != orders[0]:
            base = acc[orders[0]]
            table[order]["paired_diff"] = float((a - base).mean())
            table[order]["wins"] = int((a > base + 1e-9).sum())
            table[order]["losses"] = int((a < base - 1e-9).sum())
    methods: dict = {}
    for report, method in dict.fromkeys((key[0], key[2]) for key in keys):
        mine = [i for i, key in enumerate(keys) if key[0] == report and key[2] == method]
        methods.setdefault(report, {})[method] = {
            o: {"mean": float(acc[o][mine].mean()), "std": float(acc[o][mine].std()), "seeds": len(mine)}
            for o in orders}
    return {"table": table, "methods": methods}


def selection_markdown(kind: str, result: dict) -> str:
    if kind == "select-cost":
        lines = ["| k | prompt tokens | evaluator | GFLOP / subset | s / subset | s / subset, FLOPs counted | "
                 "FLOPs vs compressed | time vs compressed |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
        for r in result["rows"]:
            counting = r.get("seconds_per_subset_counting")
            lines.append(f"| {r['k']} | {r['prompt_tokens']:.0f} | {r['evaluator']} | "
                         f"{r['flops_per_subset'] / 1e9:.2f} | {r['seconds_per_subset']:.2f} | "
                         f"{'—' if counting is None else f'{counting:.2f}'} | "
                         f"{r['flops_vs_compressed']:.1f}x | {r['seconds_vs_compressed']:.1f}x |")
        return "\n".join(lines)
    if kind == "select-quality":
        methods = list(next(iter(result["table"].values())))
        lines = ["| task | " + " | ".join(methods) + " |", "|---|" + "---:|" * len(methods)]
        for task, row in result["table"].items():
            lines.append(f"| {task} | " + " | ".join(f"{100 * m:.1f} ± {100 * s:.1f}" for m, s in row.values()) + " |")
        means = [np.mean([result["table"][t][m][0] for t in result["table"]]) for m in methods]
        lines.append("| **mean** | " + " | ".join(f"**{100 * m:.1f}**" for m in means) + " |")
        if result.get("agreement"):
            f = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
            lines += ["", "| task | seed | method | subset-loss Spearman vs dense | score Spearman vs dense | "
                      "chosen in common with dense | split-half: method / dense | dense reliability "
                      f"(queries for {RELIABILITY_TARGET}) |",
                      "|---|---:|---|---:|---:|---:|---:|---:|"]
            lines += [f"| {a['task']} | {a['seed']} | {a['method']} | {a['subset_loss_spearman']:.2f} | "
                      f"{a['score_spearman']:.2f} | {a['overlap']} / {a['k']} | "
                      f"{f(a.get('split_half'))} / {f(a.get('dense_split_half'))} | "
                      f"{f(a.get('dense_reliability'))} ({a.get('dense_queries_needed') or '—'}) |"
                      for a in result["agreement"]]
        return "\n".join(lines)
    if kind == "select-order":
        base, orders = result["orders"][0], result["orders"]
        lines = ["| order | selections | test accuracy (mean ± std) | worst | paired diff vs " + base
                 + " | better / worse | order draws (std within a selection) |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for order, t in result["table"].items():
            diff = "—" if order == base else f"{100 * t['paired_diff']:+.1f}"
            wins = "—" if order == base else f"{t['wins']} / {t['losses']}"
            draws = f"{t['draws']} ({100 * t['within_std']:.1f})" if "draws" in t else "1"
            lines.append(f"| {order} | {t['selections']} | {100 * t['mean']:.1f} ± {100 * t['std']:.1f} | "
                         f"{100 * t['min']:.1f} | {diff} | {wins} | {draws} |")
        lines += ["", "| report | method | seeds | " + " | ".join(orders) + " |",
                  "|---|---|---:|" + "---:|" * len(orders)]
        for report, by_method in result.get("methods", {}).items():
            for method, by in by_method.items():
                lines.append(f"| {report} | {method} | {by[orders[0]]['seeds']} | " + " | ".join(
                    f"{100 * by[o]['mean']:.1f} ± {100 * by[o]['std']:.1f}" for o in orders) + " |")
        lines += ["", "| report | seed | method | " + " | ".join(f"{o} (tail run)" for o in orders) + " |",
                  "|---|---:|---|" + "---:|" * len(orders)]
        cells: dict = {}
        for r in result["rows"]:
            cells.setdefault((r["report"], r["seed"], r["method"]), {}).setdefault(r["order"], []).append(r)
        for (report, seed, method), by in cells.items():
            lines.append(f"| {report} | {seed} | {method} | " + " | ".join(_order_cell(by[o]) for o in orders) + " |")
        return "\n".join(lines)
    if kind == "headroom":
        lines = ["| task | sets | test accuracy (mean ± std) | min | max | max - mean | answers that move | "
                 "right whatever the set | some set right | one answer's share | constant answer |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {t} | {h['sets']} | {100 * h['mean']:.1f} ± {100 * h['std']:.1f} | {100 * h['min']:.1f} | "
                  f"{100 * h['max']:.1f} | {100 * h['best_minus_mean']:+.1f} | {100 * h['moved']:.1f}% | "
                  f"{100 * h['fixed_right']:.1f} | {100 * h['some_set_right']:.1f} | "
                  f"{100 * h['one_answer_share']:.1f}% | {100 * h['constant_answer']:.1f} |"
                  for t, h in result["tasks"].items()]
        return "\n".join(lines)
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


def _order_cell(rows: list[dict]) -> str:
    acc = [r["test_accuracy"] for r in rows]
    if len(rows) == 1:
        return f"{100 * acc[0]:.1f} ({rows[0]['tail_run']})"
    runs = [r["tail_run"] for r in rows]
    return f"{100 * np.mean(acc):.1f} ± {100 * np.std(acc):.1f} ({min(runs)}-{max(runs)})"

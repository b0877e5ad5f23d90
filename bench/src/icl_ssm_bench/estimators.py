"""``icl-ssm bench estimators`` and ``estimators-sim``: the selected set against the number of subsets.

``estimators``: test accuracy and loss of the selected set against the number of subsets, for
the mean and ridge estimators on one stream of subsets and for adaptive sampling
(``--permutations``: each set's order averaged out; ``--per-label``: the same scores with the
places shared out over the labels; ``--sampling stratified|both``: subsets drawn with the
labels in even shares, as ``select --stratify`` draws them). ``estimators-sim``: the same
curve on a planted datamodel, as the recall of the true best ``k``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from icl_ssm.compress.builders import cache_for
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.affinity import AffinitySelector
from icl_ssm.select.base import order_rng, top_k, top_k_per_label
from icl_ssm.select.estimators import mean_affinity, ridge_affinity
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm.select.sampling import balanced_subsets, stratified_subsets
from icl_ssm.select.subset_losses import CacheEvaluator, OracleEvaluator, SubsetEvaluator, SubsetLosses
from icl_ssm_bench.selection import load, log

EVALUATORS = ("compressed", "dense")
SAMPLINGS = ("uniform", "stratified", "both")


@dataclass(frozen=True)
class EstimatorsConfig:
    """One ``icl-ssm bench estimators`` run: the selected set's test accuracy and loss per number of subsets."""

    model: str
    compressor: str | None  # directory; the compressed evaluator needs it
    task: str
    evaluator: str  # one of EVALUATORS
    k: int
    seeds: tuple[int, ...]
    budgets: tuple[int, ...]  # numbers of subsets, cut from one stream per seed
    pool_size: int
    queries: int  # validation queries per subset
    test_size: int
    permutations: int  # random orders each selected set is scored in (0: its own order)
    balance_labels: bool
    per_label: bool
    adaptive: bool
    sampling: str  # one of SAMPLINGS
    batch: int
    query_batch: int

    def validate(self) -> None:
        if self.permutations < 0:
            raise ValueError(f"--permutations {self.permutations}; expected >= 0 (0: the selection's own prompt "
                             "order)")
        if self.evaluator not in EVALUATORS:
            raise ValueError(f"--evaluator {self.evaluator!r}; accepted: {', '.join(EVALUATORS)}")
        if self.evaluator == "compressed" and not self.compressor:
            raise ValueError("--evaluator compressed: no --compressor given; give --compressor DIR or "
                             "--evaluator dense")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"--sampling {self.sampling!r}; accepted: {', '.join(SAMPLINGS)}")
        if not self.seeds:
            raise ValueError("--seeds: none given; expected one or more seeds")
        if not self.budgets or min(self.budgets) < 1:
            raise ValueError(f"--budgets {' '.join(map(str, self.budgets))}; expected one or more values >= 1")
        if self.k < 1:
            raise ValueError(f"--k {self.k}; expected >= 1")


@dataclass(frozen=True)
class EstimatorsSimConfig:
    """One ``icl-ssm bench estimators-sim`` run: the recall of planted best demonstrations per number of subsets."""

    pool_size: int
    k: int
    signal: float  # std of the subsets' losses from the planted effects
    noise: float  # std of the evaluation noise per subset
    seeds: tuple[int, ...]
    budgets: tuple[int, ...]

    def validate(self) -> None:
        if not 1 <= self.k <= self.pool_size:
            raise ValueError(f"--k {self.k}; expected 1 <= k <= --pool-size ({self.pool_size})")
        if not self.seeds:
            raise ValueError("--seeds: none given; expected one or more seeds")
        if not self.budgets or min(self.budgets) < 1:
            raise ValueError(f"--budgets {' '.join(map(str, self.budgets))}; expected one or more values >= 1")


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


def estimators(cfg: EstimatorsConfig, save_partial: Callable[[dict], None] | None = None) -> dict:
    """The run of ``cfg`` (see the module); returns the record's body. ``save_partial`` is called
    with the record so far (``partial``) after every seed but the last, so that a long run that is
    stopped keeps the seeds it finished."""
    cfg.validate()
    model, tokenizer, compressor = load(cfg.model, cfg.compressor)
    task = get_task(cfg.task)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    inner = CacheEvaluator(model, builder, cache_for(cfg.evaluator, model, compressor), batch=cfg.batch,
                             query_batch=cfg.query_batch, balance_labels=cfg.balance_labels)
    rows = []
    for seed in cfg.seeds:
        splits = split(task, pool_size=cfg.pool_size, seed=seed)
        pool, validation, test = splits.pool, splits.validation[: cfg.queries], splits.test[: cfg.test_size]
        n = len(pool)
        memo, measured = _Memo(inner), {}

        def test_acc(indices):
            """The set's test accuracy and loss: in its own order, or averaged over the same
            ``--permutations`` random orders for every set of the seed (the order averaged out)."""
            key = tuple(sorted(indices)) if cfg.permutations else tuple(indices)
            if key not in measured:
                rng = order_rng(seed)
                orders = [list(key)] if not cfg.permutations else [
                    [key[i] for i in rng.permutation(len(key))] for _ in range(cfg.permutations)]
                runs = [evaluate_selection(model, builder, [pool[i] for i in o], test,
                                             query_batch=cfg.query_batch) for o in orders]
                measured[key] = {m: float(np.mean([r[m] for r in runs])) for m in ("accuracy", "loss")}
            return {"test_accuracy": measured[key]["accuracy"], "test_loss": measured[key]["loss"]}

        labels = [e.target for e in pool]
        streams = {}  # the subsets of each sampling, the budgets cut from one stream (paired)
        if cfg.sampling in ("uniform", "both"):
            streams[""] = balanced_subsets(n, cfg.k, max(cfg.budgets), np.random.default_rng(seed))
        if cfg.sampling in ("stratified", "both"):
            streams["/stratified"] = stratified_subsets(labels, cfg.k, max(cfg.budgets),
                                                          np.random.default_rng(seed))
        losses = {kind: memo.evaluate(pool, validation, stream).losses for kind, stream in streams.items()}

        def row(estimator, m, indices):
            return {"seed": seed, "estimator": estimator, "subsets": m, "indices": list(map(int, indices)),
                    "labels": dict(sorted(Counter(labels[i] for i in indices).items())), **test_acc(indices)}

        for m in cfg.budgets:
            for kind, stream in streams.items():
                for est, fn in (("mean", mean_affinity), ("ridge", ridge_affinity)):
                    scores, _ = fn(stream[:m], losses[kind][:m], n)
                    if kind:  # stratified subsets compare candidates within their label: chosen per label
                        rows.append(row(f"{est}{kind}", m, top_k_per_label(scores, labels, cfg.k)))
                    else:
                        rows.append(row(est, m, top_k(scores, cfg.k)))
                        if cfg.per_label:  # the same scores, the k places shared out over the labels
                            rows.append(row(f"{est}/per-label", m, top_k_per_label(scores, labels, cfg.k)))
            for kind in streams if cfg.adaptive else ():
                for est in ("mean", "ridge"):
                    # first round: the stream's first m/2 subsets (memo hits, paired)
                    sel = AffinitySelector(memo, subsets=m, estimator=est, adaptive=0.5, coverage=0,
                                             stratify=bool(kind)).select(pool, validation, cfg.k,
                                                                         np.random.default_rng(seed))
                    rows.append(row(f"{est}+adaptive{kind}", m, sel.indices))
            log(f"seed {seed} M={m}: " + ", ".join(f"{r['estimator']} {r['test_accuracy']:.3f}"
                                                    for r in rows if r["seed"] == seed and r["subsets"] == m))
        if save_partial and seed != cfg.seeds[-1]:  # a long run stopped early keeps the seeds it finished
            save_partial({**_estimators_report(cfg, rows), "partial": True})
    return _estimators_report(cfg, rows)


def _estimators_report(cfg: EstimatorsConfig, rows: list[dict]) -> dict:
    curve, target, needed = _curve(rows, max(cfg.budgets))
    loss_curve, loss_target, loss_needed = _curve(rows, max(cfg.budgets), "test_loss")
    return {"model": cfg.model, "task": cfg.task, "k": cfg.k, "evaluator": cfg.evaluator, "rows": rows,
            "curve": curve, "target": target, "subsets_to_reach_mean_at_max": needed,
            "loss_curve": loss_curve, "loss_target": loss_target, "subsets_to_reach_mean_loss_at_max": loss_needed,
            "seeds_done": sorted({r["seed"] for r in rows}),
            "settings": {"pool_size": cfg.pool_size, "queries": cfg.queries, "test_size": cfg.test_size,
                         "seeds": list(cfg.seeds), "budgets": list(cfg.budgets), "permutations": cfg.permutations,
                         "balance_labels": cfg.balance_labels, "per_label": cfg.per_label, "adaptive": cfg.adaptive,
                         "sampling": cfg.sampling}}


def estimators_sim(cfg: EstimatorsSimConfig) -> dict:
    """Planted datamodel: ``L_j = sum_{z in S_j} w_z + noise``; recall of the true best ``k``
    (the most negative ``w``) by each estimator against the number of subsets. The effects
    are scaled so that the subsets' losses spread as ``signal`` and the noise is
    ``noise`` (standard deviations), as measured for real subsets in BENCHMARKS.md."""
    cfg.validate()
    rows = []
    n, k = cfg.pool_size, cfg.k
    for seed in cfg.seeds:
        rng = np.random.default_rng(seed)
        w = rng.normal(size=n) * cfg.signal / np.sqrt(k)
        best = set(np.argsort(w)[:k].tolist())

        def loss(subset, rng=rng, w=w):
            return float(w[list(subset)].sum() + cfg.noise * rng.normal())

        oracle = OracleEvaluator(loss)
        pool = [Example(str(i), "", "") for i in range(n)]
        val = pool[:1]
        for m in cfg.budgets:
            for est in ("mean", "ridge"):
                for adaptive in (0.0, 0.5):
                    sel = AffinitySelector(oracle, subsets=m, estimator=est, adaptive=adaptive, coverage=0).select(
                        pool, val, k, np.random.default_rng(seed + 1))
                    name = est + ("+adaptive" if adaptive else "")
                    rows.append({"seed": seed, "estimator": name, "subsets": m,
                                 "test_accuracy": len(best & set(sel.indices)) / k})
    curve, target, needed = _curve(rows, max(cfg.budgets))
    return {"n": n, "k": k, "signal": cfg.signal, "noise": cfg.noise, "rows": rows, "curve": curve,
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

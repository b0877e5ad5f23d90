"""``icl-ssm bench select-quality``: test accuracy of every selection method over tasks and seeds.

Mean and std per task and method, zero-shot beside them, and how far each compressed affinity
run agrees with the dense evaluator on the same subsets (:func:`agreement`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from icl_ssm.compress.compressor import load_compressor
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.fidelity import parse_also
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.check import ZERO_SHOT
from icl_ssm.select.config import SelectConfig
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm.select.stage import select_demonstrations
from icl_ssm.select.subset_losses import RELIABILITY_TARGET
from icl_ssm_bench.selection import load, log


@dataclass(frozen=True)
class SelectQualityConfig:
    """One ``icl-ssm bench select-quality`` run: every selection method's test accuracy over tasks and seeds."""

    model: str
    compressor: str | None  # directory of the compressed evaluator
    also: tuple[str, ...]  # NAME=DIR: more compressors, each the evaluator of a method affinity:NAME
    tasks: tuple[str, ...]
    methods: tuple[str, ...]  # METHOD or affinity:EVALUATOR (compressed, dense or a NAME of `also`)
    k: int
    seeds: tuple[int, ...]
    pool_size: int
    queries: int  # validation queries per subset
    test_size: int
    subsets: int | None  # None: select's default
    estimator: str
    balance_labels: bool  # classification tasks only
    order: str  # prompt order of the chosen demonstrations
    per_label: bool
    batch: int
    query_batch: int

    def validate(self) -> None:
        also = parse_also(self.also)
        clash = sorted(set(also) & {"compressed", "dense"})
        if clash:
            raise ValueError(f"--also: the names {clash} are taken by the built-in evaluators; choose other names")
        for method in self.methods:
            name, evaluator = _method(method)
            if name == "affinity" and evaluator not in ("compressed", "dense", *also):
                raise ValueError(f"--methods {method!r}: unknown evaluator {evaluator!r}; accepted: compressed, "
                                 "dense" + "".join(f", {a}" for a in also) + " (names from --also NAME=DIR)")


def select_quality(cfg: SelectQualityConfig) -> dict:
    """The run of ``cfg`` (see the module); returns the record's body."""
    cfg.validate()
    model, tokenizer, compressor = load(cfg.model, cfg.compressor)
    also_dirs = parse_also(cfg.also)
    also = {name: load_compressor(path, model.config) for name, path in also_dirs.items()}
    runs = []
    for task_name in cfg.tasks:
        task = get_task(task_name)
        for seed in cfg.seeds:
            splits = split(task, pool_size=cfg.pool_size, seed=seed)
            base = SelectConfig(model=cfg.model, task=task_name, k=cfg.k, compressor=cfg.compressor,
                                subsets=cfg.subsets, estimator=cfg.estimator, queries=cfg.queries,
                                test_size=cfg.test_size, pool_size=cfg.pool_size, seed=seed, batch=cfg.batch,
                                query_batch=cfg.query_batch, order=cfg.order, per_label=cfg.per_label,
                                balance_labels=cfg.balance_labels and task.kind == "classification")
            for method in cfg.methods:
                name, evaluator = _method(method)
                comp = compressor
                if evaluator in also:  # another compressor, the same subsets (same seed)
                    select = replace(base, method=name, evaluator="compressed", compressor=also_dirs[evaluator])
                    comp = also[evaluator]
                else:
                    select = replace(base, method=name, evaluator=evaluator)
                selection, summary, _ = select_demonstrations(select, model, tokenizer, comp, splits=splits)
                runs.append({"task": task_name, "seed": seed, "method": method,
                             "test_accuracy": summary["test_accuracy"], "flops": summary["flops"],
                             "wall_seconds": summary["wall_seconds"], "subsets": summary["subsets"],
                             "indices": list(selection.indices),
                             "scores": [float(x) if np.isfinite(x) else None for x in selection.scores],
                             "subset_losses": selection.details.get("subset_losses"),
                             **{key: selection.details.get(key) for key in
                                ("split_half", "reliability", "queries_needed", "query_losses", "query_labels")}})
                log(f"{task_name} seed {seed} {method}: {summary['test_accuracy']:.3f} "
                     f"({summary['wall_seconds']:.0f} s)")
            # what a user gets with no demonstration at all, on the same test examples
            zero = evaluate_selection(model, PromptBuilder.for_model(model, tokenizer, task), [],
                                      splits.test[: cfg.test_size], query_batch=cfg.query_batch)
            runs.append({"task": task_name, "seed": seed, "method": ZERO_SHOT, "test_accuracy": zero["accuracy"],
                         "flops": 0, "wall_seconds": 0.0, "subsets": None, "indices": [], "scores": [],
                         "subset_losses": None})
    table = {}
    for task_name in cfg.tasks:
        for method in [*cfg.methods, ZERO_SHOT]:
            acc = [r["test_accuracy"] for r in runs if r["task"] == task_name and r["method"] == method]
            table.setdefault(task_name, {})[method] = (float(np.mean(acc)), float(np.std(acc)))
    return {"model": cfg.model, "k": cfg.k, "seeds": list(cfg.seeds), "runs": runs, "table": table,
            "agreement": agreement(runs, cfg.k),
            "settings": {k: getattr(cfg, k) for k in ("pool_size", "queries", "test_size", "subsets", "estimator",
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


def select_quality_markdown(result: dict) -> str:
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

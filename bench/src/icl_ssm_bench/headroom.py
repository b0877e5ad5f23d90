"""``icl-ssm bench headroom``: what there is to select on a task.

Random k-subsets of one pool scored densely on the test set, with how far their accuracies
spread and how many test answers move at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from icl_ssm.data.splits import Splits, split
from icl_ssm.data.tasks import Task, get_task
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm_bench.selection import log


@dataclass(frozen=True)
class HeadroomConfig:
    """One ``icl-ssm bench headroom`` run: how far random ``k``-sets of one pool move each task's test accuracy."""

    model: str
    tasks: tuple[str, ...]  # classification tasks
    k: int
    sets: int  # random subsets of the pool per task, each scored on the test set
    pool_size: int
    test_size: int
    seed: int
    query_batch: int

    def validate(self) -> None:
        if self.sets < 2:
            raise ValueError(f"--sets {self.sets}; expected >= 2 (the spread of accuracies needs two sets)")
        if self.k < 1:
            raise ValueError(f"--k {self.k}; expected >= 1")


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


def classification_splits(tasks, k: int, pool_size: int, seed: int, why: str) -> list[tuple[str, Task, Splits]]:
    """``(name, task, splits)`` of every task, each checked before any is scored: a classification
    task (``why`` says what needs it) whose pool holds ``k``."""
    todo = []
    for name in tasks:
        task = get_task(name)
        if task.kind != "classification":
            raise ValueError(f"--tasks {name}: {why}; the task is {task.kind!r}")
        splits = split(task, pool_size=pool_size, seed=seed)
        if k > len(splits.pool):
            raise ValueError(f"--k {k} is larger than {name}'s pool of {len(splits.pool)}")
        todo.append((name, task, splits))
    return todo


def headroom(cfg: HeadroomConfig, save_partial: Callable[[dict], None] | None = None) -> dict:
    """``sets`` random k-subsets of one pool per task (each in its drawn order), every one scored
    densely on the test set: how much choosing the demonstrations can move this model's
    accuracy on the task at all (:func:`headroom_summary`). Every task is checked before the
    first is scored; ``save_partial`` is called with the report so far (``partial``,
    ``tasks_done``) after every task but the last, so a long run that is stopped keeps the tasks
    it finished."""
    cfg.validate()
    todo = classification_splits(cfg.tasks, cfg.k, cfg.pool_size, cfg.seed, "headroom reads predicted labels")
    model, tokenizer = load_model(cfg.model)
    tasks = {}
    report = {"model": cfg.model, "k": cfg.k, "seed": cfg.seed, "pool_size": cfg.pool_size,
              "test_size": cfg.test_size, "tasks": tasks}
    for n, (task_name, task, splits) in enumerate(todo):
        builder = PromptBuilder.for_model(model, tokenizer, task)
        test = splits.test[: cfg.test_size]
        rng = np.random.default_rng(cfg.seed)
        sets, correct, pred = [], [], []
        for j in range(cfg.sets):
            idx = [int(i) for i in rng.choice(len(splits.pool), size=cfg.k, replace=False)]
            r = evaluate_selection(model, builder, [splits.pool[i] for i in idx], test,
                                     query_batch=cfg.query_batch, per_query=True)
            labels = Counter(splits.pool[i].target for i in idx)
            sets.append({"indices": idx, "test_accuracy": r["accuracy"], "test_loss": r["loss"],
                         "labels": dict(labels)})
            correct.append(r["correct"])
            pred.append(r["pred"])
            log(f"{task_name} set {j}: {r['accuracy']:.3f} ({r['seconds']:.0f} s) labels {dict(labels)}")
        gold = [builder.label_index(e) for e in test]
        tasks[task_name] = {**headroom_summary(np.array(correct), np.array(pred), np.array(gold)), "set_rows": sets}
        if save_partial and n < len(todo) - 1:
            save_partial({**report, "partial": True, "tasks_done": list(tasks)})
    return report


def headroom_markdown(result: dict) -> str:
    lines = ["| task | sets | test accuracy (mean ± std) | min | max | max - mean | answers that move | "
             "right whatever the set | some set right | one answer's share | constant answer |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {t} | {h['sets']} | {100 * h['mean']:.1f} ± {100 * h['std']:.1f} | {100 * h['min']:.1f} | "
              f"{100 * h['max']:.1f} | {100 * h['best_minus_mean']:+.1f} | {100 * h['moved']:.1f}% | "
              f"{100 * h['fixed_right']:.1f} | {100 * h['some_set_right']:.1f} | "
              f"{100 * h['one_answer_share']:.1f}% | {100 * h['constant_answer']:.1f} |"
              for t, h in result["tasks"].items()]
    return "\n".join(lines)

"""The paper's synthetic in-context regression study, on the library's own pieces.

A regression teacher (:mod:`icl_ssm_bench.synthetic.teacher`, a transformers model with a KV cache)
reads prompts of (x, y) pairs; a compressor is distilled from it by the same training loop as
for language models (:mod:`icl_ssm_bench.synthetic.distill`); selection is
:class:`~icl_ssm.select.affinity.AffinitySelector` over a
:class:`~icl_ssm_bench.synthetic.select.RegressionEvaluator`. The pool mixes demonstrations from the
query's cluster (D1) with demonstrations from other clusters (D2), which differ from D1 only in
the relation between x and y; a method that reads the input-label relation should choose D1.

- :func:`distill_synthetic`: a compressor (or its prompt-independent control) for a teacher;
- :func:`select_study`: test error against k of random-k, per-query nearest inputs (top-k),
  affinity on dense and on compressed caches, the D1 share of each pick, the mean affinity score
  of D1 and D2 candidates against the number of subsets, and FLOPs per evaluated subset;
- :func:`fidelity_study`: subset-loss Spearman of the compressed cache against the dense
  prompt, beside the control and the window of the same size, with paired intervals;
- :func:`flipped_probe`: prompts with right and with another cluster's targets, through the
  dense prompt, the compressed cache and a linear read-out of the SSM state
  (:func:`subset_states`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icl_ssm import atomic
from icl_ssm.compress.builders import CompressedCache, DenseCache, WindowCache
from icl_ssm.compress.cache import summary_states
from icl_ssm.compress.compressor import SSMCompressor, load_compressor
from icl_ssm.cost import measure
from icl_ssm.distill.config import DistillConfig
from icl_ssm.distill.train import train
from icl_ssm.evaluate.stats import interval, paired_separability, paired_spearman, spearman, spearman_ci
from icl_ssm.select.affinity import AffinitySelector
from icl_ssm.select.estimators import mean_affinity
from icl_ssm.select.sampling import balanced_subsets
from icl_ssm_bench.synthetic.distill import regression_targets
from icl_ssm_bench.synthetic.select import (
    RegressionEvaluator,
    nearest_prompts,
    pool_prompts,
    split_examples,
    test_errors,
)
from icl_ssm_bench.synthetic.task import RegressionTask
from icl_ssm_bench.synthetic.teacher import RegressionTeacher, load_teacher

# the synthetic recipe: a cache far smaller than a 2k-token prompt (k = 20: 40 tokens)
SYNTHETIC_RECIPE = dict(state_size=64, num_virtual=4, num_sink=2, num_recent=0, latent_size=64, gate=False,
                        system="scale_invariant", stage1_epochs=2.0, stage2_epochs=4.0, stage1_lr=3e-3,
                        stage2_lr=1e-3, warmup_ratio=0.1, lambda_rank=1.0, checkpoint_every=1000)


def task_of(teacher_dir: str | Path) -> RegressionTask:
    """The task a teacher was trained on, from its ``training.json``."""
    path = Path(teacher_dir) / "training.json"
    if not path.is_file():
        raise ValueError(f"teacher directory {str(teacher_dir)!r} has no training.json; "
                         "expected train_teacher's output")
    return RegressionTask(**json.loads(path.read_text())["task"])


def distill_synthetic(teacher_dir: str | Path, out: str | Path, *, k: int = 20, samples: int = 512,
                      queries: int = 8, group_size: int = 4, pool_size: int = 200, d1_share: float = 0.5,
                      seed: int = 0, control: bool = False, **overrides: Any) -> Path:
    """Distil a compressor for the teacher in ``teacher_dir`` into ``out`` (``SYNTHETIC_RECIPE``
    under ``overrides``); ``control=True`` trains its prompt-independent control."""
    teacher = load_teacher(teacher_dir)
    task = task_of(teacher_dir)
    recipe = {**SYNTHETIC_RECIPE, **overrides, "control": control}
    cfg = DistillConfig(model=str(teacher_dir), tasks=(f"synthetic-{task.function_class}",), k=k, samples=samples,
                        queries=queries, group_size=group_size, seed=seed, **recipe)
    targets = regression_targets(teacher, task, samples=samples, k=k, queries=queries, group_size=group_size,
                                 num_sink=cfg.num_sink, num_virtual=cfg.num_virtual, num_recent=cfg.num_recent,
                                 pool_size=pool_size, d1_share=d1_share, seed=seed)
    out = atomic.prepare_dir(out)
    train(teacher, targets, cfg, out)
    return out


def _load(teacher_dir, compressor_dir) -> tuple[RegressionTeacher, RegressionTask, SSMCompressor | None]:
    teacher = load_teacher(teacher_dir)
    compressor = None if compressor_dir is None else load_compressor(compressor_dir, teacher.config).eval()
    return teacher, task_of(teacher_dir), compressor


def select_study(teacher_dir: str | Path, compressor_dir: str | Path | None, *, ks: Sequence[int] = (5, 10, 20, 40),
                 seeds: Sequence[int] = (0, 1, 2), pool_size: int = 200, d1_share: float = 0.5, queries: int = 16,
                 test_size: int = 200, subsets: int = 200, random_prompts: int = 8,
                 checkpoints: Sequence[int] = (10, 50, 100, 200), estimator: str = "mean",
                 say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every method at every ``k`` and seed: test MSE, the D1 share of the pick, cost per subset.

    Each seed draws its own pool (``pool_size`` candidates, ``d1_share`` of them D1), ``queries``
    validation and ``test_size`` test queries from D1. Affinity scores ``subsets`` subsets (the
    same ones for both evaluators); ``checkpoints``: the mean affinity score of D1 and of D2
    candidates from the first m subsets of the dense and compressed runs (the paper's appendix
    table), at the largest k not above 20 (or the smallest k). ``estimator``: how affinity turns
    subset losses into candidate scores (:data:`~icl_ssm.select.estimators.ESTIMATORS`).
    """
    teacher, task, compressor = _load(teacher_dir, compressor_dir)
    rows, scores_table = [], []
    anchor_k = max([k for k in ks if k <= 20], default=min(ks))
    for seed in seeds:
        rng = np.random.default_rng([seed, 11])
        split = task.sample_selection(rng, pool_size, d1_share, queries, test_size,
                                      query_cluster=int(seed % task.clusters))
        pool, valid, _ = split_examples(split)
        d1 = split.pool_is_d1
        for k in ks:
            t0 = time.perf_counter()
            row: dict[str, Any] = {"k": k, "seed": seed}
            draws = np.random.default_rng([seed, k, 1])
            randoms = [draws.choice(pool_size, k, replace=False) for _ in range(random_prompts)]
            errs = [test_errors(teacher, split, [r]).mean() for r in randoms]
            row["random"] = {"mse": float(np.mean(errs)), "mse_sd": float(np.std(errs, ddof=1)) if len(errs) > 1
                             else None, "d1_share": float(np.mean([d1[r].mean() for r in randoms]))}
            near = nearest_prompts(split, k)
            row["topk"] = {"mse": float(test_errors(teacher, split, near).mean()),
                           "d1_share": float(np.mean([d1[p].mean() for p in near]))}
            # AffinitySelector draws its subsets first from this generator: both evaluators see these
            subs = balanced_subsets(pool_size, k, subsets, np.random.default_rng([seed, k, 2]))
            evaluators = {"dense": RegressionEvaluator(teacher, split, DenseCache(teacher))}
            if compressor is not None:
                evaluators["compressed"] = RegressionEvaluator(teacher, split, CompressedCache(teacher, compressor))
            for name, ev in evaluators.items():
                sel = AffinitySelector(ev, subsets=subsets, estimator=estimator).select(
                    pool, valid, k, np.random.default_rng([seed, k, 2]))
                losses = np.asarray(sel.details["subset_losses"])
                pick = [int(i) for i in sel.indices]
                row[f"affinity-{name}"] = {
                    "mse": float(test_errors(teacher, split, [pick]).mean()), "d1_share": float(d1[pick].mean()),
                    "flops_per_subset": sel.cost.flops / subsets, "seconds_per_subset": sel.cost.seconds / subsets,
                    "split_half": sel.details.get("split_half"),
                    "score_reliability": sel.details.get("score_reliability"),
                    "indices": pick}
                if k == anchor_k:
                    for m in checkpoints:
                        if m <= subsets:
                            s, _ = mean_affinity(subs[:m], losses[:m], pool_size)
                            scores_table.append({"seed": seed, "k": k, "evaluator": name, "subsets": m,
                                                 "d1_mean_score": float(np.nanmean(s[d1])),
                                                 "d2_mean_score": float(np.nanmean(s[~d1]))})
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            if say is not None:
                say(f"seed {seed} k {k}: " + ", ".join(f"{m} {row[m]['mse']:.3f} (D1 {row[m]['d1_share']:.2f})"
                                                        for m in row if isinstance(row[m], dict)))
    return {"teacher": str(teacher_dir), "compressor": None if compressor_dir is None else str(compressor_dir),
            "task": asdict(task), "pool_size": pool_size, "d1_share": d1_share, "queries": queries,
            "estimator": estimator,
            "test_size": test_size, "subsets": subsets, "rows": rows, "scores": scores_table,
            "summary": summarize_select(rows)}


def summarize_select(rows: Sequence[dict]) -> list[dict]:
    """Per k and method: the mean test MSE and D1 share over seeds, with their sd and the seeds."""
    out = []
    for k in sorted({r["k"] for r in rows}):
        at = [r for r in rows if r["k"] == k]
        for method in [m for m in at[0] if isinstance(at[0][m], dict)]:
            mse = np.array([r[method]["mse"] for r in at])
            share = np.array([r[method]["d1_share"] for r in at])
            row = {"k": k, "method": method, "seeds": len(at), "mse": float(mse.mean()),
                   "mse_sd": float(mse.std(ddof=1)) if len(at) > 1 else None, "d1_share": float(share.mean())}
            if "flops_per_subset" in at[0][method]:
                row["flops_per_subset"] = float(np.mean([r[method]["flops_per_subset"] for r in at]))
            out.append(row)
    return out


def fidelity_study(teacher_dir: str | Path, compressor_dir: str | Path, control_dir: str | Path | None = None, *,
                   k: int = 20, subsets: int = 64, queries: int = 64, pool_size: int = 200, d1_share: float = 0.5,
                   seed: int = 100) -> dict[str, Any]:
    """Held-out subsets (a pool and queries of a seed the compressor never saw): every cache
    path's subset losses against the dense prompt's; Spearman with its interval, and paired
    bootstrap differences against the control and the window of the compressed cache's size.
    FLOPs per subset: of the whole evaluation (``flops_per_subset``, ``flop_ratio``) and of
    building the cache alone, before the queries read it (``cache_flops_per_subset``,
    ``cache_flop_ratio``)."""
    teacher, task, compressor = _load(teacher_dir, compressor_dir)
    split = task.sample_selection(np.random.default_rng([seed, 12]), pool_size, d1_share, queries, 1)
    pool, valid, _ = split_examples(split)
    subs = balanced_subsets(pool_size, k, subsets, np.random.default_rng([seed, 13]))
    c = compressor.config
    paths = {"dense": RegressionEvaluator(teacher, split, DenseCache(teacher)),
             "compressed": RegressionEvaluator(teacher, split, CompressedCache(teacher, compressor)),
             "window": RegressionEvaluator(teacher, split,
                                           WindowCache(teacher, c.num_sink, c.num_virtual + c.num_recent))}
    if control_dir is not None:
        control = load_compressor(control_dir, teacher.config).eval()
        paths["control"] = RegressionEvaluator(teacher, split, CompressedCache(teacher, control, name="control"))
    results = {name: ev.evaluate(pool, valid, subs) for name, ev in paths.items()}
    dense = torch.as_tensor(results["dense"].query_losses)
    report: dict[str, Any] = {"k": k, "subsets": subsets, "queries": queries, "seed": seed,
                              "cache_slots": compressor.config.cache_length, "prompt_tokens": 2 * k}
    for name, res in results.items():
        if name == "dense":
            continue
        lo, hi = spearman_ci(results["dense"].losses, res.losses)
        rel = (res.losses - results["dense"].losses) / np.maximum(results["dense"].losses, 1e-9)
        report[name] = {"spearman": float(spearman(results["dense"].losses, res.losses)), "ci95": [lo, hi],
                        "mean_loss": float(res.losses.mean()), "mean_relative_loss_error": float(np.abs(rel).mean()),
                        "flops_per_subset": res.cost.flops / subsets}
    report["dense"] = {"mean_loss": float(results["dense"].losses.mean()),
                       "flops_per_subset": results["dense"].cost.flops / subsets}
    for name, ev in paths.items():  # the cache alone, before any query reads it
        report[name]["cache_flops_per_subset"] = _cache_flops(ev, split, subs[: ev.batch])
    report["paired"] = paired_spearman(dense, {n: torch.as_tensor(r.query_losses) for n, r in results.items()})
    report["flop_ratio"] = report["dense"]["flops_per_subset"] / report["compressed"]["flops_per_subset"]
    report["cache_flop_ratio"] = (report["dense"]["cache_flops_per_subset"]
                                  / report["compressed"]["cache_flops_per_subset"])
    return report


def _cache_flops(ev: RegressionEvaluator, split, subsets: Sequence[Sequence[int]]) -> float:
    """FLOPs per subset of building ``ev``'s cache of the prompts of ``subsets`` (no queries)."""
    with torch.no_grad(), measure() as cost:
        ev.build(pool_prompts(split, subsets).to(ev.model.read_in.weight.device))
    return cost.flops / len(subsets)


def flipped_pools(task: RegressionTask, pool_size: int, queries: int, seed: int):
    """The flipped-target probe's pools: ``pool_size`` D1 candidates (cluster 0) with
    ``queries`` validation queries, and the same inputs with the targets (noise included) of
    another cluster's function. Returns ``(split, broken)``."""
    rng = np.random.default_rng([seed, 14])
    split = task.sample_selection(rng, pool_size, 1.0, queries, 1, query_cluster=0)
    flipped_y = task.target(split.pool_x, 1 % task.clusters) + task.noise(rng, len(split.pool_y))
    return split, replace(split, pool_y=flipped_y.astype(np.float32))


def flipped_probe(teacher_dir: str | Path, compressor_dir: str | Path, *, k: int = 20, pairs: int = 64,
                  queries: int = 16, seed: int = 200) -> dict[str, Any]:
    """Subsets that differ only in whether their targets are right: each D1 subset's prompt as
    drawn, and the same inputs with the targets of another cluster's function (the input-label
    relation broken, the inputs and the targets' distribution kept). For each cache path, how
    much higher the loss of the broken prompt is, and in how many pairs it is higher at all."""
    teacher, task, compressor = _load(teacher_dir, compressor_dir)
    split, broken = flipped_pools(task, pool_size := 4 * k, queries, seed)
    subs = balanced_subsets(pool_size, k, pairs, np.random.default_rng([seed, 15]))
    out: dict[str, Any] = {"k": k, "pairs": pairs, "queries": queries}
    if compressor is not None and not compressor.config.control:
        # is the input-target relation in the SSM state at all? (a linear read-out of it)
        more = balanced_subsets(pool_size, k, 4 * pairs, np.random.default_rng([seed, 16]))
        out["state_separability"] = paired_separability(*(subset_states(teacher, compressor, s, more)
                                                          for s in (split, broken)))
    for name, cache in (("dense", DenseCache(teacher)), ("compressed", CompressedCache(teacher, compressor))):
        right = RegressionEvaluator(teacher, split, cache).evaluate(*split_examples(split)[:2], subs).losses
        wrong = RegressionEvaluator(teacher, broken, cache).evaluate(*split_examples(broken)[:2], subs).losses
        diff = wrong - right
        draws = np.random.default_rng(0).choice(diff, (2000, len(diff))).mean(1)
        out[name] = {"right": float(right.mean()), "flipped": float(wrong.mean()), "diff": float(diff.mean()),
                     "ci95": list(interval(draws)), "higher_share": float((diff > 0).mean())}
    return out


@torch.no_grad()
def subset_states(teacher: RegressionTeacher, compressor: SSMCompressor, split,
                  subsets: Sequence[Sequence[int]]) -> np.ndarray:
    """The SSM's final states ``(len(subsets), G * N)`` of the prompts of ``subsets`` of the pool."""
    return summary_states(teacher, compressor, pool_prompts(split, subsets)).flatten(1).double().numpy()


def select_markdown(result: dict) -> str:
    """The selection study's summary table and the D1/D2 score table."""
    lines = ["| k | method | test MSE (mean ± sd over seeds) | D1 share | FLOPs per subset |",
             "|---:|---|---:|---:|---:|"]
    for r in result["summary"]:
        sd = "" if r["mse_sd"] is None else f" ± {r['mse_sd']:.3f}"
        flops = f"{r['flops_per_subset'] / 1e6:.2f} M" if "flops_per_subset" in r else "-"
        lines.append(f"| {r['k']} | {r['method']} | {r['mse']:.3f}{sd} | {r['d1_share']:.2f} | {flops} |")
    if result["scores"]:
        lines += ["", "| evaluator | subsets | mean score D1 | mean score D2 |", "|---|---:|---:|---:|"]
        for ev in sorted({s["evaluator"] for s in result["scores"]}):
            for m in sorted({s["subsets"] for s in result["scores"]}):
                at = [s for s in result["scores"] if s["evaluator"] == ev and s["subsets"] == m]
                lines.append(f"| {ev} | {m} | {np.mean([s['d1_mean_score'] for s in at]):.3f} | "
                             f"{np.mean([s['d2_mean_score'] for s in at]):.3f} |")
    return "\n".join(lines) + "\n"


def plot_select(result: dict, path: str | Path) -> None:
    """Test MSE against k, one line per method (error bars: sd over seeds), as a PNG."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    for method in dict.fromkeys(r["method"] for r in result["summary"]):
        at = [r for r in result["summary"] if r["method"] == method]
        ax.errorbar([r["k"] for r in at], [r["mse"] for r in at], yerr=[r["mse_sd"] or 0.0 for r in at],
                    marker="o", capsize=3, label=method)
    ax.set_xlabel("k (demonstrations)")
    ax.set_ylabel("test MSE")
    ax.set_title(f"{result['task']['function_class']} regression, pool {result['pool_size']} "
                 f"({result['d1_share']:.0%} D1)")
    ax.legend()
    atomic.write_with(Path(path), lambda f: fig.savefig(f, format="png"))

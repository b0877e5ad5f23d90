"""``icl-ssm bench select-cost``: FLOPs and wall seconds per subset of the three evaluators.

FLOPs (FlopCounterMode, in a pass of their own) and wall seconds (timed without the counter,
and with it) per subset of compressed caches, dense prefix caches shared by a subset's
queries, and one full dense prompt per query (the paper's accounting), at several ``k``, in
one run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from icl_ssm.compress.builders import cache_for
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.sampling import balanced_subsets
from icl_ssm.select.subset_losses import CacheEvaluator, PerQueryDenseEvaluator, SubsetEvaluator
from icl_ssm_bench.selection import load, log


@dataclass(frozen=True)
class SelectCostConfig:
    """One ``icl-ssm bench select-cost`` run: FLOPs and seconds per subset of every evaluator at each ``k``."""

    model: str
    compressor: str | None  # directory; the compressed evaluator needs it
    task: str
    k: tuple[int, ...]
    queries: int  # validation queries per subset
    subsets: int  # timed subsets per evaluator, after one warm-up subset
    query_batch: int
    per_query_max_k: int  # largest k the dense per-query evaluator runs at
    seed: int

    def validate(self) -> None:
        if not self.compressor:
            raise ValueError("--compressor: none given; select-cost times the compressed evaluator, so it needs "
                             "a compressor directory (--compressor DIR)")
        if not self.k or min(self.k) < 1:
            raise ValueError(f"--k {' '.join(map(str, self.k))}; expected one or more values >= 1")
        for flag, value in (("--queries", self.queries), ("--subsets", self.subsets),
                            ("--query-batch", self.query_batch)):
            if value < 1:
                raise ValueError(f"{flag} {value}; expected >= 1")


def select_cost(cfg: SelectCostConfig) -> dict:
    """The run of ``cfg`` (see the module); returns the record's body."""
    cfg.validate()
    model, tokenizer, compressor = load(cfg.model, cfg.compressor)
    task = get_task(cfg.task)
    splits = split(task, seed=cfg.seed)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    validation = splits.validation[: cfg.queries]
    rows = []
    for k in cfg.k:
        subsets = balanced_subsets(len(splits.pool), k, cfg.subsets + 1, np.random.default_rng(cfg.seed))
        evaluators = {  # each query path: batched (a cache copy per query, padded) and packed
            f"{cache}{'-packed' if pack else ''}": CacheEvaluator(
                model, builder, cache_for(cache, model, compressor), batch=1,
                query_batch=cfg.query_batch, pack=pack)
            for pack in (False, True) for cache in ("compressed", "dense")
        }
        if k <= cfg.per_query_max_k:
            evaluators["dense-per-query"] = PerQueryDenseEvaluator(model, builder, batch=cfg.query_batch)
        lengths = [len(builder.build_prefix([splits.pool[i] for i in s]).input_ids) for s in subsets[1:]]
        rows += evaluator_rows(evaluators, splits.pool, validation, subsets, k, float(np.mean(lengths)))
    compare(rows)
    return {"model": cfg.model, "task": cfg.task, "queries": len(validation), "subsets": cfg.subsets,
            "rows": rows}


def evaluator_rows(evaluators: dict[str, SubsetEvaluator], pool: Sequence[Example], validation: Sequence[Example],
                   subsets: Sequence[Sequence[int]], k: int, prompt_tokens: float, warmup: bool = True,
                   say: Callable[[str], None] = log) -> list[dict]:
    """One row per evaluator: FLOPs per subset of ``subsets[1:]`` from a pass under the counter,
    seconds per subset from a pass without it (and with it, beside), after a warm-up on
    ``subsets[0]`` (``warmup=False``: none; the counted pass then warms the timed one up). On a
    GPU the row also has the timed pass's ``peak_bytes`` (``torch.cuda.max_memory_allocated``)."""
    rows = []
    for name, ev in evaluators.items():
        if warmup:
            ev.evaluate(pool, validation, subsets[:1])  # warm-up, not counted
        n = len(subsets) - 1
        counted = _with_flops(ev, "count").evaluate(pool, validation, subsets[1:])  # FLOPs
        timed = _with_flops(ev, "off").evaluate(pool, validation, subsets[1:])  # seconds, no counter
        row = {"k": k, "evaluator": name, "prompt_tokens": prompt_tokens,
               "flops_per_subset": counted.cost.flops / n, "seconds_per_subset": timed.cost.seconds / n,
               "seconds_per_subset_counting": counted.cost.seconds / n, "tokens_per_subset": timed.tokens / n}
        if timed.cost.peak_bytes is not None:
            row["peak_bytes"] = timed.cost.peak_bytes
        rows.append(row)
        say(f"k={k} {name}: {counted.cost.flops / n / 1e9:.1f} GFLOP, {timed.cost.seconds / n:.2f} s per subset "
            f"({counted.cost.seconds / n:.2f} s with the FLOP counter)")
    return rows


def compare(rows: list[dict]) -> None:
    """Each row's FLOPs and seconds against the compressed evaluator's at its ``k`` on the same
    query path (``-packed`` rows against ``compressed-packed``, the others, per-query included,
    against ``compressed``): ``flops_vs_compressed`` and ``seconds_vs_compressed``, in place."""
    for r in rows:
        path = "compressed-packed" if r["evaluator"].endswith("-packed") else "compressed"
        comp = next(c for c in rows if c["k"] == r["k"] and c["evaluator"] == path)
        r["flops_vs_compressed"] = r["flops_per_subset"] / comp["flops_per_subset"]
        r["seconds_vs_compressed"] = r["seconds_per_subset"] / comp["seconds_per_subset"]


def _with_flops(ev: SubsetEvaluator, mode: str) -> SubsetEvaluator:
    """``ev`` counting FLOPs as ``mode`` says (CacheEvaluator); the per-query reference always counts."""
    return replace(ev, flops=mode) if isinstance(ev, CacheEvaluator) else ev


def select_cost_markdown(result: dict) -> str:
    lines = ["| k | prompt tokens | evaluator | GFLOP / subset | s / subset | s / subset, FLOPs counted | "
             "FLOPs vs compressed | time vs compressed |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        counting = r.get("seconds_per_subset_counting")
        lines.append(f"| {r['k']} | {r['prompt_tokens']:.0f} | {r['evaluator']} | "
                     f"{r['flops_per_subset'] / 1e9:.2f} | {r['seconds_per_subset']:.2f} | "
                     f"{'—' if counting is None else f'{counting:.2f}'} | "
                     f"{r['flops_vs_compressed']:.1f}x | {r['seconds_vs_compressed']:.1f}x |")
    return "\n".join(lines)

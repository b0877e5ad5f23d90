"""``icl-ssm bench scale``: what selection costs at the paper's model sizes, on random weights.

Each named shape (:data:`icl_ssm_bench.shapes.SHAPES`) is built from its published config with
random weights (:func:`icl_ssm_bench.shapes.build_model`): the figures are cost, never quality.
Beside it, the compressor of the measured recipe, the paper's (16 virtual tokens and 4 sinks, no
exact recent tokens) and, on a shape with sliding-window layers, the recipe with the last
``window`` prompt tokens kept exact, which a sliding layer needs.

Per ``k`` and per evaluated subset, with demonstrations and queries of synthetic tokens of
Rotten Tomatoes' typical length (:class:`~icl_ssm_bench.shapes.SyntheticPrompts`): FLOPs
(counted), wall seconds and peak memory of the subset evaluators of ``bench select-cost``
(:func:`icl_ssm_bench.select_cost.evaluator_rows`), the cache build alone, and one distillation
step (stage 2, forward and backward). Beside the measurements, FLOPs projected from the shape
(:mod:`icl_ssm_bench.scale_projection`), which also stand in for a shape that cannot be measured
here; :mod:`icl_ssm_bench.scale_report` writes the record as markdown.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import PretrainedConfig, PreTrainedModel

from icl_ssm.compress.builders import CompressedCache, DenseCache
from icl_ssm.compress.cache import PrefixCache, teacher_forward
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, head_dim, kv_heads
from icl_ssm.cost import measure, peak_rss, rss_bytes, rss_peak, track_freed_memory
from icl_ssm.data.tasks import Example
from icl_ssm.distill.config import DistillConfig
from icl_ssm.distill.train import group_losses
from icl_ssm.evaluate.answers import pad_right
from icl_ssm.lm.hf import kv_from_cache, output_cache
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.sampling import balanced_subsets
from icl_ssm.select.subset_losses import CacheEvaluator, PerQueryDenseEvaluator, SubsetEvaluator
from icl_ssm_bench.scale_projection import Projection, estimate_bytes, memory_limit, projected_flops, ssm_flops
from icl_ssm_bench.select_cost import compare, evaluator_rows
from icl_ssm_bench.selection import log
from icl_ssm_bench.shapes import (
    DTYPES,
    RANDOM_WEIGHTS,
    SHAPES,
    GiB,
    SyntheticPrompts,
    SyntheticReviews,
    build_compressor,
    build_model,
    compressor_shapes,
    meta_model,
    parameter_count,
    shape_config,
    window_of,
)

# ---------------------------------------------------------------- the benchmark

@dataclass(frozen=True)
class LeanDenseCache:
    """The dense prefix of :func:`DenseCache` without the LM head over the prompt (a cost
    comparator: the logits of the prompt's own tokens are never read)."""

    model: PreTrainedModel
    name: str = "dense-lean"

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache:
        out = teacher_forward(self.model, input_ids, attention_mask, logits_to_keep=1)
        keys, values = kv_from_cache(output_cache(out))
        lengths = attention_mask.sum(1)
        return PrefixCache(keys, values, attention_mask.bool(), next_position=lengths, prompt_length=lengths)

    def tokens(self, attention_mask: Tensor) -> int:
        return int(attention_mask.sum())


@dataclass
class ScaleConfig:
    """One ``icl-ssm bench scale`` run. ``k`` holds demonstration counts or ``"max"``, the most
    whose prompt and one query fit the shape's context (capped at ``max_prompt_tokens``)."""

    shapes: tuple[str, ...] = ("qwen2.5-0.5b",)
    k: tuple[int | str, ...] = (20, 50)
    queries: int = 8  # validation queries per subset: `run`'s default (RunConfig.queries)
    prompts: SyntheticPrompts = field(default_factory=SyntheticPrompts)
    subsets: int = 1  # measured subsets per evaluator
    batch: int = 1  # subsets encoded together; 0: as many as the free GPU memory holds (<= subsets)
    query_batch: int = 32
    per_query_queries: int = 2  # queries the per-query evaluator is run on; its cost is scaled to `queries`
    per_query_max_k: int | None = 50
    device: str = "cpu"
    dtype: str = "float32"
    memory: bool = True  # peak memory: in process on a GPU, a child process on the CPU
    max_memory_gib: float | None = None  # refuse a shape or k beyond this (default: the free memory)
    max_prompt_tokens: int | None = None
    time_budget_s: float | None = None  # cases left when it is spent are skipped, and say so
    distill: bool = True
    project_only: bool = False  # no model built: the projected FLOPs alone
    seed: int = 0

    def __post_init__(self):
        self.shapes, self.k = tuple(self.shapes), tuple(self.k)
        for name in self.shapes:
            if name not in SHAPES:
                raise ValueError(f"--shapes {name!r}; accepted: {', '.join(SHAPES)}")
        for k in self.k:
            if k != "max" and not (isinstance(k, int) and k >= 1):
                raise ValueError(f"--k {k!r}: expected a positive integer or 'max'")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}; accepted: {', '.join(DTYPES)}")
        for name in ("queries", "subsets", "query_batch", "per_query_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.batch < 0:
            raise ValueError(f"--batch {self.batch}: expected >= 1, or 0 (as many as fit)")
        torch.device(self.device)  # a clear error for a bad device name

    def resolve_k(self, config: PretrainedConfig) -> list[int]:
        context = config.get_text_config().max_position_embeddings
        if self.max_prompt_tokens:
            context = min(context, self.max_prompt_tokens + self.prompts.query_tokens)
        top = self.prompts.max_k(context)
        out = [top if k == "max" else k for k in self.k]
        too_long = [k for k in out if k > top]
        if too_long:
            raise ValueError(f"--k {too_long}: prompts longer than the {context}-token context; at most {top} "
                             "demonstrations fit (or give 'max')")
        return list(dict.fromkeys(out))


@dataclass
class _Bench:
    """One shape, built: the model, its compressors and the synthetic data every case reads."""

    cfg: ScaleConfig
    name: str
    config: PretrainedConfig
    model: PreTrainedModel
    compressors: dict[str, SSMCompressor]
    builder: PromptBuilder
    pool: list[Example]
    validation: list[Example]

    @classmethod
    def build(cls, cfg: ScaleConfig, name: str, ks: Sequence[int]) -> _Bench:
        config = shape_config(name)
        device = torch.device(cfg.device)
        model = build_model(config, device, DTYPES[cfg.dtype], cfg.seed)
        compressors = {c: build_compressor(config, o, device, cfg.seed) for c, o in compressor_shapes(config).items()}
        rng = np.random.default_rng(cfg.seed)
        p = cfg.prompts
        pool = p.examples(max(ks) + 1, p.demo_tokens, rng, "demo")
        validation = p.examples(cfg.queries, p.query_tokens, rng, "query")
        builder = PromptBuilder.for_model(model, p.tokenizer(), SyntheticReviews())
        return cls(cfg, name, config, model, compressors, builder, pool, validation)

    def subsets(self, k: int) -> list[list[int]]:
        # the first is never measured (evaluator_rows' warm-up place; the counted pass warms up here)
        return balanced_subsets(len(self.pool), k, self.cfg.subsets + 1, np.random.default_rng([self.cfg.seed, k]))

    def evaluators(self, k: int, batch: int) -> dict[str, SubsetEvaluator]:
        """Every evaluator measured at ``k`` (names as in ``bench select-cost``; ``paper-`` and
        ``window-`` for the other compressors, ``dense-lean`` without the LM head over the prompt).
        The dense prefix is measured on the packed query path alone (``select``'s default)."""
        m, b, qb = self.model, self.builder, self.cfg.query_batch
        out: dict[str, SubsetEvaluator] = {
            "dense-packed": CacheEvaluator(m, b, DenseCache(m), batch=batch, query_batch=qb, pack=True),
            "dense-lean-packed": CacheEvaluator(m, b, LeanDenseCache(m), batch=batch, query_batch=qb, pack=True),
            "compressed": CacheEvaluator(m, b, CompressedCache(m, self.compressors["recipe"]), batch=batch,
                                         query_batch=qb, pack=False),
        }
        for c, compressor in self.compressors.items():
            prefix = "" if c == "recipe" else f"{c}-"
            out[f"{prefix}compressed-packed"] = CacheEvaluator(m, b, CompressedCache(m, compressor), batch=batch,
                                                                query_batch=qb, pack=True)
        return out

    def per_query(self) -> PerQueryDenseEvaluator:
        return PerQueryDenseEvaluator(self.model, self.builder, batch=self.cfg.query_batch)

    def builds(self) -> dict[str, Callable[[Tensor, Tensor], PrefixCache]]:
        """The cache builds measured alone: ``(ids, mask) -> PrefixCache``."""
        out = {"dense": DenseCache(self.model), "dense-lean": LeanDenseCache(self.model)}
        for c, compressor in self.compressors.items():
            out["compressed" if c == "recipe" else f"{c}-compressed"] = CompressedCache(self.model, compressor)
        return out

    def prompt_batch(self, k: int, batch: int) -> tuple[Tensor, Tensor]:
        """``batch`` right-padded prompts of ``k`` demonstrations, on the model's device."""
        subsets = self.subsets(k)[1:][:batch]
        ids, mask = pad_right([self.builder.build_prefix([self.pool[i] for i in s]) for s in subsets])
        return ids.to(self.model.device), mask.to(self.model.device)

    def distill_step(self, k: int) -> Callable[[], None]:
        """One stage-2 step of the recipe's compressor (forward and backward, no optimiser) on a
        group of ``DistillConfig().group_size`` prompts of ``k`` demonstrations and as many
        queries as ``DistillConfig().queries``; the teacher's targets are random tensors of the
        shapes a teacher cache stores (their values do not change the cost)."""
        dcfg = DistillConfig(k=k)
        compressor = self.compressors["recipe"]
        text = self.config.get_text_config()
        gen = torch.Generator().manual_seed(self.cfg.seed)
        rng = np.random.default_rng([self.cfg.seed, k, 1])
        p = self.cfg.prompts
        labels = torch.tensor([ids[0] for ids in self.builder.label_ids()])
        queries = p.examples(dcfg.queries, p.query_tokens, rng, "train-query")
        episodes = []
        for s in balanced_subsets(len(self.pool), k, dcfg.group_size, rng):
            Q = dcfg.queries
            gold = labels[torch.randint(len(labels), (Q,), generator=gen)]
            top = torch.randn(Q, dcfg.topk, generator=gen).log_softmax(-1).sort(dim=-1, descending=True).values
            episodes.append({
                "prompt_ids": torch.tensor(self.builder.build_prefix([self.pool[i] for i in s]).input_ids),
                "query_ids": [torch.tensor(self.builder.build_suffix(q).input_ids) for q in queries],
                "top_idx": torch.stack([torch.randperm(text.vocab_size, generator=gen)[: dcfg.topk]
                                        for _ in range(Q)]).int(),
                "top_logp": top, "gold_token": gold, "gold_logp": top[:, 0],
                "label_tokens": labels, "label_logp": top[:, : len(labels)],
                "hidden": torch.randn(Q, text.num_hidden_layers, text.hidden_size, generator=gen).half(),
            })

        def step() -> None:
            compressor.train()
            try:
                group_losses(self.model, compressor, episodes, dcfg, stage=2)["loss"].backward()
            finally:
                compressor.zero_grad(set_to_none=True)
                compressor.eval()

        return step


def _cuda_batch(bench: _Bench, k: int) -> int:
    """Subsets per forward on a GPU: as many as its free memory holds now, the model built (at
    most ``subsets``; within ``max_memory_gib`` when it is given)."""
    cfg, device = bench.cfg, bench.model.device
    free = torch.cuda.mem_get_info(device)[0]
    if cfg.max_memory_gib:
        free = min(free, int(cfg.max_memory_gib * GiB) - torch.cuda.memory_allocated(device))
    per = estimate_bytes(bench.config, DTYPES[cfg.dtype], cfg.prompts.prompt_tokens(k))["working"]
    return max(1, min(cfg.subsets, int(0.8 * free // per)))


def _case_row(k: int, case: str, n: int, counted, timed, **extra) -> dict:
    row = {"k": k, "case": case, "flops": counted.flops / n, "seconds": timed.seconds / n,
           "seconds_counting": counted.seconds / n, **extra}
    if timed.peak_bytes is not None:
        row["peak_bytes"] = timed.peak_bytes
    return row


def run_shape(cfg: ScaleConfig, name: str, say: Callable[[str], None] = log,
              deadline: float | None = None) -> dict:
    """Every measurement of one shape (see the module docstring): a dict with the shape, the
    compressors, ``rows`` (per evaluator and k), ``builds``, ``distill``, ``projected`` and
    ``skipped``; or ``refused`` with the reason, when the model cannot be served or would not fit."""
    from icl_ssm.lm.support import UnsupportedModelError, validate_supported

    config = shape_config(name)
    text = config.get_text_config()
    device = torch.device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    ks = cfg.resolve_k(config)
    out: dict[str, Any] = {"shape": name, "source": SHAPES[name].source, **_shape_fields(name, config),
                           "window": window_of(config), "k": ks, "dtype": cfg.dtype, "device": str(device)}
    out["compressors"] = {}
    for c, overrides in compressor_shapes(config).items():
        with torch.device("meta"):
            n = parameter_count(SSMCompressor(SSMCompressorConfig.for_teacher(config, **overrides)))
        out["compressors"][c] = {"overrides": overrides, "params": n, "bytes": 4 * n,
                                 "cache_slots": overrides["num_sink"] + overrides["num_virtual"]
                                 + overrides["num_recent"]}
    out["projected"] = _projections(cfg, config, ks)
    if cfg.project_only:
        return out
    try:
        validate_supported(config)
    except UnsupportedModelError as err:
        out["refused"] = f"not served: {err}"
        say(f"{name}: {out['refused']}")
        return out
    limit = int(cfg.max_memory_gib * GiB) if cfg.max_memory_gib else memory_limit(device)
    dcfg = DistillConfig()
    train = dcfg.group_size * dcfg.queries * cfg.prompts.query_tokens if cfg.distill else 0

    def need(k: int) -> dict:
        return estimate_bytes(config, dtype, cfg.prompts.prompt_tokens(k), max(cfg.batch, 1), train)

    given = "were given (--max-memory-gib)" if cfg.max_memory_gib else "are free"
    out["estimate_bytes"] = {k: need(k) for k in ks}
    least = need(min(ks))
    if least["weights"] + least["working"] > limit:
        out["refused"] = (f"would not fit: {name} in {cfg.dtype} needs about {_gib(least['weights'])} GiB of weights "
                          f"and {_gib(least['working'])} GiB more at k = {min(ks)}, and {_gib(limit)} GiB {given} on "
                          f"{device}; use a smaller k, a narrower dtype or a larger device")
        say(f"{name}: refused, {out['refused']}")
        return out
    out["refused_k"] = {k: (f"would not fit: {_gib(need(k)['weights'] + need(k)['working'])} GiB needed at k = {k}, "
                            f"{_gib(limit)} GiB {given}") for k in ks if sum(need(k).values()) > limit}
    ks = [k for k in ks if k not in out["refused_k"]]
    out["k"] = ks
    t0 = time.perf_counter()
    bench = _Bench.build(cfg, name, ks)
    out["build_seconds"] = time.perf_counter() - t0
    if device.type == "cuda":  # what the cases' peaks are measured above
        out["weights_allocated_bytes"] = torch.cuda.memory_allocated(device)
    say(f"{name}: built in {out['build_seconds']:.1f} s ({text.num_hidden_layers} layers, "
        f"{parameter_count(bench.model) / 1e9:.3f} B parameters, {cfg.dtype} on {device})")
    rows, builds, distill, skipped = [], [], [], []

    def budget_left(what: str) -> bool:
        if deadline is not None and time.perf_counter() > deadline:
            skipped.append(what)
            return False
        return True

    for k in ks:
        batch = cfg.batch or (_cuda_batch(bench, k) if device.type == "cuda" else 1)
        subsets = bench.subsets(k)
        prompt = float(np.mean([len(bench.builder.build_prefix([bench.pool[i] for i in s]).input_ids)
                                for s in subsets[1:]]))
        for ev_name, ev in bench.evaluators(k, batch).items():
            if budget_left(f"k={k} {ev_name}"):
                rows += [{**r, "batch": batch} for r in evaluator_rows({ev_name: ev}, bench.pool, bench.validation,
                                                                       subsets, k, prompt, warmup=False, say=say)]
        if (cfg.per_query_max_k is None or k <= cfg.per_query_max_k) and budget_left(f"k={k} dense-per-query"):
            m = min(cfg.per_query_queries, cfg.queries)
            (row,) = evaluator_rows({"dense-per-query": bench.per_query()}, bench.pool, bench.validation[:m],
                                    subsets, k, prompt, warmup=False,
                                    say=lambda line: say(f"{line} on {m} of {cfg.queries} queries"))
            scale = cfg.queries / m  # nothing is shared between a subset's queries: linear in them
            rows.append({**row, "flops_per_subset": row["flops_per_subset"] * scale,
                         "seconds_per_subset": row["seconds_per_subset"] * scale,
                         "seconds_per_subset_counting": row["seconds_per_subset_counting"] * scale,
                         "tokens_per_subset": row["tokens_per_subset"] * scale, "queries_measured": m,
                         "batch": batch})
        ids, mask = bench.prompt_batch(k, batch)
        for case, fn in bench.builds().items():
            if budget_left(f"k={k} build {case}"):
                with torch.no_grad(), measure(device) as counted:
                    fn(ids, mask)
                with torch.no_grad(), measure(device, count_flops=False) as timed:
                    fn(ids, mask)
                builds.append(_case_row(k, case, ids.shape[0], counted, timed, prompt_tokens=ids.shape[1]))
                say(f"k={k} build {case}: {counted.flops / ids.shape[0] / 1e9:.1f} GFLOP, "
                    f"{timed.seconds / ids.shape[0]:.3f} s per prompt")
        if cfg.distill and budget_left(f"k={k} distillation step"):
            step = bench.distill_step(k)
            with measure(device) as counted:
                step()
            with measure(device, count_flops=False) as timed:
                step()
            distill.append(_case_row(k, "distillation step", 1, counted, timed, group_size=dcfg.group_size,
                                     queries=dcfg.queries))
            say(f"k={k} distillation step: {counted.flops / 1e9:.1f} GFLOP, {timed.seconds:.2f} s")
    compare(rows)
    if cfg.memory and device.type == "cpu" and rows + builds + distill:
        try:
            peaks = peak_rss(memory_pass, cfg, name, [(r["k"], r["evaluator"]) for r in rows],
                             [(b["k"], b["case"]) for b in builds], [d["k"] for d in distill], baseline=False)
        except RuntimeError as err:  # no /proc/self/clear_refs (not Linux), or the child ran out of memory
            out["memory_not_measured"] = str(err)
            say(f"{name}: memory not measured: {err}")
        else:
            for part, measured in (("rows", rows), ("builds", builds), ("distill", distill)):
                for row, peak in zip(measured, peaks["result"][part], strict=True):
                    row.update(peak)
            out["weights_rss_bytes"] = peaks["result"]["weights_rss_bytes"]
    out.update(rows=rows, builds=builds, distill=distill, skipped=skipped,
               weights_bytes=parameter_count(bench.model) * torch.finfo(dtype).bits // 8)
    return out


def memory_pass(cfg: ScaleConfig, name: str, rows: list[tuple[int, str]], builds: list[tuple[int, str]],
                distill: list[int]) -> dict:
    """Run in a fresh process (:func:`icl_ssm.cost.peak_rss`): every case of :func:`run_shape`
    once more, each inside :func:`icl_ssm.cost.rss_peak`, in the same order. Returns per case
    ``peak_bytes`` (the process's resident set at its highest, weights included) and
    ``working_bytes`` (that above the resident set before the case)."""
    track_freed_memory()
    config = shape_config(name)
    ks = cfg.resolve_k(config)
    bench = _Bench.build(cfg, name, ks)
    batch = cfg.batch or 1
    out: dict[str, Any] = {"rows": [], "builds": [], "distill": [], "weights_rss_bytes": rss_bytes()}

    def peak(fn: Callable[[], Any]) -> dict:
        with rss_peak() as p:
            fn()
        return {"peak_bytes": p["peak_bytes"], "working_bytes": p["peak_bytes"] - p["start_bytes"]}

    for k, ev_name in rows:
        subsets = bench.subsets(k)
        if ev_name == "dense-per-query":
            m = min(cfg.per_query_queries, cfg.queries)
            out["rows"].append(peak(lambda: bench.per_query().evaluate(bench.pool, bench.validation[:m], subsets[1:])))
        else:
            ev = replace(bench.evaluators(k, batch)[ev_name], flops="off")
            out["rows"].append(peak(lambda ev=ev: ev.evaluate(bench.pool, bench.validation, subsets[1:])))
    for k, case in builds:
        ids, mask = bench.prompt_batch(k, batch)
        fn = bench.builds()[case]
        with torch.no_grad():
            out["builds"].append(peak(lambda fn=fn, ids=ids, mask=mask: fn(ids, mask)))
    for k in distill:
        out["distill"].append(peak(bench.distill_step(k)))
    return out


def _shape_fields(name: str, config: PretrainedConfig) -> dict:
    text = config.get_text_config()
    return {"layers": text.num_hidden_layers, "hidden": text.hidden_size, "heads": text.num_attention_heads,
            "kv_heads": kv_heads(text), "head_dim": head_dim(text), "vocab": text.vocab_size,
            "context": text.max_position_embeddings, "params": parameter_count(meta_model(config)),
            "published_params": SHAPES[name].published_params}


def _projections(cfg: ScaleConfig, config: PretrainedConfig, ks: Sequence[int]) -> list[dict]:
    """Projected FLOPs per evaluated subset (:func:`projected_flops`) at every ``k``, the compressors'
    own FLOPs counted on the CPU."""
    p = Projection.of(config)
    shapes = {c: SSMCompressorConfig.for_teacher(config, **o) for c, o in compressor_shapes(config).items()}
    out = []
    for k in ks:
        prompt = cfg.prompts.prompt_tokens(k)
        q, Q = cfg.prompts.query_tokens, cfg.queries
        row = {"k": k, "prompt_tokens": prompt}
        for ev in ("dense", "dense-packed", "dense-lean-packed", "dense-per-query"):
            row[ev] = projected_flops(p, ev, prompt, q, Q)
        for c, cc in shapes.items():
            ssm = ssm_flops(build_compressor(config, compressor_shapes(config)[c], cfg.device), prompt)
            prefix = "" if c == "recipe" else f"{c}-"
            for pack in (False, True):
                if pack or c == "recipe":
                    name = f"{prefix}compressed{'-packed' if pack else ''}"
                    row[name] = projected_flops(p, name, prompt, q, Q, cc, ssm)
        out.append(row)
    return out


def _gib(n: float) -> str:
    return f"{n / GiB:.1f}"


def run_scale(cfg: ScaleConfig, say: Callable[[str], None] = log) -> dict:
    """Every shape of ``cfg`` (:func:`run_shape`), in order, within ``cfg.time_budget_s``."""
    deadline = None if cfg.time_budget_s is None else time.perf_counter() + cfg.time_budget_s
    t0 = time.perf_counter()
    shapes = []
    for name in cfg.shapes:
        shapes.append(run_shape(cfg, name, say, deadline))
    settings = asdict(cfg)
    return {"settings": settings, "threads": torch.get_num_threads(), "shapes": shapes,
            "wall_seconds": time.perf_counter() - t0, "note": RANDOM_WEIGHTS}

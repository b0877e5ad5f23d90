"""One query answered from a compressed cache and, beside it, from the dense prompt, with the
logit gap, the sizes and the cost of each path: what ``icl-ssm compress`` shows, so a person
can see what compression does."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from icl_ssm.compress.cache import PrefixCache, compressed_cache, dense_cache
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, load_compressor
from icl_ssm.cost import Cost, measure, peak_rss
from icl_ssm.data.splits import split, validate_k
from icl_ssm.data.tasks import Example, Task, get_task
from icl_ssm.lm.generation import generate_answers
from icl_ssm.lm.models import DEFAULT_MODEL, load_model, model_info
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm.lm.prompts import Prompt, PromptBuilder
from icl_ssm.lm.scoring import predict_labels

MAX_LABELS = 10  # a demonstrations file with more distinct targets than this is read as generative
MAX_NEW_TOKENS = 48  # a generative answer's length


@dataclass
class SideBySideConfig:
    """What to compress and answer: ``demos`` (a JSONL file of ``{"input", "target"}``, with
    ``query``) or ``k`` demonstrations drawn with ``seed`` from ``task``'s pool (``query``
    defaulting to its first test example); the cache path is ``compressor`` (a trained
    compressor's directory), ``dense`` (the teacher's own K/V) or else an untrained compressor
    seeded with ``seed``. ``memory``: also each path's peak RSS, from fresh processes."""

    model: str = DEFAULT_MODEL
    task: str | None = None
    k: int = 8
    demos: str | None = None
    query: str | None = None
    compressor: str | None = None
    dense: bool = False  # the teacher's own K/V in the cache path (the dense prompt's cache)
    chat: bool = False
    memory: bool = False
    seed: int = 0
    task_options: dict[str, Any] = field(default_factory=dict)  # get_task's options for ``task``

    def validate(self) -> None:
        """Refuse a config with nothing to compress, or with two cache paths; before a model is loaded."""
        if self.demos is None and self.task is None:
            raise ValueError("give --demos FILE.jsonl or --task NAME with --k K")
        if self.dense and self.compressor:
            raise ValueError("--dense and --compressor are alternatives; give one")

    @property
    def mode(self) -> str:
        return "dense" if self.dense else ("trained" if self.compressor else "untrained")


class Answers(NamedTuple):
    """The query answered after each prefix, and what each path cost."""

    cache_tokens: int  # length of the compressed (or dense) prefix cache
    compressed: str
    dense: str
    max_abs_logit_diff: float  # of the next-token logits after the query
    rel_logit_err: float
    dense_cost: Cost
    compressed_cost: Cost


def read_demos(path: str) -> list[Example]:
    """``{"input": ..., "target": ...}`` per line; errors name the file and line."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--demos {path!r}: no such file")
    demos = []
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"--demos {path!r} is not UTF-8 text: {err}") from err
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n}: not JSON ({err.msg})") from err
        if not isinstance(record, dict) or not {"input", "target"} <= set(record):
            raise ValueError(f'{path}:{n}: expected an object with "input" and "target", got {line[:80]!r}')
        demos.append(Example(id=str(record.get("id", n)), input=str(record["input"]),
                               target=str(record["target"])))
    if not demos:
        raise ValueError(f"--demos {path!r} has no demonstrations")
    return demos


def side_by_side(cfg: SideBySideConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> dict:
    """The query of ``cfg`` answered after its demonstrations from the compressed cache and from
    the dense prompt (``model`` is ``cfg.model`` loaded): the sizes of the prompt, the cache and
    the compressor, both answers, the logit gap, and each path's FLOPs and seconds (and peak
    RSS with ``cfg.memory``), in the order they are shown."""
    info = model_info(model)
    task, demos, query = _demonstrations(cfg)
    builder = PromptBuilder.for_model(model, tokenizer, task, chat=cfg.chat)
    prefix_ids = torch.tensor([builder.build_prefix(demos).input_ids])  # (1, prompt tokens)
    suffix = builder.build_suffix(query)
    suffix_ids = torch.tensor([suffix.input_ids])  # (1, query tokens)
    compressor = _compressor(cfg, model, info["num_parameters"])
    answers = _answer_both(model, builder, None if cfg.dense else compressor, prefix_ids, suffix, suffix_ids)
    n_params = sum(p.numel() for p in compressor.parameters())
    c = compressor.config
    memory = _peak_memory(cfg, compressor, prefix_ids, suffix_ids) if cfg.memory else {}
    return {
        "model": cfg.model,
        "task": task.name,
        "mode": cfg.mode,
        "demonstrations": len(demos),
        "query": query.input,
        "prompt_tokens": prefix_ids.shape[1],
        "query_tokens": suffix_ids.shape[1],
        "sink_tokens": 0 if cfg.dense else c.num_sink,
        "virtual_tokens": 0 if cfg.dense else c.num_virtual,
        "cache_tokens": answers.cache_tokens,
        "compressor_params": 0 if cfg.dense else n_params,
        "teacher_params": info["num_parameters"],
        "param_fraction": 0.0 if cfg.dense else n_params / info["num_parameters"],
        "answer_compressed": answers.compressed,
        "answer_dense": answers.dense,
        "max_abs_logit_diff": answers.max_abs_logit_diff,
        "rel_logit_err": answers.rel_logit_err,
        "flops_dense": answers.dense_cost.flops,
        "flops_compressed": answers.compressed_cost.flops,
        "seconds_dense": answers.dense_cost.seconds,
        "seconds_compressed": answers.compressed_cost.seconds,
        **memory,
    }


def _demonstrations(cfg: SideBySideConfig) -> tuple[Task, list[Example], Example]:
    """``(task, demonstrations, query)``: the demonstrations file (formatted by ``cfg.task``
    when given, else read as its own task) or ``cfg.k`` drawn from the task's pool."""
    if cfg.demos is not None:
        demos = read_demos(cfg.demos)
        task = get_task(cfg.task, **cfg.task_options) if cfg.task else get_task(
            cfg.demos, input_field="input", label_field="target",
            kind="classification" if len({d.target for d in demos}) <= MAX_LABELS else "generative")
    else:
        task = get_task(cfg.task, **cfg.task_options)
        splits = split(task, seed=cfg.seed)
        validate_k(splits.pool, cfg.k)
        rng = torch.Generator().manual_seed(cfg.seed)
        demos = [splits.pool[i] for i in torch.randperm(len(splits.pool), generator=rng)[: cfg.k].tolist()]
    if cfg.query is not None:
        query = Example(id="query", input=cfg.query, target=demos[0].target)
    elif cfg.task is not None and cfg.demos is None:
        query = splits.test[0]
    else:
        raise ValueError("--query TEXT is required with --demos")
    return task, demos, query


def _compressor(cfg: SideBySideConfig, model: PreTrainedModel, num_parameters: int) -> SSMCompressor:
    """The trained compressor of ``cfg.compressor``, else an untrained one shaped for the teacher."""
    if cfg.compressor:
        return load_compressor(cfg.compressor, model.config)
    config = SSMCompressorConfig.for_teacher(model.config, name=cfg.model, num_parameters=num_parameters)
    with torch.random.fork_rng(devices=[]):  # a seeded untrained compressor, global RNG untouched
        torch.manual_seed(cfg.seed)
        return SSMCompressor(config).eval()


def _answer_both(
    model: PreTrainedModel, builder: PromptBuilder, compressor: SSMCompressor | None,
    prefix_ids: torch.Tensor, suffix: Prompt, suffix_ids: torch.Tensor,
) -> Answers:
    """The query answered after the dense prompt and after the compressed cache (the dense
    prompt's own cache when ``compressor`` is None), each path's forward timed after one warm-up.
    ``prefix_ids``: (1, prompt tokens); ``suffix_ids``: (1, query tokens)."""

    def compress() -> PrefixCache:
        return dense_cache(model, prefix_ids) if compressor is None else compressed_cache(model, compressor, prefix_ids)

    with torch.no_grad():
        compress()  # warm-up: the SSM's frozen powers are computed once, then cached
        with measure() as dense_cost:
            dense = dense_cache(model, prefix_ids)
            z_dense = forward_with_prefix(model, dense, suffix_ids).logits[0, -1]  # (vocab,)
        with measure() as comp_cost:
            comp = compress()
            z_comp = forward_with_prefix(model, comp, suffix_ids).logits[0, -1]  # (vocab,)
        answer_dense = _answer(model, builder, dense, suffix)
        answer_comp = _answer(model, builder, comp, suffix)
    return Answers(cache_tokens=comp.length, compressed=answer_comp, dense=answer_dense,
                   max_abs_logit_diff=(z_comp - z_dense).abs().max().item(),
                   rel_logit_err=((z_comp - z_dense).norm() / z_dense.norm()).item(),
                   dense_cost=dense_cost, compressed_cost=comp_cost)


def _answer(model: PreTrainedModel, builder: PromptBuilder, prefix: PrefixCache, suffix: Prompt) -> str:
    task = builder.task
    if task.kind == "classification":
        return predict_labels(model, builder, [suffix], prefix=prefix)[0]
    return generate_answers(model, builder, [suffix], prefix=prefix, max_new_tokens=MAX_NEW_TOKENS)[0]


def _peak_memory(
    cfg: SideBySideConfig, compressor: SSMCompressor, prefix_ids: torch.Tensor, suffix_ids: torch.Tensor
) -> dict[str, int]:
    """Peak RSS of answering from the dense prompt and (unless ``cfg.dense``) from the compressed
    cache, each in a fresh process that loads ``cfg.model`` again, and of a process that only imports torch."""
    spec = cfg.compressor or compressor.config.to_dict()
    dense_rss = peak_rss(_memory_job, cfg.model, "dense", None, prefix_ids, suffix_ids)
    memory = {"peak_rss_dense_bytes": dense_rss["peak_rss_bytes"],
              "peak_rss_baseline_bytes": dense_rss["baseline_rss_bytes"]}
    if not cfg.dense:
        comp_rss = peak_rss(_memory_job, cfg.model, "compressed", spec, prefix_ids, suffix_ids, baseline=False)
        memory["peak_rss_compressed_bytes"] = comp_rss["peak_rss_bytes"]
    return memory


def _memory_job(model_name: str, mode: str, compressor: str | dict | None, prefix_ids, suffix_ids) -> None:
    """One answer from a fresh process (for its peak RSS): ``mode`` dense or compressed."""
    model, _ = load_model(model_name)
    with torch.no_grad():
        if mode == "dense":
            prefix = dense_cache(model, prefix_ids)
        else:
            comp = (load_compressor(compressor, model.config) if isinstance(compressor, str)
                    else SSMCompressor(SSMCompressorConfig(**compressor)))
            prefix = compressed_cache(model, comp, prefix_ids)
        forward_with_prefix(model, prefix, suffix_ids)

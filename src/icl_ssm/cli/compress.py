"""``icl-ssm compress``: compress demonstrations, answer a query from the compressed cache and,
beside it, from the dense prompt, so a person can see what compression does."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from icl_ssm.cli.options import add_target, task_options
from icl_ssm.compress.cache import compressed_cache, exact_cache, forward_with_prefix
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, load_compressor
from icl_ssm.cost import measure, peak_rss
from icl_ssm.data.splits import split, validate_k
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.lm.generation import generate_answers
from icl_ssm.lm.models import load_model, model_info
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import predict_labels


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


def _answer(model, builder, prefix, suffix) -> str:
    task = builder.task
    if task.kind == "classification":
        return predict_labels(model, builder, [suffix], prefix=prefix)[0]
    return generate_answers(model, builder, [suffix], prefix=prefix, max_new_tokens=48)[0]


def _memory_job(model_name: str, mode: str, compressor: str | dict | None, prefix_ids, suffix_ids) -> None:
    """One answer from a fresh process (for its peak RSS): dense, exact or compressed."""
    model, _ = load_model(model_name)
    with torch.no_grad():
        if mode == "dense":
            prefix = exact_cache(model, prefix_ids)
        else:
            comp = (load_compressor(compressor, model.config) if isinstance(compressor, str)
                    else SSMCompressor(SSMCompressorConfig(**compressor)))
            prefix = compressed_cache(model, comp, prefix_ids)
        forward_with_prefix(model, prefix, suffix_ids)


def run_compress(args: argparse.Namespace) -> dict:
    if args.demos is None and args.task is None:
        raise ValueError("give --demos FILE.jsonl or --task NAME with --k K")
    if args.exact and args.compressor:
        raise ValueError("--exact and --compressor are alternatives; give one")
    model, tokenizer = load_model(args.model)
    info = model_info(model)
    if args.demos is not None:
        demos = read_demos(args.demos)
        task = get_task(args.task, **task_options(args)) if args.task else get_task(
            args.demos, input_field="input", label_field="target",
            kind="classification" if len({d.target for d in demos}) <= 10 else "generative")
    else:
        task = get_task(args.task, **task_options(args))
        splits = split(task, seed=args.seed)
        validate_k(splits.pool, args.k)
        rng = torch.Generator().manual_seed(args.seed)
        demos = [splits.pool[i] for i in torch.randperm(len(splits.pool), generator=rng)[: args.k].tolist()]
    if args.query is not None:
        query = Example(id="query", input=args.query, target=demos[0].target)
    elif args.task is not None and args.demos is None:
        query = splits.test[0]
    else:
        raise ValueError("--query TEXT is required with --demos")

    builder = PromptBuilder.for_model(model, tokenizer, task, chat=args.chat)
    prefix_ids = torch.tensor([builder.build_prefix(demos).input_ids])
    suffix = builder.build_suffix(query)
    suffix_ids = torch.tensor([suffix.input_ids])

    if args.compressor:
        compressor = load_compressor(args.compressor, model.config)
    else:
        config = SSMCompressorConfig.for_teacher(model.config, name=args.model,
                                                 num_parameters=info["num_parameters"])
        with torch.random.fork_rng(devices=[]):  # a seeded untrained compressor, global RNG untouched
            torch.manual_seed(args.seed)
            compressor = SSMCompressor(config).eval()
    def compress():
        return exact_cache(model, prefix_ids) if args.exact else compressed_cache(model, compressor, prefix_ids)

    with torch.no_grad():
        compress()  # warm-up: the SSM's frozen powers are computed once, then cached
        with measure() as dense_cost:
            dense = exact_cache(model, prefix_ids)
            z_dense = forward_with_prefix(model, dense, suffix_ids).logits[0, -1]
        with measure() as comp_cost:
            comp = compress()
            z_comp = forward_with_prefix(model, comp, suffix_ids).logits[0, -1]
        answer_dense = _answer(model, builder, dense, suffix)
        answer_comp = _answer(model, builder, comp, suffix)
    n_params = sum(p.numel() for p in compressor.parameters())
    c = compressor.config
    memory = {}
    if args.memory:
        spec = args.compressor or compressor.config.to_dict()
        dense_rss = peak_rss(_memory_job, args.model, "dense", None, prefix_ids, suffix_ids)
        memory["peak_rss_dense_bytes"] = dense_rss["peak_rss_bytes"]
        memory["peak_rss_baseline_bytes"] = dense_rss["baseline_rss_bytes"]
        if not args.exact:
            comp_rss = peak_rss(_memory_job, args.model, "compressed", spec, prefix_ids, suffix_ids, baseline=False)
            memory["peak_rss_compressed_bytes"] = comp_rss["peak_rss_bytes"]
    return {
        "model": args.model,
        "task": task.name,
        "mode": "exact" if args.exact else ("trained" if args.compressor else "untrained"),
        "demonstrations": len(demos),
        "query": query.input,
        "prompt_tokens": prefix_ids.shape[1],
        "query_tokens": suffix_ids.shape[1],
        "sink_tokens": 0 if args.exact else c.num_sink,
        "virtual_tokens": 0 if args.exact else c.num_virtual,
        "cache_tokens": comp.length,
        "compressor_params": 0 if args.exact else n_params,
        "teacher_params": info["num_parameters"],
        "param_fraction": 0.0 if args.exact else n_params / info["num_parameters"],
        "answer_compressed": answer_comp,
        "answer_dense": answer_dense,
        "max_abs_logit_diff": (z_comp - z_dense).abs().max().item(),
        "rel_logit_err": ((z_comp - z_dense).norm() / z_dense.norm()).item(),
        "flops_dense": dense_cost.flops,
        "flops_compressed": comp_cost.flops,
        "seconds_dense": dense_cost.seconds,
        "seconds_compressed": comp_cost.seconds,
        **memory,
    }


def _main(args: argparse.Namespace) -> int:
    result = run_compress(args)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['model']} - {result['task']} - {result['mode']} cache", show_header=False)
    for key, value in result.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console().print(table)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compress",
        help="answer a query from a compressed cache and from the dense prompt, side by side",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_target(p, task_help="take demonstrations from this task's pool (or format --demos with it)",
               k_help="demonstrations drawn from --task's pool")
    p.add_argument("--demos", help='JSONL file, one {"input": ..., "target": ...} per line')
    p.add_argument("--query", help="the query text (default with --task: its first test example)")
    p.add_argument("--compressor", help="directory of a trained compressor (default: an untrained one)")
    p.add_argument("--exact", action="store_true", help="put the teacher's own K/V in the cache path instead")
    p.add_argument("--chat", action="store_true", help="format through the tokenizer's chat template")
    p.add_argument("--memory", action="store_true",
                   help="also measure peak memory of each path (fresh subprocesses: slower)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_main)

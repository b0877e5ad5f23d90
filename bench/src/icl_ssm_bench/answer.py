"""``icl-ssm bench answer``: answers per second with a prompt's prefix encoded once and shared,
exact or compressed, against re-encoding the whole prompt for every input (what a user without a
shared prefix does), with the peak memory of each and how far their answers agree.

Each path runs in a subprocess of its own (:func:`worker`), so that its peak resident set size
(``getrusage(RUSAGE_SELF).ru_maxrss``, which counts torch's allocations, unlike ``tracemalloc``)
is its own; the peak before answering (the model loaded, the prompt built) is recorded too.
Each path answers a first batch untimed (warm-up), then the timed inputs; the shared paths'
time includes encoding the prefix once. The paths run one after another on the same machine
with the same torch threads: compare ratios within one record, not seconds across records.

With ``shape`` (a name of :data:`icl_ssm_bench.shapes.SHAPES`), the model is that published
shape with random weights, read through ``model``'s tokenizer, and the compressed path uses a
random compressor of the recipe's shape: its rates and memory are cost at that size; its answers
mean nothing, so only the exact path's identity with re-encoding is compared.

The prompt: ``k`` demonstrations drawn at random from a pool of ``pool_size`` (seeded), shared
out evenly over the labels and interleaved (``select --method random --per-label --order
interleave``); the inputs: the task's test split of ``inputs`` examples, disjoint from the pool.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from icl_ssm.lm.models import DEFAULT_MODEL

PATHS = ("shared-exact", "shared-compressed", "reencode")
TITLES = {"shared-exact": "prefix encoded once, exact cache", "shared-compressed": "prefix encoded once, compressed "
          "cache", "reencode": "whole prompt re-encoded per input"}


@dataclass
class AnswerBenchConfig:
    model: str = DEFAULT_MODEL  # with ``shape``: the tokenizer's model only
    shape: str | None = None  # a bench scale shape with random weights (cost only)
    task: str = "rotten_tomatoes"
    k: int = 20
    inputs: int = 1000  # answered by every path
    reencode_inputs: int | None = None  # the re-encoding path on the first this many only (None: all of them)
    batch: int = 16  # inputs per forward, every path
    pool_size: int = 200
    seed: int = 0
    compressor: str | None = None  # shared-compressed: default the compressor shipped for model, task and k
    paths: tuple[str, ...] = PATHS
    logit_check: int = 16  # inputs whose full-vocabulary logits the exact path compares with the reference
    threads: int = 1  # torch threads in every worker
    task_options: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        unknown = [p for p in self.paths if p not in PATHS]
        if unknown:
            raise ValueError(f"--paths {unknown}; accepted: {', '.join(PATHS)}")
        for name in ("k", "inputs", "batch", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.reencode_inputs is not None and not 1 <= self.reencode_inputs <= self.inputs:
            raise ValueError(f"--reencode-inputs {self.reencode_inputs}: expected 1 to --inputs {self.inputs}")
        if self.shape is not None:
            from icl_ssm_bench.shapes import SHAPES

            if self.shape not in SHAPES:
                raise ValueError(f"--shape {self.shape!r}; accepted: {', '.join(SHAPES)}")
            if self.compressor is not None:
                raise ValueError(f"--compressor {self.compressor!r} with --shape {self.shape}: a shape's compressed "
                                 "path uses a random compressor of the recipe's shape; give one or the other")


def shape_model(cfg: AnswerBenchConfig):
    """``(model, tokenizer)`` for ``cfg.shape``: the shape with random weights and the tokenizer of
    ``cfg.model`` (its ids must fall inside the shape's vocabulary)."""
    from icl_ssm.lm.models import load_tokenizer
    from icl_ssm_bench.shapes import build_model, shape_config

    config = shape_config(cfg.shape)
    tokenizer = load_tokenizer(cfg.model)
    vocab = config.get_text_config().vocab_size
    if len(tokenizer) > vocab:
        raise ValueError(f"--model {cfg.model!r}: its tokenizer has {len(tokenizer)} tokens, more than shape "
                         f"{cfg.shape!r}'s vocabulary of {vocab}; pick a model whose tokenizer fits")
    return build_model(config, seed=cfg.seed), tokenizer


def bench_setup(cfg: AnswerBenchConfig, model, tokenizer):
    """``(selected, inputs, task)``: the prompt and the inputs every path answers."""
    from icl_ssm.data.splits import split
    from icl_ssm.data.tasks import get_task
    from icl_ssm.select.base import arrange, order_rng, top_k_per_label
    from icl_ssm.select.selected import SelectedPrompt

    task = get_task(cfg.task, **cfg.task_options)
    splits = split(task, pool_size=cfg.pool_size, seed=cfg.seed, test_size=cfg.inputs)
    pool = splits.pool
    labels = [e.target for e in pool]
    chosen = top_k_per_label(np.random.default_rng(cfg.seed).random(len(pool)), labels, cfg.k)
    indices = arrange(chosen, [labels[i] for i in chosen], "interleave", order_rng(cfg.seed))
    selected = SelectedPrompt.from_pool(pool, indices, model=cfg.model, task=task, method="random",
                                        task_options=cfg.task_options)
    return selected, list(splits.test[: cfg.inputs]), task


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run_path(cfg: AnswerBenchConfig, path: str) -> dict[str, Any]:
    """One path in this process: load, warm up on one batch, answer the timed inputs; the
    answers, label scores, seconds and peak memory."""
    import torch

    from icl_ssm.apply.answer import (
        answer_inputs,
        answer_inputs_ref,
        scores_after_prefix,
        scores_reencoded,
        shared_prefix,
    )
    from icl_ssm.compress.compressor import load_compressor
    from icl_ssm.compress.pretrained import find_pretrained
    from icl_ssm.lm.models import load_model
    from icl_ssm.lm.prompts import PromptBuilder

    torch.set_num_threads(cfg.threads)
    compressor, where = None, None
    if cfg.shape is not None:
        from icl_ssm_bench.shapes import build_compressor, compressor_shapes

        model, tokenizer = shape_model(cfg)
        if path == "shared-compressed":  # a random compressor of the recipe's shape: cost only
            recipe = compressor_shapes(model.config)["recipe"]
            compressor, where = build_compressor(model.config, recipe, seed=cfg.seed), "random, the recipe's shape"
    else:
        model, tokenizer = load_model(cfg.model)
    selected, inputs, task = bench_setup(cfg, model, tokenizer)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    if path == "shared-compressed" and compressor is None:
        shipped = find_pretrained(cfg.model, cfg.task, cfg.k)
        where = cfg.compressor or (str(shipped / "compressor") if shipped else None)
        if where is None:
            raise ValueError(f"no compressor is shipped for {cfg.model} / {cfg.task}; pass --compressor DIR")
        compressor = load_compressor(where, model.config)
    if path == "reencode":
        inputs = inputs[: cfg.reencode_inputs or len(inputs)]

        def answer(qs):
            return answer_inputs_ref(model, tokenizer, selected, qs, task=task, batch=cfg.batch)
    else:
        def answer(qs):
            return answer_inputs(model, tokenizer, selected, qs, task=task, batch=cfg.batch,
                                 cache="dense" if path == "shared-exact" else "compressed", compressor=compressor)
    loaded = _peak_mib()  # the model, the data and the prompt, before any answer
    answer(inputs[: cfg.batch])  # warm-up, untimed
    before = _peak_mib()
    t0 = time.perf_counter()
    answers = answer(inputs)
    seconds = time.perf_counter() - t0
    out = {"path": path, "inputs": len(inputs), "seconds": seconds, "answers_per_second": len(inputs) / seconds,
           "peak_rss_mib": _peak_mib(), "peak_rss_loaded_mib": loaded, "peak_rss_before_answering_mib": before,
           "prompt_tokens": len(builder.build_prefix(selected.examples()).input_ids), "compressor": where,
           "answers": [a.answer for a in answers], "correct": [a.correct for a in answers],
           "scores": [[a.scores[y] for y in task.labels] for a in answers] if task.kind == "classification" else None}
    if path == "shared-exact" and cfg.logit_check and task.kind == "classification":  # after the timing
        checked = inputs[: cfg.logit_check]
        prefix = shared_prefix(model, builder, selected.examples())
        z = torch.cat([scores_after_prefix(model, builder, prefix, [builder.build_suffix(q).input_ids
                                                                   for q in checked[i: i + cfg.batch]])[0]
                       for i in range(0, len(checked), cfg.batch)])
        z_ref = scores_reencoded(model, builder, [builder.build(selected.examples(), q) for q in checked])[0]
        out["logit_check"] = {"inputs": len(checked), "max_abs_logit_diff": float((z - z_ref).abs().max()),
                              "vocabulary": int(z.shape[-1]), "dtype": str(model.dtype).replace("torch.", "")}
    return out


def worker() -> None:
    """``python -c 'from icl_ssm_bench.answer import worker; worker()'``: a config and a path as
    JSON on stdin, :func:`run_path`'s result as JSON on stdout."""
    job = json.loads(sys.stdin.read())
    cfg = AnswerBenchConfig(**{**job["config"], "paths": tuple(job["config"]["paths"])})
    print(json.dumps(run_path(cfg, job["path"])))


def bench_answer(cfg: AnswerBenchConfig, command: str, say=print) -> dict[str, Any]:
    """Every path of ``cfg`` in its own subprocess, then the record: rates, memory, agreement."""
    cfg.validate()
    runs = {}
    for path in cfg.paths:
        say(f"bench answer: {path} on {cfg.inputs if path != 'reencode' else cfg.reencode_inputs or cfg.inputs} "
            f"inputs ...")
        job = json.dumps({"config": asdict(cfg), "path": path})
        proc = subprocess.run([sys.executable, "-c", "from icl_ssm_bench.answer import worker; worker()"],
                              input=job, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"bench answer: the {path} worker failed:\n{proc.stderr[-3000:]}")
        runs[path] = json.loads(proc.stdout.strip().splitlines()[-1])
        say(f"bench answer: {path}: {runs[path]['answers_per_second']:.2f} answers/s, peak RSS "
            f"{runs[path]['peak_rss_mib']:.0f} MiB")
    from icl_ssm.provenance import provenance

    return summarize(cfg, runs, provenance(command))


def summarize(cfg: AnswerBenchConfig, runs: dict[str, dict], provenance: dict) -> dict[str, Any]:
    """The record of ``runs`` (path -> :func:`run_path`'s result), with its ``provenance`` block."""
    from icl_ssm.evaluate.stats import paired_bootstrap

    rows = []
    exact = runs.get("shared-exact")
    base = runs.get("reencode")
    for path in PATHS:
        if path not in runs:
            continue
        r = runs[path]
        row = {key: r[key] for key in ("path", "inputs", "seconds", "answers_per_second", "peak_rss_mib",
                                       "peak_rss_loaded_mib", "peak_rss_before_answering_mib", "prompt_tokens",
                                       "compressor")}
        row["title"] = TITLES[path]
        row["peak_rss_answering_mib"] = r["peak_rss_mib"] - r["peak_rss_loaded_mib"]
        if base is not None:
            row["x_reencode"] = r["answers_per_second"] / base["answers_per_second"]
        if cfg.shape is None and all(c is not None for c in r["correct"]):
            row["accuracy"] = paired_bootstrap(np.array(r["correct"], dtype=float))
        rows.append(row)
    record: dict[str, Any] = {"settings": asdict(cfg), "rows": rows, "agreement": {}, "provenance": provenance}
    if exact is not None and base is not None:  # the same inputs, first reencode_inputs of them
        n = base["inputs"]
        same = [a == b for a, b in zip(exact["answers"][:n], base["answers"], strict=True)]
        diff = None
        if exact["scores"] is not None:
            diff = float(np.abs(np.array(exact["scores"][:n]) - np.array(base["scores"])).max())
        record["agreement"]["shared-exact vs reencode"] = {"inputs": n, "identical_answers": int(sum(same)),
                                                           "max_abs_label_score_diff": diff}
    if exact is not None and "logit_check" in exact:
        record["agreement"]["logit_check"] = exact["logit_check"]
    comp = runs.get("shared-compressed")
    if cfg.shape is not None:
        from icl_ssm_bench.shapes import RANDOM_WEIGHTS

        record["random_weights"] = RANDOM_WEIGHTS + " Only the exact path's identity with re-encoding is compared."
    elif comp is not None and exact is not None:
        n = min(comp["inputs"], exact["inputs"])
        agree = [a == b for a, b in zip(comp["answers"][:n], exact["answers"][:n], strict=True)]
        entry = {"inputs": n, "agreement_with_dense": float(np.mean(agree)), "agreeing_answers": int(sum(agree))}
        if all(c is not None for c in comp["correct"][:n] + exact["correct"][:n]):
            gap = np.array(comp["correct"][:n], dtype=float) - np.array(exact["correct"][:n], dtype=float)
            entry["accuracy_minus_dense"] = paired_bootstrap(gap)
        record["agreement"]["shared-compressed vs shared-exact"] = entry
    if exact is not None and base is not None:
        check = record["agreement"].get("logit_check", {})
        record["targets"] = {
            "speedup_at_least_3x": exact["answers_per_second"] / base["answers_per_second"] >= 3,
            "identical_answers": record["agreement"]["shared-exact vs reencode"]["identical_answers"] == base["inputs"],
            "max_abs_logit_diff_below_1e-4": check.get("max_abs_logit_diff", 1.0) < 1e-4,
        }
    record["notes"] = (f"torch threads: {cfg.threads} per worker, one path at a time; peak memory is the worker "
                       "process's peak resident set size (getrusage ru_maxrss: the model, the data and the answering), "
                       "peak_rss_answering_mib its rise over the peak once the model and the prompt were loaded, "
                       "before any answer (the warm-up batch included); a shared path's time includes encoding the "
                       "prefix once; every path warmed up on one batch first, untimed")
    return record


def to_markdown(record: dict[str, Any]) -> str:
    s = record["settings"]
    on = s["model"] if not s.get("shape") else f"the {s['shape']} shape (random weights, {s['model']}'s tokenizer)"
    lines = [f"Answering {s['task']} with a k = {s['k']} prompt on {on}, batches of {s['batch']}, "
             f"{s['threads']} torch thread(s):", ""]
    if record.get("random_weights"):
        lines += [f"**{record['random_weights']}**", ""]
    lines += ["| path | inputs | answers/s | x re-encoding | peak RSS (MiB) | rise over the model loaded (MiB) "
              "| accuracy |",
              "|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        acc = r.get("accuracy")
        lines.append(f"| {r['title']} | {r['inputs']} | {r['answers_per_second']:.2f} | "
                     f"{r.get('x_reencode', float('nan')):.1f} | {r['peak_rss_mib']:.0f} | "
                     f"{r['peak_rss_answering_mib']:.0f} | "
                     + (f"{acc['mean']:.3f} [{acc['ci95'][0]:.3f}, {acc['ci95'][1]:.3f}]" if acc else "-") + " |")
    for name, entry in record["agreement"].items():
        lines.append("")
        lines.append(f"- {name}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in entry.items()))
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if isinstance(value, dict) and "ci95" in value:
        return f"{value['mean']:+.3f} [{value['ci95'][0]:+.3f}, {value['ci95'][1]:+.3f}]"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)

"""``icl-ssm bench length``: one compressor evaluated at growing shot counts (the paper's figure on
up to 1,000 demonstrations): answer error against the dense prompt while the prompt fits the
teacher's context, and seconds and FLOPs per prompt for both paths.

For every ``k`` the same ``subsets`` random k-subsets of the pool (``seed``) are answered on
``queries`` validation queries. Where the prompt fits ``config.max_position_embeddings`` the
dense prompt is the reference (relative logit error, KL, accuracy of both paths); beyond it the
compressed cache is the only path, and the row says so: there is no dense reference. Seconds are
timed without the FLOP counter; FLOPs are counted in a second pass over the first subset.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icl_ssm import atomic
from icl_ssm.compress.cache import compressed_cache, dense_cache
from icl_ssm.compress.compressor import load_compressor
from icl_ssm.cost import measure
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.evaluate.answers import evaluate_prefixes, logit_agreement, pad_right
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder


def answer(model, builder, prefix_ids, queries, build, count_flops: bool) -> tuple[Any, dict]:
    """The answers to ``queries`` after the cache ``build(ids, mask)`` makes of one prompt, and the
    seconds of building it and answering them (timed without the FLOP counter); with
    ``count_flops``, their FLOPs from a second, untimed pass."""
    ids, mask = pad_right([prefix_ids])
    ids, mask = ids.to(model.device), mask.to(model.device)
    with torch.no_grad(), measure(model.device, count_flops=False) as cost:
        ev = evaluate_prefixes(model, builder, build(ids, mask), queries, keep_logits=True, pack=True)
    out = {"seconds": cost.seconds}
    if count_flops:
        with torch.no_grad(), measure(model.device) as counted:
            evaluate_prefixes(model, builder, build(ids, mask), queries, keep_logits=False, pack=True)
        out["flops"] = counted.flops
    return ev, out


def run_length(model_name: str, task_name: str, compressor_dir: str, ks: Sequence[int], *, subsets: int = 3,
               queries: int = 8, seed: int = 0, say=print) -> dict[str, Any]:
    model, tokenizer = load_model(model_name)
    compressor = load_compressor(compressor_dir, model.config).to(model.device)
    task = get_task(task_name)
    context = getattr(model.config, "max_position_embeddings", None)
    splits = split(task, pool_size=max(max(ks), 100), seed=seed)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    builder.max_length = None  # past the context the compressed cache still reads the whole prompt
    val = splits.validation[:queries]
    rng = np.random.default_rng(seed)
    rows = []
    for k in ks:
        if k > len(splits.pool):
            raise ValueError(f"--k {k}: the pool of task {task.name!r} holds only {len(splits.pool)} examples")
        row: dict[str, Any] = {"k": k, "tokens": [], "compressed": [], "dense": [], "rel_logit_err": [], "kl": []}
        for _ in range(subsets):
            demos = [splits.pool[i] for i in rng.choice(len(splits.pool), size=k, replace=False)]
            prefix = builder.build_prefix(demos).input_ids
            suffix = max(len(builder.build_suffix(q).input_ids) for q in val)
            row["tokens"].append(len(prefix))
            comp, comp_cost = answer(model, builder, prefix, val,
                                     lambda i, m: compressed_cache(model, compressor, i, m), not row["compressed"])
            row["compressed"].append({**comp_cost, "accuracy": float(comp.correct.mean())})
            if context is None or len(prefix) + suffix <= context:
                dense, dense_cost = answer(model, builder, prefix, val, lambda i, m: dense_cache(model, i, m),
                                           not row["dense"])
                agree = logit_agreement(dense.logits, comp.logits)
                row["dense"].append({**dense_cost, "accuracy": float(dense.correct.mean())})
                row["rel_logit_err"].append(float(agree.rel_err.mean()))
                row["kl"].append(float(agree.kl.mean()))
        row["in_context"] = len(row["dense"]) == subsets
        summary = {"k": k, "prompt_tokens": float(np.mean(row["tokens"])), "in_context": row["in_context"],
                   "subsets": subsets, "queries": len(val)}
        for path in ("compressed", "dense"):
            if row[path]:
                summary[path] = {key: float(np.mean([r[key] for r in row[path]])) for key in ("seconds", "accuracy")}
                summary[path]["flops"] = row[path][0]["flops"]  # counted on the first subset
        if row["kl"]:
            summary["rel_logit_err"], summary["kl"] = float(np.mean(row["rel_logit_err"])), float(np.mean(row["kl"]))
        rows.append(summary)
        say(f"k={k}: {summary['prompt_tokens']:.0f} tokens, compressed {summary['compressed']['seconds']:.2f} s"
            + (f", dense {summary['dense']['seconds']:.2f} s, KL {summary['kl']:.3f}" if "dense" in summary
               else " (beyond the context: no dense reference)"))
    return {"model": model_name, "task": task.name, "compressor": compressor_dir, "context": context,
            "trained_k": _trained_k(compressor_dir), "rows": rows}


def _trained_k(compressor_dir: str) -> int | None:
    recipe = Path(compressor_dir).parent / "recipe.json"
    config = Path(compressor_dir) / "distill_config.json"
    for path in (recipe, config):
        if path.exists():
            return json.loads(path.read_text()).get("k")
    return None


def length_markdown(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}, {result['task']}, compressor trained at k = {result['trained_k']}; context "
             f"{result['context']} tokens", "",
             "| k | prompt tokens | rel. logit error | KL | accuracy dense / compressed | s dense / compressed "
             "| GFLOP dense / compressed |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        c, d = r["compressed"], r.get("dense")
        if d is None:
            lines.append(f"| {r['k']} | {r['prompt_tokens']:.0f} | no dense reference (beyond the context) | — | "
                         f"— / {c['accuracy']:.3f} | — / {c['seconds']:.2f} | — / {c['flops'] / 1e9:.1f} |")
        else:
            lines.append(f"| {r['k']} | {r['prompt_tokens']:.0f} | {r['rel_logit_err']:.3f} | {r['kl']:.3f} | "
                         f"{d['accuracy']:.3f} / {c['accuracy']:.3f} | {d['seconds']:.2f} / {c['seconds']:.2f} | "
                         f"{d['flops'] / 1e9:.1f} / {c['flops'] / 1e9:.1f} |")
    return "\n".join(lines) + "\n"


def plot_length(result: dict[str, Any], path: str | Path) -> None:
    """Error against k (dense reference only) and seconds per prompt against k, both paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ref = [r for r in rows if "kl" in r]
    ax1.plot([r["k"] for r in ref], [r["rel_logit_err"] for r in ref], "o-", label="relative logit error")
    ax1.plot([r["k"] for r in ref], [r["kl"] for r in ref], "s-", label="KL (nats)")
    if result["trained_k"]:
        ax1.axvline(result["trained_k"], color="gray", ls=":", label=f"trained at k = {result['trained_k']}")
    beyond = [r["k"] for r in rows if not r["in_context"]]
    if beyond:
        ax1.axvspan(min(beyond), max(beyond), color="0.9", label="beyond the context: no dense reference")
        ax2.axvspan(min(beyond), max(beyond), color="0.9")
    ax1.set_xlabel("demonstrations k")
    ax1.legend(fontsize=7)
    ax1.set_title("compressed cache against the dense prompt")
    ax2.plot([r["k"] for r in rows], [r["compressed"]["seconds"] for r in rows], "o-", label="compressed")
    ax2.plot([r["k"] for r in ref], [r["dense"]["seconds"] for r in ref], "s-", label="dense")
    ax2.set_xlabel("demonstrations k")
    ax2.set_ylabel("seconds per prompt (cache + answers)")
    ax2.legend(fontsize=7)
    fig.suptitle(f"{result['model']}, {result['task']}")
    fig.tight_layout()
    atomic.write_with(Path(path), lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)

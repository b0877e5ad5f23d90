"""``icl-ssm fidelity``: how well a compressed cache stands in for the dense prompt.

Demonstration selection only needs the compressed cache to *rank* subsets the way the dense
prompt does, so beside the per-query agreement of the answer-position logits (relative L2
error, KL, top-1) this reports the Spearman correlation, over held-out subsets, between each
subset's mean validation loss computed densely and computed from the compressed cache.

The "answer position" is the first token where answers differ: the query is followed by the
tokens every answer starts with (``PromptBuilder.answer_lead``; the space of SmolLM2's
``' ', '4', '2'`` for " 42"), since at a position every prompt answers alike the logits agree
whatever the cache holds.

Here: the run's config (:class:`FidelityConfig`) and :func:`run_fidelity`, which loads what it
names and writes the report. The core is reusable by distillation and selection:

* :func:`~icl_ssm.evaluate.paths.sample_subsets`, :func:`~icl_ssm.evaluate.paths.cache_paths`
  and :func:`~icl_ssm.evaluate.paths.evaluate_paths` - the subsets, the cache builders and
  every subset through every builder;
* :func:`~icl_ssm.evaluate.answers.evaluate_prefixes` - answer ``Q`` queries after each of ``R``
  prefix rows: the answer-position logits ``(R, Q, V)``, the gold loss and the prediction per
  (row, query);
* :class:`~icl_ssm.evaluate.dense_store.DenseStore` - the dense path's answers, reused by later runs;
* :func:`~icl_ssm.evaluate.fidelity_report.fidelity_report` - the summary dict of one path
  against the dense one.

Paper: Zhang et al., "Long-Context Demonstration Selection Using State Space Models".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from transformers import PreTrainedModel

from icl_ssm.calibrate.losses import calibrated_query_losses
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, load_compressor
from icl_ssm.data.splits import Splits, split
from icl_ssm.data.tasks import Example, Task, get_task
from icl_ssm.evaluate.answers import LOSSES, LogitAgreement, PrefixEval
from icl_ssm.evaluate.dense_store import DenseStore
from icl_ssm.evaluate.fidelity_report import fidelity_report
from icl_ssm.evaluate.paths import BASELINES, cache_paths, evaluate_paths, sample_subsets
from icl_ssm.evaluate.stats import COMPARATORS, finite_or_none, paired_spearman
from icl_ssm.lm.models import DEFAULT_MODEL, load_model, resolve_device
from icl_ssm.lm.prompts import PromptBuilder

# keys of fidelity_report that describe the other path, and their names under a prefix
_OTHER_KEYS = {
    "rel_logit_err": "rel_logit_err", "kl": "kl", "logit_mse": "logit_mse", "top1_agree": "top1_agree",
    "label_agree": "label_agree",
    "acc_compressed": "acc", "subset_loss_spearman": "subset_loss_spearman",
    "subset_loss_spearman_ci95": "subset_loss_spearman_ci95",
    "subset_loss_spearman_ci95_queries": "subset_loss_spearman_ci95_queries",
    "subset_loss_spearman_balanced": "subset_loss_spearman_balanced",
    "subset_loss_spearman_balanced_ci95_queries": "subset_loss_spearman_balanced_ci95_queries",
    "subset_loss_spearman_calibrated": "subset_loss_spearman_calibrated",
    "subset_loss_spearman_calibrated_ci95_queries": "subset_loss_spearman_calibrated_ci95_queries",
    "subset_loss_pearson": "subset_loss_pearson", "compressed_subset_loss_mean": "subset_loss_mean",
    "flops_compressed": "flops", "seconds_compressed": "seconds",
}  # fmt: skip


@dataclass
class FidelityConfig:
    """Everything ``icl-ssm fidelity`` was asked; saved in its report."""

    model: str = DEFAULT_MODEL
    task: str = ""
    k: int = 8
    compressor: str = ""
    control: str | None = None
    subsets: int = 30
    queries: int = 32
    query_offset: int = 0  # the queries are validation[query_offset : query_offset + queries]
    seed: int = 0
    loss: str = "nll"
    n_window: int | None = None  # default: the compressor's num_virtual + num_recent (the same cache size)
    also: dict[str, str] = field(default_factory=dict)  # name -> another compressor directory, same subsets
    batch: int = 4  # subsets per cache batch
    query_batch: int = 16  # (subset, query) pairs per forward
    reuse_dense: bool = False  # keep the dense answers in a DenseStore under the cache dir, and reuse them
    chat: bool = False
    device: str = "auto"  # "auto": the GPU when there is one
    task_options: dict[str, Any] = field(default_factory=dict)  # get_task's options (-o KEY=VALUE, --skip-empty)
    baselines: tuple[str, ...] = ()  # long-context comparison paths: BASELINES

    def validate(self) -> None:
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise ValueError(f"--baselines {unknown}; accepted: {', '.join(BASELINES)}")
        if self.subsets < 1:
            raise ValueError(f"--subsets {self.subsets}: expected at least 1 subset")
        if self.queries < 1:
            raise ValueError(f"--queries {self.queries}: expected at least 1 query")
        if self.query_offset < 0:
            raise ValueError(f"--query-offset {self.query_offset}: expected >= 0 (the first validation query used)")
        if self.loss not in LOSSES:
            raise ValueError(f"--loss {self.loss!r}; accepted: {', '.join(LOSSES)}")
        if self.n_window is not None and self.n_window < 0:
            raise ValueError(f"--n-window {self.n_window}: expected >= 0 prompt tokens")
        resolve_device(self.device)
        if self.batch < 1 or self.query_batch < 1:
            raise ValueError(f"--batch {self.batch} / --query-batch {self.query_batch}: expected >= 1")


def run_fidelity(
    config: FidelityConfig,
    *,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    model: Any = None,
    builder: PromptBuilder | None = None,
) -> dict:
    """Load what ``config`` names, evaluate every path and return the report dict.

    ``on_start(total_subsets)`` is called once the work is known, ``progress(n)`` after each
    batch of ``n`` subsets. ``model`` and ``builder``: the loaded model of ``config.model`` and
    its prompt builder for ``config.task`` when the caller holds them (``icl-ssm run``), so that
    neither is loaded or resolved again; both or neither.
    """
    config.validate()
    if (model is None) != (builder is None):
        raise ValueError("run_fidelity: give both model and builder (the caller's), or neither")
    if model is None:
        model, tokenizer = load_model(config.model, device=resolve_device(config.device))
        builder = PromptBuilder.for_model(model, tokenizer, get_task(config.task, **config.task_options),
                                          chat=config.chat)
    compressor, control = _load_compressors(config, model)
    task = builder.task
    splits, queries, subsets = _held_out(config, task)
    prefixes = [builder.build_prefix([splits.pool[i] for i in subset]) for subset in subsets]
    also = {name: load_compressor(path, model.config).to(model.device) for name, path in config.also.items()}
    paths = cache_paths(model, compressor, control=control, n_window=config.n_window, also=also,
                        baselines=config.baselines)
    if on_start is not None:
        on_start(len(prefixes))
    store = None
    if config.reuse_dense:
        from icl_ssm.data.assets import cache_dir

        store = DenseStore(cache_dir() / "dense", model, builder, queries, config.loss)
    results = evaluate_paths(model, builder, prefixes, queries, paths, loss=config.loss, batch=config.batch,
                             query_batch=config.query_batch, progress=progress, store=store)
    dense = results["dense"][0]
    report = _report_head(config, task.name, compressor.config, len(subsets), len(queries), dense, store)
    labels = [builder.label_index(q) for q in queries] if task.kind == "classification" else None
    report.update(_path_summaries(results, also, labels))
    report["paired"] = paired_spearman(dense.loss, {name: ev.loss for name, (ev, _) in results.items()},
                                       labels=labels)
    # per subset (and query), so the rankings can be plotted or re-analysed without rerunning anything
    report["per_subset"] = _per_subset(results, subsets, labels)
    report["config"] = asdict(config)
    return report


def _load_compressors(config: FidelityConfig, model: PreTrainedModel) -> tuple[SSMCompressor, SSMCompressor | None]:
    """The compressor ``config`` names and its control (None when not asked), on the model's device."""
    compressor = load_compressor(config.compressor, model.config).to(model.device)
    control = None
    if config.control is not None:
        control = load_compressor(config.control, model.config).to(model.device)
        if not control.config.control:
            raise ValueError(
                f"--control {config.control!r} is not a control compressor (its config has control=False); "
                "expected a prompt-independent compressor saved with SSMCompressorConfig(control=True)"
            )
    return compressor, control


def _held_out(config: FidelityConfig, task: Task) -> tuple[Splits, Sequence[Example], list[list[int]]]:
    """The task's splits, the queries ``config`` asks for and the held-out subsets of the pool
    (drawn from a numpy Generator seeded with ``config.seed``)."""
    splits = split(task, seed=config.seed)
    end = config.query_offset + config.queries
    if end > len(splits.validation):
        raise ValueError(f"--queries {config.queries} from --query-offset {config.query_offset}: task {task.name!r} "
                         f"has only {len(splits.validation)} validation examples; ask for at most that many in all")
    queries = splits.validation[config.query_offset : end]  # the validation split is already shuffled
    rng = np.random.default_rng(config.seed)
    return splits, queries, sample_subsets(splits.pool, config.k, config.subsets, rng)


def _report_head(
    config: FidelityConfig,
    task: str,
    c: SSMCompressorConfig,
    subsets: int,
    queries: int,
    dense: PrefixEval,
    store: DenseStore | None,
) -> dict[str, Any]:
    """The report's head: what was evaluated, and the compressed cache's shape."""
    return {
        "model": config.model,
        "task": task,
        "k": config.k,
        "subsets": subsets,
        "queries": queries,
        "query_offset": config.query_offset,
        "seed": config.seed,
        "loss": config.loss,
        "prompt_tokens_mean": finite_or_none(dense.prompt_length.float().mean()),
        "cache_tokens": c.cache_length,
        "num_sink": c.num_sink,
        "num_virtual": c.num_virtual,
        "position": c.position,
        "n_window": c.num_virtual + c.num_recent if config.n_window is None else config.n_window,
        "compressor_control": bool(c.control),
        "dense_reused_subsets": store.reused if store is not None else 0,  # their flops/seconds are as stored
    }


def _path_summaries(
    results: dict[str, tuple[PrefixEval, LogitAgreement | None]],
    also: dict[str, SSMCompressor],
    labels: list[int] | None,
) -> dict[str, Any]:
    """Every path against the dense one: the compressed path's :func:`fidelity_report` keys as
    they are, each comparator's under its name (``window_kl``), the other compressors' in ``also``."""
    dense = results["dense"][0]
    out: dict[str, Any] = fidelity_report(dense, *results["compressed"], labels=labels)
    for name in COMPARATORS:
        if name in results:
            sub = fidelity_report(dense, *results[name], labels=labels)
            out.update({f"{name}_{new}": sub[old] for old, new in _OTHER_KEYS.items() if old in sub})
    if also:
        out["also"] = {}
        for name, other in also.items():
            sub = fidelity_report(dense, *results[name], labels=labels)
            out["also"][name] = {"cache_tokens": other.config.cache_length,
                                 **{new: sub[old] for old, new in _OTHER_KEYS.items() if old in sub}}
    return out


def _per_subset(
    results: dict[str, tuple[PrefixEval, LogitAgreement | None]],
    subsets: list[list[int]],
    labels: list[int] | None,
) -> dict[str, Any]:
    """Each path's loss and metric per subset and per (subset, query), with the subsets' pool ids."""
    out: dict[str, Any] = {
        "ids": [list(map(int, subset)) for subset in subsets],
        "loss": {name: [finite_or_none(v) for v in results[name][0].subset_loss()] for name in results},
        "acc": {name: [finite_or_none(v) for v in results[name][0].subset_acc()] for name in results},
        "query_labels": labels,  # each query's gold label index (None for generative tasks)
        "query_loss": {name: [[finite_or_none(v) for v in row] for row in results[name][0].loss] for name in results},
    }
    if labels is not None and all(ev.scores is not None for ev, _ in results.values()):
        # the same with the label lean removed (batch calibration per subset), where every path kept its scores
        out["query_loss_calibrated"] = {
            name: [[finite_or_none(v) for v in row] for row in calibrated_query_losses(
                ev.scores.double().numpy(), np.asarray(labels), "batch")] for name, (ev, _) in results.items()}
    return out


def parse_also(items: Sequence[str] | None, flag: str = "--also") -> dict[str, str]:
    """``--also NAME=DIR ...`` (or another ``flag`` of the same form) -> {NAME: DIR}."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, path = item.partition("=")
        if not (sep and name and path):
            raise ValueError(f"{flag} {item!r}: expected NAME=DIR (a name and a compressor directory)")
        if name in out:
            raise ValueError(f"{flag}: the name {name!r} is given twice")
        out[name] = path
    return out

"""``icl-ssm fidelity``: how well a compressed cache stands in for the dense prompt.

Demonstration selection only needs the compressed cache to *rank* subsets the way the dense
prompt does, so beside the per-query agreement of the answer-position logits (relative L2
error, KL, top-1) this reports the Spearman correlation, over held-out subsets, between each
subset's mean validation loss computed densely and computed from the compressed cache.

The "answer position" is the first token where answers differ: the query is followed by the
tokens every answer starts with (``PromptBuilder.answer_lead``; the space of SmolLM2's
``' ', '4', '2'`` for " 42"), since at a position every prompt answers alike the logits agree
whatever the cache holds.

The core is reusable by distillation and selection:

* :func:`sample_subsets` - ``n`` random ``k``-subsets of a pool (explicit numpy Generator);
* :func:`evaluate_prefixes` - answer ``Q`` queries after each of ``R`` prefix rows: the
  answer-position logits ``(R, Q, V)``, the gold loss and the prediction per (row, query);
  :func:`answer_logits` is its batched fast path, :func:`answer_logits_packed` the one for
  long shared prefixes (a row's queries packed into one sequence), :func:`answer_logits_ref`
  the reference of both;
* :func:`evaluate_paths` - the same subsets through several cache builders (dense, compressed,
  control, window), streaming the logit agreement with the reference path batch by batch so
  that no ``(S, Q, V)`` tensor is ever held;
* :func:`fidelity_report` - the summary dict of one path against the dense one.

Paper: Zhang et al., "Long-Context Demonstration Selection Using State Space Models".
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from icl_ssm import atomic
from icl_ssm.compress.baselines import lm_infinite_cache, streaming_cache
from icl_ssm.compress.cache import compressed_cache, exact_cache, window_cache
from icl_ssm.compress.compressor import SSMCompressor, load_compressor
from icl_ssm.cost import CPU_ATTENTION, Cost, measure
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.evaluate.answers import (
    LOSSES,
    CacheBuilder,
    LogitAgreement,
    PrefixEval,
    evaluate_prefixes,
    logit_agreement,
    pad_right,
)
from icl_ssm.evaluate.stats import (
    COMPARATORS,
    bootstrap_spearman,
    finite_or_none,
    interval,
    label_weights,
    paired_spearman,
    pearson,
    spearman,
    spearman_ci,
    split_half_spearman,
)
from icl_ssm.lm.batch import PromptLike, as_ids
from icl_ssm.lm.models import DEFAULT_MODEL, load_model, resolve_device
from icl_ssm.lm.prompts import Prompt, PromptBuilder


def sample_subsets(pool: int | Sequence[Any], k: int, n: int, rng: np.random.Generator) -> list[list[int]]:
    """``n`` subsets of ``k`` distinct pool indices each, in random demonstration order.

    Deterministic for the state of ``rng``. Subsets are drawn independently, so two may
    coincide on a tiny pool.
    """
    size = pool if isinstance(pool, int) else len(pool)
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: expected an integer >= 1 demonstrations per subset")
    if k > size:
        raise ValueError(
            f"k={k} demonstrations requested but the candidate pool has only {size} examples; "
            "lower k or use a task with a larger pool"
        )
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"subsets={n!r}: expected an integer >= 1")
    return [rng.choice(size, size=k, replace=False).tolist() for _ in range(n)]


def weights_digest(model: torch.nn.Module) -> str:
    """Hash of a model's parameter names, shapes, dtypes and 64 values strided through each.

    Cheap (no full pass over the weights) and changed by any fine-tune, unlike a hash of
    the config alone."""
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        flat = param.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 64)][:64].double().cpu().numpy()
        h.update(f"{name}{tuple(param.shape)}{param.dtype}".encode())
        h.update(sample.tobytes())
    return h.hexdigest()[:16]


class DenseStore:
    """The dense path's answers, one safetensors file per subset row, reused by later runs.

    A row's file is named by a hash of its prompt tokens and of everything else its answers
    depend on: the model's config and :func:`weights_digest`, its dtype and device type, every
    query's tokens and gold answer, the answer lead, the labels and the loss, and the way FLOPs
    are counted (the stored cost must match a fresh one's). A run on the same
    queries reads every row it finds and computes only the rest (the prefill over ``k``
    demonstrations is most of a fidelity run's time); a killed run keeps the rows it finished.
    Nothing is ever reused for different inputs: those have another name. Each file is
    written atomically. A row costs ``4 x vocabulary x queries`` bytes (its logits).
    """

    def __init__(self, root: str | Path, model: PreTrainedModel, builder: PromptBuilder,
                 queries: Sequence[Example], loss: str):
        task = builder.task
        blob = {
            "config": model.config.to_dict(), "weights": weights_digest(model), "dtype": str(model.dtype),
            "device": model.device.type, "loss": loss, "kind": task.kind,
            "queries": [[builder.build_suffix(q).input_ids, str(q.target)] for q in queries],
            "lead": builder.answer_lead(queries),
            "labels": builder.label_ids() if task.kind == "classification" else None,
            # the FLOP formulas added to torch's (a stored row's cost must match a fresh count)
            "flops": sorted(op.__name__ for op in CPU_ATTENTION),
        }
        for volatile in ("_name_or_path", "transformers_version"):
            blob["config"].pop(volatile, None)
        key = hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]
        self.directory = atomic.prepare_dir(Path(root) / key, "dense store")
        self.reused = 0  # rows read back so far

    def _path(self, ids: Sequence[int]) -> Path:
        return self.directory / f"{hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:24]}.st"

    def get(self, prompts: Sequence[PromptLike]) -> PrefixEval | None:
        """The stored answers after every prompt, rows in order, or None if any row is missing."""
        paths = [self._path(as_ids(p)) for p in prompts]
        if not all(path.exists() for path in paths):
            return None
        from safetensors.torch import load_file

        rows = []
        for path in paths:
            t = load_file(path)
            cost = Cost(int(t["flops"]), float(t["seconds"]))
            rows.append(PrefixEval(t["loss"], t["correct"], t["pred"], t["prompt_length"],
                                   int(t["cache_length"]), t["logits"], cost))
        self.reused += len(rows)
        return PrefixEval.cat(rows)

    def put(self, prompts: Sequence[PromptLike], ev: PrefixEval) -> None:
        """Store ``ev`` (with logits), one file per row; each row is charged an equal share of the cost."""
        if ev.logits is None or ev.rows != len(prompts):
            raise ValueError(f"DenseStore.put needs one evaluated row with logits per prompt ({len(prompts)})")
        from safetensors.torch import save

        for r, prompt in enumerate(prompts):
            t = {"loss": ev.loss[r : r + 1], "correct": ev.correct[r : r + 1], "pred": ev.pred[r : r + 1],
                 "prompt_length": ev.prompt_length[r : r + 1], "logits": ev.logits[r : r + 1],
                 "cache_length": torch.tensor(ev.cache_length),
                 "flops": torch.tensor(ev.cost.flops // ev.rows), "seconds": torch.tensor(ev.cost.seconds / ev.rows,
                                                                                         dtype=torch.float64)}
            data = save({name: v.contiguous().cpu() for name, v in t.items()})
            atomic.write_with(self._path(as_ids(prompt)), lambda f, data=data: f.write(data))


def cache_paths(
    model: PreTrainedModel,
    compressor: SSMCompressor,
    *,
    control: SSMCompressor | None = None,
    n_window: int | None = None,
    also: dict[str, SSMCompressor] | None = None,
    baselines: Sequence[str] = (),
) -> dict[str, CacheBuilder]:
    """The cache builders ``icl-ssm fidelity`` compares: ``dense`` (the teacher's own K/V),
    ``compressed``, ``control`` (when given), ``window`` (the compressor's sinks + the last
    ``n_window`` prompt tokens, default its ``num_virtual + num_recent``: the same cache size,
    same position convention), the long-context ``baselines`` asked for (:data:`BASELINES`:
    ``streaming``, the sinks and the last ``n_window`` tokens of the dense cache; ``lm-infinite``,
    the same slots after a Lambda-masked prefill) and one path per compressor in ``also`` (other
    compressors compared on the same subsets and queries, e.g. the variants of an ablation)."""
    unknown = sorted(set(baselines) - set(BASELINES))
    if unknown:
        raise ValueError(f"baselines {unknown}; accepted: {', '.join(BASELINES)}")
    c = compressor.config
    clash = sorted(set(also or ()) & {"dense", "compressed", *COMPARATORS})
    if clash:
        raise ValueError(f"also: the names {clash} are taken by the built-in paths; choose other names")
    n_window = c.num_virtual + c.num_recent if n_window is None else n_window
    if n_window < 0:
        raise ValueError(f"n_window={n_window}: expected >= 0 prompt tokens")
    paths: dict[str, CacheBuilder] = {
        "dense": lambda ids, mask: exact_cache(model, ids, mask),
        "compressed": lambda ids, mask: compressed_cache(model, compressor, ids, mask),
    }
    if control is not None:
        paths["control"] = lambda ids, mask: compressed_cache(model, control, ids, mask)
    paths["window"] = lambda ids, mask: window_cache(model, ids, mask, c.num_sink, n_window, c.position)
    if "streaming" in baselines:
        paths["streaming"] = lambda ids, mask: streaming_cache(model, ids, mask, c.num_sink, n_window)
    if "lm-infinite" in baselines:
        paths["lm-infinite"] = lambda ids, mask: lm_infinite_cache(model, ids, mask, c.num_sink, n_window)
    for name, other in (also or {}).items():
        paths[name] = lambda ids, mask, other=other: compressed_cache(model, other, ids, mask)
    return paths


def evaluate_paths(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prefixes: Sequence[PromptLike],
    queries: Sequence[Example],
    paths: dict[str, CacheBuilder],
    *,
    reference: str = "dense",
    loss: str = "nll",
    batch: int = 4,
    query_batch: int = 16,
    progress: Callable[[int], None] | None = None,
    store: DenseStore | None = None,
) -> dict[str, tuple[PrefixEval, LogitAgreement | None]]:
    """Every prefix (one per subset) through every cache builder, ``batch`` subsets at a time.

    Returns, per path, its :class:`PrefixEval` (without logits) and its
    :class:`LogitAgreement` with the ``reference`` path (None for the reference itself).
    Each path's ``cost`` covers building its caches and answering all queries; the logit
    comparison is not counted. ``progress(n)`` is called after each batch of ``n`` subsets.
    With a ``store``, the reference path's rows are read from it where present (their cost is
    the one stored with them) and stored where computed.
    """
    if reference not in paths:
        raise ValueError(f"reference path {reference!r} is not among the paths {', '.join(paths)}")
    if not prefixes:
        raise ValueError("no subsets: expected at least one prefix")
    if batch < 1:
        raise ValueError(f"batch={batch}; expected >= 1 subsets per batch")
    order = [reference, *(name for name in paths if name != reference)]
    pad_id = getattr(model.config.get_text_config(), "pad_token_id", None)
    pad_id = pad_id if isinstance(pad_id, int) and pad_id >= 0 else 0  # masked anyway
    device = model.device
    with torch.no_grad():  # warm-up: lazily built state (the SSM's powers) is not timed
        ids, mask = pad_right(prefixes[:1], pad_id)
        for name in order[1:] if store is not None else order:
            paths[name](ids.to(device), mask.to(device))
    evals: dict[str, list[PrefixEval]] = {name: [] for name in order}
    agreements: dict[str, list[LogitAgreement]] = {name: [] for name in order}
    for start in range(0, len(prefixes), batch):
        rows = prefixes[start : start + batch]
        ids, mask = pad_right(rows, pad_id)  # (B, T) each
        ids, mask = ids.to(device), mask.to(device)
        ref_logits = None
        for name in order:
            ev = store.get(rows) if store is not None and name == reference else None
            if ev is None:
                with torch.no_grad(), measure(device) as cost:
                    cache = paths[name](ids, mask)
                    ev = evaluate_prefixes(model, builder, cache, queries, loss=loss, query_batch=query_batch)
                ev.cost = cost
                if store is not None and name == reference:
                    store.put(rows, ev)
            if name == reference:
                ref_logits = ev.logits
            else:
                agreements[name].append(logit_agreement(ref_logits, ev.logits))
            evals[name].append(ev.without_logits())
        if progress is not None:
            progress(ids.shape[0])
    return {
        name: (PrefixEval.cat(evals[name]), LogitAgreement.cat(agreements[name]) if agreements[name] else None)
        for name in order
    }


@dataclass
class ReportSetting:
    """What a saved ``icl-ssm fidelity --json`` report evaluated, rebuilt so that other caches
    can be evaluated on the same held-out subsets and queries (``research/recency.py``,
    ``blocks.py``, ``tail_readout.py``). ``dense``: the report's dense subset losses ``(S,)``."""

    builder: PromptBuilder
    pool: list[Example]
    subsets: list[list[int]]
    prompts: list[Prompt]
    queries: list[Example]
    dense: np.ndarray


def report_setting(report: dict, model: PreTrainedModel, tokenizer, subsets: int | None = None) -> ReportSetting:
    """The setting of ``report`` (its first ``subsets`` held-out subsets, or all) for ``model``."""
    cfg = report["config"]
    task = get_task(cfg["task"], **cfg.get("task_options", {}))
    splits = split(task, seed=report["seed"])
    builder = PromptBuilder.for_model(model, tokenizer, task, chat=cfg["chat"])
    ids = report["per_subset"]["ids"][:subsets]
    off = report.get("query_offset", 0)
    return ReportSetting(
        builder=builder, pool=list(splits.pool), subsets=ids,
        prompts=[builder.build_prefix([splits.pool[i] for i in s]) for s in ids],
        queries=list(splits.validation[off : off + report["queries"]]),
        dense=np.array(report["per_subset"]["loss"]["dense"])[: len(ids)],
    )




def fidelity_report(
    dense: PrefixEval,
    other: PrefixEval,
    agreement: LogitAgreement | None = None,
    labels: Sequence[int] | None = None,
) -> dict:
    """Summary of ``other`` against ``dense`` over the same subsets and queries.

    ``agreement``: the per-pair logit comparison, if already computed (streamed); else it is
    computed from both evaluations' logits. Keys: ``rel_logit_err``, ``kl``, ``logit_mse`` (the
    output MSE over the vocabulary), ``top1_agree``, ``label_agree`` (same predicted label; None
    for generative tasks), ``acc_dense``,
    ``acc_compressed``, ``subset_loss_spearman`` (with ``subset_loss_spearman_ci95``, a
    bootstrap interval over subsets, and ``subset_loss_spearman_ci95_queries``, over subsets
    and queries: the wider and more honest one), ``subset_loss_pearson`` (None when a side is
    constant over the subsets, as a control's is), ``dense_subset_loss_mean``/``_std``,
    ``dense_subset_acc_min``/``_max``, ``dense_split_half_spearman`` (see
    :func:`split_half_spearman`), ``compressed_subset_loss_mean``, ``flops_*`` and
    ``seconds_*`` (per subset: build its caches and answer all its queries). With the queries'
    gold ``labels`` (classification), also ``subset_loss_spearman_balanced`` and
    ``dense_split_half_spearman_balanced``: the same with label-balanced subset losses
    (:func:`label_weights`), which do not move with the label mix of the queries drawn.
    """
    if dense.loss.shape != other.loss.shape:
        raise ValueError(f"evaluations of shape {tuple(dense.loss.shape)} and {tuple(other.loss.shape)} "
                         "cover different subsets or queries")
    if agreement is None:
        if dense.logits is None or other.logits is None:
            raise ValueError("fidelity_report needs the logits of both evaluations, or a precomputed agreement")
        agreement = logit_agreement(dense.logits, other.logits)
    S = dense.rows
    dense_loss, other_loss = dense.subset_loss().numpy(), other.subset_loss().numpy()
    dense_acc = dense.subset_acc()
    both = bootstrap_spearman(dense.loss, {"other": other.loss})["other"] if S >= 3 else np.array([math.nan])
    balanced = (bootstrap_spearman(dense.loss, {"other": other.loss}, labels=labels)["other"]
                if S >= 3 and labels is not None else np.array([math.nan]))
    out = {
        "rel_logit_err": finite_or_none(agreement.rel_err.mean()),
        "kl": finite_or_none(agreement.kl.mean()),
        "logit_mse": finite_or_none(agreement.mse.mean()),
        "top1_agree": finite_or_none(agreement.top1.float().mean()),
        "label_agree": finite_or_none((dense.pred == other.pred).float().mean()) if (dense.pred >= 0).all() else None,
        "acc_dense": finite_or_none(dense.correct.mean()),
        "acc_compressed": finite_or_none(other.correct.mean()),
        "subset_loss_spearman": finite_or_none(spearman(dense_loss, other_loss)),
        "subset_loss_spearman_ci95": [finite_or_none(v) for v in spearman_ci(dense_loss, other_loss)],
        "subset_loss_spearman_ci95_queries": [finite_or_none(v) for v in interval(both)],
        "subset_loss_pearson": finite_or_none(pearson(dense_loss, other_loss)),
        "dense_subset_loss_mean": finite_or_none(dense_loss.mean()),
        "dense_subset_loss_std": finite_or_none(dense_loss.std(ddof=1)) if S > 1 else None,
        "dense_subset_acc_min": finite_or_none(dense_acc.min()),
        "dense_subset_acc_max": finite_or_none(dense_acc.max()),
        "dense_split_half_spearman": finite_or_none(split_half_spearman(dense.loss)),
        "compressed_subset_loss_mean": finite_or_none(other_loss.mean()),
        "flops_dense": dense.cost.flops / S,
        "flops_compressed": other.cost.flops / S,
        "seconds_dense": dense.cost.seconds / S,
        "seconds_compressed": other.cost.seconds / S,
    }
    if labels is not None:
        w = label_weights(labels)
        out["subset_loss_spearman_balanced"] = finite_or_none(spearman(dense.loss.double().numpy() @ w,
                                                             other.loss.double().numpy() @ w))
        out["subset_loss_spearman_balanced_ci95_queries"] = [finite_or_none(v) for v in interval(balanced)]
        out["dense_split_half_spearman_balanced"] = finite_or_none(split_half_spearman(dense.loss, labels))
    return out


# keys of fidelity_report that describe the other path, and their names under a prefix
BASELINES = ("streaming", "lm-infinite")  # long-context methods measured beside the compressor (cache_paths)

_OTHER_KEYS = {
    "rel_logit_err": "rel_logit_err", "kl": "kl", "logit_mse": "logit_mse", "top1_agree": "top1_agree",
    "label_agree": "label_agree",
    "acc_compressed": "acc", "subset_loss_spearman": "subset_loss_spearman",
    "subset_loss_spearman_ci95": "subset_loss_spearman_ci95",
    "subset_loss_spearman_ci95_queries": "subset_loss_spearman_ci95_queries",
    "subset_loss_spearman_balanced": "subset_loss_spearman_balanced",
    "subset_loss_spearman_balanced_ci95_queries": "subset_loss_spearman_balanced_ci95_queries",
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
) -> dict:
    """Load what ``config`` names, evaluate every path and return the report dict.

    ``on_start(total_subsets)`` is called once the work is known, ``progress(n)`` after each
    batch of ``n`` subsets.
    """
    config.validate()
    model, tokenizer = load_model(config.model, device=resolve_device(config.device))
    compressor = load_compressor(config.compressor, model.config).to(model.device)
    control = None
    if config.control is not None:
        control = load_compressor(config.control, model.config).to(model.device)
        if not control.config.control:
            raise ValueError(
                f"--control {config.control!r} is not a control compressor (its config has control=False); "
                "expected a prompt-independent compressor saved with SSMCompressorConfig(control=True)"
            )
    task = get_task(config.task, **config.task_options)
    splits = split(task, seed=config.seed)
    end = config.query_offset + config.queries
    if end > len(splits.validation):
        raise ValueError(f"--queries {config.queries} from --query-offset {config.query_offset}: task {task.name!r} "
                         f"has only {len(splits.validation)} validation examples; ask for at most that many in all")
    queries = splits.validation[config.query_offset : end]  # the validation split is already shuffled
    rng = np.random.default_rng(config.seed)
    subsets = sample_subsets(splits.pool, config.k, config.subsets, rng)
    builder = PromptBuilder.for_model(model, tokenizer, task, chat=config.chat)
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
    c = compressor.config
    report: dict[str, Any] = {
        "model": config.model,
        "task": task.name,
        "k": config.k,
        "subsets": len(subsets),
        "queries": len(queries),
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
    labels = [builder.label_index(q) for q in queries] if task.kind == "classification" else None
    report.update(fidelity_report(dense, *results["compressed"], labels=labels))
    for name in COMPARATORS:
        if name in results:
            sub = fidelity_report(dense, *results[name], labels=labels)
            report.update({f"{name}_{new}": sub[old] for old, new in _OTHER_KEYS.items() if old in sub})
    if also:
        report["also"] = {}
        for name, other in also.items():
            sub = fidelity_report(dense, *results[name], labels=labels)
            report["also"][name] = {"cache_tokens": other.config.cache_length,
                                    **{new: sub[old] for old, new in _OTHER_KEYS.items() if old in sub}}
    report["paired"] = paired_spearman(dense.loss, {name: ev.loss for name, (ev, _) in results.items()},
                                       labels=labels)
    # per subset (and query), so the rankings can be plotted or re-analysed without rerunning anything
    report["per_subset"] = {
        "ids": [list(map(int, subset)) for subset in subsets],
        "loss": {name: [finite_or_none(v) for v in results[name][0].subset_loss()] for name in results},
        "acc": {name: [finite_or_none(v) for v in results[name][0].subset_acc()] for name in results},
        "query_labels": labels,  # each query's gold label index (None for generative tasks)
        "query_loss": {name: [[finite_or_none(v) for v in row] for row in results[name][0].loss] for name in results},
    }
    report["config"] = asdict(config)
    return report


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

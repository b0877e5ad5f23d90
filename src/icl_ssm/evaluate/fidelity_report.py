"""One cache path against the dense one, as numbers (:func:`fidelity_report`), and the setting
of a saved fidelity report rebuilt, so that other caches can be measured on the same held-out
subsets and queries (:func:`report_setting`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from transformers import PreTrainedModel

from icl_ssm.calibrate.losses import calibrated_query_losses
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.evaluate.answers import LogitAgreement, PrefixEval, logit_agreement
from icl_ssm.evaluate.stats import (
    bootstrap_spearman,
    finite_or_none,
    interval,
    label_weights,
    pearson,
    spearman,
    spearman_ci,
    split_half_spearman,
)
from icl_ssm.lm.prompts import Prompt, PromptBuilder


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
    out = {**_answer_agreement(dense, other, agreement), **_subset_ranking(dense, other),
           **_cost_per_subset(dense, other)}
    if labels is not None and dense.scores is not None and other.scores is not None:
        out.update(calibrated_ranking(dense.scores.double().numpy(), other.scores.double().numpy(), labels))
    if labels is not None:
        out.update(_balanced_ranking(dense, other, labels))
    return out


def _answer_agreement(dense: PrefixEval, other: PrefixEval, agreement: LogitAgreement) -> dict:
    """Per (subset, query) pair: the logits' agreement, the same predicted label, the metric."""
    return {
        "rel_logit_err": finite_or_none(agreement.rel_err.mean()),
        "kl": finite_or_none(agreement.kl.mean()),
        "logit_mse": finite_or_none(agreement.mse.mean()),
        "top1_agree": finite_or_none(agreement.top1.float().mean()),
        "label_agree": finite_or_none((dense.pred == other.pred).float().mean()) if (dense.pred >= 0).all() else None,
        "acc_dense": finite_or_none(dense.correct.mean()),
        "acc_compressed": finite_or_none(other.correct.mean()),
    }


def _subset_ranking(dense: PrefixEval, other: PrefixEval) -> dict:
    """The subsets ranked by their mean loss on both paths, and the dense ranking's spread."""
    S = dense.rows
    dense_loss, other_loss = dense.subset_loss().numpy(), other.subset_loss().numpy()
    dense_acc = dense.subset_acc()
    both = bootstrap_spearman(dense.loss, {"other": other.loss})["other"] if S >= 3 else np.array([math.nan])
    return {
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
    }


def _cost_per_subset(dense: PrefixEval, other: PrefixEval) -> dict:
    """FLOPs and seconds per subset on both paths: building its caches and answering its queries."""
    S = dense.rows
    return {
        "flops_dense": dense.cost.flops / S,
        "flops_compressed": other.cost.flops / S,
        "seconds_dense": dense.cost.seconds / S,
        "seconds_compressed": other.cost.seconds / S,
    }


def _balanced_ranking(dense: PrefixEval, other: PrefixEval, labels: Sequence[int]) -> dict:
    """The subset ranking with label-balanced subset losses (:func:`label_weights`)."""
    balanced = (bootstrap_spearman(dense.loss, {"other": other.loss}, labels=labels)["other"]
                if dense.rows >= 3 else np.array([math.nan]))
    w = label_weights(labels)
    return {
        "subset_loss_spearman_balanced": finite_or_none(spearman(dense.loss.double().numpy() @ w,
                                                                 other.loss.double().numpy() @ w)),
        "subset_loss_spearman_balanced_ci95_queries": [finite_or_none(v) for v in interval(balanced)],
        "dense_split_half_spearman_balanced": finite_or_none(split_half_spearman(dense.loss, labels)),
    }


def calibrated_ranking(dense_scores: np.ndarray, other_scores: np.ndarray, labels: Sequence[int]) -> dict:
    """The subset ranking with the label lean removed: both paths' label scores ``(S, Q, L)``
    batch-calibrated per subset over its queries (:func:`~icl_ssm.calibrate.losses.calibrated_query_losses`),
    the label-balanced cross-entropy over the label set ranked against the dense path's
    (``subset_loss_spearman_calibrated``, with ``..._ci95_queries``: subsets and queries resampled,
    each subset's bias kept as estimated on all its queries) and the dense path's split-half
    (``dense_split_half_spearman_calibrated``)."""
    gold = np.asarray(labels)
    d = calibrated_query_losses(dense_scores, gold, "batch")
    o = calibrated_query_losses(other_scores, gold, "batch")
    w = label_weights(gold)
    draws = bootstrap_spearman(d, {"other": o}, labels=gold)["other"] if d.shape[0] >= 3 else np.array([math.nan])
    return {"subset_loss_spearman_calibrated": finite_or_none(spearman(d @ w, o @ w)),
            "subset_loss_spearman_calibrated_ci95_queries": [finite_or_none(v) for v in interval(draws)],
            "dense_split_half_spearman_calibrated": finite_or_none(split_half_spearman(d, gold))}


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

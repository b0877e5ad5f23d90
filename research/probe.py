"""The flipped-label probe: does a cache see whether a prompt's labels are right?

Pairs of prompts that differ only in their labels: each subset's demonstrations as they are,
and the same texts in the same order with every label replaced by another label of the task
(the next one in the task's label list). A cache that reads the input-label relation gives the
flipped prompt a different (for a model that uses the labels, higher) validation loss; a cache
that only sees the texts and the label mix gives both nearly the same, since flipping keeps the
texts and, for two balanced labels, the mix. The dense prompt is the reference.

:func:`state_separability` asks the same one step earlier: can a linear read-out of the
compressor's SSM state tell the two prompts apart at all?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from icl_ssm.compress.cache import summary_states
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import interval, paired_separability, spearman
from icl_ssm.select.subset_losses import SubsetEvaluator


def flipped(examples: Sequence[Example], labels: Sequence[str]) -> list[Example]:
    """``examples`` with each target replaced by the next label of ``labels`` (cyclically)."""
    if len(labels) < 2:
        raise ValueError(f"flipping needs at least 2 labels, got {list(labels)}")
    nxt = {y: labels[(i + 1) % len(labels)] for i, y in enumerate(labels)}
    unknown = sorted({e.target for e in examples} - set(nxt))
    if unknown:
        raise ValueError(f"targets {unknown} are not among the labels {list(labels)}")
    return [replace(e, target=nxt[e.target]) for e in examples]


def flipped_label_probe(evaluators: dict[str, SubsetEvaluator], pool: Sequence[Example],
                        validation: Sequence[Example], labels: Sequence[str], subsets: Sequence[Sequence[int]],
                        resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """For each evaluator: the mean subset loss with the right and with the flipped labels, the
    mean paired difference (flipped minus right) with its bootstrap 95% interval over subsets,
    the share of subsets whose flipped prompt scores worse, and the Spearman correlation between
    the differences and the dense evaluator's (when one is named ``"dense"``)."""
    wrong_pool = flipped(pool, labels)
    out: dict[str, Any] = {"subsets": len(subsets), "queries": len(validation)}
    diffs = {}
    for name, ev in evaluators.items():
        right = ev.evaluate(pool, validation, subsets).losses
        wrong = ev.evaluate(wrong_pool, validation, subsets).losses
        diff = wrong - right
        diffs[name] = diff
        draws = np.random.default_rng(seed).choice(diff, (resamples, len(diff))).mean(1)
        out[name] = {"right": float(right.mean()), "flipped": float(wrong.mean()), "diff": float(diff.mean()),
                     "ci95": list(interval(draws)), "higher_share": float((diff > 0).mean())}
    if "dense" in diffs:
        for name, diff in diffs.items():
            if name != "dense" and len(diff) >= 3:
                out[name]["diff_spearman_vs_dense"] = float(spearman(diffs["dense"], diff))
    return out


@torch.no_grad()
def prompt_states(model, compressor, builder, pool: Sequence[Example], subsets: Sequence[Sequence[int]]) -> np.ndarray:
    """The compressor's SSM states ``(len(subsets), G * N)`` of each subset's prompt (what
    selection compresses: ``builder.build_prefix`` of the demonstrations)."""
    rows = []
    for subset in subsets:
        ids = torch.tensor([builder.build_prefix([pool[i] for i in subset]).input_ids], device=model.device)
        rows.append(summary_states(model, compressor, ids).flatten(1).double().cpu())
    return torch.cat(rows).numpy()


def state_separability(model, compressor, builder, pool: Sequence[Example], labels: Sequence[str],
                       subsets: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Can a linear read-out of the SSM state tell each subset's prompt from the same prompt
    with its labels flipped? :func:`~icl_ssm.evaluate.stats.paired_separability` of the two
    sets of states: 0.5 is a state blind to the input-label relation, 1 a state that carries
    it (whether the head then uses it is what the loss difference says)."""
    return paired_separability(prompt_states(model, compressor, builder, pool, subsets),
                               prompt_states(model, compressor, builder, flipped(pool, labels), subsets))

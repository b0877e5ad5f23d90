"""The GradCE baseline: a first-order estimate of each candidate's validation loss around one
anchor prompt (one forward/backward), inside a similarity prefilter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.cost import measure
from icl_ssm.data.tasks import Example
from icl_ssm.lm.batch import pad_ids
from icl_ssm.lm.hf import logits_to_keep_kwargs
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.base import Selection, Selector, register, top_k, validate_positive_sizes, validate_selection_inputs
from icl_ssm.select.topk import TopKSelector


@torch.no_grad()
def demo_embedding(model: PreTrainedModel, builder: PromptBuilder, demos: Sequence[Example]) -> Tensor:
    """(H,) float32: mean input embedding over every demonstration token of ``demos``."""
    prefix = builder.build_prefix(list(demos))
    ids = [t for s, e in prefix.demo_spans for t in prefix.input_ids[s:e]]
    table = model.get_input_embeddings()
    return table(torch.tensor(ids, device=model.device)).float().mean(0)


def anchor_loss(model: PreTrainedModel, builder: PromptBuilder, demos: Sequence[Example],
                validation: Sequence[Example], delta: Tensor, batch: int = 8) -> Tensor:
    """Mean gold-answer NLL (as :func:`~icl_ssm.lm.scoring.answer_loss`, ``normalize=False``) of
    the dense prompts ``demos + query`` over ``validation``, with ``delta`` (H,) added to the
    input embedding of every demonstration token. A scalar, differentiable in ``delta``."""
    contexts = [builder.build(list(demos), q) for q in validation]
    answers = [builder.answer_ids(q) for q in validation]
    table, total = model.get_input_embeddings(), delta.new_zeros(())
    for start in range(0, len(contexts), batch):
        rows = range(start, min(start + batch, len(contexts)))
        ids, mask = pad_ids([contexts[i].input_ids + answers[i][:-1] for i in rows])  # (B, L)
        demo = torch.zeros_like(mask)  # (B, L): True on demonstration tokens
        for b, i in enumerate(rows):
            for s, e in contexts[i].demo_spans:
                demo[b, s:e] = True
        ids, mask, demo = ids.to(model.device), mask.to(model.device), demo.to(model.device)
        embeds = table(ids)  # (B, L, H)
        embeds = embeds + (demo[..., None] * delta).to(embeds.dtype)
        # (row, position whose logits predict the token, token), positions in the padded row
        gathers = [(b, len(contexts[i].input_ids) - 1 + j, t)
                   for b, i in enumerate(rows) for j, t in enumerate(answers[i])]
        keep = sorted({p for _, p, _ in gathers})
        column = {p: c for c, p in enumerate(keep)}
        keep_t = torch.tensor(keep, device=model.device)
        kwargs = logits_to_keep_kwargs(model, keep_t)
        logits = model(inputs_embeds=embeds, attention_mask=mask.long(),
                       position_ids=(mask.long().cumsum(1) - 1).clamp(min=0), **kwargs).logits
        logits = logits if kwargs else logits[:, keep_t]  # (B, len(keep), vocab)
        logp = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
        b_idx, c_idx, t_idx = torch.tensor([(b, column[p], t) for b, p, t in gathers], device=model.device).T
        total = total - logp[b_idx, c_idx, t_idx].sum().to(total.dtype)
    return total / len(contexts)


@register("gradce")
@dataclass
class GradCESelector(Selector):
    """GradCE: first-order estimate of each candidate's validation loss at one anchor.

    Our reading of the paper's description of GradCE:

    1. prefilter: the ``m = min(n, prefilter * k)`` candidates most similar to the validation
       queries (:meth:`TopKSelector.similarity`);
    2. anchor: the prompt made of the ``k`` most similar candidates (best last). One
       forward/backward over the validation queries gives ``L0`` (:func:`anchor_loss` at
       ``delta = 0``) and ``g = dL/d delta`` (H,), ``delta`` being a shift added to the input
       embedding of every demonstration token;
    3. a candidate ``z`` stands in for the anchor's demonstrations as the shift that moves
       their mean token embedding ``e_anchor`` to its own, ``e(z)`` (:func:`demo_embedding`):
       ``L(z) ~ L0 + g . (e(z) - e_anchor)``; score = ``-L(z)``, NaN outside the prefilter.

    Gradients are taken w.r.t. ``delta`` alone (``torch.autograd.grad``): no ``.grad`` is left
    on the model. Tokens: the prefilter's (pool + validation queries) plus every anchor prompt with its
    answer.
    """

    model: PreTrainedModel
    builder: PromptBuilder
    prefilter: int = 4
    batch: int = 8

    def __post_init__(self) -> None:
        validate_positive_sizes(prefilter=self.prefilter, batch=self.batch)

    @classmethod
    def from_config(cls, cfg, model, builder, compressor=None, hooks=None) -> GradCESelector:
        return cls(model, builder)

    def gradient(self, demos: Sequence[Example], validation: Sequence[Example]) -> tuple[float, Tensor]:
        """(L0, g (H,) float32): the anchor's mean validation loss and its gradient in ``delta``,
        accumulated over batches of validation queries so only one batch's graph is alive."""
        hidden = self.model.get_input_embeddings().weight.shape[1]
        dtype = torch.promote_types(self.model.get_input_embeddings().weight.dtype, torch.float32)
        delta = torch.zeros(hidden, device=self.model.device, dtype=dtype, requires_grad=True)
        loss, grad = 0.0, torch.zeros_like(delta)
        with torch.enable_grad():
            for start in range(0, len(validation), self.batch):
                part = validation[start : start + self.batch]
                value = anchor_loss(self.model, self.builder, demos, part, delta, self.batch)
                value = value * (len(part) / len(validation))
                grad += torch.autograd.grad(value, delta)[0]
                loss += float(value.detach())
        return loss, grad.float()

    def select(self, pool, validation, k, rng):
        validate_selection_inputs(pool, validation, k)
        n, m = len(pool), min(len(pool), self.prefilter * k)
        with measure(self.model.device) as cost:
            sim, tokens = TopKSelector(self.model, self.builder, self.batch).similarity(pool, validation)
            kept, anchor = top_k(sim, m), top_k(sim, k)
            demos = [pool[i] for i in anchor]
            loss0, g = self.gradient(demos, validation)
            with torch.no_grad():
                e_anchor = demo_embedding(self.model, self.builder, demos)
                shifts = torch.stack([demo_embedding(self.model, self.builder, [pool[i]]) for i in kept]) - e_anchor
                estimate = loss0 + (shifts @ g).double().cpu().numpy()  # (m,)
        tokens += sum(len(self.builder.build(demos, q)) + len(self.builder.answer_ids(q)) - 1 for q in validation)
        scores = np.full(n, np.nan)
        scores[kept] = -estimate
        return Selection(self.name, top_k(scores, k), scores, cost, tokens,
                         details={"prefiltered": m, "anchor": anchor, "anchor_loss": loss0})

"""Selection baselines behind the :class:`~icl_ssm.selection.Selector` contract.

Importing this module registers three names in :data:`~icl_ssm.selection.SELECTORS`:

* ``bm25``: lexical overlap with the validation queries (the ``bm25s`` library), no model;
* ``topk``: cosine similarity of the model's own embeddings of candidates and queries (the
  similarity baseline of "Long-Context Demonstration Selection Using State Space Models");
* ``gradce``: a first-order (Taylor) estimate of each candidate's validation loss from one
  forward/backward pass at an anchor prompt, after a ``topk`` prefilter.

All three are deterministic: ``rng`` is accepted for the contract and not used.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm import prompts as P
from icl_ssm import tasks as T
from icl_ssm.cost import measure
from icl_ssm.selection import Selection, Selector, check_selection_inputs, register, top_k


def _check_batch(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected an integer >= 1")


def _forward_kwargs(model: PreTrainedModel, keep: int | Tensor) -> dict:
    """``logits_to_keep`` where the model accepts it, so no (B, L, vocab) logits are built."""
    return {"logits_to_keep": keep} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


# ----------------------------------------------------------------------------- bm25


def _bm25s():
    """``bm25s``, imported on first use: where JAX is installed, importing it runs a JAX op, and
    JAX's first op takes 75% of the GPU's memory unless told otherwise; neither should happen
    to a process that never asked for BM25 (a distillation run beside others on one GPU)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bm25s

    return bm25s


@register("bm25")
@dataclass
class BM25Selector(Selector):
    """BM25 (``bm25s``, English stopwords): a candidate's score is the mean BM25 score of its
    ``input`` text over the validation inputs taken as queries. Cost: wall seconds, 0 FLOPs."""

    k1: float = 1.5
    b: float = 0.75

    def scores(self, pool: Sequence[T.Example], validation: Sequence[T.Example]) -> np.ndarray:
        """(n,) float64: mean over the validation queries of each candidate's BM25 score."""
        bm25s = _bm25s()
        corpus = bm25s.tokenize([e.input for e in pool], stopwords="en", return_ids=False, show_progress=False)
        queries = bm25s.tokenize([q.input for q in validation], stopwords="en", return_ids=False,
                                 show_progress=False)
        retriever = bm25s.BM25(k1=self.k1, b=self.b)
        retriever.index(corpus, show_progress=False)
        per_query = np.stack([retriever.get_scores(q) for q in queries])  # (V, n)
        return per_query.astype(np.float64).mean(0)

    def select(self, pool, validation, k, rng):
        check_selection_inputs(pool, validation, k)
        with measure(None, count_flops=False) as cost:
            scores = self.scores(pool, validation)
        return Selection(self.name, top_k(scores, k), scores, cost)


# ----------------------------------------------------------------------------- topk


@torch.no_grad()
def embed(model: PreTrainedModel, builder: P.PromptBuilder, examples: Sequence[T.Example],
          batch: int = 16) -> tuple[Tensor, int]:
    """Each example rendered as a query (``builder.build_suffix``: the input, no answer) and
    embedded as the *mean* of the model's last-layer hidden states over its real tokens.

    Mean pooling rather than the last token: every query ends with the same output prefix
    (``"Answer:"``), whose state in a causal model is dominated by the template, while the
    mean weighs every input token equally. Right-padded batches with the attention mask, so
    the result does not depend on ``batch``; no gradients. Returns ((N, H) float32 on the
    model's device, tokens run through the model).
    """
    seqs = [builder.build_suffix(e).input_ids for e in examples]
    out = []
    for start in range(0, len(seqs), batch):
        ids, mask = P.pad_ids(seqs[start : start + batch])  # (B, L) each
        ids, mask = ids.to(model.device), mask.to(model.device)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        result = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions, output_hidden_states=True,
                       **_forward_kwargs(model, 1))
        hidden = result.hidden_states[-1].float()  # (B, L, H): the last layer, after the final norm
        weights = mask.float()[..., None]  # (B, L, 1)
        out.append((hidden * weights).sum(1) / weights.sum(1))  # (B, H)
    return torch.cat(out), sum(len(s) for s in seqs)


@register("topk")
@dataclass
class TopKSelector(Selector):
    """Similarity baseline: a candidate's score is its mean cosine similarity to the
    validation queries, both embedded by :func:`embed` (the selecting model itself)."""

    model: PreTrainedModel
    builder: P.PromptBuilder
    batch: int = 16

    def __post_init__(self) -> None:
        _check_batch(batch=self.batch)

    def similarity(self, pool: Sequence[T.Example], validation: Sequence[T.Example]) -> tuple[np.ndarray, int]:
        """((n,) float64 mean cosine to the validation queries, tokens run through the model)."""
        emb, tokens = embed(self.model, self.builder, [*pool, *validation], self.batch)
        emb = torch.nn.functional.normalize(emb, dim=-1)
        cos = emb[: len(pool)] @ emb[len(pool) :].T  # (n, V)
        return cos.mean(1).double().cpu().numpy(), tokens

    def select(self, pool, validation, k, rng):
        check_selection_inputs(pool, validation, k)
        with torch.no_grad(), measure(self.model.device) as cost:
            scores, tokens = self.similarity(pool, validation)
        return Selection(self.name, top_k(scores, k), scores, cost, tokens)


# ----------------------------------------------------------------------------- gradce


@torch.no_grad()
def demo_embedding(model: PreTrainedModel, builder: P.PromptBuilder, demos: Sequence[T.Example]) -> Tensor:
    """(H,) float32: mean input embedding over every demonstration token of ``demos``."""
    prefix = builder.build_prefix(list(demos))
    ids = [t for s, e in prefix.demo_spans for t in prefix.input_ids[s:e]]
    table = model.get_input_embeddings()
    return table(torch.tensor(ids, device=model.device)).float().mean(0)


def anchor_loss(model: PreTrainedModel, builder: P.PromptBuilder, demos: Sequence[T.Example],
                validation: Sequence[T.Example], delta: Tensor, batch: int = 8) -> Tensor:
    """Mean gold-answer NLL (as :func:`~icl_ssm.prompts.answer_loss`, ``normalize=False``) of
    the dense prompts ``demos + query`` over ``validation``, with ``delta`` (H,) added to the
    input embedding of every demonstration token. A scalar, differentiable in ``delta``."""
    contexts = [builder.build(list(demos), q) for q in validation]
    answers = [builder.answer_ids(q) for q in validation]
    table, total = model.get_input_embeddings(), delta.new_zeros(())
    for start in range(0, len(contexts), batch):
        rows = range(start, min(start + batch, len(contexts)))
        ids, mask = P.pad_ids([contexts[i].input_ids + answers[i][:-1] for i in rows])  # (B, L)
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
        kwargs = _forward_kwargs(model, keep_t)
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
    builder: P.PromptBuilder
    prefilter: int = 4
    batch: int = 8

    def __post_init__(self) -> None:
        _check_batch(prefilter=self.prefilter, batch=self.batch)

    def gradient(self, demos: Sequence[T.Example], validation: Sequence[T.Example]) -> tuple[float, Tensor]:
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
        check_selection_inputs(pool, validation, k)
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


__all__ = ["BM25Selector", "GradCESelector", "TopKSelector", "anchor_loss", "demo_embedding", "embed"]

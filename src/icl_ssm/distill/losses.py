"""The distillation losses: KV alignment (stage 1), the top-k bucketed KL, the label KL, the
hidden-state loss and the subset-ranking loss (stage 2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def kv_alignment_loss(keys: Tensor, values: Tensor, pool_k: Tensor, pool_v: Tensor) -> Tensor:
    """Stage 1. ``keys``/``values: (m, B, H_kv, n_v, d)``; targets ``(B, m, H_kv, n_v, d)``."""
    tk, tv = pool_k.transpose(0, 1).to(keys.dtype), pool_v.transpose(0, 1).to(values.dtype)
    return (1 - F.cosine_similarity(keys, tk, dim=-1)).mean() + (1 - F.cosine_similarity(values, tv, dim=-1)).mean()


def bucket_kl(student_logp: Tensor, top_idx: Tensor, top_logp: Tensor, temperature: float) -> Tensor:
    """``T^2 KL(P_teacher || P_student)`` over the teacher's top-K tokens plus one bucket for
    the rest, each distribution tempered by ``T`` on those K + 1 buckets.

    ``student_logp: (n, V)`` log-softmax; ``top_idx``/``top_logp: (n, K)``. Returns ``(n,)``.
    """
    def buckets(top: Tensor) -> Tensor:
        rest = torch.log1p(-top.exp().sum(-1).clamp(max=1 - 1e-6))
        return torch.log_softmax(torch.cat([top, rest[:, None]], dim=-1) / temperature, dim=-1)

    t = buckets(top_logp.float())
    s = buckets(student_logp.gather(1, top_idx.long()))
    return temperature**2 * (t.exp() * (t - s)).sum(-1)


def label_kl(student_logp: Tensor, label_tokens: Tensor, teacher_label_logp: Tensor) -> Tensor:
    """``KL(P_teacher || P_student)`` of the answer distribution renormalised over the task's
    label verbalisers (first tokens): the decision the prompt has to carry, which the
    full-vocabulary KL weighs as two tokens among 49k.

    ``student_logp: (n, V)``; ``label_tokens: (n, L)`` long, -1 for padding;
    ``teacher_label_logp: (n, L)``. Returns ``(n,)``; 0 where a row has no labels.
    """
    valid = label_tokens >= 0
    s = student_logp.gather(1, label_tokens.clamp(min=0)).masked_fill(~valid, float("-inf")).log_softmax(-1)
    t = teacher_label_logp.float().masked_fill(~valid, float("-inf")).log_softmax(-1)
    kl = (t.exp() * (t - s)).masked_fill(~valid, 0.0).sum(-1)
    return torch.where(valid.any(-1), kl, torch.zeros_like(kl))


def hidden_loss(student: Tensor, teacher: Tensor) -> Tensor:
    """``mean_l (1 - cos)`` over layers: ``(n, m, H)`` each -> ``(n,)``."""
    return (1 - F.cosine_similarity(student, teacher.to(student.dtype), dim=-1)).mean(-1)


def rank_loss(student_nll: Tensor, teacher_nll: Tensor, level: str = "query") -> Tensor:
    """Match how losses vary across the subsets of a group: ``(S, Q)`` each -> scalar.

    ``level="query"``: every (subset, query) loss, centred over the subsets. ``"subset"``: each
    subset's mean over the queries, centred over the subsets (what selection ranks by; on
    Rotten Tomatoes it is about a fifth of the per-query variation, the rest being how a
    subset suits a particular query)."""
    if level not in RANK_LEVELS:
        raise ValueError(f"rank level {level!r}; accepted: {', '.join(RANK_LEVELS)}")
    if level == "subset":
        student_nll, teacher_nll = student_nll.mean(1, keepdim=True), teacher_nll.mean(1, keepdim=True)
    ds = student_nll - student_nll.mean(0, keepdim=True)
    dt = teacher_nll - teacher_nll.mean(0, keepdim=True)
    return (ds - dt).pow(2).mean()


RANK_LEVELS = ("query", "subset")

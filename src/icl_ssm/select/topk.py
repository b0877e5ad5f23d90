"""The top-k similarity baseline: candidates ranked by the mean cosine similarity of their
embedding (the selecting model's mean-pooled hidden state) to the validation queries."""

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


@torch.no_grad()
def embed(model: PreTrainedModel, builder: PromptBuilder, examples: Sequence[Example],
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
        ids, mask = pad_ids(seqs[start : start + batch])  # (B, L) each
        ids, mask = ids.to(model.device), mask.to(model.device)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        result = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions, output_hidden_states=True,
                       **logits_to_keep_kwargs(model, 1))
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
    builder: PromptBuilder
    batch: int = 16

    def __post_init__(self) -> None:
        validate_positive_sizes(batch=self.batch)

    @classmethod
    def from_config(cls, cfg, model, builder, compressor=None, hooks=None) -> TopKSelector:
        return cls(model, builder)

    def similarity(self, pool: Sequence[Example], validation: Sequence[Example]) -> tuple[np.ndarray, int]:
        """((n,) float64 mean cosine to the validation queries, tokens run through the model)."""
        emb, tokens = embed(self.model, self.builder, [*pool, *validation], self.batch)
        emb = torch.nn.functional.normalize(emb, dim=-1)
        cos = emb[: len(pool)] @ emb[len(pool) :].T  # (n, V)
        return cos.mean(1).double().cpu().numpy(), tokens

    def select(self, pool, validation, k, rng):
        validate_selection_inputs(pool, validation, k)
        with torch.no_grad(), measure(self.model.device) as cost:
            scores, tokens = self.similarity(pool, validation)
        return Selection(self.name, top_k(scores, k), scores, cost, tokens)

"""Batches of token ids: a prompt in any form (a :class:`~icl_ssm.lm.prompts.Prompt`, a list
of ids, a 1-D tensor) as a list of ids, and ``n`` id sequences padded, left or right, into
``(n, L)`` ids with their mask and positions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from icl_ssm.lm.prompts import Prompt

PADDING_SIDES = ("left", "right")


PromptLike = Prompt | Sequence[int] | torch.Tensor


def as_ids(prompt: PromptLike) -> list[int]:
    """A :class:`Prompt`, a list of ids or a 1-D LongTensor -> a list of ids."""
    if isinstance(prompt, Prompt):
        return list(prompt.input_ids)
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1:
            raise ValueError(f"prompt tensor has shape {tuple(prompt.shape)}; expected (seq_len,)")
        return [int(t) for t in prompt.tolist()]
    return [int(t) for t in prompt]


def pad_ids(
    seqs: Sequence[Sequence[int] | torch.Tensor], side: str = "right", value: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` id sequences -> ``(n, L)`` long ids and bool mask, padded on ``side``."""
    if side not in PADDING_SIDES:
        raise ValueError(f"side must be one of {PADDING_SIDES}, got {side!r}")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), value, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for b, s in enumerate(seqs):
        lo = width - len(s) if side == "left" else 0
        ids[b, lo : lo + len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[b, lo : lo + len(s)] = True
    return ids, mask


def pad_batch(
    seqs: Sequence[Sequence[int]], side: str, model: PreTrainedModel
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Pad to a batch. Returns input_ids, attention_mask, position_ids (all (batch, seq), on
    the model's device) and where each row's first real token sits."""
    input_ids, real = pad_ids(seqs, side, _pad_id(model))
    mask = real.long()
    width = input_ids.shape[1]
    shift = [width - len(s) if side == "left" else 0 for s in seqs]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # real tokens: 0..len-1, pads: 0
    device = model.device
    return input_ids.to(device), mask.to(device), positions.to(device), shift


def _pad_id(model: PreTrainedModel) -> int:
    # pads are masked out, any valid id works; prefer the model's own pad token
    pad = getattr(model.config.get_text_config(), "pad_token_id", None)
    return pad if isinstance(pad, int) and pad >= 0 else 0

"""Every label's verbaliser log-likelihood after a prefix cache, the query read only once
(:func:`answer_scores`): the labels' remaining tokens form a trie whose nodes are read in one
tree-masked forward after the query's cache. The reference is
:func:`icl_ssm.lm.scoring.score_labels` (tested equal)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel

from icl_ssm.compress.cache import PrefixCache
from icl_ssm.lm.batch import pad_ids
from icl_ssm.lm.hf import accepts_logits_to_keep, output_cache, slot_positions, windowed_mask, with_cache
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm.lm.prompts import PromptBuilder


def answer_scores(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prefixes: PrefixCache,
    suffixes: Sequence[Sequence[int]],
    rows: Sequence[int],
) -> tuple[Tensor, Tensor]:
    """Answer logits and every label's verbaliser log-likelihood, reading the query only once.

    For multi-token verbalisers (modular_addition's " 0" .. " 96": ``' ', '4', '2'``). One
    forward reads ``suffixes[i] + lead`` after prefix row ``rows[i]`` (``lead`` the tokens every
    answer starts with, :meth:`PromptBuilder.answer_lead`) and keeps its cache; a second
    forward then reads every node of the labels' trie at once (" 4" and " 42" share the node
    '4'; a tree attention mask lets each node see the cache, its ancestors and itself), one
    token a node instead of the whole query again for every label. Returns the
    logits at the first token where answers differ ``(n, V)`` float32 and the scores
    ``(n, n_labels)`` float32, equal to :func:`icl_ssm.lm.scoring.score_labels` (the reference).
    """
    if len(suffixes) != len(rows):
        raise ValueError(f"{len(suffixes)} suffixes but {len(rows)} prefix rows; expected equal")
    lead = builder.answer_lead()
    rest = [ids[len(lead):] for ids in builder.label_ids()]
    device = prefixes.mask.device
    ids, mask = (t.to(device) for t in pad_ids([list(s) + lead for s in suffixes], side="left"))
    sub = prefixes.select(list(rows))
    keep = {"logits_to_keep": len(lead) + 1} if accepts_logits_to_keep(model) else {}
    with torch.no_grad():
        out = forward_with_prefix(model, sub, ids, mask, **keep)
    logp = torch.log_softmax(out.logits[:, -len(lead) - 1 :].float(), dim=-1)  # (n, lead + 1, V)
    lead_logp = sum((logp[:, j, t] for j, t in enumerate(lead)), logp.new_zeros(len(suffixes)))  # (n,)
    first = logp[:, -1]  # (n, V): where answers differ
    scores = lead_logp[:, None] + first[:, [r[0] for r in rest]]  # (n, n_labels)
    # every further token of a label is read at its node of the labels' trie: one forward of all
    # nodes after the query's cache, each node seeing the cache, its ancestors and itself
    nodes = _label_trie(rest)
    if nodes:
        node_logp = _trie_logp(model, sub.extended(output_cache(out), mask), list(nodes), device)  # (n, q, V)
        for i, r in enumerate(rest):
            for j in range(1, len(r)):
                scores[:, i] += node_logp[:, nodes[tuple(r[:j])], r[j]]
    return out.logits[:, -1].float(), scores


def _label_trie(rest: Sequence[Sequence[int]]) -> dict[tuple[int, ...], int]:
    """The inner nodes of the labels' trie: each label's first j remaining tokens (1 <= j < its
    length) -> a slot, numbered in order of entry (a parent always before its children)."""
    nodes: dict[tuple[int, ...], int] = {}
    for r in rest:
        for j in range(1, len(r)):
            nodes.setdefault(tuple(r[:j]), len(nodes))
    return nodes


def _trie_logp(
    model: PreTrainedModel, extended: PrefixCache, order: list[tuple[int, ...]], device: torch.device
) -> Tensor:
    """Log-probabilities ``(n, q, V)`` float32 after each of the ``q`` trie nodes in ``order``,
    read in one forward after ``extended`` (the prefix and the query, ``n`` rows): each node
    sees the cache, its ancestors and itself, at its own position in the prompt."""
    n, q = extended.mask.shape[0], len(order)
    dtype = extended.keys[0].dtype
    low = torch.finfo(dtype).min
    bias = torch.zeros(extended.mask.shape, dtype=dtype, device=device)
    if extended.bias is not None:
        bias += extended.bias.to(dtype)  # a gated compressor's virtual tokens
    seen = torch.where(extended.mask, bias, torch.full_like(bias, low))  # (n, L)
    sees = torch.tensor([[a[: len(b)] == b for b in order] for a in order], device=device)  # (q, q) a sees b
    tree = torch.zeros(sees.shape, dtype=dtype, device=device).masked_fill(~sees, low)
    attention = torch.cat([seen[:, None].expand(n, q, -1), tree[None].expand(n, q, q)], dim=2)[:, None]
    depth = torch.tensor([len(key) - 1 for key in order], device=device)
    before, start = slot_positions(extended.mask, extended.positions)
    node_positions = start[:, None] + depth[None]  # (n, q): where each node's token stands in the prompt
    attention = windowed_mask(model, attention, node_positions, torch.cat([before, node_positions], dim=1))
    with torch.no_grad():
        branch = model(input_ids=torch.tensor([key[-1] for key in order], device=device)[None].expand(n, q),
                       attention_mask=attention, position_ids=extended.next_position[:, None] + depth[None],
                       use_cache=True, **with_cache(model, extended.to_dynamic()))
    return torch.log_softmax(branch.logits.float(), dim=-1)  # (n, q, V)

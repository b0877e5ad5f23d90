"""One episode's teacher targets: one dense prefill over the demonstrations, then every query
answered from that prefix cache (the prefix is never re-run).

Per episode, :func:`teacher_targets` returns:

* ``pool_k``, ``pool_v: (m, H_kv, n_v, d)``: the post-RoPE keys/values of the prompt after
  the sinks (and before the ``num_recent`` exact tokens), averaged over ``n_v`` equal chunks of
  positions (:func:`pool_kv`, the stage-1 targets);
* per query: the top-K log-probabilities of the answer-position distribution and the mass
  left outside them (KL targets), the gold token's log-probability and that of every label's
  token, and every layer's hidden state at the answer position. The answer position is the
  first one where answers differ: a lead that every answer shares (the space of " 42" in
  SmolLM2's tokenizer) is appended to each query (``TeacherSpec.answer_leads``).

The queries are read packed after one copy of the prefix
(:func:`icl_ssm.compress.packed.forward_packed`), or, as the reference, each after its own copy
(``pack=False``); :mod:`.teacher` stores the targets of many episodes on disk.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from icl_ssm.compress.cache import dense_cache
from icl_ssm.compress.packed import forward_packed
from icl_ssm.data.tasks import Example
from icl_ssm.distill.spec import TeacherSpec
from icl_ssm.lm.batch import pad_ids
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm.lm.prompts import PromptBuilder


def pool_kv(kv: Tensor, length: int, num_sink: int, num_virtual: int) -> Tensor:
    """Mean of ``kv: (H_kv, L, d)`` over ``num_virtual`` equal chunks of positions
    ``num_sink .. length`` -> ``(H_kv, num_virtual, d)`` (the paper's Pool)."""
    span = kv[:, num_sink:length]
    if span.shape[1] < num_virtual:
        raise ValueError(
            f"a prompt of {length} tokens leaves {span.shape[1]} after {num_sink} sinks, fewer than "
            f"num_virtual={num_virtual}; use more demonstrations or fewer virtual tokens"
        )
    return torch.stack([c.mean(dim=1) for c in torch.tensor_split(span, num_virtual, dim=1)], dim=1)


@torch.no_grad()
def teacher_targets(model, builder: PromptBuilder, demos: list[Example], queries: list[Example],
                    spec: TeacherSpec, lead: Sequence[int] = (), pack: bool = True) -> dict[str, Tensor]:
    """One episode's targets (see the module docstring); shapes without the episode axis.

    ``lead``: the tokens every answer starts with (``PromptBuilder.answer_lead``); they end each
    stored query, so the targets (distribution, gold token, label tokens, hidden states) are
    those of the first token where answers differ. The label tokens are the labels' distinct
    tokens there, in label order. ``pack``: the queries are read as segments of one sequence
    after the prefix (:func:`icl_ssm.compress.packed.forward_packed`); ``False`` is the reference path,
    each query after its own copy of the prefix (the same targets up to float rounding).
    Computed on the model's device, returned on the CPU."""
    device = model.device
    prefix_ids = torch.tensor([builder.build_prefix(demos).input_ids], device=device)
    dense = dense_cache(model, prefix_ids)
    L = prefix_ids.shape[1]
    end = L - spec.num_recent  # virtual tokens summarise what the recent tokens do not keep
    pool_k = torch.stack([pool_kv(k[0], end, spec.num_sink, spec.num_virtual) for k in dense.keys])
    pool_v = torch.stack([pool_kv(v[0], end, spec.num_sink, spec.num_virtual) for v in dense.values])
    lead = list(lead)
    suffixes = [torch.tensor(builder.build_suffix(q).input_ids + lead) for q in queries]
    if pack:  # every query a segment of one sequence after the prefix (read once, not copied per query)
        with torch.no_grad():
            logits, hidden = forward_packed(model, dense, [s.tolist() for s in suffixes], [0] * len(queries),
                                              output_hidden_states=True)
    else:  # the reference: each query after its own copy of the prefix, left-padded
        ids, mask = pad_ids(suffixes, side="left")  # the answer position is the last one for every row
        out = forward_with_prefix(model, dense.repeat_interleave(len(queries)), ids.to(device), mask.to(device),
                                    output_hidden_states=True, logits_to_keep=1)
        logits = out.logits[:, -1]
        hidden = torch.stack([h[:, -1] for h in out.hidden_states[1:]], dim=1)  # (Q, m, H)
    logp = torch.log_softmax(logits.float(), dim=-1)  # (Q, V)
    top_logp, top_idx = logp.topk(spec.topk, dim=-1)
    gold = torch.tensor([builder.answer_ids(q)[len(lead)] for q in queries], device=device)
    labels = builder.task.labels if builder.task.kind == "classification" else ()
    distinct = dict.fromkeys(builder.answer_ids(lab)[len(lead)] for lab in labels)
    label_tokens = torch.tensor(list(distinct), dtype=torch.long, device=device)
    targets = {
        "prompt_ids": prefix_ids[0],
        "pool_k": pool_k.half(),
        "pool_v": pool_v.half(),
        "top_idx": top_idx.int(),
        "top_logp": top_logp,
        "gold_token": gold,
        "gold_logp": logp.gather(1, gold[:, None])[:, 0],
        "label_tokens": label_tokens,
        "label_logp": logp[:, label_tokens] if len(labels) else logp.new_zeros(len(queries), 0),
        "hidden": hidden.half(),
    }
    return {"query_ids": suffixes, **{name: t.cpu() for name, t in targets.items()}}

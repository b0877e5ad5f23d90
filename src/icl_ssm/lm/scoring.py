"""Scoring and generation with a causal LM: the log-probabilities of continuations (fast path and
reference), label scores and predictions, the answer loss, and greedy generation, with or
without a prefix cache.

Scoring: :func:`continuation_logprobs` is the batched fast path (padding, attention masks,
explicit position ids, rows shared between continuations of one context);
:func:`continuation_logprobs_ref` is the obviously-correct reference (one unpadded forward
per pair). Both take an optional ``prefix`` standing before the prompts, so that the
demonstrations come from a (compressed) KV cache and only the query suffix is fed: a
:class:`~icl_ssm.lm.prefix.PrefixLike` (``icl_ssm.compress.cache.PrefixCache``) or a plain
transformers ``Cache`` of batch 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from icl_ssm.lm.batch import PADDING_SIDES, PromptLike, as_ids, pad_batch
from icl_ssm.lm.hf import accepts_logits_to_keep, output_cache, prefix_mask_for, with_cache
from icl_ssm.lm.prefix import PrefixLike, prefix_inputs, prefix_row_map
from icl_ssm.lm.prompts import SEPARATOR, ExampleLike, PromptBuilder


def continuation_logprobs(
    model: PreTrainedModel,
    contexts: Sequence[PromptLike],
    continuations: Sequence[Sequence[int]],
    *,
    prefix: PrefixLike | Any = None,
    prefix_rows: Sequence[int] | None = None,
    position_offset: int | None = None,
    batch_size: int = 16,
    padding_side: str = "left",
) -> torch.Tensor:
    """Sum of log p(continuation tokens | [prefix +] context), batched: the fast path.

    Args:
        contexts: ``n`` prompts (each (ctx_len,), ctx_len >= 1).
        continuations: ``n`` token lists (each (cont_len,), cont_len >= 1).
        prefix: what stands before every context, if anything: a :class:`PrefixLike`
            (``icl_ssm.compress.cache.PrefixCache``, its rows may hold different demonstration
            subsets) or a plain transformers ``Cache`` of batch size 1 (copied, never
            modified). The contexts are then the query suffixes.
        prefix_rows: ``n`` prefix rows, one per context. Default: row 0 for a one-row
            prefix, row ``i`` for context ``i`` when the prefix has ``n`` rows.
        position_offset: for a plain ``Cache`` only: position id of the first context token
            (default: the cache length). A :class:`PrefixLike` carries ``next_position``.
        batch_size: rows per forward pass.
        padding_side: ``"left"`` or ``"right"``; the result does not depend on it.

    Returns:
        (n,) float32 log-probabilities on the model's device.

    Requests with the same context (and prefix row) share rows: a continuation is read off
    the row of a longer one when its tokens minus the last are a prefix of that row's
    (single-token verbalisers -> one row per prompt).
    """
    requests = _requests(contexts, continuations)
    rows_of = prefix_row_map(prefix, len(requests), prefix_rows)
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side={padding_side!r}; accepted: {', '.join(PADDING_SIDES)}")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}; expected a positive int")
    # rows: (prefix row, input ids); each request -> (its row, position of its first target)
    rows: list[tuple[int, list[int]]] = []
    where: list[tuple[int, int]] = [(-1, -1)] * len(requests)
    by_context: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i in sorted(range(len(requests)), key=lambda i: -len(requests[i][1])):
        ctx, cont = requests[i]
        needed = ctx + cont[:-1]
        candidates = by_context.setdefault((rows_of[i], tuple(ctx)), [])
        row = next((r for r in candidates if rows[r][1][: len(needed)] == needed), None)
        if row is None:
            row = len(rows)
            rows.append((rows_of[i], needed))
            candidates.append(row)
        where[i] = (row, len(ctx) - 1)
    requests_of_row: dict[int, list[int]] = {}
    for i, (row, _) in enumerate(where):
        requests_of_row.setdefault(row, []).append(i)

    device = model.device
    out = torch.zeros(len(requests), dtype=torch.float32, device=device)
    for start in range(0, len(rows), batch_size):
        batch_rows = range(start, min(start + batch_size, len(rows)))
        seqs = [rows[r][1] for r in batch_rows]
        input_ids, mask, positions, shift = pad_batch(seqs, padding_side, model)
        # (row in batch, position in the padded row, target token, request)
        gathers = [
            (b, shift[b] + where[i][1] + j, tok, i)
            for b, r in enumerate(batch_rows)
            for i in requests_of_row[r]
            for j, tok in enumerate(requests[i][1])
        ]
        keep = sorted({g[1] for g in gathers})
        column = {p: k for k, p in enumerate(keep)}
        logprobs = _forward_logprobs(
            model,
            input_ids,
            mask,
            positions,
            prefix_inputs(prefix, [rows[r][0] for r in batch_rows], position_offset, device),
            keep,
        )  # (batch, len(keep), vocab)
        b_idx, p_idx, t_idx, r_idx = (
            torch.tensor(x, device=device)
            for x in zip(*[(b, column[p], t, i) for b, p, t, i in gathers], strict=True)
        )
        out.index_add_(0, r_idx, logprobs[b_idx, p_idx, t_idx])  # sum over tokens
    return out


def continuation_logprobs_ref(
    model: PreTrainedModel,
    contexts: Sequence[PromptLike],
    continuations: Sequence[Sequence[int]],
    *,
    prefix: PrefixLike | Any = None,
    prefix_rows: Sequence[int] | None = None,
    position_offset: int | None = None,
) -> torch.Tensor:
    """Reference for :func:`continuation_logprobs`: one unpadded forward per pair, no row
    sharing, the whole continuation fed. Returns (n,) float32 on the model's device."""
    requests = _requests(contexts, continuations)
    rows_of = prefix_row_map(prefix, len(requests), prefix_rows)
    device = model.device
    out = torch.empty(len(requests), dtype=torch.float32, device=device)
    for i, (ctx, cont) in enumerate(requests):
        ids = torch.tensor([ctx + cont], device=device)  # (1, seq)
        cache, prefix_mask, next_position, bias, slots = prefix_inputs(
            prefix, [rows_of[i]], position_offset, device
        )  # _, (1, L), (1,), None or (1, L), None or (1, L)
        positions = next_position[:, None] + torch.arange(ids.shape[1], device=device)  # (1, seq)
        _check_positions(model, int(positions.max()) + 1)
        mask = prefix_mask_for(model, prefix_mask, torch.ones_like(ids), bias, dtype=model.dtype, positions=slots)
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=cache is not None,
                **with_cache(model, cache),
            ).logits  # (1, seq, vocab)
        logprobs = logits[0].float().log_softmax(-1)  # (seq, vocab)
        steps = torch.arange(len(cont), device=device)
        out[i] = logprobs[len(ctx) - 1 + steps, torch.tensor(cont, device=device)].sum()
    return out


def score_labels(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prompts: Sequence[PromptLike],
    *,
    prefix: PrefixLike | Any = None,
    reference: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """Log-likelihood of every label's verbaliser after each prompt.

    Args:
        prompts: ``batch`` prompts: full prompts, or query suffixes after ``prefix``.
        prefix: one row shared by all prompts, or one row per prompt (see
            :func:`continuation_logprobs`).
        reference: use :func:`continuation_logprobs_ref` instead of the batched path.
        kwargs: ``position_offset``, and ``batch_size``/``padding_side`` for the batched path.

    Returns:
        (batch, n_labels) float32: sum of the token log-probs of each (multi-token) verbaliser.
    """
    labels = builder.label_ids()
    rows = prefix_row_map(prefix, len(prompts), None)
    contexts = [as_ids(p) for p in prompts for _ in labels]
    continuations = [lab for _ in prompts for lab in labels]
    rows = [r for r in rows for _ in labels]
    scores = _logprobs(model, contexts, continuations, prefix, rows, reference, kwargs)
    return scores.view(len(prompts), len(labels))


def predict_labels(
    model: PreTrainedModel, builder: PromptBuilder, prompts: Sequence[PromptLike], **kwargs: Any
) -> list[str]:
    """The label with the highest verbaliser log-likelihood for each prompt."""
    scores = score_labels(model, builder, prompts, **kwargs)  # (batch, n_labels)
    return [builder.task.labels[i] for i in scores.argmax(-1).tolist()]


def answer_loss(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prompts: Sequence[PromptLike],
    examples: Sequence[ExampleLike],
    *,
    normalize: bool = False,
    prefix: PrefixLike | Any = None,
    reference: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """Per-query loss of the gold answer: the validation loss demonstration selection uses.

    ``normalize=False``: NLL of the gold answer tokens (the gold verbaliser, or the gold
    answer text of a generative task). ``normalize=True`` (classification only): cross-entropy
    over the label set, ``-log_softmax(score_labels)[gold]``. ``prefix`` and kwargs as in
    :func:`score_labels`.

    Returns (batch,) float32.
    """
    if len(prompts) != len(examples):
        raise ValueError(f"{len(prompts)} prompts but {len(examples)} examples; expected equal")
    if normalize:
        builder._require_classification("answer_loss(normalize=True)")
        gold = torch.tensor([builder.label_index(e) for e in examples])
        scores = score_labels(model, builder, prompts, prefix=prefix, reference=reference, **kwargs)
        return torch.nn.functional.cross_entropy(scores, gold.to(scores.device), reduction="none")
    if builder.task.kind == "classification":
        for e in examples:
            builder.label_index(e)  # a clear error for a target that is not a label
    gold_ids = [builder.answer_ids(e) for e in examples]
    rows = prefix_row_map(prefix, len(prompts), None)
    contexts = [as_ids(p) for p in prompts]
    return -_logprobs(model, contexts, gold_ids, prefix, rows, reference, kwargs)


def greedy_generate(
    model: PreTrainedModel,
    prompts: Sequence[PromptLike],
    *,
    max_new_tokens: int = 32,
    eos_token_ids: Sequence[int] = (),
    stop: Callable[[list[int]], bool] | None = None,
    prefix: PrefixLike | Any = None,
    position_offset: int | None = None,
    batch_size: int = 8,
) -> list[list[int]]:
    """Greedy decoding, left-padded batches, explicit positions (works after a prefix).

    A row stops at an id in ``eos_token_ids`` (not included in the output), when
    ``stop(generated_ids)`` is true, or after ``max_new_tokens``. ``prefix`` and
    ``position_offset`` as in :func:`continuation_logprobs`. Returns the generated ids.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens}; expected >= 0")
    ids_list = [as_ids(p) for p in prompts]
    for i, p in enumerate(ids_list):
        if not p:
            raise ValueError(f"prompt {i} is empty; expected at least one token")
    rows_of = prefix_row_map(prefix, len(ids_list), None)
    device = model.device
    eos = set(eos_token_ids)
    extra = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    outputs: list[list[int]] = []
    for start in range(0, len(ids_list), batch_size):
        seqs = ids_list[start : start + batch_size]
        step_ids, mask, positions, _ = pad_batch(seqs, "left", model)  # (batch, seq) each
        cache, prefix_mask, next_position, bias, slots = prefix_inputs(
            prefix, rows_of[start : start + len(seqs)], position_offset, device
        )
        positions = positions + next_position[:, None]
        seen = mask  # (batch, seen)
        _check_positions(model, int(positions.max()) + max_new_tokens)
        generated: list[list[int]] = [[] for _ in seqs]
        done = [max_new_tokens == 0] * len(seqs)
        while not all(done):
            with torch.no_grad():
                out = model(
                    input_ids=step_ids,
                    attention_mask=prefix_mask_for(model, prefix_mask, seen, bias, step_ids.shape[1], model.dtype,
                                                   positions=slots),
                    position_ids=positions,  # (batch, step)
                    use_cache=True,
                    **with_cache(model, cache),
                    **extra,
                )
            cache = output_cache(out)
            next_ids = out.logits[:, -1].argmax(-1)  # (batch,)
            for b, tok in enumerate(next_ids.tolist()):
                if done[b]:
                    continue
                if tok in eos:
                    done[b] = True
                    continue
                generated[b].append(tok)
                if len(generated[b]) >= max_new_tokens or (stop is not None and stop(generated[b])):
                    done[b] = True
            step_ids = next_ids[:, None]  # (batch, 1)
            positions = positions[:, -1:] + 1  # (batch, 1)
            seen = torch.cat([seen, seen.new_ones(len(seqs), 1)], dim=1)
        outputs.extend(generated)
    return outputs


def generate_answers(
    model: PreTrainedModel,
    builder: PromptBuilder,
    prompts: Sequence[PromptLike],
    *,
    max_new_tokens: int = 32,
    stop_strings: Sequence[str] | None = None,
    extract: bool = True,
    **kwargs: Any,
) -> list[str]:
    """Greedy answers, cut at the first stop string, then ``task.extract_answer``.

    ``stop_strings`` default: ``("\\n\\n",)`` in plain mode (the demonstration separator: the
    model has started a new demonstration), none in chat mode (the turn's EOS ends it).
    kwargs go to :func:`greedy_generate` (``prefix``, ``position_offset``, ``batch_size``).
    ``extract=False`` returns the cut raw texts.
    """
    tokenizer = builder.tokenizer
    if stop_strings is None:
        stop_strings = () if builder.chat else (SEPARATOR,)

    def stop(ids: list[int]) -> bool:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return any(s in text for s in stop_strings)

    generated = greedy_generate(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        eos_token_ids=_eos_ids(model, tokenizer),
        stop=stop if stop_strings else None,
        **kwargs,
    )
    answers = []
    for ids in generated:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        for s in stop_strings:
            text = text.split(s, 1)[0]
        answers.append(builder.task.extract_answer(text) if extract else text)
    return answers


def _logprobs(
    model: PreTrainedModel,
    contexts: list[list[int]],
    continuations: list[list[int]],
    prefix: Any,
    prefix_rows: list[int],
    reference: bool,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    if reference:  # batching options mean nothing to the reference
        kwargs = {k: v for k, v in kwargs.items() if k not in ("batch_size", "padding_side")}
        fn = continuation_logprobs_ref
    else:
        fn = continuation_logprobs
    rows = None if prefix is None else prefix_rows
    return fn(model, contexts, continuations, prefix=prefix, prefix_rows=rows, **kwargs)


def _requests(
    contexts: Sequence[PromptLike], continuations: Sequence[Sequence[int]]
) -> list[tuple[list[int], list[int]]]:
    if len(contexts) != len(continuations):
        raise ValueError(
            f"{len(contexts)} contexts but {len(continuations)} continuations; expected equal"
        )
    requests = []
    for i, (ctx, cont) in enumerate(zip(contexts, continuations, strict=True)):
        ctx_ids, cont_ids = as_ids(ctx), [int(t) for t in cont]
        if not ctx_ids:
            raise ValueError(f"context {i} is empty; expected at least one token")
        if not cont_ids:
            raise ValueError(f"continuation {i} is empty; expected at least one token")
        requests.append((ctx_ids, cont_ids))
    return requests


def _forward_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prefix_inputs: tuple[Any, torch.Tensor, torch.Tensor, Any, Any],
    keep: list[int],
) -> torch.Tensor:
    """Log-softmax of the logits at positions ``keep``: (batch, len(keep), vocab) float32.

    ``input_ids``, ``attention_mask``, ``position_ids``: (batch, seq), positions counted from
    0; ``prefix_inputs``: (cache or None, prefix mask (batch, L), next position (batch,), bias,
    slot positions).
    """
    cache, prefix_mask, next_position, bias, slots = prefix_inputs
    positions = position_ids + next_position[:, None]  # (batch, seq)
    _check_positions(model, int(positions.max()) + 1)
    kwargs: dict[str, Any] = {
        "attention_mask": prefix_mask_for(model, prefix_mask, attention_mask, bias, dtype=model.dtype,
                                          positions=slots),
        "position_ids": positions,
        "use_cache": cache is not None,
        **with_cache(model, cache),
    }
    keep_t = torch.tensor(keep, device=input_ids.device)
    with torch.no_grad():
        if accepts_logits_to_keep(model):
            logits = model(input_ids=input_ids, logits_to_keep=keep_t, **kwargs).logits
        else:
            logits = model(input_ids=input_ids, **kwargs).logits[:, keep_t]
    return logits.float().log_softmax(-1)  # (batch, len(keep), vocab)



def _check_positions(model: PreTrainedModel, needed: int) -> None:
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and needed > limit:
        raise ValueError(
            f"scoring needs {needed} positions but the model's context "
            f"(config.max_position_embeddings) is {limit}; use a shorter prompt"
        )




def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)

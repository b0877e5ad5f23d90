"""Greedy generation with a causal LM, with or without a prefix cache: token ids
(:func:`greedy_generate`), and a task's answers cut at a stop string and extracted
(:func:`generate_answers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from icl_ssm.lm.batch import PromptLike, as_ids, pad_batch
from icl_ssm.lm.hf import accepts_logits_to_keep, output_cache
from icl_ssm.lm.logprobs import check_positions
from icl_ssm.lm.prefix import PrefixLike, prefix_inputs, prefix_row_map
from icl_ssm.lm.prompts import SEPARATOR, PromptBuilder


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
    ``position_offset`` as in :func:`~icl_ssm.lm.logprobs.continuation_logprobs`. Returns the
    generated ids, one list per prompt.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens}; expected >= 0")
    ids_list = [as_ids(p) for p in prompts]
    for i, p in enumerate(ids_list):
        if not p:
            raise ValueError(f"prompt {i} is empty; expected at least one token")
    rows_of = prefix_row_map(prefix, len(ids_list), None)
    eos = set(eos_token_ids)
    outputs: list[list[int]] = []
    for start in range(0, len(ids_list), batch_size):
        seqs = ids_list[start : start + batch_size]
        rows = rows_of[start : start + len(seqs)]
        outputs.extend(_greedy_batch(model, seqs, prefix, rows, position_offset, max_new_tokens, eos, stop))
    return outputs


def _greedy_batch(
    model: PreTrainedModel,
    seqs: list[list[int]],
    prefix: PrefixLike | Any,
    prefix_rows: list[int],
    position_offset: int | None,
    max_new_tokens: int,
    eos: set[int],
    stop: Callable[[list[int]], bool] | None,
) -> list[list[int]]:
    """:func:`greedy_generate` of one batch ``seqs`` (left-padded), each after its row of
    ``prefix_rows``; returns the generated ids, one list per sequence."""
    step_ids, mask, positions, _ = pad_batch(seqs, "left", model)  # (batch, seq) each
    after = prefix_inputs(prefix, prefix_rows, position_offset, model.device)
    positions, cache = after.positions(positions), None  # None: the prefix's own cache, at the first step
    seen = mask  # (batch, seen)
    check_positions(model, int(positions.max()) + max_new_tokens)
    extra = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    generated: list[list[int]] = [[] for _ in seqs]
    done = [max_new_tokens == 0] * len(seqs)
    while not all(done):
        with torch.no_grad():
            out = model(input_ids=step_ids, **after.forward_kwargs(model, seen, positions, num_new=step_ids.shape[1],
                                                                   cache=cache, keep_cache=True), **extra)
        cache = output_cache(out)
        next_ids = out.logits[:, -1].argmax(-1)  # (batch,)
        _append(next_ids.tolist(), generated, done, eos, max_new_tokens, stop)
        step_ids = next_ids[:, None]  # (batch, 1)
        positions = positions[:, -1:] + 1  # (batch, 1)
        seen = torch.cat([seen, seen.new_ones(len(seqs), 1)], dim=1)
    return generated


def _append(
    next_ids: list[int],
    generated: list[list[int]],
    done: list[bool],
    eos: set[int],
    max_new_tokens: int,
    stop: Callable[[list[int]], bool] | None,
) -> None:
    """Append each unfinished row's next id to ``generated``, or end the row (``done``): an EOS
    id ends it unappended; ``max_new_tokens`` ids or a true ``stop`` end it after the id."""
    for b, tok in enumerate(next_ids):
        if done[b]:
            continue
        if tok in eos:
            done[b] = True
            continue
        generated[b].append(tok)
        if len(generated[b]) >= max_new_tokens or (stop is not None and stop(generated[b])):
            done[b] = True


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


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)

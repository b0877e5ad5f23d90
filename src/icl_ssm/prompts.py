"""Prompts of in-context demonstrations, with exact token spans, and label scoring.

A prompt is a *header* (BOS + instruction), one *piece* per demonstration and a *query*
piece. Every piece is tokenised on its own and the ids are concatenated, so

* the token span of every demonstration is exact by construction;
* a demonstration tokenises the same wherever it sits (its KV cache or SSM state can be
  reused), and ``build_prefix(demos).input_ids + build_suffix(query).input_ids ==
  build(demos, query).input_ids`` always holds;
* pieces are cut where the tokenizer's pre-tokenizer splits anyway, so the concatenation also
  equals tokenising the whole text at once (:meth:`PromptBuilder.check` verifies it).

Plain-text layout (``chat=False``)::

    {instruction}\\n\\n
    {input_prefix}{input}\\n{output_prefix} {verbalizer}\\n\\n      <- one per demonstration
    {input_prefix}{input}\\n{output_prefix}                        <- the query

**Leading-space rule.** Trailing whitespace is stripped from ``output_prefix`` and the answer
(verbaliser or generative target) carries one leading space: ``"Sentiment:" + " positive"``.
Byte-level BPE tokenizers (GPT-2, Llama-3, Qwen2, SmolLM2) fold a leading space into the
word's token, so ``" positive"`` is what the model emits after ``"Sentiment:"``; the scored
continuation is exactly the token sequence the demonstrations show. In chat mode the answer
is the assistant turn's content, with no leading space.

**Where the ``\\n\\n`` separator is cut.** Llama-3/Qwen2 tokenizers merge punctuation with
following newlines (``".\\n\\n"`` is one token), so the separator must end the previous piece
(``"trailing"``); GPT-2/SmolLM2 tokenizers split ``"\\n\\nReview"`` as ``"\\n", "\\n",
"Review"`` but ``"\\n\\n"`` alone as one token, so the separator must start the next piece
(``"leading"``). :class:`PromptBuilder` probes the tokenizer and picks the position that
keeps piecewise == whole (``separator_position`` overrides it). With ``"leading"`` an empty
instruction leaves the separator at the start of the first demonstration.

Chat layout (``chat=True``): the instruction is the system turn; each demonstration is a
user turn (``input_prefix + input``) and an assistant turn (the verbaliser); the query is the
last user turn with the generation prompt. ``output_prefix`` is not used. Turn texts are cut
out of ``tokenizer.apply_chat_template`` renderings (a template that renders a turn
differently depending on what precedes it is refused at construction).

BOS: in plain mode the ids the tokenizer itself prepends (``tokenizer("x")`` minus
``tokenizer("x", add_special_tokens=False)``) start the header, unless ``add_bos`` says
otherwise; in chat mode the template's text decides (pieces are tokenised with
``add_special_tokens=False``, so BOS is never doubled).

Scoring: :func:`continuation_logprobs` is the batched fast path (padding, attention masks,
explicit position ids, rows shared between continuations of one context);
:func:`continuation_logprobs_ref` is the obviously-correct reference (one unpadded forward
per pair). Both take an optional ``prefix`` standing before the prompts, so that the
demonstrations come from a (compressed) KV cache and only the query suffix is fed: a
:class:`PrefixLike` (``icl_ssm.cache.PrefixCache``: K/V rows, slot mask, next position; one
row shared by all prompts or one per prompt) or a plain transformers ``Cache`` of batch 1.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

SEPARATOR = "\n\n"
SEPARATOR_POSITIONS = ("trailing", "leading")
PADDING_SIDES = ("left", "right")


class ExampleLike(Protocol):
    """What :class:`PromptBuilder` reads from an example (``icl_ssm.tasks.Example``)."""

    id: str
    input: str
    target: str


class TaskLike(Protocol):
    """What this module reads from a task (``icl_ssm.tasks.Task``)."""

    name: str
    kind: str  # "classification" | "generative"
    labels: tuple[str, ...]
    verbalizers: dict[str, str]
    instruction: str
    input_prefix: str
    output_prefix: str

    def extract_answer(self, text: str) -> str: ...


@dataclass
class Prompt:
    """Token ids of a prompt and where each part lies.

    ``input_ids``: (seq_len,) as a list. Spans are ``[start, end)`` token positions.
    ``answer_start`` is where the answer tokens start (``len(input_ids)`` for a prompt that
    ends with a query; for a prefix it is where a suffix would start).
    """

    input_ids: list[int]
    demo_spans: list[tuple[int, int]]
    query_span: tuple[int, int] | None
    answer_start: int
    text: str = ""

    def __len__(self) -> int:
        return len(self.input_ids)

    def tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        """``input_ids`` as a LongTensor of shape (seq_len,)."""
        return torch.tensor(self.input_ids, dtype=torch.long, device=device)


@dataclass(frozen=True)
class _Piece:
    text: str
    ids: tuple[int, ...]


@dataclass
class PromptBuilder:
    """Turns (demonstrations, query) into a :class:`Prompt` with exact spans.

    Args:
        tokenizer: a Hugging Face tokenizer (fast or slow).
        task: a task object (see :class:`TaskLike`).
        chat: use ``tokenizer.apply_chat_template`` (see the module docstring).
        max_length: longest accepted prompt in tokens, usually the model's context
            ``config.max_position_embeddings`` (:meth:`for_model` sets it); None: no check.
        add_bos: plain mode only: prepend ``tokenizer.bos_token``. None: do what the tokenizer
            does with ``add_special_tokens=True``.
        separator_position: ``"trailing"`` or ``"leading"``; None: probe the tokenizer.
    """

    tokenizer: PreTrainedTokenizerBase
    task: TaskLike
    _: KW_ONLY
    chat: bool = False
    max_length: int | None = None
    add_bos: bool | None = None
    separator_position: str | None = None
    _pieces: dict[tuple[str, str, str], _Piece] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _header: _Piece = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = getattr(self.task, "kind", None)
        if kind not in ("classification", "generative"):
            raise ValueError(
                f"task {getattr(self.task, 'name', self.task)!r} has kind={kind!r}; "
                "accepted: 'classification', 'generative'"
            )
        if kind == "classification":
            missing = [lab for lab in self.task.labels if lab not in self.task.verbalizers]
            if missing:
                raise ValueError(f"task {self.task.name!r}: labels {missing} have no verbalizer")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length={self.max_length}; expected a positive int or None")
        if self.chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError(
                    f"chat=True but tokenizer {type(self.tokenizer).__name__} has no chat "
                    "template; use chat=False (plain-text prompts)"
                )
            self._check_chat_template()
        else:
            if self.separator_position is None:
                self.separator_position = self._probe_separator_position()
            elif self.separator_position not in SEPARATOR_POSITIONS:
                raise ValueError(
                    f"separator_position={self.separator_position!r}; accepted: "
                    f"{', '.join(SEPARATOR_POSITIONS)} or None (probe the tokenizer)"
                )
        self._header = self._make_header()

    @classmethod
    def for_model(
        cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Any, **kwargs: Any
    ) -> PromptBuilder:
        """A builder whose ``max_length`` is the model's ``config.max_position_embeddings``."""
        config = model.config.get_text_config()
        kwargs.setdefault("max_length", getattr(config, "max_position_embeddings", None))
        return cls(tokenizer, task, **kwargs)

    # ------------------------------------------------------------------ building

    def build(self, demos: Sequence[ExampleLike], query: ExampleLike | None = None) -> Prompt:
        """Header + one piece per demonstration + the query (if any).

        ``input_ids``: (seq_len,) == ``build_prefix(demos).input_ids +
        build_suffix(query).input_ids``.
        """
        prefix = self._assemble(demos)
        if query is None:
            self._check_length(len(prefix.input_ids), "prompt")
            return prefix
        q = self._query_piece(query)
        start = len(prefix.input_ids)
        ids = prefix.input_ids + list(q.ids)
        self._check_length(len(ids), "prompt")
        return Prompt(
            input_ids=ids,
            demo_spans=prefix.demo_spans,
            query_span=(start, len(ids)),
            answer_start=len(ids),
            text=prefix.text + q.text,
        )

    def build_prefix(self, demos: Sequence[ExampleLike]) -> Prompt:
        """Header + demonstrations: the part a KV cache is built from. (seq_len,) ids."""
        prefix = self._assemble(demos)
        self._check_length(len(prefix.input_ids), "prefix")
        return prefix

    def build_suffix(self, query: ExampleLike) -> Prompt:
        """The query piece alone, to append after a prefix cache. (seq_len,) ids."""
        q = self._query_piece(query)
        self._check_length(len(q.ids), "suffix")
        ids = list(q.ids)
        return Prompt(ids, [], (0, len(ids)), len(ids), q.text)

    def _assemble(self, demos: Sequence[ExampleLike]) -> Prompt:
        ids = list(self._header.ids)
        texts = [self._header.text]
        spans = []
        for demo in demos:
            piece = self._demo_piece(demo)
            spans.append((len(ids), len(ids) + len(piece.ids)))
            ids.extend(piece.ids)
            texts.append(piece.text)
        return Prompt(ids, spans, None, len(ids), "".join(texts))

    def _check_length(self, n: int, what: str) -> None:
        if self.max_length is not None and n > self.max_length:
            raise ValueError(
                f"{what} is {n} tokens long but max_length is {self.max_length} (the model's "
                "context, config.max_position_embeddings); use fewer or shorter demonstrations"
            )

    # ------------------------------------------------------------------ answers

    def answer_text(self, example_or_label: ExampleLike | str) -> str:
        """The continuation the model should emit: ``" " + verbaliser`` (plain mode with an
        output prefix) or the bare verbaliser (chat mode). A ``str`` is a label name
        (classification) or an answer text (generative)."""
        if isinstance(example_or_label, str):
            target = example_or_label
        else:
            target = example_or_label.target
        if self.task.kind == "classification":
            if target not in self.task.verbalizers:
                raise ValueError(
                    f"task {self.task.name!r}: target {target!r} is not a label; "
                    f"accepted: {', '.join(self.task.labels)}"
                )
            word = self.task.verbalizers[target]
        else:
            word = target
        word = word.strip()
        if self.chat or not self.task.output_prefix.strip():
            return word
        return " " + word

    def answer_ids(self, example_or_label: ExampleLike | str) -> list[int]:
        """Token ids of :meth:`answer_text`, as they follow the query. (n_answer_tokens,)"""
        ids = self._encode(self.answer_text(example_or_label))
        if not ids:
            raise ValueError(f"task {self.task.name!r}: empty answer for {example_or_label!r}")
        return ids

    def label_ids(self) -> list[list[int]]:
        """Token ids of every verbaliser, in ``task.labels`` order (lengths may differ)."""
        self._require_classification("label_ids")
        return [self.answer_ids(label) for label in self.task.labels]

    def answer_lead(self, examples: Sequence[ExampleLike] = ()) -> list[int]:
        """The tokens every answer starts with: where a one-position target must *not* be read.

        SmolLM2 writes ``" 42"`` as ``' ', '4', '2'``: after the query every answer of a numeric
        task starts with the same space token, so the answer position's distribution is the same
        for every prompt, and a loss or a logit comparison read there says nothing about the
        demonstrations. Appending the lead to the query moves that position to the first token
        where answers differ. The lead is the longest common prefix of the verbalisers' ids
        (classification) or of ``examples``' answers (generative; needed then), cut one token
        short of the shortest answer so that every answer keeps a token after it. ``[]`` for
        verbalisers such as ``" positive"``/``" negative"``.
        """
        if self.task.kind == "classification":
            answers = self.label_ids()
        else:
            if not examples:
                raise ValueError(f"task {self.task.name!r} is generative: answer_lead needs examples whose "
                                 "answers define the lead")
            answers = [self.answer_ids(e) for e in examples]
        lead = answers[0]
        for ids in answers[1:]:
            n = 0
            while n < min(len(lead), len(ids)) and lead[n] == ids[n]:
                n += 1
            lead = lead[:n]
        return list(lead[: min(len(ids) for ids in answers) - 1])

    def label_index(self, example: ExampleLike) -> int:
        """Index of the example's gold label in ``task.labels``."""
        self._require_classification("label_index")
        try:
            return list(self.task.labels).index(example.target)
        except ValueError:
            raise ValueError(
                f"task {self.task.name!r}: example {getattr(example, 'id', '?')!r} has target "
                f"{example.target!r}; accepted labels: {', '.join(self.task.labels)}"
            ) from None

    def _require_classification(self, what: str) -> None:
        if self.task.kind != "classification":
            raise ValueError(
                f"{what} needs a classification task; task {self.task.name!r} is {self.task.kind!r}"
            )

    # ------------------------------------------------------------------ checks

    def check(self, demos: Sequence[ExampleLike], query: ExampleLike | None = None) -> None:
        """Raise ValueError unless the piecewise ids equal tokenising the whole text at once.

        (The spans are exact either way; this checks that the model sees its natural
        tokenisation.) The answer of ``query``, if it has a target, is included.
        """
        prompt = self.build(demos, query)
        ids, text = list(prompt.input_ids), prompt.text
        if query is not None and (self.task.kind == "generative" or query.target):
            ids += self.answer_ids(query)
            text += self.answer_text(query)
        whole = self._encode(text)  # prompt.text spells BOS out; it is parsed back as special
        if whole != ids:
            at = next((i for i, (a, b) in enumerate(zip(whole, ids, strict=False)) if a != b), None)
            at = min(len(whole), len(ids)) if at is None else at
            raise ValueError(
                f"piecewise tokenisation differs from tokenising the whole prompt at token {at}: "
                f"{self.tokenizer.convert_ids_to_tokens(ids[at : at + 4])} vs "
                f"{self.tokenizer.convert_ids_to_tokens(whole[at : at + 4])}"
            )

    def _probe_separator_position(self) -> str:
        """The separator position that keeps piecewise == whole on a few probe strings."""
        out = self.task.output_prefix.rstrip()
        lefts = [
            "Classify the text.",
            f"{out} positive",
            f"{out} 42",
            "answer (b)?",
            "a sentence",
        ]
        rights = [f"{self.task.input_prefix}the movie", "Question: why", "a"]
        for position in SEPARATOR_POSITIONS:
            ok = True
            for left in lefts:
                for right in rights:
                    if position == "trailing":
                        a, b = left + SEPARATOR, right
                    else:
                        a, b = left, SEPARATOR + right
                    if self._encode(a) + self._encode(b) != self._encode(a + b):
                        ok = False
            if ok:
                return position
        warnings.warn(
            f"tokenizer {type(self.tokenizer).__name__}: no separator position keeps piecewise "
            "tokenisation equal to whole-text tokenisation (SentencePiece?); spans stay exact "
            "but the prompt is not the tokenizer's natural tokenisation",
            stacklevel=3,
        )
        return "trailing"

    # ------------------------------------------------------------------ pieces

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def _special_prefix(self) -> list[int]:
        """Ids the tokenizer puts before the text with ``add_special_tokens=True``."""
        plain = self._encode("a")
        full = list(self.tokenizer("a", add_special_tokens=True)["input_ids"])
        for i in range(len(full) - len(plain) + 1):
            if full[i : i + len(plain)] == plain:
                return full[:i]
        return []

    def _bos_ids(self) -> list[int]:
        if self.add_bos is None:
            return self._special_prefix()
        if not self.add_bos:
            return []
        if self.tokenizer.bos_token_id is None:
            raise ValueError(
                f"add_bos=True but tokenizer {type(self.tokenizer).__name__} has no bos_token"
            )
        return [self.tokenizer.bos_token_id]

    def _make_header(self) -> _Piece:
        instruction = self.task.instruction.strip()
        if self.chat:
            query_turn = self._render_query_turn(self._REF_USER)
            rendered = self._render([*self._system(), self._user(self._REF_USER)], True)
            if not rendered.endswith(query_turn):
                raise self._not_compositional("the first user turn")
            text = rendered[: len(rendered) - len(query_turn)]
            return _Piece(text, tuple(self._encode(text)))
        text = instruction
        if instruction and self.separator_position == "trailing":
            text += SEPARATOR
        bos = self._bos_ids()
        bos_text = self.tokenizer.decode(bos) if bos else ""
        return _Piece(bos_text + text, tuple(bos + self._encode(text)))

    def _demo_piece(self, demo: ExampleLike) -> _Piece:
        key = ("demo", demo.input, demo.target)
        if key not in self._pieces:
            if self.chat:
                text = self._render_demo_turns(demo.input, self.answer_text(demo))
            else:
                text = self._plain_body(demo.input) + self.answer_text(demo)
                text = self._with_separator(text)
            self._pieces[key] = _Piece(text, tuple(self._encode(text)))
        return self._pieces[key]

    def _query_piece(self, query: ExampleLike) -> _Piece:
        key = ("query", query.input, "")
        if key not in self._pieces:
            if self.chat:
                text = self._render_query_turn(query.input)
            else:
                text = self._plain_body(query.input)
                if self.separator_position == "leading":
                    text = SEPARATOR + text
            self._pieces[key] = _Piece(text, tuple(self._encode(text)))
        return self._pieces[key]

    def _plain_body(self, text: str) -> str:
        return f"{self.task.input_prefix}{text.strip()}\n{self.task.output_prefix.rstrip()}"

    def _with_separator(self, text: str) -> str:
        return text + SEPARATOR if self.separator_position == "trailing" else SEPARATOR + text

    # chat: turn texts are cut out of renderings that follow a fixed reference exchange, so a
    # turn is rendered as it appears after other turns (no default system prompt inside it)
    _REF_USER = "Reference question"
    _REF_ASSISTANT = "Reference answer"

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _system(self) -> list[dict[str, str]]:
        instruction = self.task.instruction.strip()
        return [{"role": "system", "content": instruction}] if instruction else []

    def _user(self, text: str) -> dict[str, str]:
        return {"role": "user", "content": f"{self.task.input_prefix}{text.strip()}".strip()}

    def _reference(self) -> list[dict[str, str]]:
        return [
            *self._system(),
            self._user(self._REF_USER),
            {"role": "assistant", "content": self._REF_ASSISTANT},
        ]

    def _cut_after_reference(self, messages: list[dict[str, str]], gen: bool, what: str) -> str:
        base = self._render(self._reference(), False)
        rendered = self._render([*self._reference(), *messages], gen)
        if not rendered.startswith(base):
            raise self._not_compositional(what)
        return rendered[len(base) :]

    def _render_demo_turns(self, text: str, answer: str) -> str:
        turns = [self._user(text), {"role": "assistant", "content": answer}]
        return self._cut_after_reference(turns, False, "a demonstration")

    def _render_query_turn(self, text: str) -> str:
        return self._cut_after_reference([self._user(text)], True, "the query")

    def _not_compositional(self, what: str) -> ValueError:
        return ValueError(
            f"the chat template of {type(self.tokenizer).__name__} renders {what} differently "
            "depending on the turns around it, so turns cannot be tokenised independently; "
            "use chat=False"
        )

    def _check_chat_template(self) -> None:
        """The pieces of a 2-demonstration conversation must concatenate to its rendering."""
        self._header = self._make_header()
        demos = [("first input", "first answer"), ("second input", "second answer")]
        pieces = [self._header.text]
        messages = [*self._system()]
        for text, answer in demos:
            pieces.append(self._render_demo_turns(text, answer))
            messages += [self._user(text), {"role": "assistant", "content": answer}]
        pieces.append(self._render_query_turn("third input"))
        messages.append(self._user("third input"))
        if "".join(pieces) != self._render(messages, True):
            raise self._not_compositional("a conversation")


# ---------------------------------------------------------------------- scoring

PromptLike = Prompt | Sequence[int] | torch.Tensor


class PrefixLike(Protocol):
    """A (compressed) demonstration prefix in front of the prompts, e.g.
    ``icl_ssm.cache.PrefixCache``: per-layer K/V for ``B`` rows of ``L`` cache slots."""

    mask: torch.Tensor  # (B, L) bool: which cache slots are real
    next_position: torch.Tensor  # (B,) long: position id of the first token after the prefix

    @property
    def batch_size(self) -> int: ...

    def select(self, index: torch.Tensor | list[int]) -> PrefixLike: ...

    def to_dynamic(self) -> Any: ...  # a fresh transformers Cache holding the selected K/V


def as_ids(prompt: PromptLike) -> list[int]:
    """A :class:`Prompt`, a list of ids or a 1-D LongTensor -> a list of ids."""
    if isinstance(prompt, Prompt):
        return list(prompt.input_ids)
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1:
            raise ValueError(f"prompt tensor has shape {tuple(prompt.shape)}; expected (seq_len,)")
        return [int(t) for t in prompt.tolist()]
    return [int(t) for t in prompt]


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
            (``icl_ssm.cache.PrefixCache``, its rows may hold different demonstration
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
    rows_of = _prefix_row_map(prefix, len(requests), prefix_rows)
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
        input_ids, mask, positions, shift = _pad(seqs, padding_side, model)
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
            _prefix_inputs(prefix, [rows[r][0] for r in batch_rows], position_offset, device),
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
    rows_of = _prefix_row_map(prefix, len(requests), prefix_rows)
    device = model.device
    out = torch.empty(len(requests), dtype=torch.float32, device=device)
    for i, (ctx, cont) in enumerate(requests):
        ids = torch.tensor([ctx + cont], device=device)  # (1, seq)
        cache, prefix_mask, next_position, bias = _prefix_inputs(
            prefix, [rows_of[i]], position_offset, device
        )  # _, (1, L), (1,), None or (1, L)
        positions = next_position[:, None] + torch.arange(ids.shape[1], device=device)  # (1, seq)
        _check_positions(model, int(positions.max()) + 1)
        mask = prefix_attention_mask(prefix_mask, torch.ones_like(ids), bias, dtype=model.dtype)
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
    rows = _prefix_row_map(prefix, len(prompts), None)
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
    rows = _prefix_row_map(prefix, len(prompts), None)
    contexts = [as_ids(p) for p in prompts]
    return -_logprobs(model, contexts, gold_ids, prefix, rows, reference, kwargs)


# ---------------------------------------------------------------------- generation


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
    rows_of = _prefix_row_map(prefix, len(ids_list), None)
    device = model.device
    eos = set(eos_token_ids)
    extra = {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}
    outputs: list[list[int]] = []
    for start in range(0, len(ids_list), batch_size):
        seqs = ids_list[start : start + batch_size]
        step_ids, mask, positions, _ = _pad(seqs, "left", model)  # (batch, seq) each
        cache, prefix_mask, next_position, bias = _prefix_inputs(
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
                    attention_mask=prefix_attention_mask(prefix_mask, seen, bias, step_ids.shape[1], model.dtype),
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


# ---------------------------------------------------------------------- helpers


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


def _pad(
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


def _forward_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prefix_inputs: tuple[Any, torch.Tensor, torch.Tensor],
    keep: list[int],
) -> torch.Tensor:
    """Log-softmax of the logits at positions ``keep``: (batch, len(keep), vocab) float32.

    ``input_ids``, ``attention_mask``, ``position_ids``: (batch, seq), positions counted from
    0; ``prefix_inputs``: (cache or None, prefix mask (batch, L), next position (batch,), bias).
    """
    cache, prefix_mask, next_position, bias = prefix_inputs
    positions = position_ids + next_position[:, None]  # (batch, seq)
    _check_positions(model, int(positions.max()) + 1)
    kwargs: dict[str, Any] = {
        "attention_mask": prefix_attention_mask(prefix_mask, attention_mask, bias, dtype=model.dtype),
        "position_ids": positions,
        "use_cache": cache is not None,
        **with_cache(model, cache),
    }
    keep_t = torch.tensor(keep, device=input_ids.device)
    with torch.no_grad():
        if _accepts_logits_to_keep(model):
            logits = model(input_ids=input_ids, logits_to_keep=keep_t, **kwargs).logits
        else:
            logits = model(input_ids=input_ids, **kwargs).logits[:, keep_t]
    return logits.float().log_softmax(-1)  # (batch, len(keep), vocab)


def _prefix_row_map(prefix: Any, n: int, prefix_rows: Sequence[int] | None) -> list[int]:
    """Which prefix row each of ``n`` contexts follows."""
    if prefix is None:
        if prefix_rows is not None:
            raise ValueError("prefix_rows given without a prefix")
        return [0] * n
    size = _prefix_batch_size(prefix)
    if prefix_rows is None:
        if size == 1:
            return [0] * n
        if size == n:
            return list(range(n))
        raise ValueError(
            f"prefix has {size} rows for {n} prompts; expected 1 (shared) or {n} (one per "
            "prompt), or pass prefix_rows"
        )
    rows = [int(r) for r in prefix_rows]
    if len(rows) != n or any(not 0 <= r < size for r in rows):
        raise ValueError(
            f"prefix_rows must be {n} row indices in [0, {size}); got {len(rows)} rows "
            f"spanning {min(rows, default=None)}..{max(rows, default=None)}"
        )
    return rows


def _is_prefix_like(prefix: Any) -> bool:
    return all(hasattr(prefix, a) for a in ("mask", "next_position", "select", "to_dynamic"))


def _prefix_batch_size(prefix: Any) -> int:
    if _is_prefix_like(prefix):
        return int(prefix.mask.shape[0])
    size = getattr(prefix, "batch_size", None)  # a transformers Cache
    if not (isinstance(size, int) and size > 0):
        size = int(prefix.layers[0].keys.shape[0])
    if size != 1:
        raise ValueError(
            f"a plain transformers Cache as prefix must have batch size 1, got {size}; "
            "use a PrefixLike (icl_ssm.cache.PrefixCache) for one prefix per prompt"
        )
    return size


def _prefix_inputs(
    prefix: Any, rows: Sequence[int], position_offset: int | None, device: torch.device
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(fresh cache or None, prefix attention mask (B, L) long, next position (B,) long,
    additive attention bias of the prefix slots (B, L) or None).

    With a plain transformers Cache this is the module's only contact with the Cache API:
    ``copy.deepcopy``, ``get_seq_length`` and ``batch_repeat_interleave``.
    """
    n = len(rows)
    if prefix is None:
        start = torch.full((n,), position_offset or 0, dtype=torch.long, device=device)
        return None, torch.zeros(n, 0, dtype=torch.long, device=device), start, None
    if _is_prefix_like(prefix):
        if position_offset is not None:
            raise ValueError(
                "position_offset applies to a plain transformers Cache; this prefix sets the "
                "positions itself (next_position)"
            )
        sub = prefix.select(torch.tensor(list(rows), dtype=torch.long))
        bias = getattr(sub, "bias", None)
        return (sub.to_dynamic(), sub.mask.long().to(device), sub.next_position.long().to(device),
                None if bias is None else bias.to(device))
    cache = copy.deepcopy(prefix)  # forward passes append to a cache in place
    length = int(cache.get_seq_length())
    if n > 1:
        cache.batch_repeat_interleave(n)
    start = length if position_offset is None else position_offset
    mask = torch.ones(n, length, dtype=torch.long, device=device)
    return cache, mask, torch.full((n,), start, dtype=torch.long, device=device), None



def prefix_attention_mask(
    prefix_mask: torch.Tensor,
    seen_mask: torch.Tensor,
    bias: torch.Tensor | None = None,
    num_new: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The ``attention_mask`` for a forward after a prefix.

    ``prefix_mask: (B, L)`` real prefix slots; ``seen_mask: (B, S)`` the tokens after the
    prefix so far, the last ``num_new`` (default: all) being this forward's inputs. Without
    ``bias`` this is the usual 2D mask ``(B, L + S)``. ``bias: (B, L)`` adds a float to the
    attention logits of every prefix slot (a gated compressed cache): the mask becomes the 4D
    additive float mask ``(B, 1, num_new, L + S)`` that transformers passes to attention as-is,
    causal over the tokens after the prefix.
    """
    if bias is None:
        return torch.cat([prefix_mask.long(), seen_mask.long()], dim=1)
    B, S = seen_mask.shape
    q = S if num_new is None else num_new
    low = torch.finfo(dtype).min
    prefix = torch.where(prefix_mask.bool(), bias.to(dtype), torch.full_like(bias, low, dtype=dtype))  # (B, L)
    rows = torch.arange(S - q, S, device=seen_mask.device)[:, None]  # (q, 1): absolute index of each new token
    allowed = (torch.arange(S, device=seen_mask.device)[None] <= rows)[None] & seen_mask.bool()[:, None]  # (B, q, S)
    after = torch.zeros(B, q, S, dtype=dtype, device=seen_mask.device).masked_fill(~allowed, low)
    return torch.cat([prefix[:, None].expand(B, q, -1), after], dim=2)[:, None]  # (B, 1, q, L + S)


def _check_positions(model: PreTrainedModel, needed: int) -> None:
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and needed > limit:
        raise ValueError(
            f"scoring needs {needed} positions but the model's context "
            f"(config.max_position_embeddings) is {limit}; use a shorter prompt"
        )


def _pad_id(model: PreTrainedModel) -> int:
    # pads are masked out, any valid id works; prefer the model's own pad token
    pad = getattr(model.config.get_text_config(), "pad_token_id", None)
    return pad if isinstance(pad, int) and pad >= 0 else 0


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)


_LOGITS_TO_KEEP: dict[type, bool] = {}


def _accepts_logits_to_keep(model: PreTrainedModel) -> bool:
    cls = type(model)
    if cls not in _LOGITS_TO_KEEP:
        _LOGITS_TO_KEEP[cls] = "logits_to_keep" in inspect.signature(model.forward).parameters
    return _LOGITS_TO_KEEP[cls]


_CACHE_ARGUMENT: dict[type, str] = {}


def with_cache(model: PreTrainedModel, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model(...)`` and ``model.generate(...)``: transformers 5.24 renamed
    the forward's ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40), so the
    name is read from the model's signature once per class."""
    cls = type(model)
    if cls not in _CACHE_ARGUMENT:
        params = inspect.signature(model.forward).parameters
        _CACHE_ARGUMENT[cls] = "cache" if "cache" in params else "past_key_values"
    return {_CACHE_ARGUMENT[cls]: cache}


def output_cache(out: Any) -> Any:
    """The cache a forward returned, under the name of the installed transformers."""
    return out["cache"] if "cache" in out else out["past_key_values"]


__all__ = [
    "with_cache",
    "output_cache",
    "pad_ids",
    "PADDING_SIDES",
    "SEPARATOR",
    "PrefixLike",
    "Prompt",
    "PromptBuilder",
    "answer_loss",
    "as_ids",
    "continuation_logprobs",
    "continuation_logprobs_ref",
    "generate_answers",
    "greedy_generate",
    "predict_labels",
    "score_labels",
]

"""Prompts of in-context demonstrations, with exact token spans (their answers: :mod:`.answer_format`).

A prompt is a *header* (BOS + instruction), one *piece* per demonstration and a *query*
piece. Every piece is tokenised on its own and the ids are concatenated, so

* the token span of every demonstration is exact by construction;
* a demonstration tokenises the same wherever it sits (its KV cache or SSM state can be
  reused), and ``build_prefix(demos).input_ids + build_suffix(query).input_ids ==
  build(demos, query).input_ids`` always holds;
* pieces are cut where the tokenizer's pre-tokenizer splits anyway, so the concatenation also
  equals tokenising the whole text at once (:meth:`PromptBuilder.check` verifies it).

Plain-text layout (``chat=False``)::

    {instruction}\n\n
    {input_prefix}{input}\n{output_prefix} {verbalizer}\n\n      <- one per demonstration
    {input_prefix}{input}\n{output_prefix}                        <- the query

The answer after ``{output_prefix}`` carries one leading space in plain mode and none in chat
mode (the leading-space rule of :mod:`icl_ssm.lm.answer_format`).

**Where the ``\n\n`` separator is cut.** Llama-3/Qwen2 tokenizers merge punctuation with
following newlines (``".\n\n"`` is one token), so the separator must end the previous piece
(``"trailing"``); GPT-2/SmolLM2 tokenizers split ``"\n\nReview"`` as ``"\n", "\n",
"Review"`` but ``"\n\n"`` alone as one token, so the separator must start the next piece
(``"leading"``). :class:`PromptBuilder` probes the tokenizer and picks the position that
keeps piecewise == whole (``separator_position`` overrides it). With ``"leading"`` an empty
instruction leaves the separator at the start of the first demonstration.

Chat layout (``chat=True``): the instruction is the system turn; each demonstration is a
user turn (``input_prefix + input``) and an assistant turn (the verbaliser); the query is the
last user turn with the generation prompt. ``output_prefix`` is not used. Turn texts are cut
out of ``tokenizer.apply_chat_template`` renderings (:class:`~icl_ssm.lm.chat.ChatTurns`; a
template that renders a turn differently depending on what precedes it is refused at
construction).

BOS: in plain mode the ids the tokenizer itself prepends (``tokenizer("x")`` minus
``tokenizer("x", add_special_tokens=False)``) start the header, unless ``add_bos`` says
otherwise; in chat mode the template's text decides (pieces are tokenised with
``add_special_tokens=False``, so BOS is never doubled).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from icl_ssm.lm.answer_format import AnswerFormat, ExampleLike, TaskLike
from icl_ssm.lm.chat import ChatTurns

SEPARATOR = "\n\n"


SEPARATOR_POSITIONS = ("trailing", "leading")


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
class PromptBuilder(ChatTurns, AnswerFormat):
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

    # ------------------------------------------------------------------ checks

    def validate(self, demos: Sequence[ExampleLike], query: ExampleLike | None = None) -> None:
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

    # ------------------------------------------------------------------ pieces

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

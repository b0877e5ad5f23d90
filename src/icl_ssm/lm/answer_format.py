"""Answers: what the prompts read from an example and a task (:class:`ExampleLike`,
:class:`TaskLike`), and the continuation the model should emit after a query, as text and as
token ids (:class:`AnswerFormat`, the answer half of :class:`~icl_ssm.lm.prompts.PromptBuilder`).

**Leading-space rule.** Trailing whitespace is stripped from ``output_prefix`` and the answer
(verbaliser or generative target) carries one leading space: ``"Sentiment:" + " positive"``.
Byte-level BPE tokenizers (GPT-2, Llama-3, Qwen2, SmolLM2) fold a leading space into the
word's token, so ``" positive"`` is what the model emits after ``"Sentiment:"``; the scored
continuation is exactly the token sequence the demonstrations show. In chat mode the answer
is the assistant turn's content, with no leading space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from transformers import PreTrainedTokenizerBase


class ExampleLike(Protocol):
    """What :class:`~icl_ssm.lm.prompts.PromptBuilder` reads from an example
    (``icl_ssm.data.tasks.Example``)."""

    id: str
    input: str
    target: str


class TaskLike(Protocol):
    """What the prompts and their answers read from a task (``icl_ssm.data.tasks.Task``)."""

    name: str
    kind: str  # "classification" | "generative"
    labels: tuple[str, ...]
    verbalizers: dict[str, str]
    instruction: str
    input_prefix: str
    output_prefix: str

    def extract_answer(self, text: str) -> str: ...


class AnswerFormat:
    """The answer half of :class:`~icl_ssm.lm.prompts.PromptBuilder`: the answers of its
    ``task`` in its layout (``chat``), tokenised with its ``tokenizer``."""

    tokenizer: PreTrainedTokenizerBase
    task: TaskLike
    chat: bool

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

    def _encode(self, text: str) -> list[int]:
        """The ids of ``text`` without special tokens; ``[]`` for an empty text."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

"""Tasks: the data sets demonstrations are selected from, and how each one is scored.

A task is a small dataclass whose fields are its options; it overrides one method,
:meth:`Task.load`, and registers one name in :data:`TASKS`. :func:`get_task` builds one by
name (or from a path to the user's own ``.jsonl``/``.csv``/``.tsv`` file), and :func:`split`
carves a candidate pool, a validation set and a test set out of its examples.

Where the data comes from:

* registry assets (offline-capable, see :mod:`icl_ssm.data.assets`): ``rotten_tomatoes``
  (stand-in for SST-2), ``cr`` (customer reviews), ``mmlu``;
* the Hugging Face hub through the optional ``datasets`` package (``pip install
  'icl-ssm[hub]'``), or a local copy passed as ``path=``: ``sst2``, ``poem_sentiment``,
  ``gsm8k`` (and ``mmlu`` with ``source="hub"``);
* generated from a seed, any size: ``coin_flip``, ``modular_addition``, ``edge_existence``;
* the user's file: ``jsonl`` / ``csv``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("classification", "generative")


class HubUnavailableError(RuntimeError):
    """A hub data set was asked for but cannot be loaded (no `datasets`, or no network)."""


@dataclass(frozen=True)
class Example:
    id: str  # unique within a task
    input: str  # the text shown to the model (question/review/...)
    target: str  # the gold label name (classification) or gold answer text (generative)


class Task:
    """Base class of every task. Subclasses are dataclasses whose fields are the options.

    Override :meth:`load` (the whole data, deterministic); classification tasks get
    label matching and 0/1 accuracy from here, generative tasks override
    :meth:`extract_answer` / :meth:`score` where exact match is not the metric.
    """

    name: str = ""
    kind: str = "classification"  # "classification" or "generative"
    labels: tuple[str, ...] = ()  # classification: label names in a fixed order
    verbalizers: dict[str, str] = {}  # label -> word the model emits; {} for generative
    instruction: str = ""  # one line, the prompt's header
    input_prefix: str = "Input: "
    output_prefix: str = "Output: "
    source: str = ""  # human-readable origin

    # --- the one method to override -------------------------------------------------
    def load(self) -> list[Example]:
        raise NotImplementedError  # abstract: every registered task overrides it

    # --- shared behaviour -----------------------------------------------------------
    @functools.cached_property
    def _examples(self) -> tuple[Example, ...]:
        return tuple(self.load())

    def examples(self) -> list[Example]:
        """The whole available data, in a deterministic order (loaded once per instance)."""
        return list(self._examples)

    def offline(self) -> bool:
        """Whether the task can be built here without a hub (registry assets count)."""
        return True

    def size_hint(self) -> int | None:
        """Number of examples if known without downloading anything, else None."""
        return None

    def notes(self) -> list[str]:
        """What the user should know about how the data was read (e.g. rows skipped), one
        line each; empty by default."""
        return []

    def group(self, example: Example) -> str:
        """Stratum for :func:`split` (MMLU: the subject); one stratum by default."""
        return ""

    def verbalize(self, target: str) -> str:
        """What the model should emit for a gold target."""
        return self.verbalizers.get(target, target) if self.kind == "classification" else target

    @functools.cached_property
    def _label_lookup(self) -> dict[str, str]:
        lookup = {label.lower(): label for label in self.labels}
        lookup.update({word.strip().lower(): label for label, word in self.verbalizers.items()})
        return lookup

    def extract_answer(self, text: str) -> str:
        """Classification: the label whose verbaliser (or name) starts the text, else "".

        Generative: the first non-empty line. Idempotent: an extracted answer maps to itself.
        """
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        first = lines[0] if lines else ""
        if self.kind != "classification":
            return first
        head = first.lower().lstrip(string.punctuation + " ")
        best = ""
        for word in self._label_lookup:
            rest = head[len(word) :]
            if head.startswith(word) and (not rest or not (rest[0].isalnum() or rest[0] == "_")):
                if len(word) > len(best):
                    best = word
        return self._label_lookup[best] if best else ""

    def score(self, prediction: str, example: Example) -> float:
        """Per-example metric: accuracy (0/1) on the extracted answer."""
        answer = self.extract_answer(prediction)
        if self.kind == "classification":
            return float(answer == example.target)
        return float(normalize_text(answer) == normalize_text(example.target))


TASKS: dict[str, type[Task]] = {}


def register(name: str) -> Callable[[type[Task]], type[Task]]:
    def wrap(cls: type[Task]) -> type[Task]:
        cls.name = name
        TASKS[name] = cls
        return cls

    return wrap


def get_task(name: str, **options: Any) -> Task:
    """Build a registered task by name, or a user-file task from a ``.jsonl``/``.csv`` path."""
    name = str(name)
    if name.lower().endswith(USER_FILE_SUFFIXES):
        return _build(TASKS["jsonl"], name, path=name, **options)
    if name not in TASKS:
        if name.lower().endswith(".json"):
            raise ValueError(f"{name}: a .json file is not read as a task; save it as JSON Lines, one object a line "
                             f"(a file ending .jsonl), or as a .csv/.tsv file with a header")
        raise ValueError(
            f"unknown task {name!r}; accepted: {', '.join(TASKS)}, or a path ending {'/'.join(USER_FILE_SUFFIXES)}"
        )
    return _build(TASKS[name], name, **options)


def _build(cls: type[Task], name: str, **options: Any) -> Task:
    accepted = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"task {name!r}: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(accepted) or 'none'}"
        )
    return cls(**options)


_WS = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Lowercase, collapse whitespace, strip punctuation and spaces at both ends."""
    return _WS.sub(" ", text.lower()).strip(string.punctuation + " ")


def positive_int(value: Any, what: str, minimum: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum or str(number) != str(value).strip():
        raise ValueError(f"{what}={value!r}: expected an integer >= {minimum}")
    return number


def validate_flag(value: Any, what: str) -> bool:
    """A bool option that may arrive as a string from the command line."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ValueError(f"{what}={value!r}: expected true or false")


USER_FILE_SUFFIXES = (".jsonl", ".csv", ".tsv")





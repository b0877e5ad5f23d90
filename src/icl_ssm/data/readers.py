"""A user's own data: JSONL, CSV and TSV files read with errors that name the file and line,
registered as the ``jsonl`` (and ``csv``) task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from icl_ssm.data.files import read_records, record_field
from icl_ssm.data.tasks import KINDS, TASKS, Example, Task, normalize_text, register, validate_flag

SHOWN_LINES = 10  # line numbers listed in a note before "... and N more"


@register("jsonl")
@dataclass
class UserFileTask(Task):
    """The user's ``.jsonl`` / ``.csv`` / ``.tsv`` file, one example per line (or row).

    Classification (default): ``labels`` are the sorted distinct values of ``label_field``
    unless given (then any other value is an error). ``kind="generative"``: the field holds
    the gold answer text (``target_field=`` is an alias of ``label_field=``), scored by
    exact match after :func:`normalize_text`. ``id_field`` names a unique id column; by
    default the id is ``line-<n>``.

    A row whose text or label is empty (``""``, blank, ``null``) is an error naming its line;
    ``skip_empty=True`` skips such rows instead, and :meth:`notes` lists their lines.
    """

    path: str | None = None
    input_field: str = "text"
    label_field: str = "label"
    target_field: str | None = None
    kind: str = "classification"
    labels: tuple[str, ...] | str | None = None
    id_field: str | None = None
    skip_empty: bool | str = False
    instruction: str = ""
    input_prefix: str = "Input: "
    output_prefix: str = "Output: "

    def __post_init__(self) -> None:
        self._check_options()
        self.skipped: dict[str, list[int]] = {}  # what was empty -> line numbers of the rows skipped
        self.repeated: list[tuple[int, int, bool]] = []  # (line, line of the first row, same label?)
        if self.path is None:  # a placeholder (e.g. for `data list`): no data yet
            self.source = "user file (pass a path ending .jsonl, .csv or .tsv)"
            self.labels = tuple(self.labels or ())
            return
        self.name = str(self.path)
        self.source = f"user file {self.path}"
        if not self.instruction:
            self.instruction = "Classify the input." if self.kind == "classification" else "Answer the input."
        given = tuple(self.labels) if self.labels else None
        rows = self._read_rows(given)
        if self.kind == "classification":
            self.labels = given or tuple(sorted({ex.target for ex in rows}))
            self.verbalizers = {label: label for label in self.labels}
        else:
            self.labels = ()
            self.verbalizers = {}
        self.__dict__["_examples"] = tuple(rows)  # validated eagerly; served by examples()

    def _check_options(self) -> None:
        """Options as the command line may give them (``labels="neg,pos"``, ``skip_empty="true"``)
        made typed, and refused where they contradict ``kind``."""
        if self.kind not in KINDS:
            raise ValueError(f"user file task: kind={self.kind!r}; accepted: {', '.join(KINDS)}")
        if self.target_field is not None:
            self.label_field = self.target_field
        if isinstance(self.labels, str | int):  # "neg,pos" from the command line
            self.labels = tuple(s.strip() for s in str(self.labels).split(",") if s.strip())
        elif self.labels is not None:
            self.labels = tuple(str(label) for label in self.labels)
        if self.kind == "generative" and self.labels:
            raise ValueError("user file task: labels= only applies to kind='classification'")
        self.skip_empty = validate_flag(self.skip_empty, "skip_empty")

    def _read_rows(self, given: tuple[str, ...] | None) -> list[Example]:
        """The file's rows as examples, in file order; the rows skipped (``skip_empty``) go to
        :attr:`skipped` and those whose text repeats an earlier row's to :attr:`repeated`.
        ``given``: the labels given, which every classification row's label must be one of."""
        rows: list[Example] = []
        ids: dict[str, int] = {}
        first: dict[str, tuple[int, str]] = {}  # normalised text -> (line, label) of its first row
        target_name = "label" if self.kind == "classification" else "answer"
        for number, record in read_records(self.path):
            where = f"{self.path} line {number}"
            empty = [(key, what) for key, what in ((self.input_field, "text"), (self.label_field, target_name))
                     if _is_empty(record, key)]
            if empty and self.skip_empty:
                self.skipped.setdefault(empty[0][1], []).append(number)
                continue
            if empty:
                key = empty[0][0]
                raise ValueError(
                    f"{where}: field {key!r} is {record[key]!r}; expected a non-empty string or number; "
                    f"pass skip_empty=true / --skip-empty to skip rows with an empty text or {target_name}"
                )
            text = record_field(record, self.input_field, where, "input_field")
            target = record_field(record, self.label_field, where, "label_field")
            if self.kind == "classification" and given is not None and target not in given:
                raise ValueError(f"{where}: label {target!r} is not one of the labels given ({', '.join(given)})")
            ex_id = record_field(record, self.id_field, where, "id_field") if self.id_field else f"line-{number}"
            if ex_id in ids:
                raise ValueError(f"{where}: id {ex_id!r} already used on line {ids[ex_id]}")
            ids[ex_id] = number
            seen = first.setdefault(normalize_text(text), (number, target))
            if seen[0] != number:
                self.repeated.append((number, seen[0], seen[1] == target))
            rows.append(Example(ex_id, text, target))
        if not rows:
            skipped = sum(map(len, self.skipped.values()))
            raise ValueError(
                f"{self.path}: all {skipped} rows have an empty text or {target_name} (fields "
                f"{self.input_field!r} and {self.label_field!r}); pass input_field= / label_field= to read other fields"
            )
        return rows

    def size_hint(self) -> int | None:
        return len(self.examples()) if self.path is not None else None

    def notes(self) -> list[str]:
        """The rows skipped (``skip_empty``) and the rows whose text repeats an earlier row's
        (the splits keep the first), by line number."""
        notes = []
        if self.skipped:
            parts = [f"{len(lines)} {_rows(len(lines))} with an empty {what} ({_lines(lines)})"
                     for what, lines in self.skipped.items()]
            notes.append(f"{self.path}: skipped {' and '.join(parts)}")
        if self.repeated:
            differ = [line for line, _, same in self.repeated if not same]
            label = (f"; {len(differ)} of them with another {'label' if self.kind == 'classification' else 'answer'} "
                     f"than the first ({_lines(differ)})") if differ else ""
            n = len(self.repeated)
            notes.append(f"{self.path}: {n} {_rows(n)} {'repeats' if n == 1 else 'repeat'} the text of an earlier row "
                         f"({_lines([line for line, _, _ in self.repeated])}); the splits keep only the first{label}")
        return notes

    def load(self) -> list[Example]:
        raise ValueError(
            "user file task: no file given; pass a path, e.g. get_task('data.jsonl', "
            "input_field='text', label_field='label')"
        )


TASKS["csv"] = UserFileTask


def _is_empty(record: dict[str, Any], key: str) -> bool:
    """Whether ``record`` has ``key`` with nothing in it (null, or only whitespace); a missing
    key is not empty but a wrong field name, which :func:`record_field` reports."""
    value = record.get(key)
    return key in record and (value is None or (isinstance(value, str) and not value.strip()))


def _rows(n: int) -> str:
    return "row" if n == 1 else "rows"


def _lines(lines: list[int]) -> str:
    """``line 4`` / ``lines 4, 9, 17`` / ``lines 4, 9, ... and 12 more``."""
    shown = ", ".join(map(str, lines[:SHOWN_LINES]))
    more = f" ... and {len(lines) - SHOWN_LINES} more" if len(lines) > SHOWN_LINES else ""
    return f"line{'s' if len(lines) > 1 else ''} {shown}{more}"

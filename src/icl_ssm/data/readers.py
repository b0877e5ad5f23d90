"""A user's own data: JSONL, CSV and TSV files read with errors that name the file and line,
registered as the ``jsonl`` (and ``csv``) task."""

from __future__ import annotations

from dataclasses import dataclass

from icl_ssm.data.files import read_records, record_field
from icl_ssm.data.tasks import KINDS, TASKS, Example, Task, register


@register("jsonl")
@dataclass
class UserFileTask(Task):
    """The user's ``.jsonl`` / ``.csv`` / ``.tsv`` file, one example per line (or row).

    Classification (default): ``labels`` are the sorted distinct values of ``label_field``
    unless given (then any other value is an error). ``kind="generative"``: the field holds
    the gold answer text (``target_field=`` is an alias of ``label_field=``), scored by
    exact match after :func:`normalize_text`. ``id_field`` names a unique id column; by
    default the id is ``line-<n>``.
    """

    path: str | None = None
    input_field: str = "text"
    label_field: str = "label"
    target_field: str | None = None
    kind: str = "classification"
    labels: tuple[str, ...] | str | None = None
    id_field: str | None = None
    instruction: str = ""
    input_prefix: str = "Input: "
    output_prefix: str = "Output: "

    def __post_init__(self) -> None:
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
        if self.path is None:  # a placeholder (e.g. for `data list`): no data yet
            self.source = "user file (pass a path ending .jsonl, .csv or .tsv)"
            self.labels = tuple(self.labels or ())
            return
        self.name = str(self.path)
        self.source = f"user file {self.path}"
        if not self.instruction:
            self.instruction = "Classify the input." if self.kind == "classification" else "Answer the input."
        given = tuple(self.labels) if self.labels else None
        rows = []
        ids: dict[str, int] = {}
        for number, record in read_records(self.path):
            where = f"{self.path} line {number}"
            text = record_field(record, self.input_field, where, "input_field")
            target = record_field(record, self.label_field, where, "label_field")
            if self.kind == "classification" and given is not None and target not in given:
                raise ValueError(f"{where}: label {target!r} is not one of the labels given ({', '.join(given)})")
            ex_id = record_field(record, self.id_field, where, "id_field") if self.id_field else f"line-{number}"
            if ex_id in ids:
                raise ValueError(f"{where}: id {ex_id!r} already used on line {ids[ex_id]}")
            ids[ex_id] = number
            rows.append(Example(ex_id, text, target))
        if self.kind == "classification":
            self.labels = given or tuple(sorted({ex.target for ex in rows}))
            self.verbalizers = {label: label for label in self.labels}
        else:
            self.labels = ()
            self.verbalizers = {}
        self.__dict__["_examples"] = tuple(rows)  # validated eagerly; served by examples()

    def size_hint(self) -> int | None:
        return len(self.examples()) if self.path is not None else None

    def load(self) -> list[Example]:
        raise ValueError(
            "user file task: no file given; pass a path, e.g. get_task('data.jsonl', "
            "input_field='text', label_field='label')"
        )


TASKS["csv"] = UserFileTask

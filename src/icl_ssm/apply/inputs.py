"""The inputs a user answers: a ``.jsonl``, ``.csv`` or ``.tsv`` file read like a task file
(:func:`~icl_ssm.data.files.read_records`, errors naming the file and the line), each row an
input with or without its label."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from icl_ssm.data.files import label_from, read_records, record_field
from icl_ssm.data.tasks import Example, Task


@dataclass(frozen=True)
class InputFields:
    """Which fields of a row hold the input's text, its label (optional in every row, or in
    none) and its id (default: ``line-<n>``); ``skip_empty``: skip rows whose text or label is
    empty instead of refusing the file."""

    input_field: str = "text"
    label_field: str = "label"
    id_field: str | None = None
    skip_empty: bool = False

    @staticmethod
    def for_task(options: dict, **given) -> InputFields:
        """The fields a user-file task was read with (``options``, its ``-o`` settings), with
        ``given`` (the ones not None) in their place."""
        label = options.get("target_field") or options.get("label_field") or "label"
        fields = {"input_field": options.get("input_field", "text"), "label_field": label,
                  "id_field": options.get("id_field")}
        fields.update({key: value for key, value in given.items() if value is not None})
        return InputFields(**fields)


def read_inputs(path: str | Path, task: Task, fields: InputFields = InputFields()) -> tuple[list[Example], list[str]]:
    """The inputs of ``path`` as examples (``target`` the label name, or the answer of a
    generative task; ``""`` when the file has no labels), and notes on the rows skipped.

    A row without the input field, with an empty text, or with a label that is not one of the
    task's (its name or its index) is an error naming its line; so is a file where some rows
    have a label and others do not, and an id used twice. ``fields.skip_empty`` skips rows with
    an empty text or label instead, and the note lists their lines.
    """
    records = read_records(path)
    labelled = [number for number, record in records if fields.label_field in record]
    if labelled and len(labelled) != len(records):
        missing = next(number for number, record in records if fields.label_field not in record)
        raise ValueError(f"{path} line {missing}: no field {fields.label_field!r} while line {labelled[0]} has one; "
                         f"give every input a label or none (label_field= names the field)")
    inputs, skipped, ids = [], [], {}
    for number, record in records:
        where = f"{path} line {number}"
        keys = [fields.input_field, *([fields.label_field] if labelled else [])]
        empty = [key for key in keys if key in record and (record[key] is None or not str(record[key]).strip())]
        if empty and fields.skip_empty:
            skipped.append(number)
            continue
        if empty:
            raise ValueError(f"{where}: field {empty[0]!r} is {record[empty[0]]!r}; expected a non-empty string or "
                             "number; pass --skip-empty to skip rows with an empty text or label")
        text = record_field(record, fields.input_field, where, "input_field")
        target = ""
        if labelled:
            value = record_field(record, fields.label_field, where, "label_field")
            target = label_from(value, task.labels, where) if task.kind == "classification" else value
        ex_id = record_field(record, fields.id_field, where, "id_field") if fields.id_field else f"line-{number}"
        if ex_id in ids:
            raise ValueError(f"{where}: id {ex_id!r} already used on line {ids[ex_id]}")
        ids[ex_id] = number
        inputs.append(Example(ex_id, text, target))
    if not inputs:
        raise ValueError(f"{path}: all {len(skipped)} rows have an empty text or label")
    notes = [f"{path}: skipped {len(skipped)} row{'s' if len(skipped) > 1 else ''} with an empty text or label "
             f"(line{'s' if len(skipped) > 1 else ''} {', '.join(map(str, skipped[:10]))}"
             f"{' ...' if len(skipped) > 10 else ''})"] if skipped else []
    return inputs, notes

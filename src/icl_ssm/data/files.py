"""Reading records from JSONL, CSV and TSV files, with errors that name the file and the line."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from icl_ssm.data.tasks import USER_FILE_SUFFIXES


def read_records(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) for each record of a ``.jsonl``, ``.csv`` or ``.tsv`` file.

    Errors name the file and the line: non-UTF-8 bytes, a line that is not a JSON object,
    a CSV row with the wrong number of fields, an empty file.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    text = _read_text(path, suffix)
    records = _jsonl_records(path, text) if suffix == ".jsonl" else _table_records(path, text, suffix)
    if not records:
        raise ValueError(f"{path}: no examples found (only blank lines or a header)")
    return records


def _read_text(path: Path, suffix: str) -> str:
    """The text of a user file with an accepted ``suffix``, without a byte-order mark; refused
    when it is not a file, not UTF-8 (naming the line and column) or blank."""
    if suffix not in USER_FILE_SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; accepted: {USER_FILE_SUFFIXES}")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory; expected a {suffix} file with one example per line")
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(
            f"{path} line {line}: not valid UTF-8 (byte 0x{data[err.start]:02x} at column "
            f"{column}); save the file as UTF-8"
        ) from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise ValueError(f"{path}: the file is empty; expected one example per line")
    return text


def _jsonl_records(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON Lines text."""
    records: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {number}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path} line {number}: expected a JSON object, got {type(record).__name__}")
        records.append((number, record))
    return records


def _table_records(path: Path, text: str, suffix: str) -> list[tuple[int, dict[str, Any]]]:
    """(first line number, {column: cell}) for each non-blank row of a CSV (``.csv``) or TSV
    (``.tsv``) text after its header; a row may span lines (a quoted newline)."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if suffix == ".tsv" else ",")
    header = next(reader, None)
    if not header:
        raise ValueError(f"{path}: the file is empty; expected a header line")
    _check_header(path, header, suffix)
    records: list[tuple[int, dict[str, Any]]] = []
    start = reader.line_num + 1
    for row in _rows(reader, path):
        if not any(cell.strip() for cell in row):
            start = reader.line_num + 1
            continue
        if len(row) != len(header):
            raise ValueError(
                f"{path} line {start}: {len(row)} fields, but the header has {len(header)} ({', '.join(header)})"
            )
        records.append((start, dict(zip(header, row, strict=True))))
        start = reader.line_num + 1
    return records


def _check_header(path: Path, header: list[str], suffix: str) -> None:
    """Refuse a header that names a column twice, or one column that looks like a row written
    with another separator than ``suffix`` is read with."""
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise ValueError(f"{path} line 1: column {', '.join(map(repr, twice))} appears more than once in the "
                         f"header ({', '.join(header)}); expected each column once")
    other = ";" if suffix == ".csv" else ","
    if len(header) == 1 and other in header[0]:
        raise ValueError(f"{path} line 1: the header {header[0]!r} is one column; the file looks "
                         f"{'semicolon' if other == ';' else 'comma'}-separated, but a {suffix} file is read "
                         f"{'comma' if suffix == '.csv' else 'tab'}-separated: save it with "
                         f"{'commas' if suffix == '.csv' else 'tabs'}"
                         + (" or name it .tsv after replacing ';' with tabs" if other == ";" else ""))


def _rows(reader: Any, path: Path) -> Iterable[list[str]]:
    """CSV rows; a malformed row is an error naming its line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise ValueError(f"{path} line {reader.line_num}: malformed CSV ({err})") from None
        yield row


def record_field(record: dict[str, Any], key: str, where: str, option: str) -> str:
    """``record[key]`` as a non-empty string; errors say where and how to choose the field."""
    if key not in record:
        present = ", ".join(map(str, record)) or "none"
        raise ValueError(
            f"{where}: missing field {key!r} (fields present: {present}); pass {option}= to use another field"
        )
    value = record[key]
    if isinstance(value, float) and value != value:
        raise ValueError(f"{where}: field {key!r} is NaN; expected a non-empty string or number")
    if isinstance(value, bool | int | float | str) and str(value).strip():
        return str(value).strip()
    raise ValueError(f"{where}: field {key!r} is {value!r}; expected a non-empty string or number")


def label_from(value: Any, labels: Sequence[str], where: str) -> str:
    """Map a stored label (its name, or its index as int or string) to a label name."""
    text = str(value).strip()
    if text in labels:
        return text
    if re.fullmatch(r"\d+", text) and int(text) < len(labels):
        return labels[int(text)]
    raise ValueError(f"{where}: label {value!r} is not one of {', '.join(labels)} (nor an index 0..{len(labels) - 1})")

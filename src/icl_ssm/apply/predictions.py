"""``predictions.jsonl``, written so that an interrupted run continues where it stopped.

While answering, finished lines are appended to ``predictions.jsonl.partial`` a batch at a time
(one write and a flush per batch, so the file holds whole batches); its first line records the
settings it was made with. A rerun with the same settings reads the lines there, drops a last line
cut short (a process killed mid-write), and answers only the inputs after them; a rerun with
other settings is refused, naming what differs. When every input is answered the lines are
written to ``predictions.jsonl`` in one atomic rename, with ``answer_settings.json`` beside it, and
the partial file is removed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from icl_ssm import atomic

PREDICTIONS = "predictions.jsonl"
PARTIAL = PREDICTIONS + ".partial"
SETTINGS = "answer_settings.json"
HEADER = "icl-ssm answer: partial predictions"


class PredictionsFile:
    """The predictions of one run in ``out``: :meth:`resume` (rows done before), :meth:`append`
    (a finished batch), :meth:`finish` (the final file)."""

    def __init__(self, out: str | Path, settings: dict[str, Any]):
        self.out = Path(out)
        self.settings = settings
        self._file: IO[str] | None = None

    @property
    def final(self) -> Path:
        return self.out / PREDICTIONS

    @property
    def partial(self) -> Path:
        return self.out / PARTIAL

    def resume(self) -> tuple[list[dict[str, Any]], bool]:
        """``(rows, finished)``: the rows answered before with these settings, in input order, and
        whether they are the finished ``predictions.jsonl``. Refuses files made with other settings."""
        settings_file = self.out / SETTINGS
        if self.final.is_file() and not self.partial.is_file():
            saved = json.loads(settings_file.read_text()) if settings_file.is_file() else None
            self._check(saved, self.final)
            return _rows(self.final.read_text().splitlines(keepends=True), self.final, first=1)[0], True
        if not self.partial.is_file():
            return [], False
        lines = self.partial.read_text().splitlines(keepends=True)
        header = _json(lines[0]) if lines and lines[0].endswith("\n") else None
        if not isinstance(header, dict) or header.get("header") != HEADER:
            raise ValueError(f"{self.partial} does not start with the settings line icl-ssm answer writes; remove it "
                             "or choose another --out")
        self._check(header.get("settings"), self.partial)
        rows, kept = _rows(lines[1:], self.partial, first=2)
        if kept < len(lines) - 1:  # a line cut short: keep the file's whole lines only
            with open(self.partial, "r+") as f:
                f.truncate(sum(len(line.encode()) for line in lines[: kept + 1]))
        return rows, False

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        """Append finished rows in one write, flushed to disk (creating the file with its
        settings line first)."""
        try:
            if self._file is None:
                fresh = not self.partial.is_file()
                self._file = open(self.partial, "a")
                if fresh:
                    self._file.write(json.dumps({"header": HEADER, "settings": self.settings}) + "\n")
            self._file.write("".join(json.dumps(r) + "\n" for r in rows))
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as err:
            raise atomic.NotWritten(self.partial, err, "the whole lines written before are kept, and the same "
                                    "command continues from them") from err

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def finish(self, rows: Sequence[dict[str, Any]]) -> Path:
        """``predictions.jsonl`` (``rows``, in input order) and ``answer_settings.json``, each by an
        atomic rename; the partial file removed."""
        self.close()
        atomic.write_json(self.out / SETTINGS, self.settings)
        atomic.write_jsonl(self.final, list(rows))
        self.partial.unlink(missing_ok=True)
        return self.final

    def _check(self, saved: dict[str, Any] | None, path: Path) -> None:
        if isinstance(saved, dict) and saved.get("cache") == "exact":  # the dense cache's earlier name
            saved = {**saved, "cache": "dense"}
        if saved == self.settings:
            return
        if not isinstance(saved, dict):
            raise ValueError(f"{path} exists but its settings are not recorded ({SETTINGS} is missing); remove it "
                             "or choose another --out")
        differ = sorted(key for key in set(saved) | set(self.settings) if saved.get(key) != self.settings.get(key))
        said = "; ".join(f"{key}: {_short(saved.get(key))} then, {_short(self.settings.get(key))} now"
                         for key in differ)
        raise ValueError(f"{path} was made with other settings ({said}); rerun with the same selection, inputs and "
                         f"settings to continue it, or remove it or choose another --out to start again")


def _json(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def _rows(lines: list[str], path: Path, first: int) -> tuple[list[dict[str, Any]], int]:
    """The whole rows of ``lines`` and how many lines they take: a last line without its newline
    or not valid JSON was cut short and is left out; such a line anywhere else is an error (``first``:
    the file's line number of ``lines[0]``)."""
    rows = []
    for number, line in enumerate(lines):
        row = _json(line) if line.endswith("\n") else None
        if not isinstance(row, dict) or "id" not in row:
            if number == len(lines) - 1:
                break
            raise ValueError(f"{path} line {number + first}: not a prediction; remove the file or choose another --out")
        rows.append(row)
    return rows, len(rows)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

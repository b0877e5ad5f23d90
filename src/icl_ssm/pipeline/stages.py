"""A run's stages on disk (``OUT/stages/<name>.json``, keyed by the settings that made them, with
what made them), their progress bars and the run's messages."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from icl_ssm import atomic


def stage_key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Stages:
    """``OUT/stages/<name>.json``: a stage's result and the key of the settings behind it."""

    def __init__(self, out: Path):
        self.dir = out / "stages"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._since = time.monotonic()  # a stage's seconds: from the previous stage's end to its own

    def get(self, name: str, key: str) -> dict | None:
        path = self.dir / f"{name}.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if record.get("key") != key:
            return None
        self._since = time.monotonic()
        return record["result"]

    def put(self, name: str, key: str, result: dict) -> dict:
        """Store a stage's result with what made it (commit, dirty files, date, torch threads, machine)
        and its wall seconds: since the previous stage ended (the work between stages, a model
        loaded say, counts to the stage after it)."""
        seconds = time.monotonic() - self._since
        atomic.write_json(self.dir / f"{name}.json", {"key": key, "result": result, "made_by": made_by(),
                                                     "seconds": seconds})
        self._since = time.monotonic()
        return result

    def provenance(self) -> dict[str, dict]:
        """What made each stored stage and its wall seconds, read in one pass:
        ``{"stages_made_by": {name: made_by}, "stage_seconds": {name: seconds}}`` (a stage stored
        before either was kept is absent from that map)."""
        records = dict(self._records())
        return {"stages_made_by": {name: r["made_by"] for name, r in records.items() if r.get("made_by")},
                "stage_seconds": {name: r["seconds"] for name, r in records.items() if "seconds" in r}}

    def _records(self) -> Iterator[tuple[str, dict]]:
        for path in sorted(self.dir.glob("*.json")):
            try:
                yield path.stem, json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue


def made_by() -> dict:
    """What a stage was made by: :func:`~icl_ssm.provenance.environment` and the tracked files that
    differed from its commit."""
    from icl_ssm.provenance import provenance

    prov = provenance("icl-ssm run")
    return {key: prov[key] for key in ("commit", "modified_files", "date", "machine", "device_name")}


@contextmanager
def stage_bar(description: str, unit: str) -> Iterator[tuple[Callable[[int], None], Callable[[int], None]]]:
    """A progress bar for one stage: ``(on_start(total), advance(n))``; a line per update in logs."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    with Progress(TextColumn(f"[bold]{description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                  TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=console) as bar:
        job = bar.add_task(description, total=None)

        def advance(n: int) -> None:
            bar.advance(job, n)
            if not console.is_terminal:
                t = bar.tasks[0]
                console.print(f"{description}: {int(t.completed)}/{int(t.total or 0)} {unit}, {t.elapsed or 0:.0f} s")

        yield (lambda total: bar.update(job, total=total or None)), advance
        total = bar.tasks[0].total or 1  # a stage without steps (a baseline) shows as one finished step
        bar.update(job, total=total, completed=total)


def say(message: str) -> None:
    print(f"icl-ssm run: {message}", file=sys.stderr, flush=True)

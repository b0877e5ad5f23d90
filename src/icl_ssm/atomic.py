"""Files that are either complete or absent: write to a temporary file beside the target,
then rename it into place (``os.replace`` is atomic on one file system), so an interruption
or a full disk never leaves a truncated result that looks valid."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


class NotWritten(OSError):
    """A file that could not be written (a full disk, a read-only directory): its message names
    the file, the reason and what was kept."""

    def __init__(self, path: str | Path, err: OSError, kept: str):
        super().__init__(err.errno, f"cannot write {str(path)!r}: {err.strerror or err}; {kept}")

    def __str__(self) -> str:
        return str(self.strerror)


def is_temporary(path: str | Path) -> bool:
    """Whether ``path`` is named like the temporary files :func:`write_with` writes
    (``.NAME.XXXX.tmp``): what a killed writer leaves half-written."""
    name = Path(path).name
    return name.startswith(".") and name.endswith(".tmp")


def write_with(path: str | Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it to ``path``. An
    OSError while doing so (no space, no permission) becomes :class:`NotWritten`; whatever was
    at ``path`` before stays as it was."""
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        move_in(tmp, path)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and not isinstance(err, NotWritten):
            raise NotWritten(path, err, "the file there before is unchanged" if path.exists() else
                             "nothing was written in its place") from err
        raise
    return path


def move_in(tmp: str | Path, path: str | Path) -> None:
    """Rename the finished file ``tmp`` to ``path`` with the mode a plain ``open()`` would give
    (``mkstemp`` and safetensors create owner-only files)."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: str | Path, text: str) -> Path:
    return write_with(path, lambda f: f.write(text.encode()))


def write_json(path: str | Path, obj: Any, indent: int | None = 1) -> Path:
    return write_text(path, json.dumps(obj, indent=indent) + "\n")


def write_jsonl(path: str | Path, rows: list[dict]) -> Path:
    return write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def prepare_dir(path: str | Path, what: str = "--out") -> Path:
    """Create ``path`` (and parents); refuse a file or an unwritable directory by name."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{what} {str(path)!r} cannot be created: {err.strerror}") from err
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {str(path)!r} is not writable")
    return path


def write_result(out: str | Path, stem: str, result: Any, markdown: Callable[[Any], str],
                 plot: Callable[[Any, Path], None] | None = None) -> str:
    """``out/<stem>.json``, ``.md`` (``markdown(result)``) and, with ``plot``, ``.png``, each
    written atomically into the prepared ``out``; returns the markdown."""
    out = prepare_dir(out)
    write_json(out / f"{stem}.json", result)
    text = markdown(result)
    write_text(out / f"{stem}.md", text)
    if plot is not None:
        plot(result, out / f"{stem}.png")
    return text

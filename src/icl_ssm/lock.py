"""One writer per output directory: ``OUT/.icl-ssm.lock``, held with ``flock`` while a command
writes there.

A second process on the same directory is refused at once, naming the holder's pid, command and
start time. The kernel releases the lock when its process ends, however it ends: a killed process
leaves its line in the file and no lock. The next command takes the lock over, says whose it was,
and removes the temporary files the killed process left half-written (:func:`sweep`).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from icl_ssm import atomic

LOCK = ".icl-ssm.lock"


def _holder(text: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, int | float) else "?"
    return f"pid {holder.get('pid', '?')}, {holder.get('command') or 'icl-ssm'}, started {when}"


def sweep(out: Path) -> list[str]:
    """Remove the temporary files :mod:`icl_ssm.atomic` writes (``.NAME.XXXX.tmp``) that a killed
    process left under ``out``; only the lock's holder may, as no other icl-ssm process writes there.
    Returns their paths relative to ``out``."""
    stale = [p for p in out.rglob("*") if p.is_file() and atomic.is_temporary(p)]
    for p in stale:
        p.unlink(missing_ok=True)
    return sorted(str(p.relative_to(out)) for p in stale)


@contextmanager
def one_writer(out: str | Path, command: str, say: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold ``out``'s lock while the block runs; ``out`` must exist. Raises ValueError when another
    live process holds it; ``say`` hears when a dead process's lock is taken over."""
    out = Path(out)
    path = out / LOCK
    f = open(path, "a+")  # noqa: SIM115  # held open for the lock's lifetime
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = _holder(f.read())
        f.close()
        raise ValueError(f"{out} is being written by another icl-ssm process ({_describe(holder)}); wait for it to "
                         "finish, or choose another --out") from None
    try:
        f.seek(0)
        previous = _holder(f.read())
        tell = say or (lambda line: print(line, file=sys.stderr))
        if previous.get("pid") and previous.get("pid") != os.getpid():
            tell(f"{out}: took over the lock left by a process that is no longer running ({_describe(previous)})")
        stale = sweep(out)
        if stale:
            tell(f"{out}: removed {len(stale)} unfinished temporary file(s) a killed run left ({', '.join(stale[:3])}"
                 + (", ..." if len(stale) > 3 else "") + ")")
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "command": command, "started": time.time()}) + "\n")
        f.flush()
        yield out
    finally:
        f.seek(0)
        f.truncate()  # a clean exit leaves no holder behind
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()

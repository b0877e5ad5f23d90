"""One writer per output directory: ``OUT/.icl-ssm.lock``, held with ``flock`` while a command
writes there.

A second process on the same directory is refused at once, naming the holder's pid, command and
start time. The kernel releases the lock when its process ends, however it ends: a killed process
leaves its line in the file and no lock. The next command takes the lock over and says whose it
was.
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
        if previous.get("pid") and previous.get("pid") != os.getpid():
            (say or (lambda line: print(line, file=sys.stderr)))(
                f"{out}: took over the lock left by a process that is no longer running ({_describe(previous)})")
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

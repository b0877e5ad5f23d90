"""What a published record says it rests on: the command, the commit, the machine, the date and
the library versions (``tools/claims.py`` refuses a record without them)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from datetime import date
from pathlib import Path
from typing import Any


def environment() -> dict[str, Any]:
    """``commit`` (HEAD of the checkout this package runs from, None outside one), ``date``,
    ``machine`` (architecture, torch threads, cpu or cuda), ``torch`` and ``transformers``."""
    import torch
    import transformers

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or None
    return {"commit": commit, "date": date.today().isoformat(), "machine": f"{platform.machine()}, "
            f"{torch.get_num_threads()} torch threads, {'cuda' if torch.cuda.is_available() else 'cpu'}",
            "torch": torch.__version__, "transformers": transformers.__version__}


def device_name(device: str = "cpu") -> str:
    """The GPU's name, or the CPU's model name and core count."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def provenance(command: str, device: str = "cpu") -> dict[str, Any]:
    """A record's provenance block: ``command``, :func:`environment`, the device's name and the
    tracked files that differed from the commit when it ran (``modified_files``)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.split("\n")
    return {"command": command, **environment(), "device_name": device_name(device),
            "modified_files": [line[3:] for line in status if line.strip()]}


def threads_of(machine: str | None) -> int | None:
    """The torch thread count in an :func:`environment` ``machine`` string, None if absent."""
    found = re.search(r"(\d+) torch threads", machine or "")
    return int(found.group(1)) if found else None


def made_by_summary(parts: dict[str, dict | None]) -> dict[str, Any]:
    """What the parts of one result were made by (``parts``: a name, e.g. a stage, to its
    :func:`environment`-like dict, None where it was not recorded): ``commits`` and ``threads``
    (the distinct values, sorted), ``dirty`` (the parts run from a checkout with modified tracked
    files) and ``mixed``: a sentence when the parts differ in commit or thread count, else None."""
    recorded = {name: part for name, part in parts.items() if part}
    commits = sorted({str(p.get("commit"))[:7] for p in recorded.values() if p.get("commit")})
    threads = sorted({t for p in recorded.values() if (t := threads_of(p.get("machine"))) is not None})
    dirty = sorted(name for name, p in recorded.items() if p.get("modified_files"))
    problems = []
    if len(commits) > 1:
        problems.append(f"commits {', '.join(commits)}")
    if len(threads) > 1:
        by = {t: sorted(n for n, p in recorded.items() if threads_of(p.get("machine")) == t) for t in threads}
        problems.append("; ".join(f"{t} torch thread{'s' if t != 1 else ''} ({', '.join(names)})"
                                  for t, names in by.items()))
    return {"commits": commits, "threads": threads, "dirty": dirty,
            "mixed": "mixes " + " and ".join(problems) if problems else None}


def record_made_by(record: dict[str, Any]) -> dict[str, Any]:
    """:func:`made_by_summary` of a run's record: its stages (``stages_made_by``, what
    ``icl-ssm run`` reports) and its test scoring (``scored_on_test_by``); a record from before
    per-stage provenance, its process's ``environment`` alone."""
    parts = dict(record.get("stages_made_by") or {})
    if record.get("scored_on_test_by"):
        parts["test scoring"] = record["scored_on_test_by"]
    return made_by_summary(parts or {"process": record.get("environment")})

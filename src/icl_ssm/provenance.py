"""What a published record says it rests on: the command, the commit, the machine, the date and
the library versions (``tools/claims.py`` refuses a record without them)."""

from __future__ import annotations

import os
import platform
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

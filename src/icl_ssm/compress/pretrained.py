"""Compressors shipped inside the package (``icl_ssm/pretrained/``), found by model, task and the
shot count they were trained at."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedConfig

from icl_ssm.compress.compressor import SSMCompressor, load_compressor


def pretrained_root() -> Path:
    """``icl_ssm/pretrained``: one folder per shipped compressor, each with ``recipe.json``
    (model, tasks, k and the exact ``icl-ssm distill`` command that reproduces it),
    ``compressor/`` and, where trained, ``control/``."""
    from importlib import resources

    return Path(str(resources.files("icl_ssm") / "pretrained"))


def shipped_recipes() -> list[tuple[Path, dict]]:
    """``(folder, recipe)`` of every compressor shipped with the package, in folder order."""
    root = pretrained_root()
    paths = sorted(root.glob("*/recipe.json")) if root.is_dir() else []
    return [(path.parent, json.loads(path.read_text())) for path in paths]


def find_pretrained(model: str, task: str, k: int | None = None) -> Path | None:
    """The shipped folder for ``model`` and ``task``, or None. Where several are shipped for
    them (one per shot count), the one trained at the ``k`` nearest the one asked for (the
    smaller on a tie; without ``k``, the smallest)."""
    found = [(abs(int(meta.get("k", 0)) - k) if k is not None else 0, int(meta.get("k", 0)), folder)
             for folder, meta in shipped_recipes()
             if meta.get("model") == model and task in meta.get("tasks", [])]
    return min(found, key=lambda f: f[:2])[2] if found else None


def load_pretrained(model: str, task: str, teacher_config: PreTrainedConfig | None = None,
                    k: int | None = None) -> SSMCompressor:
    """The compressor shipped for ``model`` (an embedded name) and ``task``, trained at the
    shot count nearest ``k`` where several are shipped."""
    found = find_pretrained(model, task, k)
    if found is None:
        have = ", ".join(f"{m['model']}/{'+'.join(m['tasks'])}/k={m.get('k')}" for _, m in shipped_recipes()) or "none"
        raise ValueError(f"no compressor is shipped for model {model!r} and task {task!r} (shipped: {have}); "
                         "train one with `icl-ssm distill` and load it with load_compressor(DIR)")
    return load_compressor(found / "compressor", teacher_config)

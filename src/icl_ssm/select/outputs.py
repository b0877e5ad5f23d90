"""The files ``icl-ssm select --out DIR`` writes for one chosen prompt, each atomically:
``selected.jsonl`` (id, text, label and score of each demonstration, prompt order),
``prompt.txt``, ``summary.json``, ``select_config.json`` and ``selection.json`` (the
:class:`~icl_ssm.select.selected.SelectedPrompt` that ``icl-ssm answer`` loads)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from icl_ssm import atomic
from icl_ssm.calibrate import Calibration
from icl_ssm.data.tasks import Example, get_task
from icl_ssm.select.base import Selection
from icl_ssm.select.config import SelectConfig, selection_queries, uses_compressor
from icl_ssm.select.selected import SelectedPrompt, pool_spec
from icl_ssm.select.selection_parts import compressor_fidelity


def selected_rows(pool, indices: list[int], scores: list[float | None]) -> list[dict]:
    """The lines of ``selected.jsonl``: id, text, label and score of each chosen candidate."""
    return [{"id": pool[i].id, "text": pool[i].input, "label": pool[i].target, "score": scores[i]} for i in indices]


def write_selection(out: Path, selection: Selection, summary: dict, pool, builder_text: str, config: dict) -> None:
    """selected.jsonl, prompt.txt, summary.json, select_config.json and selection.json (the
    :class:`~icl_ssm.select.selected.SelectedPrompt` that ``icl-ssm answer`` loads), each written
    atomically."""
    scores = [float(x) if np.isfinite(x) else None for x in selection.scores]
    atomic.write_jsonl(out / "selected.jsonl", selected_rows(pool, selection.indices, scores))
    atomic.write_text(out / "prompt.txt", builder_text)
    atomic.write_json(out / "select_config.json", config)
    atomic.write_json(out / "summary.json", summary)
    chosen = selected_prompt(SelectConfig(**{k: v for k, v in config.items()
                                            if k in SelectConfig.__dataclass_fields__}), pool, selection.indices)
    saved = summary.get("saved_calibration")
    if saved and saved["method"] != "none":
        chosen.calibration = Calibration.from_dict(saved)
    chosen.save(out)


def selected_prompt(cfg: SelectConfig, pool: Sequence[Example], indices: Sequence[int]) -> SelectedPrompt:
    """The chosen ``indices`` of ``pool`` (prompt order) as a :class:`SelectedPrompt`, with the
    model, task, pool and compressor of ``cfg``."""
    task = get_task(cfg.task, **cfg.task_options)
    compressor = cfg.compressor if uses_compressor(cfg) else None
    made = pool_spec(pool, size=cfg.pool_size, seed=cfg.seed, k=cfg.k, min_validation=selection_queries(cfg))
    return SelectedPrompt.from_pool(pool, indices, model=cfg.model, task=task, method=cfg.method,
                                    task_options=cfg.task_options, chat=cfg.chat, pool_made=made,
                                    compressor=compressor, fidelity=compressor_fidelity(compressor))

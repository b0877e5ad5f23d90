"""The fields of a :class:`~icl_ssm.select.selected.SelectedPrompt` (its keyword arguments) from
the files ``icl-ssm select`` and ``icl-ssm run`` wrote before ``selection.json`` existed:
``select_config.json`` + ``summary.json`` (:func:`from_select_dir`), ``run_config.json`` +
``report.json`` (:func:`from_run_dir`), each with its ``selected.jsonl``, or a
``selected.jsonl`` alone (:func:`from_jsonl`).

Only the fields :mod:`~icl_ssm.select.selection_schema` lists are read; what those files never
held (the template of a task that cannot be built here, the pool positions of a pick other than
the one written) is left empty rather than guessed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from icl_ssm import schema
from icl_ssm.data.files import read_records
from icl_ssm.data.tasks import get_task
from icl_ssm.select.selection_parts import Demonstration, compressor_fidelity, task_template
from icl_ssm.select.selection_schema import (
    REPORT_SCHEMA,
    RUN_CONFIG_SCHEMA,
    SELECT_CONFIG_SCHEMA,
    SELECTION_FILE,
    SUMMARY_SCHEMA,
)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, row in read_records(path):
        missing = [key for key in ("id", "text", "label") if key not in row]
        if missing:
            raise ValueError(f"{path} line {number}: missing {', '.join(missing)}; a selected.jsonl line holds the "
                             "id, text and label of one demonstration")
        rows.append(row)
    return rows


def _demos(rows: list[dict[str, Any]], indices: Sequence[int] | None) -> list[Demonstration]:
    if indices is not None and len(indices) != len(rows):
        indices = None  # a summary of another pick than the one written (run's hand-over): positions unknown
    return [Demonstration(str(r["id"]), str(r["text"]), str(r["label"]), None if indices is None else int(indices[i]))
            for i, r in enumerate(rows)]


def _template_of(task: str, options: dict[str, Any]) -> dict[str, Any]:
    try:
        return task_template(get_task(task, **options))
    except (ValueError, OSError):
        return {}  # the task cannot be built here: the prompt is formatted from the task when answering


def from_select_dir(path: Path) -> dict[str, Any]:
    """The fields of the selection in a directory ``icl-ssm select`` wrote: ``select_config.json``,
    ``selected.jsonl`` and (for the pool positions) ``summary.json``."""
    cfg = schema.load(path / "select_config.json", SELECT_CONFIG_SCHEMA)
    if not (path / "selected.jsonl").is_file():
        if (path / "prompts.jsonl").is_file():
            raise ValueError(f"{path} holds a selection per test input (select --per-query), not one prompt; answer "
                             "with --per-query bm25 (or topk) on a selection of one prompt instead")
        raise ValueError(f"{path} has select_config.json but no selected.jsonl; the selection did not finish")
    summary = schema.load(path / "summary.json", SUMMARY_SCHEMA) if (path / "summary.json").is_file() else {}
    rows = _read_rows(path / "selected.jsonl")
    ids = summary.get("ids")
    indices = summary.get("indices") if ids == [str(r["id"]) for r in rows] else None
    options = dict(cfg.get("task_options") or {})
    method = cfg.get("method")
    queries = cfg.get("queries", 0)
    if method == "search":
        queries = max(cfg.get("confirm_queries", 0), cfg.get("screen_queries", 0) if cfg.get("screen") != "none"
                      else 0)
    pool = {"size": cfg["pool_size"], "seed": cfg.get("seed", 0), "k": cfg.get("k", len(rows)),
            "min_validation": queries} if "pool_size" in cfg else None
    compressor = cfg.get("compressor") if _reads_compressor(cfg) else None
    return dict(model=cfg.get("model", ""), task=cfg.get("task", ""), demonstrations=_demos(rows, indices),
                task_options=options, template=_template_of(cfg.get("task", ""), options),
                chat=bool(cfg.get("chat", False)), pool=pool, compressor=compressor,
                fidelity=compressor_fidelity(compressor), method=method, source=str(path))


def _reads_compressor(cfg: dict[str, Any]) -> bool:
    if cfg.get("method") == "search":
        return cfg.get("screen") == "compressed"
    return cfg.get("method") in ("affinity", "bridge") and cfg.get("evaluator") == "compressed"


def from_run_dir(path: Path) -> dict[str, Any]:
    """The fields of the prompt handed over in a directory ``icl-ssm run`` wrote: ``run_config.json``,
    ``report.json`` and ``selected.jsonl``."""
    cfg = schema.load(path / "run_config.json", RUN_CONFIG_SCHEMA)
    if not (path / "selected.jsonl").is_file() or not (path / "report.json").is_file():
        raise ValueError(f"{path} has run_config.json but no selected.jsonl and report.json; the run did not finish "
                         "(rerun icl-ssm run with the same --out to continue it)")
    report = schema.load(path / "report.json", REPORT_SCHEMA)
    rows = _read_rows(path / "selected.jsonl")
    handed = report.get("handed_over") or {}
    options = dict(cfg.get("task_options") or {})
    methods = cfg.get("methods") or ()
    search = max(cfg.get("confirm_queries", 0), cfg.get("screen_queries", 0)) if "search" in methods else 0
    pool = {"size": cfg["pool_size"], "seed": cfg.get("seed", 0), "k": cfg.get("k", len(rows)),
            "min_validation": max(cfg.get("queries", 0), search) + cfg.get("check_size", 0)}
    compressor = (report.get("compressor") or {}).get("compressor")
    return dict(model=cfg.get("model", ""), task=cfg.get("task", ""),
                demonstrations=_demos(rows, handed.get("indices")), task_options=options,
                template=_template_of(cfg.get("task", ""), options), chat=False, pool=pool, compressor=compressor,
                fidelity=compressor_fidelity(compressor, report.get("fidelity_verdict")), method=handed.get("name"),
                source=str(path))


def in_selection_dir(path: Path) -> bool:
    """Whether ``path``, a ``selected.jsonl``, sits in a directory that holds its selection's
    configuration (which is then read instead)."""
    return path.name == "selected.jsonl" and any((path.parent / name).is_file() for name in
                                                 (SELECTION_FILE, "select_config.json", "run_config.json"))


def from_jsonl(path: Path, model: str | None, task: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """The fields of the selection in a ``selected.jsonl`` outside a selection directory: the
    rows chosen for ``model`` and ``task`` (built with ``options``), which must then be named."""
    if not model or not task:
        raise ValueError(f"{path}: a selected.jsonl alone does not say which model and task it was chosen for; pass "
                         "the directory icl-ssm select or icl-ssm run wrote it into, or name them (--model, --task)")
    return dict(model=model, task=task, demonstrations=_demos(_read_rows(path), None), task_options=dict(options),
                template=_template_of(task, options), source=str(path))

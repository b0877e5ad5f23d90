"""``icl-ssm answer``: a selection's prompt applied to a file of inputs, resumably.

:func:`plan_answer` checks everything that can be checked before a model is loaded (the
selection, the model it was made for, the compressor and its fidelity verdict, every input row)
and :func:`run_answer` answers the inputs not answered before, a batch at a time, into
``predictions.jsonl`` (:mod:`icl_ssm.apply.predictions`), with zero-shot answers beside them where
the inputs have labels, and returns the summary written to ``answer_summary.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from icl_ssm import atomic
from icl_ssm.apply.answer import CACHES, MIN_BATCH_INPUTS, RETRIEVERS, answer_calibration, iter_answers
from icl_ssm.apply.inputs import InputFields, read_inputs
from icl_ssm.apply.predictions import PredictionsFile
from icl_ssm.calibrate import Calibration
from icl_ssm.compress.compressor import SSMCompressor
from icl_ssm.compress.pretrained import find_pretrained
from icl_ssm.data.tasks import Example, Task
from icl_ssm.evaluate.stats import paired_bootstrap
from icl_ssm.lock import one_writer
from icl_ssm.select.selected import SelectedPrompt
from icl_ssm.select.selection_parts import compressor_fidelity

SUMMARY = "answer_summary.json"
# --calibrate: the calibration saved with the selection, none, or one estimated now on the inputs
CALIBRATE = ("selection", "none", "batch", "contextual", "domain")


@dataclass
class AnswerConfig:
    """What ``icl-ssm answer`` was asked: the selection (a directory or ``selected.jsonl``),
    the inputs file, and how to answer them."""

    selection: str = ""
    inputs: str = ""
    model: str | None = None  # None: the selection's; another model is refused
    task: str | None = None  # only for a selected.jsonl with no configuration beside it
    cache: str = "dense"  # the shared prefix: CACHES
    compressor: str | None = None  # cache compressed: default the selection's, else the one shipped
    force: bool = False  # cache compressed with a compressor whose fidelity verdict did not pass
    per_query: str | None = None  # RETRIEVERS: k demonstrations retrieved from the pool for each input
    k: int | None = None  # per_query: demonstrations per input (default: the selection's k)
    batch: int = 16
    max_new_tokens: int = 32  # generative tasks: the longest answer
    zero_shot: bool = True  # labelled inputs: answer them with no demonstrations too
    calibrate: str = "selection"  # CALIBRATE: the label-score calibration applied to every answer
    input_field: str | None = None  # None: the selection's task file's, else "text"
    label_field: str | None = None
    id_field: str | None = None
    skip_empty: bool = False
    task_options: dict[str, Any] = field(default_factory=dict)  # only with task: get_task's options

    def __post_init__(self) -> None:
        if self.cache == "exact":  # the dense cache's earlier name
            self.cache = "dense"

    def validate(self) -> None:
        if self.cache not in CACHES:
            raise ValueError(f"--cache {self.cache!r}; accepted: {', '.join(CACHES)}")
        if self.per_query is not None and self.per_query not in RETRIEVERS:
            raise ValueError(f"--per-query {self.per_query!r}; accepted: {', '.join(RETRIEVERS)}")
        if self.per_query is not None and self.cache != "dense":
            raise ValueError(f"--per-query {self.per_query} gives every input a prompt of its own, encoded whole; "
                             f"there is no shared prefix to compress (--cache {self.cache})")
        if self.calibrate not in CALIBRATE:
            raise ValueError(f"--calibrate {self.calibrate!r}; accepted: {', '.join(CALIBRATE)}")
        if self.per_query is not None and self.calibrate not in ("selection", "none"):
            raise ValueError(f"--calibrate {self.calibrate} estimates a bias for one prompt; --per-query "
                             f"{self.per_query} gives every input its own prompt: use --calibrate none")
        if self.k is not None and self.per_query is None:
            raise ValueError(f"--k {self.k} sets the demonstrations retrieved per input; it needs --per-query "
                             "(the selection's prompt has its own k)")
        for name in ("batch", "max_new_tokens", "k"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} {value}: expected >= 1")


@dataclass
class AnswerPlan:
    """A checked :class:`AnswerConfig`: the selection, its task, the inputs, the model to load,
    the compressor to use (``cache="compressed"``) with a line on its fidelity, and the settings
    a partial predictions file must share to be continued."""

    cfg: AnswerConfig
    selected: SelectedPrompt
    task: Task
    inputs: list[Example]
    notes: list[str]
    model: str
    compressor: str | None
    fidelity: str | None
    settings: dict[str, Any]

    @property
    def labelled(self) -> bool:
        return all(q.target for q in self.inputs)


def plan_answer(cfg: AnswerConfig) -> AnswerPlan:
    """Check ``cfg`` before a model is loaded: the selection loads, the model is the one it was
    made for (refused with both names), the compressor has passed its fidelity verdict (else
    refused unless ``cfg.force``), every input row reads."""
    cfg.validate()
    selected = SelectedPrompt.load(cfg.selection, model=cfg.model, task=cfg.task, task_options=cfg.task_options)
    model = cfg.model or selected.model
    selected.check_model(model)
    task = selected.task_object()
    fields = InputFields.for_task(selected.task_options, input_field=cfg.input_field, label_field=cfg.label_field,
                                  id_field=cfg.id_field, skip_empty=cfg.skip_empty or None)
    inputs, notes = read_inputs(cfg.inputs, task, fields)
    compressor, fidelity = (None, None)
    if cfg.cache == "compressed":
        compressor, fidelity = _compressor(cfg, selected)
    if cfg.per_query is not None:
        selected.pool_examples(task)  # the pool rebuilds, before any model is loaded
    if cfg.calibrate != "none" and task.kind != "classification" and (cfg.calibrate != "selection"):
        raise ValueError(f"--calibrate {cfg.calibrate}: task {selected.task!r} is {task.kind!r}; a calibration shifts "
                         "label scores, which only a classification task has (use --calibrate none)")
    if cfg.calibrate == "batch" and len(inputs) < MIN_BATCH_INPUTS:
        raise ValueError(f"--calibrate batch estimates the bias on the inputs themselves and needs at least "
                         f"{MIN_BATCH_INPUTS} of them; {cfg.inputs} holds {len(inputs)}: use --calibrate selection "
                         "(the bias saved with the selection) or contextual")
    if cfg.calibrate == "selection" and selected.calibration is not None and not selected.calibration.is_none:
        c = selected.calibration
        notes.append(f"calibration: {c.method}, saved with the selection ({c.source}); --calibrate none answers raw")
        if cfg.per_query is not None:
            notes.append(f"calibration: not applied with --per-query {cfg.per_query} (it is the selected prompt's)")
    settings = {"selection": _hash(json.dumps(selected.to_dict(), sort_keys=True)), "inputs": _file_hash(cfg.inputs),
                "fields": asdict(fields), "model": selected.model, "cache": cfg.cache, "compressor": compressor,
                "per_query": cfg.per_query, "k": cfg.k if cfg.per_query else None,
                "max_new_tokens": cfg.max_new_tokens if task.kind == "generative" else None,
                "zero_shot": cfg.zero_shot, "calibrate": cfg.calibrate}
    return AnswerPlan(cfg, selected, task, inputs, notes, model, compressor, fidelity, settings)


def run_answer(plan: AnswerPlan, out: str | Path, model, tokenizer, compressor: SSMCompressor | None = None, *,
               progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Answer the inputs of ``plan`` not answered before into ``out/predictions.jsonl`` and write
    ``out/answer_summary.json``; returns the summary. ``compressor``: the loaded ``plan.compressor``
    (``cache="compressed"``). ``progress(n)`` after every batch, with the number it answered."""
    out = atomic.prepare_dir(out)
    with one_writer(out, "icl-ssm answer"):
        return _run_answer(plan, out, model, tokenizer, compressor, progress)


def _run_answer(plan: AnswerPlan, out: Path, model, tokenizer, compressor, progress) -> dict[str, Any]:
    cfg = plan.cfg
    predictions = PredictionsFile(out, plan.settings)
    done, finished = predictions.resume()
    ids = [q.id for q in plan.inputs]
    if [row["id"] for row in done] != ids[: len(done)]:
        raise ValueError(f"{predictions.partial if not finished else predictions.final} holds answers that are not the "
                         f"first inputs of {cfg.inputs}; remove it or choose another --out")
    rest = plan.inputs[len(done):]
    t0 = time.perf_counter()
    calibrations = resolve_calibrations(plan, model, tokenizer, compressor)
    try:
        if rest:
            rows = _answer_rows(plan, model, tokenizer, compressor, rest, calibrations)
            for batch_rows in rows:
                predictions.append(batch_rows)
                done += batch_rows
                if progress is not None:
                    progress(len(batch_rows))
    finally:
        predictions.close()
    seconds = time.perf_counter() - t0
    if not finished:
        predictions.finish(done)
    summary = summarize(plan, done, answered=len(rest), seconds=seconds, calibrations=calibrations)
    atomic.write_json(out / SUMMARY, summary)
    return summary


def resolve_calibrations(plan: AnswerPlan, model, tokenizer, compressor) -> dict[str, Calibration | None]:
    """The calibration of the prompt (``"prompt"``) and of the zero-shot answers beside it
    (``"zero_shot"``), None where the scores stay raw. ``--calibrate selection``: the one saved with
    the selection; ``batch``, ``contextual``, ``domain``: estimated now on the inputs
    (:func:`~icl_ssm.apply.answer.answer_calibration`), always on the file's first inputs, whichever
    were answered before, so a continued run applies the same bias. Zero-shot gets the prompt's method
    estimated for itself on the inputs (raw where that method cannot be: a fitted bias, or too
    few inputs for batch)."""
    cfg = plan.cfg
    if plan.task.kind != "classification" or cfg.calibrate == "none":
        return {"prompt": None, "zero_shot": None}
    kwargs = {"batch": cfg.batch, "task": plan.task}
    if cfg.calibrate == "selection":
        prompt = None if cfg.per_query is not None else plan.selected.calibration
    else:
        warnings: list[str] = []
        prompt = answer_calibration(model, tokenizer, plan.selected, cfg.calibrate, plan.inputs, warnings,
                                    cache=cfg.cache, compressor=compressor, **kwargs)
        for line in warnings:
            print(f"icl-ssm answer: warning: {line}", file=sys.stderr)
        plan.notes.extend(warnings)
    if prompt is None or prompt.is_none:
        return {"prompt": None, "zero_shot": None}
    zero = None
    if plan.labelled and cfg.zero_shot and prompt.method in ("batch", "contextual", "domain") and \
            (prompt.method != "batch" or len(plan.inputs) >= MIN_BATCH_INPUTS):
        zero = answer_calibration(model, tokenizer, plan.selected.zero_shot(), prompt.method, plan.inputs, **kwargs)
    return {"prompt": prompt, "zero_shot": zero}


def _answer_rows(plan: AnswerPlan, model, tokenizer, compressor, rest: list[Example],
                 calibrations: dict[str, Calibration | None]):
    """The rows of ``rest``, a batch at a time, with zero-shot answers beside them when the
    inputs have labels; with a calibration, the raw answer's correctness beside the calibrated one's."""
    cfg = plan.cfg
    kwargs = {"batch": cfg.batch, "task": plan.task, "max_new_tokens": cfg.max_new_tokens}
    answers = iter_answers(model, tokenizer, plan.selected, rest, cache=cfg.cache, compressor=compressor,
                           retriever=cfg.per_query, k=cfg.k, calibration=calibrations["prompt"], **kwargs)
    zero = iter_answers(model, tokenizer, plan.selected.zero_shot(), rest, calibration=calibrations["zero_shot"],
                        **kwargs) if plan.labelled and cfg.zero_shot else None
    for batch in answers:
        rows = [a.row() for a in batch]
        if zero is not None:
            for row, z in zip(rows, next(zero), strict=True):
                row["zero_shot"] = {"answer": z.answer, "correct": z.correct}
                if z.raw_answer is not None:
                    row["zero_shot"]["raw_correct"] = z.raw_correct
        yield rows


def summarize(plan: AnswerPlan, rows: list[dict[str, Any]], *, answered: int, seconds: float,
              calibrations: dict[str, Calibration | None] | None = None) -> dict[str, Any]:
    """What ``answer_summary.json`` holds: counts, timing, the calibrations applied and, for
    labelled inputs, the accuracy of the prompt and of zero-shot (as answered, and raw where a
    calibration was applied) with 95% bootstrap intervals over the inputs, and their paired
    difference."""
    calibrations = calibrations or {}
    cfg = plan.cfg
    summary: dict[str, Any] = {
        "selection": plan.selected.source, "inputs_file": cfg.inputs, "inputs": len(rows), "answered_now": answered,
        "answered_before": len(rows) - answered, "model": plan.model, "task": plan.selected.task,
        "k": plan.selected.k if cfg.per_query is None else (cfg.k or plan.selected.k), "cache": cfg.cache,
        "compressor": plan.compressor, "fidelity": plan.fidelity, "per_query": cfg.per_query,
        "seconds": seconds, "answers_per_second": answered / seconds if answered and seconds > 0 else None,
        "notes": plan.notes,
        "calibration": {name: None if c is None else c.to_dict() for name, c in calibrations.items()} or None,
    }
    correct = [row["correct"] for row in rows]
    if rows and all(c is not None for c in correct):
        summary["accuracy"] = paired_bootstrap(np.array(correct, dtype=float))
        zero = [row.get("zero_shot", {}).get("correct") for row in rows]
        if all(z is not None for z in zero):
            summary["zero_shot_accuracy"] = paired_bootstrap(np.array(zero, dtype=float))
            summary["gain_over_zero_shot"] = paired_bootstrap(np.array(correct, dtype=float) - np.array(zero))
        raw = [row.get("raw_correct") for row in rows]
        if all(r is not None for r in raw):
            summary["raw_accuracy"] = paired_bootstrap(np.array(raw, dtype=float))
        zero_raw = [row.get("zero_shot", {}).get("raw_correct") for row in rows]
        if all(z is not None for z in zero_raw):
            summary["zero_shot_raw_accuracy"] = paired_bootstrap(np.array(zero_raw, dtype=float))
    return summary


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary for a terminal: what was answered and, with labels, the accuracies."""
    rate = summary["answers_per_second"]
    lines = [f"answered {summary['answered_now']} of {summary['inputs']} inputs"
             + (f" ({summary['answered_before']} answered before, skipped)" if summary["answered_before"] else "")
             + (f", {rate:.1f} per second" if rate else "")
             + f"; {summary['cache']} prefix" + (f", {summary['per_query']} per input" if summary["per_query"] else "")]
    acc = summary.get("accuracy")
    if acc:
        line = f"accuracy {_ci(acc)} on {acc['n']} labelled inputs (95% bootstrap interval over the inputs)"
        zero = summary.get("zero_shot_accuracy")
        if zero:
            line += (f"; zero-shot {_ci(zero)}; the prompt minus zero-shot "
                     f"{_ci(summary['gain_over_zero_shot'], sign=True)} (paired)")
        lines.append(line)
        cal = (summary.get("calibration") or {}).get("prompt")
        if cal and summary.get("raw_accuracy"):
            line = f"calibration {cal['method']} ({cal['source']}): raw accuracy {_ci(summary['raw_accuracy'])}"
            if summary.get("zero_shot_raw_accuracy"):
                line += f", zero-shot raw {_ci(summary['zero_shot_raw_accuracy'])}"
            lines.append(line)
    return lines


def _ci(stat: dict[str, Any], sign: bool = False) -> str:
    f = "+.3f" if sign else ".3f"
    lo, hi = stat["ci95"]
    return f"{format(stat['mean'], f)} [{format(lo, f)}, {format(hi, f)}]"


def _compressor(cfg: AnswerConfig, selected: SelectedPrompt) -> tuple[str, str]:
    """The compressor for ``--cache compressed`` and a line on its fidelity: ``cfg.compressor``,
    else the selection's, else the one shipped for its model and task; refused unless its
    fidelity verdict passed or ``cfg.force``."""
    path = cfg.compressor or selected.compressor
    if path is None:
        shipped = find_pretrained(selected.model, selected.task, selected.k)
        if shipped is None:
            raise ValueError(f"--cache compressed needs a compressor: selection {selected.where()} read none and none "
                             f"is shipped for {selected.model} / {selected.task}; pass --compressor DIR (icl-ssm "
                             "distill trains one) or use --cache dense")
        path = str(shipped / "compressor")
    fidelity = selected.fidelity if path == selected.compressor and selected.fidelity else compressor_fidelity(path)
    verdict = fidelity.get("verdict")
    said = {"compressed": "passed", "dense": "failed", None: "not measured"}.get(verdict, str(verdict))
    line = f"compressor {path}: fidelity verdict {said} ({fidelity.get('detail') or 'no detail'})"
    if verdict != "compressed" and not cfg.force:
        raise ValueError(f"{line}; its answers are not shown to be the dense prompt's: use --cache dense, or "
                         "--force to answer from it anyway")
    return str(path), line + (" - used because --force was given" if verdict != "compressed" else "")


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]

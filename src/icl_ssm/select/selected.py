"""A chosen prompt as one object: :class:`SelectedPrompt`, the demonstrations in prompt order
with the model, task and template they were chosen for, saved to and loaded from a directory.

``SelectedPrompt.save(dir)`` writes ``dir/selection.json`` atomically (and ``selected.jsonl`` and
``prompt.txt`` beside it when asked). :meth:`SelectedPrompt.load` reads

* a directory holding ``selection.json`` (what ``icl-ssm select`` and ``icl-ssm run`` write);
* a directory written by ``icl-ssm select`` or ``icl-ssm run`` before ``selection.json`` existed
  (``select_config.json`` + ``summary.json``, or ``run_config.json`` + ``report.json``, each with
  its ``selected.jsonl``);
* a ``selected.jsonl`` file: with its directory's configuration files when they are there.

The layout of ``selection.json`` is :mod:`~icl_ssm.select.selection_schema`'s; the older
directories are read by :mod:`~icl_ssm.select.selected_legacy`.

What it holds is what answering and exporting need, and nothing that must be recomputed:
every demonstration's id, text, label and pool index; the model (answering with another is
refused by name); the task, its options and the template it was formatted with (instruction,
input and output prefixes, labels and their verbalisers); how the pool is rebuilt (its size,
seed, ``k`` and a hash of its ids, for retrieval per input); and the compressor the selection
read, with its fidelity verdict where one was measured; and the calibration chosen with the
prompt (:class:`~icl_ssm.calibrate.Calibration`: the method, the bias per label and what it was
estimated on), which ``icl-ssm answer`` applies by default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from icl_ssm import atomic, schema
from icl_ssm.calibrate import Calibration
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import KINDS, Example, Task, get_task
from icl_ssm.lm.models import EMBEDDED_MODELS
from icl_ssm.select import selected_legacy
from icl_ssm.select.selection_parts import Demonstration, task_template
from icl_ssm.select.selection_schema import FORMAT, SELECTION_FILE, SELECTION_SCHEMA, TEMPLATE_FIELDS


@dataclass
class SelectedPrompt:
    """The ``k`` demonstrations a selection chose, in prompt order, and what they were chosen for.

    ``model``: the name the selection's model was loaded by (:func:`canonical_model` compares
    names); ``task`` and ``task_options``: what :func:`~icl_ssm.data.tasks.get_task` takes;
    ``template``: the task's ``kind``, ``labels``, ``verbalizers``, ``instruction``,
    ``input_prefix`` and ``output_prefix`` (the prompt's format, kept so that a prompt can be
    answered or exported when the task file has moved); ``chat``: prompts in the chat template;
    ``pool``: ``{"size", "seed", "k", "min_validation", "ids_sha256"}``, how
    :func:`~icl_ssm.data.splits.split` rebuilds the candidate pool (None: unknown);
    ``compressor``: the compressor directory the selection read (None: none); ``fidelity``:
    its verdict ``{"verdict": "compressed" | "dense" | None, "detail", "source"}`` (verdict
    None: not measured); ``method``: the selector that chose them; ``calibration``: the
    :class:`~icl_ssm.calibrate.Calibration` chosen with the prompt (None: raw scores);
    ``source``: where it was loaded from (not saved).
    """

    model: str
    task: str
    demonstrations: list[Demonstration]
    task_options: dict[str, Any] = field(default_factory=dict)
    template: dict[str, Any] = field(default_factory=dict)
    chat: bool = False
    pool: dict[str, Any] | None = None
    compressor: str | None = None
    fidelity: dict[str, Any] | None = None
    method: str | None = None
    calibration: Calibration | None = None
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.calibration is not None and self.template.get("labels") and \
                list(self.calibration.labels) != list(self.template["labels"]):
            raise ValueError(f"selection {self.where()}: its calibration is for labels "
                             f"{list(self.calibration.labels)}, its task's are {self.template['labels']}")

    @property
    def k(self) -> int:
        return len(self.demonstrations)

    def examples(self) -> list[Example]:
        """The demonstrations as task examples, in prompt order."""
        return [d.example() for d in self.demonstrations]

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.demonstrations]

    @property
    def pool_indices(self) -> list[int] | None:
        indices = [d.pool_index for d in self.demonstrations]
        return None if any(i is None for i in indices) else indices  # type: ignore[return-value]

    def zero_shot(self) -> SelectedPrompt:
        """The same task and model with no demonstrations: the baseline a prompt is measured against."""
        return replace(self, demonstrations=[], method="zero-shot", compressor=None, fidelity=None, calibration=None)

    # ------------------------------------------------------------------ the task and its pool

    def task_object(self) -> Task:
        """The task the prompt was chosen on: ``get_task(task, **task_options)``; where that
        cannot be built (a user file since moved), a task made from the saved template. Refuses
        a task whose format no longer matches the saved template (the prompt would differ)."""
        try:
            task = get_task(self.task, **self.task_options)
        except (ValueError, OSError) as err:
            if not self.template:
                raise ValueError(f"selection {self.where()}: task {self.task!r} cannot be loaded ({err}) and the "
                                 "selection has no saved template to answer with") from err
            return TemplateTask.from_template(self.task, self.template)
        if self.template:
            now = task_template(task)
            changed = [key for key in TEMPLATE_FIELDS if key in self.template and now[key] != self.template[key]]
            if changed:
                raise ValueError(f"selection {self.where()}: task {self.task!r} now formats prompts differently from "
                                 f"when it was selected ({', '.join(changed)} changed: "
                                 f"{', '.join(f'{self.template[c]!r} -> {now[c]!r}' for c in changed)})")
        return task

    def pool_examples(self, task: Task | None = None) -> list[Example]:
        """The candidate pool the demonstrations were chosen from, rebuilt by
        :func:`~icl_ssm.data.splits.split` and checked against the saved ids (retrieval per
        input draws from it)."""
        if not self.pool:
            raise ValueError(f"selection {self.where()} does not say how its pool was made (pool size and seed); "
                             "retrieval per input needs it")
        task = task or self.task_object()
        if isinstance(task, TemplateTask):
            raise ValueError(f"selection {self.where()}: task {self.task!r} cannot be loaded here, so the candidate "
                             "pool cannot be rebuilt; retrieval per input needs the task's data")
        p = self.pool
        pool = split(task, pool_size=p["size"], seed=p["seed"], fit=True, k=p.get("k", 0),
                     min_val_size=p.get("min_validation", 0)).pool
        wrong = [d.id for d in self.demonstrations if d.pool_index is not None and
                 (d.pool_index >= len(pool) or pool[d.pool_index].id != d.id)]
        if wrong or (p.get("ids_sha256") and p["ids_sha256"] != ids_hash(pool)):
            raise ValueError(f"selection {self.where()}: the pool rebuilt from task {self.task!r} (size {p['size']}, "
                             f"seed {p['seed']}) is not the one the selection chose from"
                             + (f" (demonstrations {', '.join(wrong[:5])} are not where it says)" if wrong else "")
                             + "; the task's data changed since")
        return pool

    # ------------------------------------------------------------------ the model

    def check_model(self, name: str) -> None:
        """Refuse a model other than the selection's, naming both (aliases of one embedded
        model are the same model)."""
        if canonical_model(name) != canonical_model(self.model):
            raise ValueError(f"model {name!r} differs from {self.model!r}, the model selection {self.where()} was "
                             f"made for; a prompt chosen for one model is not chosen for another: answer with "
                             f"--model {self.model} or select again for {name}")

    # ------------------------------------------------------------------ saving and loading

    @staticmethod
    def from_pool(pool: Sequence[Example], indices: Sequence[int], *, model: str, task: Task,
                  method: str | None = None, task_options: dict[str, Any] | None = None, chat: bool = False,
                  pool_made: dict[str, Any] | None = None, compressor: str | None = None,
                  fidelity: dict[str, Any] | None = None, calibration: Calibration | None = None) -> SelectedPrompt:
        """The selection of ``pool[i] for i in indices`` (prompt order) for ``model`` and ``task``
        (built with ``task_options``); ``pool_made``: :func:`pool_spec`."""
        demos = [Demonstration(pool[i].id, pool[i].input, pool[i].target, int(i)) for i in indices]
        name = str(Path(task.name).resolve()) if Path(task.name).is_file() else task.name  # a user file, from anywhere
        return SelectedPrompt(model, name, demos, dict(task_options or {}), task_template(task), chat, pool_made,
                              compressor, fidelity, method, calibration)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("source")
        data["calibration"] = None if self.calibration is None else self.calibration.to_dict()
        return {"format": FORMAT, **data}

    @staticmethod
    def from_dict(data: dict[str, Any], source: str | None = None) -> SelectedPrompt:
        """The selection ``data`` holds (:meth:`to_dict`), checked against
        :data:`~icl_ssm.select.selection_schema.SELECTION_SCHEMA`."""
        where = source or "the selection"
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, found {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ValueError(f"{where}: selection format {data.get('format')!r}; this icl-ssm reads format {FORMAT}")
        schema.validate(data, SELECTION_SCHEMA, where)
        demos = [Demonstration(**d) for d in data["demonstrations"]]
        kept = {key: data[key] for key in ("task_options", "template", "chat", "pool", "compressor", "fidelity",
                                           "method") if key in data}
        if data.get("calibration") is not None:
            kept["calibration"] = Calibration.from_dict(data["calibration"], f"{where}: calibration")
        return SelectedPrompt(data["model"], data["task"], demos, **kept, source=source)

    def save(self, directory: str | Path, *, files: bool = False, prompt_text: str | None = None) -> Path:
        """``directory/selection.json``, written atomically; with ``files`` also ``selected.jsonl``
        (id, text, label of each demonstration) and, given ``prompt_text``, ``prompt.txt``."""
        out = atomic.prepare_dir(directory)
        if files:
            atomic.write_jsonl(out / "selected.jsonl", [{"id": d.id, "text": d.text, "label": d.label}
                                                         for d in self.demonstrations])
        if prompt_text is not None:
            atomic.write_text(out / "prompt.txt", prompt_text)
        return atomic.write_json(out / SELECTION_FILE, self.to_dict())

    @staticmethod
    def load(path: str | Path, *, model: str | None = None, task: str | None = None,
             task_options: dict[str, Any] | None = None) -> SelectedPrompt:
        """A selection from a directory or a ``selected.jsonl`` (see the module docstring).
        ``model``, ``task`` and ``task_options`` say what a ``selected.jsonl`` with no
        configuration beside it was chosen for; they are not read otherwise."""
        path = Path(path)
        if path.is_file() and path.name == SELECTION_FILE:
            path = path.parent
        if path.is_file():
            if path.suffix != ".jsonl":
                raise ValueError(f"{path}: expected a selection directory or a selected.jsonl file")
            if selected_legacy.in_selection_dir(path):
                return SelectedPrompt.load(path.parent)
            return SelectedPrompt(**selected_legacy.from_jsonl(path, model, task, task_options or {}))
        if not path.is_dir():
            raise ValueError(f"selection {str(path)!r} does not exist; expected the --out directory of icl-ssm select "
                             "or icl-ssm run, or a selected.jsonl")
        if (path / SELECTION_FILE).is_file():
            file = path / SELECTION_FILE
            return SelectedPrompt.from_dict(schema.load(file, schema.OBJECT), str(file))
        if (path / "select_config.json").is_file():
            return SelectedPrompt(**selected_legacy.from_select_dir(path))
        if (path / "run_config.json").is_file():
            return SelectedPrompt(**selected_legacy.from_run_dir(path))
        found = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
        raise ValueError(f"{path} is not a selection: expected {SELECTION_FILE}, or the files of icl-ssm select "
                         f"(select_config.json, summary.json, selected.jsonl) or icl-ssm run (run_config.json, "
                         f"report.json, selected.jsonl); found {found}")

    def where(self) -> str:
        return repr(self.source) if self.source else f"for {self.task!r}"


@dataclass
class TemplateTask(Task):
    """A task rebuilt from a saved template alone: enough to format prompts, score labels
    and extract answers (exact match) when the task's own data cannot be read."""

    template_name: str = ""
    template: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_template(name: str, template: dict[str, Any]) -> TemplateTask:
        task = TemplateTask(template_name=name, template=dict(template))
        if template.get("kind") not in KINDS:
            raise ValueError(f"task {name!r}: saved template has kind {template.get('kind')!r}; accepted: "
                             f"{', '.join(KINDS)}")
        task.name = name
        task.kind = template["kind"]
        task.labels = tuple(template.get("labels") or ())
        task.verbalizers = dict(template.get("verbalizers") or {})
        task.instruction = template.get("instruction", "")
        task.input_prefix = template.get("input_prefix", "Input: ")
        task.output_prefix = template.get("output_prefix", "Output: ")
        return task

    def load(self) -> list[Example]:
        raise ValueError(f"task {self.template_name!r} was rebuilt from a saved template and has no data")


def canonical_model(name: str) -> str:
    """One name per model: an embedded model's canonical name for any of its aliases, a local
    directory's resolved path, else the name as given (a hub id)."""
    key = str(name).strip()
    spec = EMBEDDED_MODELS.get(key.lower())
    if spec is not None:
        return spec.name
    path = Path(key).expanduser()
    try:
        return str(path.resolve()) if path.exists() else key
    except (OSError, ValueError):  # not a path this system can hold (too long, a NUL byte): a name
        return key


def ids_hash(examples: Sequence[Example]) -> str:
    """A short hash of the examples' ids in order: tells a rebuilt pool from another."""
    return hashlib.sha256("\n".join(e.id for e in examples).encode()).hexdigest()[:16]


def pool_spec(pool: Sequence[Example], *, size: int, seed: int, k: int, min_validation: int) -> dict[str, Any]:
    """``SelectedPrompt.pool``: the :func:`~icl_ssm.data.splits.split` arguments that made ``pool``
    and the hash of its ids."""
    return {"size": size, "seed": seed, "k": k, "min_validation": min_validation, "ids_sha256": ids_hash(pool)}



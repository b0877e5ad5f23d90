"""What every stage of ``icl-ssm run`` reads, resolved once (:class:`Run`): the settings, the
task and its splits, the stage store, and once loaded the model, its tokenizer and the prompt
builder. A stage takes the run and returns its result; nothing below re-resolves a task or a
builder from the settings."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from icl_ssm.data.splits import Splits, split_notes
from icl_ssm.data.tasks import Example, Task, get_task
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.pipeline.config import RunConfig, held_out_start, run_splits
from icl_ssm.pipeline.stages import Stages, say


@dataclass(frozen=True)
class Run:
    """One run's resolved inputs. ``model``, ``tokenizer`` and ``builder`` are None until
    :meth:`with_model` (a distillation, before it, loads its own)."""

    cfg: RunConfig
    out: Path
    task: Task
    splits: Splits
    stages: Stages
    model: Any = None
    tokenizer: Any = None
    builder: PromptBuilder | None = None

    @classmethod
    def open(cls, cfg: RunConfig, out: Path) -> Run:
        """Resolve the task and make its splits (saying what they note of themselves); refuse a
        ``k`` larger than the pool."""
        task = get_task(cfg.task, **cfg.task_options)
        splits = run_splits(cfg, task)
        for note in split_notes(splits, task):
            say(note)
        if cfg.k > len(splits.pool):
            raise ValueError(f"--k {cfg.k} demonstrations requested but the pool of task {task.name!r} has only "
                             f"{len(splits.pool)} candidates; lower --k or raise --pool-size")
        return cls(cfg, out, task, splits, Stages(out))

    def with_model(self, model: Any, tokenizer: Any) -> Run:
        """The run with its model loaded and the one prompt builder every stage uses."""
        return replace(self, model=model, tokenizer=tokenizer,
                       builder=PromptBuilder.for_model(model, tokenizer, self.task))

    @property
    def classification(self) -> bool:
        return self.task.kind == "classification"

    @property
    def test(self) -> list[Example]:
        """The test examples every prompt is scored on (the first ``cfg.test_size``)."""
        return self.splits.test[: self.cfg.test_size]

    @property
    def read(self) -> list[Example]:
        """The validation examples selection reads (the first ones); the check's come after."""
        return self.splits.validation[: held_out_start(self.cfg)]

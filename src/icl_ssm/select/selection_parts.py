"""The parts of a saved selection that its readers share: one :class:`Demonstration`, a task's
:func:`task_template` and a compressor's :func:`compressor_fidelity`. Both the current reader
(:class:`~icl_ssm.select.selected.SelectedPrompt`) and the one of older directories
(:mod:`~icl_ssm.select.selected_legacy`) build on them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icl_ssm import schema
from icl_ssm.data.tasks import Example, Task
from icl_ssm.select.selection_schema import RECIPE_SCHEMA


@dataclass(frozen=True)
class Demonstration:
    """One demonstration of a prompt: its ``id`` in the task, ``text`` (the input shown),
    ``label`` (the gold label name, or the answer text of a generative task) and where it sits
    in the candidate pool (``pool_index``; None where the pool is not known)."""

    id: str
    text: str
    label: str
    pool_index: int | None = None

    def example(self) -> Example:
        return Example(self.id, self.text, self.label)


def task_template(task: Task) -> dict[str, Any]:
    """The fields of ``task`` that decide how its prompts read:
    :data:`~icl_ssm.select.selection_schema.TEMPLATE_FIELDS`."""
    return {"kind": task.kind, "labels": list(task.labels), "verbalizers": dict(task.verbalizers),
            "instruction": task.instruction, "input_prefix": task.input_prefix, "output_prefix": task.output_prefix}


def compressor_fidelity(compressor: str | None, verdict: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """``SelectedPrompt.fidelity`` for ``compressor``: from a run's fidelity ``verdict``
    (:func:`~icl_ssm.evaluate.verdict.fidelity_verdict`) when there is one; else, for a
    compressor shipped with the package, the fidelity its recipe records (numbers without
    intervals: no verdict); else None."""
    if compressor is None:
        return None
    if verdict is not None and verdict.get("checks") is not None:
        passed = verdict.get("verdict", verdict.get("evaluator"))
        return {"verdict": passed, "detail": verdict.get("summary") or verdict.get("reason") or "",
                "source": "the run's fidelity stage"}
    recipe = Path(compressor).parent / "recipe.json"
    measured = schema.load(recipe, RECIPE_SCHEMA).get("fidelity") if recipe.is_file() else None
    if not measured:
        return {"verdict": None, "detail": "no fidelity measured for this compressor", "source": None}
    numbers = ", ".join(f"{key} {measured[key]:.3f}" for key in ("subset_loss_spearman", "kl", "top1_agree",
                                                                  "acc_dense", "acc_compressed")
                        if isinstance(measured.get(key), int | float))
    return {"verdict": None, "source": str(recipe),
            "detail": f"measured when it was shipped on {measured.get('subsets')} subsets x {measured.get('queries')} "
                      f"queries: {numbers}; without intervals, so no verdict (icl-ssm run measures one)"}

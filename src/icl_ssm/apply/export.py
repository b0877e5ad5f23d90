"""The chosen demonstrations in the shapes other tools load, each a small function registered in
:data:`EXPORTS` (one name, one function ``SelectedPrompt -> JSON-able``):

* ``dspy``: a saved ``dspy.Predict``'s state (``Predict.save(path)``'s JSON): the demonstrations
  as its ``demos``, the instruction and the field prefixes as its signature's. Load it with
  ``dspy.Predict("text -> label").load(path)`` (``"text -> answer"`` for a generative task).
* ``langchain``: a ``FewShotPromptTemplate`` as LangChain's prompt files hold it (``_type``
  ``few_shot``): the demonstrations as its ``examples``, an ``example_prompt`` in icl-ssm's
  plain layout, the instruction as ``prefix`` and the query as ``suffix``, so that
  ``template.format(text=...)`` is the prompt icl-ssm answers with. Braces in the texts are
  doubled, as f-string templates need.
* ``messages``: an OpenAI-style chat messages list: the instruction as the system message, each
  demonstration a user turn and an assistant turn; append the input as the last user turn.

Every export reads the template saved with the selection (the prompt's format), never the task's
data. None of the three can carry a calibration: each holds text, and a text cannot shift a label's
score. :func:`calibration_note` says so, with the bias to apply by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from icl_ssm.select.selected import SelectedPrompt
from icl_ssm.select.selection_parts import task_template

SEPARATOR = "\n\n"  # between demonstrations, as icl_ssm.lm.prompts lays them out


def answer_word(selected: SelectedPrompt, label: str) -> str:
    """What the model emits for ``label``: its verbaliser (classification), else the text itself."""
    template = _template(selected)
    if template["kind"] == "classification":
        return str(template.get("verbalizers", {}).get(label, label)).strip()
    return label.strip()


def output_name(selected: SelectedPrompt) -> str:
    """The output field's name: ``label`` for classification, ``answer`` for a generative task."""
    return "label" if _template(selected)["kind"] == "classification" else "answer"


def to_dspy(selected: SelectedPrompt) -> dict[str, Any]:
    """A ``dspy.Predict`` state with the demonstrations as ``demos`` (fields ``text`` and
    ``label``/``answer``); ``metadata.dependency_versions`` is left empty (no DSPy wrote it)."""
    t, out = _template(selected), output_name(selected)
    demos = [{"text": d.text.strip(), out: answer_word(selected, d.label)} for d in selected.demonstrations]
    fields = [{"prefix": t.get("input_prefix", "").strip() or "Text:", "description": "${text}"},
              {"prefix": t.get("output_prefix", "").strip() or f"{out.title()}:", "description": f"${{{out}}}"}]
    return {"traces": [], "train": [], "demos": demos,
            "signature": {"instructions": t.get("instruction", "").strip(), "fields": fields},
            "lm": None, "metadata": {"dependency_versions": {}}}


def to_langchain(selected: SelectedPrompt) -> dict[str, Any]:
    """A ``FewShotPromptTemplate`` in LangChain's prompt-file layout (``_type: few_shot``)."""
    t, out = _template(selected), output_name(selected)
    output_prefix = _braces(t.get("output_prefix", "").rstrip())
    space = " " if output_prefix.strip() else ""
    body = f"{_braces(t.get('input_prefix', ''))}{{text}}\n{output_prefix}"
    examples = [{"text": _braces(d.text.strip()), out: _braces(answer_word(selected, d.label))}
                for d in selected.demonstrations]
    return {"_type": "few_shot", "input_variables": ["text"], "prefix": _braces(t.get("instruction", "").strip()),
            "example_separator": SEPARATOR,
            "example_prompt": {"_type": "prompt", "input_variables": ["text", out],
                               "template": f"{body}{space}{{{out}}}"},
            "examples": examples, "suffix": body, "template_format": "f-string"}


def to_messages(selected: SelectedPrompt) -> list[dict[str, str]]:
    """``[{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", ...}, ...]``: the
    chat layout of :class:`~icl_ssm.lm.prompts.PromptBuilder` (``chat=True``)."""
    t = _template(selected)
    instruction = t.get("instruction", "").strip()
    messages = [{"role": "system", "content": instruction}] if instruction else []
    for d in selected.demonstrations:
        messages.append({"role": "user", "content": f"{t.get('input_prefix', '')}{d.text.strip()}".strip()})
        messages.append({"role": "assistant", "content": answer_word(selected, d.label)})
    return messages


EXPORTS: dict[str, Callable[[SelectedPrompt], Any]] = {
    "dspy": to_dspy,
    "langchain": to_langchain,
    "messages": to_messages,
}


def export_selection(selected: SelectedPrompt, to: str) -> Any:
    """``selected``'s demonstrations in the shape ``to`` (a key of :data:`EXPORTS`) names."""
    if to not in EXPORTS:
        raise ValueError(f"export {to!r}; accepted: {', '.join(EXPORTS)}")
    return EXPORTS[to](selected)


def calibration_note(selected: SelectedPrompt, to: str) -> str | None:
    """Where ``selected`` carries a calibration: a line saying the ``to`` export cannot, and the bias
    per label to subtract from the label log-probabilities by hand (None without one)."""
    c = selected.calibration
    if c is None or c.is_none:
        return None
    what = {"dspy": "a DSPy Predict's demos", "langchain": "a LangChain template",
            "messages": "a chat messages list"}.get(to, f"the {to} export")
    bias = ", ".join(f"{label}: {b:+.4f}" for label, b in zip(c.labels, c.bias, strict=True))
    return (f"the selection's {c.method} calibration is not carried: {what} holds text, and a text cannot shift a "
            f"label's score. The answers icl-ssm measured were calibrated; to get them, answer with icl-ssm answer, "
            f"or subtract this bias from each label's log-probability before taking the best: {bias}")


def _template(selected: SelectedPrompt) -> dict[str, Any]:
    if not selected.template:
        return task_template(selected.task_object())
    return selected.template


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")

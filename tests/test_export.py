"""``icl-ssm export``: a selection's demonstrations in the shapes DSPy, LangChain and chat APIs
load, each checked by loading it where the library installs within CI's time.

LangChain: ``langchain-core`` (in the ``test`` extra) loads the file and formats the prompt
icl-ssm answers with. Messages: ``langchain_core.messages.convert_to_messages`` reads the list,
and the tiny tokenizer's chat template renders it as icl-ssm's chat prompt. DSPy pulls some 70
packages (about 400 MB), so CI checks its export against the layout ``dspy.Predict.save``
writes (DSPy 3.4: ``traces``, ``train``, ``demos``, ``signature.instructions``,
``signature.fields[].prefix/description``, ``lm``, ``metadata.dependency_versions``); the test
that loads it with DSPy itself runs where DSPy is installed and is skipped elsewhere.
"""

import json
import warnings

import pytest

from icl_ssm.apply.export import EXPORTS, export_selection
from icl_ssm.cli import main
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.tiny import tiny_tokenizer
from icl_ssm.select.selected import SelectedPrompt


@pytest.fixture(scope="module")
def selection(tmp_path_factory):
    """Three demonstrations of a sentiment file whose texts hold braces, saved as icl-ssm saves them."""
    root = tmp_path_factory.mktemp("export")
    rows = [{"text": f"review {i}: the {{plot}} was {'great' if i % 2 else 'terrible'}", "label":
             "positive" if i % 2 else "negative"} for i in range(30)]
    data = root / "reviews.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task(str(data), instruction="Classify the {sentiment}.", input_prefix="Review: ",
                    output_prefix="Sentiment:")
    splits = split(task, pool_size=12, seed=0)
    selected = SelectedPrompt.from_pool(splits.pool, [3, 0, 5], model="tiny-llama", task=task, method="random",
                         task_options={"instruction": "Classify the {sentiment}.", "input_prefix": "Review: ",
                                       "output_prefix": "Sentiment:"})
    selected.save(root / "sel", files=True)
    return {"root": root, "selected": selected, "task": task, "query": splits.test[0], "dir": root / "sel"}


def exported(selection, to, tmp_path, capsys):
    path = tmp_path / f"{to}.json"
    assert main(["export", str(selection["dir"]), "--to", to, "--out", str(path)]) == 0
    assert f"3 demonstrations for {to} written to {path}" in capsys.readouterr().err
    return path, json.loads(path.read_text())


def test_langchain_few_shot_template_formats_the_prompt_icl_ssm_answers_with(selection, tmp_path, capsys):
    from langchain_core.prompts import FewShotPromptTemplate, PromptTemplate, load_prompt

    path, data = exported(selection, "langchain", tmp_path, capsys)
    builder = PromptBuilder(tiny_tokenizer(), selection["task"], add_bos=False)
    query = selection["query"]
    expected = builder.build(selection["selected"].examples(), query).text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # load_prompt is deprecated in langchain-core 1.2; the file layout is not
        loaded = load_prompt(path)
    assert isinstance(loaded, FewShotPromptTemplate)
    assert loaded.format(text=query.input) == expected
    kwargs = {key: value for key, value in data.items() if key != "_type"}
    example = {key: value for key, value in kwargs.pop("example_prompt").items() if key != "_type"}
    built = FewShotPromptTemplate(**kwargs, example_prompt=PromptTemplate(**example))
    assert built.format(text=query.input) == expected
    assert len(built.examples) == 3 and built.examples[0]["label"] == "positive"


def test_messages_load_as_chat_messages_and_render_as_icl_ssm_s_chat_prompt(selection, tmp_path, capsys):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, convert_to_messages

    _, messages = exported(selection, "messages", tmp_path, capsys)
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 3
    assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in messages)
    loaded = convert_to_messages(messages)
    assert [type(m) for m in loaded] == [SystemMessage] + [HumanMessage, AIMessage] * 3
    tokenizer = tiny_tokenizer()
    query = selection["query"]
    task = selection["task"]
    rendered = tokenizer.apply_chat_template(messages + [{"role": "user", "content": task.input_prefix + query.input}],
                                             tokenize=False, add_generation_prompt=True)
    builder = PromptBuilder(tokenizer, task, chat=True)
    assert rendered == builder.build(selection["selected"].examples(), query).text


def test_dspy_export_has_the_saved_predict_layout(selection, tmp_path, capsys):
    """DSPy's ``Predict.save`` layout (see the module docstring), checked field by field."""
    _, state = exported(selection, "dspy", tmp_path, capsys)
    assert set(state) == {"traces", "train", "demos", "signature", "lm", "metadata"}
    assert state["traces"] == [] and state["train"] == [] and state["lm"] is None
    assert state["metadata"] == {"dependency_versions": {}}  # load() warns on each version that differs: none here
    demos = selection["selected"].demonstrations
    assert state["demos"] == [{"text": d.text, "label": d.label} for d in demos]
    assert state["signature"] == {"instructions": "Classify the {sentiment}.",
                                  "fields": [{"prefix": "Review:", "description": "${text}"},
                                             {"prefix": "Sentiment:", "description": "${label}"}]}


def test_dspy_loads_the_export(selection, tmp_path, capsys):
    dspy = pytest.importorskip("dspy")
    path, _ = exported(selection, "dspy", tmp_path, capsys)
    program = dspy.Predict("text -> label")
    program.load(str(path))
    assert [d["label"] for d in program.demos] == [d.label for d in selection["selected"].demonstrations]
    assert program.signature.instructions == "Classify the {sentiment}."


def test_export_prints_without_out_and_refuses_an_unknown_shape(selection, capsys):
    assert main(["export", str(selection["dir"]), "--to", "messages"]) == 0
    assert json.loads(capsys.readouterr().out) == export_selection(selection["selected"], "messages")
    with pytest.raises(ValueError, match="export 'csv'; accepted: dspy, langchain, messages"):
        export_selection(selection["selected"], "csv")
    assert set(EXPORTS) == {"dspy", "langchain", "messages"}


@pytest.mark.parametrize("to", list(EXPORTS))
def test_an_export_says_plainly_that_it_cannot_carry_the_calibration(selection, tmp_path, capsys, to):
    from dataclasses import replace

    from icl_ssm.calibrate import Calibration

    calibrated = replace(selection["selected"], calibration=Calibration("batch", ("negative", "positive"),
                                                                        (-0.25, 0.25), 64, "a test"))
    calibrated.save(tmp_path / "cal")
    assert main(["export", str(tmp_path / "cal"), "--to", to, "--out", str(tmp_path / "x.json")]) == 0
    err = capsys.readouterr().err
    assert "batch calibration is not carried" in err and "negative: -0.2500, positive: +0.2500" in err
    assert main(["export", str(selection["dir"]), "--to", to, "--out", str(tmp_path / "y.json")]) == 0
    assert "calibration" not in capsys.readouterr().err  # no calibration, no note

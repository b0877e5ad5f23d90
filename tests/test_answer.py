"""Answering inputs with a selection (``icl-ssm answer``, :mod:`icl_ssm.apply`) on tiny random
models and small files: the shared prefix against the reference that re-encodes every prompt,
the selection saved and loaded, resumable predictions, and the errors a user meets."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from icl_ssm import SelectedPrompt, answer_inputs
from icl_ssm.apply.answer import answer_inputs_ref, scores_after_prefix, scores_reencoded, shared_prefix
from icl_ssm.apply.inputs import read_inputs
from icl_ssm.apply.predictions import PARTIAL, PredictionsFile
from icl_ssm.cli import main
from icl_ssm.compress.builders import CompressedCache
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.tiny import tiny_model
from icl_ssm.select.per_query import bm25_prompts

ROOT = Path(__file__).resolve().parents[1]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A coin-flip task file, 1,000 inputs with labels (from another seed), a selection of 3."""
    root = tmp_path_factory.mktemp("answer")
    data = write_jsonl(root / "coin.jsonl", [{"text": e.input, "label": e.target}
                                             for e in get_task("coin_flip", size=120).examples()])
    more = get_task("coin_flip", size=1000, seed=7).examples()
    inputs = write_jsonl(root / "inputs.jsonl", [{"text": e.input, "label": e.target} for e in more])
    sel = root / "sel"
    assert main(["select", "--model", "tiny-llama", "--task", str(data), "--k", "3", "--pool-size", "24", "--queries",
                 "3", "--test-size", "6", "--method", "random", "--out", str(sel)]) == 0
    return {"root": root, "data": data, "inputs": inputs, "sel": sel}


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


def user_task(tmp_path, labels, kind="classification"):
    """A user file whose labels are ``labels`` (several tokens each, for the multi-token path)."""
    rows = [{"text": f"the film number {i} was {'good' if i % 2 else 'bad'}", "label": labels[i % len(labels)]}
            for i in range(40)]
    path = write_jsonl(tmp_path / f"{kind}.jsonl", rows)
    return get_task(str(path), kind=kind)


@pytest.mark.parametrize("labels, kind", [(None, "classification"),
                                          (("very good indeed", "rather bad", "so so"), "classification"),
                                          (("four", "Paris is it", "seven"), "generative")])
def test_shared_prefix_answers_as_the_whole_prompt_re_encoded(tmp_path, tiny, labels, kind):
    """The fast path (prefix encoded once, inputs packed after it) against the reference (every
    whole prompt encoded on its own): answer-position logits within 1e-4 in float32, the same
    answers, single- and multi-token verbalisers, and greedy answers of a generative task."""
    model, tokenizer = tiny
    assert model.dtype == torch.float32
    task = get_task("coin_flip", size=60) if labels is None else user_task(tmp_path, labels, kind)
    data = split(task, pool_size=12, seed=0)
    options = {} if labels is None else {"kind": kind}
    selected = SelectedPrompt.from_pool(data.pool, [4, 0, 7], model="tiny-llama", task=task, method="random",
                                        task_options=options)
    inputs = data.test[:7]
    builder = PromptBuilder.for_model(model, tokenizer, task)
    if kind == "classification":
        prefix = shared_prefix(model, builder, selected.examples())
        z, scores = scores_after_prefix(model, builder, prefix, [builder.build_suffix(q).input_ids for q in inputs])
        z_ref, scores_ref = scores_reencoded(model, builder, [builder.build(selected.examples(), q) for q in inputs])
        assert (z - z_ref).abs().max() < 1e-4 and (scores - scores_ref).abs().max() < 1e-4
        batched = scores_reencoded(model, builder, [builder.build(selected.examples(), q) for q in inputs], batch=3)[1]
        assert (batched - scores_ref).abs().max() < 1e-4  # the padded re-encoding a user would batch
    fast = answer_inputs(model, tokenizer, selected, inputs, batch=3)
    ref = answer_inputs_ref(model, tokenizer, selected, inputs)
    assert [a.answer for a in fast] == [a.answer for a in ref]
    assert [a.id for a in fast] == [q.id for q in inputs]
    assert all(a.demonstrations == selected.ids and a.pool_indices == [4, 0, 7] for a in fast)
    if kind == "classification":
        assert all(abs(a.scores[y] - b.scores[y]) < 1e-4 for a, b in zip(fast, ref) for y in task.labels)
        assert all(a.correct == float(a.answer == q.target) for a, q in zip(fast, inputs))


def test_the_compressed_prefix_answers_from_the_compressor_cache(tmp_path, tiny):
    model, tokenizer = tiny
    task = get_task("coin_flip", size=60)
    data = split(task, pool_size=12, seed=0)
    selected = SelectedPrompt.from_pool(data.pool, [4, 0, 7], model="tiny-llama", task=task, method="random")
    torch.manual_seed(0)
    compressor = SSMCompressor(SSMCompressorConfig.for_teacher(model.config, state_size=16, num_virtual=4,
                                                               num_sink=2, latent_size=8))
    answers = answer_inputs(model, tokenizer, selected, data.test[:5], cache="compressed", compressor=compressor)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    prefix = shared_prefix(model, builder, selected.examples(), CompressedCache(model, compressor))
    assert prefix.length == 6  # 2 sinks + 4 virtual slots, not the prompt
    scores = scores_after_prefix(model, builder, prefix, [builder.build_suffix(q).input_ids for q in data.test[:5]])[1]
    assert [a.answer for a in answers] == [task.labels[i] for i in scores.argmax(-1).tolist()]
    with pytest.raises(ValueError, match="gives every input a prompt of its own"):
        answer_inputs(model, tokenizer, selected, data.test[:2], cache="compressed", compressor=compressor,
                      retriever="bm25")


def test_a_selection_saves_and_loads_as_one_object_and_old_directories_load(files, tmp_path):
    selected = SelectedPrompt.load(files["sel"])
    summary = json.loads((files["sel"] / "summary.json").read_text())
    assert selected.ids == summary["ids"] and selected.pool_indices == summary["indices"]
    assert selected.model == "tiny-llama" and selected.method == "random" and selected.k == 3
    assert selected.template["labels"] == ["no", "yes"] and selected.pool["size"] == 24
    pool = selected.pool_examples()
    assert [pool[i].id for i in selected.pool_indices] == selected.ids
    assert SelectedPrompt.load(files["sel"] / "selected.jsonl") == selected  # the jsonl finds its directory
    selected.save(tmp_path / "copy", files=True)
    assert SelectedPrompt.load(tmp_path / "copy") == selected
    # a select directory written before selection.json: the same selection from its configs
    old = tmp_path / "old-select"
    old.mkdir()
    for name in ("select_config.json", "summary.json", "selected.jsonl"):
        (old / name).write_bytes((files["sel"] / name).read_bytes())
    loaded = SelectedPrompt.load(old)
    assert loaded.examples() == selected.examples() and loaded.pool_indices == selected.pool_indices
    assert loaded.pool_examples() == pool
    # a run directory written before selection.json
    run = tmp_path / "old-run"
    run.mkdir()
    (run / "selected.jsonl").write_bytes((files["sel"] / "selected.jsonl").read_bytes())
    (run / "run_config.json").write_text(json.dumps({"model": "tiny-llama", "task": str(files["data"]), "k": 3,
                                                     "pool_size": 24, "seed": 0, "queries": 3, "check_size": 0,
                                                     "methods": ["random"], "task_options": {}}))
    (run / "report.json").write_text(json.dumps({"handed_over": {"name": "random", "indices": selected.pool_indices},
                                                 "compressor": {"compressor": None}, "fidelity_verdict": None}))
    loaded = SelectedPrompt.load(run)
    assert loaded.examples() == selected.examples() and loaded.method == "random"
    assert loaded.pool_examples() == pool
    with pytest.raises(ValueError, match="is not a selection: expected selection.json"):
        SelectedPrompt.load(tmp_path)
    with pytest.raises(ValueError, match="does not say which model and task"):
        SelectedPrompt.load(write_jsonl(tmp_path / "bare.jsonl", [{"id": "a", "text": "t", "label": "yes"}]))


def test_a_selection_answers_when_its_task_file_has_moved(files, tmp_path, tiny):
    """The saved template formats the prompt: the same answers without the task file."""
    model, tokenizer = tiny
    selected = SelectedPrompt.load(files["sel"])
    inputs = read_inputs(files["inputs"], selected.task_object())[0][:4]
    moved = SelectedPrompt.from_dict({**selected.to_dict(), "task": str(tmp_path / "gone.jsonl")})
    assert type(moved.task_object()).__name__ == "TemplateTask"
    assert [a.row() for a in answer_inputs(model, tokenizer, moved, inputs)] == \
        [a.row() for a in answer_inputs(model, tokenizer, selected, inputs)]
    changed = SelectedPrompt.from_dict({**selected.to_dict(), "template": {**selected.template,
                                                                          "instruction": "Say yes."}})
    with pytest.raises(ValueError, match=r"differently from when it was selected \(instruction changed"):
        changed.task_object()


def answer(files, out, *extra):
    return main(["answer", str(files["sel"]), str(files["inputs"]), "--out", str(out), *extra])


def small_inputs(files, tmp_path, n=12, name="few.jsonl", **rename):
    """The first ``n`` inputs in ``tmp_path / name``, fields renamed as ``rename`` says (old=new)."""
    rows = [json.loads(line) for line in files["inputs"].read_text().splitlines()[:n]]
    rows = [{rename.get(k, k): v for k, v in r.items()} for r in rows]
    return write_jsonl(tmp_path / name, rows)


def test_answer_writes_predictions_with_accuracy_and_zero_shot_beside(files, tmp_path, capsys, tiny):
    few = small_inputs(files, tmp_path)
    out = tmp_path / "out"
    assert main(["answer", str(files["sel"]), str(few), "--out", str(out), "--batch", "5"]) == 0
    err = capsys.readouterr().err
    assert "answered 12 of 12 inputs" in err and "accuracy " in err and "zero-shot " in err
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"line-{i}" for i in range(1, 13)]
    assert set(rows[0]) == {"id", "answer", "scores", "correct", "demonstrations", "pool_indices", "zero_shot"}
    selected = SelectedPrompt.load(files["sel"])
    assert all(r["demonstrations"] == selected.ids for r in rows)
    summary = json.loads((out / "answer_summary.json").read_text())
    assert summary["accuracy"]["mean"] == pytest.approx(np.mean([r["correct"] for r in rows]))
    lo, hi = summary["accuracy"]["ci95"]
    assert lo <= summary["accuracy"]["mean"] <= hi and "zero_shot_accuracy" in summary
    model, tokenizer = tiny
    inputs = read_inputs(few, selected.task_object())[0]
    assert [r["answer"] for r in rows] == [a.answer for a in answer_inputs_ref(model, tokenizer, selected, inputs)]
    zero = answer_inputs_ref(model, tokenizer, selected.zero_shot(), inputs)
    assert [r["zero_shot"]["answer"] for r in rows] == [a.answer for a in zero]
    # a rerun answers nothing and says so
    assert main(["answer", str(files["sel"]), str(few), "--out", str(out), "--batch", "5", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["answered_now"] == 0 and again["answered_before"] == 12
    # inputs without labels: answers only
    unlabelled = write_jsonl(tmp_path / "nolabel.jsonl", [{"text": r["text"]} for r in
                                                          map(json.loads, few.read_text().splitlines())])
    assert main(["answer", str(files["sel"]), str(unlabelled), "--out", str(tmp_path / "nl"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "accuracy" not in summary
    rows_nl = [json.loads(line) for line in (tmp_path / "nl" / "predictions.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in rows_nl] == [r["answer"] for r in rows] and rows_nl[0]["correct"] is None


def test_per_query_retrieval_saves_each_input_s_demonstrations(files, tmp_path, capsys, tiny):
    few = small_inputs(files, tmp_path, n=6)
    out = tmp_path / "bm25"
    assert main(["answer", str(files["sel"]), str(few), "--out", str(out), "--per-query", "bm25", "--k", "2"]) == 0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    selected = SelectedPrompt.load(files["sel"])
    pool = selected.pool_examples()
    inputs = read_inputs(few, selected.task_object())[0]
    assert [r["pool_indices"] for r in rows] == bm25_prompts(pool, inputs, 2)
    assert all(r["demonstrations"] == [pool[i].id for i in r["pool_indices"]] for r in rows)
    model, tokenizer = tiny
    for row, q in zip(rows, inputs):  # each input answered after its own prompt, encoded whole
        own = SelectedPrompt.from_pool(pool, row["pool_indices"], model="tiny-llama", task=selected.task_object(),
                                       method="bm25")
        assert row["answer"] == answer_inputs_ref(model, tokenizer, own, [q])[0].answer


def test_bad_inputs_get_errors_that_name_them(files, tmp_path, capsys):
    out = tmp_path / "out"
    few = small_inputs(files, tmp_path)
    renamed = small_inputs(files, tmp_path, name="renamed.jsonl", text="review")
    cases = [
        (["answer", str(files["sel"]), str(renamed), "--out", str(out)],
         "missing field 'text' (fields present: review, label); pass input_field="),
        (["answer", str(files["sel"]), str(write_jsonl(tmp_path / "empty.jsonl", [{"text": "a", "label": "yes"},
                                                                                 {"text": " ", "label": "no"}])),
          "--out", str(out)], "line 2: field 'text' is ' '; expected a non-empty string or number; pass --skip-empty"),
        (["answer", str(files["sel"]), str(write_jsonl(tmp_path / "mixed.jsonl", [{"text": "a", "label": "yes"},
                                                                                 {"text": "b"}])),
          "--out", str(out)], "line 2: no field 'label' while line 1 has one"),
        (["answer", str(files["sel"]), str(write_jsonl(tmp_path / "wrong.jsonl", [{"text": "a", "label": "maybe"}])),
          "--out", str(out)], "label 'maybe' is not one of no, yes"),
        (["answer", str(tmp_path), str(few), "--out", str(out)], "is not a selection: expected selection.json"),
        (["answer", str(files["sel"]), str(few), "--out", str(out), "--model", "tiny-qwen2"],
         "model 'tiny-qwen2' differs from 'tiny-llama', the model selection"),
        (["answer", str(files["sel"]), str(few), "--out", str(out), "--k", "2"], "--k 2 sets the demonstrations"),
        (["answer", str(files["sel"]), str(few), "--out", str(out), "-o", "size=3"], "-o size: the inputs file takes"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err
    assert main(["answer", str(files["sel"]), str(renamed), "--out", str(tmp_path / "renamed"), "-o",
                 "input_field=review", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"] == 12
    skipped = write_jsonl(tmp_path / "skip.jsonl", [{"text": "a", "label": "yes"}, {"text": "", "label": "no"}])
    assert main(["answer", str(files["sel"]), str(skipped), "--out", str(tmp_path / "sk"), "--skip-empty"]) == 0
    assert "skipped 1 row with an empty text or label (line 2)" in capsys.readouterr().err


def test_compressed_prefix_is_refused_without_a_passed_verdict_unless_forced(files, tmp_path, capsys):
    torch.manual_seed(0)
    comp = tmp_path / "comp"
    SSMCompressor(SSMCompressorConfig.for_teacher(tiny_model("llama").config, state_size=16, num_virtual=4,
                                                  num_sink=2, latent_size=8)).save_pretrained(comp)
    few = small_inputs(files, tmp_path, n=4)
    argv = ["answer", str(files["sel"]), str(few), "--out", str(tmp_path / "c"), "--cache", "compressed",
            "--compressor", str(comp)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"compressor {comp}: fidelity verdict not measured" in err and "--force to answer from it anyway" in err
    assert main([*argv, "--force", "--json"]) == 0
    assert "used because --force was given" in capsys.readouterr().err
    assert main(["answer", str(files["sel"]), str(few), "--out", str(tmp_path / "n"), "--cache", "compressed"]) == 2
    assert "read none and none is shipped for tiny-llama" in capsys.readouterr().err


def test_a_partial_file_continues_only_with_the_settings_that_made_it(files, tmp_path, capsys):
    few = small_inputs(files, tmp_path, n=10)
    out = tmp_path / "out"
    assert main(["answer", str(files["sel"]), str(few), "--out", str(out), "--batch", "4"]) == 0
    capsys.readouterr()
    whole = (out / "predictions.jsonl").read_text()
    settings = json.loads((out / "answer_settings.json").read_text())
    # a run stopped after one batch and a half-written line: the rerun answers the rest only
    lines = whole.splitlines(keepends=True)
    header = json.dumps({"header": "icl-ssm answer: partial predictions", "settings": settings}) + "\n"
    (out / "predictions.jsonl").unlink()
    (out / PARTIAL).write_text(header + "".join(lines[:4]) + lines[4][:20])
    assert main(["answer", str(files["sel"]), str(few), "--out", str(out), "--batch", "4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["answered_before"] == 4 and summary["answered_now"] == 6
    assert (out / "predictions.jsonl").read_text() == whole and not (out / PARTIAL).exists()
    # the same partial file, rerun with other settings: refused, naming what differs
    (out / "predictions.jsonl").unlink()
    (out / PARTIAL).write_text(header + "".join(lines[:4]))
    assert main(["answer", str(files["sel"]), str(few), "--out", str(out), "--no-zero-shot"]) == 2
    err = capsys.readouterr().err
    assert f"{out / PARTIAL} was made with other settings (zero_shot: true then, false now)" in err
    other = small_inputs(files, tmp_path, n=9, name="nine.jsonl")
    assert main(["answer", str(files["sel"]), str(other), "--out", str(out)]) == 2
    assert "was made with other settings (inputs: " in capsys.readouterr().err
    with pytest.raises(ValueError, match="line 3: not a prediction"):
        (out / PARTIAL).write_text(header + lines[0] + "nonsense\n" + lines[1])
        PredictionsFile(out, settings).resume()


def test_sigterm_halfway_then_rerun_answers_the_rest_and_equals_an_uninterrupted_run(files, tmp_path):
    """The command in a subprocess over 1,000 inputs, stopped by SIGTERM once the partial file
    holds some batches; the rerun answers only the rest, and its predictions.jsonl is byte for
    byte an uninterrupted run's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = tmp_path / "stopped"
    argv = [sys.executable, "-m", "icl_ssm", "answer", str(files["sel"]), str(files["inputs"]), "--out", str(out),
            "--batch", "8", "--no-zero-shot", "--json"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = out / PARTIAL
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if partial.is_file() and partial.read_text().count("\n") > 1 + 8 * 5:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be stopped; use more inputs"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "icl-ssm answer: interrupted" in err
    kept = partial.read_text().count("\n") - 1
    assert 0 < kept < 1000 and kept % 8 == 0 and not (out / "predictions.jsonl").exists()
    rerun = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["answered_before"] == kept and summary["answered_now"] == 1000 - kept
    whole = tmp_path / "whole"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the subprocesses ran, so that the floats are the same to the bit
    try:
        assert main([*argv[3:-1], "--out", str(whole)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert (out / "predictions.jsonl").read_text() == (whole / "predictions.jsonl").read_text()


# ---------------------------------------------------------------------- calibrated selections

def calibrated_selection(files, tmp_path, bias=(-1.5, 1.5), method="batch"):
    """The module's selection with a calibration saved in its selection.json."""
    from icl_ssm.calibrate import Calibration

    selected = SelectedPrompt.load(files["sel"])
    labels = selected.task_object().labels
    selected.calibration = Calibration(method, tuple(labels), tuple(bias), 64, "a test's bias")
    out = tmp_path / "calibrated"
    selected.save(out)
    return SelectedPrompt.load(out), out


def test_a_calibrated_selection_answers_as_the_re_encoded_prompt_with_the_same_bias(files, tmp_path, tiny):
    """The shared prefix with the saved bias against the reference (every prompt re-encoded, the
    same bias applied by hand): the same answers, the raw scores kept beside."""
    model, tokenizer = tiny
    task = SelectedPrompt.load(files["sel"]).task_object()
    inputs = read_inputs(small_inputs(files, tmp_path, n=20), task)[0]
    raw = answer_inputs_ref(model, tokenizer, SelectedPrompt.load(files["sel"]), inputs)
    logp = torch.log_softmax(torch.tensor([[a.scores[y] for y in task.labels] for a in raw], dtype=torch.float64), -1)
    bias = logp.mean(0)  # the inputs' own mean: it moves some answers whichever way the prompt leans
    selected, _ = calibrated_selection(files, tmp_path, bias=tuple(bias.tolist()))
    assert selected.calibration.bias == tuple(bias.tolist())
    fast = answer_inputs(model, tokenizer, selected, inputs, batch=6)
    by_hand = [task.labels[i] for i in (logp - bias).argmax(-1).tolist()]
    assert [a.answer for a in fast] == by_hand == [a.answer for a in answer_inputs_ref(model, tokenizer, selected,
                                                                                        inputs)]
    assert [a.raw_answer for a in fast] == [a.answer for a in raw]
    assert by_hand != [a.answer for a in raw]  # the bias moved some answers: the test can fail
    assert all(abs(a.scores[y] - b.scores[y]) < 1e-4 for a, b in zip(fast, raw) for y in task.labels)
    assert all(a.raw_correct == float(a.raw_answer == q.target) for a, q in zip(fast, inputs))


def test_answer_applies_the_saved_calibration_and_calibrate_overrides_it(files, tmp_path, capsys, tiny):
    selected, sel = calibrated_selection(files, tmp_path)
    few = small_inputs(files, tmp_path, n=12)
    assert main(["answer", str(sel), str(few), "--out", str(tmp_path / "cal"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in (tmp_path / "cal" / "predictions.jsonl").read_text().splitlines()]
    assert {"calibrated_scores", "raw_answer", "raw_correct"} <= set(rows[0])
    assert summary["calibration"]["prompt"]["bias"] == [-1.5, 1.5]
    assert summary["raw_accuracy"]["mean"] == pytest.approx(np.mean([r["raw_correct"] for r in rows]))
    assert main(["answer", str(sel), str(few), "--out", str(tmp_path / "raw"), "--calibrate", "none", "--json"]) == 0
    capsys.readouterr()
    raw = [json.loads(line) for line in (tmp_path / "raw" / "predictions.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in raw] == [r["raw_answer"] for r in rows] and "calibrated_scores" not in raw[0]
    # batch calibration on the inputs needs enough of them, and fitted reads labels: both refused by name
    assert main(["answer", str(sel), str(few), "--out", str(tmp_path / "b"), "--calibrate", "batch"]) == 2
    assert "needs at least 32 of them" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["answer", str(sel), str(few), "--out", str(tmp_path / "f"), "--calibrate", "fitted"])
    assert "invalid choice: 'fitted'" in capsys.readouterr().err


def test_batch_calibration_on_the_inputs_resumes_byte_identical(files, tmp_path, capsys, tiny):
    """--calibrate batch estimates its bias on the file's first inputs whichever were answered
    before: a run stopped after two batches and continued writes an uninterrupted run's file."""
    model, tokenizer = tiny
    _, sel = calibrated_selection(files, tmp_path)
    many = small_inputs(files, tmp_path, n=40, name="forty.jsonl")
    out = tmp_path / "whole"
    assert main(["answer", str(sel), str(many), "--out", str(out), "--batch", "8", "--calibrate", "batch",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["calibration"]["prompt"]["method"] == "batch" and summary["calibration"]["prompt"]["inputs"] == 40
    assert summary["calibration"]["zero_shot"]["method"] == "batch"
    whole = (out / "predictions.jsonl").read_text()
    lines = whole.splitlines(keepends=True)
    settings = json.loads((out / "answer_settings.json").read_text())
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    header = json.dumps({"header": "icl-ssm answer: partial predictions", "settings": settings}) + "\n"
    (stopped / PARTIAL).write_text(header + "".join(lines[:16]))
    assert main(["answer", str(sel), str(many), "--out", str(stopped), "--batch", "8", "--calibrate", "batch",
                 "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["answered_before"] == 16 and again["answered_now"] == 24
    assert (stopped / "predictions.jsonl").read_text() == whole
    # the bias is the mean label log-probability of the inputs under the prompt
    from icl_ssm.apply.answer import answer_calibration

    selected = SelectedPrompt.load(sel)
    inputs = read_inputs(many, selected.task_object())[0]
    cal = answer_calibration(model, tokenizer, selected, "batch", inputs, batch=8)
    raw = answer_inputs(model, tokenizer, selected, inputs, calibration=None)
    logp = torch.log_softmax(torch.tensor([[a.scores[y] for y in selected.task_object().labels] for a in raw],
                                          dtype=torch.float64), -1).mean(0)
    assert cal.bias[1] - cal.bias[0] == pytest.approx(float(logp[1] - logp[0]), abs=1e-6)
    assert summary["calibration"]["prompt"]["bias"] == pytest.approx(list(cal.bias), abs=1e-9)


def test_select_calibrate_batch_saves_the_bias_answer_applies(files, tmp_path, capsys, tiny):
    sel = tmp_path / "sel-cal"
    assert main(["select", "--model", "tiny-llama", "--task", str(files["data"]), "--k", "3", "--pool-size", "24",
                 "--queries", "6", "--test-size", "6", "--method", "random", "--calibrate", "batch", "--out",
                 str(sel)]) == 0
    err = capsys.readouterr().err
    assert "calibration batch (saved in selection.json; the mean label log-probability over 6 unlabelled inputs)" in err
    selected = SelectedPrompt.load(sel)
    assert selected.calibration.method == "batch" and selected.calibration.inputs == 6
    with pytest.raises(SystemExit):
        main(["select", "--task", str(files["data"]), "--method", "random", "--calibrate", "magic"])
    capsys.readouterr()
    assert main(["select", "--model", "tiny-llama", "--task", str(files["data"]), "--k", "3", "--pool-size", "24",
                 "--method", "random", "--calibrate", "search", "--out", str(tmp_path / "x")]) == 2
    assert "--calibrate search pairs every searched prompt" in capsys.readouterr().err


def test_a_full_disk_mid_answer_names_the_file_keeps_whole_lines_and_the_rerun_completes(files, tmp_path, capsys,
                                                                                        monkeypatch):
    """The disk fills on the third batch: one error naming the partial file and the reason, the
    lines before it kept whole, no predictions.jsonl; the same command once there is room again
    writes what an uninterrupted run writes."""
    import errno

    inputs = small_inputs(files, tmp_path, n=40, name="forty.jsonl")
    argv = ["answer", str(files["sel"]), str(inputs), "--batch", "8", "--no-zero-shot"]
    real, calls = os.fsync, {"n": 0}

    def full(fd):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    out = tmp_path / "full"
    monkeypatch.setattr(os, "fsync", full)
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {str(out / PARTIAL)!r}: No space left on device" in err and "Traceback" not in err
    assert "whole lines written before are kept" in err
    lines = (out / PARTIAL).read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") and json.loads(line) for line in lines) and not (out / "predictions.jsonl").exists()
    monkeypatch.setattr(os, "fsync", real)
    assert main([*argv, "--out", str(out)]) == 0
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    assert (out / "predictions.jsonl").read_text() == (tmp_path / "whole" / "predictions.jsonl").read_text()


def test_an_unwritable_out_is_refused_naming_the_file_and_the_previous_outputs_stay(files, tmp_path, capsys,
                                                                                   monkeypatch):
    """A read-only (or full) directory when the final files are renamed into place: the error names
    the file, and the predictions of the run before are byte for byte as they were."""
    import errno
    import tempfile

    inputs = small_inputs(files, tmp_path, n=8, name="eight.jsonl")
    out = tmp_path / "ro"
    argv = ["answer", str(files["sel"]), str(inputs), "--out", str(out), "--no-zero-shot"]
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")}
    (out / "predictions.jsonl").unlink()  # answer again: its final files must be written anew
    before.pop("predictions.jsonl")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and "Read-only file system" in err and str(out) in err
    after = {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")}
    assert {k: v for k, v in after.items() if k in before} == before
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_ids_from_a_users_file_never_steer_where_a_file_is_written(tmp_path, tmp_cache):
    """A task file and an inputs file whose ids are paths (``../``, absolute, nested, NUL): select
    and answer write only into their --out folders and the cache, under names of their own."""
    hostile = ["../../escape", "/tmp/absolute-escape", "nested/dir/x", "..", ".", "x\x00y", "~/home-escape",
               "C:\\windows\\escape", "sel/../../up"]
    coin = get_task("coin_flip", size=60).examples()
    rows = [{"id": hostile[i] if i < len(hostile) else f"plain-{i}", "text": e.input, "label": e.target}
            for i, e in enumerate(coin)]
    work = tmp_path / "work"
    work.mkdir()
    data = write_jsonl(work / "hostile.jsonl", rows)
    inputs = write_jsonl(work / "inputs.jsonl", rows[:12])
    before = {p for p in tmp_path.parent.rglob("*")}
    sel, out = work / "sel", work / "answers"
    assert main(["select", "--model", "tiny-llama", "--task", str(data), "-o", "id_field=id", "--k", "3",
                 "--pool-size", "24", "--queries", "3", "--test-size", "6", "--method", "bm25", "--out", str(sel)]) == 0
    assert main(["answer", str(sel), str(inputs), "--out", str(out)]) == 0
    written = {p for p in tmp_path.parent.rglob("*")} - before
    allowed = (sel, out, Path(tmp_cache))
    assert all(any(p == a or a in p.parents for a in allowed) for p in written), sorted(map(str, written))
    names = {p.name for p in written}
    assert not any(part in name for name in names for part in ("escape", "nested", "absolute", "\x00")), names
    assert not (tmp_path.parent / "escape").exists() and not Path("/tmp/absolute-escape").exists()
    selected = json.loads((sel / "selection.json").read_text())
    assert {d["id"] for d in selected["demonstrations"]} <= {r["id"] for r in rows}


def test_the_dense_cache_has_one_name_and_the_earlier_one_still_reads():
    """``--cache dense`` (the default) is the dense prompt's own K/V; ``exact``, its earlier name,
    reads as ``dense``; anything else is refused with the accepted names."""
    import argparse

    from icl_ssm.apply.answer import CACHES, cache_kind
    from icl_ssm.apply.answer_file import AnswerConfig
    from icl_ssm.cli.answer import cache_name

    assert CACHES == ("dense", "compressed") and AnswerConfig().cache == "dense"
    assert AnswerConfig(cache="exact").cache == "dense"
    assert cache_name("exact") == cache_name("dense") == "dense" and cache_name("compressed") == "compressed"
    with pytest.raises(argparse.ArgumentTypeError, match="'full'; accepted: dense, compressed"):
        cache_name("full")
    with pytest.raises(ValueError, match="cache='full'; accepted: dense, compressed"):
        cache_kind("full")


def test_predictions_written_under_the_dense_cache_s_earlier_name_resume(tmp_path):
    """An answer directory whose settings say cache 'exact' (the earlier name) continues under
    'dense'; any other difference is still refused."""
    settings = {"selection": "s", "cache": "dense", "model": "m"}
    old = PredictionsFile(tmp_path, {**settings, "cache": "exact"})
    old.append([{"id": "a", "prediction": "x"}])
    old.close()
    rows, finished = PredictionsFile(tmp_path, settings).resume()
    assert [r["id"] for r in rows] == ["a"] and not finished
    with pytest.raises(ValueError, match="model"):
        PredictionsFile(tmp_path, {**settings, "model": "other"}).resume()

"""``icl-ssm run`` end to end on a tiny random model and a generated task (no download)."""

import json
from pathlib import Path

import numpy as np
import pytest

from icl_ssm.cli import main
from icl_ssm.data.tasks import get_task
from icl_ssm.pipeline import RunConfig, run_splits

SHAPE = ["--state-size", "16", "--num-virtual", "4", "--num-sink", "2", "--latent-size", "8"]


@pytest.fixture
def data(tmp_path):
    task = get_task("coin_flip", size=120)
    path = tmp_path / "coin.jsonl"
    path.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    return str(path)


def pool_of(data, methods=("affinity", "random", "bm25", "topk")):
    return run_splits(RunConfig(task=data, pool_size=24, k=3, queries=3, methods=methods)).pool


def run_args(data, out, *extra, distill=True):
    return ["run", "--model", "tiny-llama", "--task", data, "--k", "3", "--out", str(out), *SHAPE,
            "--distill-samples", "8", "--pool-size", "24", "--queries", "3", "--test-size", "6",
            "--fidelity-subsets", "4", "--fidelity-queries", "2", "--subsets", "8", "--batch", "4",
            *(["--distill"] if distill else []), *extra]


def test_run_writes_every_report_file_and_a_rerun_skips_finished_stages(data, tmp_path, tmp_cache, capsys):
    out = tmp_path / "run"
    assert main(run_args(data, out, "--evaluator", "compressed", "--methods", "affinity", "random", "bm25", "topk",
                         "--equal-cost", "--test-orders", "2")) == 0
    report = json.loads((out / "report.json").read_text())
    verdict = report["fidelity_verdict"]
    assert verdict["evaluator"] == "compressed" and verdict["verdict"] in ("compressed", "dense")
    assert len(verdict["checks"]) == 4
    failed_warning = "Warning: affinity selected on compressed caches that failed the fidelity verdict"
    assert (failed_warning in (out / "report.md").read_text()) == (verdict["verdict"] == "dense")
    assert report["compressor"]["source"] == "distilled"
    seconds = report["stage_seconds"]  # each stage's wall seconds, as stored beside its result
    assert {"compressor", "fidelity", "select-affinity", "check"} <= set(seconds) and min(seconds.values()) >= 0
    assert (out / "compressor" / "model.safetensors").exists()
    shape = json.loads((out / "compressor" / "config.json").read_text())
    assert shape["gate"] and shape["num_recent"] == 16  # the distilled default is the gated hybrid
    methods = [r["method"] for r in report["selections"]]
    assert methods == ["affinity", "affinity (dense)", "affinity (dense's time)", "random", "bm25", "topk",
                       "zero-shot"]
    assert report["selections"][-1]["test_accuracy"] == report["check"]["zero_shot_test_accuracy"]
    equal = json.loads((out / "stages" / "select-affinity-equal-cost.json").read_text())["result"]
    dense = json.loads((out / "stages" / "select-affinity-dense.json").read_text())["result"]
    assert equal["budget"]["budget_seconds"] == pytest.approx(dense["wall_seconds"])
    # its queries: the 3 selection's and what the 64 of the check leave of the 12 validation examples (none)
    assert equal["evaluator"] == "compressed" and equal["validation_size"] == equal["budget"]["queries"] == 3
    assert "Reliability (losses / scores)" in (out / "report.md").read_text()
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in report["selections"])
    assert report["fidelity"]["subsets"] == 4 and "subset_loss_spearman" in report["fidelity"]
    md = (out / "report.md").read_text()
    assert "affinity" in md and "bm25" in md and "accuracy.png" in md
    for png in ("accuracy.png", "cost.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [json.loads(x) for x in (out / "selected.jsonl").read_text().splitlines()]
    assert len({r["id"] for r in rows}) == 3 and report["picks"]["affinity"] == report["selections"][0]["indices"]
    assert [r["id"] for r in rows] == [pool_of(data)[i].id for i in report["handed_over"]["indices"]]
    assert len(rows) == 3 and all(r["text"] in (out / "prompt.txt").read_text() for r in rows)
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "stages").iterdir()}
    capsys.readouterr()
    assert main(run_args(data, out, "--evaluator", "compressed", "--methods", "affinity", "random", "bm25", "topk",
                         "--equal-cost", "--test-orders", "2")) == 0
    err = capsys.readouterr().err
    assert "fidelity: done before, skipped" in err and "select topk: done before, skipped" in err
    assert "distilling" not in err
    assert {p.name: p.stat().st_mtime_ns for p in (out / "stages").iterdir()} == stamps
    assert json.loads((out / "report.json").read_text())["selections"] == report["selections"]
    # the same run with every method's places shared out over the labels, in interleaved order
    assert main(run_args(data, out, "--per-label", "--order", "interleave", "--methods", "random", "bm25",
                         "--evaluator", "compressed")) == 0
    err = capsys.readouterr().err  # the compressor distilled before; no method here reads its fidelity
    assert "distilling" not in err and "compressor is not used and its fidelity not measured" in err
    pool = pool_of(data, ("random", "bm25"))
    for r in json.loads((out / "report.json").read_text())["selections"][:-1]:  # the last row: zero-shot
        assert {pool[i].target for i in r["indices"]} == {"yes", "no"}
        summary = json.loads((out / "stages" / f"select-{r['method']}.json").read_text())["result"]
        assert summary["per_label"] is True and summary["order"] == "interleave"
    # affinity's subsets drawn with the labels in even shares; the baselines unchanged
    assert main(run_args(data, out, "--stratify", "--subsets", "30", "--methods", "affinity", "random",
                         "--no-dense-evaluator", "--evaluator", "compressed")) == 0
    capsys.readouterr()
    affinity = json.loads((out / "stages" / "select-affinity.json").read_text())["result"]
    assert affinity["stratified"] is True and sorted(affinity["labels"].values()) == [1, 2]
    assert json.loads((out / "stages" / "select-random.json").read_text())["result"]["stratified"] is False


def test_without_a_compressor_run_selects_on_dense_caches_and_searches_without_a_screen(data, tmp_path, tmp_cache,
                                                                                      capsys):
    out = tmp_path / "plain"
    args = ["run", "--model", "tiny-llama", "--task", data, "--k", "3", "--out", str(out), "--pool-size", "24",
            "--queries", "3", "--test-size", "6", "--check-size", "5", "--random-prompts", "3", "--methods",
            "search", "affinity", "random", "--search-minutes", "0.1", "--screen-queries", "4",
            "--confirm-queries", "8"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "no compressor is shipped for tiny-llama" in err and "distilling" not in err
    report = json.loads((out / "report.json").read_text())
    assert report["compressor"]["source"] == "none" and report["fidelity"] is None
    assert report["fidelity_verdict"]["evaluator"] == "dense" and report["search"]["screen"] == "none"
    assert not (out / "compressor").exists() and "Not measured." in (out / "report.md").read_text()
    assert main([*args, "--evaluator", "compressed"]) == 2
    assert "--evaluator compressed needs a compressor" in capsys.readouterr().err


def test_run_refuses_bad_input(data, tmp_path, tmp_cache, capsys):
    (tmp_path / "file").write_text("x")
    assert main(run_args(data, tmp_path / "file")) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(run_args(data, tmp_path / "big", "--k", "30")) == 2
    assert "pool_size=24 is smaller than k=30" in capsys.readouterr().err
    assert main(run_args(data, tmp_path / "m", "--methods", "affinity", "oracle")) == 2
    assert "oracle" in capsys.readouterr().err


def test_the_fidelity_check_chooses_affinitys_evaluator(data, tmp_path, tmp_cache, capsys):
    out = tmp_path / "run"
    assert main(run_args(data, out, "--methods", "affinity", "random")) == 0  # --evaluator auto
    report = json.loads((out / "report.json").read_text())
    verdict, rows = report["fidelity_verdict"], report["selections"]
    assert verdict["evaluator"] == verdict["verdict"] and rows[0]["evaluator"] == verdict["verdict"]
    dense_row = [r["method"] for r in rows][:-1] == ["affinity", "affinity (dense)", "random"]
    assert dense_row == (verdict["verdict"] == "compressed")  # no second, identical dense run
    said = "The compressed caches are not faithful enough to the dense prompt"
    assert (said in (out / "report.md").read_text()) == (verdict["verdict"] == "dense")
    # forced: the reason says so, and the compressed-cache stage already run is not redone
    assert main(run_args(data, out, "--methods", "affinity", "random", "bridge", "--evaluator", "dense",
                         "--no-dense-evaluator")) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["selections"][0]["evaluator"] == "dense"
    bridge = next(r for r in report["selections"] if r["method"] == "bridge")  # BRIDGE follows the gate too
    assert bridge["evaluator"] == "dense" and len(bridge["indices"]) == len(report["selections"][0]["indices"])
    assert report["fidelity_verdict"]["reason"].startswith("--evaluator dense was asked for")
    assert "Affinity evaluator: dense, because --evaluator dense was asked for" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--evaluator 'window'; accepted: auto, compressed, dense"):
        RunConfig(evaluator="window").validate()


def ship_tiny_compressor(data: str, tmp_path, monkeypatch) -> Path:
    """A compressor and its control shipped for tiny-llama / ``data`` / k=3 on a temporary root."""
    import torch

    from icl_ssm.compress import pretrained as pretrained_mod
    from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
    from icl_ssm.lm.tiny import tiny_model

    shipped = tmp_path / "shipped" / "tiny--coin--k3"
    shape = dict(state_size=16, num_virtual=4, num_sink=2, latent_size=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for name, control in (("compressor", False), ("control", True)):
            config = SSMCompressorConfig.for_teacher(tiny_model("llama").config, control=control, **shape)
            SSMCompressor(config).save_pretrained(shipped / name)
    (shipped / "recipe.json").write_text(json.dumps({"model": "tiny-llama", "tasks": [data], "k": 3}))
    monkeypatch.setattr(pretrained_mod, "pretrained_root", lambda: tmp_path / "shipped")
    return shipped


def test_a_shipped_compressor_no_method_reads_is_not_measured(data, tmp_path, tmp_cache, monkeypatch, capsys):
    """Without affinity, BRIDGE or a compressed screen nothing reads the fidelity verdict: the run
    skips the fidelity stage, says so, and selects on dense caches; with affinity it measures it."""
    ship_tiny_compressor(data, tmp_path, monkeypatch)
    out = tmp_path / "run"
    assert main(run_args(data, out, "--methods", "random", "bm25", "--test-orders", "0", "--no-headroom",
                         distill=False)) == 0
    assert "compressor is not used and its fidelity not measured" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["compressor"]["source"] == "unused" and report["fidelity"] is None
    assert not (out / "stages" / "fidelity.json").exists()
    assert "fidelity was not measured" in report["fidelity_verdict"]["reason"]
    out = tmp_path / "run-affinity"
    assert main(run_args(data, out, "--methods", "affinity", "--no-dense-evaluator", "--test-orders", "0",
                         "--no-headroom", distill=False)) == 0
    assert (out / "stages" / "fidelity.json").exists()
    assert json.loads((out / "report.json").read_text())["compressor"]["source"] == "shipped"


def test_run_takes_the_shipped_compressor_and_its_accuracies_count_right_answers(data, tmp_path, tmp_cache,
                                                                                 monkeypatch, capsys):
    """The branch `make demo` takes (a compressor shipped for the model, task and k, with its
    control), on a tiny shipped root; every accuracy in the report is the share of test answers
    that an independent prediction from the whole prompt gets right."""
    from icl_ssm.lm.models import load_model
    from icl_ssm.lm.prompts import PromptBuilder
    from icl_ssm.lm.scoring import predict_labels

    shipped = ship_tiny_compressor(data, tmp_path, monkeypatch)
    out = tmp_path / "run"
    assert main(run_args(data, out, "--methods", "affinity", "random", "--no-dense-evaluator", "--evaluator",
                         "compressed", "--test-orders", "0", distill=False)) == 0
    assert "using the compressor shipped for tiny-llama" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["compressor"]["source"] == "shipped" and "distilling" not in str(report["compressor"])
    assert report["compressor"]["compressor"] == str(shipped / "compressor")
    assert "control_subset_loss_spearman" in report["fidelity"]  # the shipped control is measured beside it
    assert not (out / "compressor").exists()
    model, tokenizer = load_model("tiny-llama")
    task = get_task(data)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    splits = run_splits(RunConfig(task=data, pool_size=24, k=3, queries=3, test_size=6,
                                  methods=("affinity", "random")), task)
    test = splits.test[:6]
    for row in report["selections"]:
        demos = [splits.pool[i] for i in row["indices"]]
        pred = predict_labels(model, builder, [builder.build(demos, q) for q in test])
        assert row["test_accuracy"] == pytest.approx(np.mean([p == q.target for p, q in zip(pred, test, strict=True)]))


@pytest.mark.parametrize(("screen", "verdict", "compressor", "expected"), [
    (None, "compressed", "G", "none"),  # the default: no screen, whatever the verdict
    ("auto", "compressed", "G", "compressed"),
    ("auto", "dense", "G", "none"),
    ("auto", "dense", None, "none"),
    ("dense", "dense", None, "dense"),
])
def test_the_search_screens_nothing_by_default_and_auto_follows_the_verdict(screen, verdict, compressor, expected,
                                                                         capsys):
    from icl_ssm.pipeline import DEFAULT_SCREEN, search_config
    from icl_ssm.pipeline.evaluator import EvaluatorChoice
    from icl_ssm.select.config import SelectConfig

    cfg = RunConfig() if screen is None else RunConfig(screen=screen)
    got = search_config(cfg, SelectConfig(compressor=compressor), EvaluatorChoice(verdict, verdict, "test"),
                        {"bm25": {"indices": [1, 2]}})
    assert got.screen == expected and got.method == "search" and got.seeds == {"bm25": [1, 2]}
    assert DEFAULT_SCREEN == "none" and SelectConfig().screen == DEFAULT_SCREEN
    if screen is None:
        assert "search: no screen" in capsys.readouterr().err


@pytest.mark.parametrize("calibrate", ["search", "batch"])
def test_calibrate_hands_the_prompt_over_with_its_calibration_beside_calibrated_alternatives(
        data, tmp_path, tmp_cache, capsys, calibrate):
    """With --calibrate the search scores (prompt, calibration) pairs, the check weighs calibrated
    random prompts and zero-shot too, selection.json saves the handed-over prompt's calibration and
    the report splits the gain over a raw random prompt into calibration and selection."""
    out = tmp_path / "cal"
    args = ["run", "--model", "tiny-llama", "--task", data, "--k", "3", "--out", str(out), "--pool-size", "24",
            "--queries", "3", "--test-size", "6", "--check-size", "5", "--random-prompts", "3", "--methods",
            "search", "random", "--search-minutes", "0.1", "--screen-queries", "4", "--confirm-queries", "8",
            "--calibrate", calibrate]
    assert main(args) == 0
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    search = json.loads((out / "stages" / "select-search.json").read_text())["result"]
    assert search["calibrations"] == (["none", "batch"] if calibrate == "search" else ["batch"])
    assert search["calibration"] in search["calibrations"]
    check = report["check"]
    assert {"calibrated-random-0", "calibrated-random-2", "calibrated-zero-shot"} <= set(check["prompts"])
    assert all(r["calibration"].startswith("batch") for n, r in check["prompts"].items() if n.startswith("calib"))
    cal = check["calibrated"]
    assert cal["gain_over_random_raw"] == pytest.approx(cal["from_calibration"] + cal["from_selection"])
    assert all("calibrated_test_accuracy" in r for r in check["random"])
    handed = report["handed_over"]
    selection = json.loads((out / "selection.json").read_text())
    assert selection["calibration"] == handed["calibration"]
    if handed["name"] == "search":
        expected = search["calibration"]
        assert (selection["calibration"] or {"method": "none"})["method"] == expected
    assert handed["test_accuracy"] == cal["handed"] and "raw_test_accuracy" in handed
    md = (out / "report.md").read_text()
    assert (out / "calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "calibration.png" in md
    opening = md.split("\n## ")[0]
    assert "You get: " in opening and "calibration earns" in opening and "selection " in opening
    vs = handed["vs_calibrated_random"]
    assert vs["ci95"][0] <= vs["mean"] <= vs["ci95"][1] and "the mean batch-calibrated random prompt" in opening
    assert handed["shown_better_than_calibrated"] == (vs["ci95"][0] > 0)


def test_where_validation_cannot_rank_calibrated_prompts_run_hands_one_over_without_a_search(
        data, tmp_path, tmp_cache, capsys, monkeypatch):
    """The headroom rule (select/headroom.py) decides whether the search runs: forced to find no
    headroom, run skips the search and hands over a calibrated random prompt, and says why; with
    --no-headroom it searches."""
    import icl_ssm.pipeline.methods as pipeline  # where the headroom stage reads can_add

    out = tmp_path / "quick"
    args = ["run", "--model", "tiny-llama", "--task", data, "--k", "3", "--out", str(out), "--pool-size", "24",
            "--queries", "3", "--test-size", "6", "--check-size", "5", "--random-prompts", "3", "--methods",
            "search", "random", "--search-minutes", "0.1", "--screen-queries", "4", "--confirm-queries", "8",
            "--calibrate", "search"]
    monkeypatch.setattr(pipeline, "can_add", lambda room: pipeline_can_add(room, 2.0))  # no reliability reaches 2
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "selection is not shown to add anything measurable beyond calibration" in err
    report = json.loads((out / "report.json").read_text())
    assert "search" not in report["picks"] and report["preferred"] == "calibrated-random"
    assert report["headroom"]["search"] is False and len(report["headroom"]["prompts"]) == 8
    assert report["picks"]["calibrated-random"] == report["headroom"]["prompts"][0]
    assert "Headroom after calibration: " in (out / "report.md").read_text()
    if report["handed_over"]["name"] == "calibrated-random":
        assert json.loads((out / "selection.json").read_text())["calibration"]["method"] == "batch"
    assert main([*args, "--no-headroom", "--out", str(tmp_path / "searched")]) == 0
    assert "search" in json.loads((tmp_path / "searched" / "report.json").read_text())["picks"]


def pipeline_can_add(room, minimum):
    from icl_ssm.select.headroom import can_add

    return can_add(room, minimum)


def test_the_compressor_choice_reads_back_what_the_report_and_the_stage_store():
    """A run's compressor stage result is typed; the report and the stage file keep its dict,
    recipe and distill settings only where there are any."""
    from icl_ssm.pipeline.compressor import SOURCES, CompressorChoice

    none = CompressorChoice(None, None, "none")
    assert none.as_dict() == {"compressor": None, "control": None, "source": "none"} and none.load() is None
    shipped = CompressorChoice("c", "d", "shipped", recipe={"k": 20})
    assert shipped.as_dict() == {"compressor": "c", "control": "d", "source": "shipped", "recipe": {"k": 20}}
    assert CompressorChoice.from_dict(shipped.as_dict()) == shipped and set(SOURCES) >= {none.source, shipped.source}


def test_a_run_resolves_its_task_and_splits_once_and_refuses_a_k_above_the_pool(tmp_path):
    """pipeline.context.Run: the task and its splits made once (the stages read them from the run);
    a k larger than the pool is refused before any stage, with the pool it would take."""
    from dataclasses import replace

    from icl_ssm.pipeline import RunConfig
    from icl_ssm.pipeline.context import Run

    cfg = RunConfig(task="coin_flip", k=4, pool_size=20, test_size=10, task_options={"size": 400})
    run = Run.open(cfg, tmp_path)
    assert run.task.name == "coin_flip" and len(run.splits.pool) == 20 and len(run.test) == 10
    assert run.read == run.splits.validation[: max(cfg.queries, cfg.confirm_queries, cfg.screen_queries)]
    assert run.model is None and run.builder is None and run.classification
    with pytest.raises(ValueError, match=r"pool_size=20 is smaller than k=30; ask for a pool of at least 45"):
        Run.open(replace(cfg, k=30), tmp_path)

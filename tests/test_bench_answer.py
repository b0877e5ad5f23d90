"""``icl-ssm bench answer`` on a tiny random model: every path answers the same inputs, the
record holds rates, memory and agreement, and carries the provenance a published record needs."""

import importlib.util
from pathlib import Path

import pytest
import torch
from icl_ssm_bench.answer import AnswerBenchConfig, run_path, summarize, to_markdown

from icl_ssm.cli import build_parser
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.lm.tiny import tiny_model
from icl_ssm.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]


def test_every_path_answers_and_the_record_compares_them(tmp_path):
    torch.manual_seed(0)
    comp = tmp_path / "comp"
    SSMCompressor(SSMCompressorConfig.for_teacher(tiny_model("llama").config, state_size=16, num_virtual=4,
                                                  num_sink=2, latent_size=8)).save_pretrained(comp)
    cfg = AnswerBenchConfig(model="tiny-llama", task="coin_flip", task_options={"size": 200}, k=2, inputs=24,
                            reencode_inputs=16, batch=8, pool_size=20, compressor=str(comp), logit_check=4)
    threads = torch.get_num_threads()
    try:
        runs = {path: run_path(cfg, path) for path in cfg.paths}
    finally:
        torch.set_num_threads(threads)
    assert runs["reencode"]["inputs"] == 16 and runs["shared-exact"]["inputs"] == 24
    record = summarize(cfg, runs, provenance("icl-ssm bench answer"))
    agreement = record["agreement"]["shared-exact vs reencode"]
    assert agreement == {"inputs": 16, "identical_answers": 16, "max_abs_label_score_diff": agreement[
        "max_abs_label_score_diff"]} and agreement["max_abs_label_score_diff"] < 1e-4
    assert record["agreement"]["logit_check"]["max_abs_logit_diff"] < 1e-4
    assert record["targets"]["identical_answers"] and record["targets"]["max_abs_logit_diff_below_1e-4"]
    compressed = record["agreement"]["shared-compressed vs shared-exact"]
    assert compressed["inputs"] == 24 and 0 <= compressed["agreement_with_dense"] <= 1
    rows = {r["path"]: r for r in record["rows"]}
    assert rows["reencode"]["x_reencode"] == 1.0 and all(r["peak_rss_mib"] > 0 for r in rows.values())
    assert "| whole prompt re-encoded per input | 16 |" in to_markdown(record)
    spec = importlib.util.spec_from_file_location("claims", ROOT / "tools" / "claims.py")
    claims = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(claims)
    claims.validate_record("answer.json", record)  # command, commit, machine, date, torch, transformers


def test_the_command_parses_with_its_paths():
    args = build_parser().parse_args(["bench", "answer", "--paths", "shared-exact", "reencode", "--inputs", "10"])
    assert args.paths == ["shared-exact", "reencode"] and args.inputs == 10


def test_a_published_shape_is_measured_for_cost_only(tmp_path):
    cfg = AnswerBenchConfig(model="tiny-llama", shape="tiny-qwen2", task="coin_flip", task_options={"size": 200},
                            k=2, inputs=12, reencode_inputs=8, batch=4, pool_size=20, logit_check=4)
    cfg.validate()
    threads = torch.get_num_threads()
    try:
        runs = {path: run_path(cfg, path) for path in cfg.paths}
    finally:
        torch.set_num_threads(threads)
    assert runs["shared-compressed"]["compressor"] == "random, the recipe's shape"
    record = summarize(cfg, runs, provenance("icl-ssm bench answer --shape tiny-qwen2"))
    assert record["agreement"]["shared-exact vs reencode"]["identical_answers"] == 8
    assert record["agreement"]["logit_check"]["vocabulary"] == 2048  # the shape's, not the tiny model's
    assert "shared-compressed vs shared-exact" not in record["agreement"]  # random answers are not compared
    assert all("accuracy" not in r for r in record["rows"]) and "random" in record["random_weights"]
    assert "tiny-qwen2 shape (random weights" in to_markdown(record)


@pytest.mark.parametrize("bad, message", [(dict(shape="qwen9"), "accepted: smollm2-135m"),
                                          (dict(shape="tiny-qwen2", compressor="c"), "give one or the other")])
def test_a_shape_is_checked_before_anything_loads(bad, message):
    with pytest.raises(ValueError, match=message):
        AnswerBenchConfig(**bad).validate()

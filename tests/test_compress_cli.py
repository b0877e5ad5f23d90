
import json

import pytest
import torch

from icl_ssm.cli import main

DEMOS = [
    {"input": "a wonderful film", "target": "positive"},
    {"input": "dull and long", "target": "negative"},
    {"input": "great acting", "target": "positive"},
    {"input": "boring plot", "target": "negative"},
]


@pytest.fixture
def demos(tmp_path):
    path = tmp_path / "demos.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DEMOS) + "\n")
    return path


def run_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_dense_mode_matches_the_dense_prompt(capsys, demos):
    out = run_json(capsys, "compress", "--model", "tiny-llama", "--demos", str(demos),
                   "--query", "a great movie", "--dense", "--json")
    assert out["max_abs_logit_diff"] < 1e-3
    assert out["answer_compressed"] == out["answer_dense"]
    assert out["cache_tokens"] == out["prompt_tokens"]


def test_untrained_compressor_runs_and_reports_sizes(capsys, demos):
    out = run_json(capsys, "compress", "--model", "tiny-qwen2", "--demos", str(demos),
                   "--query", "a great movie", "--json")
    for key in ("sink_tokens", "virtual_tokens", "prompt_tokens", "compressor_params", "teacher_params",
                "param_fraction", "answer_compressed", "answer_dense", "max_abs_logit_diff"):
        assert key in out
    assert out["sink_tokens"] == 4 and out["virtual_tokens"] == 16 and out["cache_tokens"] == 20
    assert out["answer_compressed"] in ("positive", "negative")
    assert out["flops_compressed"] > 0 and out["flops_dense"] > 0


def test_trained_compressor_directory_is_used(capsys, demos, tmp_path):
    from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
    from icl_ssm.lm.tiny import tiny_model

    cfg = SSMCompressorConfig.for_teacher(tiny_model("llama").config, state_size=8, num_virtual=3,
                                          num_sink=1, latent_size=4)
    SSMCompressor(cfg).save_pretrained(tmp_path / "comp")
    out = run_json(capsys, "compress", "--model", "tiny-llama", "--demos", str(demos), "--query", "fun",
                   "--compressor", str(tmp_path / "comp"), "--json")
    assert out["mode"] == "trained" and out["cache_tokens"] == 4


def test_task_pool_demonstrations(capsys):
    out = run_json(capsys, "compress", "--model", "tiny-llama", "--task", "coin_flip", "--k", "3", "--exact", "--json")
    assert out["demonstrations"] == 3 and out["answer_dense"] in ("yes", "no")


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"input": "x", "target": "y"}\nnot json\n', r"demos.jsonl:2: not JSON"),
        ('{"input": "x"}\n', r"demos.jsonl:1: expected an object with \"input\" and \"target\""),
        ("\n\n", "has no demonstrations"),
    ],
)
def test_bad_demo_files(tmp_path, capsys, content, message):
    path = tmp_path / "demos.jsonl"
    path.write_text(content)
    assert main(["compress", "--model", "tiny-llama", "--demos", str(path), "--query", "q"]) == 2
    assert pytest.importorskip("re").search(message, capsys.readouterr().err)


def test_bad_arguments(capsys, demos):
    assert main(["compress", "--model", "tiny-llama", "--demos", str(demos), "--query", "q", "--exact",
                 "--compressor", "x"]) == 2
    assert "alternatives" in capsys.readouterr().err
    assert main(["compress", "--model", "tiny-llama", "--task", "coin_flip", "--k", "100000"]) == 2
    assert "k=100000" in capsys.readouterr().err
    assert main(["compress", "--model", "no-such-model", "--demos", str(demos), "--query", "q"]) == 2
    assert "smollm2-135m" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_compressed_cache_forward(capsys):
    """The real tier: fetch + convert SmolLM2-135M (cached after the first run), then answer
    from exact and compressed caches."""
    out = run_json(capsys, "compress", "--model", "smollm2-135m", "--task", "rotten_tomatoes", "--k", "4",
                   "--exact", "--json")
    assert out["max_abs_logit_diff"] < 1e-3 and out["answer_compressed"] == out["answer_dense"]
    out = run_json(capsys, "compress", "--model", "smollm2-135m", "--task", "rotten_tomatoes", "--k", "4", "--json")
    assert out["cache_tokens"] == 20 and out["param_fraction"] <= 0.10
    assert out["prompt_tokens"] > out["cache_tokens"]
    assert torch.isfinite(torch.tensor(out["max_abs_logit_diff"]))


def test_memory_is_measured_in_fresh_processes(capsys, demos):
    out = run_json(capsys, "compress", "--model", "tiny-llama", "--demos", str(demos), "--query", "q",
                   "--memory", "--json")
    assert out["peak_rss_dense_bytes"] >= out["peak_rss_baseline_bytes"] > 0
    assert out["peak_rss_compressed_bytes"] > 0


def test_measure_counts_flops_and_time():
    from icl_ssm.cost import Cost, measure

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with measure() as cost:
        a @ b
    assert cost.flops == 2 * 8 * 16 * 4 and cost.seconds > 0
    assert (cost + Cost(flops=1)).flops == cost.flops + 1

"""``icl-ssm bench scale`` on tiny shapes (seconds), the published shapes from their configs alone
(meta device, no memory), the projection against the counted FLOPs, refusals, the written files."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from icl_ssm_bench import scale, scale_report, shapes
from transformers import AutoModelForCausalLM

from icl_ssm.cli import main
from icl_ssm.cost import rss_peak, track_freed_memory
from icl_ssm.lm.prompts import PromptBuilder

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", [n for n, s in shapes.SHAPES.items() if s.published_params])
def test_shapes_have_their_published_sizes(name):
    params = shapes.parameter_count(shapes.meta_model(shapes.shape_config(name)))  # meta: no memory
    assert params == pytest.approx(shapes.SHAPES[name].published_params, rel=0.03)


def test_gemma_shape_slides_and_gets_a_window_compressor():
    config = shapes.shape_config("gemma-3-1b")
    assert shapes.window_of(config) == 512 and shapes.window_of(shapes.shape_config("qwen2.5-7b")) is None
    types = config.get_text_config().layer_types
    assert types.count("full_attention") == 4 and types.count("sliding_attention") == 22
    comps = shapes.compressor_shapes(config)
    assert comps["window"]["num_recent"] == 512 and comps["recipe"]["num_recent"] == 16
    assert (comps["paper"]["num_virtual"], comps["paper"]["num_sink"], comps["paper"]["num_recent"]) == (16, 4, 0)


def test_built_model_matches_one_built_on_the_cpu():
    config = shapes.shape_config("tiny-gemma3")
    built = shapes.build_model(config, seed=0)
    reference = AutoModelForCausalLM.from_config(config).eval()
    for (name, a), (_, b) in zip(built.named_buffers(), reference.named_buffers(), strict=True):
        assert torch.equal(a, b), name  # the rotary tables and scales that to_empty leaves empty
    logits = built(input_ids=torch.arange(40)[None]).logits
    assert torch.isfinite(logits).all() and not built.training
    assert all(not p.requires_grad for p in built.parameters())


def test_synthetic_prompts_have_the_lengths_asked():
    prompts = shapes.SyntheticPrompts(demo_tokens=20, query_tokens=9)
    builder = PromptBuilder(prompts.tokenizer(), shapes.SyntheticReviews())
    rng = np.random.default_rng(0)
    demos = prompts.examples(5, 20, rng, "d")
    (query,) = prompts.examples(1, 9, rng, "q")
    assert len(builder.build_prefix(demos).input_ids) == prompts.prompt_tokens(5)
    assert len(builder.build_suffix(query).input_ids) == 9
    assert all(len(ids) == 1 for ids in builder.label_ids())
    context = shapes.shape_config("qwen2.5-0.5b").max_position_embeddings
    assert prompts.prompt_tokens(prompts.max_k(context)) + 9 <= context < prompts.prompt_tokens(
        prompts.max_k(context) + 1) + 9
    cfg = scale.ScaleConfig(k=(20, "max"), max_prompt_tokens=1000)
    assert cfg.resolve_k(shapes.shape_config("qwen2.5-0.5b")) == [20, (1000 - 8) // 34]
    with pytest.raises(ValueError, match="at most"):
        scale.ScaleConfig(k=(5000,)).resolve_k(shapes.shape_config("smollm2-135m"))


def test_scale_on_tiny_shapes_counts_what_the_shape_projects(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["bench", "scale", "--shapes", "tiny-qwen2", "tiny-gemma3", "--k", "3", "7", "--per-query-max-k",
                 "3", "--no-memory", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert shapes.RANDOM_WEIGHTS in text and (out / "scale.md").read_text() == text.rstrip("\n")
    assert sorted(p.name for p in out.iterdir()) == ["scale.json", "scale.md"]  # nothing left half-written
    result = json.loads((out / "scale.json").read_text())
    assert result["provenance"]["command"].startswith("icl-ssm bench scale --shapes tiny-qwen2")
    assert all(result["provenance"][key] for key in ("date", "torch", "transformers", "machine"))
    qwen, gemma = result["shapes"]
    assert set(qwen["compressors"]) == {"recipe", "paper"}
    assert set(gemma["compressors"]) == {"recipe", "paper", "window"}
    assert gemma["compressors"]["window"]["cache_slots"] == 4 + 16 + 48
    for shape in (qwen, gemma):
        projected = {p["k"]: p for p in shape["projected"]}
        names = [r["evaluator"] for r in shape["rows"] if r["k"] == 3]
        assert names[:3] == ["dense-packed", "dense-lean-packed", "compressed"] and names[-1] == "dense-per-query"
        assert "dense-per-query" not in [r["evaluator"] for r in shape["rows"] if r["k"] == 7]
        for r in shape["rows"]:  # the projection from the shape is the counter's count
            assert r["flops_per_subset"] == pytest.approx(projected[r["k"]][r["evaluator"]], rel=1e-6), r
            assert r["seconds_per_subset"] > 0 and "peak_bytes" not in r
        assert {b["case"] for b in shape["builds"]} >= {"dense", "dense-lean", "compressed", "paper-compressed"}
        lean = {b["k"]: b["flops"] for b in shape["builds"] if b["case"] == "dense-lean"}
        full = {b["k"]: b["flops"] for b in shape["builds"] if b["case"] == "dense"}
        assert all(full[k] > lean[k] for k in full)  # the LM head over the prompt
        assert [d["k"] for d in shape["distill"]] == [3, 7] and all(d["flops"] > 0 for d in shape["distill"])
        saved = scale_report.savings(shape)
        assert len(saved) == 2 * len(shape["compressors"]) * 2 and all(s["gap"] > 0 for s in saved)
    assert "| tiny-gemma3 | 7 | 246 | window (68) | dense-packed |" in text


def test_scale_refuses_a_shape_that_would_not_fit(capsys):
    cfg = scale.ScaleConfig(shapes=("qwen2.5-0.5b",), k=(20,), max_memory_gib=0.5, distill=False)
    shape = scale.run_shape(cfg, "qwen2.5-0.5b", say=lambda line: None)
    assert shape["refused"].startswith("would not fit: qwen2.5-0.5b in float32 needs about 1.8 GiB of weights")
    assert "0.5 GiB were given (--max-memory-gib)" in shape["refused"] and "rows" not in shape
    assert shape["projected"][0]["dense-packed"] > shape["projected"][0]["compressed-packed"]
    assert main(["bench", "scale", "--shapes", "qwen2.5-0.5b", "--k", "20", "--max-memory-gib", "0.5"]) == 0
    assert "**qwen2.5-0.5b: refused**, would not fit" in capsys.readouterr().out


def test_scale_refuses_a_model_it_cannot_serve(monkeypatch):
    from icl_ssm.lm import support

    def refuse(config):
        raise support.UnsupportedModelError("model type 'gemma3_text' is not supported: sliding layers")

    monkeypatch.setattr(support, "validate_supported", refuse)
    cfg = scale.ScaleConfig(shapes=("tiny-gemma3",), k=(3,))
    shape = scale.run_shape(cfg, "tiny-gemma3", say=lambda line: None)
    assert shape["refused"].startswith("not served: model type 'gemma3_text'") and shape["projected"]
    assert "**tiny-gemma3: refused**, not served" in scale_report.scale_markdown(
        {"settings": scale.asdict(cfg), "threads": 1, "shapes": [shape]})


def test_projection_alone_needs_no_model():
    cfg = scale.ScaleConfig(shapes=("llama-3.1-8b",), k=(20,), project_only=True)
    (shape,) = scale.run_scale(cfg)["shapes"]
    p = shape["projected"][0]
    assert "rows" not in shape and p["prompt_tokens"] == 8 + 20 * 34
    assert p["dense-per-query"] > p["dense-packed"] > p["dense-lean-packed"] > p["compressed-packed"]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_rss_peak_sees_a_block_allocation():
    track_freed_memory()
    with rss_peak() as peak:
        x = torch.ones(64, 1024, 1024)  # 256 MiB, touched
        del x
    assert peak["peak_bytes"] - peak["start_bytes"] >= 200 * 1024**2


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux only")
def test_scale_measures_memory_on_the_cpu(tmp_path):
    cfg = scale.ScaleConfig(shapes=("tiny-qwen2",), k=(3,), per_query_max_k=None, distill=False)
    (shape,) = scale.run_scale(cfg)["shapes"]
    for row in shape["rows"] + shape["builds"]:
        assert row["peak_bytes"] >= row["working_bytes"] >= 0
    assert shape["weights_rss_bytes"] > shape["weights_bytes"]


def test_gpu_script_runs_on_the_cpu_with_tiny_shapes(tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "DTYPE": "float32", "SHAPES": "tiny-qwen2", "KS": "3 max",
           "MAX_PROMPT": "200", "EXTRA": "--no-memory --no-distill", "ICL_SSM": f"{sys.executable} -m icl_ssm",
           "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_scale.sh"), str(tmp_path / "gpu")], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "gpu" / "scale.json").read_text())
    assert result["shapes"][0]["k"] == [3, (200 - 8) // 34] and (tmp_path / "gpu" / "scale.md").is_file()
    env["DEVICE"] = "cuda"
    if not torch.cuda.is_available():
        done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_scale.sh"), str(tmp_path / "none")], env=env,
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 2 and "no CUDA device" in done.stderr

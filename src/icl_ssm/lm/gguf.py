"""GGUF files: their metadata, read without a tensor; a model refused from that metadata alone
when the KV compressor cannot serve it; and the one-time, atomic dequantisation into a cache
directory of plain safetensors that :func:`icl_ssm.lm.models.load_model` then reads."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
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

from icl_ssm.lm.hf import sliding_window
from icl_ssm.lm.support import SERVED, UnsupportedModelError, validate_supported

# written last into a converted directory; its absence means "not a finished conversion"
CONVERSION_MARKER = "icl_ssm_conversion.json"


CONVERSION_FORMAT = 1


LOCK_TIMEOUT_S = 30 * 60


# (path to a .gguf file) -> (model, tokenizer), dequantised, in float32
GgufLoader = Callable[[Path], "tuple[PreTrainedModel, PreTrainedTokenizerBase]"]


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
    ``general.architecture``: an architecture transformers cannot load from GGUF, a sliding
    window (:func:`declared_window`) that the config transformers reads from the file cannot
    carry (the model would attend past its window), and whatever :func:`validate_supported`
    refuses in that config. Returns that config, its window set to the file's
    (:func:`carry_window`).
    """
    path = Path(path)
    metadata = gguf_metadata(path)
    arch = metadata.get("general.architecture")
    if not arch:
        raise ValueError(f"{path}: the GGUF metadata has no general.architecture; expected a model file "
                         "written by llama.cpp or gguf-py")
    where = f"GGUF file {str(path)!r} (architecture {arch!r})"
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except ValueError as err:
        import transformers

        raise UnsupportedModelError(
            f"{where} is not supported: transformers {transformers.__version__} cannot load it from GGUF ({err}); "
            f"architectures it loads: {', '.join(_gguf_architectures()) or 'unknown'}. {SERVED}"
        ) from None
    if not carry_window(config, metadata):
        raise UnsupportedModelError(
            f"{where} is not supported: it uses sliding-window attention ({arch}.attention.sliding_window="
            f"{metadata.get(f'{arch}.attention.sliding_window')}, {arch}.context_length="
            f"{metadata.get(f'{arch}.context_length')}) but the config transformers reads from it "
            f"({type(config).__name__}) has no window, so every layer would attend past it. {SERVED}"
        )
    try:
        validate_supported(config)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(f"{where}: {err}") from None
    return config


def declared_window(metadata: dict[str, Any]) -> int | None:
    """The sliding window a GGUF file declares (``<arch>.attention.sliding_window``), None when it
    declares none or one that covers its whole context (``<arch>.context_length``)."""
    arch = metadata.get("general.architecture")
    window = metadata.get(f"{arch}.attention.sliding_window")
    context = metadata.get(f"{arch}.context_length")
    return int(window) if window and (context is None or window < context) else None


def carry_window(config: PretrainedConfig, metadata: dict[str, Any]) -> bool:
    """Give ``config`` the sliding window its GGUF file declares (:func:`declared_window`), in place.

    transformers does not read the window of every architecture from GGUF: a Mistral config
    takes its class default (4,096 tokens) whatever the file says, window or none, and a Phi-3
    config none. Where the config can hold a window (a ``sliding_window`` field), it is set to
    the file's (None where the file declares none); where it cannot and the file declares one,
    False: the model cannot be served as the file describes it."""
    text = config.get_text_config()
    want = declared_window(metadata)
    context = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    have = sliding_window(config)
    if have is not None and context is not None and have >= context:
        have = None  # a window that covers the context changes nothing
    if have == want:
        return True
    if "sliding_window" not in text.to_dict():
        return want is None
    if getattr(text, "layer_types", None) and want is not None and not any("sliding" in t for t in text.layer_types):
        return False  # every layer is declared full: a window would have no layer to apply to
    text.sliding_window = want
    if want is not None and getattr(text, "use_sliding_window", None) is False:
        text.use_sliding_window = True
    return True


def _gguf_architectures() -> list[str]:
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # the list moved: the refusal still names the architecture
        return []
    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def load_gguf(path: str | os.PathLike[str]) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantise a GGUF file with transformers (slow: ~20 s for SmolLM2-135M on 2 cores)."""
    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    carry_window(model.config, gguf_metadata(path))  # the window the file declares (validate_gguf checked it)
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

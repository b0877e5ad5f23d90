"""icl-ssm: demonstration selection with state space models distilled from a transformer.

The subpackages follow the data flow, each importing only from those before it:
``data`` (tasks, splits) -> ``lm`` (models, prompts, scoring) -> ``ssm`` (HiPPO, scans) ->
``compress`` (compressor, caches) -> ``distill`` (Algorithm 1) -> ``evaluate`` (fidelity) ->
``select`` (Algorithm 2 and the baselines) -> ``apply`` (answering inputs with a selection,
exporting it) -> ``pipeline`` / ``report``; the command line (``cli``) sits on top and no
library module imports it.

This module exports the user API, the entry point of every stage and the extension points
(:class:`Selector` with :func:`register_selector`, :class:`Task` with :func:`register_task`).
"""

from icl_ssm.apply.answer import Answer, answer_inputs
from icl_ssm.apply.export import export_selection
from icl_ssm.compress.builders import (
    CacheBuilder,
    CompressedCache,
    ControlCache,
    DenseCache,
    LMInfiniteCache,
    StreamingCache,
    WindowCache,
    cache_for,
)
from icl_ssm.compress.cache import PrefixCache, compress_demonstrations, compressed_cache, dense_cache, window_cache
from icl_ssm.compress.cache import (
    exact_cache as exact_cache,  # dense_cache's earlier name
)
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig, load_compressor
from icl_ssm.compress.generate import generate_with_prefix
from icl_ssm.compress.pretrained import find_pretrained, load_pretrained
from icl_ssm.data.splits import Splits, split
from icl_ssm.data.tasks import TASKS, Example, Task, get_task
from icl_ssm.data.tasks import register as register_task
from icl_ssm.distill.config import DistillConfig
from icl_ssm.distill.run import train_compressor
from icl_ssm.evaluate.fidelity import FidelityConfig, run_fidelity
from icl_ssm.lm.generation import generate_answers
from icl_ssm.lm.models import EMBEDDED_MODELS, load_model, model_info
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm.lm.prompts import Prompt, PromptBuilder
from icl_ssm.lm.scoring import answer_loss, predict_labels, score_labels
from icl_ssm.lm.support import validate_supported
from icl_ssm.pipeline import RunConfig, run_pipeline
from icl_ssm.select.affinity import AffinitySelector
from icl_ssm.select.base import SELECTORS, Selection, Selector
from icl_ssm.select.base import register as register_selector
from icl_ssm.select.config import SelectConfig
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm.select.selected import SelectedPrompt
from icl_ssm.select.stage import select_demonstrations
from icl_ssm.select.subset_losses import CacheEvaluator, SubsetEvaluator
from icl_ssm.ssm.layer import HiPPOSSM

__version__ = "0.1.0"

__all__ = [
    # models, tasks, prompts
    "EMBEDDED_MODELS", "load_model", "model_info", "validate_supported",
    "TASKS", "Task", "Example", "get_task", "split", "Splits", "register_task",
    "Prompt", "PromptBuilder", "score_labels", "predict_labels", "answer_loss", "generate_answers",
    # the state space model, the compressor and its caches
    "HiPPOSSM", "SSMCompressor", "SSMCompressorConfig", "load_compressor", "load_pretrained", "find_pretrained",
    "PrefixCache", "dense_cache", "compressed_cache", "window_cache", "compress_demonstrations",
    "forward_with_prefix", "generate_with_prefix",
    "CacheBuilder", "DenseCache", "CompressedCache", "ControlCache", "WindowCache", "StreamingCache",
    "LMInfiniteCache", "cache_for",
    # selection
    "SELECTORS", "Selector", "register_selector", "Selection", "AffinitySelector", "SubsetEvaluator",
    "CacheEvaluator", "evaluate_selection",
    # the stages' entry points
    "DistillConfig", "train_compressor", "FidelityConfig", "run_fidelity", "SelectConfig",
    "select_demonstrations", "RunConfig", "run_pipeline",
    # a selection saved, loaded, answered with and exported
    "SelectedPrompt", "answer_inputs", "Answer", "export_selection",
    "__version__",
]

"""icl-ssm: demonstration selection with state space models distilled from a transformer.

The modules follow the data flow: ``tasks`` -> ``prompts`` -> ``models`` (the teacher) ->
``hippo`` / ``scan`` / ``ssm`` -> ``compressor`` -> ``cache`` -> ``teacher`` -> ``distill`` ->
``fidelity`` -> ``selection`` / ``baselines`` -> ``report`` -> ``pipeline`` and the CLI.
"""

__version__ = "0.1.0"

from icl_ssm import baselines as _baselines  # noqa: F401  (registers bm25, topk, gradce in SELECTORS)
from icl_ssm.cache import (
    PrefixCache,
    compress_demonstrations,
    compressed_cache,
    exact_cache,
    forward_with_prefix,
    generate_with_prefix,
    window_cache,
)
from icl_ssm.compressor import SSMCompressor, SSMCompressorConfig, load_compressor, load_pretrained
from icl_ssm.models import EMBEDDED_MODELS, check_supported, load_model, model_info
from icl_ssm.prompts import Prompt, PromptBuilder, answer_loss, generate_answers, predict_labels, score_labels
from icl_ssm.scan import PowerCache, legs_scan, scan_fast
from icl_ssm.selection import SELECTORS, AffinitySelector, CacheEvaluator, Selection, evaluate_selection
from icl_ssm.ssm import HiPPOSSM
from icl_ssm.tasks import TASKS, Example, Task, get_task, split

__all__ = [
    "SELECTORS",
    "AffinitySelector",
    "CacheEvaluator",
    "EMBEDDED_MODELS",
    "TASKS",
    "Example",
    "HiPPOSSM",
    "PowerCache",
    "PrefixCache",
    "Prompt",
    "PromptBuilder",
    "Selection",
    "SSMCompressor",
    "SSMCompressorConfig",
    "Task",
    "__version__",
    "answer_loss",
    "check_supported",
    "compress_demonstrations",
    "compressed_cache",
    "evaluate_selection",
    "exact_cache",
    "forward_with_prefix",
    "generate_answers",
    "generate_with_prefix",
    "get_task",
    "legs_scan",
    "load_compressor",
    "load_pretrained",
    "load_model",
    "model_info",
    "predict_labels",
    "scan_fast",
    "score_labels",
    "split",
    "window_cache",
]

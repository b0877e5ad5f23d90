"""What the selection benchmarks share: the selection numbers of BENCHMARKS.md.

One module per ``icl-ssm bench`` subcommand:

* ``select-cost`` (:mod:`.select_cost`): FLOPs and wall seconds per subset of the three
  evaluators at several ``k``;
* ``select-quality`` (:mod:`.select_quality`): test accuracy of every method over tasks and seeds;
* ``estimators``, ``estimators-sim`` (:mod:`.estimators`): the selected set against the number of
  subsets, for the mean and ridge estimators and adaptive sampling;
* ``select-order`` (:mod:`.select_order`): earlier selections scored again in every prompt order;
* ``headroom`` (:mod:`.headroom`): what there is to select on a task.

Here: the model and compressor a run's flags name, and its progress lines on stderr.
"""

from __future__ import annotations

import sys

from icl_ssm.compress.compressor import load_compressor
from icl_ssm.lm.models import load_model


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load(model: str, compressor: str | None):
    """The model ``model`` names, its tokenizer, and the compressor in the directory ``compressor``
    (None: no compressor)."""
    lm, tokenizer = load_model(model)
    return lm, tokenizer, load_compressor(compressor, lm.config) if compressor else None

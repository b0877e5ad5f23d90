"""The BM25 baseline: candidates ranked by their summed BM25 score (``bm25s``) against the
validation queries."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from icl_ssm.cost import measure
from icl_ssm.data.tasks import Example
from icl_ssm.select.base import Selection, Selector, register, top_k, validate_selection_inputs


def load_bm25s():
    """``bm25s``, imported on first use: where JAX is installed, importing it runs a JAX op, and
    JAX's first op takes 75% of the GPU's memory unless told otherwise; neither should happen
    to a process that never asked for BM25 (a distillation run beside others on one GPU)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bm25s

    return bm25s


@register("bm25")
@dataclass
class BM25Selector(Selector):
    """BM25 (``bm25s``, English stopwords): a candidate's score is the mean BM25 score of its
    ``input`` text over the validation inputs taken as queries. Cost: wall seconds, 0 FLOPs."""

    k1: float = 1.5
    b: float = 0.75

    def scores(self, pool: Sequence[Example], validation: Sequence[Example]) -> np.ndarray:
        """(n,) float64: mean over the validation queries of each candidate's BM25 score."""
        bm25s = load_bm25s()
        corpus = bm25s.tokenize([e.input for e in pool], stopwords="en", return_ids=False, show_progress=False)
        queries = bm25s.tokenize([q.input for q in validation], stopwords="en", return_ids=False,
                                 show_progress=False)
        retriever = bm25s.BM25(k1=self.k1, b=self.b)
        retriever.index(corpus, show_progress=False)
        per_query = np.stack([retriever.get_scores(q) for q in queries])  # (V, n)
        return per_query.astype(np.float64).mean(0)

    def select(self, pool, validation, k, rng):
        validate_selection_inputs(pool, validation, k)
        with measure(None, count_flops=False) as cost:
            scores = self.scores(pool, validation)
        return Selection(self.name, top_k(scores, k), scores, cost)

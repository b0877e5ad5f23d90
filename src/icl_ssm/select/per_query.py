"""Retrieval per test input, as the paper and OpenICL run their BM25 and top-k baselines: every
test input gets the ``k`` candidates most similar to it, in its own prompt. The per-task
selectors (:mod:`~icl_ssm.select.bm25`, :mod:`~icl_ssm.select.topk`) choose one set for the
whole task from the validation queries instead.

Prompts put the most similar demonstration last, nearest the query (OpenICL's order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from icl_ssm.cost import measure
from icl_ssm.data.tasks import Example
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lm.scoring import predict_labels
from icl_ssm.select.bm25 import load_bm25s
from icl_ssm.select.topk import embed

PER_QUERY_METHODS = ("bm25", "topk")


def _nearest(scores: np.ndarray, k: int) -> list[list[int]]:
    """Each row's ``k`` highest-scored columns, ascending (the best last); ties by index."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [row[::-1].tolist() for row in order]


def bm25_prompts(pool: Sequence[Example], queries: Sequence[Example], k: int, k1: float = 1.5,
                 b: float = 0.75) -> list[list[int]]:
    """For every query, the ``k`` pool candidates of highest BM25 score against its input; a query with
    no BM25 token (stopwords and punctuation only) scores every candidate 0, so it gets the first ``k``."""
    bm25s = load_bm25s()
    corpus = bm25s.tokenize([e.input for e in pool], stopwords="en", return_ids=False, show_progress=False)
    tokens = bm25s.tokenize([q.input for q in queries], stopwords="en", return_ids=False, show_progress=False)
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(corpus, show_progress=False)
    empty = np.zeros(len(pool))  # bm25s.BM25.get_scores fails on an empty token list
    return _nearest(np.stack([retriever.get_scores(q) if q else empty for q in tokens]), k)


@torch.no_grad()
def topk_prompts(model: PreTrainedModel, builder: PromptBuilder, pool: Sequence[Example],
                 queries: Sequence[Example], k: int, batch: int = 16) -> tuple[list[list[int]], int]:
    """For every query, the ``k`` pool candidates whose embedding (:func:`~icl_ssm.select.topk.embed`)
    is most cosine-similar to its own; and the tokens embedded."""
    emb, tokens = embed(model, builder, [*pool, *queries], batch)
    emb = torch.nn.functional.normalize(emb, dim=-1)
    return _nearest((emb[len(pool):] @ emb[: len(pool)].T).double().cpu().numpy(), k), tokens


def per_query_selection(method: str, model: PreTrainedModel, builder: PromptBuilder, pool: Sequence[Example],
                        test: Sequence[Example], k: int, batch: int = 8) -> dict[str, Any]:
    """``method`` (``bm25`` or ``topk``) per test input: its prompts (pool indices per test
    input), the test accuracy of answering each input after its own prompt, and the cost of
    retrieval and of answering (FLOPs, seconds: every prompt is a dense prefill of its own)."""
    if method not in PER_QUERY_METHODS:
        raise ValueError(f"per-query method {method!r}; accepted: {', '.join(PER_QUERY_METHODS)}")
    if not 1 <= k <= len(pool):
        raise ValueError(f"k={k} demonstrations from a pool of {len(pool)}")
    with measure(model.device, count_flops=method == "topk") as retrieval:
        if method == "bm25":
            prompts, tokens = bm25_prompts(pool, test, k), 0
        else:
            prompts, tokens = topk_prompts(model, builder, pool, test, k)
    with torch.no_grad(), measure(model.device) as answering:
        full = [builder.build([pool[i] for i in p], q) for p, q in zip(prompts, test, strict=True)]
        pred = [label for start in range(0, len(full), batch)
                for label in predict_labels(model, builder, full[start: start + batch])]
    correct = [p == q.target for p, q in zip(pred, test, strict=True)]
    return {"method": f"{method} (per query)", "k": k, "prompts": prompts, "test_accuracy": float(np.mean(correct)),
            "correct": [float(c) for c in correct], "test_size": len(test), "flops": retrieval.flops,
            "wall_seconds": retrieval.seconds, "tokens": tokens, "answer_flops": answering.flops,
            "answer_seconds": answering.seconds}

"""Selection on the synthetic regression task with the language tasks' machinery: the pool and
queries as :class:`~icl_ssm.data.tasks.Example` handles (their ids index the arrays), a
:class:`~icl_ssm.select.evaluators.SubsetEvaluator` whose loss is the squared error of the
teacher's prediction after a subset's cache (dense, compressed or window), and the test error
of a chosen prompt. :class:`~icl_ssm.select.affinity.AffinitySelector` then runs unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from icl_ssm.compress.cache import PrefixCache, compressed_cache, dense_cache, forward_with_prefix, window_cache
from icl_ssm.compress.compressor import SSMCompressor
from icl_ssm.cost import Cost, measure
from icl_ssm.data.tasks import Example
from icl_ssm.select.evaluators import SubsetEvaluator, SubsetLosses
from icl_ssm_bench.synthetic.task import SelectionSplit
from icl_ssm_bench.synthetic.teacher import RegressionTeacher, prompt_values

REGRESSION_CACHES = ("dense", "compressed", "window")


def split_examples(split: SelectionSplit) -> tuple[list[Example], list[Example], list[Example]]:
    """Handles for the pool (``c<i>``), the validation (``v<j>``) and the test (``t<j>``)
    queries. Their target is one constant: no label carries the cluster."""
    def handles(prefix: str, n: int) -> list[Example]:
        return [Example(id=f"{prefix}{i}", input=f"{prefix}{i}", target="y") for i in range(n)]

    return handles("c", len(split.pool_x)), handles("v", len(split.valid_x)), handles("t", len(split.test_x))


def _rows(examples: Sequence[Example], prefix: str) -> np.ndarray:
    if any(not e.id.startswith(prefix) for e in examples):
        raise ValueError(f"expected handles from split_examples with ids {prefix}<i>")
    return np.array([int(e.id[len(prefix):]) for e in examples], dtype=np.int64)


def pool_prompts(split: SelectionSplit, index: np.ndarray | Sequence[Sequence[int]]) -> torch.Tensor:
    """Prompt tokens ``(S, 2k, d + 1)`` of the pool rows ``index: (S, k)``, in that order."""
    index = np.asarray(index)
    return prompt_values(split.pool_x[index], split.pool_y[index])


@dataclass
class RegressionEvaluator(SubsetEvaluator):
    """A subset's loss: the mean over the validation queries of the squared error of the
    teacher's prediction after the subset's prompt, read from a ``cache``: ``"dense"`` (the
    exact prompt), ``"compressed"`` (needs ``compressor``) or ``"window"`` (sinks and the last
    ``n_window`` tokens, default the compressor's cache size). Per-query losses are kept, so the
    split-half reliabilities of :mod:`icl_ssm.select.budget` apply."""

    model: RegressionTeacher
    split: SelectionSplit
    cache: str = "compressed"
    compressor: SSMCompressor | None = None
    batch: int = 16
    n_window: int | None = None
    num_sink: int = 4
    name: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.cache not in REGRESSION_CACHES:
            raise ValueError(f"cache={self.cache!r}; accepted: {', '.join(REGRESSION_CACHES)}")
        if self.cache == "compressed" and self.compressor is None:
            raise ValueError("cache='compressed' needs a compressor")
        if self.batch < 1:
            raise ValueError(f"batch={self.batch}; expected >= 1")
        if self.compressor is not None:
            c = self.compressor.config
            self.num_sink = c.num_sink
            if self.n_window is None:
                self.n_window = c.num_virtual + c.num_recent
        self.name = self.cache

    def build(self, values: torch.Tensor) -> PrefixCache:
        if self.cache == "dense":
            return dense_cache(self.model, values)
        if self.cache == "compressed":
            return compressed_cache(self.model, self.compressor, values)
        return window_cache(self.model, values, None, self.num_sink, self.n_window or 16)

    def evaluate(self, pool, validation, subsets):
        device = self.model.read_in.weight.device
        rows, queries = _rows(pool, "c"), _rows(validation, "v")
        qx = prompt_values(self.split.valid_x[queries][:, None]).to(device)  # (Q, 1, F)
        qy = torch.as_tensor(self.split.valid_y[queries], dtype=torch.float32, device=device)
        Q = len(queries)
        per_query, total, tokens = [], Cost(), 0
        for start in range(0, len(subsets), self.batch):
            chunk = [rows[list(s)] for s in subsets[start: start + self.batch]]
            values = pool_prompts(self.split, np.stack(chunk)).to(device)
            with torch.no_grad(), measure(device) as cost:
                prefix = self.build(values).repeat_interleave(Q)
                pred = forward_with_prefix(self.model, prefix, qx.repeat(len(chunk), 1, 1)).predictions[:, -1]
            per_query.append(((pred.float() - qy.repeat(len(chunk))) ** 2).view(len(chunk), Q).double().cpu().numpy())
            total = total + cost
            encoded = values.shape[1] if self.cache == "dense" else (
                self.num_sink + (self.compressor.config.num_recent if self.cache == "compressed" else self.n_window))
            tokens += len(chunk) * (encoded + Q)
        q = np.concatenate(per_query)
        return SubsetLosses(q.mean(1), total, tokens, q)


@torch.no_grad()
def test_errors(model: RegressionTeacher, split: SelectionSplit, prompts: Sequence[Sequence[int]]) -> np.ndarray:
    """Squared error at each test query after the dense prompt of pool rows ``prompts[j]``: one
    prompt for every query (``len(prompts) == 1``) or one per query (per-query retrieval)."""
    n = len(split.test_x)
    if len(prompts) not in (1, n):
        raise ValueError(f"{len(prompts)} prompts for {n} test queries; expected 1 or one per query")
    device = model.read_in.weight.device
    values = pool_prompts(split, [list(p) for p in prompts]).to(device)
    cache = dense_cache(model, values)
    queries = prompt_values(split.test_x[:, None]).to(device)
    cache = cache.repeat_interleave(n) if len(prompts) == 1 else cache
    pred = forward_with_prefix(model, cache, queries).predictions[:, -1].double().cpu().numpy()
    return (pred - split.test_y) ** 2


def nearest_prompts(split: SelectionSplit, k: int) -> list[list[int]]:
    """Per-query top-k: for every test query the ``k`` pool inputs nearest it (Euclidean),
    nearest last (closest to the query in the prompt)."""
    d = ((split.test_x[:, None, :] - split.pool_x[None]) ** 2).sum(-1)  # (t, n)
    return [list(np.argsort(row, kind="stable")[:k][::-1]) for row in d]

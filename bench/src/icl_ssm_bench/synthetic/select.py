"""Selection on the synthetic regression task with the language tasks' machinery: the pool and
queries as :class:`~icl_ssm.data.tasks.Example` handles (their ids index the arrays), a
:class:`~icl_ssm.select.subset_losses.SubsetEvaluator` whose loss is the squared error of the
teacher's prediction after a subset's cache (dense, compressed or window), and the test error
of a chosen prompt. :class:`~icl_ssm.select.affinity.AffinitySelector` then runs unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from icl_ssm.compress.builders import CacheBuilder
from icl_ssm.compress.cache import PrefixCache, dense_cache
from icl_ssm.cost import Cost, measure
from icl_ssm.data.tasks import Example
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm.select.subset_losses import SubsetEvaluator, SubsetLosses
from icl_ssm_bench.synthetic.task import SelectionSplit
from icl_ssm_bench.synthetic.teacher import RegressionTeacher, prompt_values


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
    teacher's prediction after the subset's prompt, read from ``cache`` (a
    :class:`~icl_ssm.compress.builders.CacheBuilder` of the teacher: :class:`DenseCache`, the
    exact prompt; :class:`CompressedCache`; :class:`WindowCache`, sinks and the last tokens).
    Per-query losses are kept, so the split-half reliabilities of :mod:`icl_ssm.select.budget`
    apply."""

    model: RegressionTeacher
    split: SelectionSplit
    cache: CacheBuilder
    batch: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.cache, CacheBuilder):
            raise TypeError(f"cache={self.cache!r}: expected a CacheBuilder (icl_ssm.compress.builders)")
        if self.batch < 1:
            raise ValueError(f"batch={self.batch}; expected >= 1")

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.cache.name

    def build(self, values: torch.Tensor) -> PrefixCache:
        return self.cache(values, torch.ones(values.shape[:2], dtype=torch.bool, device=values.device))

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
            mask = torch.ones(values.shape[:2], dtype=torch.bool)
            tokens += self.cache.tokens(mask) + len(chunk) * Q
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

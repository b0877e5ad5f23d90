"""Teacher targets of the synthetic regression teacher, for the same two-stage distillation
(:func:`icl_ssm.distill.train.train`) that language models get.

An episode is a prompt of ``k`` (x, y) pairs drawn from a selection pool that mixes the query
cluster (D1) and the others (D2), as selection will present them, and ``queries`` validation
inputs from the query cluster; a group is ``group_size`` episodes from one pool with the same
queries (what the ranking term compares). The targets mirror the language model's:

- ``pool_k``, ``pool_v``: the teacher's K/V pooled into ``num_virtual`` chunks (stage 1);
- ``prediction``: the teacher's prediction at each query after the whole prompt, which stage 2
  matches by squared error (the regression counterpart of the answer distribution's KL);
- ``hidden``: every layer's hidden state at each query (the hidden-state loss);
- ``target``: the query's true y, for the ranking term (the subset's squared error per query).

The teacher is small, so the targets are computed in memory; :class:`RegressionTargets` has
the interface of :class:`~icl_ssm.distill.teacher.TeacherCache` that training reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from icl_ssm.compress.cache import dense_cache
from icl_ssm.distill.targets import pool_kv
from icl_ssm.lm.prefix import forward_with_prefix
from icl_ssm_bench.synthetic.task import RegressionTask
from icl_ssm_bench.synthetic.teacher import RegressionTeacher, prompt_values


@dataclass(frozen=True)
class RegressionEpisode:
    group: int


class RegressionTargets:
    """Episodes and their targets in memory: ``episodes[i].group`` and ``get(i)``, as
    :class:`~icl_ssm.distill.teacher.TeacherCache` offers them."""

    def __init__(self, episodes: list[RegressionEpisode], targets: list[dict[str, Tensor]]):
        if len(episodes) != len(targets):
            raise ValueError(f"{len(episodes)} episodes but {len(targets)} targets")
        self.episodes = episodes
        self._targets = targets

    def __len__(self) -> int:
        return len(self.episodes)

    def get(self, i: int) -> dict[str, Tensor]:
        return self._targets[i]


@torch.no_grad()
def regression_episode(model: RegressionTeacher, xs: np.ndarray, ys: np.ndarray, query_x: np.ndarray,
                       query_y: np.ndarray, *, num_sink: int, num_virtual: int, num_recent: int) -> dict[str, Tensor]:
    """One episode's targets: the prompt ``xs: (k, d)``, ``ys: (k,)`` and the queries ``query_x:
    (Q, d)`` with their true ``query_y: (Q,)``. Shapes: ``prompt_values (2k, d + 1)``, ``pool_k``
    / ``pool_v (layers, kv_heads, num_virtual, head_dim)``, ``query_values (Q, 1, d + 1)``,
    ``prediction``, ``target (Q,)``, ``hidden (Q, layers, hidden)``."""
    device = model.read_in.weight.device
    values = prompt_values(xs[None], ys[None]).to(device)  # (1, 2k, d + 1)
    dense = dense_cache(model, values)
    end = values.shape[1] - num_recent
    pool_k = torch.stack([pool_kv(k[0], end, num_sink, num_virtual) for k in dense.keys])
    pool_v = torch.stack([pool_kv(v[0], end, num_sink, num_virtual) for v in dense.values])
    queries = prompt_values(query_x[:, None]).to(device)  # (Q, 1, d + 1)
    out = forward_with_prefix(model, dense.repeat_interleave(len(query_x)), queries, output_hidden_states=True)
    hidden = torch.stack([h[:, -1] for h in out.hidden_states[1:]], dim=1)  # (Q, m, H)
    return {"prompt_values": values[0].cpu(), "pool_k": pool_k.cpu(), "pool_v": pool_v.cpu(),
            "query_values": queries.cpu(), "prediction": out.predictions[:, -1].float().cpu(),
            "target": torch.as_tensor(query_y, dtype=torch.float32), "hidden": hidden.float().cpu()}


def regression_targets(model: RegressionTeacher, task: RegressionTask, *, samples: int, k: int, queries: int,
                       group_size: int, num_sink: int, num_virtual: int, num_recent: int, pool_size: int = 200,
                       d1_share: float = 0.5, seed: int = 0) -> RegressionTargets:
    """``samples`` episodes (rounded up to whole groups of ``group_size``): each group a fresh
    selection pool of ``pool_size`` candidates (``d1_share`` from a random query cluster) and
    ``queries`` validation inputs from that cluster; each episode ``k`` candidates of it."""
    for name, value in (("samples", samples), ("k", k), ("queries", queries), ("group_size", group_size)):
        if value < 1:
            raise ValueError(f"regression_targets: {name}={value}; expected >= 1")
    if k > pool_size:
        raise ValueError(f"regression_targets: k={k} demonstrations from a pool of {pool_size}")
    rng = np.random.default_rng(seed)
    groups = -(-samples // group_size)
    episodes, targets = [], []
    model.eval()
    for g in range(groups):
        split = task.sample_selection(rng, pool_size, d1_share, queries, 0,
                                      query_cluster=int(rng.integers(task.clusters)))
        for _ in range(group_size):
            pick = rng.choice(pool_size, k, replace=False)
            targets.append(regression_episode(model, split.pool_x[pick], split.pool_y[pick], split.valid_x,
                                              split.valid_y, num_sink=num_sink, num_virtual=num_virtual,
                                              num_recent=num_recent))
            episodes.append(RegressionEpisode(group=g))
    return RegressionTargets(episodes, targets)

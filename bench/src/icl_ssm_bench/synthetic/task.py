"""Synthetic in-context regression, clustered: the paper's case study of linear functions.

The data of Garg et al. (2022), "What can transformers learn in-context? A case study of simple
function classes" (https://arxiv.org/abs/2208.01066): inputs ``x ~ N(0, I_d)`` and targets
``y = f(x) + N(0, sigma^2)``, with ``f`` linear (``<beta, x>``) or a two-layer ReLU network
(Garg's ``relu_2nn_regression``). Garg's targets have variance ``d``; here every function is
scaled by ``1 / sqrt(d)`` so that ``f(x)`` has unit variance, and a squared error reads as
Garg's *normalised* squared error (the zero predictor scores ``1 + sigma^2``).

Two uses, as in Zhang et al., "Long-Context Demonstration Selection Using State Space Models":

* :meth:`RegressionTask.sample_prompts` - the teacher's training prompts: each prompt's pairs
  come from one freshly drawn random function (Garg's training distribution).
* :meth:`RegressionTask.sample_selection` - the selection setting: ``clusters`` fixed
  functions (for ``"linear"``, mutually orthogonal anchors ``beta_c``), a pool of candidate
  demonstrations mixing the query cluster (D1) and the other clusters (D2), and validation and
  test queries from D1.

Everything is plain numpy (float32); randomness comes from an explicit
``numpy.random.Generator``, and a task's cluster functions from its ``seed`` alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

FUNCTION_CLASSES = ("linear", "relu")


@dataclass(frozen=True)
class Anchors:
    """The fixed functions of a task's clusters.

    ``"linear"``: ``beta: (C, d)``, orthonormal rows (``f_c(x) = <beta_c, x>``).
    ``"relu"``: ``w1: (C, d, h)``, ``w2: (C, h)`` and ``scale`` (``f_c(x) = scale * relu(x @ w1_c) @ w2_c``).
    Unused fields are None.
    """

    beta: np.ndarray | None = None
    w1: np.ndarray | None = None
    w2: np.ndarray | None = None
    scale: float = 1.0


@dataclass(frozen=True)
class SelectionSplit:
    """One selection problem: a pool of candidates and queries, all as numpy arrays.

    ``pool_x: (n, d)``, ``pool_y: (n,)`` float32; ``pool_cluster: (n,)`` int64, the cluster of
    each candidate; ``valid_x: (v, d)``, ``valid_y: (v,)`` and ``test_x: (t, d)``, ``test_y: (t,)``
    come from ``query_cluster`` (D1).
    """

    pool_x: np.ndarray
    pool_y: np.ndarray
    pool_cluster: np.ndarray
    valid_x: np.ndarray
    valid_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    query_cluster: int

    @property
    def pool_is_d1(self) -> np.ndarray:
        """``(n,)`` bool: the candidates from the query's cluster."""
        return self.pool_cluster == self.query_cluster


@dataclass(frozen=True)
class RegressionTask:
    """A clustered regression task.

    ``function_class``: ``"linear"`` or ``"relu"``; ``d``: input dimension; ``clusters``: number
    of fixed cluster functions (for ``"linear"`` at most ``d``, their anchors being orthogonal);
    ``sigma``: standard deviation of the label noise, relative to the unit-variance signal;
    ``seed``: the cluster functions (sampling methods take their own generator);
    ``relu_hidden``: hidden width of the ReLU networks (Garg: 100).

    The default ``sigma = 0.25`` keeps 20 demonstrations in ``d = 20`` from pinning ``beta``:
    noiseless, ``d`` pairs determine it exactly and every later demonstration is worth nothing;
    with this noise even the Bayes-optimal (ridge) estimate still leaves a share of the signal
    unexplained at ``k = 20`` and keeps improving up to ``k = 60``, so the number of useful (D1)
    demonstrations matters over the whole range a selector chooses from.
    """

    function_class: str = "linear"
    d: int = 20
    clusters: int = 4
    sigma: float = 0.25
    seed: int = 0
    relu_hidden: int = 100

    def __post_init__(self):
        if self.function_class not in FUNCTION_CLASSES:
            raise ValueError(f"function_class must be one of {FUNCTION_CLASSES}, got {self.function_class!r}")
        for name in ("d", "clusters", "relu_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.function_class == "linear" and self.clusters > self.d:
            raise ValueError(f"clusters={self.clusters} orthogonal anchors do not fit in d={self.d} dimensions; "
                             f"use clusters <= {self.d}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma must be a finite number >= 0, got {self.sigma!r}")

    # ------------------------------------------------------------------ cluster functions

    @cached_property
    def anchors(self) -> Anchors:
        """The clusters' functions, a pure function of the task's fields."""
        rng = np.random.default_rng([self.seed, FUNCTION_CLASSES.index(self.function_class)])
        if self.function_class == "linear":
            q, r = np.linalg.qr(rng.standard_normal((self.d, self.d)))
            q = q * np.sign(np.diag(r))[None]  # Haar-distributed orthogonal matrix
            return Anchors(beta=q.T[: self.clusters].astype(np.float32))  # (C, d), unit rows
        h = self.relu_hidden
        w1 = rng.standard_normal((self.clusters, self.d, h)).astype(np.float32)
        w2 = rng.standard_normal((self.clusters, h)).astype(np.float32)
        return Anchors(w1=w1, w2=w2, scale=_relu_scale(h, self.d))

    def target(self, x: np.ndarray, cluster: np.ndarray | int) -> np.ndarray:
        """Noiseless ``f_c(x)``: ``x: (n, d)``, ``cluster``: int or ``(n,)`` ints -> ``(n,)`` float32."""
        x = self._check_x(x, "x")
        cluster = np.broadcast_to(np.asarray(cluster, dtype=np.int64), x.shape[:1])
        if cluster.size and (cluster.min() < 0 or cluster.max() >= self.clusters):
            raise ValueError(f"cluster must lie in [0, {self.clusters}), got values "
                             f"{sorted(set(cluster.tolist()) - set(range(self.clusters)))}")
        a = self.anchors
        if self.function_class == "linear":
            return np.einsum("nd,nd->n", x, a.beta[cluster]).astype(np.float32)
        hidden = np.maximum(np.einsum("nd,ndh->nh", x, a.w1[cluster]), 0)  # (n, h)
        return (a.scale * np.einsum("nh,nh->n", hidden, a.w2[cluster])).astype(np.float32)

    # ------------------------------------------------------------------ sampling

    def sample_points(self, rng: np.random.Generator, cluster: np.ndarray | int, n: int | None = None):
        """Noisy pairs from fixed clusters: ``cluster`` an int (with ``n``) or ``(n,)`` ints ->
        ``x: (n, d)``, ``y: (n,)`` float32."""
        cluster = np.asarray(cluster, dtype=np.int64)
        if cluster.ndim == 0:
            if n is None:
                raise ValueError("sample_points: give n when cluster is a single int")
            cluster = np.full(n, int(cluster))
        x = rng.standard_normal((cluster.shape[0], self.d)).astype(np.float32)
        y = self.target(x, cluster) + self.noise(rng, cluster.shape)
        return x, y

    def sample_prompts(self, rng: np.random.Generator, n: int, points: int, dims: int | None = None):
        """Training prompts as Garg trains: each of the ``n`` prompts has ``points`` pairs from
        one freshly drawn function (linear: ``beta ~ N(0, I / dims)``; relu: a new network).

        ``dims`` (curriculum, default ``d``): only ``dims`` input coordinates are non-zero, a
        random subset for each prompt, and the function is scaled so that ``f(x)`` keeps unit
        variance. Garg zeroes the *last* coordinates instead; then the coordinates that join
        last are trained least, and a teacher trained briefly ignores them.
        Returns ``xs: (n, points, d)``, ``ys: (n, points)`` float32.
        """
        dims = self.d if dims is None else dims
        if not 1 <= dims <= self.d:
            raise ValueError(f"dims must lie in [1, d={self.d}], got {dims}")
        if n < 1 or points < 1:
            raise ValueError(f"n and points must be >= 1, got n={n}, points={points}")
        xs = rng.standard_normal((n, points, self.d)).astype(np.float32)
        if dims < self.d:
            active = np.argsort(rng.random((n, self.d)), axis=1)[:, :dims]  # (n, dims): a subset per prompt
            mask = np.zeros((n, self.d), dtype=np.float32)
            np.put_along_axis(mask, active, 1.0, axis=1)
            xs *= mask[:, None, :]
        if self.function_class == "linear":
            beta = rng.standard_normal((n, self.d)).astype(np.float32) / np.float32(math.sqrt(dims))
            f = np.einsum("npd,nd->np", xs, beta)
        else:
            h = self.relu_hidden
            w1 = rng.standard_normal((n, self.d, h)).astype(np.float32)
            w2 = rng.standard_normal((n, h)).astype(np.float32)
            f = _relu_scale(h, dims) * np.einsum("nph,nh->np", np.maximum(np.einsum("npd,ndh->nph", xs, w1), 0), w2)
        return xs, (f + self.noise(rng, (n, points))).astype(np.float32)

    def sample_selection(
        self,
        rng: np.random.Generator,
        n_pool: int,
        d1_share: float,
        n_valid: int,
        n_test: int,
        query_cluster: int = 0,
    ) -> SelectionSplit:
        """A pool of ``n_pool`` candidates, ``round(d1_share * n_pool)`` of them from
        ``query_cluster`` (D1, at random places) and the rest from the other clusters, uniformly
        (D2); ``n_valid`` validation and ``n_test`` test queries from D1."""
        if not 0 <= query_cluster < self.clusters:
            raise ValueError(f"query_cluster must lie in [0, {self.clusters}), got {query_cluster}")
        if not 0.0 <= d1_share <= 1.0:
            raise ValueError(f"d1_share must lie in [0, 1], got {d1_share}")
        n_d1 = round(d1_share * n_pool)
        if n_d1 < n_pool and self.clusters < 2:
            raise ValueError(f"d1_share={d1_share} asks for D2 candidates but the task has one cluster; "
                             "use clusters >= 2 or d1_share=1")
        others = np.array([c for c in range(self.clusters) if c != query_cluster], dtype=np.int64)
        d2 = others[rng.integers(0, len(others), n_pool - n_d1)] if len(others) else np.zeros(0, np.int64)
        cluster = rng.permutation(np.concatenate([np.full(n_d1, query_cluster, dtype=np.int64), d2]))
        pool_x, pool_y = self.sample_points(rng, cluster)
        valid_x, valid_y = self.sample_points(rng, query_cluster, n_valid)
        test_x, test_y = self.sample_points(rng, query_cluster, n_test)
        return SelectionSplit(pool_x, pool_y, cluster, valid_x, valid_y, test_x, test_y, query_cluster)

    # ------------------------------------------------------------------ helpers

    def noise(self, rng: np.random.Generator, shape) -> np.ndarray:
        """Target noise N(0, sigma^2) of ``shape``, float32."""
        return (self.sigma * rng.standard_normal(shape)).astype(np.float32)

    def _check_x(self, x: np.ndarray, name: str) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"{name} must be an (n, {self.d}) array, got shape {x.shape}")
        return x


def _relu_scale(hidden: int, dims: int) -> float:
    # Garg's sqrt(2 / hidden) gives f(x) variance about dims; the extra 1/sqrt(dims) makes it 1
    return math.sqrt(2.0 / (hidden * dims))


__all__ = ["FUNCTION_CLASSES", "Anchors", "RegressionTask", "SelectionSplit"]

"""Demonstration selection (the paper's Algorithm 2) and the contract every selector follows.

A selector turns a candidate pool and a validation set into ``k`` demonstrations::

    selector = SELECTORS["affinity"](evaluator=CacheEvaluator(model, builder, CompressedCache(model, compressor)))
    selection = selector.select(pool, validation, k, rng)   # -> Selection

``affinity`` samples ``M`` subsets of size ``k``, asks a :class:`SubsetEvaluator` for each
subset's mean validation loss ``L_j`` and scores each candidate ``z`` by an estimate of how
much it lowers the loss:

* ``estimator="mean"`` (the paper): ``mu(z) = -mean{L_j : z in S_j}``;
* ``estimator="ridge"`` (datamodels): ``L_j ~ b + sum_z w_z [z in S_j]`` fitted by ridge
  regression with the penalty chosen by exact leave-one-out error, ``mu(z) = -w_z``. It
  accounts for who else was in each subset, so it needs fewer subsets for the same ranking.

Subsets are drawn *balanced* (a stream of random permutations cut into ``k``-subsets, so every
candidate appears ``floor`` or ``ceil`` of ``M k / n`` times); ``adaptive > 0`` holds back that
fraction of the budget for a second round that samples the candidates whose rank is still
uncertain near the top-``k`` boundary more often. ``stratify=True`` draws every subset with
the pool's labels in even shares, each label from its own balanced stream, and chooses the
``k`` with the same shares: the subset losses then no longer move with the label mix, and
each candidate competes with its own label only. A candidate that no subset contained has
a NaN score and is listed in ``Selection.unseen``; it is never ranked.

Evaluators: :class:`CacheEvaluator` (``"compressed"``: sinks + SSM virtual tokens, no dense
prefill; ``"dense"``: the exact prefix cache, shared by all validation queries of a subset),
:class:`PerQueryDenseEvaluator` (one full prompt per (subset, query): the paper's accounting),
:class:`OracleEvaluator` (a known function of the subset, for tests). Under
``accelerate launch`` the subsets are sharded across processes and the losses gathered, so
every process ends with the same selection as one process would.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from icl_ssm.cost import Cost
from icl_ssm.data.tasks import Example

ARRANGE_ORDERS = ("score", "interleave", "random")  # prompt order of the chosen demonstrations: see arrange()


@dataclass
class Selection:
    """What a selector chose and what it cost.

    ``indices``: pool positions of the ``k`` demonstrations in prompt order (ascending score:
    the best candidate sits last, next to the query); ``scores``: (n,) float64, higher is
    better, NaN where a candidate was never scored; ``cost``: FLOPs (FlopCounterMode) and wall
    seconds; ``tokens``: tokens run through the transformer; ``subsets``: subsets evaluated
    (affinity); ``unseen``: candidates no subset contained.
    """

    method: str
    indices: list[int]
    scores: np.ndarray
    cost: Cost = field(default_factory=Cost)
    tokens: int = 0
    subsets: int = 0
    unseen: list[int] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def examples(self, pool: Sequence[Example]) -> list[Example]:
        return [pool[i] for i in self.indices]

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "k": len(self.indices), "indices": list(self.indices),
                "flops": self.cost.flops, "wall_seconds": self.cost.seconds, "tokens": self.tokens,
                "subsets": self.subsets, "unseen": len(self.unseen), **self.details}


@dataclass(frozen=True)
class Hooks:
    """What a selector tells whoever runs it, while it runs; every hook is optional.

    ``on_say(line)``: its findings and its plan, before a budget is spent; ``on_progress(n)``:
    ``n`` more evaluations made (subsets, prompts); ``on_total(n)``: the evaluations it makes in
    all, once known (again when a plan changes it). A selector calls them through :meth:`say`,
    :meth:`progress` and :meth:`total`, so it never checks which were given."""

    on_say: Callable[[str], None] | None = None
    on_progress: Callable[[int], None] | None = None
    on_total: Callable[[int], None] | None = None

    def say(self, line: str) -> None:
        if self.on_say is not None:
            self.on_say(line)

    def progress(self, n: int) -> None:
        if self.on_progress is not None:
            self.on_progress(n)

    def total(self, n: int) -> None:
        if self.on_total is not None:
            self.on_total(n)


class Selector:
    """Override :meth:`select`; register the class with :func:`register`.

    That is the whole contract: ``icl-ssm select --method NAME`` and ``icl-ssm run --methods``
    find a registered selector by its name and build it with :meth:`from_config`, which a
    selector that needs the model (or more of the run's settings) overrides. The driver knows
    no concrete selector; what it needs to know of one it asks here: :meth:`planned` (the
    evaluations known before it starts), :attr:`balances_labels` (its prompts share out the
    labels themselves, so a per-label quota leaves them alone) and :meth:`findings` (what of
    its ``details`` the run's summary keeps). It reports through :attr:`hooks`."""

    name: ClassVar[str] = ""
    balances_labels: ClassVar[bool] = False
    hooks: Hooks = Hooks()  # the instance's, set by from_config (a dataclass selector declares it as a field)

    @classmethod
    def from_config(cls, cfg: Any, model: Any, builder: Any, compressor: Any = None,
                    hooks: Hooks | None = None) -> Selector:
        """The selector for a run's settings ``cfg`` (a :class:`~icl_ssm.select.config.SelectConfig`),
        wired to ``model`` and its prompt ``builder`` (and a compressor, where one is used) and
        reporting through ``hooks``. Default: ``cls()`` with the hooks."""
        selector = cls()
        selector.hooks = hooks or Hooks()
        return selector

    def select(self, pool: Sequence[Example], validation: Sequence[Example], k: int,
               rng: np.random.Generator) -> Selection:
        raise NotImplementedError  # abstract: every registered selector overrides it

    def planned(self, n: int, k: int) -> int:
        """The evaluations :meth:`select` makes on a pool of ``n`` for ``k``, as known before it
        starts (a budget's pilot only: the rest comes through ``hooks.total``); 0: none."""
        return 0

    def findings(self, details: dict[str, Any]) -> dict[str, Any]:
        """What of a selection's ``details`` the run's summary keeps: by default the reliability
        findings and the budget (:data:`FINDINGS`); a selector whose details are its record (the
        search's plan, screen and rungs) keeps them all."""
        kept = {key: details[key] for key in FINDINGS if key in details}
        if "budget" in details:
            kept.update(budget=details["budget"], queries_used=details["budget"]["queries"])
        return kept


# a selection's findings every summary keeps: how reliable its scores were and what would do
FINDINGS = ("min_coverage", "split_half", "reliability", "queries_needed", "score_split_half", "score_reliability")


SELECTORS: dict[str, type[Selector]] = {}


def register(name: str) -> Callable[[type[Selector]], type[Selector]]:
    def wrap(cls: type[Selector]) -> type[Selector]:
        if name in SELECTORS:
            raise ValueError(f"selector {name!r} is already registered")
        cls.name = name
        SELECTORS[name] = cls
        return cls

    return wrap


def validate_selection_inputs(pool: Sequence[Example], validation: Sequence[Example], k: int) -> None:
    """Refuse k <= 0, k > n, a pool with duplicate ids and an empty validation set."""
    if not isinstance(k, int | np.integer) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k={k!r}: expected an integer >= 1 demonstrations")
    if k > len(pool):
        raise ValueError(f"k={k} demonstrations requested but the pool has only {len(pool)} candidates; "
                         "lower k or use a larger pool")
    seen: set[str] = set()
    dupes = [e.id for e in pool if e.id in seen or seen.add(e.id)]
    if dupes:
        raise ValueError(f"the pool has duplicate ids {sorted(set(dupes))[:5]}; every candidate needs a unique id")
    if len(validation) == 0:
        raise ValueError("the validation set is empty: selection needs at least one validation query")


def top_k(scores: np.ndarray, k: int) -> list[int]:
    """The ``k`` best finite scores, ascending (best last); ties go to the lower index."""
    scores = np.asarray(scores, dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(scores))
    if len(finite) < k:
        raise ValueError(f"only {len(finite)} candidates have a score, fewer than k={k}")
    order = finite[np.lexsort((finite, -scores[finite]))][:k]  # best first, lower index first on ties
    return order[::-1].tolist()


def top_k_per_label(scores: np.ndarray, labels: Sequence[str], k: int) -> list[int]:
    """The ``k`` best finite scores with the labels shared out evenly, ascending (best last).

    Each of the ``L`` labels of the candidates gets ``k // L`` places, filled with its best
    candidates; the places left (``k % L``, and any a label cannot fill) go to the best of the
    rest, whatever their label. Of all such sets this one has the highest total score
    (:func:`top_k_per_label_ref` checks it by enumeration). On the small models this project
    measures, a prompt that leans to one label pulls answers toward it; where the pool leans,
    the quota lifts every method (BENCHMARKS.md, "One label's share of the prompt").
    """
    scores = np.asarray(scores, dtype=np.float64)
    if len(labels) != len(scores):
        raise ValueError(f"{len(labels)} labels for {len(scores)} scores")
    kinds = sorted(set(labels))
    if len(kinds) > k:
        raise ValueError(f"a per-label quota needs at most k={k} distinct labels; the candidates have {len(kinds)} "
                         f"({', '.join(map(repr, kinds[:5]))}{', ...' if len(kinds) > 5 else ''})")
    best_first = top_k(scores, int(np.isfinite(scores).sum()))[::-1]
    chosen: list[int] = []
    for y in kinds:
        chosen += [i for i in best_first if labels[i] == y][: k // len(kinds)]
    taken = set(chosen)
    chosen += [i for i in best_first if i not in taken][: k - len(chosen)]
    if len(chosen) < k:
        raise ValueError(f"only {len(chosen)} candidates have a score, fewer than k={k}")
    return sorted(chosen, key=lambda i: (scores[i], -i))


def top_k_per_label_ref(scores: np.ndarray, labels: Sequence[str], k: int) -> list[int]:
    """Slow reference of :func:`top_k_per_label`: every ``k``-subset of the scored candidates
    that gives each label at least ``min(k // L, its scored candidates)`` places, the highest
    total score (ties: the lexicographically smallest set), ascending (best last)."""
    from itertools import combinations

    kinds = sorted(set(labels))
    finite = [i for i in range(len(scores)) if np.isfinite(scores[i])]
    quota = {y: min(k // len(kinds), sum(labels[i] == y for i in finite)) for y in kinds}
    best, best_total = None, -np.inf
    for subset in combinations(finite, k):
        counts = Counter(labels[i] for i in subset)
        total = float(sum(scores[i] for i in subset))
        if all(counts[y] >= q for y, q in quota.items()) and total > best_total + 1e-12:
            best, best_total = subset, total
    assert best is not None, "no feasible subset"
    return sorted(best, key=lambda i: (scores[i], -i))


def per_label(selection: Selection, pool: Sequence[Example]) -> Selection:
    """``selection`` with its demonstrations re-chosen from its scores by :func:`top_k_per_label`
    (the pool's targets are the labels); what it cost is unchanged."""
    k = len(selection.indices)
    indices = top_k_per_label(selection.scores, [e.target for e in pool], k)
    return replace(selection, indices=indices, details={**selection.details, "per_label": True})


def order_rng(seed: int) -> np.random.Generator:
    """The generator of ``arrange(..., "random", ...)`` for a run's ``seed``, apart from the selection's own."""
    return np.random.default_rng([seed, 1])


def arrange(indices: Sequence[int], labels: Sequence[str], order: str, rng: np.random.Generator) -> list[int]:
    """The chosen demonstrations ``indices`` (ascending score, best last) put in prompt order.

    ``"score"``: unchanged, the paper's order. ``"interleave"``: each label's demonstrations
    spread evenly over the prompt, the better ones of a label later, so that no run of one
    label ends the prompt (a small model tends to answer the last label it saw); the
    ``j``-th of a label's ``c`` demonstrations sits at ``(j + 1/2) / c`` of the way through,
    the better score later on ties. With every label distinct it is the score order.
    ``"random"``: a permutation drawn from ``rng``.
    """
    if order not in ARRANGE_ORDERS:
        raise ValueError(f"order {order!r}; accepted: {', '.join(ARRANGE_ORDERS)}")
    if len(labels) != len(indices):
        raise ValueError(f"{len(labels)} labels for {len(indices)} demonstrations")
    indices = list(indices)
    if order == "score":
        return indices
    if order == "random":
        return [indices[i] for i in rng.permutation(len(indices))]
    rank, count = [], Counter()
    for y in labels:  # rank[pos]: how many of its label come before it (worse scores)
        rank.append(count[y])
        count[y] += 1
    key = [((j + 0.5) / count[y], pos) for pos, (j, y) in enumerate(zip(rank, labels, strict=True))]
    return [indices[pos] for _, pos in sorted(key)]


def validate_positive_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected an integer >= 1")

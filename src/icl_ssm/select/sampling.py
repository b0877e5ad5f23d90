"""How Algorithm 2 draws its subsets: uniform with balanced coverage, label-stratified, or focused
on the candidates near the top-k boundary. Every draw comes from an explicit ``numpy`` generator."""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence

import numpy as np


def subsets_for(n: int, k: int, eps: float = 0.5) -> int:
    """Subsets ``M`` for the mean estimator to reach standard error ``eps`` (in units of the
    spread of subset losses) on every candidate's affinity.

    A candidate's affinity averages the losses of the ``~M k / n`` subsets containing it, whose
    spread is ``sigma``; its standard error is ``sigma * sqrt(n / (M k))``. Asking for
    ``<= eps * sigma`` gives ``M = ceil(n / (k eps^2))`` (constant 1). Example: n = 1500,
    k = 20, eps = 0.5 -> 300 subsets, each candidate in 4 of them.
    """
    if not eps > 0:
        raise ValueError(f"eps={eps!r}: expected a positive target standard error")
    return max(1, math.ceil(n / (k * eps * eps)))


class _Stream:
    """Random permutations of ``items`` read one after another: ``draw(q)`` takes the next
    ``q`` distinct items, keeping a repeat (a permutation's tail meeting the next one's head)
    for the next draw, so every item is drawn ``floor`` or ``ceil`` of its share."""

    def __init__(self, items: Sequence[int], rng: np.random.Generator) -> None:
        self.items, self.rng, self.queue = list(items), rng, deque()

    def draw(self, q: int) -> list[int]:
        subset, members, deferred = [], set(), []
        while len(subset) < q:
            if not self.queue:
                self.queue.extend(self.items[i] for i in self.rng.permutation(len(self.items)))
            i = self.queue.popleft()
            if i in members:  # the previous permutation's tail: keep it for the next draw
                deferred.append(i)
            else:
                subset.append(i)
                members.add(i)
        self.queue.extendleft(reversed(deferred))
        return subset


def balanced_subsets(n: int, k: int, m: int, rng: np.random.Generator,
                     among: Sequence[int] | None = None) -> list[list[int]]:
    """``m`` subsets of ``k`` distinct candidates cut from a stream of random permutations
    of ``among`` (default ``range(n)``): every candidate appears ``floor`` or ``ceil`` of
    ``m k / len(among)`` times, give or take one at a permutation boundary."""
    items = list(range(n)) if among is None else list(among)
    if not 1 <= k <= len(items):
        raise ValueError(f"k={k}: expected 1 <= k <= {len(items)} candidates")
    stream = _Stream(items, rng)
    return [stream.draw(k) for _ in range(m)]


def label_quotas(labels: Sequence[str], k: int) -> dict[str, int]:
    """Places per label in a ``k``-subset with the labels shared out evenly: ``k // L`` each
    (the ``k % L`` left over go to different labels from subset to subset). Refuses more
    labels than ``k`` and a label with too few candidates for its places."""
    counts = Counter(labels)
    kinds = sorted(counts)
    if len(kinds) > k:
        raise ValueError(f"stratified subsets need at most k={k} distinct labels; the candidates have {len(kinds)} "
                         f"({', '.join(map(repr, kinds[:5]))}{', ...' if len(kinds) > 5 else ''})")
    quota = {y: k // len(kinds) for y in kinds}
    extra = 1 if k % len(kinds) else 0
    short = {y: counts[y] for y in kinds if counts[y] < quota[y] + extra}
    if short:
        raise ValueError(f"stratified {k}-subsets over {len(kinds)} labels need {quota[kinds[0]] + extra} candidates "
                         f"of each label; these labels have fewer: {short}")
    return quota


def stratified_subsets(labels: Sequence[str], k: int, m: int, rng: np.random.Generator,
                       focus: Sequence[int] | None = None) -> list[list[int]]:
    """``m`` subsets of ``k`` candidates with the labels shared out evenly (:func:`label_quotas`),
    each label's places drawn from its own balanced stream (every candidate of a label appears
    ``floor`` or ``ceil`` of its share), the subset then shuffled into a random prompt order.

    Every subset holds the same label mix, so the subset losses no longer move with it: a
    candidate is compared only with the candidates of its own label, which a per-label
    selection (:func:`top_k_per_label`) then keeps. ``focus``: for adaptive sampling's second
    round, half of each label's places come from its focus candidates (when it has any), the
    rest uniformly from the label.
    """
    quota = label_quotas(labels, k)
    kinds = list(quota)
    members = {y: [i for i, v in enumerate(labels) if v == y] for y in kinds}
    streams = {y: _Stream(members[y], rng) for y in kinds}
    focused = {y: [i for i in (focus or ()) if labels[i] == y] for y in kinds}
    heads = {y: _Stream(focused[y], rng) for y in kinds if focused[y]}
    extras = _Stream(range(len(kinds)), rng)  # which labels take the k % L places left over
    out = []
    for _ in range(m):
        more = {kinds[j] for j in extras.draw(k - sum(quota.values()))}
        subset = []
        for y in kinds:
            q = quota[y] + (y in more)
            if y in heads:
                head = heads[y].draw(min(math.ceil(q / 2), len(focused[y])))
                rest = np.setdiff1d(members[y], head)
                subset += head + rng.choice(rest, size=q - len(head), replace=False).tolist()
            else:
                subset += streams[y].draw(q)
        out.append([subset[i] for i in rng.permutation(k)])
    return out


def focused_subsets(n: int, k: int, m: int, focus: Sequence[int], rng: np.random.Generator) -> list[list[int]]:
    """``m`` subsets, each half from ``focus`` (balanced) and the rest uniformly from the pool,
    so that the focus candidates gain evidence while their company stays random."""
    half = min(len(focus), math.ceil(k / 2))
    heads = balanced_subsets(n, half, m, rng, among=focus) if half else [[] for _ in range(m)]
    out = []
    for head in heads:
        rest = np.setdiff1d(np.arange(n), head)
        tail = rng.choice(rest, size=k - len(head), replace=False).tolist()
        subset = head + tail
        out.append([subset[i] for i in rng.permutation(k)])
    return out

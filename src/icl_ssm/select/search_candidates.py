"""The prompt search's candidates (:mod:`icl_ssm.select.search`): an :class:`Arm` is one whole prompt
with where it came from and its losses; :class:`Arms` keeps each prompt once, in the order it was
first given; the generators below draw new prompts from ``rng`` (random, label-balanced,
neighbours of the best so far) or derive them from the screen's losses (Algorithm 2's top ``k``).

A prompt is a list of pool indices in prompt order. Every generator draws from ``rng`` only, in a
fixed order, so the same generator state gives the same candidates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from icl_ssm.calibrate import NONE
from icl_ssm.select.base import arrange, top_k, top_k_per_label
from icl_ssm.select.estimators import mean_affinity
from icl_ssm.select.sampling import balanced_subsets, stratified_subsets

SOURCES = ("random", "balanced", "affinity", "seed", "swap")


def key(prompt: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(i) for i in prompt)


@dataclass
class Arm:
    """One candidate prompt: pool indices in prompt order, where it came from, and its losses."""

    prompt: list[int]
    source: str
    screen_loss: float = math.nan
    confirm: dict[int, float] = field(default_factory=dict)  # queries -> label-balanced dense loss
    # with calibrations: queries -> {calibration: its loss}; the arm's loss is the best of them
    pairs: dict[int, dict[str, float]] = field(default_factory=dict)

    def calibration(self, queries: int) -> str:
        """The calibration whose pair scored best on ``queries`` (``none`` without calibrations)."""
        losses = self.pairs.get(queries)
        return min(losses, key=losses.get) if losses else NONE


class Arms(dict[tuple[int, ...], Arm]):
    """Every candidate of one search, by :func:`key`, in the order first given."""

    def add(self, prompts: Sequence[Sequence[int]], source: str) -> list[Arm]:
        """The arms made of those ``prompts`` not already held (each held once more from now on)."""
        new = []
        for p in prompts:
            if key(p) not in self:
                self[key(p)] = Arm(list(p), source)
                new.append(self[key(p)])
        return new

    def screened(self) -> list[Arm]:
        """The arms with a screen loss, in the order first given."""
        return [a for a in self.values() if math.isfinite(a.screen_loss)]


def random_prompts(n: int, k: int, m: int, rng: np.random.Generator) -> list[list[int]]:
    """``m`` random ``k``-prompts of a pool of ``n`` (none for ``m <= 0``)."""
    return balanced_subsets(n, k, m, rng) if m > 0 else []


def balanced_prompts(pool_labels: list[str], labels: Sequence[str], k: int, m: int,
                     rng: np.random.Generator) -> list[list[int]]:
    """``m`` label-balanced random ``k``-prompts, half interleaved by label, half in a random order
    (none for ``m <= 0`` or without ``labels``, a generative task)."""
    if m <= 0 or not labels:
        return []
    prompts = stratified_subsets(pool_labels, k, m, rng)
    return [arrange(p, [pool_labels[i] for i in p], "interleave", rng) if j % 2 else p
            for j, p in enumerate(prompts)]


def swap_prompts(best: Sequence[Sequence[int]], n: int, pool_labels: list[str], labels: Sequence[str], m: int,
                 rng: np.random.Generator) -> list[list[int]]:
    """``m`` neighbours of the ``best`` prompts (taken in turn): one or two members swapped for
    outsiders (of the same label where the task has ``labels``, so a balanced prompt stays
    balanced), or two positions exchanged."""
    out = []
    for j in range(m):
        base = list(best[j % len(best)])
        move = rng.integers(3)
        if move == 2 and len(base) > 1:  # reorder: two positions exchanged
            a, b = rng.choice(len(base), 2, replace=False)
            base[a], base[b] = base[b], base[a]
        else:
            inside = set(base)
            for _ in range(int(move) + 1):
                at = int(rng.integers(len(base)))
                same = [i for i in range(n) if i not in inside
                        and (not labels or pool_labels[i] == pool_labels[base[at]])]
                if not same:
                    continue
                new = int(rng.choice(same))
                inside.discard(base[at])
                inside.add(new)
                base[at] = new
        out.append(base)
    return out


def affinity_prompts(screened: Sequence[Arm], n: int, k: int, pool_labels: list[str], labels: Sequence[str],
                     rng: np.random.Generator) -> list[list[int]]:
    """Algorithm 2's picks from the ``screened`` arms' screen losses, no extra evaluations: the top
    ``k`` by mean affinity and, with ``labels``, the top ``k`` per label interleaved. None when
    fewer than two arms are screened or fewer than ``k`` of the ``n`` candidates get a score."""
    if len(screened) < 2:
        return []
    scores, _ = mean_affinity([a.prompt for a in screened], np.array([a.screen_loss for a in screened]), n)
    if np.isfinite(scores).sum() < k:
        return []
    out = [top_k(scores, k)]
    if labels:
        picked = top_k_per_label(scores, pool_labels, k)
        out.append(arrange(picked, [pool_labels[i] for i in picked], "interleave", rng))
    return out

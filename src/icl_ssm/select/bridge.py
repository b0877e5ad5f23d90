"""BRIDGE's optimisation step (Wan et al., 2025, "From Few to Many: Self-Improving Many-Shot
Reasoners Through Iterative Optimization and Generation"): Bayesian optimisation over which
demonstrations to include, with a Gaussian-process surrogate of the validation loss.

Our reading, for a fixed number ``k`` of demonstrations:

1. ``initial * M`` random ``k``-subsets (balanced, as affinity draws them) are scored by the
   subset evaluator, ``M`` the whole budget (by default affinity's, so that the two compare at
   the same number of subset evaluations; BRIDGE's own budget is a number of BO iterations);
2. a GP with a squared-exponential kernel on the subsets' membership vectors (distance: the
   number of members two subsets do not share) is fitted to the standardised losses, its
   length scale and noise chosen by marginal likelihood on a grid;
3. each round proposes random subsets and one- and two-member swaps of the best subsets seen,
   and evaluates the ``batch`` proposals of highest expected improvement; 2-3 repeat until
   ``M`` subsets have been scored;
4. the pick is the scored subset of lowest loss. Each candidate's score is how much the GP's
   posterior mean says it lowers the loss at the pick (minus the mean's gradient in its
   membership, BRIDGE's importance), which orders the pick (best last).

BRIDGE's generation step (new demonstrations written by the model) is not implemented: it
needs a model that reasons in writing, which the embedded one does not. Evaluations go through
any :class:`~icl_ssm.select.subset_losses.SubsetEvaluator`, so ``--evaluator compressed`` gives the
paper's "BRIDGE + Algorithm 1" rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_factor, cho_solve
from scipy.special import ndtr

from icl_ssm.select.base import Hooks, Selection, Selector, register, validate_selection_inputs
from icl_ssm.select.sampling import balanced_subsets, subsets_for
from icl_ssm.select.subset_losses import SubsetEvaluator, concat, evaluator_for

LENGTH_SCALES = (0.5, 1.0, 2.0, 4.0)  # in units of sqrt(k): the squared distance of two disjoint k-subsets is 2k
NOISES = (1e-3, 1e-2, 0.1, 0.3, 1.0)  # noise variance of the standardised losses


def membership(subsets: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """``(S, n)`` float64: 1 where a subset contains a candidate."""
    x = np.zeros((len(subsets), n))
    for row, s in enumerate(subsets):
        x[row, list(s)] = 1.0
    return x


@dataclass
class GP:
    """A zero-mean GP on membership vectors, fitted to standardised values."""

    x: np.ndarray  # (S, n)
    length: float
    noise: float
    alpha: np.ndarray  # (S,) K^-1 y
    chol: tuple
    y_mean: float
    y_std: float

    def kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None] - 2 * a @ b.T
        return np.exp(-np.maximum(d2, 0.0) / (2 * self.length**2))

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation ``(P,)`` each, in the losses' units."""
        ks = self.kernel(x, self.x)  # (P, S)
        mean = ks @ self.alpha
        var = np.clip(1.0 - (ks * cho_solve(self.chol, ks.T).T).sum(1), 1e-12, None)
        return self.y_mean + self.y_std * mean, self.y_std * np.sqrt(var)

    def mean_gradient(self, x: np.ndarray) -> np.ndarray:
        """``(n,)``: the gradient of the posterior mean in the membership vector at ``x`` (n,)."""
        ks = self.kernel(x[None], self.x)[0]  # (S,)
        return self.y_std * ((ks * self.alpha) @ (self.x - x[None])) / self.length**2


def fit_gp(x: np.ndarray, y: np.ndarray, k: int) -> GP:
    """The GP of highest log marginal likelihood over :data:`LENGTH_SCALES` x :data:`NOISES`."""
    y_mean, y_std = float(y.mean()), float(y.std()) or 1.0
    z = (y - y_mean) / y_std
    d2 = np.maximum((x * x).sum(1)[:, None] + (x * x).sum(1)[None] - 2 * x @ x.T, 0.0)
    best, best_ll = None, -np.inf
    for scale in LENGTH_SCALES:
        length = scale * np.sqrt(k)
        base = np.exp(-d2 / (2 * length**2))
        for noise in NOISES:
            chol = cho_factor(base + noise * np.eye(len(y)), lower=True)
            alpha = cho_solve(chol, z)
            ll = -0.5 * z @ alpha - np.log(np.diag(chol[0])).sum()
            if ll > best_ll:
                best, best_ll = GP(x, length, noise, alpha, chol, y_mean, y_std), ll
    return best


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """EI below ``best`` (losses are minimised)."""
    z = (best - mean) / std
    return (best - mean) * ndtr(z) + std * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)


def proposals(scored: Sequence[Sequence[int]], losses: np.ndarray, n: int, k: int, count: int,
              rng: np.random.Generator) -> list[tuple[int, ...]]:
    """``count`` new k-subsets: half random, half one or two members of a top-5 subset swapped out."""
    seen = {tuple(sorted(s)) for s in scored}
    top = [scored[i] for i in np.argsort(losses)[:5]]
    out: dict[tuple[int, ...], None] = {}
    for attempt in range(20 * count):
        if len(out) >= count:
            break
        if attempt % 2 == 0 or k == n:
            s = tuple(sorted(rng.choice(n, size=k, replace=False).tolist()))
        else:
            base = list(top[rng.integers(len(top))])
            outside = np.setdiff1d(np.arange(n), base)
            swaps = min(int(rng.integers(1, 3)), len(outside), k)
            drop = rng.choice(k, size=swaps, replace=False)
            for j, new in zip(drop, rng.choice(outside, size=swaps, replace=False)):
                base[j] = int(new)
            s = tuple(sorted(base))
        if s not in seen:
            out[s] = None
    return list(out)


@register("bridge")
@dataclass
class BridgeSelector(Selector):
    """BRIDGE's optimisation step: Bayesian optimisation of the k-subset (see the module).

    ``subsets``: subsets scored in all (None: affinity's default ``subsets_for(n, k)``);
    ``initial``: the share of them drawn at random first; ``batch``: proposals evaluated per
    round; ``candidates``: proposals the acquisition ranks per round.
    """

    evaluator: SubsetEvaluator
    subsets: int | None = None
    initial: float = 0.5
    batch: int = 8
    candidates: int = 256
    hooks: Hooks = Hooks()

    def __post_init__(self) -> None:
        if self.subsets is not None and self.subsets < 2:
            raise ValueError(f"subsets={self.subsets}: BRIDGE needs at least 2 subsets")
        if not 0.0 < self.initial <= 1.0:
            raise ValueError(f"initial={self.initial}: expected a share in (0, 1]")
        if self.batch < 1 or self.candidates < self.batch:
            raise ValueError(f"batch={self.batch}, candidates={self.candidates}: expected 1 <= batch <= candidates")

    @classmethod
    def from_config(cls, cfg, model, builder, compressor=None, hooks=None) -> BridgeSelector:
        """``cfg.evaluator`` as affinity reads it: compressed caches (BRIDGE + Algorithm 1), dense ones,
        or one dense prompt per query."""
        return cls(evaluator_for(cfg, model, builder, compressor), subsets=cfg.subsets, batch=cfg.batch,
                   hooks=hooks or Hooks())

    def plan(self, n: int, k: int) -> int:
        return self.subsets or subsets_for(n, k)

    def planned(self, n: int, k: int) -> int:
        return self.plan(n, k)

    def select(self, pool, validation, k, rng):
        validate_selection_inputs(pool, validation, k)
        n = len(pool)
        total = self.plan(n, k)
        first = max(2, min(total, round(self.initial * total)))
        scored = [tuple(sorted(s)) for s in balanced_subsets(n, k, first, rng)]
        parts = [self.evaluator.evaluate(pool, validation, scored)]
        losses = parts[0].losses.astype(np.float64)
        self.hooks.progress(len(scored))
        rounds = []
        while len(scored) < total:
            gp = fit_gp(membership(scored, n), losses, k)
            offered = proposals(scored, losses, n, k, self.candidates, rng)
            if not offered:  # every k-subset of a tiny pool scored
                break
            mean, std = gp.predict(membership(offered, n))
            ei = expected_improvement(mean, std, float(losses.min()))
            chosen = [offered[i] for i in np.argsort(-ei)[: min(self.batch, total - len(scored))]]
            part = self.evaluator.evaluate(pool, validation, chosen)
            rounds.append({"scored": len(chosen), "best_before": float(losses.min()),
                           "best_after": float(min(losses.min(), part.losses.min())),
                           "length_scale": gp.length, "noise": gp.noise})
            scored += chosen
            parts.append(part)
            losses = np.concatenate([losses, part.losses])
            self.hooks.progress(len(chosen))
        result = concat(*parts) if len(parts) > 1 else parts[0]
        pick = scored[int(np.argmin(losses))]
        gp = fit_gp(membership(scored, n), losses, k)
        scores = -gp.mean_gradient(membership([pick], n)[0])  # > 0: the mean loss falls with the candidate
        indices = sorted(pick, key=lambda i: (scores[i], i))  # ascending: the best next to the query
        random_best = float(losses[:first].min())
        details = {"subset_losses": losses.tolist(), "subsets_random": first, "rounds": rounds,
                   "pick_loss": float(losses.min()), "best_random_loss": random_best,
                   "bo_improved": bool(losses.min() < random_best)}
        return Selection("bridge", indices, scores, cost=result.cost, tokens=result.tokens,
                         subsets=len(scored), details=details)

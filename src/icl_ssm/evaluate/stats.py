"""Statistics of fidelity and selection: rank correlations with bootstrap intervals, label-balanced
weights, split-half reliability with the Spearman-Brown correction, percentile intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from torch import Tensor


def rankdata(x: Sequence[float] | np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (``scipy.stats.rankdata(method="average")``)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    new = np.r_[True, ordered[1:] != ordered[:-1]]  # first element of each tie group
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], len(x)]
    average = (starts + ends + 1) / 2  # mean of the 1-based ranks start+1 .. end
    ranks = np.empty(len(x))
    ranks[order] = average[np.cumsum(new) - 1]
    return ranks


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation; NaN when either side is constant or has fewer than 2 values."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"pearson needs two 1-D arrays of one length, got {x.shape} and {y.shape}")
    if len(x) < 2:
        return math.nan
    dx, dy = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(np.clip(dx @ dy / denom, -1.0, 1.0)) if denom > 0 else math.nan


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation (Pearson of average ranks); NaN when a side is constant."""
    return pearson(rankdata(x), rankdata(y))


def spearman_ci(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    level: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`spearman` over resampled (x, y) pairs.

    With 30 subsets a Spearman correlation is uncertain by about +-0.3 (95%), which is the
    size of the differences between compressors; the interval says so in the report.
    Resamples with a constant side are dropped; ``(nan, nan)`` when every one is.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"spearman_ci needs two 1-D arrays of one length, got {x.shape} and {y.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected a coverage between 0 and 1")
    if len(x) < 3:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(x), size=(resamples, len(x)))
    return interval(np.array([spearman(x[i], y[i]) for i in draws]), level)


def bootstrap_spearman(
    ref: Tensor | np.ndarray,
    others: dict[str, Tensor | np.ndarray],
    *,
    queries: bool = True,
    labels: Sequence[int] | np.ndarray | None = None,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Bootstrap draws of each path's subset-loss Spearman with the reference path.

    ``ref`` and every ``others[name]`` are ``(S, Q)`` per-query losses on the same subsets and
    queries. Each draw resamples the ``S`` subsets and, with ``queries``, the ``Q`` queries
    too, recomputes every subset's mean loss on the drawn queries and correlates. Every path
    sees the same draws, so ``draws[a] - draws[b]`` is a paired comparison of two paths.

    Resampling the queries matters: a subset's loss is a mean over a handful of queries, and
    which queries were drawn can move a compressor's Spearman as much as which subsets were.
    With ``labels`` (one per query) every draw's subset losses are label-balanced over the
    drawn queries (:func:`label_weights`).
    Returns ``{name: (resamples,) float64}``, NaN where a draw leaves a side constant.
    """
    ref = np.asarray(ref, dtype=np.float64)
    if ref.ndim != 2:
        raise ValueError(f"bootstrap_spearman needs (subsets, queries) losses, got shape {ref.shape}")
    S, Q = ref.shape
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, S, size=(resamples, S))
    counts = np.ones((resamples, Q))  # every query once
    if queries:
        counts = np.stack([np.bincount(c, minlength=Q) for c in rng.integers(0, Q, size=(resamples, Q))]).astype(float)
    if labels is None:
        weights = counts / Q
    else:
        labels = np.asarray(labels)
        if labels.shape != (Q,):
            raise ValueError(f"bootstrap_spearman: {labels.shape[0]} labels for {Q} queries")
        weights = np.zeros((resamples, Q))
        for value in np.unique(labels):
            of = labels == value
            drawn = counts[:, of].sum(1, keepdims=True)  # queries of this label in each draw
            weights[:, of] = np.divide(counts[:, of], drawn, out=np.zeros_like(counts[:, of]), where=drawn > 0)
        weights /= weights.sum(1, keepdims=True)  # each label drawn carries the same weight

    def subset_means(x: np.ndarray) -> np.ndarray:  # (resamples, S): drawn subsets, drawn queries
        return np.einsum("bsq,bq->bs", x[rows], weights)

    ref_means = subset_means(ref)
    draws = {}
    for name, x in others.items():
        x = np.asarray(x, dtype=np.float64)
        if x.shape != ref.shape:
            raise ValueError(f"bootstrap_spearman: losses of {name!r} have shape {x.shape}, the reference {ref.shape}")
        draws[name] = np.array([spearman(a, b) for a, b in zip(ref_means, subset_means(x))])
    return draws


def label_weights(labels: Sequence[int] | np.ndarray) -> np.ndarray:
    """``(Q,)`` query weights summing to 1 that give every label present the same total weight.

    A subset's label balance shifts every answer toward the labels it shows most: queries of
    that label gain, the others lose. Its plain mean loss therefore moves with the label mix of
    the queries that happened to be drawn, and on Rotten Tomatoes at k = 50 the subsets' losses
    on positive and on negative queries rank them in opposite orders (BENCHMARKS.md). Weighted
    this way, a subset's loss is the mean of its per-label mean losses, as on a balanced test set.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not len(labels):
        raise ValueError(f"label_weights needs a non-empty 1-D array of labels, got shape {labels.shape}")
    values, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (len(values) * counts[inverse])


def stratified_halves(labels: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Query indices split in two, each label's queries alternating between the halves."""
    labels = np.asarray(labels)
    first = np.zeros(len(labels), dtype=bool)
    for value in np.unique(labels):
        first[np.flatnonzero(labels == value)[0::2]] = True
    return np.flatnonzero(first), np.flatnonzero(~first)


def split_half_spearman(loss: Tensor | np.ndarray, labels: Sequence[int] | np.ndarray | None = None) -> float:
    """Spearman between the subsets' mean losses on the even and on the odd queries.

    ``loss``: ``(S, Q)`` per-query losses of one path. How much of its ranking of the subsets
    belongs to the subsets rather than to the queries that happened to be drawn, i.e. how far
    it can carry over to other queries from the task. NaN with fewer than 2 queries.
    With ``labels`` (one per query), the halves are label-stratified and each half's loss is
    label-balanced (:func:`label_weights`).
    """
    loss = np.asarray(loss, dtype=np.float64)
    if loss.ndim != 2:
        raise ValueError(f"split_half_spearman needs (subsets, queries) losses, got shape {loss.shape}")
    if loss.shape[1] < 2:
        return math.nan
    if labels is None:
        return spearman(loss[:, 0::2].mean(1), loss[:, 1::2].mean(1))
    labels = np.asarray(labels)
    a, b = stratified_halves(labels)
    if not len(b):
        return math.nan
    return spearman(loss[:, a] @ label_weights(labels[a]), loss[:, b] @ label_weights(labels[b]))


def spearman_brown(half: float, factor: float = 2.0) -> float:
    """Reliability of a mean over ``factor`` times the queries of a half whose split-half
    correlation is ``half``: ``factor * r / (1 + (factor - 1) * r)`` (Spearman-Brown). With the
    default ``factor=2``, the reliability of the whole validation set's ranking. NaN for a NaN
    ``half``; the formula assumes exchangeable queries and is read here for rank correlations,
    as an estimate.
    """
    if not math.isfinite(half):
        return math.nan
    if factor <= 0:
        raise ValueError(f"factor={factor}: expected a positive length ratio")
    return factor * half / (1 + (factor - 1) * half)


def queries_for_reliability(half: float, queries: int, target: float = 0.8) -> int | None:
    """How many validation queries Spearman-Brown predicts a ranking needs to reach reliability
    ``target``, from the split-half correlation ``half`` measured on ``queries`` queries (two
    halves of ``queries / 2``). None when ``half <= 0`` (no length reaches it: the queries do not
    agree on the subsets at all) or is NaN.
    """
    if not 0 < target < 1:
        raise ValueError(f"target={target}: expected a reliability between 0 and 1")
    if queries < 2:
        raise ValueError(f"queries={queries}: a split-half needs at least 2 queries")
    if not math.isfinite(half) or half <= 0:
        return None
    if half >= 1:
        return queries // 2
    factor = target * (1 - half) / (half * (1 - target))
    return max(1, math.ceil(factor * queries / 2 - 1e-9))  # an exact multiple is not rounded up by float error


def interval(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap ``draws``, NaN draws left out; ``(nan, nan)`` if all are."""
    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected a coverage between 0 and 1")
    draws = np.asarray(draws, dtype=np.float64)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return math.nan, math.nan
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def bootstrap_means(diff: Sequence[float] | np.ndarray, *, resamples: int = 2000, seed: int | np.random.Generator = 0,
                    both_axes: bool = True) -> np.ndarray:
    """Bootstrap draws of the mean of paired differences: the one resampling routine of the project.

    ``diff``: ``(n,)`` one paired difference per unit (an example, a subset), or ``(n, m)``
    (subsets x queries, say): each draw resamples the ``n`` rows and, with ``both_axes``, the
    ``m`` columns too, and takes the mean of the drawn cells. Returns ``(resamples,)`` float64.
    NaN cells are left out of a draw's mean (a draw of only NaN is NaN).
    """
    diff = np.asarray(diff, dtype=np.float64)
    if diff.ndim not in (1, 2) or not diff.size:
        raise ValueError(f"bootstrap_means needs a non-empty (n,) or (n, m) array of differences, got {diff.shape}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    grid = diff if diff.ndim == 2 else diff[:, None]
    n, m = grid.shape
    rows = rng.integers(0, n, size=(resamples, n))
    counts = np.ones((resamples, m))
    if m > 1 and both_axes:
        counts = np.stack([np.bincount(c, minlength=m) for c in rng.integers(0, m, size=(resamples, m))]).astype(float)
    finite = np.isfinite(grid)
    values = np.where(finite, grid, 0.0)
    total = np.einsum("brm,bm->b", values[rows], counts)
    weight = np.einsum("brm,bm->b", finite[rows].astype(float), counts)
    return np.divide(total, weight, out=np.full(resamples, math.nan), where=weight > 0)


def paired_bootstrap(diff: Sequence[float] | np.ndarray, *, resamples: int = 2000, level: float = 0.95,
                     seed: int | np.random.Generator = 0, both_axes: bool = True) -> dict[str, float | list[float]]:
    """Mean of paired differences with its percentile bootstrap interval.

    ``diff`` as :func:`bootstrap_means` takes it: ``(n,)`` per unit (the interval resamples
    the units) or ``(n, m)`` (it resamples rows and, with ``both_axes``, columns). Returns
    ``{"mean", "ci95": [lo, hi], "resampled": "rows" | "rows and columns", "n": n}``; the key
    is ``ci95`` whatever ``level`` is asked (the level is in ``"level"``).
    """
    diff = np.asarray(diff, dtype=np.float64)
    draws = bootstrap_means(diff, resamples=resamples, seed=seed, both_axes=both_axes)
    lo, hi = interval(draws, level)
    axes = "rows and columns" if diff.ndim == 2 and diff.shape[1] > 1 and both_axes else "rows"
    return {"mean": float(np.nanmean(diff)), "ci95": [lo, hi], "level": level, "resampled": axes,
            "n": int(diff.shape[0])}


def simultaneous_lower_bounds(gains: np.ndarray, *, resamples: int = 2000, level: float = 0.95,
                              seed: int | np.random.Generator = 0) -> tuple[np.ndarray, np.ndarray]:
    """One-sided lower bounds on several paired mean gains at once, valid together.

    ``gains``: ``(a, n)``, row ``j`` the per-example gain of alternative ``j`` over a reference
    (e.g. correct minus the reference's correct). Each bootstrap draw resamples the ``n``
    examples (the same draw for every row) and takes ``max_j (mean*_j - mean_j)``; ``c`` is
    that maximum's ``level`` quantile, and every lower bound is ``mean_j - c``. With
    probability about ``level`` all true gains lie above their bounds, so picking the best
    alternative *after* looking (the largest ``mean_j``) and requiring its bound above 0 keeps
    the chance of replacing an equally good reference near ``1 - level`` (bootstrap the maximum).
    Returns ``(means (a,), lower (a,))``.
    """
    gains = np.asarray(gains, dtype=np.float64)
    if gains.ndim != 2 or not gains.size:
        raise ValueError(f"simultaneous_lower_bounds needs (alternatives, examples) gains, got {gains.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected a coverage between 0 and 1")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    means = gains.mean(1)
    n = gains.shape[1]
    idx = rng.integers(0, n, size=(resamples, n))
    excess = np.stack([gains[:, i].mean(1) for i in idx]) - means  # (resamples, a)
    c = float(np.quantile(excess.max(1), level))
    return means, means - c


COMPARATORS = ("control", "window", "streaming", "lm-infinite")  # paths a trained compressor is judged against


def paired_spearman(dense: Tensor, losses: dict[str, Tensor], *, labels: Sequence[int] | None = None,
                    resamples: int = 2000, seed: int = 0) -> dict:
    """Paired bootstrap differences of subset-loss Spearman between the paths of one run.

    ``dense``: the ``(S, Q)`` dense losses; ``losses``: every path's (``dense`` itself is
    skipped). Each trained path (``compressed`` and the ``also`` ones) is compared with every
    comparator of :data:`COMPARATORS` present, and each ``also`` path with ``compressed``.
    Returns ``{"A-B": {"diff", "ci95", "ci95_queries"}}``: the Spearman of A minus that of B,
    and bootstrap intervals of the difference over the same resampled subsets (and queries)
    for both paths, which are far narrower than comparing the two paths' own intervals. With
    ``labels``, also ``diff_balanced`` and ``ci95_balanced`` (subsets and queries resampled) on
    label-balanced subset losses.
    """
    losses = {name: x for name, x in losses.items() if name != "dense"}
    if dense.shape[0] < 3:
        return {}
    trained = [name for name in losses if name not in COMPARATORS]
    pairs = [(a, b) for a in trained for b in COMPARATORS if b in losses]
    pairs += [(a, "compressed") for a in trained if a != "compressed" and "compressed" in losses]
    rho = {name: spearman(dense.mean(1).numpy(), x.mean(1).numpy()) for name, x in losses.items()}
    out = {f"{a}-{b}": {"diff": finite_or_none(rho[a] - rho[b])} for a, b in pairs}
    runs = [("ci95", False, None), ("ci95_queries", True, None)]
    if labels is not None:
        w = label_weights(labels)
        rho = {name: spearman(dense.double().numpy() @ w, x.double().numpy() @ w) for name, x in losses.items()}
        for a, b in pairs:
            out[f"{a}-{b}"]["diff_balanced"] = finite_or_none(rho[a] - rho[b])
        runs.append(("ci95_balanced", True, labels))
    for key, queries, weigh in runs:
        draws = bootstrap_spearman(dense, losses, queries=queries, labels=weigh, resamples=resamples, seed=seed)
        for a, b in pairs:
            out[f"{a}-{b}"][key] = [finite_or_none(v) for v in interval(draws[a] - draws[b])]
    return out


def finite_or_none(value: float | Tensor) -> float | None:
    """A finite float for JSON, None for NaN (e.g. a correlation with a constant side)."""
    value = float(value)
    return value if math.isfinite(value) else None


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n`` (an accuracy over ``n`` examples)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"successes={successes}, n={n}: expected 0 <= successes <= n and n >= 1")
    from scipy.stats import norm

    z = float(norm.ppf((1 + level) / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_separability(a: np.ndarray | Tensor, b: np.ndarray | Tensor, *, folds: int = 8,
                        penalties: Sequence[float] = (1e-3, 1e-2, 1e-1, 1.0, 10.0)) -> dict:
    """How well a linear read-out tells ``a: (n, D)`` from ``b: (n, D)``, row ``i`` of each a pair
    (the same prompt, two versions): held-out accuracy of a ridge classifier on standardised
    features, ``folds``-fold over pairs (both rows of a pair in the same fold), the penalty
    chosen by an inner split of each training fold. 0.5 is chance (a constant read-out scores
    exactly that); a Wilson interval over the ``2n`` held-out predictions comes with it."""
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    b = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    if a.shape != b.shape or len(a) < 2 * folds:
        raise ValueError(f"a {a.shape} and b {b.shape} must be the same (n, D) with n >= 2 * folds = {2 * folds}")
    n = len(a)
    fold = np.arange(n) % folds

    def fit(xa: np.ndarray, xb: np.ndarray, penalty: float):
        x = np.concatenate([xa, xb])
        mean, std = x.mean(0), x.std(0) + 1e-9
        z = np.concatenate([np.ones((len(x), 1)), (x - mean) / std], axis=1)
        y = np.concatenate([np.ones(len(xa)), -np.ones(len(xb))])
        reg = penalty * len(x) * np.eye(z.shape[1])
        reg[0, 0] = 0.0
        w = np.linalg.solve(z.T @ z + reg, z.T @ y)
        return lambda xs: np.concatenate([np.ones((len(xs), 1)), (xs - mean) / std], axis=1) @ w

    def accuracy(score, xa, xb) -> float:  # a tie (a read-out that sees nothing) counts half
        s = np.concatenate([score(xa), -score(xb)])  # positive: read as its own side
        return float((s > 1e-9).sum() + 0.5 * (np.abs(s) <= 1e-9).sum())

    correct = 0.0
    for f in range(folds):
        train, test = fold != f, fold == f
        ta, tb = a[train], b[train]
        inner = np.arange(len(ta)) % 2 == 0
        best = max(penalties, key=lambda p: accuracy(fit(ta[inner], tb[inner], p), ta[~inner], tb[~inner]))
        correct += accuracy(fit(ta, tb, best), a[test], b[test])
    return {"accuracy": correct / (2 * n), "ci95": list(wilson_interval(round(correct), 2 * n)), "pairs": n}

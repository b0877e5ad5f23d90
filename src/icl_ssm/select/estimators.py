"""Affinity estimators: from the losses of sampled subsets to one score per candidate. ``mean``
(the paper's: the mean loss of the subsets that contain it), ``ridge`` (a linear datamodel
fitted to the losses, with its reference solver beside it) and ``adjusted`` (the datamodel with
the subset's label shares, their squares and its last demonstration's label as covariates, so
that a candidate's score is its effect with the label mix and the ending held fixed); the top-k
boundary for adaptive sampling."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ESTIMATORS = ("mean", "ridge", "adjusted")


def indicator(subsets: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """(M, n) float64, 1 where candidate ``z`` is in subset ``j``."""
    X = np.zeros((len(subsets), n))
    for j, s in enumerate(subsets):
        X[j, list(s)] = 1.0
    return X


def mean_affinity(subsets: Sequence[Sequence[int]], losses: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 2: ``(scores, stderr)``, each (n,); ``-mean`` loss of the subsets containing a
    candidate, and the standard error of that mean (NaN where fewer than two subsets)."""
    X = indicator(subsets, n)  # (M, n)
    counts = X.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = X.T @ losses / counts
        var = (X.T @ losses**2 / counts - mean**2) * counts / (counts - 1)
        stderr = np.sqrt(np.maximum(var, 0.0) / counts)
    stderr[counts < 2] = np.nan
    return -mean, stderr


def ridge_fit(X: np.ndarray, y: np.ndarray, alphas: Sequence[float]) -> tuple[np.ndarray, float, np.ndarray]:
    """Ridge regression with an unpenalised intercept, penalty chosen by leave-one-out error.

    ``X``: (M, n), ``y``: (M,). Returns ``(w (n,), alpha, loo_mse (len(alphas),))``. One SVD of
    the centred design gives every penalty's fit and its exact LOO residuals
    ``r_j / (1 - H_jj)`` with ``H = 11^T/M + Xc (Xc^T Xc + alpha I)^-1 Xc^T``.
    """
    M = X.shape[0]
    Xc, yc = X - X.mean(0), y - y.mean()
    U, s, Vt = np.linalg.svd(Xc, full_matrices=False)  # (M, r), (r,), (r, n)
    Uty = U.T @ yc
    loo = []
    for a in alphas:
        d = s**2 / (s**2 + a)
        hat = (U**2) @ d + 1.0 / M
        resid = (yc - U @ (d * Uty)) / np.maximum(1.0 - hat, 1e-12)
        loo.append(float(np.mean(resid**2)))
    best = int(np.argmin(loo))
    a = alphas[best]
    w = Vt.T @ (s / (s**2 + a) * Uty)
    return w, float(a), np.array(loo)


def ridge_fit_ref(X: np.ndarray, y: np.ndarray, alphas: Sequence[float]) -> tuple[np.ndarray, float, np.ndarray]:
    """Reference for :func:`ridge_fit`: refit without each subset in turn (slow, obvious)."""

    def fit(Xs, ys, a):
        mx, my = Xs.mean(0), ys.mean()
        w = np.linalg.solve((Xs - mx).T @ (Xs - mx) + a * np.eye(Xs.shape[1]), (Xs - mx).T @ (ys - my))
        return w, my - mx @ w

    loo = []
    for a in alphas:
        errs = []
        for j in range(len(y)):
            keep = np.arange(len(y)) != j
            w, b = fit(X[keep], y[keep], a)
            errs.append((y[j] - X[j] @ w - b) ** 2)
        loo.append(float(np.mean(errs)))
    best = int(np.argmin(loo))
    return fit(X, y, alphas[best])[0], float(alphas[best]), np.array(loo)


def ridge_affinity(subsets: Sequence[Sequence[int]], losses: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Datamodel estimator: ``(scores, stderr)``; ``scores = -w`` of :func:`ridge_fit` over a
    penalty grid scaled to the mean count per candidate; NaN for unseen candidates. The
    stderr is the mean estimator's (used by adaptive sampling)."""
    X = indicator(subsets, n)
    counts = X.sum(0)
    scale = max(float(counts.mean()), 1.0)
    w, _, _ = ridge_fit(X, np.asarray(losses, dtype=np.float64), list(scale * np.logspace(-2, 2, 17)))
    scores = -w
    scores[counts == 0] = np.nan
    return scores, mean_affinity(subsets, losses, n)[1]


COVARIATE_SCALE = 10.0  # covariate columns scaled up: their ridge penalty is 1/100 of a candidate's


def subset_covariates(subsets: Sequence[Sequence[int]], labels: Sequence[str]) -> np.ndarray:
    """(M, 3(L-1)) for a pool with L labels: every label's share of the subset but the first
    label's, the squares of those shares (a mix's imbalance acts non-linearly), and one-hot
    the label of the subset's last demonstration (prompt order is the subset's order)."""
    kinds = sorted(set(labels))
    index = {y: i for i, y in enumerate(kinds)}
    L = len(kinds)
    out = np.zeros((len(subsets), 3 * max(L - 1, 0)))
    if L < 2:
        return out
    for j, s in enumerate(subsets):
        share = np.bincount([index[labels[i]] for i in s], minlength=L) / max(len(s), 1)
        out[j, : L - 1] = share[1:]
        out[j, L - 1 : 2 * (L - 1)] = share[1:] ** 2
        last = index[labels[s[-1]]]
        if last:
            out[j, 2 * (L - 1) + last - 1] = 1.0
    return out


def adjusted_affinity(subsets: Sequence[Sequence[int]], losses: np.ndarray, n: int,
                      labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The ridge datamodel with :func:`subset_covariates`: ``(scores, stderr)``; ``scores`` are
    minus the candidates' coefficients (the covariates' are dropped), NaN for unseen candidates;
    the stderr is the mean estimator's. Penalty by leave-one-out, as in :func:`ridge_affinity`."""
    if len(labels) != n:
        raise ValueError(f"adjusted_affinity: {len(labels)} labels for a pool of {n}")
    X = indicator(subsets, n)
    counts = X.sum(0)
    C = subset_covariates(subsets, labels) * COVARIATE_SCALE
    scale = max(float(counts.mean()), 1.0)
    w, _, _ = ridge_fit(np.hstack([X, C]), np.asarray(losses, dtype=np.float64),
                        list(scale * np.logspace(-2, 2, 17)))
    scores = -w[:n]
    scores[counts == 0] = np.nan
    return scores, mean_affinity(subsets, losses, n)[1]


def boundary(scores: np.ndarray, stderr: np.ndarray, k: int, width: float = 2.0) -> list[int]:
    """Candidates whose side of the top-``k`` boundary is uncertain: within ``width`` standard
    errors of the midpoint between the ``k``-th and ``k+1``-th score; at least ``2k`` (the
    closest ones, in standard errors) when fewer qualify. Unseen candidates always qualify."""
    n = len(scores)
    seen = np.isfinite(scores)
    order = np.sort(scores[seen])[::-1]
    if len(order) <= k:
        return np.flatnonzero(~seen).tolist()
    mid = 0.5 * (order[k - 1] + order[k])
    se = np.where(np.isfinite(stderr) & (stderr > 0), stderr, np.nanmax(stderr[np.isfinite(stderr)], initial=1.0))
    z = np.where(seen, np.abs(scores - mid) / se, 0.0)
    closest = np.argsort(z, kind="stable")[: min(n, 2 * k)]
    return sorted(set(np.flatnonzero(z < width).tolist()) | set(closest.tolist()))

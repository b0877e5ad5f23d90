"""HiPPO-LegS transition matrices, their discretisations, and the discrete Legendre basis.

Pure functions, computed in float64 (cast at the call site). Two continuous systems share
the LegS matrices ``(A, B)``:

* time-invariant: ``x'(t) = A x(t) + B u(t)``, discretised with a step ``dt``. With
  ``dt = 1`` (the paper's code) the discrete spectral radius is ``e^-1``: the state
  forgets everything but the last few tokens. ``dt`` is therefore a parameter.
* scale-invariant (HiPPO-LegS proper): ``x'(t) = A x(t) / t + B u(t) / t``. With the
  input held constant over each token interval ``(k-1, k]`` and integrated exactly (zero
  order hold), the state after T tokens is the projection of the whole piecewise-constant
  history onto the first N shifted Legendre polynomials on ``[0, T]``.

References: Gu et al., "HiPPO: Recurrent Memory with Optimal Polynomial Projections"
(NeurIPS 2020), https://arxiv.org/abs/2008.07669; the appendix of Zhang et al.,
"Long-Context Demonstration Selection Using State Space Models".
"""

from __future__ import annotations

import math

import torch
from numpy.polynomial import legendre as npleg
from torch import Tensor

MEASURES = ("legs",)


METHODS = ("bilinear", "zoh")


_f64 = torch.float64


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def transition(measure: str, N: int) -> tuple[Tensor, Tensor]:
    """The continuous HiPPO transition of ``measure`` with state size ``N``.

    LegS, exactly as the paper's appendix: ``A[p, q] = -sqrt((2p+1)(2q+1))`` for p > q,
    ``A[p, p] = -(p+1)``, 0 above the diagonal; ``B[p] = sqrt(2p+1)``.

    Returns ``A: (N, N)`` and ``B: (N,)``, float64. A is lower triangular with eigenvalues
    ``-(p+1)``.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    _check_positive_int("N", N)
    p = torch.arange(N, dtype=_f64)
    b = torch.sqrt(2 * p + 1)
    A = -torch.tril(b[:, None] * b[None, :], diagonal=-1) - torch.diag(p + 1)
    return A, b.clone()


def _identity_like(A: Tensor) -> Tensor:
    return torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)


def discretize(A: Tensor, B: Tensor, dt: float, method: str = "bilinear") -> tuple[Tensor, Tensor]:
    """Discretise the time-invariant system ``x' = A x + B u`` with step ``dt``.

    * ``bilinear``: ``Abar = (I - dt/2 A)^-1 (I + dt/2 A)``, ``Bbar = (I - dt/2 A)^-1 dt B``
    * ``zoh``: ``Abar = exp(dt A)``, ``Bbar = A^-1 (exp(dt A) - I) B``

    ``A: (N, N)``; ``B: (N,)`` or ``(N, H)`` (a learned input matrix is discretised the same
    way). Returns ``(Abar, Bbar)`` in float64 with the shapes of A and B.
    """
    _check_method(method)
    if not (isinstance(dt, (int, float)) and math.isfinite(dt) and dt > 0):
        raise ValueError(f"dt must be a finite number > 0, got {dt!r}")
    A, B = A.to(_f64), B.to(_f64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or B.shape[0] != A.shape[0]:
        raise ValueError(
            f"A must be (N, N) and B (N,) or (N, H); got A {tuple(A.shape)}, B {tuple(B.shape)}"
        )
    eye = _identity_like(A)
    Bm = B if B.ndim == 2 else B[:, None]
    if method == "bilinear":
        left = eye - (dt / 2) * A
        Abar = torch.linalg.solve(left, eye + (dt / 2) * A)
        Bbar = torch.linalg.solve(left, dt * Bm)
    else:
        Abar = torch.linalg.matrix_exp(dt * A)
        Bbar = torch.linalg.solve(A, (Abar - eye) @ Bm)
    return Abar, Bbar.reshape(B.shape)


def discretize_steps(A: Tensor, dt: Tensor, method: str = "bilinear") -> Tensor:
    """``Abar`` of :func:`discretize` for a tensor of steps, differentiable in ``dt``.

    ``A: (N, N)``, ``dt: (G,)`` (positive) -> ``(G, N, N)`` in ``dt``'s dtype: one transition
    per group, for a learned step (``log dt`` trained with the compressor).
    """
    _check_method(method)
    if dt.ndim != 1 or not bool((dt > 0).all()) or not bool(torch.isfinite(dt).all()):
        raise ValueError(f"dt must be a 1-d tensor of finite steps > 0, got {dt}")
    A = A.to(dt.dtype)
    eye = _identity_like(A)
    step = dt[:, None, None]
    if method == "bilinear":
        return torch.linalg.solve(eye - (step / 2) * A, eye + (step / 2) * A)
    return torch.linalg.matrix_exp(step * A)


def discretize_legs(A: Tensor, T: int, method: str = "zoh") -> tuple[Tensor, Tensor]:
    """Per-token step matrices of the scale-invariant system ``x' = A x / t + v(t) / t``.

    Token k (1-based) occupies ``(k-1, k]``; the state evolves as
    ``h_k = Abar[k-1] h_{k-1} + Gamma[k-1] v_k`` where ``v_k`` is the token's input vector
    (``B u_k`` for the HiPPO input, ``Bbar x_k`` for a learned input matrix).

    * ``zoh`` (exact for piecewise-constant input): ``Abar_k = exp(A log(k/(k-1)))``,
      ``Gamma_k = A^-1 (Abar_k - I)``; ``Abar_1 = 0`` since the history starts at t = 0.
    * ``bilinear`` (HiPPO's own discretisation, state-spaces ``HiPPOScale``):
      ``Abar_k = (I - A/2k)^-1 (I + A/2k)``, ``Gamma_k = (I - A/2k)^-1 / k``.

    Returns ``Abar: (T, N, N)`` and ``Gamma: (T, N, N)``, float64. Memory is O(T N^2): this
    is for the token-by-token reference and for tests, never for long prompts.
    """
    _check_method(method)
    _check_positive_int("T", T)
    A = A.to(_f64)
    eye = _identity_like(A)
    k = torch.arange(1, T + 1, dtype=_f64)
    if method == "bilinear":
        left = eye - A / (2 * k[:, None, None])
        Abar = torch.linalg.solve(left, eye + A / (2 * k[:, None, None]))
        Gamma = torch.linalg.solve(left, eye.expand(T, -1, -1) / k[:, None, None])
        return Abar, Gamma
    log_ratio = torch.log(k[1:] / (k[1:] - 1))
    Abar = torch.cat([torch.zeros_like(eye)[None], torch.linalg.matrix_exp(A * log_ratio[:, None, None])])
    Gamma = torch.linalg.solve(A, Abar - eye)
    return Abar, Gamma


def shifted_legendre(y: Tensor, N: int) -> Tensor:
    """``e_n(y)`` for n < N by the three-term recurrence: ``y: (...)`` -> ``(..., N)``."""
    _check_positive_int("N", N)
    x = 2 * y - 1
    out = [torch.ones_like(x)]
    if N > 1:
        out.append(x)
    for n in range(1, N - 1):  # (n+1) P_{n+1} = (2n+1) x P_n - n P_{n-1}
        out.append(((2 * n + 1) * x * out[n] - n * out[n - 1]) / (n + 1))
    P = torch.stack(out, dim=-1)
    return P * torch.sqrt(2 * torch.arange(N, dtype=P.dtype, device=P.device) + 1)


def shifted_legendre_integral(y: Tensor, N: int) -> Tensor:
    """``E_n(y) = int_0^y e_n`` for n < N: ``y: (...)`` -> ``(..., N)``.

    Uses ``int P_n = (P_{n+1} - P_{n-1}) / (2n+1)``, which vanishes at -1 for n >= 1.
    """
    x = 2 * y - 1
    P = shifted_legendre(y, N + 1) / torch.sqrt(
        2 * torch.arange(N + 1, dtype=y.dtype, device=y.device) + 1
    )  # plain P_0 .. P_N
    n = torch.arange(1, N, dtype=y.dtype, device=y.device)
    rest = (P[..., 2:] - P[..., :-2]) / (2 * torch.sqrt(2 * n + 1))
    return torch.cat([((x + 1) / 2)[..., None], rest], dim=-1)


def gauss_legendre(N: int) -> tuple[Tensor, Tensor]:
    """N-point Gauss-Legendre nodes and weights on [0, 1] (exact to degree 2N-1), float64."""
    _check_positive_int("N", N)
    z, w = npleg.leggauss(N)
    return torch.from_numpy((z + 1) / 2), torch.from_numpy(w / 2)


def legs_dilation(r: float, N: int) -> Tensor:
    """``exp(A log(1/r))`` for the LegS A, computed as the dilation ``p(y) -> r p(r y)``.

    Entry ``[n, m] = r * sum_j w_j e_m(z_j) e_n(r z_j)`` over Gauss-Legendre nodes: exact
    (the integrand is a polynomial of degree 2N-2) and well-conditioned. ``(N, N)`` float64.
    """
    if not (0 <= r <= 1):
        raise ValueError(f"r must be in [0, 1], got {r!r}")
    z, w = gauss_legendre(N)
    return r * (shifted_legendre(r * z, N).T * w) @ shifted_legendre(z, N)


def legendre_basis(T: int, N: int | None = None) -> Tensor:
    """Orthonormal basis of polynomials of degree < N sampled at T token positions.

    Column n is the degree-n discrete Legendre (Gram) polynomial at the token midpoints,
    obtained by a QR of the continuous Legendre polynomials there (well conditioned, unlike
    a Vandermonde matrix) with a positive-diagonal sign convention. Returns ``(T, N)``
    float64 with ``Q^T Q = I``; ``N`` defaults to ``T``.
    """
    _check_positive_int("T", T)
    N = T if N is None else N
    _check_positive_int("N", N)
    if N > T:
        raise ValueError(f"N must be <= T for an orthonormal basis; got N={N}, T={T}")
    y = (torch.arange(T, dtype=_f64) + 0.5) / T
    Q, R = torch.linalg.qr(shifted_legendre(y, N))
    return Q * torch.sign(torch.diagonal(R))


def legendre_coefficients(x: Tensor, N: int | None = None) -> Tensor:
    """Coefficients of ``x: (..., T, d)`` on the first N basis vectors: ``(..., N, d)``."""
    Q = legendre_basis(x.shape[-2], N).to(x.dtype)
    return Q.T @ x


def legendre_projection(x: Tensor, N: int) -> Tensor:
    """Best approximation of ``x: (..., T, d)`` by degree < N polynomials along T."""
    Q = legendre_basis(x.shape[-2], N).to(x.dtype)
    return Q @ (Q.T @ x)


def tail_energy(x: Tensor, N: int) -> Tensor:
    """Energy of ``x: (..., T, d)`` in degrees >= N of the full discrete Legendre spectrum.

    Proposition 1: this equals the squared Frobenius error of ``legendre_projection(x, N)``.
    Returns ``(...)``.
    """
    c = legendre_coefficients(x)  # (..., T, d), the full orthonormal spectrum
    return c[..., N:, :].pow(2).sum(dim=(-2, -1))

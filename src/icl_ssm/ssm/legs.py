"""The scale-invariant LegS scan ``h_k = Abar_k h_{k-1} + Gamma_k Bbar x_k``: its step matrices
change with a row's token index k (:func:`hippo.discretize_legs`), so the state is the Legendre
projection of the whole history, whatever its length. Shapes as in :mod:`icl_ssm.ssm.scan`.

* :func:`legs_scan_reference` - token by token, obviously correct.
* :func:`legs_scan_fast` - the exact (zoh) final state, GEMM-shaped, from the data-independent
  kernel :func:`legs_kernel_slabs` (:func:`legs_kernel` is its reference).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from icl_ssm.ssm import hippo
from icl_ssm.ssm.inputs import check_chunk, finish, project, validate

LEGS_IMPLS = ("reference", "fast")


def left_align(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Move each row's real tokens to the start, in order, zeroing the rest.

    Returns ``(aligned, order, lengths)``; ``lengths: (B,)``.
    """
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    index = order.reshape(*order.shape, *([1] * (x.ndim - 2))).expand_as(x)
    keep = torch.gather(mask, 1, order).reshape(*order.shape, *([1] * (x.ndim - 2)))
    return torch.where(keep, torch.gather(x, 1, index), 0), order, mask.sum(dim=1)


def legs_scan_reference(
    x: Tensor,
    Bbar: Tensor,
    mask: Tensor | None = None,
    method: str = "zoh",
    return_states: bool = False,
    check_finite: bool = True,
) -> Tensor:
    """Token by token with the step matrices of :func:`hippo.discretize_legs`.

    ``Bbar: (N, H)`` or ``(G, N, H)`` is the continuous input matrix (the per-token
    ``Gamma_k`` is applied inside). A row's k-th real token is step k; padding leaves the
    state unchanged. Memory O(T N^2): for tests and short sequences.
    """
    inp = validate(x, Bbar, None, mask, check_finite)
    B, T, _ = x.shape
    G, N = inp.G, inp.N
    A, _ = hippo.transition("legs", N)
    Abar, Gamma = (t.to(x.dtype) for t in hippo.discretize_legs(A.to(x.device), T, method))
    Bflat = inp.Bbar.reshape(G * N, -1)
    step = torch.zeros(B, dtype=torch.long, device=x.device)  # tokens seen per row
    h = x.new_zeros(B, G, N)
    states = []
    for t in range(T):
        real = torch.ones(B, dtype=torch.bool, device=x.device) if mask is None else inp.mask[:, t]
        k = step.clamp(max=T - 1)  # index of this token's step matrices
        v = (x[:, t] @ Bflat.T).view(B, G, N)
        new = torch.einsum("bnm,bgm->bgn", Abar[k], h) + torch.einsum("bnm,bgm->bgn", Gamma[k], v)
        h = torch.where(real[:, None, None], new, h)
        step = step + real.long()
        if return_states:
            states.append(h * real[:, None, None])
    if return_states:
        return finish(torch.stack(states, dim=1), inp, 2)
    return finish(h, inp, 1)


def legs_kernel(L: int, N: int, start: int, stop: int) -> Tensor:
    """Value-space kernel of the exact (zoh) LegS scan for tokens ``start .. stop-1``.

    Entry ``[k, j, n] = (E_n(z_j (k+1) / L) - E_n(z_j k / L)) / z_j`` with ``E_n`` the
    integral of the n-th shifted Legendre polynomial and ``z_j`` the Gauss nodes: the
    contribution of token k, seen at node j, to coefficient n of the state after L tokens.
    Returns ``(stop - start, N, N)`` float64. Entries are O(1/L): no cancellation blow-up.
    """
    z, _ = hippo.gauss_legendre(N)
    k = torch.arange(start, stop + 1, dtype=torch.float64)
    E = hippo.shifted_legendre_integral(z[None, :] * k[:, None] / L, N)  # (C+1, N, N)
    return (E[1:] - E[:-1]) / z[None, :, None]


def legs_kernel_slabs(L: int, N: int, start: int, stop: int, dtype: torch.dtype = torch.float64,
                      device: torch.device | str = "cpu") -> Tensor:
    """:func:`legs_kernel` laid out ``(J, N, C)`` (``legs_kernel(...).permute(1, 2, 0)``), in ``dtype``.

    The same entries, several times faster: one pass of the Legendre recurrence over the
    chunk's breakpoints, each degree's slab written as soon as it is known (``int P_n =
    (P_{n+1} - P_{n-1}) / (2n+1)``, differenced over consecutive breakpoints), so no
    ``(C, J, N)`` float64 temporaries are stacked, concatenated or differenced. Computed in
    float64, cast slab by slab. The layout makes ``K.transpose(1, 2)`` the ``(C, N)``
    matrix of each node, which ``torch.bmm`` reads without a copy.
    """
    z, _ = hippo.gauss_legendre(N)
    k = torch.arange(start, stop + 1, dtype=torch.float64)
    x = (2 * (z[:, None] * k[None, :] / L) - 1).to(device)  # (J, C+1): the breakpoints, on [-1, 1]
    inv_z = (1 / z)[:, None].to(device)
    out = torch.empty(N, N, stop - start, dtype=dtype, device=device)
    out[:, 0] = (x[:, 1:] - x[:, :-1]) / 2 * inv_z  # E_0(y) = y
    p_prev, p = torch.ones_like(x), x  # P_{n-1}, P_n
    d_prev = torch.zeros_like(x[:, 1:])  # P_{n-1} differenced over the breakpoints
    for n in range(1, N):
        p_next = ((2 * n + 1) * x * p - n * p_prev) / (n + 1)
        d_next = p_next[:, 1:] - p_next[:, :-1]
        out[:, n] = (d_next - d_prev) * (inv_z / (2 * math.sqrt(2 * n + 1)))
        d_prev = p[:, 1:] - p[:, :-1]
        p_prev, p = p, p_next
    return out


def legs_scan_fast(
    x: Tensor,
    Bbar: Tensor,
    mask: Tensor | None = None,
    chunk: int = 256,
    check_finite: bool = True,
) -> Tensor:
    """Final state of the exact (zoh) scale-invariant LegS scan, GEMM-shaped and stable.

    ``exp(A log(T/s))`` is the dilation ``p(y) -> (s/T) p(y s/T)`` of the polynomial whose
    shifted-Legendre coefficients are the state, so the state after T tokens is, at the
    Gauss nodes ``z_j``, a sum over tokens of the input polynomial's values times the
    integral of ``e_n`` over the token's interval. Hence: one GEMM ``Y = X (E_z Bbar)^T``
    (values of each token's input at the nodes), then per chunk of tokens a batched GEMM
    with :func:`legs_kernel` (data independent, built in float64 by the Legendre
    recurrence, :func:`legs_kernel_slabs`), then the Gauss weights. Nothing is diagonalised. Rows of different
    lengths are grouped by length. Returns ``(B, [G,] N)``.
    """
    check_chunk(chunk)
    inp = validate(x, Bbar, None, mask, check_finite)
    B, T, H = x.shape
    G, N = inp.G, inp.N
    z, w = hippo.gauss_legendre(N)
    Ez = hippo.shifted_legendre(z, N).to(device=x.device, dtype=x.dtype)  # (J, N): e_n(z_j)
    Wv = torch.einsum("jn,gnh->gjh", Ez, inp.Bbar)  # (G, J, H)
    if inp.mask is None:
        lengths = torch.full((B,), T, dtype=torch.long)
    else:
        x, _, lengths = left_align(x, inp.mask)
        lengths = lengths.cpu()
    Y = project(x, Wv)  # (B, T, G, J): input polynomial of each token at the nodes
    out = x.new_zeros(B, G, N)
    for L in torch.unique(lengths).tolist():
        rows = (lengths == L).nonzero().flatten().to(x.device)
        if L == 0:
            continue
        acc = x.new_zeros(N, len(rows) * G, N)  # (J, b*G, N)
        for start in range(0, L, chunk):
            stop = min(start + chunk, L)
            K = legs_kernel_slabs(L, N, start, stop, x.dtype, x.device)  # (J, N, C)
            Yc = Y[rows, start:stop].permute(3, 0, 2, 1).reshape(N, -1, stop - start)  # (J, b*G, C)
            acc = acc + torch.bmm(Yc, K.transpose(1, 2))  # one GEMM per node
        out[rows] = torch.einsum("jbn,j->bn", acc, w.to(device=x.device, dtype=x.dtype)).view(-1, G, N)
    return finish(out, inp, 1)


def legs_scan(
    x: Tensor,
    Bbar: Tensor,
    mask: Tensor | None = None,
    impl: str = "fast",
    method: str = "zoh",
    return_states: bool = False,
    chunk: int = 256,
    check_finite: bool = True,
) -> Tensor:
    """Scale-invariant LegS scan; ``fast`` computes the exact (zoh) final state."""
    if impl not in LEGS_IMPLS:
        raise ValueError(f"impl must be one of {LEGS_IMPLS}, got {impl!r}")
    if method not in hippo.METHODS:
        raise ValueError(f"method must be one of {hippo.METHODS}, got {method!r}")
    if impl == "fast":
        if method != "zoh" or return_states:
            raise ValueError(
                "the fast LegS scan computes the exact (method='zoh') final state only; "
                f"got method={method!r}, return_states={return_states}: use impl='reference'"
            )
        return legs_scan_fast(x, Bbar, mask, chunk=chunk, check_finite=check_finite)
    return legs_scan_reference(x, Bbar, mask, method, return_states, check_finite)

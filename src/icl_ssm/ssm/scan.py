"""Linear scans ``h_t = Abar h_{t-1} + Bbar x_t`` over token embeddings.

Shapes used throughout::

    x:     (batch, T, H)      token embeddings
    Bbar:  (N, H) or (G, N, H) learned input matrix, one per group of teacher layers
    Abar:  (N, N)             frozen discrete transition, shared by the groups
    mask:  (batch, T) bool    True for real tokens; padding may sit anywhere
    out:   (batch, [G,] N)    final state, or (batch, T, [G,] N) with return_states

Three implementations of the time-invariant scan are kept side by side and tested against
each other:

* :func:`scan_reference` - token by token, obviously correct.
* :func:`scan_paper` - the paper's chunked closed form
  ``s_out = A^C s_in + sum_t A^(C-1-t) u_t``, recomputing the powers in every chunk (kept
  as a comparison row in the benchmark).
* :func:`scan_fast` - the default. Powers of the frozen ``Abar`` are computed once (in
  float64) and cached in a :class:`~icl_ssm.ssm.powers.PowerCache`. For the final state it
  folds the first level of chunking into the input matrix, ``W_j = Abar^(C1-1-j) Bbar``, so
  that every chunk of ``C1`` tokens is reduced by *one* GEMM straight from the embeddings
  (the same shape as the bare projection ``X Bbar^T``); the chunk sums then go through a second
  chunked GEMM against the stacked powers of ``Abar^C1``, and only ``T / (C1 C2)`` small
  steps stay sequential. ``C1`` is chosen from a flop model (``C1 = 1`` is the plain
  ``U = X Bbar^T`` then chunk-GEMM scheme). All states use a chunk-parallel scan. Memory
  beyond the input is ``O(C N^2 + batch T N)``, never ``O(T N^2)``.

The scale-invariant LegS scan, whose step matrices change with time, is :mod:`icl_ssm.ssm.legs`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from icl_ssm.ssm.inputs import check_chunk, finish, project, validate
from icl_ssm.ssm.powers import PowerCache

IMPLS = ("reference", "paper", "fast")


def right_align(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Move each row's real tokens to the end, in order, and zero what precedes them.

    ``x: (B, T, ...)``, ``mask: (B, T)`` -> ``(aligned, order)`` where ``order: (B, T)``
    maps aligned positions to original ones. From a zero state, zero inputs before a
    sequence leave a time-invariant scan unchanged, so aligned rows scan like rows alone.
    """
    order = torch.argsort(mask.to(torch.int8), dim=1, stable=True)  # padding first, then tokens
    index = order.reshape(*order.shape, *([1] * (x.ndim - 2))).expand_as(x)
    keep = torch.gather(mask, 1, order).reshape(*order.shape, *([1] * (x.ndim - 2)))
    return torch.where(keep, torch.gather(x, 1, index), 0), order


def _unalign_states(states: Tensor, order: Tensor, mask: Tensor) -> Tensor:
    """Inverse of :func:`right_align` for ``states: (B, T, ...)``; padding positions -> 0."""
    index = order.reshape(*order.shape, *([1] * (states.ndim - 2))).expand_as(states)
    out = torch.zeros_like(states).scatter(1, index, states)
    return out * mask.reshape(*mask.shape, *([1] * (states.ndim - 2)))


def scan_reference(
    x: Tensor,
    Bbar: Tensor,
    Abar: Tensor,
    mask: Tensor | None = None,
    return_states: bool = False,
    check_finite: bool = True,
) -> Tensor:
    """Token by token: ``h_t = Abar h_{t-1} + Bbar x_t`` for real tokens, ``h_0 = 0``.

    Padding tokens (``mask`` False) leave the state unchanged; their entries in the
    returned states are 0. Returns ``(B, [G,] N)`` or ``(B, T, [G,] N)``.
    """
    inp = validate(x, Bbar, Abar, mask, check_finite)
    B, T, _ = x.shape
    G, N = inp.G, inp.N
    A = Abar.to(x.dtype)
    Bflat = inp.Bbar.reshape(G * N, -1)  # (G*N, H)
    h = x.new_zeros(B, G, N)
    states = []
    for t in range(T):
        new = h @ A.T + (x[:, t] @ Bflat.T).view(B, G, N)
        h = new if mask is None else torch.where(inp.mask[:, t, None, None], new, h)
        if return_states:
            states.append(h if mask is None else h * inp.mask[:, t, None, None])
    if return_states:
        return finish(torch.stack(states, dim=1), inp, 2)
    return finish(h, inp, 1)


def _left_pad(u: Tensor, multiple: int) -> Tensor:
    """Zero-pad ``u: (B, T, ...)`` at the start so that T is a multiple of ``multiple``."""
    r = (-u.shape[1]) % multiple
    if r == 0:
        return u
    return torch.cat([u.new_zeros(u.shape[0], r, *u.shape[2:]), u], dim=1)


def scan_paper(
    x: Tensor,
    Bbar: Tensor,
    Abar: Tensor,
    mask: Tensor | None = None,
    chunk: int = 64,
    check_finite: bool = True,
    max_chunks: int | None = None,
) -> Tensor:
    """The paper's chunked closed form, recomputing ``A^0 .. A^C`` inside every chunk.

    ``max_chunks`` stops after that many chunks (the benchmark times a prefix and
    extrapolates; the returned state is then that of the prefix). Returns ``(B, [G,] N)``.
    """
    check_chunk(chunk)
    inp = validate(x, Bbar, Abar, mask, check_finite)
    xa = x if inp.mask is None else right_align(x, inp.mask)[0]
    u = _left_pad(project(xa, inp.Bbar), chunk)  # (B, T', G, N)
    B, T, G, N = u.shape
    A = Abar.to(x.dtype)
    s = u.new_zeros(B, G, N)
    n_chunks = T // chunk if max_chunks is None else min(T // chunk, max_chunks)
    for c in range(n_chunks):
        powers = [torch.eye(N, dtype=A.dtype, device=A.device)]
        for _ in range(chunk):
            powers.append(A @ powers[-1])
        stacked = torch.stack(powers[chunk - 1 :: -1])  # (C, N, N): A^(C-1-t) for t < C
        uc = u[:, c * chunk : (c + 1) * chunk]  # (B, C, G, N)
        s = s @ powers[chunk].T + torch.einsum("tnm,btgm->bgn", stacked, uc)
    return finish(s, inp, 1)


def scan_groups(x: Tensor, Bbar: Tensor, Abar: Tensor, mask: Tensor | None = None, chunk: int = 32) -> Tensor:
    """Final states with one transition per group, differentiable in ``Abar`` (a learned dt).

    ``x: (B, T, H)``, ``Bbar: (G, N, H)``, ``Abar: (G, N, N)`` -> ``(B, G, N)``. The chunked
    closed form: ``A^0 .. A^C`` once per call (C matrix products per group, kept for the
    backward pass), then one product per chunk. Reference: :func:`scan_reference` per group.
    """
    check_chunk(chunk)
    if Bbar.ndim != 3 or Abar.shape != (Bbar.shape[0], Bbar.shape[1], Bbar.shape[1]):
        raise ValueError(f"Bbar must be (G, N, H) and Abar (G, N, N); got {tuple(Bbar.shape)}, {tuple(Abar.shape)}")
    xa = x if mask is None else right_align(x, mask.bool())[0]
    u = _left_pad(project(xa, Bbar.to(x.dtype)), chunk)  # (B, T', G, N)
    A = Abar.to(x.dtype)
    powers = [torch.eye(A.shape[-1], dtype=A.dtype, device=A.device).expand_as(A)]
    for _ in range(chunk):
        powers.append(A @ powers[-1])
    stacked = torch.stack(powers[chunk - 1 :: -1])  # (C, G, N, N): A^(C-1-t) for t < C
    s = u.new_zeros(u.shape[0], *u.shape[2:])
    for c in range(u.shape[1] // chunk):
        uc = u[:, c * chunk : (c + 1) * chunk]  # (B, C, G, N)
        s = torch.einsum("bgm,gnm->bgn", s, powers[chunk]) + torch.einsum("tgnm,btgm->bgn", stacked, uc)
    return s


def scan_groups_reference(x: Tensor, Bbar: Tensor, Abar: Tensor, mask: Tensor | None = None) -> Tensor:
    """:func:`scan_groups` token by token, one group at a time."""
    return torch.stack([scan_reference(x, Bbar[g : g + 1], Abar[g], mask, check_finite=False)[:, 0]
                        for g in range(Bbar.shape[0])], dim=1)


def plan_fold(batch: int, T: int, H: int, N: int, G: int = 1) -> int:
    """Fold size ``C1`` for :func:`scan_fast`'s final-state path.

    Folding costs ``2 C1 G N^2 H`` flops once per call (forming ``W``) and divides the
    second-level GEMM's ``2 (batch T / C1) G N^2`` by ``C1``; the flop optimum is
    ``sqrt(batch T / H)``. The second-level GEMM is thinner and runs slower per flop than
    the first, so the measured optimum (BENCHMARKS.md) sits about 1.4x higher. Rounded to a
    power of two, capped at 32 so that ``W`` stays small. 1 means no folding (short prompts).
    """
    best = math.sqrt(2 * max(batch * T, 1) / max(H, 1))
    c1 = 2 ** round(math.log2(best)) if best >= 3 else 1  # folding by 2 never pays for W
    return int(min(c1, 32, T))


def plan_chunk(n: int) -> int:
    """Second-level chunk ``C2`` for a sequence of ``n`` first-level sums.

    ``sqrt(n)`` balances the GEMM's row count ``n / C2`` against the ``n / C2``
    sequential steps; clamped to [8, 32] (larger reducers, ``C2 N x N``, cost more memory
    traffic than they save).
    """
    return int(min(32, max(8, 2 ** round(math.log2(max(n, 1)) / 2))))


def _chunk_sums(u: Tensor, reducer: Tensor) -> Tensor:
    """Per-chunk contributions ``S_c = sum_j P^(C-1-j) u_{c,j}`` as one GEMM.

    ``u: (B, n, C, G, N)`` and ``reducer: (C * N, N)``
    (:meth:`~icl_ssm.ssm.powers.PowerCache.reducer`) -> ``(B, n, G, N)``.
    """
    B, n, C, G, N = u.shape
    if G == 1:
        return (u.reshape(B * n, C * N) @ reducer).view(B, n, 1, N)
    ug = u.permute(0, 1, 3, 2, 4).reshape(B * n * G, C * N)  # (B*n*G, C*N)
    return (ug @ reducer).view(B, n, G, N)


def _scan_chunks(v: Tensor, cache: PowerCache, step: int, chunk: int) -> Tensor:
    """Final state of ``s_i = P s_{i-1} + v_i`` with ``P = Abar^step``, ``v: (B, n, G, N)``.

    One GEMM for all chunk sums, then ``n / chunk`` sequential steps.
    """
    v = _left_pad(v, chunk)
    B, n, G, N = v.shape
    reducer = cache.reducer(step, chunk, v.dtype, v.device)  # (chunk*N, N)
    sums = _chunk_sums(v.view(B, n // chunk, chunk, G, N), reducer)  # (B, n/chunk, G, N)
    carry = cache.stack(step, chunk, v.dtype, v.device)[chunk].T
    s = sums[:, 0]
    for c in range(1, sums.shape[1]):
        s = s @ carry + sums[:, c]
    return s


def scan_fast(
    x: Tensor,
    Bbar: Tensor,
    Abar: Tensor | PowerCache,
    mask: Tensor | None = None,
    chunk: int | None = None,
    fold: int | None = None,
    return_states: bool = False,
    check_finite: bool = True,
) -> Tensor:
    """GEMM-shaped scan with cached powers; same result as :func:`scan_reference`.

    ``Abar`` may be a :class:`~icl_ssm.ssm.powers.PowerCache` (reuse it across calls: the
    powers are computed once). ``chunk`` is the second-level chunk ``C2`` (default :func:`plan_chunk`) and the
    chunk of the all-states scan (default 64); ``fold`` the first-level fold ``C1``
    (default :func:`plan_fold`).
    Returns ``(B, [G,] N)`` or ``(B, T, [G,] N)``.
    """
    if chunk is not None:
        check_chunk(chunk)
    cache = Abar if isinstance(Abar, PowerCache) else None
    A_for_check = cache.Abar.to(x.dtype) if cache is not None and isinstance(x, Tensor) else Abar
    inp = validate(x, Bbar, A_for_check, mask, check_finite)
    if cache is None:
        cache = PowerCache(Abar)
    order = None
    if inp.mask is not None:
        x, order = right_align(x, inp.mask)
    if return_states:
        states = _states_fast(x, inp.Bbar, cache, chunk or 64)  # (B, T, G, N)
        if order is not None:
            states = _unalign_states(states, order, inp.mask)
        return finish(states, inp, 2)
    B, T, H = x.shape
    G, N = inp.G, inp.N
    c1 = plan_fold(B, T, H, N, G) if fold is None else fold
    check_chunk(c1)
    c1 = min(c1, T)
    if c1 == 1:
        u = project(x, inp.Bbar)  # (B, T, G, N)
        return finish(_scan_chunks(u, cache, 1, chunk or plan_chunk(T)), inp, 1)
    W = cache.folded(Bbar, c1)  # (C1*H, G*N)
    head, q = T % c1, T // c1
    pieces = []
    if head:  # the first T mod C1 tokens: their state after `head` steps
        pieces.append((x[:, :head].reshape(B, head * H) @ W[(c1 - head) * H :]).view(B, 1, G, N))
    if q:
        body = x[:, head:].reshape(B, q, c1 * H)  # a view: rows are contiguous in (T, H)
        pieces.append((body @ W).view(B, q, G, N))
    v = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)  # (B, n, G, N)
    return finish(_scan_chunks(v, cache, c1, chunk or plan_chunk(v.shape[1])), inp, 1)


def _states_fast(x: Tensor, Bg: Tensor, cache: PowerCache, chunk: int) -> Tensor:
    """All states by a chunk-parallel scan: ``(B, T, H) -> (B, T, G, N)``.

    1. local states inside every chunk from a zero start: ``chunk`` sequential GEMMs, each
       batched over all chunks; 2. the state entering each chunk: ``T / chunk`` steps;
    3. ``state = local + Abar^(j+1) carry`` for all positions as one GEMM.
    """
    B, T, _ = x.shape
    G, N = Bg.shape[:2]
    u = _left_pad(project(x, Bg), chunk)  # (B, T', G, N)
    n = u.shape[1] // chunk
    u = u.view(B, n, chunk, G, N)
    powers = cache.stack(1, chunk, x.dtype, x.device)  # (C+1, N, N)
    A_T = powers[1].T
    local = [u[:, :, 0]]
    for j in range(1, chunk):
        local.append(local[-1] @ A_T + u[:, :, j])
    local = torch.stack(local, dim=2)  # (B, n, C, G, N)
    carries = [u.new_zeros(B, G, N)]
    carry_T = powers[chunk].T
    for c in range(n - 1):
        carries.append(carries[-1] @ carry_T + local[:, c, -1])
    carries = torch.stack(carries, dim=1)  # (B, n, G, N): state before chunk c
    lift = cache.lifter(chunk, x.dtype, x.device)  # (N, C*N): block j is (Abar^(j+1))^T
    carried = (carries @ lift).view(B, n, G, chunk, N).transpose(2, 3)  # (B, n, C, G, N)
    states = (local + carried).reshape(B, n * chunk, G, N)
    return states[:, n * chunk - T :]


def scan(
    x: Tensor,
    Bbar: Tensor,
    Abar: Tensor | PowerCache,
    mask: Tensor | None = None,
    impl: str = "fast",
    chunk: int | None = None,
    return_states: bool = False,
    check_finite: bool = True,
) -> Tensor:
    """Dispatch to one of :data:`IMPLS` (see the module docstring for shapes).

    ``chunk`` defaults to the fast scan's plan and to 64 for the paper's scan."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "fast":
        return scan_fast(x, Bbar, Abar, mask, chunk=chunk, return_states=return_states,
                         check_finite=check_finite)
    A = Abar.Abar if isinstance(Abar, PowerCache) else Abar
    if impl == "reference":
        return scan_reference(x, Bbar, A, mask, return_states=return_states,
                              check_finite=check_finite)
    if return_states:
        raise ValueError("impl='paper' computes final states only; use 'fast' or 'reference'")
    return scan_paper(x, Bbar, A, mask, chunk=chunk or 64, check_finite=check_finite)

"""Powers of a frozen transition ``Abar: (N, N)`` for :func:`~icl_ssm.ssm.scan.scan_fast`,
computed once in float64 and cast on demand (:class:`PowerCache`): the stacked powers, the
chunk reducers, the folded input matrix and the lifter that the fast scan multiplies by."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor

from icl_ssm.ssm.inputs import shape_of


@dataclass
class PowerCache:
    """Powers of a frozen ``Abar: (N, N)``, computed once in float64 and cast on demand.

    ``stack(step, n, dtype, device)`` returns ``(n + 1, N, N)`` with entry j equal to
    ``Abar^(step * j)``. Powers are built by repeated multiplication in float64, whose error
    grows linearly in the exponent (repeated squaring amplifies it).
    """

    Abar: Tensor
    _master: dict = field(default_factory=dict, repr=False)
    _cast: dict = field(default_factory=dict, repr=False)
    _folded: tuple | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        A = self.Abar
        if not isinstance(A, Tensor) or A.ndim != 2 or A.shape[0] != A.shape[1]:
            got = shape_of(A) if isinstance(A, Tensor) else type(A).__name__
            raise ValueError(f"Abar must be a square (N, N) tensor, got {got}")
        if not torch.isfinite(A).all():
            raise ValueError("Abar has non-finite values; it must be finite")
        self.Abar = A.detach().to(torch.float64)

    @property
    def N(self) -> int:
        return self.Abar.shape[0]

    def _power(self, k: int) -> Tensor:
        key = ("power", k)
        if key not in self._master:
            out, base, e = torch.eye(self.N, dtype=torch.float64, device=self.Abar.device), self.Abar, k
            while e:
                if e & 1:
                    out = out @ base
                base, e = base @ base, e >> 1
            self._master[key] = out
        return self._master[key]

    def stack(self, step: int, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        key = (step, n, dtype, torch.device(device))
        if key not in self._cast:
            base = self.Abar if step == 1 else self._power(step)
            powers = [torch.eye(self.N, dtype=torch.float64, device=base.device)]
            for _ in range(n):
                powers.append(base @ powers[-1])
            self._cast[key] = torch.stack(powers).to(dtype=dtype, device=device)
        return self._cast[key]

    def reducer(self, step: int, C: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """``(C * N, N)`` matrix with row block j equal to ``(P^(C-1-j))^T``, ``P = Abar^step``.

        A chunk ``u: (C, N)`` flattened to ``(C * N,)`` times this matrix is
        ``sum_j P^(C-1-j) u_j``: all chunks of a sequence reduce in one GEMM.
        """
        key = ("reducer", step, C, dtype, torch.device(device))
        if key not in self._cast:
            powers = self.stack(step, C, dtype, device)
            self._cast[key] = powers[:C].flip(0).transpose(1, 2).reshape(C * self.N, self.N)
        return self._cast[key]

    def folded(self, Bbar: Tensor, c1: int) -> Tensor:
        """``W: (C1 * H, G * N)`` with ``W[(j, h), (g, n)] = (Abar^(C1-1-j) Bbar_g)[n, h]``.

        One GEMM with it reduces a chunk of ``C1`` embeddings straight to its state
        contribution. ``W`` depends only on frozen powers and on ``Bbar: (G, N, H)`` (or
        ``(N, H)``); it is
        kept for the most recent ``Bbar`` (the same tensor object, unmodified since) when no
        gradient flows to it, as in selection, where one compressor scores many subsets.
        """
        key = (c1, Bbar.dtype, Bbar.device, Bbar._version)
        cacheable = not (torch.is_grad_enabled() and Bbar.requires_grad)
        hit = self._folded
        if cacheable and hit is not None and hit[0] == key and hit[1]() is Bbar:
            return hit[2]
        Bg = Bbar if Bbar.ndim == 3 else Bbar[None]
        G, N, H = Bg.shape
        P = self.stack(1, c1, Bbar.dtype, Bbar.device)  # (C1+1, N, N)
        # (C1*N, N) @ (N, G*H), then reorder to rows (j, h) and columns (g, n)
        PB = P[:c1].flip(0).reshape(c1 * N, N) @ Bg.permute(1, 0, 2).reshape(N, G * H)
        W = PB.view(c1, N, G, H).permute(0, 3, 2, 1).reshape(c1 * H, G * N)
        self._folded = (key, weakref.ref(Bbar), W) if cacheable else None
        return W

    def lifter(self, C: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """``(N, C * N)`` matrix with column block j equal to ``(Abar^(j+1))^T``."""
        key = ("lifter", C, dtype, torch.device(device))
        if key not in self._cast:
            powers = self.stack(1, C, dtype, device)
            self._cast[key] = powers[1:].transpose(1, 2).permute(1, 0, 2).reshape(self.N, C * self.N)
        return self._cast[key]

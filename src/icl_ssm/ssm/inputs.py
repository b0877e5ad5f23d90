"""The inputs every scan takes, checked once: ``x: (batch, T, H)``, ``Bbar: (N, H)`` or
``(G, N, H)``, ``Abar: (N, N)``, ``mask: (batch, T)`` (the shapes of :mod:`icl_ssm.ssm.scan`);
the projection ``U = X Bbar^T`` that every scan starts from; and the result checked for
finiteness in place of the (much larger) input."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class ScanInputs:
    """One scan's inputs as :func:`validate` checked them; ``Bbar`` always grouped, ``(G, N, H)``."""

    x: Tensor  # (B, T, H)
    Bbar: Tensor  # (G, N, H)
    mask: Tensor | None  # (B, T) bool
    grouped: bool  # whether the caller passed (G, N, H)
    check_finite: bool = True

    @property
    def N(self) -> int:
        return self.Bbar.shape[1]

    @property
    def G(self) -> int:
        return self.Bbar.shape[0]



def shape_of(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)



def validate(
    x: Tensor, Bbar: Tensor, Abar: Tensor | None, mask: Tensor | None, check_finite: bool
) -> ScanInputs:
    if not isinstance(x, Tensor) or x.ndim != 3:
        got = shape_of(x) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a (batch, T, H) tensor, got {got}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    B, T, H = x.shape
    if T == 0:
        raise ValueError("x has T = 0 tokens; a scan needs T >= 1")
    if B == 0:
        raise ValueError("x has batch = 0; a scan needs at least one sequence")
    if not isinstance(Bbar, Tensor) or Bbar.ndim not in (2, 3):
        got = shape_of(Bbar) if isinstance(Bbar, Tensor) else type(Bbar).__name__
        raise ValueError(f"Bbar must be (N, H) or (G, N, H), got {got}")
    grouped = Bbar.ndim == 3
    Bg = Bbar if grouped else Bbar[None]
    if Bg.shape[1] <= 0 or Bg.shape[0] <= 0:
        raise ValueError(f"Bbar must have N >= 1 and G >= 1, got shape {shape_of(Bbar)}")
    if Bg.shape[2] != H:
        raise ValueError(
            f"Bbar's last dim must equal x's H = {H}, got Bbar of shape {shape_of(Bbar)}"
        )
    if Bg.dtype != x.dtype or Bg.device != x.device:
        raise ValueError(
            f"Bbar must match x's dtype and device ({x.dtype}, {x.device}), "
            f"got ({Bg.dtype}, {Bg.device})"
        )
    N = Bg.shape[1]
    if Abar is not None:
        if not isinstance(Abar, Tensor) or shape_of(Abar) != (N, N):
            got = shape_of(Abar) if isinstance(Abar, Tensor) else type(Abar).__name__
            raise ValueError(f"Abar must be (N, N) = ({N}, {N}) to match Bbar, got {got}")
    if mask is not None:
        if not isinstance(mask, Tensor) or shape_of(mask) != (B, T):
            got = shape_of(mask) if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"mask must be (batch, T) = ({B}, {T}), got {got}")
        if mask.dtype != torch.bool:
            if mask.is_floating_point() or not ((mask == 0) | (mask == 1)).all():
                raise ValueError(f"mask must be bool or 0/1 integers, got dtype {mask.dtype}")
            mask = mask.bool()
        mask = mask.to(x.device)
    if check_finite:  # the parameters are small; x is checked through the result (see finish)
        for name, t in (("Bbar", Bbar), ("Abar", Abar)):
            if t is not None and not torch.isfinite(t).all():
                bad = (~torch.isfinite(t)).sum().item()
                raise ValueError(f"{name} has {bad} non-finite values (nan or inf); inputs must be finite")
    return ScanInputs(x=x, Bbar=Bg, mask=mask, grouped=grouped, check_finite=check_finite)



def finish(out: Tensor, inp: ScanInputs, group_dim: int) -> Tensor:
    """Check the result instead of the (much larger) input: a nan or inf in a real token of
    ``x`` reaches the state, so a finite result proves finite inputs at no cost. Only on
    failure are the inputs searched, to name the culprit."""
    if inp.check_finite and not torch.isfinite(out).all():
        bad = ~torch.isfinite(inp.x)
        if inp.mask is not None:
            bad &= inp.mask[..., None]
        if bad.any():
            raise ValueError(
                f"x has {int(bad.sum())} non-finite values (nan or inf) in real tokens; inputs must be finite"
            )
        raise ValueError("the scan overflowed to nan/inf from finite inputs; scale x down or use float64")
    return out if inp.grouped else out.squeeze(group_dim)



def check_chunk(chunk: int) -> None:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")



def project(x: Tensor, Bg: Tensor) -> Tensor:
    """``U = X Bbar^T`` as one GEMM: ``(B, T, H), (G, N, H) -> (B, T, G, N)``."""
    G, N, H = Bg.shape
    return (x @ Bg.reshape(G * N, H).T).view(*x.shape[:2], G, N)


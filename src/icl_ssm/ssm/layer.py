"""The state space layer the compressor reads prompts with: a frozen HiPPO-LegS transition
and a learned input matrix per group of teacher layers.

``HiPPOSSM(x: (B, T, H), mask: (B, T)) -> (B, G, N)``: the final state of every group.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from icl_ssm.ssm import hippo
from icl_ssm.ssm import scan as S
from icl_ssm.ssm.legs import legs_scan
from icl_ssm.ssm.powers import PowerCache

SYSTEMS = ("time_invariant", "scale_invariant")


def validate_learn_dt(learn_dt: bool, system: str) -> None:
    if learn_dt and system != "time_invariant":
        raise ValueError(f"learn_dt needs system='time_invariant' (a scale-invariant scan has no dt), got {system!r}; "
                         "pass --system time_invariant with --learn-dt")


def validate_channels(channels: int, state_size: int) -> None:
    if isinstance(channels, bool) or not isinstance(channels, int) or channels <= 0 or state_size % channels:
        raise ValueError(f"channels must be a positive divisor of state_size={state_size}, got {channels!r}")


class HiPPOSSM(nn.Module):
    """G parallel SSMs sharing one frozen transition, ``h_t = Abar h_{t-1} + Bbar_g x_t``.

    * ``system="time_invariant"``: ``Abar`` from :func:`hippo.discretize` with step ``dt``
      (``method`` bilinear or zoh); the scan is :func:`scan.scan_fast` with powers cached.
    * ``system="scale_invariant"``: the exact (zoh) LegS scan, :func:`legs.legs_scan`; its
      state is the Legendre projection of the whole prompt, whatever its length.

    ``Bbar: (G, N, H)`` is initialised so that each state coordinate starts with unit-scale
    inputs for unit-scale embeddings. ``impl`` selects the scan (``reference`` for checks).

    ``channels = P`` splits each group's state into P independent LegS memories of
    ``N / P`` coefficients (a block-diagonal transition, as S4 gives every input channel its
    own): each reads its own projection of the embeddings. With ``P = 1`` (the paper's
    layout) the N coefficients are the Legendre expansion of one mixture of projections, so
    only ``Bbar[0]``'s projection of the prompt's average survives in the slowest mode; with
    P channels, P projections of the average do. The scan runs as ``G * P`` groups of state
    size ``N / P``.

    ``learn_dt=True`` (time-invariant only) makes ``log dt`` a parameter, one per group,
    starting at ``log(dt)``: the transitions are rediscretised at every call and the scan is
    :func:`scan.scan_groups`, through which the gradient reaches ``log_dt``.
    """

    def __init__(
        self,
        state_size: int,
        input_size: int,
        groups: int = 1,
        system: str = "time_invariant",
        dt: float = 0.01,
        method: str = "bilinear",
        impl: str = "fast",
        learn_dt: bool = False,
        channels: int = 1,
    ) -> None:
        super().__init__()
        if system not in SYSTEMS:
            raise ValueError(f"system must be one of {SYSTEMS}, got {system!r}")
        for name, value in (("state_size", state_size), ("input_size", input_size), ("groups", groups)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        validate_channels(channels, state_size)
        self.system, self.dt, self.method, self.impl = system, dt, method, impl
        self.channels = channels
        A, B = hippo.transition("legs", state_size // channels)
        if system == "time_invariant":
            hippo.discretize(A[:1, :1], B[:1], dt, method)  # validates dt and method early
        elif method not in hippo.METHODS:
            raise ValueError(f"method must be one of {hippo.METHODS}, got {method!r}")
        validate_learn_dt(learn_dt, system)
        self.learn_dt = learn_dt
        if learn_dt:
            self.log_dt = nn.Parameter(torch.full((groups,), math.log(dt)))
        # HiPPO's B spread over the embedding directions, plus a small random part
        gen = torch.Generator().manual_seed(0)
        rand = torch.randn(groups, state_size, input_size, generator=gen) / math.sqrt(input_size)
        scale = B.float().abs().clamp_min(1e-3).repeat(channels)  # each channel's LegS B
        self.Bbar = nn.Parameter(rand * scale[:, None].to(rand.device))
        # the frozen transition is derived from the config, built on first use (on the CPU in
        # float64, whatever device the module was created on) and never saved
        self._cache: PowerCache | None = None
        self._A: Tensor | None = None  # learn_dt: the continuous transition, rediscretised every call

    @property
    def groups(self) -> int:
        return self.Bbar.shape[0]

    @property
    def state_size(self) -> int:
        return self.Bbar.shape[1]

    @property
    def channel_size(self) -> int:
        """Coefficients per LegS memory, ``N / channels``."""
        return self.state_size // self.channels

    def power_cache(self, device: torch.device) -> PowerCache:
        """Powers of the discrete transition on ``device``, computed once."""
        if self._cache is None or self._cache.Abar.device != torch.device(device):
            A, B = hippo.transition("legs", self.channel_size)
            Abar, _ = hippo.discretize(A, B, self.dt, self.method)
            self._cache = PowerCache(Abar.to(device))
        return self._cache

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x: (B, T, H)``, ``mask: (B, T)`` -> final states ``(B, G, N)``."""
        G, P = self.groups, self.channels
        Bbar = self.Bbar.to(x.dtype).reshape(G * P, self.channel_size, -1)  # each channel a group of its own
        return self._scan(x, Bbar, mask).reshape(x.shape[0], G, self.state_size)

    def _scan(self, x: Tensor, Bbar: Tensor, mask: Tensor | None) -> Tensor:
        if self.system == "scale_invariant":
            return legs_scan(x, Bbar, mask, impl=self.impl, check_finite=False)
        if self.learn_dt:
            if self._A is None or self._A.device != x.device:  # the continuous LegS matrix, built once
                self._A = hippo.transition("legs", self.channel_size)[0].to(x.device)
            Abar = hippo.discretize_steps(self._A, self.log_dt.double().exp(), self.method)
            Abar = Abar.repeat_interleave(self.channels, dim=0)  # (G * P, n, n): a group's channels share its dt
            if self.impl == "fast":
                return S.scan_groups(x, Bbar, Abar, mask)
            return S.scan_groups_reference(x, Bbar, Abar.to(x.dtype), mask)
        cache = self.power_cache(x.device)
        if self.impl == "fast":
            return S.scan_fast(x, Bbar, cache, mask, check_finite=False)
        return S.scan(x, Bbar, cache.Abar.to(x.dtype), mask, impl=self.impl, check_finite=False)

    def extra_repr(self) -> str:
        return (f"groups={self.groups}, state_size={self.state_size}, channels={self.channels}, system={self.system}, "
                f"dt={self.dt}, method={self.method}, learn_dt={self.learn_dt}")

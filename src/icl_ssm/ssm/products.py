"""Products of each token with the tokens just before it: the multiplicative input of H3
(Fu et al., 2023, "Hungry Hungry Hippos"), placed in front of the HiPPO scan.

The SSM's final state is a linear function of what it reads. Read from the token embeddings,
it holds position-weighted sums of single tokens, and no head placed after it can recover a
quantity that depends on two tokens at once: whether a label fits its text, or in regression
the products ``x_i * y`` whose sum over the prompt is ``X^T y``. Feeding the scan the products

    ``f_t = (sum_{j=1..w} c_j * K e_{t-j}) * (V e_t)``     (elementwise, ``P`` features)

lets the same linear state sum those interactions: at a label token, ``f_t`` multiplies the
label's projection with a learned causal filter of the ``w`` tokens before it. The filter
starts as a shift by one token (``c_1 = 1``), H3's shift SSM in its simplest form.

:class:`ShiftProducts` computes the filter as a depthwise convolution;
:func:`shift_products_reference` is the loop over positions and lags it is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class ShiftProducts(nn.Module):
    """``x: (B, T, H)`` -> products ``(B, T, P)`` of each token with a learned causal filter
    of the ``window`` tokens before it (zero where there are none). The tokens are
    layer-normalised (no affine) first, so the products have unit scale whatever the scale
    of the teacher's embeddings. Masked tokens (``mask: (B, T)`` False) contribute nothing to
    the filter of the tokens after them."""

    def __init__(self, input_size: int, size: int, window: int = 1) -> None:
        super().__init__()
        for name, value in (("input_size", input_size), ("size", size), ("window", window)):
            _check_positive(name, value)
        self.window = window
        self.key = nn.Linear(input_size, size)
        self.value = nn.Linear(input_size, size)
        taps = torch.zeros(size, window)
        taps[:, 0] = 1.0  # lag 1: the token just before
        self.taps = nn.Parameter(taps)  # (P, w): taps[:, j] weighs the token j + 1 positions back

    def project(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Keys and values ``(B, T, P)`` of the normalised tokens; masked keys are zero."""
        x = F.layer_norm(x, x.shape[-1:])
        k, v = self.key(x), self.value(x)
        if mask is not None:
            k = k * mask[..., None].to(k.dtype)
        return k, v

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        k, v = self.project(x, mask)
        T, w = x.shape[1], self.window
        padded = F.pad(k.transpose(1, 2), (w, 0))  # (B, P, w + T): w zeros before the first token
        weight = self.taps.flip(-1)[:, None].to(k.dtype)  # (P, 1, w): conv1d correlates, lag w first
        filtered = F.conv1d(padded, weight, groups=k.shape[-1])[..., :T]  # position t: lags 1..w
        return filtered.transpose(1, 2) * v


def shift_products_reference(module: ShiftProducts, x: Tensor, mask: Tensor | None = None) -> Tensor:
    """:class:`ShiftProducts` by a loop over positions and lags (for tests)."""
    k, v = module.project(x, mask)
    out = torch.zeros_like(v)
    for t in range(x.shape[1]):
        for lag in range(1, module.window + 1):
            if t - lag >= 0:
                out[:, t] += module.taps[:, lag - 1].to(k.dtype) * k[:, t - lag] * v[:, t]
    return out

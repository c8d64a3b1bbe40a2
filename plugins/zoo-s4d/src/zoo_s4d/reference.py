"""A readable S4D layer: the maths as a reader writes it down (models.md §3).

This is the teaching counterpart of ``zoo_s4d.core.S4D`` in the spirit of the original
``s4d.py``: one class, the whole (H, P, L) Vandermonde matrix built with complex ``exp``, then a
2L-padded rfft convolution. It has no backends, no streaming state and ZOH only, so that every line
maps to a formula; ``plugins/zoo-s4d/tests/test_reference.py`` holds the core to it (float64,
outputs and gradients), and the benchmark harness times the core against it as its peer
(``python -m benchmarks run s4d``). Written from the formulas, not taken from any repository.

Letters: B batch, L length, H channels, P = N/2 stored conjugate pairs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn


class StraightforwardS4D(nn.Module):
    """y = K * u + D·u with K_l = 2 Re Σ_p C_p B̄_p exp(l·Δλ_p) (ZOH), computed in one broadcast."""

    def __init__(self, d_model: int, d_state: int = 64, *, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        H, P = d_model, d_state // 2
        real = dtype or torch.get_default_dtype()
        cplx = torch.complex128 if real == torch.float64 else torch.complex64
        self.log_dt = nn.Parameter(torch.empty(H, dtype=real))  # (H)
        self.log_A_real = nn.Parameter(torch.full((H, P), -0.6931, dtype=real))  # (H, P): Re λ = −exp(·)
        self.A_imag = nn.Parameter(torch.pi * torch.arange(P, dtype=real).expand(H, P).clone())  # (H, P)
        self.B = nn.Parameter(torch.view_as_real(torch.ones(H, P, dtype=cplx)))  # (H, P, 2)
        self.C = nn.Parameter(torch.view_as_real(torch.randn(H, P, dtype=cplx)))  # (H, P, 2)
        self.D = nn.Parameter(torch.randn(H, dtype=real))  # (H)
        nn.init.uniform_(self.log_dt, -6.9078, -2.3026)  # Δ log-uniform in [1e-3, 1e-1]

    def kernel(self, L: int) -> Tensor:
        """K (H, L): ZOH B̄ = (exp(ΔA) − 1)/A · B, then the Vandermonde sum over the P pairs."""
        dt = torch.exp(self.log_dt)  # (H)
        A = torch.complex(-torch.exp(self.log_A_real), self.A_imag)  # (H, P)
        dtA = A * dt[:, None]  # (H, P)
        B_bar = torch.expm1(dtA) / A * torch.view_as_complex(self.B)  # (H, P)  ZOH
        CB = torch.view_as_complex(self.C) * B_bar  # (H, P)
        V = torch.exp(dtA[..., None] * torch.arange(L, device=A.device))  # (H, P, L) Vandermonde
        return 2 * torch.einsum("hp,hpl->hl", CB, V).real  # (H, L)

    def forward(self, u: Tensor) -> Tensor:
        """u (B, L, H) → y (B, L, H): causal convolution with K (zero-padded to 2L) plus D·u."""
        L = u.shape[1]
        k_f = torch.fft.rfft(self.kernel(L), n=2 * L)  # (H, L+1)
        u_f = torch.fft.rfft(u.transpose(1, 2), n=2 * L)  # (B, H, L+1)
        y = torch.fft.irfft(u_f * k_f, n=2 * L)[..., :L]  # (B, H, L)
        return y.transpose(1, 2) + u * self.D  # (B, L, H)


@torch.no_grad()
def copy_from_zoo(zoo_layer: Any) -> StraightforwardS4D:
    """A StraightforwardS4D holding the same parameters as a zoo ``S4D`` (ZOH, any init, its dtype).

    The core stores Δ as ``exp(log_dt) · dt_scale``; here the scale is folded into ``log_dt`` as a
    python float, so a float64 layer is not rounded through a float32 log.
    """
    if zoo_layer.discretizer != "zoh":
        raise ValueError(f"StraightforwardS4D is ZOH only; the zoo layer uses {zoo_layer.discretizer!r}")
    H, P = zoo_layer.A_imag.shape
    layer = StraightforwardS4D(H, 2 * P, dtype=zoo_layer.log_dt.dtype).to(zoo_layer.log_dt.device)
    layer.log_dt.copy_(zoo_layer.log_dt + math.log(float(zoo_layer.dt_scale)))  # in the layer's own precision
    for name in ("log_A_real", "A_imag", "B", "C", "D"):
        getattr(layer, name).copy_(getattr(zoo_layer, name))
    return layer

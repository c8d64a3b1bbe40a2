"""A straightforward S4D layer (models.md §3): the comparison point for ``bench_s4d.py``.

It builds the whole (H, P, L) Vandermonde matrix with complex ``exp``, the way a reader would
write the maths down, then convolves by a 2L-padded rfft. Written for this benchmark from the
formulas, not taken from any repository.

Letters: B batch, L length, H channels, P = N/2 stored conjugate pairs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class StraightforwardS4D(nn.Module):
    """y = K * u + D·u with K_l = 2 Re Σ_p C_p B̄_p exp(l·Δλ_p) (ZOH), computed in one broadcast."""

    def __init__(self, d_model: int, d_state: int = 64) -> None:
        super().__init__()
        H, P = d_model, d_state // 2
        self.log_dt = nn.Parameter(torch.empty(H))  # (H)
        self.log_A_real = nn.Parameter(torch.full((H, P), -0.6931))  # (H, P): Re λ = −exp(·)
        self.A_imag = nn.Parameter(torch.pi * torch.arange(P).float().expand(H, P).clone())  # (H, P)
        self.B = nn.Parameter(torch.view_as_real(torch.ones(H, P, dtype=torch.cfloat)))  # (H, P, 2)
        self.C = nn.Parameter(torch.view_as_real(torch.randn(H, P, dtype=torch.cfloat)))  # (H, P, 2)
        self.D = nn.Parameter(torch.randn(H))  # (H)
        nn.init.uniform_(self.log_dt, -6.9078, -2.3026)  # Δ log-uniform in [1e-3, 1e-1]

    def kernel(self, L: int) -> Tensor:
        dt = torch.exp(self.log_dt)  # (H)
        A = torch.complex(-torch.exp(self.log_A_real), self.A_imag)  # (H, P)
        dtA = A * dt[:, None]  # (H, P)
        B_bar = torch.expm1(dtA) / A * torch.view_as_complex(self.B)  # (H, P)  ZOH
        CB = torch.view_as_complex(self.C) * B_bar  # (H, P)
        V = torch.exp(dtA[..., None] * torch.arange(L, device=A.device))  # (H, P, L) Vandermonde
        return 2 * torch.einsum("hp,hpl->hl", CB, V).real  # (H, L)

    def forward(self, u: Tensor) -> Tensor:
        L = u.shape[1]
        k_f = torch.fft.rfft(self.kernel(L), n=2 * L)  # (H, L+1)
        u_f = torch.fft.rfft(u.transpose(1, 2), n=2 * L)  # (B, H, L+1)
        y = torch.fft.irfft(u_f * k_f, n=2 * L)[..., :L]  # (B, H, L)
        return y.transpose(1, 2) + u * self.D  # (B, L, H)


@torch.no_grad()
def copy_from_zoo(zoo_layer: nn.Module) -> StraightforwardS4D:
    """A StraightforwardS4D holding the same parameters as a zoo ``S4D`` (ZOH, any init)."""
    if zoo_layer.discretizer != "zoh":
        raise ValueError(f"StraightforwardS4D is ZOH only; the zoo layer uses {zoo_layer.discretizer!r}")
    H, P = zoo_layer.A_imag.shape
    layer = StraightforwardS4D(H, 2 * P)
    layer.log_dt.copy_(zoo_layer.log_dt + torch.log(torch.tensor(float(zoo_layer.dt_scale))))
    for name in ("log_A_real", "A_imag", "B", "C", "D"):
        getattr(layer, name).copy_(getattr(zoo_layer, name))
    return layer

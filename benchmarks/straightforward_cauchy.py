"""A straightforward S4 Cauchy kernel: the peer of the ``s4/kernel`` benchmark family.

The maths of ``zoo_core.kernels.dplr.kernel_cauchy`` (generating function at the roots of unity,
four Cauchy sums over the conjugate-completed state, division-free rank-1 Woodbury, irfft), written
the way a reader would put it down: one broadcast over the whole (H, N, F) array of reciprocals,
no chunks, plain autograd. Written for this benchmark from the formulas, not taken from any
repository.

Letters: H channels, M stored half state, N = 2M full state, L length, F = ⌊L/2⌋ + 1 frequencies.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from benchmarks.harness import rel
from zoo_core.kernels.systems import DPLRSystem


def _full(x: Tensor) -> Tensor:
    """Conjugate completion (H, M) → (H, N)."""
    return torch.cat([x, x.conj()], -1)


def straightforward_cauchy(system: DPLRSystem, L: int) -> Tensor:
    """K = irfft(K̂), K̂(ω) = 2Δ (k00 − k01 · Δ(1+ω) k10 / (1 + Δ(1+ω) k11)) at ω_k = exp(−2πik/L).

    k_ab = Σ_n v_n / (2(1−ω) − (1+ω)Δλ_n) over the full state, v = C̃B, C̃P, P*B, P*P.

    Args:
        system: ``DPLRSystem`` (Lambda, P, B, C̃: (H, M); dt: (H,)), all of one precision.
        L: kernel length.

    Returns:
        (H, L) real kernel.
    """
    lam, p, b, c = system.Lambda, system.P, system.B, system.C  # (H, M) each
    dt = system.dt[:, None]  # (H, 1)
    omega = torch.polar(torch.ones(L // 2 + 1, dtype=torch.float64),
                        -2 * math.pi * torch.arange(L // 2 + 1, dtype=torch.float64) / L)  # (F)
    one_m, one_p = (1 - omega).to(lam.dtype), (1 + omega).to(lam.dtype)  # (F) each
    r = 1 / (2 * one_m - one_p * (dt * _full(lam))[..., None])  # (H, N, F)

    def cauchy(v: Tensor) -> Tensor:
        return (_full(v)[..., None] * r).sum(1)  # (H, F)

    k00, k01, k10, k11 = cauchy(c * b), cauchy(c * p), cauchy(p.conj() * b), cauchy(p.conj() * p)
    scale = dt * one_p  # (H, F)
    return torch.fft.irfft(2 * dt * (k00 - k01 * scale * k10 / (1 + scale * k11)), n=L)  # (H, L)


def check_agreement(tol: float = 1e-4) -> dict[str, float]:
    """straightforward_cauchy against kernel_cauchy: outputs and all parameter gradients.

    S4's HiPPO-LegS init in float32, H=16, N=64, L ∈ {37, 1000} (odd on purpose; 1000 has the
    Nyquist node). Raises AssertionError beyond ``tol`` relative L2 error.
    """
    from zoo_core.kernels.dplr import kernel_cauchy
    from zoo_s4.core import S4

    errors = {}
    for L in (37, 1000):
        torch.manual_seed(L)
        layer = S4(d_model=16, d_state=64, l_max=L, backend="cauchy")
        g = torch.randn(16, L)  # (H, L) upstream gradient
        outs, grads = [], []
        for fn in (kernel_cauchy, straightforward_cauchy):
            layer.zero_grad(set_to_none=True)
            outs.append(fn(layer._trained_system(), L))
            outs[-1].backward(g)
            grads.append({n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None})
        errors[f"K L={L}"] = rel(outs[1], outs[0])
        for name, ref in grads[0].items():
            errors[f"d{name} L={L}"] = rel(grads[1][name], ref)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"straightforward_cauchy disagrees with kernel_cauchy beyond {tol} relative: {bad}"
    return errors


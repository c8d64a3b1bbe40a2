"""Convolution kernels ``K_l = Re(C Ā^l B̄)``, l = 0..L-1, of discrete LTI systems.

Dimensions:
    H: channels.
    N: state size per channel.
    L: kernel length.
    T: block length of the blocked Vandermonde product (about √L).
    J: number of blocks, ceil(L / T).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .dplr import kernel_dplr_naive
from .naive import check_length as _check_length
from .naive import common as _common
from .naive import naive_dense as _naive_dense
from .naive import naive_diag as _naive_diag
from .systems import DenseSystem, DiagSystem, DPLRSystem


def kernel_naive(system: DiagSystem | DenseSystem | DPLRSystem, L: int) -> Tensor:
    """Reference kernel: powers of the state matrix, one step at a time.

    Args:
        system: a ``DiagSystem`` (log_a, w: (H, N)), a ``DenseSystem``
            (A: (H, N, N); B, C: (H, N)) or a ``DPLRSystem`` (densified, see ``kernel_dplr_naive``).
        L: kernel length, at least 1.

    Returns:
        (H, L) real kernel, ``K_l = Re(C Ā^l B̄)``.
    """
    _check_length(L)
    if isinstance(system, DiagSystem):
        return _naive_diag(system, L)
    if isinstance(system, DenseSystem):
        return _naive_dense(system, L)
    if isinstance(system, DPLRSystem):
        return kernel_dplr_naive(system, L)
    raise TypeError(
        f"kernel_naive takes a DiagSystem, DenseSystem or DPLRSystem, got {type(system).__name__}"
    )


def block_size(L: int) -> int:
    """Block length T of the blocked Vandermonde product: ceil(√L) minimises T + L/T."""
    return max(1, math.ceil(math.sqrt(L)))


def kernel_vandermonde(system: DiagSystem, L: int) -> Tensor:
    """Diagonal kernel as a blocked Vandermonde product, writing l = j·T + t.

    ``K[h, jT + t] = Re Σ_n (w ā^{jT})[h, n] · ā^t[h, n]``: exp runs on H·N·(T + J) entries and
    the largest intermediate is H·N·max(T, J) + H·J·T, never the H·N·L Vandermonde matrix. Each
    power is exp of its exact exponent, so rounding does not accumulate with l.

    Args:
        system: ``DiagSystem`` with log_a, w: (H, N), real or complex, float32 or float64.
        L: kernel length, at least 1.

    Returns:
        (H, L) real kernel, ``K_l = Re Σ_n w_n exp(l · log_a_n)``.
    """
    _check_length(L)
    if not isinstance(system, DiagSystem):
        raise TypeError(f"kernel_vandermonde takes a DiagSystem, got {type(system).__name__}")
    log_a, w = _common(system.log_a, system.w)  # (H, N), (H, N)
    T = block_size(L)
    J = math.ceil(L / T)
    real = log_a.dtype.to_real()
    t = torch.arange(T, dtype=real, device=log_a.device)  # (T)
    j = torch.arange(J, dtype=real, device=log_a.device) * T  # (J)
    inner = torch.exp(log_a[..., None] * t)  # (H, N, T)
    outer = w[..., None] * torch.exp(log_a[..., None] * j)  # (H, N, J)
    K = torch.real(outer.transpose(-1, -2) @ inner)  # (H, J, T)
    return K.reshape(K.shape[0], J * T)[:, :L]  # (H, L)

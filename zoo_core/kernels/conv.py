"""Causal convolution of a sequence with a per-channel kernel, ``y_t = Σ_{s≤t} k_s u_{t−s}``.

Dimensions:
    B: batch.
    L: sequence length (the kernel has the same length).
    H: channels.
    F: rfft frequencies, L + 1 (transform length 2L).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(u: Tensor, k: Tensor) -> None:
    if u.dim() != 3:
        raise ValueError(f"u must be (B, L, H), got shape {tuple(u.shape)}")
    _, L, H = u.shape
    if tuple(k.shape) != (H, L):
        raise ValueError(
            f"kernel k must be (H, L) = ({H}, {L}) to match u of shape {tuple(u.shape)}, got "
            f"{tuple(k.shape)}; compute the kernel at the sequence length (or zero-pad it to L)"
        )
    if u.is_complex() or k.is_complex():
        raise ValueError("conv takes real u and k; take the real part of a complex kernel first")


def conv_naive(u: Tensor, k: Tensor) -> Tensor:
    """Reference: direct causal convolution through an explicit Toeplitz matrix, O(H·L²) memory.

    Args:
        u: (B, L, H) real input.
        k: (H, L) real kernel, the same length as u.

    Returns:
        (B, L, H), ``y_t = Σ_{s=0}^{t} k_s u_{t−s}``, in the promoted dtype of u and k.
    """
    _check(u, k)
    dtype = torch.promote_types(u.dtype, k.dtype)
    u, k = u.to(dtype), k.to(dtype)
    L = u.shape[1]
    lag = torch.arange(L, device=u.device)
    lag = lag[:, None] - lag[None, :]  # (L, L): t − s
    toeplitz = k[:, lag.clamp(min=0)] * (lag >= 0)  # (H, L, L): k_{t−s}, 0 above the diagonal
    return torch.einsum("hts,bsh->bth", toeplitz, u)  # (B, L, H)


def conv_fft(u: Tensor, k: Tensor) -> Tensor:
    """Causal linear convolution by real FFT, zero-padded to 2L so that nothing wraps around.

    Args:
        u: (B, L, H) real input.
        k: (H, L) real kernel, the same length as u.

    Returns:
        (B, L, H), equal to ``conv_naive(u, k)``, in the promoted dtype of u and k.
    """
    _check(u, k)
    L = u.shape[1]
    # transform along the last (contiguous) axis: ~1.3x faster than along time in (B, L, H)
    k_f = torch.fft.rfft(k, n=2 * L)  # (H, F)
    u_f = torch.fft.rfft(u.transpose(1, 2), n=2 * L)  # (B, H, F)
    y = torch.fft.irfft(u_f * k_f, n=2 * L)[..., :L].transpose(1, 2)  # (B, L, H)
    return y.to(torch.promote_types(u.dtype, k.dtype))

"""Convolution kernels ``K_l = Re(C Ā^l B̄)``, l = 0..L-1, of discrete LTI systems.

Dimensions:
    H: channels.
    N: state size per channel.
    L: kernel length.
    T: block length of the blocked Vandermonde product (about √L; ``vandermonde.block_size``).
    J: number of blocks, ceil(L / T).
"""

from __future__ import annotations

from torch import Tensor

from .dplr import kernel_dplr_naive
from .naive import check_length as _check_length
from .naive import naive_dense as _naive_dense
from .naive import naive_diag as _naive_diag
from .powers import exp_flushed, powers
from .systems import DenseSystem, DiagSystem, DPLRSystem
from .vandermonde import block_size, kernel_from_parts

__all__ = ["block_size", "exp_flushed", "kernel_naive", "kernel_vandermonde", "powers"]


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


def kernel_vandermonde(system: DiagSystem, L: int) -> Tensor:
    """Diagonal kernel as a blocked Vandermonde product, writing l = j·T + t.

    ``K[h, jT + t] = Re Σ_n (w ā^{jT})[h, n] · ā^t[h, n]``: exp runs on H·N·(T + J) entries and
    the largest intermediate is H·N·max(T, J) + H·J·T, never the H·N·L Vandermonde matrix. Each
    power is exp of its exact exponent, so rounding does not accumulate with l.

    Immune to subnormal floats: decaying powers fall below the smallest normal float for long L
    (at S4D's init, H = 256, N = 64, L = 16384, 28 % of the ``ā^{jT}`` do), and a CPU computes
    on subnormals tens of times more slowly. ``torch.set_flush_denormal`` cannot help from inside
    an op (it sets the calling thread's flag only, not ATen's worker threads', and it does not
    speed up ``exp`` here), so every power comes from ``powers`` (exactly 0 below the
    normal range), ``w ā^{jT}`` and the kernel are flushed too. Each dropped contribution is
    below ``finfo.tiny`` in magnitude: results equal the plain product within float32 rounding.

    Args:
        system: ``DiagSystem`` with log_a, w: (H, N), real or complex, float32 or float64.
        L: kernel length, at least 1.

    One custom op (``zoo.kernels.vandermonde``: ``zoo::vandermonde_kernel``) with an analytic
    backward, so ``torch.export`` keeps L symbolic and the backward keeps no graph of the powers.

    Returns:
        (H, L) real kernel, ``K_l = Re Σ_n w_n exp(l · log_a_n)``, with no subnormal entry.
    """
    _check_length(L)
    if not isinstance(system, DiagSystem):
        raise TypeError(f"kernel_vandermonde takes a DiagSystem, got {type(system).__name__}")
    return kernel_from_parts(system.log_a, system.w, L)  # (H, L)

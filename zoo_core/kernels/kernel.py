"""Convolution kernels ``K_l = Re(C Ā^l B̄)``, l = 0..L-1, of discrete LTI systems.

Dimensions:
    H: channels.
    N: state size per channel.
    L: kernel length.
    T: block length of the blocked Vandermonde product (about √L; ``vandermonde.block_size``).
    J: number of blocks, ceil(L / T).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .dplr import kernel_dplr_naive
from .naive import check_length as _check_length
from .naive import flush_subnormal
from .naive import naive_dense as _naive_dense
from .naive import naive_diag as _naive_diag
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


def exp_flushed(z: Tensor) -> Tensor:
    """``exp(z)`` for a real or complex exponent, computed without arithmetic on subnormal floats.

    Where ``Re z`` is below ``log(finfo.tiny)`` (≈ −87.34 in float32, −708.4 in float64) the result
    is exactly 0: the exponent is replaced by 0 *before* ``exp``, so ``exp`` never computes an
    underflowing value (measured on the 2-core AMD EPYC of the reports, float32, one thread: 4M
    ``exp`` whose results are subnormal take 280 ms, 65× a normal result, and whose results
    underflow to 0, 90 ms; the flush-to-zero flag changes neither). A complex exponent goes through
    ``torch.polar(exp(Re z), Im z)``, the same ``e^x (cos y + i sin y)`` as complex ``exp``
    (measured 5× faster there than ATen's complex ``exp``); its components ``e^x cos y`` may still
    be subnormal and are flushed. Its autograd graph (masks, real/imag, ``polar``) is slow to
    backpropagate through: differentiate ``powers`` instead.

    Args:
        z: exponent, any shape, real or complex, float32 or float64.

    Returns:
        ``exp(z)``, same shape and dtype, every entry 0 or normal; it differs from ``torch.exp(z)``
        by less than ``finfo.tiny`` per entry (absolute) beyond rounding.
    """
    x = z.real if z.is_complex() else z
    keep = ~(x < math.log(torch.finfo(x.dtype).tiny))  # NaN is kept: a NaN parameter must still show as NaN
    mag = torch.where(keep, torch.exp(torch.where(keep, x, 0.0)), 0.0)
    if not z.is_complex():
        return mag
    return flush_subnormal(torch.polar(mag, z.imag))


class _Powers(torch.autograd.Function):
    """``exp(log_a ⊗ pos)`` by ``exp_flushed``, with the backward of exp written out.

    ``out = exp(pos · log_a)`` is holomorphic in log_a, so its gradient is
    ``Σ_p pos_p · conj(out) · grad`` (``out · grad`` when real): one product and one reduction
    over the saved output, where autograd through ``exp_flushed`` would record the real/imag
    selections, both masks and ``polar`` (measured 1.7× the old forward+backward). Entries flushed
    to 0 contribute 0, as their true contribution is below ``tiny``.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, log_a: Tensor, pos: Tensor) -> Tensor:
        out = exp_flushed(log_a[..., None] * pos)  # (..., P)
        ctx.save_for_backward(out, pos)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        out, pos = ctx.saved_tensors  # type: ignore[attr-defined]  # FunctionCtx's stub lacks saved_tensors
        prod = grad * (out.conj() if out.is_complex() else out)  # (..., P)
        return (prod * pos).sum(-1), None


def powers(log_a: Tensor, pos: Tensor) -> Tensor:
    """``exp(log_a[..., None] · pos)``, differentiable in log_a, with no subnormal entry.

    Args:
        log_a: (..., N) real or complex exponents.
        pos: (P,) real positions (powers), the real dtype of log_a.

    Returns:
        (..., N, P) powers ``ā^pos``, each exactly 0 where it would underflow (``exp_flushed``).
    """
    out: Tensor = _Powers.apply(log_a, pos)
    return out


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

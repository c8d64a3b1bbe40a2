"""Step-by-step reference kernels of diagonal and dense systems, and the checks every kernel shares.

Kept apart from ``kernel.py`` so the DPLR kernels (``dplr.py``) can build on the dense reference while
``kernel_naive`` dispatches to them: both import this module, neither imports the other back.

Subnormal floats: the powers ``Ā^l`` of a stable system decay below the smallest normal float
(``finfo.tiny``, about 1.2e-38 in float32) and some CPUs compute on such subnormal values tens of
times more slowly (issue 16: the dense S4 reference took 295 s by default and 9.3 s with
flush-to-zero at L = 16384 on an Intel Xeon; on the AMD EPYC of the reports the dense powers were
not measurably slowed, ``exp`` was). ``torch.set_flush_denormal`` cannot fix this from inside an
op: it sets the calling thread's flag only, and ATen's intra-op worker threads keep producing
subnormals (measured: with 2 threads, half the entries of ``x * 1.0`` stay subnormal with the flag
set). So the references flush
explicitly: ``flush_subnormal`` zeroes every entry below ``tiny`` once per step, and a power that
has underflowed stays exactly 0 from then on. The kernel changes by less than ``tiny`` per dropped
term (absolute), which is below float32 rounding of any kernel with a normal-range value.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx

from .systems import DenseSystem, DiagSystem


def common(*xs: Tensor) -> tuple[Tensor, ...]:
    """Cast tensors to their common (possibly complex) dtype."""
    dtype = xs[0].dtype
    for x in xs[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    return tuple(x.to(dtype) for x in xs)


def check_length(L: int) -> None:
    """Refuse an empty kernel: every kernel below starts from step 0."""
    if L < 1:
        raise ValueError(f"kernel length L must be at least 1, got {L}")


def _hardshrink_subnormal(x: Tensor) -> Tensor:
    """Real ``x`` with its subnormal entries set to 0, in one ``hardshrink`` pass (see ``flush_subnormal``)."""
    if x.is_complex():
        return torch.view_as_complex(_hardshrink_subnormal(torch.view_as_real(x).contiguous()))
    info = torch.finfo(x.dtype)
    return torch.nn.functional.hardshrink(x, info.tiny * (1 - info.eps))


class _FlushSubnormal(torch.autograd.Function):
    """Forward: flush subnormals to 0. Backward: the identity (a straight-through estimator).

    The flush stands for "this value underflowed": the function being computed is the unflushed
    one, whose derivative is the identity, and the flushed entries' own gradient terms are below
    ``tiny`` anyway. Passing the gradient through unchanged also keeps backward at its previous
    cost: masking it (``hardshrink``'s own backward and the complex views') measured 1.6× the
    Vandermonde kernel's forward+backward.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor) -> Tensor:
        return _hardshrink_subnormal(x)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> Tensor:
        return grad


def flush_subnormal(x: Tensor) -> Tensor:
    """``x`` with every subnormal entry (real and imaginary parts separately) replaced by exactly 0.

    One ``hardshrink`` pass at the largest subnormal, ``tiny·(1 − eps)`` of the dtype's own
    ``finfo`` (float32 and float64 alike): it keeps every ``|x| ≥ tiny`` bit for bit, and is one
    vectorised kernel where ``where(|x| < tiny, 0, x)`` is three (measured 1.3 vs 6-10 ms per 4M
    float32 here). Its gradient is the identity (``_FlushSubnormal``). Integer tensors are
    returned as they are.
    """
    if not (x.is_floating_point() or x.is_complex()):
        return x
    out: Tensor = _FlushSubnormal.apply(x)
    return out


def naive_diag(system: DiagSystem, L: int) -> Tensor:
    """Diagonal reference: ``Re(sum w a^l)`` one power at a time, (H, L); each power is flushed of
    subnormals (module docstring), so it stays naive but its speed is not the CPU's denormal path."""
    log_a, w = common(system.log_a, system.w)  # (H, N), (H, N)
    a = torch.exp(log_a)  # (H, N)
    x = w  # (H, N): w · a^l at step l
    out = []
    for _ in range(L):
        out.append(torch.real(x.sum(-1)))  # (H)
        x = flush_subnormal(a * x)  # (H, N)
    return torch.stack(out, -1)  # (H, L)


def naive_dense(system: DenseSystem, L: int) -> Tensor:
    """Dense reference: ``Re(C Ā^l B̄)`` one matrix-vector product at a time, (H, L); each state
    ``Ā^l B̄`` and each readout product ``C ⊙ Ā^l B̄`` is flushed of subnormals (module docstring)."""
    A, x, C = common(system.A, system.B, system.C)  # (H, N, N), (H, N), (H, N)
    out = []
    for _ in range(L):
        out.append(torch.real(flush_subnormal(C * x).sum(-1)))  # (H)
        x = flush_subnormal(torch.einsum("hij,hj->hi", A, x))  # (H, N): Ā^l B̄
    return torch.stack(out, -1)  # (H, L)

"""Step-by-step reference kernels of diagonal and dense systems, and the checks every kernel shares.

Kept apart from ``kernel.py`` so the DPLR kernels (``dplr.py``) can build on the dense reference while
``kernel_naive`` dispatches to them: both import this module, neither imports the other back.
"""

from __future__ import annotations

import torch
from torch import Tensor

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


def naive_diag(system: DiagSystem, L: int) -> Tensor:
    """Diagonal reference: ``Re(sum w a^l)`` one power at a time, (H, L)."""
    log_a, w = common(system.log_a, system.w)  # (H, N), (H, N)
    a = torch.exp(log_a)  # (H, N)
    x = w  # (H, N): w · a^l at step l
    out = []
    for _ in range(L):
        out.append(torch.real(x.sum(-1)))  # (H)
        x = a * x  # (H, N)
    return torch.stack(out, -1)  # (H, L)


def naive_dense(system: DenseSystem, L: int) -> Tensor:
    """Dense reference: ``Re(C Ā^l B̄)`` one matrix-vector product at a time, (H, L)."""
    A, x, C = common(system.A, system.B, system.C)  # (H, N, N), (H, N), (H, N)
    out = []
    for _ in range(L):
        out.append(torch.real((C * x).sum(-1)))  # (H)
        x = torch.einsum("hij,hj->hi", A, x)  # (H, N): Ā^l B̄
    return torch.stack(out, -1)  # (H, L)

"""Discretisers: continuous (A, B) and a step Δ to discrete (Ā, B̄), as in models.md §1.2.

Every discretiser has the signature ``(A, B, dt, *, structure="diag") -> Discrete``.

Dimensions:
    H: channels.
    N: state size per channel.

Structures:
    "diag": A (H, N) real or complex eigenvalues, B (H, N), dt broadcastable to A (e.g. (H, 1)).
    "dense": A (H, N, N), B (H, N), dt (H,) or broadcastable to (H, 1, 1); log_a is None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor


class Discrete(NamedTuple):
    """A discrete system: ``a`` (H, N) or (H, N, N), ``b`` (H, N), ``log_a`` (H, N) or None."""

    a: Tensor
    b: Tensor
    log_a: Tensor | None


_Impl = Callable[[Tensor, Tensor, Tensor], Discrete]


_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
_COMPLEX = {real: cplx for cplx, real in _REAL.items()}


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    """The real dtype of a complex one (a real dtype is returned as is): ``dtype.to_real()``, which
    ``torch.compile`` cannot trace (a graph break that ``fullgraph=True`` refuses), as a table lookup."""
    return _REAL.get(dtype, dtype)


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """The complex dtype of a real one (a complex dtype is returned as is): ``dtype.to_complex()``,
    traceable by ``torch.compile``, as ``real_dtype``."""
    return _COMPLEX.get(dtype, dtype)


def _cast(A: Tensor, B: Tensor, dt: Tensor | float) -> tuple[Tensor, Tensor, Tensor]:
    """Cast A and B to their common dtype; dt to a real tensor of the matching precision."""
    dtype = torch.promote_types(A.dtype, B.dtype)
    real = real_dtype(dtype)
    return A.to(dtype), B.to(dtype), torch.as_tensor(dt, dtype=real, device=A.device)


def principal_log(a: Tensor) -> Tensor:
    """Principal log; a real tensor with an entry ≤ 0 is made complex first (log(−x) = log x + iπ).

    The result dtype therefore depends on the values when ``a`` is real: real when every entry is
    positive, complex otherwise.
    """
    if not a.is_complex() and bool((a <= 0).any()):
        a = torch.complex(a, torch.zeros_like(a))
    return torch.log(a)


def _zoh_diag(A: Tensor, B: Tensor, dt: Tensor) -> Discrete:
    dtA = dt * A  # (H, N)
    a = torch.exp(dtA)  # (H, N)
    b = torch.expm1(dtA) / A * B  # (H, N): (ā − 1)/λ · B, expm1 keeps small Δλ exact
    return Discrete(a, b, dtA)


def _bilinear_diag(A: Tensor, B: Tensor, dt: Tensor) -> Discrete:
    half = dt * A / 2  # (H, N)
    a = (1 + half) / (1 - half)  # (H, N)
    b = dt / (1 - half) * B  # (H, N)
    return Discrete(a, b, principal_log(a))


def _euler_diag(A: Tensor, B: Tensor, dt: Tensor) -> Discrete:
    a = 1 + dt * A  # (H, N)
    b = (dt * B).expand(a.shape)  # (H, N)
    return Discrete(a, b, principal_log(a))


def _dense_dt(dt: Tensor) -> tuple[Tensor, Tensor]:
    """dt as (H, 1, 1) for matrices and (H, 1) for vectors (a scalar stays a scalar)."""
    if dt.dim() == 1:
        dt = dt[:, None, None]  # (H, 1, 1)
    return dt, (dt[..., 0] if dt.dim() == 3 else dt)


def _eye(A: Tensor) -> Tensor:
    return torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)  # (N, N)


def _zoh_dense(A: Tensor, B: Tensor, dt: Tensor) -> Discrete:
    # exp([[ΔA, ΔB], [0, 0]]) = [[e^{ΔA}, A⁻¹(e^{ΔA} − I)B], [0, 1]]; exact for singular A too.
    dt_m, dt_v = _dense_dt(dt)
    H, N = A.shape[0], A.shape[-1]
    top = torch.cat([dt_m * A, (dt_v * B)[..., None]], -1)  # (H, N, N+1)
    M = torch.cat([top, top.new_zeros(H, 1, N + 1)], -2)  # (H, N+1, N+1)
    E = torch.linalg.matrix_exp(M)  # (H, N+1, N+1)
    return Discrete(E[:, :N, :N], E[:, :N, N], None)


def _bilinear_dense(A: Tensor, B: Tensor, dt: Tensor) -> Discrete:
    dt_m, dt_v = _dense_dt(dt)
    half = dt_m * A / 2  # (H, N, N)
    lhs = _eye(A) - half  # (H, N, N)
    a = torch.linalg.solve(lhs, _eye(A) + half)  # (H, N, N)
    b = torch.linalg.solve(lhs, dt_v * B)  # (H, N)
    return Discrete(a, b, None)


def _euler_dense(A: Tensor, B: Tensor, dt: Tensor) -> Discrete:
    dt_m, dt_v = _dense_dt(dt)
    return Discrete(_eye(A) + dt_m * A, (dt_v * B).expand(B.shape), None)  # (H, N, N), (H, N)


def _dispatch(name: str, table: dict[str, _Impl], A: Tensor, B: Tensor, dt: Tensor | float,
              structure: str) -> Discrete:
    if structure not in table:
        raise ValueError(f"{name}: unknown structure {structure!r}; allowed: {', '.join(table)}")
    return table[structure](*_cast(A, B, dt))


def zoh(A: Tensor, B: Tensor, dt: Tensor | float, *, structure: str = "diag") -> Discrete:
    """Zero-order hold: ``Ā = exp(ΔA)``, ``B̄ = A⁻¹(exp(ΔA) − I)B``; ``log_a = Δλ`` (exact).

    Args:
        A: (H, N) eigenvalues ("diag") or (H, N, N) matrices ("dense"); λ ≠ 0 for "diag".
        B: (H, N) input vectors.
        dt: step Δ > 0, broadcastable to A ("diag") or (H,) / (H, 1, 1) ("dense").
        structure: "diag" or "dense".

    Returns:
        ``Discrete(a, b, log_a)``; log_a is None for "dense".
    """
    return _dispatch("zoh", {"diag": _zoh_diag, "dense": _zoh_dense}, A, B, dt, structure)


def bilinear(A: Tensor, B: Tensor, dt: Tensor | float, *, structure: str = "diag") -> Discrete:
    """Bilinear (Tustin): ``Ā = (I − ΔA/2)⁻¹(I + ΔA/2)``, ``B̄ = (I − ΔA/2)⁻¹ΔB``.

    ``log_a`` is the principal log of ā (complex when a real ā is negative).

    Args:
        A: (H, N) eigenvalues ("diag") or (H, N, N) matrices ("dense").
        B: (H, N) input vectors.
        dt: step Δ > 0, broadcastable to A ("diag") or (H,) / (H, 1, 1) ("dense").
        structure: "diag" or "dense".

    Returns:
        ``Discrete(a, b, log_a)``; log_a is None for "dense".
    """
    return _dispatch("bilinear", {"diag": _bilinear_diag, "dense": _bilinear_dense}, A, B, dt,
                     structure)


def euler(A: Tensor, B: Tensor, dt: Tensor | float, *, structure: str = "diag") -> Discrete:
    """Forward Euler: ``Ā = I + ΔA``, ``B̄ = ΔB`` (stable only for small Δ).

    ``log_a`` is the principal log of ā (complex when a real ā is negative).

    Args:
        A: (H, N) eigenvalues ("diag") or (H, N, N) matrices ("dense").
        B: (H, N) input vectors.
        dt: step Δ > 0, broadcastable to A ("diag") or (H,) / (H, 1, 1) ("dense").
        structure: "diag" or "dense".

    Returns:
        ``Discrete(a, b, log_a)``; log_a is None for "dense".
    """
    return _dispatch("euler", {"diag": _euler_diag, "dense": _euler_dense}, A, B, dt, structure)

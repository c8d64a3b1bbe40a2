"""HiPPO-LegS, its normal part (HiPPO-N) and the NPLR / DPLR form used by S4 and S5.

Letters: N = full state size (n, k index it); N/2 = the conjugate half that S4/S4D/S5 store.

    A_nk = −sqrt(2n+1)·sqrt(2k+1) (n > k),  −(n+1) (n = k),  0 (n < k);   B_n = sqrt(2n+1)
    p_n  = sqrt(n + ½);   S = A + p pᵀ = −½ I + K,  K real skew-symmetric (normal)
    S    = V diag(Λ) V*,  Λ = −½ + iω,  V unitary;   V* A V = diag(Λ) − P̃ P̃*,  P̃ = V* p

`−i·K` is Hermitian, so a Hermitian eigensolver (``eigh``) gives ω (ascending) and a unitary V
without the ill-conditioning of diagonalising A itself (whose eigenvector matrix has condition
number ~1e47 at N = 64). Everything is computed in float64 / complex128.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["NPLR", "hippo_legs", "legs_rank1", "legs_normal", "nplr_legs", "conj_half", "dplr_legs"]


class NPLR(NamedTuple):
    """Normal-plus-low-rank form of HiPPO-LegS in the eigenbasis of its normal part.

    Attributes:
        Lambda: (M,) complex128 eigenvalues of the normal part S (real part −½).
        P: (M,) complex128 low-rank vector in the eigenbasis, P̃ = V* p.
        B: (M,) complex128 input vector in the eigenbasis, B̃ = V* B.
        V: (N, M) complex128 eigenvectors (columns); M = N for the full form, N/2 after `conj_half`.
    """

    Lambda: Tensor
    P: Tensor
    B: Tensor
    V: Tensor


def _check_size(N: int) -> None:
    if not isinstance(N, int) or isinstance(N, bool) or N < 1:
        raise ValueError(f"state size N must be a positive int, got {N!r}")


def hippo_legs(N: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """The HiPPO-LegS state matrix and input vector.

    Args:
        N: state size.
        dtype: real floating dtype of the result (computed in float64, cast at the end).

    Returns:
        (A, B): A (N, N) lower triangular with eigenvalues −1, …, −N; B (N,) = sqrt(2n+1).
    """
    _check_size(N)
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a real floating dtype, got {dtype}")
    n = torch.arange(N, dtype=torch.float64)  # (N,)
    r = torch.sqrt(2 * n + 1)  # (N,)
    A = -torch.tril(torch.outer(r, r), diagonal=-1) - torch.diag(n + 1)  # (N, N)
    return A.to(dtype), r.to(dtype)


def legs_rank1(N: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Rank-one correction p (N,) = sqrt(n + ½): A + p pᵀ = −½ I + skew-symmetric."""
    _check_size(N)
    return torch.sqrt(torch.arange(N, dtype=torch.float64) + 0.5).to(dtype)  # (N,)


def legs_normal(N: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """The normal part S = A + p pᵀ = −½ I + K of HiPPO-LegS ("HiPPO-N", S5's init), (N, N).

    p pᵀ is formed as ½·r rᵀ (r_n = sqrt(2n+1)) with its diagonal set to the exact n + ½, so
    that in floating point the diagonal of S is exactly −½ and S + Sᵀ is exactly −I (K exactly
    skew-symmetric); the naive `A + outer(p, p)` is off by a few ulps.

    Args:
        N: state size.
        dtype: real floating dtype of the result (computed in float64, cast at the end).

    Returns:
        S: (N, N).
    """
    A, r = hippo_legs(N)  # (N, N), (N,)
    n = torch.arange(N, dtype=torch.float64)  # (N,)
    ppT = 0.5 * torch.outer(r, r)  # (N, N) = p pᵀ
    ppT.diagonal().copy_(n + 0.5)
    return (A + ppT).to(dtype)


def check_complex_dtype(dtype: torch.dtype) -> None:
    """Raise ValueError unless `dtype` is a complex dtype."""
    if not dtype.is_complex:
        raise ValueError(f"dtype must be complex (torch.complex64 or torch.complex128), got {dtype}")


def _hermitian_part(M: Tensor) -> Tensor:
    """(M + M*)/2 for a square complex matrix."""
    return (M + M.mH) / 2


def nplr_legs(N: int) -> NPLR:
    """Full (M = N) NPLR decomposition of HiPPO-LegS, in complex128.

    Diagonalises S = A + p pᵀ by ``eigh`` on the Hermitian part of −i·S (which is −i·K; the
    reference codes pass −i·S itself and LAPACK reads the same Hermitian part). Eigenvalues come
    sorted by imaginary part ascending.

    Args:
        N: state size.

    Returns:
        NPLR with Lambda, P, B (N,) and V (N, N), such that S = V diag(Λ) V* and
        V* A V = diag(Λ) − P P*.
    """
    _, B = hippo_legs(N)  # (N,)
    p = legs_rank1(N)  # (N,)
    S = legs_normal(N)  # (N, N) = A + p pᵀ = −½ I + K
    re = torch.diagonal(S).mean()  # exactly −½
    omega, V = torch.linalg.eigh(_hermitian_part(-1j * S.to(torch.complex128)))  # (N,), (N, N)
    Lambda = torch.complex(torch.full_like(omega, re.item()), omega)  # (N,)
    Vh = V.mH  # (N, N)
    P = Vh @ p.to(torch.complex128)  # (N,)
    Bt = Vh @ B.to(torch.complex128)  # (N,)
    return NPLR(Lambda, P, Bt, V)


def conj_half(nplr: NPLR) -> NPLR:
    """Keep the N/2 eigenpairs with negative imaginary part (the references' convention).

    Eigenvalues are (stably) sorted by imaginary part ascending and the first N/2 kept, with the
    matching columns of V and entries of P and B. The dropped half are their complex conjugates.

    Args:
        nplr: a full NPLR (Lambda (N,), V (N, N)).

    Returns:
        NPLR with Lambda, P, B (N/2,) and V (N, N/2).

    Raises:
        ValueError: if N is odd (a real ω = 0 mode would have no conjugate partner).
    """
    N = nplr.Lambda.shape[-1]
    if N % 2 != 0:
        raise ValueError(f"conj_half needs an even state size N, got N={N}; use an even d_state")
    idx = torch.sort(nplr.Lambda.imag, stable=True).indices[: N // 2]  # (N/2,)
    return NPLR(nplr.Lambda[idx], nplr.P[idx], nplr.B[idx], nplr.V[:, idx])


def dplr_legs(N: int, *, dtype: torch.dtype = torch.complex64) -> tuple[Tensor, Tensor, Tensor]:
    """Conjugate-half DPLR parameters of HiPPO-LegS, as S4 initialises them.

    No clipping of Im(B) is applied (the S4 code's `B_clip=2.0` is left to the caller).

    Args:
        N: full state size (even).
        dtype: complex dtype of the result.

    Returns:
        (Lambda, P, B), each (N/2,) of `dtype`.
    """
    check_complex_dtype(dtype)
    half = conj_half(nplr_legs(N))
    return half.Lambda.to(dtype), half.P.to(dtype), half.B.to(dtype)

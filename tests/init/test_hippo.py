"""HiPPO-LegS, its normal part and the NPLR/DPLR form, against the S4 explainer's numbers."""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.init.hippo import (
    NPLR,
    conj_half,
    dplr_legs,
    hippo_legs,
    legs_normal,
    legs_rank1,
    nplr_legs,
)

F64 = torch.float64
C128 = torch.complex128


def _eye(N: int) -> torch.Tensor:
    return torch.eye(N, dtype=F64)


# --- the HiPPO-LegS matrix itself -------------------------------------------------------------


def test_legs_entries_small() -> None:
    A, B = hippo_legs(3)
    s1, s3, s5 = 1.0, math.sqrt(3), math.sqrt(5)
    expected = torch.tensor(
        [[-1, 0, 0], [-s3 * s1, -2, 0], [-s5 * s1, -s5 * s3, -3]], dtype=F64
    )
    torch.testing.assert_close(A, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(B, torch.tensor([s1, s3, s5], dtype=F64), rtol=0, atol=1e-15)
    assert A.dtype == F64 and B.dtype == F64


def test_legs_dtype_cast() -> None:
    A, B = hippo_legs(4, dtype=torch.float32)
    assert A.dtype == torch.float32 and B.dtype == torch.float32
    torch.testing.assert_close(A.double(), hippo_legs(4)[0], rtol=1e-7, atol=0)


@pytest.mark.parametrize("N", [8, 16])
def test_legs_eigenvalues_are_minus_one_to_minus_N(N: int) -> None:
    A, _ = hippo_legs(N)
    assert torch.equal(torch.triu(A, diagonal=1), torch.zeros_like(A))  # triangular
    expected = -torch.arange(1, N + 1, dtype=F64)
    assert torch.equal(torch.diagonal(A), expected)
    # A general (non-symmetric) eigensolver: V is ill-conditioned (cond ~1e11 at N = 16), so the
    # computed eigenvalues are only accurate to ~1e-6 relative; they are still −1, …, −N.
    ev = torch.linalg.eigvals(A)
    assert ev.imag.abs().max() < 1e-4 * N
    torch.testing.assert_close(torch.sort(ev.real, descending=True).values, expected, rtol=1e-5, atol=0)


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_bad_state_size_raises(bad: object) -> None:
    with pytest.raises(ValueError, match="positive int"):
        hippo_legs(bad)  # type: ignore[arg-type]


def test_non_float_dtype_raises() -> None:
    with pytest.raises(ValueError, match="floating"):
        hippo_legs(4, dtype=torch.int64)


# --- the rank-one correction and the normal part ----------------------------------------------


@pytest.mark.parametrize("N", [1, 2, 8, 64, 256])
def test_symmetric_part_after_rank1_is_exactly_minus_half_identity(N: int) -> None:
    A, _ = hippo_legs(N)
    p = legs_rank1(N)
    torch.testing.assert_close(p, torch.sqrt(torch.arange(N, dtype=F64) + 0.5), rtol=0, atol=0)
    S = legs_normal(N)
    torch.testing.assert_close(S, A + torch.outer(p, p), rtol=0, atol=1e-12 * N)
    assert torch.equal((S + S.T) / 2, -0.5 * _eye(N))  # exactly, not just to rounding
    assert torch.equal(torch.diagonal(S), torch.full((N,), -0.5, dtype=F64))


@pytest.mark.parametrize("N", [8, 64])
def test_symmetric_part_of_A_bounded_by_minus_half(N: int) -> None:
    A, _ = hippo_legs(N)
    assert torch.linalg.eigvalsh((A + A.T) / 2).max() <= -0.5 + 1e-12


@pytest.mark.parametrize("N", [8, 64])
def test_S_is_normal_and_A_is_not(N: int) -> None:
    A, _ = hippo_legs(N)
    S = legs_normal(N)
    assert torch.linalg.matrix_norm(S @ S.T - S.T @ S) < 1e-10 * N
    assert torch.linalg.matrix_norm(A @ A.T - A.T @ A) > 1.0  # the check can fail


@pytest.mark.parametrize("N", [8, 64])
@pytest.mark.parametrize("t", [0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 20.0])
def test_matrix_exponential_never_amplifies(N: int, t: float) -> None:
    A, _ = hippo_legs(N)
    norm = torch.linalg.matrix_norm(torch.linalg.matrix_exp(t * A), ord=2)
    assert norm <= math.exp(-t / 2) * (1 + 1e-10)


def test_matrix_exponential_bound_fails_for_a_non_normal_amplifier() -> None:
    """The same check catches a matrix that amplifies transiently (eigenvalues −1, −2)."""
    M = torch.tensor([[-1.0, 50.0], [0.0, -2.0]], dtype=F64)
    norm = torch.linalg.matrix_norm(torch.linalg.matrix_exp(0.5 * M), ord=2)
    assert norm > math.exp(-0.25)


def test_normal_part_eigenvalues_at_N8_match_explainer() -> None:
    """S4 explainer: −0.5 ± 19.857i, ±5.354i, ±1.958i, ±0.427i at N = 8."""
    ev = torch.linalg.eigvals(legs_normal(8))
    torch.testing.assert_close(ev.real, torch.full((8,), -0.5, dtype=F64), rtol=0, atol=1e-12)
    imag = torch.sort(ev.imag).values
    expected = torch.tensor([-19.857, -5.354, -1.958, -0.427, 0.427, 1.958, 5.354, 19.857], dtype=F64)
    torch.testing.assert_close(torch.round(imag, decimals=3), expected, rtol=0, atol=0)
    nplr = nplr_legs(8)
    assert torch.equal(nplr.Lambda.real, torch.full((8,), -0.5, dtype=F64))  # exactly −½
    torch.testing.assert_close(torch.round(nplr.Lambda.imag, decimals=3), expected, rtol=0, atol=0)


# --- NPLR / DPLR ------------------------------------------------------------------------------


@pytest.mark.parametrize("N", [2, 8, 64])
def test_nplr_shapes_dtypes_and_order(N: int) -> None:
    nplr = nplr_legs(N)
    assert isinstance(nplr, NPLR)
    for t, shape in zip(nplr, [(N,), (N,), (N,), (N, N)]):
        assert t.dtype == C128 and tuple(t.shape) == shape
    assert torch.all(nplr.Lambda.imag[1:] >= nplr.Lambda.imag[:-1])  # ascending


@pytest.mark.parametrize("N", [8, 16, 32, 64, 128])
def test_V_unitary_and_reconstruction(N: int) -> None:
    Lam, _, _, V = nplr_legs(N)
    I = torch.eye(N, dtype=C128)
    assert torch.linalg.matrix_norm(V.mH @ V - I) < 1e-12
    S = legs_normal(N).to(C128)
    err = torch.linalg.matrix_norm(V @ torch.diag(Lam) @ V.mH - S).item()
    # ‖S‖_F grows like N², so the absolute error does too (1.7e-14 at N = 8, 3.3e-12 at N = 64);
    # the relative error stays ~2e-15 at every N.
    if N <= 32:
        assert err < 1e-12
    assert err / torch.linalg.matrix_norm(S).item() < 1e-14


@pytest.mark.parametrize("N", [8, 64])
def test_dplr_form_of_A_full_nplr(N: int) -> None:
    A, B = hippo_legs(N)
    p = legs_rank1(N)
    Lam, P, Bt, V = nplr_legs(N)
    lhs = V.mH @ A.to(C128) @ V  # (N, N)
    rhs = torch.diag(Lam) - torch.outer(P, P.conj())
    assert torch.linalg.matrix_norm(lhs - rhs) < 1e-14 * torch.linalg.matrix_norm(rhs)
    assert torch.linalg.matrix_norm(lhs - torch.diag(Lam)) > 1.0  # the low-rank term matters
    torch.testing.assert_close(P, V.mH @ p.to(C128), rtol=0, atol=1e-14)
    torch.testing.assert_close(Bt, V.mH @ B.to(C128), rtol=0, atol=1e-14)


@pytest.mark.parametrize("N", [2, 8, 64])
def test_conj_half_keeps_negative_half_and_drops_conjugates(N: int) -> None:
    full = nplr_legs(N)
    half = conj_half(full)
    assert tuple(half.Lambda.shape) == (N // 2,) and tuple(half.V.shape) == (N, N // 2)
    assert tuple(half.P.shape) == (N // 2,) and tuple(half.B.shape) == (N // 2,)
    assert torch.all(half.Lambda.imag < 0)
    assert torch.all(half.Lambda.imag[1:] >= half.Lambda.imag[:-1])
    dropped = full.Lambda[N // 2 :]
    conj_sorted = torch.sort(half.Lambda.conj().imag).values
    torch.testing.assert_close(conj_sorted, dropped.imag, rtol=1e-13, atol=1e-12)
    assert torch.equal(half.Lambda.real, dropped.real)


@pytest.mark.parametrize("N", [2, 8, 64])
def test_conj_half_columns_match_eigenvalues(N: int) -> None:
    """Half + conjugate half rebuild S, p and B: S = 2Re(V_h Λ_h V_h*), p = 2Re(V_h P_h)."""
    A, B = hippo_legs(N)
    p = legs_rank1(N)
    Lam, P, Bt, V = conj_half(nplr_legs(N))
    S = 2 * (V @ torch.diag(Lam) @ V.mH).real
    torch.testing.assert_close(S, legs_normal(N), rtol=0, atol=1e-12)
    torch.testing.assert_close(2 * (V @ P).real, p, rtol=0, atol=1e-12)
    torch.testing.assert_close(2 * (V @ Bt).real, B, rtol=0, atol=1e-12)
    A_rebuilt = 2 * (V @ (torch.diag(Lam) - torch.outer(P, P.conj())) @ V.mH).real
    # the conj-half DPLR alone does not rebuild A: the cross terms P_h P_h^T are missing
    assert torch.linalg.matrix_norm(A_rebuilt - A) > 1e-3


@pytest.mark.parametrize("N", [1, 7])
def test_conj_half_odd_N_raises(N: int) -> None:
    with pytest.raises(ValueError, match="even"):
        conj_half(nplr_legs(N))


def test_dplr_legs_is_cast_conj_half() -> None:
    Lam, P, B = dplr_legs(64)
    half = conj_half(nplr_legs(64))
    for got, ref in zip((Lam, P, B), half[:3]):
        assert got.dtype == torch.complex64 and tuple(got.shape) == (32,)
        assert torch.equal(got, ref.to(torch.complex64))
    Lam128, _, _ = dplr_legs(64, dtype=C128)
    assert torch.equal(Lam128, half.Lambda)
    with pytest.raises(ValueError, match="complex"):
        dplr_legs(8, dtype=torch.float32)


# --- the explainer's "about 0.60" -------------------------------------------------------------


def test_bilinear_power_norm_at_explainer_setting() -> None:
    """At Δ = 0.001, L = 1024, N = 64 the norm of Ā^L is "about 0.60" (S4 explainer)."""
    N, dt, L = 64, 1e-3, 1024
    A, _ = hippo_legs(N)
    I = _eye(N)
    Abar = torch.linalg.solve(I - dt / 2 * A, I + dt / 2 * A)  # (N, N)
    norm = torch.linalg.matrix_norm(torch.linalg.matrix_power(Abar, L), ord=2).item()
    assert round(norm, 2) == 0.60  # 0.5993 in float64

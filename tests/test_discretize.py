"""Discretisers: worked values, stability, dense against diagonal, kernel against recurrence.

Letters: H channels, N state size, L length.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from zoo_core.discretize import bilinear, euler, zoh
from zoo_core.kernels.kernel import kernel_naive, kernel_vandermonde
from zoo_core.kernels.systems import DenseSystem, DiagSystem
from zoo_core.testing import assert_rel_close as assert_close

F64, C128 = torch.float64, torch.complex128
METHODS = {"zoh": zoh, "bilinear": bilinear, "euler": euler}


def _scalar(method, lam: float, dt: float):  # type: ignore[no-untyped-def]
    return method(torch.tensor([[lam]], dtype=F64), torch.ones(1, 1, dtype=F64), dt)


def test_worked_values() -> None:
    bil = _scalar(bilinear, -64.0, 0.1)
    assert bil.a.item() == pytest.approx((1 - 3.2) / (1 + 3.2), abs=1e-12)
    assert round(bil.a.item(), 3) == -0.524
    eul = _scalar(euler, -64.0, 0.1)
    assert eul.a.item() == pytest.approx(-5.4, abs=1e-12)
    z = _scalar(zoh, -1.0, 0.1)
    assert z.a.item() == pytest.approx(math.exp(-0.1), abs=1e-12)
    assert round(z.a.item(), 4) == 0.9048
    assert z.b.item() == pytest.approx(1 - math.exp(-0.1), abs=1e-12)  # (ā − 1)/λ
    assert z.log_a.item() == pytest.approx(-0.1, abs=1e-15)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("lam", [-64.0, -1.0, 3.0])
def test_log_a_is_a_log_of_a(name: str, lam: float) -> None:
    # a negative real ā (bilinear and Euler at λ = −64) needs the complex principal log
    d = _scalar(METHODS[name], lam, 0.1)
    assert torch.allclose(torch.exp(d.log_a), d.a.to(d.log_a.dtype), atol=1e-12)


def test_bilinear_is_stable_for_every_step() -> None:
    torch.manual_seed(0)
    lam = torch.complex(-torch.rand(4, 16, dtype=F64) - 1e-3, 100 * torch.randn(4, 16, dtype=F64))
    for dt in torch.logspace(-4, 4, 17, dtype=F64):
        a = bilinear(lam, torch.ones_like(lam), dt).a
        assert (a.abs() < 1).all(), f"|ā| ≥ 1 at Δ = {dt.item():.0e}"


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_dense_on_a_diagonal_matrix_equals_diag(name: str, cplx: bool) -> None:
    torch.manual_seed(0)
    lam = -torch.rand(3, 4, dtype=F64) - 0.1  # (H, N)
    if cplx:
        lam = torch.complex(lam, torch.randn(3, 4, dtype=F64))
    B, dt = torch.randn(3, 4, dtype=F64), torch.rand(3, dtype=F64) + 0.01  # (H, N), (H)
    diag = METHODS[name](lam, B, dt[:, None])
    dense = METHODS[name](torch.diag_embed(lam), B, dt, structure="dense")
    assert dense.log_a is None
    assert_close("a", torch.diag_embed(diag.a), dense.a, 1e-12)
    assert_close("b", diag.b, dense.b, 1e-12)


@pytest.mark.parametrize("name", ["zoh", "bilinear"])
def test_dense_kernel_equals_diagonalised_kernel(name: str) -> None:
    # A = V Λ V⁻¹ discretises to V Λ̄ V⁻¹, so the dense kernel equals the diagonal one.
    torch.manual_seed(1)
    H, N, L = 2, 4, 40
    lam = torch.complex(-torch.rand(H, N, dtype=F64) - 0.1, torch.randn(H, N, dtype=F64))
    V = torch.randn(H, N, N, dtype=C128)
    A = V @ torch.diag_embed(lam) @ torch.linalg.inv(V)  # (H, N, N)
    B, C = torch.randn(H, N, dtype=C128), torch.randn(H, N, dtype=C128)  # (H, N)
    dt = torch.full((H,), 0.3, dtype=F64)
    dense = METHODS[name](A, B, dt, structure="dense")
    diag = METHODS[name](lam, torch.linalg.solve(V, B), dt[:, None])  # B in the eigenbasis
    w = torch.einsum("hi,hin->hn", C, V) * diag.b  # (H, N)
    ref = kernel_naive(DiagSystem(diag.log_a, w), L)
    assert_close("K", ref, kernel_naive(DenseSystem(dense.a, dense.b, C), L), 1e-10)


def _impulse_response(a: Tensor, b: Tensor, C: Tensor, L: int) -> Tensor:
    """x_t = a x_{t−1} + b u_t, y_t = Re Σ_n C x_t, for u = δ_0: (H, N) each → (H, L)."""
    x = torch.zeros_like(a * b * C)  # (H, N)
    ys = []
    for t in range(L):
        x = a * x + b * (1.0 if t == 0 else 0.0)  # (H, N)
        ys.append(torch.real((C * x).sum(-1)))  # (H)
    return torch.stack(ys, -1)  # (H, L)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_kernel_equals_recurrence(name: str, cplx: bool) -> None:
    torch.manual_seed(2)
    H, N, L = 3, 5, 64
    lam = -torch.rand(H, N, dtype=F64) * 30 - 0.5  # Euler ā < 0 for some entries: complex log_a
    C = torch.randn(H, N, dtype=F64)
    if cplx:
        lam = torch.complex(lam, torch.randn(H, N, dtype=F64))
        C = torch.randn(H, N, dtype=C128)
    B, dt = torch.randn(H, N, dtype=F64), torch.full((H, 1), 0.05, dtype=F64)
    d = METHODS[name](lam, B, dt)
    ref = _impulse_response(d.a, d.b, C, L)
    system = DiagSystem(d.log_a, C * d.b)
    assert_close("naive", ref, kernel_naive(system, L), 1e-12)
    assert_close("vandermonde", ref, kernel_vandermonde(system, L), 1e-10)


@pytest.mark.parametrize("name", METHODS)
def test_unknown_structure_names_the_allowed_ones(name: str) -> None:
    with pytest.raises(ValueError, match="allowed: diag, dense"):
        METHODS[name](-torch.ones(1, 2), torch.ones(1, 2), 0.1, structure="dplr")


def test_gradients_flow_to_every_input() -> None:
    A = torch.complex(-torch.rand(2, 3, dtype=F64), torch.randn(2, 3, dtype=F64)).requires_grad_()
    B = torch.randn(2, 3, dtype=F64, requires_grad=True)
    dt = torch.rand(2, 1, dtype=F64, requires_grad=True)
    for method in METHODS.values():
        d = method(A, B, dt)
        K = kernel_vandermonde(DiagSystem(d.log_a, d.b), 9)
        for g in torch.autograd.grad(K.sum(), (A, B, dt)):
            assert torch.isfinite(torch.view_as_real(g) if g.is_complex() else g).all()


def test_dense_zoh_needs_no_inverse() -> None:
    # A = [[0, 1], [0, 0]] is singular and defective: Ā = [[1, Δ], [0, 1]], B̄ = ∫₀^Δ e^{sA} ds B.
    A = torch.tensor([[[0.0, 1.0], [0.0, 0.0]]], dtype=F64)  # (H=1, 2, 2)
    B = torch.tensor([[2.0, 3.0]], dtype=F64)  # (H=1, 2)
    d = zoh(A, B, torch.tensor([0.5], dtype=F64), structure="dense")
    assert_close("a", torch.tensor([[[1.0, 0.5], [0.0, 1.0]]], dtype=F64), d.a, 1e-14)
    assert_close("b", torch.tensor([[0.5 * 2 + 0.125 * 3, 0.5 * 3]], dtype=F64), d.b, 1e-14)


def test_bilinear_keeps_every_hippo_eigenvalue_inside_the_unit_disk() -> None:
    """The S4 explainer: bilinear maps the left half-plane into the unit disk, for every Δ > 0,
    so every HiPPO-LegS eigenvalue (−1…−N) and every eigenvalue of its normal part stays stable."""
    from zoo_core.init.hippo import hippo_legs, nplr_legs

    N = 16
    A, B = hippo_legs(N)
    lam_normal = nplr_legs(N).Lambda  # −½ + iω
    for dt in torch.logspace(-4, 4, 17, dtype=torch.float64):
        Abar = bilinear(A[None], B[None], dt[None], structure="dense").a
        radius = torch.linalg.eigvals(Abar[0]).abs().max()
        assert radius < 1, (float(dt), float(radius))
        a_normal = bilinear(lam_normal[None], torch.ones_like(lam_normal)[None], dt, structure="diag").a
        assert bool((a_normal.abs() < 1).all()), float(dt)

"""kernel_vandermonde against kernel_naive, and the naive dense kernel against the diagonal one.

Letters: H channels, N state size, L kernel length.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from zoo_core.kernels.kernel import block_size, kernel_naive, kernel_vandermonde
from zoo_core.kernels.systems import DenseSystem, DiagSystem
from zoo_core.testing import assert_rel_close as assert_close

F32, F64 = torch.float32, torch.float64


def make_system(H: int, N: int, cplx: bool, dtype: torch.dtype = F64) -> DiagSystem:
    """Stable system: Re log_a in [−0.1, −0.001], so kernels at L ≈ 1000 have not vanished."""
    re = -torch.exp(torch.empty(H, N, dtype=F64).uniform_(math.log(1e-3), math.log(0.1)))  # (H, N)
    if not cplx:
        return DiagSystem(re.to(dtype), torch.randn(H, N, dtype=F64).to(dtype))
    log_a = torch.complex(re, math.pi * torch.rand(H, N, dtype=F64))  # (H, N)
    w = torch.randn(H, N, dtype=torch.complex128)  # (H, N)
    return DiagSystem(log_a.to(dtype.to_complex()), w.to(dtype.to_complex()))


@pytest.mark.parametrize("L", [1, 5, 100, 1000, 1023])
@pytest.mark.parametrize("N", [1, 64])
@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_vandermonde_matches_naive_f64(cplx: bool, N: int, L: int) -> None:
    torch.manual_seed(L + N)
    system = make_system(3, N, cplx)
    assert_close("K", kernel_naive(system, L), kernel_vandermonde(system, L), 1e-10)


@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_vandermonde_f32(cplx: bool) -> None:
    torch.manual_seed(0)
    system = make_system(3, 16, cplx, F32)
    out = kernel_vandermonde(system, 257)
    assert out.dtype == F32
    assert_close("K", kernel_naive(system, 257), out, 1e-5)


@pytest.mark.parametrize("L", [7, 100])
@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_vandermonde_gradients(cplx: bool, L: int) -> None:
    torch.manual_seed(L)
    base = make_system(3, 8, cplx)
    g = torch.randn(3, L, dtype=F64)  # (H, L) upstream gradient
    grads = []
    for fn in (kernel_naive, kernel_vandermonde):
        log_a, w = base.log_a.clone().requires_grad_(), base.w.clone().requires_grad_()
        grads.append(torch.autograd.grad(fn(DiagSystem(log_a, w), L), (log_a, w), g))
    for name, ref, out in zip(("dlog_a", "dw"), *grads):
        assert_close(name, ref, out, 1e-10)


@pytest.mark.parametrize("L", [2, 3, 1000])  # L = 1: K = Re w, which the naive loop's graph does not reach log_a for
@pytest.mark.parametrize("kinds", ["real", "complex", "mixed"])
def test_vandermonde_op_backward_is_the_naive_gradient(kinds: str, L: int) -> None:
    """The custom op's analytic backward (zoo::vandermonde_kernel_bwd) against autograd through the naive
    loop, for real, complex and a real log_a beside a complex w (its gradient the real part)."""
    torch.manual_seed(L)
    base = make_system(3, 8, kinds != "real")
    if kinds == "mixed":
        base = DiagSystem(base.log_a.real.contiguous(), base.w)
    g = torch.randn(3, L, dtype=F64)
    grads = []
    for fn in (kernel_naive, kernel_vandermonde):
        log_a, w = base.log_a.clone().requires_grad_(), base.w.clone().requires_grad_()
        grads.append(torch.autograd.grad(fn(DiagSystem(log_a, w), L), (log_a, w), g))
    for name, ref, out in zip(("dlog_a", "dw"), *grads):
        assert out.dtype == ref.dtype, name
        assert_close(name, ref, out, 1e-10)


@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_vandermonde_op_passes_opcheck_and_gradcheck(cplx: bool) -> None:
    from zoo_core.kernels import vandermonde

    torch.manual_seed(1)
    system = make_system(2, 3, cplx)
    log_a, w = system.log_a.requires_grad_(), system.w.requires_grad_()
    torch.library.opcheck(vandermonde.vandermonde_kernel, (log_a, w, 11))
    assert torch.autograd.gradcheck(lambda a, b: vandermonde.vandermonde_kernel(a, b, 11), (log_a, w))


def test_vandermonde_backward_builds_no_hnl_intermediate() -> None:
    H, N, L = 2, 64, 4096
    T = block_size(L)
    J = math.ceil(L / T)
    system = make_system(H, N, True)
    log_a, w = system.log_a.requires_grad_(), system.w.requires_grad_()
    K = kernel_vandermonde(DiagSystem(log_a, w), L)
    with _Sizes() as sizes:
        torch.autograd.grad(K, (log_a, w), torch.randn_like(K))
    assert sizes.peak <= 2 * H * N * max(T, J) + 2 * H * L, f"peak {sizes.peak}; H·N·L = {H * N * L}"


def test_mixed_real_log_a_and_complex_w() -> None:
    torch.manual_seed(0)
    system = DiagSystem(-torch.rand(2, 4, dtype=F64), torch.randn(2, 4, dtype=torch.complex128))
    assert_close("K", kernel_naive(system, 33), kernel_vandermonde(system, 33), 1e-12)


def test_dense_naive_matches_diagonalised() -> None:
    # Ā = V diag(ā) V⁻¹ gives C Ā^l B̄ = Σ_n (C V)_n ā_n^l (V⁻¹ B̄)_n.
    torch.manual_seed(0)
    H, N, L = 2, 4, 50
    system = make_system(H, N, True)
    V = torch.randn(H, N, N, dtype=torch.complex128)  # (H, N, N)
    A = V @ torch.diag_embed(system.log_a.exp()) @ torch.linalg.inv(V)  # (H, N, N)
    B, C = torch.randn(H, N, dtype=F64), torch.randn(H, N, dtype=F64)  # (H, N)
    CV = torch.einsum("hi,hin->hn", C.to(V.dtype), V)  # (H, N)
    w = CV * torch.linalg.solve(V, B.to(V.dtype))  # (H, N)
    ref = kernel_naive(DiagSystem(system.log_a, w), L)
    assert_close("K", ref, kernel_naive(DenseSystem(A, B, C), L), 1e-10)


class _Sizes(TorchFunctionMode):
    """Records the largest tensor any torch call returns and how many entries exp runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.peak, self.exp_entries = 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.exp:
            self.exp_entries += args[0].numel()
        if isinstance(out, Tensor):
            self.peak = max(self.peak, out.numel())
        return out


def _full_vandermonde(system: DiagSystem, L: int) -> Tensor:
    V = torch.exp(system.log_a[..., None] * torch.arange(L))  # (H, N, L): what must not be built
    return torch.real((system.w[..., None] * V).sum(-2))  # (H, L)


@pytest.mark.parametrize("fn, blocked", [(kernel_vandermonde, True), (_full_vandermonde, False)])
def test_no_hnl_intermediate(fn, blocked: bool) -> None:
    H, N, L = 2, 64, 4096
    T = block_size(L)
    J = math.ceil(L / T)
    system = make_system(H, N, True)
    with _Sizes() as sizes:
        fn(system, L)
    fits = sizes.peak <= H * N * max(T, J) + H * L and sizes.exp_entries <= H * N * (T + J)
    assert fits is blocked, f"peak {sizes.peak}, exp on {sizes.exp_entries}; H·N·L = {H * N * L}"


def test_bad_arguments() -> None:
    system = make_system(1, 2, True)
    with pytest.raises(ValueError, match="at least 1"):
        kernel_vandermonde(system, 0)
    dense = DenseSystem(torch.eye(2)[None], torch.ones(1, 2), torch.ones(1, 2))
    with pytest.raises(TypeError, match="DiagSystem"):
        kernel_vandermonde(dense, 4)  # type: ignore[arg-type]

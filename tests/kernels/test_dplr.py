"""DPLR (S4) kernels: the explainer's N = 2 example, Cauchy against the dense reference (outputs,
Nyquist node, gradients, memory), C̃ ↔ C, and the O(N) step against the convolution.

Letters: H channels, M stored half state, N = 2M full state, L length, B batch.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from zoo_core.discretize import bilinear
from zoo_core.init.hippo import conj_half, dplr_legs, hippo_legs, nplr_legs
from zoo_core.kernels import dplr
from zoo_core.kernels.conv import conv_fft, conv_naive
from zoo_core.kernels.dplr import (
    DPLRStep,
    c_from_ctilde,
    ctilde_from_c,
    dplr_dense,
    dplr_discrete_dense,
    kernel_cauchy,
    kernel_dplr_naive,
)
from zoo_core.kernels.kernel import kernel_naive
from zoo_core.kernels.systems import DenseSystem, DPLRSystem
from zoo_core.testing import assert_close

F32, F64, C64, C128 = torch.float32, torch.float64, torch.complex64, torch.complex128


@pytest.fixture(autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    """The references loop over thousands of tiny ops: a second thread only adds barrier waits."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _dt(H: int, lo: float = 1e-3, hi: float = 1e-1) -> Tensor:
    return torch.exp(torch.empty(H, dtype=F64).uniform_(math.log(lo), math.log(hi)))  # (H)


def legs_system(H: int, N: int, dtype: torch.dtype = C128) -> DPLRSystem:
    """S4's init: HiPPO-LegS DPLR, complex-normal C̃, Δ log-uniform in [1e-3, 1e-1]."""
    lam, p, b = (x.expand(H, -1) for x in dplr_legs(N, dtype=C128))  # (H, M) each
    c = torch.randn(H, N // 2, dtype=C128)  # (H, M)
    return cast(DPLRSystem(lam, p, b, c, _dt(H)), dtype)


def random_system(H: int, N: int, dtype: torch.dtype = C128) -> DPLRSystem:
    """Random stable DPLR: Re Λ < 0 and −PP* dissipative, so the full A is stable."""
    M = N // 2
    lam = torch.complex(-torch.rand(H, M, dtype=F64) - 0.1, 10 * torch.randn(H, M, dtype=F64))
    p, b, c = (torch.randn(H, M, dtype=C128) for _ in range(3))  # (H, M) each
    return cast(DPLRSystem(lam, p, b, c, _dt(H, 1e-2, 1.0)), dtype)


def cast(s: DPLRSystem, dtype: torch.dtype) -> DPLRSystem:
    real = dtype.to_real()
    return DPLRSystem(s.Lambda.to(dtype), s.P.to(dtype), s.B.to(dtype), s.C.to(dtype), s.dt.to(real))


def with_c(s: DPLRSystem, c: Tensor) -> DPLRSystem:
    return DPLRSystem(s.Lambda, s.P, s.B, c, s.dt)


def unroll(system: DPLRSystem, u: Tensor, L_c: int) -> Tensor:
    """Run DPLRStep over u (B, L, H) from the zero state; C̃ belongs to length L_c."""
    mats = DPLRStep.precompute(system, L_c)
    x = DPLRStep.init_state(mats, u.shape[0])  # (B, H, M)
    ys = []
    for t in range(u.shape[1]):
        y, x = DPLRStep.step(mats, x, u[:, t])  # (B, H), (B, H, M)
        ys.append(y)
    return torch.stack(ys, 1)  # (B, L, H)


# the explainer's worked example: N = 2, Δ = 1, C = [1 0] -----------------------------------------
PULSE = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0], dtype=F64)
PULSE_OUT = torch.tensor([2 / 3, 8 / 9, 26 / 27, 80 / 81, 80 / 243, 80 / 729, 80 / 2187, 80 / 6561],
                         dtype=F64)  # climbs toward 1, then falls by 3 per step
GEOMETRIC = 2 / 3 * (1 / 3) ** torch.arange(8, dtype=F64)  # K_i = (2/3)(1/3)^i


def test_worked_example_dense() -> None:
    A, B = hippo_legs(2)  # [[−1, 0], [−√3, −2]], [1, √3]
    d = bilinear(A[None], B[None], 1.0, structure="dense")
    s3 = math.sqrt(3)
    Abar = torch.tensor([[[1 / 3, 0], [-s3 / 3, 0]]], dtype=F64)  # (1, 2, 2) as printed
    Bbar = torch.tensor([[2 / 3, s3 / 3]], dtype=F64)  # (1, 2) as printed
    assert_close("Abar", Abar, d.a, rtol=1e-14, atol=1e-15)
    assert_close("Bbar", Bbar, d.b, rtol=1e-14, atol=1e-15)
    k = kernel_naive(DenseSystem(d.a, d.b, torch.tensor([[1.0, 0.0]], dtype=F64)), 8)  # (1, 8)
    assert_close("K", GEOMETRIC[None], k, rtol=1e-14, atol=0)
    x, rec = torch.zeros(2, dtype=F64), []
    for u in PULSE:
        x = d.a[0] @ x + d.b[0] * u
        rec.append(x[0])
    u = PULSE[None, :, None]  # (1, L, 1)
    for name, y in [("recurrence", torch.stack(rec)), ("conv_naive", conv_naive(u, k)[0, :, 0]),
                    ("conv_fft", conv_fft(u, k)[0, :, 0])]:
        assert_close(name, PULSE_OUT, y, rtol=1e-13, atol=1e-15)


def test_worked_example_through_dplr() -> None:
    # Same system in the unitary eigenbasis of its normal part: C_full = [1 0] V_full.
    half = conj_half(nplr_legs(2))
    c = half.V[:1]  # (1, M) = [1 0] V_half
    system = DPLRSystem(half.Lambda[None], half.P[None], half.B[None], c, torch.ones(1, dtype=F64))
    system = with_c(system, ctilde_from_c(system, 8))
    assert_close("K cauchy", GEOMETRIC[None], kernel_cauchy(system, 8), rtol=1e-13, atol=1e-15)
    y = unroll(system, PULSE[None, :, None], 8)[0, :, 0]
    assert_close("step", PULSE_OUT, y, rtol=1e-13, atol=1e-15)


# full system and conversions ---------------------------------------------------------------------
def test_dense_form_is_s4_nplr() -> None:
    # For LegS, V_full* A_legs V_full = diag(Λ_full) − P_full P_full*: Q = P is the right tie.
    N = 8
    half = conj_half(nplr_legs(N))
    V = torch.cat([half.V, half.V.conj()], -1)  # (N, N)
    system = legs_system(1, N)
    A, _, _ = dplr_dense(system)
    ref = V.mH @ hippo_legs(N)[0].to(C128) @ V  # (N, N)
    assert_close("A", ref[None], A, rtol=0, atol=1e-12)


def test_c_round_trip_and_conjugate_symmetry() -> None:
    torch.manual_seed(0)
    system, L = legs_system(3, 16), 100
    ct = ctilde_from_c(system, L)  # system.C read as the true C
    assert_close("C", system.C, c_from_ctilde(with_c(system, ct), L), rtol=1e-11, atol=1e-12)
    # the full-state solve, done here by hand, is conjugate-symmetric
    Abar, _ = dplr_discrete_dense(system)
    ct_full = dplr_dense(system)[2]  # (H, N)
    lhs = torch.eye(16, dtype=C128) - torch.linalg.matrix_power(Abar, L)  # (H, N, N)
    c_full = torch.linalg.solve(lhs.mT, ct_full)  # (H, N)
    assert_close("conj half", c_full[:, :8].conj(), c_full[:, 8:], rtol=1e-11, atol=1e-12)
    assert_close("half", c_full[:, :8], c_from_ctilde(system, L), rtol=1e-11, atol=1e-12)


# Cauchy kernel against the dense reference -------------------------------------------------------
@pytest.mark.parametrize("L", [1, 2, 7, 1023, 1024])
def test_cauchy_matches_naive_legs(L: int) -> None:
    torch.manual_seed(L)
    system = legs_system(4, 64)
    assert_close("K", kernel_dplr_naive(system, L), kernel_cauchy(system, L), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("L", [1, 7, 256, 1023])
def test_cauchy_matches_naive_random(L: int) -> None:
    torch.manual_seed(L)
    system = random_system(4, 16)
    assert_close("K", kernel_dplr_naive(system, L), kernel_cauchy(system, L), rtol=1e-10, atol=1e-12)


def test_cauchy_float32() -> None:
    torch.manual_seed(0)
    system = legs_system(4, 64)
    ref = kernel_dplr_naive(system, 1024)
    out = kernel_cauchy(cast(system, C64), 1024)
    assert out.dtype == F32
    assert_close("K", ref, out, rtol=0, atol=2e-5 * ref.abs().max().item())


def _explainer_kernel(system: DPLRSystem, L: int) -> Tensor:
    """The explainer's listing (z = 2(1−ω)/((1+ω)Δ), four sums, 2/(1+ω) factor) on exact nodes."""
    _, B, C = dplr_dense(system)  # (H, N) each
    lam = torch.cat([system.Lambda, system.Lambda.conj()], -1)[:, None, :]  # (H, 1, N)
    P = torch.cat([system.P, system.P.conj()], -1)  # (H, N)
    omega = torch.exp(-2j * math.pi * torch.arange(L // 2 + 1) / L).to(B.dtype)  # (F)
    omega[L // 2] = -1 if L % 2 == 0 else omega[L // 2]  # exactly −1, as a table of roots gives
    s = (2 / system.dt[:, None]) * (1 - omega) / (1 + omega)  # (H, F)

    def cauchy(v: Tensor) -> Tensor:
        return (v[:, None, :] / (s[..., None] - lam)).sum(-1)  # (H, F)

    k00, k01 = cauchy(C * B), cauchy(C * P)
    k10, k11 = cauchy(P.conj() * B), cauchy(P.conj() * P)
    return torch.fft.irfft(2 / (1 + omega) * (k00 - k01 * k10 / (1 + k11)), n=L)  # (H, L)


@pytest.mark.parametrize("L", [2, 8, 1024])
def test_nyquist_node_finite(L: int) -> None:
    torch.manual_seed(L)
    system = legs_system(4, 64)
    assert not bool(torch.isfinite(_explainer_kernel(cast(system, C64), L)).any())  # 0/0 at ω = −1
    ref = kernel_dplr_naive(system, L)
    for dtype, rtol in [(C128, 1e-10), (C64, 1e-4)]:
        out = kernel_cauchy(cast(system, dtype), L)
        assert bool(torch.isfinite(out).all())
        assert_close(f"K {dtype}", ref, out, rtol=0, atol=rtol * ref.abs().max().item())
    # K̂ at ω = −1 is the limit C̃ (I + Ā)⁻¹ B̄
    Abar, Bbar = dplr_discrete_dense(system)
    lim = torch.linalg.solve(torch.eye(64, dtype=C128) + Abar, Bbar)  # (H, N)
    lim = (dplr_dense(system)[2] * lim).sum(-1).real  # (H)
    nyq = torch.fft.rfft(kernel_cauchy(system, L))[:, L // 2].real  # (H)
    assert_close("K̂(−1)", lim, nyq, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("G", [17, 3], ids=["one_chunk", "chunks_of_3"])
def test_cauchy_gradients(G: int, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    base, L = random_system(2, 8), 33  # F = 17 nodes
    monkeypatch.setattr(dplr, "CHUNK_ELEMENTS", 2 * 4 * G)
    g = torch.randn(2, L, dtype=F64)  # (H, L) upstream gradient
    names = ("Lambda", "P", "B", "C", "dt")
    grads, outs = [], []
    for fn in (kernel_dplr_naive, kernel_cauchy):
        leaves = [getattr(base, n).clone().requires_grad_() for n in names]
        outs.append(fn(DPLRSystem(*leaves), L))
        grads.append(torch.autograd.grad(outs[-1], leaves, g))
    assert_close("K", *outs, rtol=1e-10, atol=1e-12)
    for name, ref, out in zip(names, *grads):
        assert_close(f"d{name}", ref, out, rtol=1e-9, atol=1e-9 * ref.abs().max().item())


# the recurrent view ------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [legs_system, random_system])
def test_step_unrolled_equals_convolution(make) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    system, L = make(3, 16), 50
    u = torch.randn(2, L, 3, dtype=F64)  # (B, L, H)
    ref = conv_naive(u, kernel_cauchy(system, L))  # (B, L, H)
    assert_close("y f64", ref, unroll(system, u, L), rtol=1e-10, atol=1e-10 * ref.abs().max().item())
    out = unroll(cast(system, C64), u.float(), L)
    assert out.dtype == F32
    assert_close("y f32", ref, out, rtol=0, atol=1e-4 * ref.abs().max().item())


# memory ------------------------------------------------------------------------------------------
class _Peak(TorchFunctionMode):
    """Records the largest tensor any torch call returns."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, Tensor):
                self.peak = max(self.peak, t.numel())
        return out


@pytest.mark.parametrize("chunked", [True, False])
def test_no_hml_intermediate(chunked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    H, N, L, G = 2, 64, 4096, 128
    M, F = N // 2, L // 2 + 1
    monkeypatch.setattr(dplr, "CHUNK_ELEMENTS", H * M * G if chunked else 1 << 30)
    # the op's body: a torch-function mode sees no further into the custom op cauchy_khat than its result
    monkeypatch.setattr(dplr, "cauchy_khat", dplr._khat_chunked)
    system = legs_system(H, N)
    with _Peak() as sizes:
        kernel_cauchy(system, L)
    fits = sizes.peak <= H * M * G + H * L
    assert fits is chunked, f"peak {sizes.peak}; H·M·F = {H * M * F}"


@pytest.mark.parametrize("chunked", [True, False])
def test_backward_saves_no_hml(chunked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    H, N, L, G = 2, 64, 4096, 128
    M = N // 2
    monkeypatch.setattr(dplr, "CHUNK_ELEMENTS", H * M * G)
    if not chunked:  # plain autograd through the chunks saves every (H, M, G) intermediate
        monkeypatch.setattr(dplr, "cauchy_khat", dplr._khat_chunked)  # the op's body, not the op
    system = legs_system(H, N)
    lam = system.Lambda.clone().requires_grad_()
    saved: list[int] = []
    record = lambda t: saved.append(t.numel()) or t  # noqa: E731
    with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        k = kernel_cauchy(DPLRSystem(lam, system.P, system.B, system.C, system.dt), L)
    (grad,) = torch.autograd.grad(k.sum(), lam)
    assert bool(torch.isfinite(grad).all())
    fits = sum(saved) <= 2 * H * (N + L)
    assert fits is chunked, f"saved {sum(saved)} entries; H·M·L/2 = {H * M * L // 2}"


# dispatch and registry ---------------------------------------------------------------------------
def test_kernel_naive_dispatches_dplr() -> None:
    torch.manual_seed(0)
    system = random_system(2, 8)
    assert torch.equal(kernel_naive(system, 20), kernel_dplr_naive(system, 20))


def test_registry() -> None:
    from zoo_core.plugin_registry import Problem
    from zoo_core.plugins import load_registry

    reg = load_registry()
    cauchy = reg.backend("kernel", "cauchy")
    assert cauchy.load() is kernel_cauchy
    assert cauchy.supports(Problem(structure="dplr")) is None
    assert cauchy.supports(Problem(structure="diag")) is not None
    assert reg.backend("kernel", "naive").supports(Problem(structure="dplr")) is None
    auto = next(b for b in reg.backends_for("kernel") if b.supports(Problem(structure="dplr")) is None)
    assert auto.name == "cauchy"  # picked over naive by priority


def test_bad_arguments() -> None:
    system = random_system(2, 4)
    with pytest.raises(ValueError, match="at least 1"):
        kernel_cauchy(system, 0)
    with pytest.raises(ValueError, match=r"\(H, M\)"):
        kernel_cauchy(with_c(system, system.C[:, :1]), 4)
    with pytest.raises(ValueError, match="dt must be"):
        kernel_cauchy(DPLRSystem(system.Lambda, system.P, system.B, system.C, system.dt[:1]), 4)

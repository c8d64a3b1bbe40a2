"""The kernels are immune to subnormal floats (issue 16): no op of theirs yields one, and they equal
the previous implementations, which did, within float32 rounding (outputs and gradients).

Each problem decays far below float32's normal range within L (``Re log ā · L`` down to ≈ −1000,
float32's smallest normal is ``exp(−87.3)``), so the previous code's powers went subnormal; the
tests assert that they did, by watching every op's output under a ``TorchDispatchMode``.

Letters: H channels, N state size (M stored half of a DPLR state), L kernel length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from zoo_core.init.hippo import dplr_legs
from zoo_core.kernels.dplr import (
    _full,
    c_from_ctilde,
    dplr_discrete_dense,
    kernel_cauchy,
    kernel_dplr_naive,
)
from zoo_core.kernels.kernel import block_size, exp_flushed, kernel_naive, kernel_vandermonde
from zoo_core.kernels.naive import common, flush_subnormal
from zoo_core.kernels.systems import DenseSystem, DiagSystem, DPLRSystem
from zoo_core.testing import assert_rel_close

F32, F64, C64, C128 = torch.float32, torch.float64, torch.complex64, torch.complex128


def subnormal_count(x: Tensor) -> int:
    """Entries of x (real and imaginary parts apart) with 0 < |x| < tiny."""
    if x.is_complex():
        x = torch.view_as_real(x.resolve_conj())
    if not x.is_floating_point():
        return 0
    return int(((x.abs() < torch.finfo(x.dtype).tiny) & (x != 0)).sum())


_MOVES = {torch.ops.aten.stack.default, torch.ops.aten.cat.default, torch.ops.aten.clone.default,
          torch.ops.aten.copy_.default, torch.ops.aten._unsafe_view.default}  # data movement, no arithmetic


class Subnormals(TorchDispatchMode):
    """Records the aten ops that compute on subnormal floats, forward (and backward, if active).

    ``consumed``: ops that read a subnormal input, i.e. arithmetic on subnormals, which is what is
    slow (views, which only relabel memory, and the flush itself are not counted). ``produced``: ops
    whose output holds one; an immune kernel may produce a subnormal in one elementwise op (the
    product ``e^x · cos y`` in ``polar``, ``w · ā^{jT}``) if the very next op flushes it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.consumed: dict[str, int] = {}
        self.produced: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        view = any(r.alias_info is not None for r in func._schema.returns) or func in _MOVES
        if not view and func is not torch.ops.aten.hardshrink.default:
            n = sum(subnormal_count(t) for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor))
            if n:
                self.consumed[str(func)] = self.consumed.get(str(func), 0) + n
        out = func(*args, **kwargs)
        n = sum(subnormal_count(t) for t in tree_leaves(out) if isinstance(t, Tensor))
        if n and not view:
            self.produced[str(func)] = self.produced.get(str(func), 0) + n
        return out


def watch(fn: Callable[[], Tensor]) -> tuple[Tensor, dict[str, int]]:
    """fn's output and the ops that computed on subnormals in it (``Subnormals.consumed``)."""
    with Subnormals() as mode:
        out = fn()
    return out, mode.consumed


# ---- the previous implementations, verbatim in substance (before the flush) -------------------------

def old_vandermonde(system: DiagSystem, L: int) -> Tensor:
    log_a, w = common(system.log_a, system.w)  # (H, N), (H, N)
    T = block_size(L)
    J = math.ceil(L / T)
    real = torch.empty(0, dtype=log_a.dtype).real.dtype
    t = torch.arange(T, dtype=real)  # (T)
    j = torch.arange(J, dtype=real) * T  # (J)
    inner = torch.exp(log_a[..., None] * t)  # (H, N, T)
    outer = w[..., None] * torch.exp(log_a[..., None] * j)  # (H, N, J)
    K = torch.real(outer.transpose(-1, -2) @ inner)  # (H, J, T)
    return K.reshape(K.shape[0], J * T)[:, :L]


def old_naive_diag(system: DiagSystem, L: int) -> Tensor:
    log_a, w = common(system.log_a, system.w)
    a, x, out = torch.exp(log_a), w, []
    for _ in range(L):
        out.append(torch.real(x.sum(-1)))
        x = a * x
    return torch.stack(out, -1)


def old_naive_dense(system: DenseSystem, L: int) -> Tensor:
    A, x, C = common(system.A, system.B, system.C)
    out = []
    for _ in range(L):
        out.append(torch.real((C * x).sum(-1)))
        x = torch.einsum("hij,hj->hi", A, x)
    return torch.stack(out, -1)


# ---- problems whose powers go subnormal ------------------------------------------------------------

def decaying_diag(H: int, N: int, cplx: bool, dtype: torch.dtype, lo: float = 1e-3, hi: float = 0.5) -> DiagSystem:
    """Re log ā log-uniform in [−hi, −lo]: at L = 2000 the fast modes reach exp(−1000)."""
    g = torch.Generator().manual_seed(H * N + cplx)
    re = -torch.exp(torch.empty(H, N, dtype=F64).uniform_(math.log(lo), math.log(hi), generator=g))
    w = torch.randn(H, N, dtype=C128 if cplx else F64, generator=g)
    log_a = torch.complex(re, math.pi * torch.rand(H, N, dtype=F64, generator=g)) if cplx else re
    return DiagSystem(log_a.to(dtype if not cplx else dtype.to_complex()), w.to(dtype if not cplx else dtype.to_complex()))


def decaying_dplr(H: int, N: int, dtype: torch.dtype = C64) -> DPLRSystem:
    """S4's HiPPO-LegS init with Δ log-uniform in [1e-2, 1]: Re(Δλ) reaches −0.5 per step."""
    g = torch.Generator().manual_seed(H + N)
    lam, p, b = (x.expand(H, -1).to(dtype) for x in dplr_legs(N, dtype=C128))
    c = torch.randn(H, N // 2, dtype=C128, generator=g).to(dtype)
    dt = torch.exp(torch.empty(H, dtype=F64).uniform_(math.log(1e-2), 0.0, generator=g))
    return DPLRSystem(lam, p, b, c, dt.to(torch.empty(0, dtype=dtype).real.dtype))


L_LONG = 2000


@pytest.fixture(autouse=True)
def _two_threads():  # type: ignore[no-untyped-def]
    """Two intra-op threads, as on the reference CPU (set_flush_denormal would reach one of them only)."""
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


# ---- the building blocks ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F64, C64, C128])
def test_flush_subnormal_zeroes_exactly_the_subnormals(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    vals = [0.0, info.tiny, -info.tiny, info.tiny * (1 - info.eps), -info.tiny / 3, info.tiny * info.eps, 1.0, -2.5]
    x = torch.tensor(vals, dtype=torch.empty(0, dtype=dtype).real.dtype)
    if dtype.is_complex:
        x = torch.complex(x, x.flip(0))
    y = flush_subnormal(x)
    assert subnormal_count(y) == 0
    parts = (lambda t: torch.view_as_real(t)) if dtype.is_complex else (lambda t: t)
    kept = parts(x).abs() >= info.tiny
    assert torch.equal(parts(y)[kept], parts(x)[kept]), "normal entries must be kept bit for bit"
    assert not parts(y)[~kept].any()
    # straight-through: the gradient is the identity
    xr = x.clone().requires_grad_()
    g = torch.randn_like(x)
    (gx,) = torch.autograd.grad(flush_subnormal(xr), xr, g)
    assert torch.equal(gx, g)


def test_exp_flushed_keeps_nan() -> None:
    """A parameter gone NaN must show as NaN, not as a clean 0 that hides the divergence."""
    out = exp_flushed(torch.tensor([float("nan"), -1000.0, -1.0]))
    assert out[0].isnan() and out[1] == 0 and torch.isclose(out[2], torch.exp(torch.tensor(-1.0)))


@pytest.mark.parametrize("dtype", [F32, F64, C64, C128])
def test_exp_flushed(dtype: torch.dtype) -> None:
    real = torch.empty(0, dtype=dtype).real.dtype
    x = torch.linspace(-1000.0, 5.0, 4001, dtype=F64).to(real)  # covers both float32's and float64's underflow
    z = torch.complex(x, torch.linspace(0, 20, 4001, dtype=real)) if dtype.is_complex else x
    ref = torch.exp(z.to(C128 if dtype.is_complex else F64))
    out, hits = watch(lambda: exp_flushed(z))
    assert not hits, hits
    assert subnormal_count(torch.exp(z)) > 0, "the plain exp must underflow here, or the test shows nothing"
    tiny = torch.finfo(real).tiny
    err = (out.to(ref.dtype) - ref).abs()
    assert bool((err <= 4 * torch.finfo(real).eps * ref.abs() + 2 * tiny).all())


# ---- the kernels -----------------------------------------------------------------------------------

@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_vandermonde_f32_immune_and_equal(cplx: bool) -> None:
    system = decaying_diag(4, 16, cplx, F32)
    old, old_hits = watch(lambda: old_vandermonde(system, L_LONG))
    assert old_hits, "the previous kernel must produce subnormals on this problem"
    new, hits = watch(lambda: kernel_vandermonde(system, L_LONG))
    assert not hits, f"arithmetic on subnormals in {hits}"
    assert subnormal_count(new) == 0
    assert_rel_close("K", old, new, 2e-6)


@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_vandermonde_f32_gradients_equal(cplx: bool) -> None:
    base = decaying_diag(4, 16, cplx, F32)
    g = torch.randn(4, L_LONG, generator=torch.Generator().manual_seed(3))
    grads, counts = [], []
    for fn in (old_vandermonde, kernel_vandermonde):
        log_a, w = base.log_a.clone().requires_grad_(), base.w.clone().requires_grad_()
        out = fn(DiagSystem(log_a, w), L_LONG)
        with Subnormals() as mode:
            grads.append(torch.autograd.grad(out, (log_a, w), g))
        counts.append(sum(mode.consumed.values()))
    # backward: a gradient times a power just above tiny may still round into a subnormal, a handful of
    # entries (not flushed: that would cost a pass over every power), against many before
    assert counts[0] > 0 and counts[1] <= counts[0] // 10, counts
    for name, ref, got in zip(("dlog_a", "dw"), *grads, strict=True):
        assert bool(got.isfinite().all())
        assert_rel_close(name, ref, got, 2e-6)


@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_vandermonde_f64_immune(cplx: bool) -> None:
    """float64 flushes at its own threshold, exp(−708.4): L = 4000 reaches exp(−2000)."""
    system = decaying_diag(4, 16, cplx, F64, lo=0.05, hi=0.5)
    old, old_hits = watch(lambda: old_vandermonde(system, 4000))
    assert old_hits
    new, hits = watch(lambda: kernel_vandermonde(system, 4000))
    assert not hits, hits
    assert_rel_close("K", old, new, 1e-13)


@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_naive_diag_immune_and_equal(cplx: bool) -> None:
    base = decaying_diag(3, 8, cplx, F32)
    g = torch.randn(3, L_LONG, generator=torch.Generator().manual_seed(4))
    outs, grads, hits = [], [], []
    for fn in (old_naive_diag, kernel_naive):
        log_a, w = base.log_a.clone().requires_grad_(), base.w.clone().requires_grad_()
        out, h = watch(lambda: fn(DiagSystem(log_a, w), L_LONG))  # noqa: B023 (called at once)
        outs.append(out.detach())
        hits.append(h)
        grads.append(torch.autograd.grad(out, (log_a, w), g))
    assert hits[0] and not hits[1], hits
    assert_rel_close("K", outs[0], outs[1], 2e-6)
    for name, ref, got in zip(("dlog_a", "dw"), *grads, strict=True):
        assert_rel_close(name, ref, got, 2e-6)


def test_naive_dense_immune_and_equal() -> None:
    """A dense system (a random rotation of a decaying diagonal one) against the previous loop."""
    d = decaying_diag(2, 6, True, F64, lo=0.1)  # every mode decays, so every component of Ā^l B̄ does
    g = torch.Generator().manual_seed(5)
    V = torch.linalg.qr(torch.randn(2, 6, 6, dtype=C128, generator=g))[0]  # (H, N, N) unitary
    A = V @ torch.diag_embed(torch.exp(d.log_a)) @ V.mH  # (H, N, N)
    B, C = torch.randn(2, 6, dtype=C128, generator=g), torch.randn(2, 6, dtype=C128, generator=g)
    base = DenseSystem(A.to(C64), B.to(C64), C.to(C64))
    old, old_hits = watch(lambda: old_naive_dense(base, L_LONG))
    assert old_hits
    leaves = [x.clone().requires_grad_() for x in (base.A, base.B, base.C)]
    new, hits = watch(lambda: kernel_naive(DenseSystem(*leaves), L_LONG))
    assert not hits, hits
    assert_rel_close("K", old, new.detach(), 2e-6)
    gk = torch.randn(2, L_LONG, generator=g)
    ref_leaves = [x.clone().requires_grad_() for x in (base.A, base.B, base.C)]
    ref = torch.autograd.grad(old_naive_dense(DenseSystem(*ref_leaves), L_LONG), ref_leaves, gk)
    got = torch.autograd.grad(new, leaves, gk)
    for name, r, o in zip("ABC", ref, got, strict=True):
        assert_rel_close(f"d{name}", r, o, 2e-6)


def test_dplr_naive_immune_and_equal() -> None:
    """S4's dense reference: C from C̃ (a matrix power) and the dense powers, against the previous code."""
    system = decaying_dplr(3, 16)

    def old() -> Tensor:
        Abar, Bbar = dplr_discrete_dense(system)
        eye = torch.eye(Abar.shape[-1], dtype=Abar.dtype)
        ct = _full(system.C)
        c = torch.linalg.solve((eye - torch.linalg.matrix_power(Abar, L_LONG)).mT, ct)
        return old_naive_dense(DenseSystem(Abar, Bbar, c), L_LONG)

    ref, old_hits = watch(old)
    assert old_hits
    new, hits = watch(lambda: kernel_dplr_naive(system, L_LONG))
    assert not hits, hits
    assert_rel_close("K", ref, new, 2e-6)
    assert_rel_close("C", _full(c_from_ctilde(system, L_LONG)), _full(c_from_ctilde(system, L_LONG)), 0.0)


def test_cauchy_has_no_subnormals() -> None:
    """kernel_cauchy never forms a power Ā^l: it is immune by construction (its forward watched)."""
    system = decaying_dplr(3, 16)
    with torch.no_grad():
        k, hits = watch(lambda: kernel_cauchy(system, L_LONG))
    assert not hits, hits
    assert subnormal_count(k) == 0
    assert_rel_close("K", kernel_dplr_naive(system, L_LONG), k, 1e-4)

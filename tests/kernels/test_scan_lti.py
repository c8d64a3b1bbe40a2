"""scan_chunked (time-invariant diagonal) against the sequential loop: outputs, final state and
gradients, real and complex, odd lengths, several recursion levels, long-L stability."""

from __future__ import annotations

import pytest
import torch

import zoo_core.kernels.scan_lti as scan_lti
from zoo_core.kernels.scan import scan_naive
from zoo_core.kernels.scan_lti import scan_chunked
from zoo_core.testing import assert_close

F64, C128 = torch.float64, torch.complex128


def _case(L, cplx, h0, seed=0):
    g = torch.Generator().manual_seed(seed)
    if cplx:
        a = (torch.rand(3, 4, generator=g, dtype=F64) * 0.5 + 0.5) * torch.exp(1j * torch.rand(3, 4, generator=g, dtype=F64))
        b = torch.randn(2, L, 3, 4, generator=g, dtype=C128)
        h = torch.randn(2, 3, 4, generator=g, dtype=C128) if h0 else None
    else:
        a = torch.rand(3, 4, generator=g, dtype=F64) * 1.8 - 0.9  # negative decays too
        b = torch.randn(2, L, 3, 4, generator=g, dtype=F64)
        h = torch.randn(2, 3, 4, generator=g, dtype=F64) if h0 else None
    return a[None, None], b, h


@pytest.mark.parametrize("L", [1, 7, 37, 257, 1100])
@pytest.mark.parametrize("cplx", [False, True])
@pytest.mark.parametrize("h0", [False, True])
def test_equals_the_loop_with_gradients(L, cplx, h0, monkeypatch):
    monkeypatch.setattr(scan_lti, "CHUNK", 8)  # several recursion levels even at small L
    a, b, h = _case(L, cplx, h0)
    inputs = [t.clone().requires_grad_(True) for t in (a, b) + ((h,) if h0 else ())]
    ref = scan_naive(inputs[0], inputs[1], inputs[2] if h0 else None)
    out = scan_chunked(inputs[0], inputs[1], inputs[2] if h0 else None)
    assert_close("states", ref[0], out[0], rtol=1e-10, atol=1e-10)
    assert_close("final state", ref[1], out[1], rtol=1e-10, atol=1e-10)
    cot = torch.randn(ref[0].shape, dtype=ref[0].dtype)
    g_ref = torch.autograd.grad((ref[0] * cot.conj()).real.sum(), inputs)
    g_out = torch.autograd.grad((out[0] * cot.conj()).real.sum(), inputs)
    for name, r, o in zip(("a", "b", "h0"), g_ref, g_out):
        assert_close(f"grad {name}", r, o, rtol=1e-9, atol=1e-9)


def test_long_sequence_float32_is_finite_and_accurate():
    g = torch.Generator().manual_seed(1)
    a = (0.9 + 0.099 * torch.rand(16, generator=g)) * torch.exp(1j * torch.rand(16, generator=g))
    b = torch.randn(1, 16384, 16, generator=g, dtype=torch.complex64)
    out, _ = scan_chunked(a.to(torch.complex64)[None, None], b)
    ref, _ = scan_naive(a.to(C128)[None, None], b.to(C128))
    assert bool(torch.isfinite(torch.view_as_real(out)).all())
    rel = ((out.to(C128) - ref).abs().max() / ref.abs().max()).item()
    assert rel < 1e-4, rel


def test_refuses_time_varying_or_block_structures():
    b = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match="time- and batch-invariant"):
        scan_chunked(torch.rand(2, 5, 3), b)
    with pytest.raises(ValueError, match="'diag' only"):
        scan_chunked(torch.rand(1, 1, 3, 2, 2), torch.randn(2, 5, 3, 2), structure="block2x2")


def test_registered_for_lti_diagonal_problems_only():
    from zoo_core.plugin_registry import Problem
    from zoo_core.plugins import get_registry

    entry = get_registry().backend("scan", "chunked")
    assert entry.supports(Problem(structure="diag", lti=True)) is None
    assert entry.supports(Problem(structure="diag", lti=False)) is not None
    assert entry.supports(Problem(structure="block2x2", lti=True)) is not None

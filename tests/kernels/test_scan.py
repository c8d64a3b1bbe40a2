"""scan_parallel against the scan_naive loop: outputs, final state and gradients.

Letters: B batch, L length, S state dims.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from zoo_core.kernels import scan
from zoo_core.kernels.scan import scan_naive, scan_parallel
from zoo_core.testing import assert_rel_close as assert_close

F32, F64 = torch.float32, torch.float64
CASES = ("diag_real", "diag_complex", "block2x2", "block2x2_defective")
TOL = {F64: 1e-10, F32: 1e-5}


def _decays(shape: tuple[int, ...], lo: float, hi: float, dtype: torch.dtype, cplx: bool) -> Tensor:
    r = lo + (hi - lo) * torch.rand(shape, dtype=F64)
    if cplx:
        return torch.polar(r, 2 * math.pi * torch.rand(shape, dtype=F64)).to(dtype.to_complex())
    return (r * torch.where(torch.rand(shape) < 0.5, -1.0, 1.0).to(F64)).to(dtype)


def make_case(
    case: str, L: int, dtype: torch.dtype, B: int = 2
) -> tuple[Tensor, Tensor, Tensor, str]:
    """(a, b, h0, structure) with a in a different broadcast shape for each case."""
    if case == "diag_real":  # a: (B, L, *S), S = (3, 2)
        a = _decays((B, L, 3, 2), 0.5, 1.0, dtype, False)
        return a, torch.randn(B, L, 3, 2, dtype=dtype), torch.randn(B, 3, 2, dtype=dtype), "diag"
    if case == "diag_complex":  # a: (L, *S), b complex
        c = dtype.to_complex()
        a = _decays((L, 3, 2), 0.5, 1.0, dtype, True)
        return a, torch.randn(B, L, 3, 2, dtype=c), torch.randn(B, 3, 2, dtype=c), "diag"
    if case == "block2x2":  # a: (B, L, S, 2, 2), spectral norm 0.95
        M = torch.randn(B, L, 3, 2, 2, dtype=F64)
        a = (0.95 * M / torch.linalg.matrix_norm(M, 2)[..., None, None]).to(dtype)
        b = torch.randn(B, L, 3, 2, dtype=dtype)
        return a, b, torch.randn(B, 3, 2, dtype=dtype), "block2x2"
    # defective LTI block [[1, Δ], [0, 1]], a: (1, 1, S, 2, 2): not diagonalisable
    a = torch.zeros(1, 1, 3, 2, 2, dtype=dtype)
    a[..., 0, 0] = a[..., 1, 1] = 1.0
    a[..., 0, 1] = 0.1 * torch.rand(3, dtype=dtype)
    return a, torch.randn(B, L, 3, 2, dtype=dtype), torch.randn(B, 3, 2, dtype=dtype), "block2x2"


def _run_with_grads(fn, a: Tensor, b: Tensor, h0: Tensor, structure: str, gs: list[Tensor]):
    a, b, h0 = (x.detach().clone().requires_grad_() for x in (a, b, h0))
    h_all, h_last = fn(a, b, h0, structure=structure)
    return h_all, h_last, torch.autograd.grad([h_all, h_last], (a, b, h0), gs)


@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
@pytest.mark.parametrize("L", [1, 7, 37, 257])
@pytest.mark.parametrize("case", CASES)
def test_parallel_matches_naive(case: str, L: int, dtype: torch.dtype) -> None:
    torch.manual_seed(L)
    a, b, h0, structure = make_case(case, L, dtype)
    h_shape = b.shape[:1] + b.shape[2:]
    gs = [torch.randn(b.shape, dtype=b.dtype), torch.randn(h_shape, dtype=b.dtype)]
    ref = _run_with_grads(scan_naive, a, b, h0, structure, gs)
    out = _run_with_grads(scan_parallel, a, b, h0, structure, gs)
    tol = TOL[dtype]
    assert_close("h_all", ref[0], out[0], tol)
    assert_close("h_last", ref[1], out[1], tol)
    for name, g_ref, g_out in zip(("da", "db", "dh0"), ref[2], out[2]):
        assert_close(name, g_ref, g_out, tol)


@pytest.mark.parametrize("case", CASES)
def test_without_h0_and_deep_recursion(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # chunk 3 (not a power of two) at L = 100 recurses four levels deep with ragged padding
    monkeypatch.setattr(scan, "CHUNK", 3)
    torch.manual_seed(1)
    a, b, _, structure = make_case(case, 100, F64)
    ref = scan_naive(a, b, structure=structure)
    out = scan_parallel(a, b, structure=structure)
    assert_close("h_all", ref[0], out[0], 1e-10)
    assert_close("h_last", ref[1], out[1], 1e-10)


def _cumprod_scan(a: Tensor, b: Tensor, h0: Tensor | None = None, *, structure: str = "diag"):
    """The forbidden trick, h_t = P_t Σ_{s≤t} b_s / P_s: kept only to see the check below fail."""
    P = torch.cumprod(a.expand(b.shape), 1)
    h = P * torch.cumsum(b / P, 1)
    return h, h[:, -1]


def _long_case(case: str, L: int) -> tuple[Tensor, Tensor, str]:
    torch.manual_seed(0)
    if case == "block2x2":  # r·rotation(θ), |eig| = r in [0.9, 0.999]
        r = 0.9 + 0.099 * torch.rand(2, 1, 4, dtype=F64)
        th = torch.rand(2, 1, 4, dtype=F64)
        rot = torch.stack([th.cos(), -th.sin(), th.sin(), th.cos()], -1).reshape(2, 1, 4, 2, 2)
        a = (r[..., None, None] * rot).expand(2, L, 4, 2, 2)
        return a, torch.randn(2, L, 4, 2, dtype=F64), case
    a = _decays((2, L, 4), 0.9, 0.999, F64, case == "diag_complex")
    return a, torch.randn(a.shape, dtype=a.dtype), "diag"


def _f32(x: Tensor) -> Tensor:
    return x.to(torch.complex64 if x.is_complex() else F32)


def _long_error(fn, case: str, L: int = 16384) -> float:
    a, b, structure = _long_case(case, L)
    ref, _ = scan_naive(a, b, structure=structure)
    out, _ = fn(_f32(a), _f32(b), structure=structure)
    if not torch.isfinite(torch.view_as_real(out) if out.is_complex() else out).all():
        return math.inf
    return ((out.to(ref.dtype) - ref).abs().norm() / ref.abs().norm()).item()


@pytest.mark.parametrize("case", ["diag_real", "diag_complex", "block2x2"])
def test_long_sequence_float32_is_stable(case: str) -> None:
    err = _long_error(scan_parallel, case)
    assert err <= 1e-4, f"float32 scan at L=16384: relative error {err:.2e} against a float64 loop"


def test_long_sequence_check_catches_cumprod_trick() -> None:
    assert _long_error(_cumprod_scan, "diag_real") > 1e-4


def test_errors_name_the_problem() -> None:
    b = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match="diag, block2x2"):
        scan_parallel(torch.rand(2, 5, 3), b, structure="dense")
    with pytest.raises(ValueError, match="does not broadcast"):
        scan_parallel(torch.rand(4, 3), b)
    with pytest.raises(ValueError, match=r"\(B, L, \*S, 2\)"):
        scan_naive(torch.rand(2, 5, 3, 2, 2), b, structure="block2x2")


@pytest.mark.parametrize("case", ["diag_real", "block2x2"])
def test_long_sequence_with_bfloat16_activations(case: str) -> None:
    """Reliability N8 at L = 16384 for every CPU backend of the scan: decays in float32 (parameters stay
    float32 under mixed precision), inputs b in bfloat16 (activations). Each backend computes in float32:
    finite, and within 1e-4 of the float64 loop on the same rounded input (1e-2 where it returns bfloat16)."""
    from zoo_core.plugin_registry import Problem
    from zoo_core.plugins import get_registry

    a, b, structure = _long_case(case, 16384)
    b16 = b.to(torch.bfloat16)
    ref, _ = scan_naive(a, b16.to(F64), structure=structure)
    problem = Problem(structure=structure, lti=False, complex=False, device="cpu")
    served = [e for e in get_registry().backends_for("scan") if e.check(problem)[0] is None]
    assert len(served) >= 2, [e.name for e in served]
    for entry in served:
        out, last = entry.load()(a.to(F32), b16, structure=structure)
        assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(last).all()), entry.name
        err = ((out.to(F64) - ref).norm() / ref.norm()).item()
        bound = 1e-4 if out.dtype == F32 else 1e-2
        assert err <= bound, f"{entry.name}: bfloat16 activations at L=16384, relative error {err:.2e} > {bound:.0e}"

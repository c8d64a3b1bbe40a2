"""The fused C++ CPU scan (backend cpu-scan, ``zoo_core.kernels.scan_cpu``) against ``scan_naive``: every
state, the final one and every gradient (a, b, h0), diagonal real and complex and 2×2 blocks,
time-varying and time-invariant a, resets, odd sizes (L = 1, state counts off the SIMD width and off
the kernel's block), float64 tightly and float32/bfloat16 loosely; the custom ops under opcheck and
torch.compile(fullgraph=True); auto's choice on CPU and its announced fallback."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from zoo_core.kernels import cpp
from zoo_core.kernels import scan_cpu as K
from zoo_core.kernels.scan import scan_naive
from zoo_core.logs import reset_log_once
from zoo_core.plugin_registry import Problem
from zoo_core.plugins import get_registry

REASON = K.unavailable_reason()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"the C++ scan kernel is unavailable here: {REASON}")


def make(structure: str = "diag", *, cplx: bool = False, tv: bool = False, reset: bool = False, h0: bool = True,
         S: tuple[int, ...] = (3, 37), L: int = 13, B: int = 2, real_a: bool = False, seed: int = 0,
         dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """S = (3, 37): 111 values (222 with pairs), off every SIMD width; |a| < 1 so states stay bounded."""
    g = torch.Generator().manual_seed(seed)
    cdt = {torch.float64: torch.complex128, torch.float32: torch.complex64}[dtype]
    dt = cdt if cplx else dtype
    pair = (2,) if structure == "block2x2" else ()
    a_shape = ((B, L) if tv else ()) + S + ((2, 2) if structure == "block2x2" else ())
    a = torch.randn(a_shape, generator=g, dtype=torch.float64 if real_a else torch.complex128 if cplx else torch.float64) * 0.5
    return {
        "a": a.to(dtype if real_a else dt),
        "b": torch.randn((B, L, *S, *pair), generator=g, dtype=torch.complex128 if cplx else torch.float64).to(dt),
        "h0": torch.randn((B, *S, *pair), generator=g, dtype=torch.complex128 if cplx else torch.float64).to(dt) if h0 else None,
        "reset": (torch.rand(B, L, generator=g) < 0.3) if reset else None,
        "structure": structure,
    }


def run(fn: Any, case: dict[str, Any]) -> dict[str, torch.Tensor]:
    leaves = {k: case[k].clone().requires_grad_() for k in ("a", "b", "h0") if case[k] is not None}
    h_all, h_last = fn(leaves["a"], leaves["b"], leaves.get("h0"), structure=case["structure"], reset=case["reset"])
    g = torch.Generator().manual_seed(1)
    wide = torch.complex128 if h_all.is_complex() else torch.float64  # the same cotangents whatever the dtype
    ga = torch.randn(h_all.shape, generator=g, dtype=wide).to(h_all.dtype)
    gl = torch.randn(h_last.shape, generator=g, dtype=wide).to(h_last.dtype)
    loss = (h_all * ga.conj()).real.sum() + (h_last * gl.conj()).real.sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return {"h_all": h_all, "h_last": h_last, **{f"grad {k}": v for k, v in zip(leaves, grads, strict=True)}}


def assert_same(ref: dict[str, torch.Tensor], out: dict[str, torch.Tensor], tol: float) -> None:
    assert set(ref) == set(out)
    for k in ref:
        assert out[k].dtype == ref[k].dtype and out[k].shape == ref[k].shape, k
        r, o = ref[k].detach().to(torch.complex128), out[k].detach().to(torch.complex128)
        if r.norm() == 0:  # e.g. ∂h0 when every row restarts at step 0
            assert o.norm() == 0, k
            continue
        err = ((o - r).norm() / r.norm()).item()
        assert err < tol, f"{k}: relative error {err:.2e}"


# equality with the loop ------------------------------------------------------------------------
STRUCTS = [("diag", False), ("diag", True), ("block2x2", False)]


@needs_kernel
@pytest.mark.parametrize("reset", [False, True])
@pytest.mark.parametrize("tv", [False, True])
@pytest.mark.parametrize("structure,cplx", STRUCTS)
def test_equals_naive(structure: str, cplx: bool, tv: bool, reset: bool) -> None:
    case = make(structure, cplx=cplx, tv=tv, reset=reset)
    assert_same(run(scan_naive, case), run(K.scan_cpu, case), tol=1e-12)


@needs_kernel
@pytest.mark.parametrize("structure,cplx", STRUCTS)
@pytest.mark.parametrize("S,L,B", [((5,), 1, 2), ((1,), 9, 3), ((2100,), 5, 1), ((700, 3), 4, 2), ((16,), 7, 5)])
def test_odd_sizes(structure: str, cplx: bool, S: tuple[int, ...], L: int, B: int) -> None:
    """L = 1; one state; more values than one work item's block (8 KiB) with a tail; B = 1 (blocks
    shrink so both threads work); a state count that is a whole number of vectors."""
    case = make(structure, cplx=cplx, S=S, L=L, B=B, reset=L > 3)
    assert_same(run(scan_naive, case), run(K.scan_cpu, case), tol=1e-12)


@needs_kernel
@pytest.mark.parametrize("tv", [False, True])
def test_real_a_with_complex_b_and_no_h0(tv: bool) -> None:
    case = make(cplx=True, real_a=True, tv=tv, h0=False, reset=True)
    assert not case["a"].is_complex()
    out = run(K.scan_cpu, case)
    assert out["grad a"].dtype == torch.float64
    assert_same(run(scan_naive, case), out, tol=1e-12)


@needs_kernel
def test_linoss_layout_a_broadcast_over_a_state_axis() -> None:
    """LinOSS passes a (P, 2, 2) for b (B, L, 2, P, 2): a broadcast along the leading state axis too."""
    g = torch.Generator().manual_seed(0)
    case = make("block2x2", S=(2, 6), L=11)
    case["a"] = torch.randn(6, 2, 2, generator=g, dtype=torch.float64) * 0.5
    assert_same(run(scan_naive, case), run(K.scan_cpu, case), tol=1e-12)


@needs_kernel
@pytest.mark.parametrize("structure,cplx", STRUCTS)
def test_float32_agrees_with_float64_and_keeps_dtypes(structure: str, cplx: bool) -> None:
    case64 = make(structure, cplx=cplx, tv=True, reset=True, L=40)
    case32 = {k: (v.to(torch.complex64 if v.is_complex() else torch.float32) if isinstance(v, torch.Tensor) and v.is_floating_point()
                  or isinstance(v, torch.Tensor) and v.is_complex() else v) for k, v in case64.items()}
    out = run(K.scan_cpu, case32)
    assert all(v.dtype in (torch.float32, torch.complex64) for v in out.values())
    assert_same({k: v.to(out[k].dtype) for k, v in run(scan_naive, case64).items()}, out, tol=2e-6)


@needs_kernel
def test_bfloat16_is_computed_in_float32_and_returned_in_bfloat16() -> None:
    case = make(L=20)
    case16 = {k: (v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in case.items()}
    h_all, h_last = K.scan_cpu(case16["a"], case16["b"], case16["h0"])
    assert h_all.dtype == h_last.dtype == torch.bfloat16
    ref, _ = scan_naive(*(case16[k].float() for k in ("a", "b", "h0")))
    torch.testing.assert_close(h_all.float(), ref, rtol=1e-2, atol=1e-2)


@needs_kernel
@pytest.mark.parametrize("structure,cplx", STRUCTS)
def test_gradcheck(structure: str, cplx: bool) -> None:
    case = make(structure, cplx=cplx, S=(3,), L=5, reset=True)
    case["reset"][:, 0] = False

    def fn(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return K.scan_cpu(a, b, h0, structure=structure, reset=case["reset"])

    args = tuple(case[k].clone().requires_grad_() for k in ("a", "b", "h0"))
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-7)


@needs_kernel
def test_tiny_states_flush_to_zero_without_changing_results() -> None:
    """States that decay into subnormal floats: the kernel flushes them (fast) and still equals the
    loop to float32 rounding."""
    a = torch.full((4, 33), 1e-10)
    b = torch.zeros(2, 300, 4, 33)
    b[:, 0] = 1.0
    h_all, h_last = K.scan_cpu(a, b)
    ref_all, _ = scan_naive(a, b)
    torch.testing.assert_close(h_all, ref_all, rtol=1e-6, atol=1e-37)
    assert (h_last == 0).all() and (h_all[:, 4:] == 0).all()  # 1e-40 and below: flushed to exact zeros


@needs_kernel
def test_complex_blocks_run_the_loop_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    case = make("block2x2", cplx=True, L=6)
    reset_log_once()
    with caplog.at_level(logging.WARNING, logger="zoo_core.kernels.scan_cpu"):
        assert_same(run(scan_naive, case), run(K.scan_cpu, case), tol=1e-14)
    assert any("complex 2x2" in r.getMessage() for r in caplog.records)


# custom ops: opcheck and torch.compile ---------------------------------------------------------
@needs_kernel
@pytest.mark.parametrize("tv,with_q,reset", [(False, False, False), (True, True, True), (False, True, True)])
def test_opcheck(tv: bool, with_q: bool, reset: bool) -> None:
    g = torch.Generator().manual_seed(0)
    B, L, S = 2, 7, 10
    shape = (B, L, S) if tv else (S,)
    P = (torch.rand(shape, generator=g, dtype=torch.float64) * 0.9).requires_grad_()
    Q = (torch.rand(shape, generator=g, dtype=torch.float64) * 0.1).requires_grad_() if with_q else None
    b = torch.randn(B, L, S, generator=g, dtype=torch.float64).requires_grad_()
    h0 = torch.randn(B, S, generator=g, dtype=torch.float64).requires_grad_()
    r = (torch.rand(B, L, generator=g) < 0.3) if reset else None
    torch.library.opcheck(torch.ops.zoo.linear_scan_fwd.default, (P, Q, b, h0, r))
    h_all, _ = torch.ops.zoo.linear_scan_fwd(P.detach(), None if Q is None else Q.detach(), b.detach(), h0.detach(), r)
    bwd_args = (P.detach(), None if Q is None else Q.detach(), torch.randn_like(h_all), torch.randn(B, S, dtype=torch.float64),
                h_all, h0.detach(), r)
    torch.library.opcheck(torch.ops.zoo.linear_scan_bwd.default, bwd_args, test_utils=("test_schema", "test_faketensor"))
    # non-contiguous inputs: the fake must promise the contiguous results the real op returns
    t = lambda x: x.transpose(-1, -2).contiguous().transpose(-1, -2)  # noqa: E731  same values, other strides
    odd = (t(P.detach()) if tv else P.detach(), None if Q is None else (t(Q.detach()) if tv else Q.detach()),
           t(torch.randn_like(h_all)), torch.randn(B, S, dtype=torch.float64), h_all, h0.detach(), r)
    torch.library.opcheck(torch.ops.zoo.linear_scan_bwd.default, odd, test_utils=("test_schema", "test_faketensor"))


@needs_kernel
@pytest.mark.parametrize("structure,cplx", STRUCTS)
def test_compiles_fullgraph_and_matches_eager(structure: str, cplx: bool) -> None:
    """No graph break around the custom ops (aot_eager traces forward and backward through the fakes)."""
    case = make(structure, cplx=cplx, L=9, reset=True, dtype=torch.float32)
    leaves = [case[k].clone().requires_grad_() for k in ("a", "b", "h0")]

    def f(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        h_all, h_last = K.scan_cpu(torch.tanh(a.real) if not a.is_complex() else a * 0.9, b, h0, structure=structure,
                                   reset=case["reset"])
        return (h_all.abs() ** 2).sum() + h_last.abs().sum()

    eager = f(*leaves)
    g_eager = torch.autograd.grad(eager, leaves)
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(*leaves)
    g_out = torch.autograd.grad(out, leaves)
    torch.testing.assert_close(out, eager)
    for x, y in zip(g_out, g_eager, strict=True):
        torch.testing.assert_close(x, y)


# backend choice ---------------------------------------------------------------------------------
@needs_kernel
def test_auto_picks_it_on_cpu_for_the_diagonal_and_block_cores() -> None:
    from zoo_linoss.core import LinOSS
    from zoo_lru.core import LRU
    from zoo_s5.core import S5

    assert LRU(d_model=2, d_state=4).backend_choice.label() == "recurrent: scan=cpu-scan"
    assert S5(d_model=2, d_state=4, blocks=1).backend_choice.label() == "recurrent: scan=cpu-scan"
    assert LinOSS(d_model=2, d_state=4).backend_choice.entries["scan"].name == "cpu-scan"
    assert LRU(d_model=2, d_state=4, backend="cpu").backend_choice.entries["scan"].name == "cpu-scan"  # the spec name
    entry = get_registry().backend("scan", "cpu-scan")
    assert "CPU tensors only" in (entry.supports(Problem(structure="diag", device="cuda")) or "")
    assert "real 2x2 blocks" in (entry.supports(Problem(structure="block2x2", complex=True)) or "")
    assert "dplr" in (entry.supports(Problem(structure="dplr")) or "")
    # off the CPU it never shadows the others
    assert get_registry().backends_for("scan", "cuda")[-1].name == "cpu-scan"


def test_unavailable_kernel_falls_back_to_the_loop_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    from zoo_lru.core import LRU

    monkeypatch.setattr(cpp, "unavailable_reason", lambda name: "no C++ compiler: 'c++' is not on PATH (test)")
    reset_log_once()
    with caplog.at_level(logging.WARNING, logger="zoo_core.backends"):
        assert LRU(d_model=2, d_state=4).backend_choice.label() == "recurrent: scan=naive"
        LRU(d_model=2, d_state=4)
    said = [r for r in caplog.records if "'cpu-scan' is unavailable" in r.getMessage()]
    # once per process, at WARNING, naming the slower backend taken and the fix's cue
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "not on PATH" in said[0].getMessage() and "slower 'naive'" in said[0].getMessage()
    entry = get_registry().backend("scan", "cpu-scan")
    assert entry.check(Problem(structure="diag")) == ("no C++ compiler: 'c++' is not on PATH (test)", True)
    # a problem it does not serve is a plain "no", never an announced fallback
    assert entry.check(Problem(structure="diag", device="cuda"))[1] is False


@pytest.mark.skipif(cpp._tool_reason() is not None, reason="no C++ compiler here")
@pytest.mark.parametrize("name", ["linear_scan", "selective_scan", "stream_block"])
def test_every_kernel_source_is_cpp17(name: str) -> None:
    """torch before 2.12 builds extensions as C++17 (pyproject accepts torch >= 2.2): a C++20-only construct
    (a requires-expression, say) would leave those users on the slow paths. Syntax only, this machine's flags."""
    import shutil
    import subprocess
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    cxx = shutil.which("c++") or shutil.which("g++")
    assert cxx is not None
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-w", f"-DTORCH_EXTENSION_NAME={name}", *cpp.cflags(),
           *(f"-I{p}" for p in include_paths()), f"-I{sysconfig.get_paths()['include']}", str(cpp.source(name))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

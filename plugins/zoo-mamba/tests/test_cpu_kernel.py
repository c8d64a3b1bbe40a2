"""The fused C++ CPU selective scan (selective-cpu) against the naive loop: outputs, final or
end states and every gradient, float64 and float32, input-dependent and time-invariant B/C, with
and without D and h0, packed documents, lengths off the chunk grid and channel counts off the SIMD
width; auto's choice and its announced fallback; the custom ops under torch.compile(fullgraph=True)
and torch.library.opcheck; and the loader's reasons (no ninja, a failed build)."""

from __future__ import annotations

import logging

import pytest
import torch

from zoo_core.kernels import cpp
from zoo_core.logs import reset_log_once
from zoo_core.plugin_registry import Problem
from zoo_core.plugins import get_registry
from zoo_mamba import cpu_kernel as K
from zoo_mamba import scan as S
from zoo_mamba.core import Mamba

F64 = torch.float64

REASON = K.unavailable_reason()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"the C++ kernel is unavailable here: {REASON}")


def make(Bt=2, L=37, Di=21, N=5, *, static_B=False, static_C=False, D=True, h0=True, dtype=F64, seed=0):
    """Di = 21: not a multiple of any SIMD width (float32 16/8 lanes, float64 8/4), so tails are exercised."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    args = {
        "u": r(Bt, L, Di),
        "delta": torch.nn.functional.softplus(r(Bt, L, Di) - 1),
        "A": -torch.exp(r(Di, N) * 0.5),
        "B": r(Di, N) if static_B else r(Bt, L, N),
        "C": r(Di, N) if static_C else r(Bt, L, N),
        "D": r(Di) if D else None,
        "h0": r(Bt, Di, N) if h0 else None,
    }
    return {k: (v.to(dtype).requires_grad_() if v is not None else None) for k, v in args.items()}


def run(fn, args, seed=1, **packed):
    y, h = fn(**args, **packed)
    g = torch.Generator().manual_seed(seed)
    gy = torch.randn(y.shape, generator=g, dtype=F64).to(y.dtype)
    gh = torch.randn(h.shape, generator=g, dtype=F64).to(h.dtype)
    names = [k for k, v in args.items() if v is not None]
    grads = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), [args[k] for k in names])
    return {"y": y, "h_last": h, **{f"grad {k}": v for k, v in zip(names, grads, strict=True)}}


def assert_same(ref, out, tol):
    assert set(ref) == set(out)
    for k in ref:
        assert out[k].dtype == ref[k].dtype or tol > 1e-8, k
        err = ((out[k].double() - ref[k].double()).norm() / ref[k].double().norm().clamp_min(1e-30)).item()
        assert err < tol, f"{k}: relative error {err:.2e}"


def cpu(chunk=None):
    return lambda **a: K.selective_scan_cpu(**a, chunk=chunk)


def layout(Bt, L, seed=3):
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(Bt, L, generator=g) < 0.2
    starts[0, 0] = True
    starts[:, min(5, L - 1)] = True  # at a chunk boundary of chunk=5
    ends = torch.rand(Bt, L, generator=g) < 0.2
    ends[:, L - 1] = True
    ends[-1, min(4, L - 1)] = True  # the state right before a chunk boundary
    return starts, ends


# equality with the naive loop -------------------------------------------------------------------
@needs_kernel
@pytest.mark.parametrize("chunk", [None, 1, 5, 16])
@pytest.mark.parametrize("L", [1, 17, 37, 80])
def test_equals_naive_time_varying(L, chunk):
    args = make(L=L)
    assert_same(run(S.selective_scan_naive, args), run(cpu(chunk), args), tol=1e-10)


@needs_kernel
@pytest.mark.parametrize("chunk", [None, 5])
@pytest.mark.parametrize("static_B,static_C,D,h0", [(True, True, False, False), (True, False, True, True),
                                                    (False, True, False, True), (False, False, False, False)])
def test_equals_naive_mambasl_switches(static_B, static_C, D, h0, chunk):
    args = make(L=23, static_B=static_B, static_C=static_C, D=D, h0=h0)
    assert_same(run(S.selective_scan_naive, args), run(cpu(chunk), args), tol=1e-10)


@needs_kernel
@pytest.mark.parametrize("Di", [1, 5, 16, 33])
def test_channel_counts_off_the_simd_width(Di):
    args = make(L=19, Di=Di, N=3, static_B=Di == 33)
    assert_same(run(S.selective_scan_naive, args), run(cpu(7), args), tol=1e-10)


@needs_kernel
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("h0", [False, True])
@pytest.mark.parametrize("L", [6, 37])
def test_packed_documents_equal_naive(L, h0, static):
    args = make(Bt=3, L=L, static_B=static, static_C=static, h0=h0)
    starts, ends = layout(3, L)
    for packed in ({"starts": starts}, {"ends": ends}, {"starts": starts, "ends": ends}):
        ref = run(S.selective_scan_naive, args, **packed)
        assert_same(ref, run(cpu(5), args, **packed), tol=1e-10)
        assert_same(ref, run(cpu(None), args, **packed), tol=1e-10)


@needs_kernel
@pytest.mark.parametrize("static", [False, True])
def test_float32_agrees_with_float64_and_keeps_dtypes(static):
    args64 = make(L=50, static_B=static, static_C=static)
    args32 = {k: (v.detach().float().requires_grad_() if v is not None else None) for k, v in args64.items()}
    starts, ends = layout(2, 50)
    ref = run(S.selective_scan_naive, args64, starts=starts, ends=ends)
    out = run(cpu(), args32, starts=starts, ends=ends)
    assert all(v.dtype == torch.float32 for v in out.values())
    assert_same(ref, out, tol=2e-5)


@needs_kernel
def test_mixed_dtypes_compute_in_float64_and_return_u_dtype():
    args = make(L=9)
    args["u"] = args["u"].detach().float().requires_grad_()
    out, ref = run(cpu(), args), run(S.selective_scan_naive, args)
    assert out["y"].dtype == torch.float32 and out["h_last"].dtype == F64 and out["grad u"].dtype == torch.float32
    assert_same(ref, out, tol=1e-6)


@needs_kernel
def test_gradcheck():
    args = make(Bt=2, L=9, Di=3, N=2)
    keys = list(args)
    fn = lambda *a: K.selective_scan_cpu(**dict(zip(keys, a, strict=True)), chunk=4)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(args.values()), eps=1e-6, atol=1e-7)


@needs_kernel
def test_tiny_states_flush_to_zero_without_changing_results():
    """States that decay into subnormal floats: the kernel flushes them (fast) and the result still
    equals the reference to float32 rounding."""
    args = {k: (v.detach().float() if v is not None else None) for k, v in make(L=300, h0=True).items()}
    args["A"] = args["A"] * 40  # exp(ΔA) ≈ e^-20 per step: the state underflows within a few steps
    args["u"][:, 3:] = 0.0
    y, h = K.selective_scan_cpu(**args)
    y_ref, h_ref = S.selective_scan_naive(**args)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-30)
    assert (h == 0).all()  # flushed to exact zeros (the reference keeps subnormals or zeros: no difference above 1e-38)


# backend choice -------------------------------------------------------------------------------
@needs_kernel
def test_auto_on_cpu_picks_the_cpp_kernel():
    assert Mamba(4).backend_choice.label() == "selective: scan=selective-cpu"
    assert Mamba(4, backend="cpu").backend_choice.label() == "selective: scan=selective-cpu"
    entry = get_registry().backend("scan", "selective-cpu")
    assert "CPU tensors only" in entry.supports(Problem(structure="selective", lti=False, device="cuda"))
    assert "not a 'diag'" in entry.supports(Problem(structure="diag", lti=True))
    assert "int8" in entry.supports(Problem(structure="selective", lti=False, dtype="int8"))


def test_unavailable_kernel_falls_back_to_chunked_and_says_why(monkeypatch, caplog):
    monkeypatch.setattr(cpp, "unavailable_reason", lambda name: "no C++ compiler: 'c++' is not on PATH (test)")
    reset_log_once()
    with caplog.at_level(logging.WARNING, logger="zoo_core.backends"):
        assert Mamba(4).backend_choice.label() == "selective: scan=selective-chunked"
        Mamba(4)
    said = [r.getMessage() for r in caplog.records if "'selective-cpu' is unavailable" in r.getMessage()]
    assert len(said) == 1 and "not on PATH" in said[0] and "slower 'selective-chunked'" in said[0]
    # the GPU-only backends ranked above it are not fallbacks on a CPU: no warning names them
    assert not [r for r in caplog.records if "selective-cuda" in r.getMessage() or "selective-triton" in r.getMessage()]
    entry = get_registry().backend("scan", "selective-cpu")
    assert "not on PATH" in entry.supports(Problem(structure="selective", lti=False))
    # asked for by its spec name 'cpu' (zoo-core's cpu-scan shares it): the refusal gives the true reason
    with pytest.raises(Exception, match="not on PATH"):
        Mamba(4, backend="cpu")


def test_loader_reasons_never_raise(monkeypatch, tmp_path):
    """No ninja: the reason names the fix. A source that does not compile: the compiler's error lines."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    assert "pip install ninja" in (cpp._tool_reason() or "")
    monkeypatch.undo()
    monkeypatch.setenv("CXX", "no-such-compiler-zoo")
    assert "no C++ compiler" in (cpp._tool_reason() or "")
    monkeypatch.undo()
    if cpp._tool_reason() is not None:
        pytest.skip(f"no build tools here: {cpp._tool_reason()}")
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "broken_zoo_kernel.cpp").write_text("this is not C++;\n")
    monkeypatch.setattr(cpp, "CSRC", tmp_path / "csrc")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    # a lock file left by a killed build: torch's loader alone would wait for it forever
    stale = cpp.cache_root() / cpp.build_name("broken_zoo_kernel") / "lock"
    stale.parent.mkdir(parents=True)
    stale.touch()
    reason = cpp.unavailable_reason("broken_zoo_kernel")
    assert reason is not None and "failed" in reason and "error" in reason.lower(), reason
    assert cpp.unavailable_reason("broken_zoo_kernel") == reason  # once per process
    with pytest.raises(cpp.KernelUnavailableError):
        cpp.load("broken_zoo_kernel")
    assert "missing" in (cpp.unavailable_reason("no_such_zoo_kernel") or "")


def test_cache_key_holds_the_capability_and_source():
    name = cpp.build_name("selective_scan")
    assert name.startswith(f"zoo_selective_scan_{cpp.capability().lower()}_")
    assert "-O3" in cpp.cflags() and "-DCPU_CAPABILITY_AVX2" in cpp.cflags("AVX2")
    assert not any(f.startswith("-march") for f in cpp.cflags("AVX512"))


# custom ops: torch.compile and opcheck ---------------------------------------------------------
@needs_kernel
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiles_fullgraph_and_matches_eager(backend):
    """No graph break around the custom ops; aot_eager traces forward and backward through the fake
    implementations in seconds, inductor (C++ codegen: ~1 min on a first, uncached run) fuses the rest."""
    args = {k: (v.detach().float().requires_grad_() if v is not None else None) for k, v in make(L=13, Di=9, N=4).items()}

    def f(u, delta, A, B, C, D, h0):
        y, h = K.selective_scan_cpu(torch.sin(u), delta, A, B, C, D, h0, chunk=4)
        return (y * y).sum() + h.sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=False, backend=backend)
    vals = list(args.values())
    eager = f(*vals)
    g_eager = torch.autograd.grad(eager, vals)
    out = compiled(*vals)
    g_out = torch.autograd.grad(out, vals)
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_out, g_eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_compiles_fullgraph_with_packed_documents():
    """``ends``: the number of returned states is data-dependent (the fake implementation asks for a
    dynamic size); it still traces without a graph break, forward and backward."""
    args = {k: (v.detach().float().requires_grad_() if v is not None else None) for k, v in make(L=13, Di=9, N=4).items()}
    starts, ends = layout(2, 13)

    def f(u, delta, A, B, C, D, h0, starts, ends):
        y, h = K.selective_scan_cpu(u, delta, A, B, C, D, h0, starts=starts, ends=ends, chunk=4)
        return (y * y).sum() + (h * h).sum()

    vals = list(args.values())
    eager = f(*vals, starts, ends)
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(*vals, starts, ends)
    torch.testing.assert_close(out, eager)
    for a, b in zip(torch.autograd.grad(out, vals), torch.autograd.grad(eager, vals), strict=True):
        torch.testing.assert_close(a, b)


@needs_kernel
@pytest.mark.parametrize("static,packed", [(False, False), (True, False), (False, True)])
def test_opcheck(static, packed):
    args = make(Bt=2, L=11, Di=6, N=3, static_B=static, static_C=static)
    starts, ends = layout(2, 11) if packed else (None, None)
    inputs = (args["u"], args["delta"], args["A"], args["B"], args["C"], args["D"], args["h0"], starts, ends, 4)
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if packed:  # the number of end states is data-dependent: fake tensors need a dynamic size, which opcheck allows
        tests = ("test_schema", "test_autograd_registration")
    torch.library.opcheck(torch.ops.zoo.selective_scan_fwd.default, inputs, test_utils=tests)
    if not packed:  # the backward op too: its schema and fake shapes (it has no autograd of its own)
        plain = [t.detach() if isinstance(t, torch.Tensor) else t for t in inputs]
        y, h, entering = torch.ops.zoo.selective_scan_fwd(*plain)
        bwd_inputs = (torch.randn_like(y), torch.randn_like(h), *plain[:9], entering, 4)
        torch.library.opcheck(torch.ops.zoo.selective_scan_bwd.default, bwd_inputs, test_utils=("test_schema", "test_faketensor"))
        # Mamba's u is a transposed view (the short convolution's output): the fakes must still promise the
        # contiguous results the real ops return, or inductor's stride check fails compiled training
        t = lambda x: x.transpose(-1, -2).contiguous().transpose(-1, -2)  # noqa: E731  same values, other strides
        odd = (torch.randn_like(y), torch.randn_like(h), t(plain[0]), t(plain[1]), plain[2], t(plain[3]), t(plain[4]),
               *plain[5:9], entering, 4)
        torch.library.opcheck(torch.ops.zoo.selective_scan_bwd.default, odd, test_utils=("test_schema", "test_faketensor"))

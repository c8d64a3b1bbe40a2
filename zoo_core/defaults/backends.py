"""Default kernel backends: naive references first, then the fast pure-PyTorch ones."""

from __future__ import annotations

from collections.abc import Callable

from ..hookspecs import RegisterBackend, hookimpl
from ..plugin_registry import Problem

Supports = Callable[[Problem], str | None]

zoo_api = 1


def _structures(*allowed: str) -> Supports:
    def supports(p: Problem) -> str | None:
        if p.structure not in allowed:
            return f"it handles {'/'.join(allowed)} systems, not {p.structure!r}"
        return None

    return supports


def _lti_diag(p: Problem) -> str | None:
    if not p.lti or p.structure != "diag":
        return "it needs a time-invariant diagonal system (the same a at every step)"
    return None


def _lti_only(p: Problem) -> str | None:
    if not p.lti:
        return "a convolution needs a time-invariant (LTI) system; this core is input-dependent"
    return None


def _kernel(*allowed: str) -> Supports:
    structures = _structures(*allowed)
    return lambda p: _lti_only(p) or structures(p)


def _triton_diag(p: Problem) -> str | None:
    """Diagonal systems on CUDA tensors.

    The device is checked first: Mamba's Triton kernel shares the spec name ``triton``, and on a CPU the
    reason a user reads (from whichever of the two comes first) is then the true one for either core."""
    reason = None if p.device == "cuda" else f"the Triton kernels run on CUDA tensors only, not {p.device!r}"
    return reason or _structures("diag")(p)


def _triton_diag_probe(p: Problem) -> str | None:
    """The kernel has passed a run-time check on this GPU (cached per process)."""
    try:
        from ..kernels.triton_diag import triton_runtime_reason  # lazy: keeps torch and triton out of backends
    except Exception as exc:  # an installed but broken triton raises anything
        return f"triton does not import ({type(exc).__name__}: {exc}); pip install 'zoo-core[triton]'"
    return triton_runtime_reason()


def _cpu_scan(p: Problem) -> str | None:
    """Diagonal (real or complex) and real 2×2-block systems on CPU tensors."""
    reason = None if p.device == "cpu" else f"the fused C++ scan runs on CPU tensors only, not {p.device!r}"
    reason = reason or _structures("diag", "block2x2")(p)
    if reason is None and p.structure == "block2x2" and p.complex:
        reason = "the fused C++ scan computes real 2x2 blocks only (no core uses complex ones)"
    return reason


def _cpu_scan_probe(p: Problem) -> str | None:
    """The C++ kernel is built and loaded (compiled on first use, cached; else why not: no compiler, no ninja)."""
    from ..kernels.scan_cpu import unavailable_reason  # lazy: imports torch and builds the kernel once

    return unavailable_reason()


def _keops_probe(p: Problem) -> str | None:
    """pykeops has passed a run-time check (cached per process).

    ``requires`` has already found the package; the check imports it and runs a tiny kernel
    against kernel_cauchy, since a pykeops that imports may still fail to compile.
    """
    from ..kernels.keops import runtime_reason  # imports torch: only when asked  # lazy: keeps torch out of backends

    return runtime_reason()


@hookimpl
def zoo_register_backends(register: RegisterBackend) -> None:
    register("naive", "kernel", "zoo_core.kernels.kernel:kernel_naive", priority=0,
             supports=_kernel("diag", "dense", "dplr"),
             description="reference: powers of the discrete state matrix, one step at a time (O(N·L), O(N²·L) dense)")
    register("vandermonde", "kernel", "zoo_core.kernels.kernel:kernel_vandermonde", priority=10,
             supports=_kernel("diag"),
             description="diagonal systems: blocked Vandermonde product, exp only on O(N·(T + L/T)) entries, memory O(H·(N·√L + L))")
    register("cauchy", "kernel", "zoo_core.kernels.dplr:kernel_cauchy", priority=10,
             supports=_kernel("dplr"),
             description="DPLR (S4) systems: generating function at the roots of unity, four chunked Cauchy sums and a "
                         "division-free rank-1 Woodbury, then irfft; memory O(H·(N + L)) plus one chunk")
    register("keops", "kernel", "zoo_core.kernels.keops:kernel_cauchy_keops", priority=5,
             supports=_kernel("dplr"), requires=("pykeops",), probe=_keops_probe,
             description="DPLR (S4) systems: kernel_cauchy with the four Cauchy sums fused in one pykeops reduction "
                         "(JIT-compiled on first use); optional: pip install pykeops")
    register("naive", "conv", "zoo_core.kernels.conv:conv_naive", priority=0, supports=_lti_only,
             description="reference: direct causal convolution, O(L²)")
    register("fft", "conv", "zoo_core.kernels.conv:conv_fft", priority=10, supports=_lti_only,
             description="causal convolution by real FFT zero-padded to 2L, O(L log L)")
    register("naive", "scan", "zoo_core.kernels.scan:scan_naive", priority=0,
             supports=_structures("diag", "block2x2"),
             description="reference: sequential loop h_t = a_t ⊗ h_{t−1} + b_t")
    # On CPU the sequential loop beats both parallel scans at every measured size
    # (benchmarks/REPORT_SCAN.md), so there auto keeps the loop; elsewhere the parallel ones lead.
    register("chunked", "scan", "zoo_core.kernels.scan_lti:scan_chunked", priority=5, device_priority={"cpu": -5},
             supports=_lti_diag,
             description="time-invariant diagonal systems: per-chunk Toeplitz matmuls of powers of a, carries by recursion")
    register("scan", "scan", "zoo_core.kernels.scan:scan_parallel", priority=10, device_priority={"cpu": -1},
             supports=_structures("diag", "block2x2"),
             description="parallel: chunked log-depth (Hillis–Steele within chunks, recursive over chunk carries)")
    # On CPU the fused C++ kernel beats the loop (benchmarks/REPORT_SCAN.md); off the CPU it refuses, and its
    # base priority below naive's keeps it out of auto's passed-over notes there.
    register("cpu-scan", "scan", "zoo_core.kernels.scan_cpu:scan_cpu", priority=-10, device_priority={"cpu": 15},
             supports=_cpu_scan, probe=_cpu_scan_probe, aliases=("cpu",),
             description="diagonal (real or complex) and 2x2-block systems by the zoo's fused C++ kernel (CPU tensors; one "
                         "streaming pass per step, adjoint backward); compiled on first use (g++, pip install ninja); "
                         "spec name 'cpu'")
    register("triton-diag", "scan", "zoo_core.kernels.triton_diag:scan_triton", priority=20, supports=_triton_diag,
             requires=("triton",), probe=_triton_diag_probe, aliases=("triton",),
             description="diagonal systems, real or complex, by a Triton kernel (CUDA tensors, after a run-time check); "
                         "optional: pip install 'zoo-core[triton]'; spec name 'triton'")

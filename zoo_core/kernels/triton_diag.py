"""The diagonal linear recurrence ``h_t = a_t ⊙ h_{t−1} + b_t`` (real or complex) as a Triton kernel.

Same arguments and results as ``zoo_core.kernels.scan.scan_naive`` for ``structure="diag"`` (the
reference it is tested against): a broadcastable to (B, L, *S) (a time-invariant a stays
unexpanded in memory: its batch and time strides are 0), b (B, L, *S), h0 (B, *S), ``reset`` (B, L).

Why a kernel: every PyTorch path of this op either loops over t in Python (one dispatch per step) or
does log-depth work with full-size temporaries; the kernel reads a and b once and writes every state
once. One program per (batch row, block of BLOCK_S flattened states) walks time sequentially with the
block in registers; the lanes of a block are independent recurrences, so the loads along S coalesce.
Complex numbers travel as (re, im) pairs of the real view (``torch.view_as_real``).

Backward: the adjoint is the same recurrence run in reverse, λ_t = ∂/∂h_t + conj(a_{t+1}) λ_{t+1},
by the same kernel (``REVERSE``); then ∂/∂b = λ, ∂/∂a = λ ⊙ conj(h_{t−1}) (formed in PyTorch from the
saved states, which this op returns anyway), ∂/∂h0 = the carry left after step 0. A ``reset`` step
multiplies a by an exact 0 there, as the reference does.

Wrapped as ``torch.library`` custom ops (``zoo_core::diag_scan_triton`` and its backward) with fake
implementations and a registered autograd formula. CPU testing: ``TRITON_INTERPRET=1`` set before
this module is first imported runs the kernel on CPU tensors (``tests/kernels/test_triton_diag.py``).
"""

import functools
import math
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from .probe import gpu_self_test
from .scan import _prepare, check_reset, scan_naive


@triton.jit
def _diag_kernel(  # pointers and sizes unannotated: Triton's compiler resolves annotations (pyproject.toml, mypy)
    a_ptr, b_ptr, h0_ptr, keep_ptr, out_ptr, last_ptr,
    L, S, sa_b, sa_l, sa_s, sb_b, sb_l, sb_s,
    REVERSE: tl.constexpr, IS_COMPLEX: tl.constexpr, W: tl.constexpr, HAS_KEEP: tl.constexpr, BLOCK_S: tl.constexpr,
):
    # W: real values per element in h0, out and last (contiguous): 2 for complex, else 1
    pb = tl.program_id(0)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    m = s < S
    a_base = a_ptr + pb.to(tl.int64) * sa_b + s * sa_s
    b_base = b_ptr + pb.to(tl.int64) * sb_b + s * sb_s
    h_off = pb.to(tl.int64) * S * W + s * W  # (B, S[, 2]) contiguous
    hr = tl.load(h0_ptr + h_off, mask=m, other=0.0)
    if IS_COMPLEX:
        hi = tl.load(h0_ptr + h_off + 1, mask=m, other=0.0)
    for i in range(L):
        if REVERSE:
            t = L - 1 - i
        else:
            t = i
        ar = tl.load(a_base + t * sa_l, mask=m, other=0.0)
        br = tl.load(b_base + t * sb_l, mask=m, other=0.0)
        if IS_COMPLEX:
            ai = tl.load(a_base + t * sa_l + 1, mask=m, other=0.0)
            bi = tl.load(b_base + t * sb_l + 1, mask=m, other=0.0)
        if HAS_KEEP:
            k = tl.load(keep_ptr + pb.to(tl.int64) * L + t)  # exactly 0 where a document starts
            ar = ar * k
            if IS_COMPLEX:
                ai = ai * k
        o_off = (pb.to(tl.int64) * L + t) * S * W + s * W
        if REVERSE:  # λ_t = g_t + carry; carry = conj(a_t) λ_t for step t − 1
            hr = hr + br
            tl.store(out_ptr + o_off, hr, mask=m)
            if IS_COMPLEX:
                hi = hi + bi
                tl.store(out_ptr + o_off + 1, hi, mask=m)
                hr, hi = ar * hr + ai * hi, ar * hi - ai * hr
            else:
                hr = ar * hr
        else:  # h_t = a_t h_{t−1} + b_t
            if IS_COMPLEX:
                hr, hi = ar * hr - ai * hi + br, ar * hi + ai * hr + bi
                tl.store(out_ptr + o_off + 1, hi, mask=m)
            else:
                hr = ar * hr + br
            tl.store(out_ptr + o_off, hr, mask=m)
    tl.store(last_ptr + h_off, hr, mask=m)
    if IS_COMPLEX:
        tl.store(last_ptr + h_off + 1, hi, mask=m)


def _flat(x: Tensor) -> Tensor:
    """(B, L, *S) -> (B, L, S) with unit stride along S (a view when it can be), as a real view."""
    x = x.flatten(2)
    if x.stride(2) != 1:
        x = x.contiguous()
    return torch.view_as_real(x) if x.is_complex() else x


def _launch(a: Tensor, b: Tensor, h0: Tensor | None, keep: Tensor | None, reverse: bool, block_s: int) -> tuple[Tensor, Tensor]:
    """Run the kernel over a, b (B, L, *S) of one dtype; returns every state (B, L, *S) and the last one."""
    B, L = b.shape[:2]
    S = math.prod(b.shape[2:])
    out = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    last = torch.empty((B, *b.shape[2:]), dtype=b.dtype, device=b.device)
    h_init = torch.zeros_like(last) if h0 is None else h0.contiguous()
    ar, br = _flat(a), _flat(b)
    real = (lambda x: torch.view_as_real(x)) if b.is_complex() else (lambda x: x)
    grid = (B, triton.cdiv(S, block_s))
    _diag_kernel[grid](
        ar, br, real(h_init), ar if keep is None else keep, real(out), real(last),
        L, S, ar.stride(0), ar.stride(1), ar.stride(2), br.stride(0), br.stride(1), br.stride(2),
        REVERSE=reverse, IS_COMPLEX=b.is_complex(), W=2 if b.is_complex() else 1, HAS_KEEP=keep is not None, BLOCK_S=block_s,
        num_warps=max(1, min(8, block_s // 64)),
    )
    return out, last


@torch.library.custom_op("zoo_core::diag_scan_triton", mutates_args=())
def _scan_fwd(a: Tensor, b: Tensor, h0: Tensor | None, keep: Tensor | None, block_s: int) -> tuple[Tensor, Tensor]:
    """h_all (B, L, *S), h_last (B, *S); a already broadcast to b's shape (a stride-0 view is fine)."""
    return _launch(a, b, h0, keep, False, block_s)


@_scan_fwd.register_fake
def _(a: Tensor, b: Tensor, h0: Tensor | None, keep: Tensor | None, block_s: int) -> tuple[Tensor, Tensor]:
    return torch.empty_like(b, memory_format=torch.contiguous_format), b.new_empty((b.shape[0], *b.shape[2:]))


@torch.library.custom_op("zoo_core::diag_scan_triton_bwd", mutates_args=())
def _scan_bwd(a: Tensor, g_all: Tensor, g_last: Tensor | None, keep: Tensor | None, block_s: int) -> tuple[Tensor, Tensor]:
    """λ (B, L, *S) and ∂/∂h0 (B, *S): the reverse recurrence with conj(a)."""
    return _launch(a, g_all, g_last, keep, True, block_s)


@_scan_bwd.register_fake
def _(a: Tensor, g_all: Tensor, g_last: Tensor | None, keep: Tensor | None, block_s: int) -> tuple[Tensor, Tensor]:
    return torch.empty_like(g_all, memory_format=torch.contiguous_format), g_all.new_empty((g_all.shape[0], *g_all.shape[2:]))


def _setup_context(ctx: Any, inputs: tuple[object, ...], output: tuple[Tensor, Tensor]) -> None:
    a, _b, h0, keep, block_s = inputs
    ctx.save_for_backward(a, h0, keep, output[0])
    ctx.block_s = block_s


def _backward(ctx: Any, g_all: Tensor | None, g_last: Tensor | None) -> tuple[Tensor | None, ...]:
    a, h0, keep, h_all = ctx.saved_tensors
    g = torch.zeros_like(h_all) if g_all is None else g_all.contiguous()
    lam, g_h0 = _scan_bwd(a, g, None if g_last is None else g_last.contiguous(), keep, ctx.block_s)
    first = torch.zeros_like(h_all[:, :1]) if h0 is None else h0[:, None]
    h_prev = torch.cat([first, h_all[:, :-1]], 1)  # (B, L, *S)
    g_a = lam * h_prev.conj()
    if keep is not None:
        g_a = g_a * keep.reshape(*keep.shape, *([1] * (g_a.dim() - 2)))
    return g_a, lam, (g_h0 if h0 is not None else None), None, None


_scan_fwd.register_autograd(_backward, setup_context=_setup_context)


def scan_triton(
    a: Tensor, b: Tensor, h0: Tensor | None = None, *, structure: str = "diag", reset: Tensor | None = None,
    block_s: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Diagonal scan by the Triton kernel; same arguments and results as ``scan_naive`` (diag only).

    Args:
        block_s: flattened states per program (a power of two; default: 256, or less for small S).
    """
    if structure != "diag":
        raise ValueError(f"the Triton scan computes diagonal recurrences only, not {structure!r}")
    reset = check_reset(reset, b)
    a, b, h0, _ = _prepare(a, b, h0, "diag")  # a broadcast (a view), one dtype, h0 broadcast
    S = math.prod(b.shape[2:])
    bs = min(256, max(16, triton.next_power_of_2(S))) if block_s is None else int(block_s)
    if bs < 1 or bs & (bs - 1):
        raise ValueError(f"block_s must be a power of two, got {block_s}")
    keep = None if reset is None else (~reset).to(b.real.dtype if b.is_complex() else b.dtype).contiguous()
    return _scan_fwd(a, b.contiguous(), None if h0 is None else h0.contiguous(), keep, bs)


def triton_runtime_reason() -> str | None:
    """None once the kernel has run on this GPU and matched the reference (values and gradients,
    real and complex); else why not. For the backend's ``supports``, cached per process."""
    return _triton_runtime_reason()


@functools.lru_cache(maxsize=1)
def _triton_runtime_reason() -> str | None:
    return gpu_self_test("the Triton diagonal scan", _self_test_pairs)


def _self_test_pairs() -> list[tuple[Tensor, Tensor]]:
    """(GPU result, float64 reference): outputs, last states and gradients, real and complex."""
    g = torch.Generator().manual_seed(0)
    pairs: list[tuple[Tensor, Tensor]] = []
    for dtype in (torch.float32, torch.complex64):
        a = torch.rand(2, 19, 3, 5, generator=g, dtype=dtype) * 0.9
        b = torch.randn(2, 19, 3, 5, generator=g, dtype=dtype)
        h0 = torch.randn(2, 3, 5, generator=g, dtype=dtype)
        ref = [x.to(torch.complex128 if dtype.is_complex else torch.float64).requires_grad_() for x in (a, b, h0)]
        gpu = [x.cuda().requires_grad_() for x in (a, b, h0)]
        r_all, r_last = scan_naive(*ref)
        o_all, o_last = scan_triton(*gpu)
        gr = torch.autograd.grad(r_all.abs().sum() + r_last.abs().sum(), ref)
        go = torch.autograd.grad(o_all.abs().sum() + o_last.abs().sum(), gpu)
        pairs += [(o_all, r_all), (o_last, r_last), *zip(go, gr, strict=True)]
    return pairs

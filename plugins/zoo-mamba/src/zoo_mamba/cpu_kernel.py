"""Mamba's selective scan by the zoo's fused C++ CPU kernel, as PyTorch custom ops.

The kernel (``zoo_core/kernels/csrc/selective_scan.cpp``, built on first use by
``zoo_core.kernels.cpp``) walks time once per (batch row, block of SIMD-width channels), fusing the
discretisation, the state update and the readout, so no (Bt, L, Di, N) tensor is written; the
backward recomputes each chunk's states from the state entering it (the only thing the forward
keeps) and runs the adjoint backwards through them. Same arguments and results as
``zoo_mamba.scan.selective_scan_naive``.

Two custom ops, ``zoo::selective_scan_fwd`` and ``zoo::selective_scan_bwd``, with fake (meta)
implementations and an autograd formula, so ``torch.compile(fullgraph=True)`` and
``torch.export`` see one opaque node instead of a graph break. The ops take inputs already in the
compute dtype (float32 or float64); ``selective_scan_cpu`` casts around them, so gradients reach
inputs of other dtypes through ordinary autograd.
"""

# No ``from __future__ import annotations``: torch.library reads the op schema from real annotations.

from typing import Any, Optional

import torch
from torch import Tensor

from zoo_core.kernels import cpp

from .scan import CHUNK, _check, compute_dtype

KERNEL = "selective_scan"


def unavailable_reason() -> Optional[str]:
    """None once the C++ kernel is built and loaded in this process (building it if needed), else why not.

    The backend's probe: ``zoo_core.backends`` announces the fallback (once, with this reason) when
    ``auto`` passes over the kernel because of it.
    """
    return cpp.unavailable_reason(KERNEL)


def _ext() -> Any:
    return cpp.load(KERNEL)


def _tr(M: Tensor) -> Tensor:
    """(Di, N) -> (N, Di) contiguous: the kernel loads a block of channels per state index."""
    return M.t().contiguous()


def _bc(M: Tensor) -> Tensor:
    """B or C in the kernel's layout: (Bt, L, N) as is, time-invariant (Di, N) transposed."""
    return _tr(M) if M.dim() == 2 else M.contiguous()


def _states(S: Tensor) -> Tensor:
    """(·, Di, N) <-> (·, N, Di), contiguous."""
    return S.transpose(1, 2).contiguous()


def _opt(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


@torch.library.custom_op("zoo::selective_scan_fwd", mutates_args=(), device_types="cpu")
def selective_scan_fwd(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor], h0: Optional[Tensor],
                       starts: Optional[Tensor], ends: Optional[Tensor], chunk: int) -> tuple[Tensor, Tensor, Tensor]:
    """y (Bt, L, Di); the final states (Bt, Di, N), or with ``ends`` the states after those steps
    (number of ends, Di, N); the chunk-entry states (Bt, ceil(L / T), N, Di) the backward needs.
    All inputs in one dtype, float32 or float64."""
    y, h, entering = _ext().forward(u.contiguous(), delta.contiguous(), _tr(A), _bc(B), _bc(C), _opt(D),
                                    None if h0 is None else _states(h0), _opt(starts), _opt(ends), chunk)
    return y, _states(h), entering


@selective_scan_fwd.register_fake
def _fwd_fake(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor], h0: Optional[Tensor],
              starts: Optional[Tensor], ends: Optional[Tensor], chunk: int) -> tuple[Tensor, Tensor, Tensor]:
    bt, L, di = u.shape
    n = A.shape[1]
    ctx = torch.library.get_ctx()
    rows = bt if ends is None else ctx.new_dynamic_size()  # how many ends: data-dependent
    # ceil(L / min(chunk, L)) chunk states, only ever read by the backward op. As an expression in a
    # symbolic L, every tensor of that size asks "is it 1?" and export pins L to one side of chunk; as
    # an unbacked size (>= 1) of its own it asks nothing, and the length stays dynamic.
    nchunks = ctx.new_dynamic_size(min=1) if isinstance(L, torch.SymInt) else (L + chunk - 1) // chunk
    return u.new_empty(bt, L, di), u.new_empty(rows, di, n), u.new_empty(bt, nchunks, n, di)


@torch.library.custom_op("zoo::selective_scan_bwd", mutates_args=(), device_types="cpu")
def selective_scan_bwd(gy: Tensor, gh: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                       h0: Optional[Tensor], starts: Optional[Tensor], ends: Optional[Tensor], entering: Tensor,
                       chunk: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (du, ddelta, dA, dB, dC, dD, dh0) from the cotangents of y and of the returned states;
    dD is (Di,) zeros-shaped even without D, dh0 is ∂/∂h0 (the adjoint before step 0) either way."""
    du, dd, dAt, dB, dC, dD, dh0 = _ext().backward(gy.contiguous(), _states(gh), u.contiguous(), delta.contiguous(), _tr(A),
                                                   _bc(B), _bc(C), _opt(D), None if h0 is None else _states(h0), _opt(starts),
                                                   _opt(ends), entering.contiguous(), chunk)
    return du, dd, dAt.t().contiguous(), (dB.t().contiguous() if B.dim() == 2 else dB), \
        (dC.t().contiguous() if C.dim() == 2 else dC), dD, _states(dh0)


@selective_scan_bwd.register_fake
def _bwd_fake(gy: Tensor, gh: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
              h0: Optional[Tensor], starts: Optional[Tensor], ends: Optional[Tensor], entering: Tensor,
              chunk: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    bt, _, di = u.shape
    n = A.shape[1]
    # contiguous, as the real op returns them (empty_like would copy u's strides: Mamba's u is a transposed
    # view of the short convolution's output, and inductor checks the strides a fake promises)
    return (u.new_empty(u.shape), u.new_empty(u.shape), A.new_empty(A.shape), B.new_empty(B.shape), C.new_empty(C.shape),
            u.new_empty(di), u.new_empty(bt, di, n))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
    u, delta, A, B, C, D, h0, starts, ends, chunk = inputs
    ctx.save_for_backward(u, delta, A, B, C, D, h0, starts, ends, output[2])
    ctx.chunk = chunk
    ctx.has = (D is not None, h0 is not None)


def _backward(ctx: Any, gy: Tensor, gh: Tensor, _g_entering: Tensor) -> tuple[Optional[Tensor], ...]:
    u, delta, A, B, C, D, h0, starts, ends, entering = ctx.saved_tensors
    du, dd, dA, dB, dC, dD, dh0 = selective_scan_bwd(gy, gh, u, delta, A, B, C, D, h0, starts, ends, entering, ctx.chunk)
    has_D, has_h0 = ctx.has
    return du, dd, dA, dB, dC, dD if has_D else None, dh0 if has_h0 else None, None, None, None


selective_scan_fwd.register_autograd(_backward, setup_context=_setup_context)


def selective_scan_cpu(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor] = None, h0: Optional[Tensor] = None,
    *, chunk: Optional[int] = None, starts: Optional[Tensor] = None, ends: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The fused C++ selective scan on CPU tensors; same arguments and results as ``selective_scan_naive``
    (``chunk``: steps between the states the forward keeps for the backward, default ``CHUNK``).

    Raises:
        zoo_core.kernels.cpp.KernelUnavailableError: the kernel cannot be built here (the backend's
            ``supports`` says so beforehand, so ``auto`` never picks it then).
    """
    _check(u, delta, A, B, C, D, h0, starts, ends)
    T = CHUNK if chunk is None else int(chunk)
    if T < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    ct = compute_dtype(u, delta, A, B, C, D, h0)
    cast = lambda t: None if t is None else t.to(ct)  # noqa: E731
    y, h, _ = selective_scan_fwd(u.to(ct), delta.to(ct), A.to(ct), B.to(ct), C.to(ct), cast(D), cast(h0), starts, ends, T)
    return y.to(u.dtype), h

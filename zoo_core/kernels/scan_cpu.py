"""The diagonal (real or complex) and 2×2-block linear scans by the zoo's fused C++ CPU kernel.

Same arguments and results as ``zoo_core.kernels.scan.scan_naive`` (the reference it is tested
against). The kernel (``zoo_core/kernels/csrc/linear_scan.cpp``, built on first use by
``zoo_core.kernels.cpp``) walks time once per (batch row, block of states) with the block's state in
SIMD registers, so b is read and every state written exactly once; the backward is the adjoint scan
run in reverse over the saved states (which the op returns anyway), nothing recomputed.

One kernel serves the three structures by writing every step as
``h_t = P ⊙ h_{t−1} + Q ⊙ swap(h_{t−1}) + b_t`` over flattened real values, where ``swap`` exchanges
neighbouring pairs: a real diagonal a is P alone; a complex one, with (re, im) interleaved, is
P = (ar, ar), Q = (−ai, ai); a 2×2 block on (x, y) is P = (a00, a11), Q = (a01, a10). P and Q are
formed here from a with differentiable PyTorch ops, so autograd maps their gradients back to a. A
time-invariant a (size 1, or stride 0, along batch and time) is passed as (S,) and never expanded.

Two custom ops, ``zoo::linear_scan_fwd`` and ``zoo::linear_scan_bwd``, with fake (meta)
implementations and a registered autograd formula, so ``torch.compile(fullgraph=True)`` and
``torch.export`` see one opaque node. They take float32 or float64; float16/bfloat16 inputs are
computed in float32 and cast back.
"""

# No ``from __future__ import annotations``: torch.library reads the op schema from real annotations.

import logging
from typing import Any, Optional

import torch
from torch import Tensor

from ..logs import log_once
from . import cpp
from .scan import _prepare, check_reset, scan_naive

KERNEL = "linear_scan"
log = logging.getLogger("zoo_core.kernels.scan_cpu")

_COMPUTE = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.complex32: torch.complex64}
_KERNEL_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def unavailable_reason() -> Optional[str]:
    """None once the C++ kernel is built and loaded in this process (building it if needed), else why not.

    The backend's probe: ``zoo_core.backends`` announces the fallback (once, with this reason) when
    ``auto`` passes over the kernel because of it.
    """
    return cpp.unavailable_reason(KERNEL)


def _ext() -> Any:
    return cpp.load(KERNEL)


def _opt(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


@torch.library.custom_op("zoo::linear_scan_fwd", mutates_args=(), device_types="cpu")
def linear_scan_fwd(P: Tensor, Q: Optional[Tensor], b: Tensor, h0: Optional[Tensor],
                    reset: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Every state (Bt, L, S) and the last one (Bt, S) of h_t = P ⊙ h_{t−1} + Q ⊙ swap(h_{t−1}) + b_t.

    P, Q: (S,) time-invariant or (Bt, L, S); Q None for a real diagonal. b (Bt, L, S); h0 (Bt, S) or
    None; reset (Bt, L) bool or None. One dtype, float32 or float64."""
    h_all, h_last = _ext().forward(P.contiguous(), _opt(Q), b.contiguous(), _opt(h0), _opt(reset))
    return h_all, h_last


@linear_scan_fwd.register_fake
def _fwd_fake(P: Tensor, Q: Optional[Tensor], b: Tensor, h0: Optional[Tensor],
              reset: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    return b.new_empty(b.shape), b.new_empty(b.shape[0], b.shape[2])


@torch.library.custom_op("zoo::linear_scan_bwd", mutates_args=(), device_types="cpu")
def linear_scan_bwd(P: Tensor, Q: Optional[Tensor], g_all: Tensor, g_last: Optional[Tensor], h_all: Tensor,
                    h0: Optional[Tensor], reset: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(∂P, ∂Q, ∂b, ∂h0) from the cotangents of every state and of the last one (None: zero) and the
    forward's states. ∂P, ∂Q have P's shape (summed over batch and time when time-invariant); ∂Q is
    empty without Q; ∂h0 is the adjoint before step 0 whether or not h0 was given."""
    gP, gQ, gb, gh0 = _ext().backward(P.contiguous(), _opt(Q), g_all.contiguous(), _opt(g_last), h_all.contiguous(),
                                      _opt(h0), _opt(reset))
    return gP, gQ, gb, gh0


@linear_scan_bwd.register_fake
def _bwd_fake(P: Tensor, Q: Optional[Tensor], g_all: Tensor, g_last: Optional[Tensor], h_all: Tensor,
              h0: Optional[Tensor], reset: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # contiguous, as the real op returns them (empty_like would promise the inputs' strides)
    gQ = P.new_empty(P.shape) if Q is not None else P.new_empty(0)
    return P.new_empty(P.shape), gQ, g_all.new_empty(g_all.shape), g_all.new_empty(g_all.shape[0], g_all.shape[2])


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    P, Q, _b, h0, reset = inputs
    ctx.save_for_backward(P, Q, h0, reset, output[0])
    ctx.has = (Q is not None, h0 is not None)


def _backward(ctx: Any, g_all: Optional[Tensor], g_last: Optional[Tensor]) -> tuple[Optional[Tensor], ...]:
    P, Q, h0, reset, h_all = ctx.saved_tensors
    g = torch.zeros_like(h_all) if g_all is None else g_all
    gP, gQ, gb, gh0 = linear_scan_bwd(P, Q, g, g_last, h_all, h0, reset)
    has_q, has_h0 = ctx.has
    return gP, gQ if has_q else None, gb, gh0 if has_h0 else None, None


linear_scan_fwd.register_autograd(_backward, setup_context=_setup_context)


def _pairs(x: Tensor, y: Tensor) -> Tensor:
    """(..., ) and (..., ) -> (..., 2) interleaved."""
    return torch.stack([x, y], -1)


def scan_cpu(
    a: Tensor, b: Tensor, h0: Optional[Tensor] = None, *, structure: str = "diag", reset: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """The fused C++ scan on CPU tensors; same arguments and results as ``scan_naive``.

    Args:
        a: transitions, broadcastable to (B, L, *S) ("diag") or (B, L, *S, 2, 2) ("block2x2").
        b: inputs, (B, L, *S) or (B, L, *S, 2); real or complex.
        h0: initial state (B, *S) or (B, *S, 2); None means zero.
        structure: "diag" or "block2x2".
        reset: (B, L) bool or None: True at each document's first step, where h_{t−1} is dropped.

    Returns:
        h_all: (B, L, *S[, 2]) every state; h_last: (B, *S[, 2]) the final state.

    Raises:
        zoo_core.kernels.cpp.KernelUnavailableError: the kernel cannot be built here (the backend's
            ``supports`` says so beforehand, so ``auto`` never picks it then).
    """
    reset = check_reset(reset, b)
    a_in = a
    a, b, h0, _ = _prepare(a, b, h0, structure)  # checks; a broadcast to its full shape (a view), one dtype
    dtype = b.dtype
    ct = _COMPUTE.get(dtype, dtype)
    if ct not in _KERNEL_DTYPES:
        raise TypeError(f"the C++ scan computes in float32/float64/complex64/complex128, not {dtype}")
    if structure == "block2x2" and ct.is_complex:
        log_once(log, logging.WARNING, "complex-block2x2",
                 "the fused C++ CPU scan has no complex 2x2 blocks (no core uses them); running the sequential loop")
        return scan_naive(a, b, h0, structure=structure, reset=reset)
    # a real a with complex b scales both halves of each pair alike: P only, no coupling
    a_ct = ct.to_real() if ct.is_complex and not a_in.is_complex() else ct
    b = b.to(ct)
    h0 = None if h0 is None else h0.to(ct)
    Bt, L = b.shape[:2]
    a_pad = a_in.reshape((1,) * (a.dim() - a_in.dim()) + tuple(a_in.shape))
    invariant = a_pad.shape[0] == 1 and a_pad.shape[1] == 1
    # time-invariant: index the caller's small a, not the broadcast view (whose backward would
    # materialise a (B, L, *S) zero tensor); else the full a
    a = torch.broadcast_to(a_pad[0, 0].to(a_ct), a.shape[2:]) if invariant else torch.broadcast_to(a_in.to(a_ct), a.shape)
    lead = (-1,) if invariant else (Bt, L, -1)
    Q: Optional[Tensor] = None
    if structure == "block2x2":
        P = _pairs(a[..., 0, 0], a[..., 1, 1])
        Q = _pairs(a[..., 0, 1], a[..., 1, 0])
        bf = b
    elif ct.is_complex:
        ar = a.real if a.is_complex() else a
        P = _pairs(ar, ar)
        if a.is_complex():
            Q = _pairs(-a.imag, a.imag)
        bf = torch.view_as_real(b)
    else:
        P, bf = a, b
    h0f = None
    if h0 is not None:
        h0f = (torch.view_as_real(h0) if h0.is_complex() else h0).reshape(Bt, -1)
    h_all, h_last = linear_scan_fwd(P.reshape(lead), None if Q is None else Q.reshape(lead), bf.reshape(Bt, L, -1), h0f,
                                    reset)
    full = bf.shape
    h_all, h_last = h_all.view(full), h_last.view(full[:1] + full[2:])
    if ct.is_complex and structure == "diag":
        # the final state is a streaming state a caller feeds back (step, torch.compile, torch.export): a copy,
        # not a complex view of a real buffer, which dynamo cannot fake as an input (view_as_complex replayed
        # on the (B, 2N) base fails); (B, N), negligible
        h_all, h_last = torch.view_as_complex(h_all), torch.view_as_complex(h_last).clone()
    return h_all.to(dtype), h_last.to(dtype)

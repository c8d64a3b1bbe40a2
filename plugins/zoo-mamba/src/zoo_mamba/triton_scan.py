"""Mamba's selective scan as Triton kernels (forward and a recomputing backward), for GPUs.

Same arguments and results as ``zoo_mamba.scan.selective_scan_naive`` (the reference it is tested
against); the letters are that module's: Bt batch, L length, Di channels, N state size, T chunk.

Why Triton, and why this shape:
    mamba-ssm's CUDA kernel is the only fused Mamba-1 scan and is no longer built by default; this
    one needs nothing but ``triton``, and covers what that one's wrapper does not (an initial state,
    a gradient through the final state, packed documents).

Layout of the work (both kernels):
    one program per (batch row, block of BLOCK_D channels); it holds its (BLOCK_D, N) state in
    registers and walks time sequentially, so the (Bt, L, Di, N) tensor of states is never written.
    * forward: y_t = Σ_n h_t C_t + D u_t per step; stores the state *entering* each chunk of T steps
      (Bt, L/T, Di, N), the final state, and with ``ends`` the states after those steps.
    * backward: chunks in reverse; each chunk's states are recomputed from the stored entering state
      into a per-program scratch of T+1 states (L2-resident: Bt·Di·(T+1)·N values in all, never
      Bt·L·Di·N), then the adjoint λ runs backwards through the chunk, as mamba-ssm's CUDA kernel does.
    Gradients of quantities shared across programs (B, C input-dependent: shared by all channels;
    A, time-invariant B/C: shared by the batch) are written as per-program partial sums and reduced
    in PyTorch: no atomics, so the result is deterministic.

Packed documents: ``starts`` multiplies the transition by an exact 0 (as the reference does), ``ends``
is mapped to a per-step slot (−1 where none) so the forward stores those states in place.

The two kernels are wrapped in ``torch.library`` custom ops (``zoo_mamba::selective_scan_triton`` and
its backward) with fake implementations and a registered autograd formula, so ``torch.compile`` and
``torch.export`` see one opaque op. Compute is in float32 (float64 when an input is float64; half
inputs are converted to float32 before the kernel).

CPU testing: with ``TRITON_INTERPRET=1`` set before this module is imported, Triton runs the same
kernels on CPU tensors (slowly); that is how CI tests them (``tests/test_triton_scan.py``).
"""

import functools
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from zoo_core.kernels.probe import gpu_self_test

from .scan import _check, compute_dtype, selective_scan_naive

CHUNK = 64  # T: steps per stored entering state; the backward's scratch holds T+1 states per program


# ---------------------------------------------------------------------------------------------
# kernels
@triton.jit
def _fwd_kernel(  # pointers and sizes unannotated: Triton's compiler resolves annotations (pyproject.toml, mypy)
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, h0_ptr, keep_ptr, slot_ptr,  # inputs
    y_ptr, last_ptr, enter_ptr,  # outputs
    L, Di, N,
    STATIC_B: tl.constexpr, STATIC_C: tl.constexpr, HAS_D: tl.constexpr, HAS_KEEP: tl.constexpr,
    HAS_ENDS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # (BD,)
    n = tl.arange(0, BLOCK_N)  # (BN,)
    md, mn = d < Di, n < N
    m2 = md[:, None] & mn[None, :]
    dn = d[:, None] * N + n[None, :]  # (BD, BN) offsets into a (Di, N) matrix
    row = b.to(tl.int64) * L  # (b, t) -> row + t
    n_chunks = tl.cdiv(L, CHUNK)
    A = tl.load(A_ptr + dn, mask=m2, other=0.0)
    h = tl.load(h0_ptr + b.to(tl.int64) * Di * N + dn, mask=m2, other=0.0)  # padded lanes stay exactly 0
    if STATIC_B:
        Bs = tl.load(B_ptr + dn, mask=m2, other=0.0)
    if STATIC_C:
        Cs = tl.load(C_ptr + dn, mask=m2, other=0.0)
    if HAS_D:
        Dv = tl.load(D_ptr + d, mask=md, other=0.0)
    for t in range(L):
        # the state entering chunk t // T, stored at the chunk's first step (a predicated-off store elsewhere)
        first = (t % CHUNK) == 0
        tl.store(enter_ptr + ((b.to(tl.int64) * n_chunks + t // CHUNK) * Di * N) + dn, h, mask=m2 & first)
        off = (row + t) * Di + d
        uu = tl.load(u_ptr + off, mask=md, other=0.0)
        dd = tl.load(delta_ptr + off, mask=md, other=0.0)
        dA = tl.exp(dd[:, None] * A)
        if HAS_KEEP:
            dA = dA * tl.load(keep_ptr + row + t)  # exactly 0 where a document starts
        if STATIC_B:
            Bt_ = Bs
        else:
            Bt_ = tl.load(B_ptr + (row + t) * N + n, mask=mn, other=0.0)[None, :]
        if STATIC_C:
            Ct_ = Cs
        else:
            Ct_ = tl.load(C_ptr + (row + t) * N + n, mask=mn, other=0.0)[None, :]
        h = dA * h + (dd * uu)[:, None] * Bt_
        yy = tl.sum(h * Ct_, axis=1)
        if HAS_D:
            yy += Dv * uu
        tl.store(y_ptr + off, yy, mask=md)
        if HAS_ENDS:
            s = tl.load(slot_ptr + row + t).to(tl.int64)  # −1: not an end
            # the scalar is broadcast before the comparison: the interpreter rejects a scalar-bool mask term
            tl.store(last_ptr + s * Di * N + dn, h, mask=m2 & ((d * 0 + s) >= 0)[:, None])
    if not HAS_ENDS:
        tl.store(last_ptr + b.to(tl.int64) * Di * N + dn, h, mask=m2)


@triton.jit
def _bwd_kernel(  # pointers and sizes unannotated: Triton's compiler resolves annotations (pyproject.toml, mypy)
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, keep_ptr, slot_ptr,  # inputs
    gy_ptr, glast_ptr, enter_ptr,  # inputs of the backward
    scratch_ptr,  # (programs, T+1, BD, BN) work space
    gu_ptr, gdelta_ptr, gA_ptr, gB_ptr, gC_ptr, gh0_ptr,  # outputs (gA, static gB/gC: per batch row)
    L, Di, N,
    STATIC_B: tl.constexpr, STATIC_C: tl.constexpr, HAS_D: tl.constexpr, HAS_KEEP: tl.constexpr,
    HAS_ENDS: tl.constexpr, HAS_GLAST: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    pd = tl.program_id(1)
    n_dblocks = tl.num_programs(1)
    d = pd * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    md, mn = d < Di, n < N
    m2 = md[:, None] & mn[None, :]
    dn = d[:, None] * N + n[None, :]
    local = tl.arange(0, BLOCK_D)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # scratch offsets
    scratch = scratch_ptr + (b.to(tl.int64) * n_dblocks + pd) * (CHUNK + 1) * BLOCK_D * BLOCK_N
    row = b.to(tl.int64) * L
    bdn = b.to(tl.int64) * Di * N
    n_chunks = tl.cdiv(L, CHUNK)
    A = tl.load(A_ptr + dn, mask=m2, other=0.0)
    if STATIC_B:
        Bs = tl.load(B_ptr + dn, mask=m2, other=0.0)
    if STATIC_C:
        Cs = tl.load(C_ptr + dn, mask=m2, other=0.0)
    if HAS_D:
        Dv = tl.load(D_ptr + d, mask=md, other=0.0)
    # λ: ∂loss/∂h_t from the steps after t (and, at t = L−1, from the final state's cotangent)
    if HAS_GLAST:
        g = tl.load(glast_ptr + bdn + dn, mask=m2, other=0.0)
    else:
        g = tl.zeros_like(A)
    gA_acc = tl.zeros_like(A)
    gB_acc = tl.zeros_like(A)
    gC_acc = tl.zeros_like(A)
    for ci in range(n_chunks):
        c = n_chunks - 1 - ci
        t0 = c * CHUNK
        T = tl.minimum(CHUNK, L - t0)
        # 1. recompute the chunk's states: scratch[0] = entering state, scratch[s + 1] = state after t0 + s
        h = tl.load(enter_ptr + (b.to(tl.int64) * n_chunks + c) * Di * N + dn, mask=m2, other=0.0)
        tl.store(scratch + local, h)
        for s in range(T):
            t = t0 + s
            off = (row + t) * Di + d
            uu = tl.load(u_ptr + off, mask=md, other=0.0)
            dd = tl.load(delta_ptr + off, mask=md, other=0.0)
            dA = tl.exp(dd[:, None] * A)
            if HAS_KEEP:
                dA = dA * tl.load(keep_ptr + row + t)
            if STATIC_B:
                Bt_ = Bs
            else:
                Bt_ = tl.load(B_ptr + (row + t) * N + n, mask=mn, other=0.0)[None, :]
            h = dA * h + (dd * uu)[:, None] * Bt_
            tl.store(scratch + (s + 1) * BLOCK_D * BLOCK_N + local, h)
        tl.debug_barrier()  # the scratch written by any thread of the program is read by any other
        # 2. the adjoint, backwards through the chunk
        for r in range(T):
            s = T - 1 - r
            t = t0 + s
            off = (row + t) * Di + d
            uu = tl.load(u_ptr + off, mask=md, other=0.0)
            dd = tl.load(delta_ptr + off, mask=md, other=0.0)
            gy = tl.load(gy_ptr + off, mask=md, other=0.0)
            h_t = tl.load(scratch + (s + 1) * BLOCK_D * BLOCK_N + local)
            h_prev = tl.load(scratch + s * BLOCK_D * BLOCK_N + local)
            if STATIC_B:
                Bt_ = Bs
            else:
                Bt_ = tl.load(B_ptr + (row + t) * N + n, mask=mn, other=0.0)[None, :]
            if STATIC_C:
                Ct_ = Cs
            else:
                Ct_ = tl.load(C_ptr + (row + t) * N + n, mask=mn, other=0.0)[None, :]
            g = g + gy[:, None] * Ct_  # y_t's direct dependence on h_t
            if HAS_ENDS:
                sl = tl.load(slot_ptr + row + t).to(tl.int64)
                g += tl.load(glast_ptr + sl * Di * N + dn, mask=m2 & ((d * 0 + sl) >= 0)[:, None], other=0.0)
            # C: ∂y_t/∂C_t = h_t
            if STATIC_C:
                gC_acc += gy[:, None] * h_t
            else:
                tl.store(gC_ptr + ((b.to(tl.int64) * n_dblocks + pd) * L + t) * N + n, tl.sum(gy[:, None] * h_t, axis=0), mask=mn)
            dA = tl.exp(dd[:, None] * A)
            if HAS_KEEP:
                dA = dA * tl.load(keep_ptr + row + t)
            P = g * h_prev * dA  # ∂/∂(Δ_t A)
            gA_acc += dd[:, None] * P
            g_dbu = tl.sum(g * Bt_, axis=1)  # ∂/∂(Δ_t u_t)
            dbu = dd * uu
            gd = tl.sum(P * A, axis=1) + g_dbu * uu
            gu = g_dbu * dd
            if HAS_D:
                gu += gy * Dv
            tl.store(gu_ptr + off, gu, mask=md)
            tl.store(gdelta_ptr + off, gd, mask=md)
            if STATIC_B:
                gB_acc += g * dbu[:, None]
            else:
                tl.store(gB_ptr + ((b.to(tl.int64) * n_dblocks + pd) * L + t) * N + n, tl.sum(g * dbu[:, None], axis=0), mask=mn)
            g = dA * g  # passed to step t − 1
        tl.debug_barrier()  # the next chunk overwrites the scratch
    tl.store(gh0_ptr + bdn + dn, g, mask=m2)
    tl.store(gA_ptr + bdn + dn, gA_acc, mask=m2)
    if STATIC_B:
        tl.store(gB_ptr + bdn + dn, gB_acc, mask=m2)
    if STATIC_C:
        tl.store(gC_ptr + bdn + dn, gC_acc, mask=m2)


# ---------------------------------------------------------------------------------------------
# launch parameters
def _block_n(N: int) -> int:
    return max(2, triton.next_power_of_2(N))


def default_block_d(bt: int, di: int, N: int) -> int:
    """Channels per program: as many as keep every multiprocessor busy (about 2·132 programs on an
    H200) and the (BLOCK_D, N) state within ~2K registers' worth of values; at least 4."""
    bn = _block_n(N)
    for bd in (64, 32, 16, 8):
        if bd * bn <= 2048 and bt * triton.cdiv(di, bd) >= 264:
            return bd
    return 4


def _num_warps(block_d: int, block_n: int) -> int:
    return max(1, min(8, block_d * block_n // 128))


# ---------------------------------------------------------------------------------------------
# custom ops (inputs already in the compute dtype and contiguous: see selective_scan_triton)
@torch.library.custom_op("zoo_mamba::selective_scan_triton", mutates_args=())
def _scan_fwd(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, h0: Tensor | None,
              keep: Tensor | None, slot: Tensor | None, n_ends: int, chunk: int, block_d: int) -> tuple[Tensor, Tensor, Tensor]:
    """Forward kernel: y (Bt, L, Di), the final state (Bt, Di, N) or the ends' states (n_ends, Di, N),
    and the state entering each chunk (Bt, ⌈L/T⌉, Di, N) for the backward."""
    bt, L, di = u.shape
    N = A.shape[1]
    n_chunks = triton.cdiv(L, chunk)
    y = torch.empty_like(u)
    last = u.new_empty((bt, di, N) if slot is None else (n_ends, di, N))
    enter = u.new_empty(bt, n_chunks, di, N)
    h_init = u.new_zeros(bt, di, N) if h0 is None else h0
    bn = _block_n(N)
    grid = (bt, triton.cdiv(di, block_d))
    _fwd_kernel[grid](
        u, delta, A, B, C, u if D is None else D, h_init, u if keep is None else keep, u if slot is None else slot,
        y, last, enter, L, di, N,
        STATIC_B=B.dim() == 2, STATIC_C=C.dim() == 2, HAS_D=D is not None, HAS_KEEP=keep is not None,
        HAS_ENDS=slot is not None, CHUNK=chunk, BLOCK_D=block_d, BLOCK_N=bn, num_warps=_num_warps(block_d, bn),
    )
    return y, last, enter


@_scan_fwd.register_fake
def _(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, h0: Tensor | None,
      keep: Tensor | None, slot: Tensor | None, n_ends: int, chunk: int, block_d: int) -> tuple[Tensor, Tensor, Tensor]:
    bt, L, di = u.shape
    N = A.shape[1]
    last = u.new_empty((bt, di, N) if slot is None else (n_ends, di, N))
    return torch.empty_like(u), last, u.new_empty(bt, (L + chunk - 1) // chunk, di, N)


@torch.library.custom_op("zoo_mamba::selective_scan_triton_bwd", mutates_args=())
def _scan_bwd(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, keep: Tensor | None,
              slot: Tensor | None, gy: Tensor, glast: Tensor | None, enter: Tensor, chunk: int,
              block_d: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Backward kernel: ∂/∂u, ∂/∂Δ, ∂/∂A, ∂/∂B, ∂/∂C, ∂/∂h0 (D's gradient is Σ gy·u, formed by the caller).

    ``glast``: the cotangent of the final state, or of the ends' states when ``slot`` is given; None: 0."""
    bt, L, di = u.shape
    N = A.shape[1]
    bn = _block_n(N)
    n_db = triton.cdiv(di, block_d)
    static_B, static_C = B.dim() == 2, C.dim() == 2
    gu, gdelta = torch.empty_like(u), torch.empty_like(u)
    gA_rows, gh0 = u.new_empty(bt, di, N), u.new_empty(bt, di, N)
    gB_part = u.new_empty(bt, di, N) if static_B else u.new_empty(bt, n_db, L, N)  # summed below
    gC_part = u.new_empty(bt, di, N) if static_C else u.new_empty(bt, n_db, L, N)
    scratch = u.new_empty(bt * n_db * (chunk + 1) * block_d * bn)
    _bwd_kernel[(bt, n_db)](
        u, delta, A, B, C, u if D is None else D, u if keep is None else keep, u if slot is None else slot,
        gy, u if glast is None else glast, enter, scratch,
        gu, gdelta, gA_rows, gB_part, gC_part, gh0, L, di, N,
        STATIC_B=static_B, STATIC_C=static_C, HAS_D=D is not None, HAS_KEEP=keep is not None,
        HAS_ENDS=slot is not None, HAS_GLAST=glast is not None and slot is None, CHUNK=chunk, BLOCK_D=block_d,
        BLOCK_N=bn, num_warps=_num_warps(block_d, bn),
    )
    gB = gB_part.sum(0) if static_B else gB_part.sum(1)
    gC = gC_part.sum(0) if static_C else gC_part.sum(1)
    return gu, gdelta, gA_rows.sum(0), gB, gC, gh0


@_scan_bwd.register_fake
def _(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, keep: Tensor | None,
      slot: Tensor | None, gy: Tensor, glast: Tensor | None, enter: Tensor, chunk: int,
      block_d: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    bt, _, di = u.shape
    return (torch.empty_like(u), torch.empty_like(u), torch.empty_like(A), torch.empty_like(B), torch.empty_like(C),
            u.new_empty(bt, di, A.shape[1]))


def _setup_context(ctx: Any, inputs: tuple[object, ...], output: tuple[Tensor, ...]) -> None:
    u, delta, A, B, C, D, h0, keep, slot, _n_ends, chunk, block_d = inputs
    ctx.save_for_backward(u, delta, A, B, C, D, keep, slot, output[2])
    ctx.chunk, ctx.block_d, ctx.has_h0 = chunk, block_d, h0 is not None


def _backward(ctx: Any, gy: Tensor | None, glast: Tensor | None,
              _genter: Tensor | None) -> tuple[Tensor | None, ...]:
    u, delta, A, B, C, D, keep, slot, enter = ctx.saved_tensors
    gy_ = torch.zeros_like(u) if gy is None else gy.contiguous()
    gu, gdelta, gA, gB, gC, gh0 = _scan_bwd(u, delta, A, B, C, D, keep, slot, gy_,
                                            None if glast is None else glast.contiguous(), enter,
                                            ctx.chunk, ctx.block_d)
    gD = None if D is None else (gy_ * u).sum((0, 1))
    return gu, gdelta, gA, gB, gC, gD, gh0 if ctx.has_h0 else None, None, None, None, None, None


_scan_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------
# the backend
def selective_scan_triton(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None, h0: Tensor | None = None,
    *, starts: Tensor | None = None, ends: Tensor | None = None, chunk: int | None = None, block_d: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Selective scan by the Triton kernels; same arguments and results as ``selective_scan_naive``.

    Args:
        chunk: steps per stored entering state (default ``CHUNK``): the backward recomputes this many
            states per program into its scratch.
        block_d: channels per program (a power of two; default ``default_block_d``).
    """
    _check(u, delta, A, B, C, D, h0, starts, ends)
    T = CHUNK if chunk is None else int(chunk)
    if T < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    bt, _, di = u.shape
    bd = default_block_d(bt, di, A.shape[1]) if block_d is None else int(block_d)
    if bd < 1 or bd & (bd - 1):
        raise ValueError(f"block_d must be a power of two, got {block_d}")
    ct = compute_dtype(u, delta, A, B, C, D, h0)

    def cast(x: Tensor) -> Tensor:
        return x.to(ct).contiguous()

    keep = None if starts is None else (~starts).to(ct).contiguous()
    slot, n_ends = None, 0
    if ends is not None:
        n_ends = int(ends.sum())  # one host sync: the result's size
        ranks = torch.cumsum(ends.reshape(-1).to(torch.int64), 0).reshape(ends.shape) - 1
        slot = torch.where(ends, ranks, torch.full_like(ranks, -1)).to(torch.int32).contiguous()
    y, last, _ = _scan_fwd(cast(u), cast(delta), cast(A), cast(B), cast(C), None if D is None else cast(D),
                           None if h0 is None else cast(h0), keep, slot, n_ends, T, bd)
    return y.to(u.dtype), last


# ---------------------------------------------------------------------------------------------
# the run-time probe behind ``auto``
def triton_runtime_reason() -> str | None:
    """None once the kernels have run on this GPU and matched the reference (forward and gradients);
    else why not. Run by the backend's ``supports`` only for problems on CUDA, cached per process."""
    return _triton_runtime_reason()


@functools.lru_cache(maxsize=1)
def _triton_runtime_reason() -> str | None:
    return gpu_self_test("the Triton selective scan", _self_test_pairs)


def _self_test_pairs() -> list[tuple[Tensor, Tensor]]:
    """(GPU result, float64 reference): y, the last state and every gradient."""
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 37, 10, generator=g), torch.rand(2, 37, 10, generator=g) * 0.1 + 0.01,
            -torch.rand(10, 5, generator=g) - 0.5, torch.randn(2, 37, 5, generator=g), torch.randn(2, 37, 5, generator=g),
            torch.randn(10, generator=g), torch.randn(2, 10, 5, generator=g)]
    ref = [a.double().requires_grad_() for a in args]
    gpu = [a.cuda().requires_grad_() for a in args]
    y_r, h_r = selective_scan_naive(*ref)
    y_g, h_g = selective_scan_triton(*gpu, chunk=16, block_d=4)
    gr = torch.autograd.grad(y_r.sum() + h_r.sum(), ref)
    gg = torch.autograd.grad(y_g.sum() + h_g.sum(), gpu)
    return [(y_g, y_r), (h_g, h_r), *zip(gg, gr, strict=True)]

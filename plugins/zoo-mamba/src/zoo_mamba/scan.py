"""Mamba's selective scan, three backends with one signature, and the single-step update.

Letters: Bt batch, L length, Di inner width (channels), N state size per channel, T chunk length.

    dA_t = exp(Δ_t ⊗ A)                        (Bt, Di, N)   A = −exp(A_log) < 0
    h_t  = dA_t ⊙ h_{t−1} + (Δ_t ⊙ u_t) ⊗ B_t   (Bt, Di, N)   B̄ = Δ·B, as all Mamba code does
    y_t  = Σ_n h_t[..., n] C_t[n] + D ⊙ u_t     (Bt, Di)

B and C are input-dependent, (Bt, L, N), shared by all Di channels; or time-invariant, (Di, N),
one row per channel (MambaSL's switches). Everything is computed in float32 (float64 when an input
is float64); y is returned in u's dtype and the final state in the compute dtype.

Packed documents (``zoo_core.packing``), two optional keywords of every backend:
    ``starts`` (Bt, L) bool: the state restarts from zero at these steps, h_t = (Δu)_t ⊗ B_t there:
        the transition dA_t is multiplied by 0 (an exact zero, never a −inf log-decay, so no
        inf − inf and finite gradients), which also makes every gradient across the start zero.
    ``ends`` (Bt, L) bool: the second result is then the state after each of these steps,
        (number of ends, Di, N) in row-major order (each document's final state), instead of the
        state after step L−1; the chunked backend picks them out of the chunk it has in hand.

Backends (registered as ``scan`` backends of structure ``"selective"``):
    ``selective_scan_naive``    the reference: a loop over t under autograd.
    ``selective_scan_chunked``  a custom autograd function that works chunk by chunk (T steps):
        forward keeps only the state entering each chunk; backward recomputes a chunk and runs the
        reverse (adjoint) scan through it. Peak extra memory is a few (Bt, T, Di, N) buffers plus
        (L/T)·Bt·Di·N, never Bt·L·Di·N.
    ``selective_scan_cuda``     mamba-ssm's fused kernel when it imports and the tensors are on a
        GPU (no initial state, no gradient through the final state); otherwise the chunked path.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import Tensor

from zoo_core.packing import check_step_mask

CHUNK = 64  # T: steps per chunk; the (T, Bt, Di, N) buffers stay small while the per-chunk ops amortise


def compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    """float64 if any input is float64, else float32 (half inputs are accumulated in float32)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _check(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, h0: Tensor | None,
           starts: Tensor | None = None, ends: Tensor | None = None) -> None:
    if u.dim() != 3 or delta.shape != u.shape:
        raise ValueError(f"selective scan needs u and delta of one shape (Bt, L, Di); got {tuple(u.shape)} and {tuple(delta.shape)}")
    bt, L, di = u.shape
    if A.dim() != 2 or A.shape[0] != di:
        raise ValueError(f"A must be (Di, N) = ({di}, N); got {tuple(A.shape)}")
    n = A.shape[1]
    for name, M in (("B", B), ("C", C)):
        if tuple(M.shape) not in ((bt, L, n), (di, n)):
            raise ValueError(f"{name} must be input-dependent (Bt, L, N) = {(bt, L, n)} or time-invariant (Di, N) = {(di, n)}; "
                             f"got {tuple(M.shape)}")
    if D is not None and tuple(D.shape) != (di,):
        raise ValueError(f"D must be (Di,) = ({di},); got {tuple(D.shape)}")
    if h0 is not None and tuple(h0.shape) != (bt, di, n):
        raise ValueError(f"h0 must be (Bt, Di, N) = {(bt, di, n)}; got {tuple(h0.shape)}")
    for name, mask in (("starts", starts), ("ends", ends)):
        check_step_mask(mask, (bt, L), name=name, who="selective scan")


def _keep(starts: Tensor | None, ct: torch.dtype) -> Tensor | None:
    """(Bt, L) in the compute dtype: 0 where the state restarts, 1 elsewhere (None: no restart)."""
    return None if starts is None else (~starts).to(ct)


# ---------------------------------------------------------------------------------------------
# reference
def selective_scan_naive(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None, h0: Tensor | None = None,
    *, starts: Tensor | None = None, ends: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference: the plain loop over t (autograd records every step).

    Args:
        u: (Bt, L, Di) input. delta: (Bt, L, Di) step sizes Δ (already softplus'd, > 0).
        A: (Di, N) negative real. B, C: (Bt, L, N) input-dependent or (Di, N) time-invariant.
        D: (Di,) skip, or None. h0: (Bt, Di, N) initial state, or None for zero.
        starts: (Bt, L) bool, steps where the state restarts from zero (packed documents), or None.
        ends: (Bt, L) bool, steps whose states to return instead of the last one, or None.

    Returns:
        y: (Bt, L, Di) in u's dtype; h_last: (Bt, Di, N) in the compute dtype, or with ``ends``
        (number of ends, Di, N), the states after those steps in row-major order.
    """
    _check(u, delta, A, B, C, D, h0, starts, ends)
    ct = compute_dtype(u, delta, A, B, C, D, h0)
    uc, dc, Ac, Bc, Cc = (t.to(ct) for t in (u, delta, A, B, C))
    h = uc.new_zeros(u.shape[0], u.shape[2], A.shape[1]) if h0 is None else h0.to(ct)  # (Bt, Di, N)
    B_steps = [Bc] * u.shape[1] if B.dim() == 2 else [b[:, None, :] for b in Bc.unbind(1)]  # (Di, N) | (Bt, 1, N)
    C_steps = [Cc] * u.shape[1] if C.dim() == 2 else [c[:, None, :] for c in Cc.unbind(1)]
    keep = _keep(starts, ct)
    keep_steps = [None] * u.shape[1] if keep is None else [k[:, None, None] for k in keep.unbind(1)]  # (Bt, 1, 1)
    ys, hs = [], []
    for u_t, d_t, B_t, C_t, k_t in zip(uc.unbind(1), dc.unbind(1), B_steps, C_steps, keep_steps, strict=True):
        dA = torch.exp(d_t[..., None] * Ac)  # (Bt, Di, N)
        h = (dA if k_t is None else dA * k_t) * h + (d_t * u_t)[..., None] * B_t  # (Bt, Di, N)
        ys.append((h * C_t).sum(-1))  # (Bt, Di)
        hs.append(h)
    y = torch.stack(ys, 1)  # (Bt, L, Di)
    if D is not None:
        y = y + D.to(ct) * uc
    return y.to(u.dtype), (h if ends is None else torch.stack(hs, 1)[ends])


def selective_step(
    u_t: Tensor, delta_t: Tensor, A: Tensor, B_t: Tensor, C_t: Tensor, D: Tensor | None, h: Tensor
) -> tuple[Tensor, Tensor]:
    """One step of the recurrence, for decoding.

    Args:
        u_t, delta_t: (Bt, Di). A: (Di, N). B_t, C_t: broadcastable to (Bt, Di, N), i.e.
            (Bt, 1, N) input-dependent or (Di, N) time-invariant. D: (Di,) or None.
        h: (Bt, Di, N) state.

    Returns:
        y_t: (Bt, Di) in u_t's dtype; h: (Bt, Di, N) in the compute dtype.
    """
    ct = compute_dtype(u_t, delta_t, A, B_t, C_t, h)
    uc, dc = u_t.to(ct), delta_t.to(ct)
    h = torch.exp(dc[..., None] * A.to(ct)) * h.to(ct) + (dc * uc)[..., None] * B_t.to(ct)  # (Bt, Di, N)
    y = (h * C_t.to(ct)).sum(-1)  # (Bt, Di)
    if D is not None:
        y = y + D.to(ct) * uc
    return y.to(u_t.dtype), h


# ---------------------------------------------------------------------------------------------
# chunked, with a recomputing backward
def _time_major(M: Tensor) -> Tensor:
    return M.transpose(0, 1).contiguous()  # (Bt, L, ·) -> (L, Bt, ·)


def _per_step(M: Tensor, static: bool, t0: int, t1: int) -> Tensor:
    """B or C for steps t0..t1−1, broadcastable to (T, Bt, Di, N)."""
    return M if static else M[t0:t1, :, None, :]  # (Di, N) | (T, Bt, 1, N)


def _contract_N(H: Tensor, M: Tensor, static: bool) -> Tensor:
    """Σ_n H[..., n] M[..., n] for H (T, Bt, Di, N) -> (T, Bt, Di)."""
    if static:
        return torch.einsum("tbdn,dn->tbd", H, M)
    return torch.matmul(H, M.transpose(-1, -2)).squeeze(-1)  # (T, Bt, Di, N) @ (T, Bt, N, 1)


def _reduce_to(G: Tensor, w: Tensor, static: bool) -> Tensor:
    """Gradient of B or C: Σ_d G ⊙ w over channels (input-dependent: (T, Bt, N)) or over steps and
    batch too (time-invariant: (Di, N)). G (T, Bt, Di, N), w (T, Bt, Di)."""
    if static:
        return torch.einsum("tbdn,tbd->dn", G, w)
    return torch.matmul(w[:, :, None, :], G).squeeze(2)  # (T, Bt, 1, Di) @ (T, Bt, Di, N)


class _Chunks:
    """The chunk loop's inputs in time-major layout and two reusable (T, Bt, Di, N) buffers.

    Reusing the buffers (instead of allocating per chunk) keeps the process's resident memory at
    the live size: glibc does not hand freed megabyte blocks back promptly.
    """

    def __init__(self, dc: Tensor, dbu: Tensor, A: Tensor, Bm: Tensor, static_B: bool, chunk: int,
                 keep: Tensor | None = None) -> None:
        self.dc, self.dbu, self.A, self.Bm, self.static_B, self.keep = dc, dbu, A, Bm, static_B, keep  # keep (L, Bt)
        L, bt, di = dc.shape
        T = min(chunk, L)
        self.dA_buf = dc.new_empty(T, bt, di, A.shape[1])  # (T, Bt, Di, N)
        self.H_buf = dc.new_empty(T, bt, di, A.shape[1])

    def states(self, h: Tensor, t0: int, t1: int) -> tuple[Tensor, Tensor]:
        """dA and every state of steps t0..t1−1 starting from h: (T, Bt, Di, N) views of the buffers."""
        dA, H = self.dA_buf[: t1 - t0], self.H_buf[: t1 - t0]
        torch.mul(self.dc[t0:t1, :, :, None], self.A, out=dA).exp_()  # exp(Δ ⊗ A)
        if self.keep is not None:  # a document starts: the transition is exactly 0 (forward and backward use dA)
            dA.mul_(self.keep[t0:t1, :, None, None])
        torch.mul(self.dbu[t0:t1, :, :, None], _per_step(self.Bm, self.static_B, t0, t1), out=H)  # Δu ⊗ B
        prev = h
        for t in range(t1 - t0):
            prev = H[t].addcmul_(dA[t], prev)  # h_t = dA_t ⊙ h_{t−1} + Δu_t B_t, in place
        return dA, H


class _Ends:
    """The steps whose states are returned (``ends``), sorted by time, with each one's row-major slot
    in the result and where each chunk's run of them begins: one host sync, not one per chunk."""

    def __init__(self, ends: Tensor, chunk: int) -> None:
        L = ends.shape[1]
        self.count = int(ends.sum())
        slot = (torch.cumsum(ends.reshape(-1).long(), 0) - 1).reshape(ends.shape)  # (Bt, L) row-major order
        self.t, self.b = torch.nonzero(ends.t(), as_tuple=True)  # time-major order: by step, then row
        self.slot = slot[self.b, self.t]
        edges = torch.arange(0, L + chunk, chunk, device=ends.device).clamp(max=L)
        self.cuts = torch.searchsorted(self.t, edges).tolist()

    def take(self, out: Tensor, H: Tensor, j: int, t0: int) -> None:
        """Copy chunk j's end states from its states H (T, Bt, Di, N) into out (count, Di, N)."""
        k = slice(self.cuts[j], self.cuts[j + 1])
        out[self.slot[k]] = H[self.t[k] - t0, self.b[k]]

    def give(self, G: Tensor, g: Tensor, j: int, t0: int) -> None:
        """Add the end states' cotangents g (count, Di, N) to chunk j's adjoint G (T, Bt, Di, N)."""
        k = slice(self.cuts[j], self.cuts[j + 1])
        G[self.t[k] - t0, self.b[k]] += g[self.slot[k]]  # (t, b) pairs are distinct: no accumulation needed


def _batch_major(t: Tensor, dtype: torch.dtype) -> Tensor:
    """(L, Bt, ...) time-major -> (Bt, L, ...) in ``dtype``, always a fresh contiguous copy (see backward)."""
    return t.transpose(0, 1).clone(memory_format=torch.contiguous_format).to(dtype)


class _SelectiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, u: Tensor, delta: Tensor, A: Tensor, Bm: Tensor, Cm: Tensor, D: Tensor | None,
                h0: Tensor | None, chunk: int, starts: Tensor | None, ends: Tensor | None) -> tuple[Tensor, Tensor]:
        ct = compute_dtype(u, delta, A, Bm, Cm, D, h0)
        bt, L, di = u.shape
        static_B, static_C = Bm.dim() == 2, Cm.dim() == 2
        uc, dc = _time_major(u.to(ct)), _time_major(delta.to(ct))  # (L, Bt, Di)
        Ac = A.to(ct)
        Bc = Bm.to(ct) if static_B else _time_major(Bm.to(ct))  # (Di, N) | (L, Bt, N)
        Cc = Cm.to(ct) if static_C else _time_major(Cm.to(ct))
        keep = None if starts is None else _time_major((~starts).to(ct))  # (L, Bt): 0 where a document starts
        chunks = _Chunks(dc, dc * uc, Ac, Bc, static_B, chunk, keep)
        picks = None if ends is None else _Ends(ends, chunk)
        h = uc.new_zeros(bt, di, A.shape[1]) if h0 is None else h0.to(ct)  # (Bt, Di, N)
        at_ends = None if picks is None else uc.new_zeros(picks.count, di, A.shape[1])
        entering, y = [], torch.empty_like(uc)  # y (L, Bt, Di)
        for j, t0 in enumerate(range(0, L, chunk)):
            t1 = min(t0 + chunk, L)
            entering.append(h)
            _, H = chunks.states(h, t0, t1)
            y[t0:t1] = _contract_N(H, _per_step(Cc, static_C, t0, t1), static_C)  # (T, Bt, Di)
            if picks is not None and at_ends is not None:
                picks.take(at_ends, H, j, t0)
            h = H[-1].clone()
        if D is not None:
            y.addcmul_(uc, D.to(ct))
        ctx.save_for_backward(uc, dc, Ac, Bc, Cc, D, torch.stack(entering, 0), keep)
        ctx.meta = (chunk, static_B, static_C, h0 is not None, ct)
        ctx.picks = picks
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (u, delta, A, Bm, Cm, D, h0))
        return y.transpose(0, 1).to(u.dtype), (h if at_ends is None else at_ends)

    @staticmethod
    def backward(ctx: Any, gy: Tensor | None, gh_last: Tensor | None) -> tuple[Tensor | None, ...]:
        uc, dc, Ac, Bc, Cc, D, entering, keep = ctx.saved_tensors
        chunk, static_B, static_C, has_h0, ct = ctx.meta
        picks: _Ends | None = ctx.picks
        L, bt, di = uc.shape
        gyc = uc.new_zeros(L, bt, di) if gy is None else _time_major(gy.to(ct))  # (L, Bt, Di)
        g_ends = None if picks is None or gh_last is None else gh_last.to(ct)  # (count, Di, N): the end states'
        # ∂/∂h from later steps; with ends, the state after step L−1 is no result, so nothing comes after it
        lam = uc.new_zeros(bt, di, Ac.shape[1]) if gh_last is None or picks is not None else gh_last.to(ct)
        dbu = dc * uc
        chunks = _Chunks(dc, dbu, Ac, Bc, static_B, chunk, keep)
        G_buf = torch.empty_like(chunks.H_buf)  # (T, Bt, Di, N): the adjoint λ
        g_dbu = torch.empty_like(uc)  # (L, Bt, Di): ∂/∂(Δu)
        g_d = torch.empty_like(uc)  # (L, Bt, Di): ∂/∂Δ through dA
        gA, gB, gC = torch.zeros_like(Ac), torch.zeros_like(Bc), torch.zeros_like(Cc)
        for j in reversed(range(entering.shape[0])):
            t0, t1 = j * chunk, min(j * chunk + chunk, L)
            h_in = entering[j]  # (Bt, Di, N)
            dA, H = chunks.states(h_in, t0, t1)
            if static_C:
                gC += _reduce_to(H, gyc[t0:t1], True)
            else:
                gC[t0:t1] = _reduce_to(H, gyc[t0:t1], False)  # (T, Bt, N)
            G = torch.mul(gyc[t0:t1, :, :, None], _per_step(Cc, static_C, t0, t1), out=G_buf[: t1 - t0])  # direct ∂/∂h_t
            G[-1] += lam
            if picks is not None and g_ends is not None:
                picks.give(G, g_ends, j, t0)
            for t in range(t1 - t0 - 1, 0, -1):
                G[t - 1].addcmul_(dA[t], G[t])  # λ_{t−1} = ∂y/∂h_{t−1} + dA_t ⊙ λ_t
            lam = dA[0] * G[0]  # passed to the previous chunk
            # ∂/∂(Δ_t A) = λ_t ⊙ h_{t−1} ⊙ dA_t, formed in dA's buffer
            P = dA.mul_(G)  # (T, Bt, Di, N)
            P[1:].mul_(H[:-1])
            P[0].mul_(h_in)
            gA += torch.einsum("tbdn,tbd->dn", P, dc[t0:t1])
            g_d[t0:t1] = torch.einsum("tbdn,dn->tbd", P, Ac)
            g_dbu[t0:t1] = _contract_N(G, _per_step(Bc, static_B, t0, t1), static_B)  # Σ_n λ_t B_t
            if static_B:
                gB += _reduce_to(G, dbu[t0:t1], True)
            else:
                gB[t0:t1] = _reduce_to(G, dbu[t0:t1], False)
        g_u = g_dbu * dc
        g_delta = g_d.addcmul_(g_dbu, uc)
        gD = None
        if D is not None:
            g_u.addcmul_(gyc, D.to(ct))
            gD = (gyc * uc).sum((0, 1))
        du, dd, dA_, dB, dC, dD, dh0 = ctx.dtypes
        # fresh batch-major copies: under torch.compile the backward is traced with fake tensors, where a
        # buffer from empty_like of a transposed input, filled in place, has other strides than it gets when
        # the functionalized graph runs; a view of softplus_backward's result then failed at run time.
        # (.contiguous() or .to(memory_format=...) is a no-op where the fake already looks contiguous.)
        return (
            _batch_major(g_u, du), _batch_major(g_delta, dd), gA.to(dA_),
            gB.to(dB) if static_B else _batch_major(gB, dB), gC.to(dC) if static_C else _batch_major(gC, dC),
            None if gD is None else gD.to(dD), lam.to(dh0) if has_h0 else None, None, None, None,
        )


def selective_scan_chunked(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None, h0: Tensor | None = None,
    *, chunk: int | None = None, starts: Tensor | None = None, ends: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Chunked selective scan with a recomputing backward; same arguments and results as
    ``selective_scan_naive`` (``chunk``: steps per chunk, default ``CHUNK``)."""
    _check(u, delta, A, B, C, D, h0, starts, ends)
    T = CHUNK if chunk is None else int(chunk)
    if T < 1:
        raise ValueError(f"chunk must be ≥ 1, got {chunk}")
    return _SelectiveScan.apply(u, delta, A, B, C, D, h0, T, starts, ends)


# ---------------------------------------------------------------------------------------------
# mamba-ssm's CUDA kernel
@functools.lru_cache(maxsize=1)
def _cuda_kernel() -> Any:
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn  # optional dependency

    return selective_scan_fn


def selective_scan_cuda(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None, h0: Tensor | None = None,
    *, starts: Tensor | None = None, ends: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """mamba-ssm's fused ``selective_scan_fn`` for CUDA tensors without an initial state; the
    chunked path otherwise (CPU tensors, float64, a given h0, packed documents: ``starts``/``ends``,
    since mamba-ssm's Mamba-1 kernel has no ``seq_idx`` reset). Same arguments and results as
    ``selective_scan_naive``, except that no gradient flows back through the kernel's final state."""
    _check(u, delta, A, B, C, D, h0, starts, ends)
    if not u.is_cuda or h0 is not None or u.dtype == torch.float64 or starts is not None or ends is not None:
        return selective_scan_chunked(u, delta, A, B, C, D, h0, starts=starts, ends=ends)
    fn = _cuda_kernel()
    tv = lambda M: M if M.dim() == 2 else M.transpose(1, 2).contiguous()  # noqa: E731  (Bt, N, L)
    y, last = fn(u.transpose(1, 2).contiguous(), delta.transpose(1, 2).contiguous(), A.float(), tv(B), tv(C),
                 None if D is None else D.float(), return_last_state=True)
    return y.transpose(1, 2), last


def cuda_runtime_reason() -> str | None:
    """None once mamba-ssm's kernel has run on this GPU and matched the reference; else why not.

    Run by the backend's ``supports`` only for problems on CUDA, and cached per process.
    """
    return _cuda_runtime_reason()


@functools.lru_cache(maxsize=1)
def _cuda_runtime_reason() -> str | None:
    if not torch.cuda.is_available():
        return "CUDA is not available in this torch build or machine"
    try:
        _cuda_kernel()
    except Exception as exc:  # an installed but broken extension raises anything
        return f"mamba_ssm does not import ({type(exc).__name__}: {exc}); pip install mamba-ssm (needs a CUDA build)"
    try:
        g = torch.Generator().manual_seed(0)
        args = [torch.randn(2, 17, 8, generator=g), torch.rand(2, 17, 8, generator=g) * 0.1,
                -torch.rand(8, 4, generator=g) - 0.5, torch.randn(2, 17, 4, generator=g), torch.randn(2, 17, 4, generator=g),
                torch.randn(8, generator=g)]
        ref, ref_h = selective_scan_naive(*args)
        out, h = selective_scan_cuda(*(a.cuda() for a in args))
        err = max(((out.cpu() - ref).norm() / ref.norm()).item(), ((h.cpu() - ref_h).norm() / ref_h.norm()).item())
    except Exception as exc:
        return f"mamba_ssm's selective_scan_fn failed a test run on this GPU ({type(exc).__name__}: {exc})"
    if not math.isfinite(err) or err > 1e-4:
        return f"mamba_ssm's selective_scan_fn disagrees with the reference on this GPU (relative error {err:.1e})"
    return None

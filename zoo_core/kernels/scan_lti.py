"""Chunked scan for time-invariant diagonal recurrences ``h_t = a ⊙ h_{t−1} + b_t``.

Dimensions:
    B: batch.  L: length.  S: state dimensions (flattened to n).  T: chunk length (``CHUNK``).
    J: number of chunks, ceil(L / T).

Within a chunk, ``h_t = a^(t+1) ⊙ h_in + Σ_{s≤t} a^(t−s) ⊙ b_s``: the sum is one batched matmul with
the (T, T) lower-triangular Toeplitz matrix of powers of a per state (what a CPU does fastest);
the chunks' carries obey the same recurrence with a^T, solved by the same function on J steps.
Powers come from at most T multiplications, never from a cumulative product over the whole
sequence, so nothing over- or underflows at long L.

Resets (``reset``: documents packed in one row start from zero): a chunk without a document start
keeps the Toeplitz matmul; only the chunks holding one (at most one per document) are rescanned by
doubling with the transition zeroed at their starts (exact, no subtraction of an earlier document's
sum); the carry entering a chunk is dropped from its first start on, and the chunks' carries obey the
same recurrence with a^T reset wherever a chunk holds a start — the same function, one level up.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .scan import _OPS, _doubling, check_reset

CHUNK = 32  # T: the matmul costs ∝ T, the carry levels ∝ log_T L; 16–64 measured alike on CPU


def _powers(a: Tensor, T: int) -> Tensor:
    """a^k for k = 0..T, shape (n, T + 1), by repeated multiplication (T ≤ CHUNK steps)."""
    out = [torch.ones_like(a), a]
    for _ in range(T - 1):
        out.append(out[-1] * a)
    return torch.stack(out, -1)  # (n, T + 1)


def _toeplitz(p: Tensor, T: int) -> Tensor:
    """(n, T, T) with entry [t, s] = a^(t−s) for t ≥ s, else 0."""
    lag = torch.arange(T, device=p.device)
    lag = lag[:, None] - lag[None, :]  # (T, T)
    return p[:, lag.clamp(min=0)] * (lag >= 0)  # (n, T, T)


def _chunk_sums(M: Tensor, x: Tensor) -> Tensor:
    """Σ_s M[n, t, s] x[k, s, n] -> (k, T, n). Complex inputs go through one real matmul with
    the block matrix [[Re M, −Im M], [Im M, Re M]] (CPU complex bmm is slow, in backward most)."""
    if not x.is_complex():
        return (M @ x.permute(2, 1, 0)).permute(2, 1, 0)  # (k, T, n)
    k, T, n = x.shape
    Mr, Mi = M.real, M.imag  # (n, T, T)
    big = torch.cat([torch.cat([Mr, -Mi], 2), torch.cat([Mi, Mr], 2)], 1)  # (n, 2T, 2T)
    xr = torch.view_as_real(x).permute(2, 3, 1, 0).reshape(n, 2 * T, k)  # (n, [re; im]·T, k)
    y = (big @ xr).reshape(n, 2, T, k).permute(3, 2, 0, 1)  # (k, T, n, 2)
    return torch.view_as_complex(y.contiguous())  # (k, T, n)


def _restart(local: Tensor, bp: Tensor, a: Tensor, r: Tensor) -> Tensor:
    """The chunks holding a document start, rescanned with a zeroed there.

    local: (B, J, T, n) zero-start chunk states; bp: (B, J·T, n) inputs; a: (n,); r: (B, J, T) starts.
    Returns local with those chunks replaced (the others untouched)."""
    Bsz, J, T, n = local.shape
    rows = r.reshape(Bsz * J, T)
    idx = torch.nonzero(rows.any(-1))[:, 0]  # chunks with a start
    if not len(idx):
        return local
    rk = rows[idx]  # (k, T)
    ak = a * (~rk).to(a.dtype)[..., None]  # (k, T, n): the transition zeroed at each start
    hk = _doubling(ak, bp.reshape(Bsz * J, T, n)[idx], _OPS["diag"])[1]  # (k, T, n)
    return local.reshape(Bsz * J, T, n).index_copy(0, idx, hk).reshape(Bsz, J, T, n)


def _scan(a: Tensor, b: Tensor, h0: Tensor | None, reset: Tensor | None = None) -> Tensor:
    """a: (n,), b: (B, L, n), h0: (B, n) or None, reset: (B, L) bool or None -> all states (B, L, n)."""
    Bsz, L, n = b.shape
    T = min(CHUNK, L)
    J = math.ceil(L / T)
    p = _powers(a, T)  # (n, T + 1)
    bp = torch.nn.functional.pad(b, (0, 0, 0, J * T - L))  # (B, J·T, n)
    local = _chunk_sums(_toeplitz(p, T), bp.reshape(Bsz * J, T, n)).reshape(Bsz, J, T, n)  # (B, J, T, n)
    keep: Tensor | None = None  # (B, J, T): no start in the chunk up to t (the carry still reaches t)
    chunk_reset: Tensor | None = None  # (B, J): the chunk holds a start (its carry recurrence restarts)
    if reset is not None:
        r = F.pad(reset, (0, J * T - L), value=False).reshape(Bsz, J, T)
        local = _restart(local, bp, a, r)
        keep = torch.cumsum(r, -1) == 0
        chunk_reset = r.any(-1)
    if J == 1 and h0 is None:
        return local.reshape(Bsz, J * T, n)[:, :L]
    last = local[:, :, -1]  # (B, J, n): each chunk's own final state
    if J == 1:
        assert h0 is not None  # one chunk without h0 returned above
        carry_in = h0[:, None]  # (B, 1, n)
    else:
        carries = _scan(p[:, T], last, h0, chunk_reset)  # (B, J, n): state after each chunk
        first = h0[:, None] if h0 is not None else torch.zeros_like(last[:, :1])
        carry_in = torch.cat([first, carries[:, :-1]], 1)  # (B, J, n): state entering each chunk
    carried = p[:, 1:].T * carry_in[:, :, None]  # (B, J, T, n): a^(t+1) h_in
    h = local + (carried if keep is None else carried * keep[..., None])  # (B, J, T, n)
    return h.reshape(Bsz, J * T, n)[:, :L]


def scan_chunked(a: Tensor, b: Tensor, h0: Tensor | None = None, *, structure: str = "diag",
                 reset: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``scan_naive``'s signature for a time-invariant diagonal ``a`` (size 1 along batch and time).

    Args:
        a: transitions broadcastable to (B, L, *S) with a.shape[0] == a.shape[1] == 1.
        b: inputs (B, L, *S); real or complex.
        h0: initial state (B, *S) or None.
        structure: must be "diag".
        reset: (B, L) bool or None: True at each document's first step, where h_{t−1} is dropped
            (packed documents in one row; a stays time-invariant, the resets are handled per chunk).

    Returns:
        h_all (B, L, *S) and h_last (B, *S).
    """
    if structure != "diag":
        raise ValueError(f"scan_chunked handles structure 'diag' only, not {structure!r}")
    if b.dim() < 2 or b.shape[1] < 1:
        raise ValueError(f"scan needs b of shape (B, L, *S) with L ≥ 1, got {tuple(b.shape)}")
    if a.dim() > b.dim() or any(s != 1 for s in a.shape[: max(0, a.dim() - b.dim() + 2)]):
        raise ValueError(f"scan_chunked needs a time- and batch-invariant a (shape (1, 1, *S)), got {tuple(a.shape)}")
    reset = check_reset(reset, b)
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), h0.dtype if h0 is not None else a.dtype)
    Bsz, L, S = b.shape[0], b.shape[1], b.shape[2:]
    a_flat = torch.broadcast_to(a.to(dtype), (1, 1, *S)).reshape(-1)  # (n,)
    h0_flat = None if h0 is None else torch.broadcast_to(h0.to(dtype), (Bsz, *S)).reshape(Bsz, -1)
    h = _scan(a_flat, b.to(dtype).reshape(Bsz, L, -1), h0_flat, reset).reshape(Bsz, L, *S)
    return h, h[:, -1]

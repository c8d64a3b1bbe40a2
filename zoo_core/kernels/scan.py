"""Linear recurrences ``h_t = a_t ⊗ h_{t−1} + b_t``, t = 0..L−1, with ``h_{−1} = h0`` (or 0).

Dimensions:
    B: batch.
    L: sequence length.
    S: any number of state dimensions (for example H, N), written *S.
    T: chunk length of the parallel scan (``CHUNK``).
    J: number of chunks, ceil(L / T).

Structures (``⊗`` and the shapes of a and b):
    "diag": elementwise; b (B, L, *S), a broadcastable to (B, L, *S), h0 (B, *S).
    "block2x2": 2×2 matrix–vector product; b (B, L, *S, 2), a broadcastable to (B, L, *S, 2, 2),
        h0 (B, *S, 2). Blocks are never diagonalised, so defective ones such as [[1, Δ], [0, 1]]
        are exact.

Resets (packed batches, ``zoo_core.packing``): ``reset`` (B, L) bool marks the steps where a new
document starts; there the previous state is dropped (``h_t = b_t``, as if ``a_t`` were zero), so
every document runs from the zero state inside one call. The transition is zeroed explicitly,
never through ``log a = −inf`` (cumulative sums of logs would give inf − inf = NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ..packing import check_step_mask

CHUNK = 8  # T: 4–8 measured fastest on CPU (forward + backward) among 4..256


class _Ops(NamedTuple):
    """The algebra of one structure: a ⊗ h, a_later ∘ a_earlier, identity transitions."""

    apply: Callable[[Tensor, Tensor], Tensor]
    compose: Callable[[Tensor, Tensor], Tensor]
    identity: Callable[[tuple[int, ...], Tensor], Tensor]
    a_shape: Callable[[torch.Size], torch.Size]
    min_dim: int


def _mul(a: Tensor, h: Tensor) -> Tensor:
    return a * h


def _matvec(a: Tensor, h: Tensor) -> Tensor:
    return a[..., 0] * h[..., :1] + a[..., 1] * h[..., 1:]  # (..., 2): columns of a times h


def _matmul(later: Tensor, earlier: Tensor) -> Tensor:
    return later @ earlier  # (..., 2, 2)


def _ones(shape: tuple[int, ...], like: Tensor) -> Tensor:
    return torch.ones(shape, dtype=like.dtype, device=like.device)


def _eyes(shape: tuple[int, ...], like: Tensor) -> Tensor:
    return torch.eye(2, dtype=like.dtype, device=like.device).expand(shape)


_OPS = {
    "diag": _Ops(_mul, _mul, _ones, lambda s: s, min_dim=2),
    "block2x2": _Ops(_matvec, _matmul, _eyes, lambda s: s + (2,), min_dim=3),
}


def _broadcasts(shape: torch.Size, target: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


def _prepare(
    a: Tensor, b: Tensor, h0: Tensor | None, structure: str
) -> tuple[Tensor, Tensor, Tensor | None, _Ops]:
    """Check shapes, broadcast a to its full shape and cast everything to one dtype."""
    if structure not in _OPS:
        raise ValueError(f"unknown scan structure {structure!r}; allowed: {', '.join(_OPS)}")
    ops = _OPS[structure]
    if b.dim() < ops.min_dim or b.shape[1] < 1 or (structure == "block2x2" and b.shape[-1] != 2):
        want = "(B, L, *S)" if structure == "diag" else "(B, L, *S, 2)"
        raise ValueError(
            f"{structure} scan needs b of shape {want} with L ≥ 1, got {tuple(b.shape)}"
        )
    a_shape = ops.a_shape(b.shape)
    if not _broadcasts(a.shape, a_shape):
        raise ValueError(f"a of shape {tuple(a.shape)} does not broadcast to {tuple(a_shape)}")
    dtype = torch.promote_types(a.dtype, b.dtype)
    if h0 is not None:
        h_shape = b.shape[:1] + b.shape[2:]
        if not _broadcasts(h0.shape, h_shape):
            raise ValueError(
                f"h0 of shape {tuple(h0.shape)} does not broadcast to {tuple(h_shape)}"
            )
        dtype = torch.promote_types(dtype, h0.dtype)
        h0 = torch.broadcast_to(h0.to(dtype), h_shape)
    return torch.broadcast_to(a.to(dtype), a_shape), b.to(dtype), h0, ops


def check_reset(reset: Tensor | None, b: Tensor) -> Tensor | None:
    """Refuse a ``reset`` that is not a (B, L) bool mask of b's batch and length."""
    return check_step_mask(reset, tuple(b.shape[:2]), name="reset", who="scan")


def _zero_at(a: Tensor, reset: Tensor | None) -> Tensor:
    """a (B, L, ...) at full shape with the transition zeroed where ``reset`` is set (the state restarts)."""
    if reset is None:
        return a
    keep = (~reset).to(a.dtype)  # (B, L)
    return a * keep.reshape(*keep.shape, *([1] * (a.dim() - 2)))


def scan_naive(
    a: Tensor, b: Tensor, h0: Tensor | None = None, *, structure: str = "diag", reset: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Reference: the plain loop over t.

    Args:
        a: transitions, broadcastable to (B, L, *S) ("diag") or (B, L, *S, 2, 2) ("block2x2").
        b: inputs, (B, L, *S) or (B, L, *S, 2); real or complex.
        h0: initial state (B, *S) or (B, *S, 2); None means zero.
        structure: "diag" or "block2x2".
        reset: (B, L) bool or None: True at each document's first step, where h_{t−1} is dropped.

    Returns:
        h_all: (B, L, *S[, 2]) every state; h_last: (B, *S[, 2]) the final state.
    """
    reset = check_reset(reset, b)
    a, b, h, ops = _prepare(a, b, h0, structure)
    a = _zero_at(a, reset)
    if h is None:
        h = torch.zeros_like(b[:, 0])  # (B, *S[, 2])
    hs = []
    # unbind, not b[:, t]: the backward of L slices would write L zero-filled full-size gradients
    for a_t, b_t in zip(a.unbind(1), b.unbind(1), strict=True):
        h = ops.apply(a_t, h) + b_t  # (B, *S[, 2])
        hs.append(h)
    return torch.stack(hs, 1), h


def _doubling(a: Tensor, b: Tensor, ops: _Ops) -> tuple[Tensor, Tensor]:
    """Hillis–Steele inclusive scan along dim 1: prefix transitions and zero-start states."""
    d = 1
    while d < b.shape[1]:
        # (a_i, b_i) • (a_j, b_j) = (a_j a_i, a_j b_i + b_j) with i = t − d, j = t.
        b = torch.cat([b[:, :d], ops.apply(a[:, d:], b[:, :-d]) + b[:, d:]], 1)  # (B, L, ...)
        a = torch.cat([a[:, :d], ops.compose(a[:, d:], a[:, :-d])], 1)  # (B, L, ...)
        d *= 2
    return a, b


def _pad(a: Tensor, b: Tensor, n: int, ops: _Ops) -> tuple[Tensor, Tensor]:
    """Append n identity steps (a = 1 or I, b = 0) along time."""
    if n == 0:
        return a, b
    a_pad = ops.identity((a.shape[0], n) + tuple(a.shape[2:]), a)  # (B, n, ...)
    b_pad = b.new_zeros((b.shape[0], n) + tuple(b.shape[2:]))  # (B, n, ...)
    return torch.cat([a, a_pad], 1), torch.cat([b, b_pad], 1)


def _chunked(a: Tensor, b: Tensor, ops: _Ops) -> Tensor:
    """Two-level scan along dim 1: doubling inside chunks, recursion over the chunk totals."""
    batch, L = b.shape[:2]
    T = max(CHUNK, 2)
    if L <= T:
        return _doubling(a, b, ops)[1]
    J = math.ceil(L / T)
    a, b = _pad(a, b, J * T - L, ops)  # (B, J·T, ...)
    a_in, h_in = _doubling(
        a.reshape((batch * J, T) + a.shape[2:]), b.reshape((batch * J, T) + b.shape[2:]), ops
    )  # (B·J, T, ...)
    a_in = a_in.reshape((batch, J, T) + a.shape[2:])  # (B, J, T, ...)
    h_in = h_in.reshape((batch, J, T) + b.shape[2:])  # (B, J, T, ...)
    ends = _chunked(a_in[:, :, -1], h_in[:, :, -1], ops)  # (B, J, ...): state at each chunk end
    carry = torch.cat([torch.zeros_like(ends[:, :1]), ends[:, :-1]], 1)  # (B, J, ...) entering
    h = h_in + ops.apply(a_in, carry[:, :, None])  # (B, J, T, ...)
    return h.reshape((batch, J * T) + b.shape[2:])[:, :L]  # (B, L, ...)


def scan_parallel(
    a: Tensor, b: Tensor, h0: Tensor | None = None, *, structure: str = "diag", reset: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Chunked log-depth scan; same arguments and results as ``scan_naive``.

    Chunks of ``CHUNK`` steps are scanned by doubling, the chunk totals by the same function
    recursively (depth log_T L), then each chunk adds its incoming carry. No divisions, so it
    neither over- nor underflows at long L. h0 is folded in as ``b_0 ← b_0 + a_0 ⊗ h0``.

    Args:
        a: transitions, broadcastable to (B, L, *S) ("diag") or (B, L, *S, 2, 2) ("block2x2").
        b: inputs, (B, L, *S) or (B, L, *S, 2); real or complex.
        h0: initial state (B, *S) or (B, *S, 2); None means zero.
        structure: "diag" or "block2x2".
        reset: (B, L) bool or None: True at each document's first step, where h_{t−1} is dropped
            (the transition is zeroed there, so no prefix product crosses a document start).

    Returns:
        h_all: (B, L, *S[, 2]) every state; h_last: (B, *S[, 2]) the final state.
    """
    reset = check_reset(reset, b)
    a, b, h0, ops = _prepare(a, b, h0, structure)
    a = _zero_at(a, reset)
    if h0 is not None:
        b = torch.cat([b[:, :1] + ops.apply(a[:, :1], h0[:, None]), b[:, 1:]], 1)  # (B, L, ...)
    h_all = _chunked(a, b, ops)  # (B, L, *S[, 2])
    return h_all, h_all[:, -1]

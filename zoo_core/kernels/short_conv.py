"""The short causal depthwise convolution of Mamba, Mamba-2, RG-LRU and Gated DeltaNet, with its
carried past: ``y_t = bias + Σ_{j<K} w_j · s_{t+j}`` over ``s = [past, x]``, past the last K−1 inputs.

One place for what each of those cores wrote for itself: the parallel form (``causal_conv``, a
whole piece after the past) and the one-step form (``causal_conv_step``, for decoding), which
must agree so that step-by-step decoding equals the parallel forward and a sequence split in
pieces equals it whole. ``causal_conv_naive`` is the explicit loop both are tested against.

Dimensions:
    B: batch.
    L: length of the piece.
    C: channels (one filter each: depthwise).
    K: filter width; the carried past holds K−1 inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from ..packing import Segments


def _check(x: Tensor, weight: Tensor, bias: Tensor | None, past: Tensor | None, step: bool) -> None:
    """Shapes, named: a mismatch would otherwise surface as conv1d's groups or a broadcast error."""
    want = "(B, C)" if step else "(B, L, C)"
    if x.dim() != (2 if step else 3):
        raise ValueError(f"x must be {want}, got shape {tuple(x.shape)}")
    C = x.shape[-1]
    if weight.dim() != 3 or weight.shape[:2] != (C, 1):
        raise ValueError(f"weight must be conv1d's depthwise (C, 1, K) with C = {C} channels of x, got "
                         f"{tuple(weight.shape)}; pass the nn.Conv1d(C, C, K, groups=C) weight")
    if bias is not None and tuple(bias.shape) != (C,):
        raise ValueError(f"bias must be (C,) = ({C},), got {tuple(bias.shape)}; or None for no bias")
    want_past = (x.shape[0], C, weight.shape[-1] - 1)
    if past is not None and tuple(past.shape) != want_past:
        raise ValueError(f"past must be (B, C, K−1) = {want_past}, the last K−1 inputs, got {tuple(past.shape)}; "
                         "start from zeros (past=None in causal_conv) or the past a call returned")


def causal_conv(x: Tensor, weight: Tensor, bias: Tensor | None, past: Tensor | None = None, *,
                channels_last: bool = False) -> tuple[Tensor, Tensor]:
    """The causal depthwise conv of a piece ``x`` after ``past``, and the past after it.

    Args:
        x: (B, L, C) input; L may be 0 or shorter than K−1.
        weight: (C, 1, K), an ``nn.Conv1d(C, C, K, groups=C)`` weight.
        bias: (C,) or None.
        past: (B, C, K−1), the K−1 inputs before x (oldest first), cast to x's dtype; None means zeros
            (the start of a sequence).
        channels_last: join past and x time-major, (B, K−1+L, C), so conv1d reads a channels-last
            view: its CPU backward is an order of magnitude faster there than on the channels-first
            (B, C, K−1+L) join (Mamba-2 measured 60% of a whole fwd+bwd at L = 4096). The two give
            equal values but not always equal bits, so each core keeps the layout it was trained with.

    Returns:
        y: (B, L, C), a transposed view of conv1d's output (no copy);
        new_past: (B, C, K−1), the last K−1 inputs of ``[past, x]``, a copy (no view pins the join).
    """
    _check(x, weight, bias, past, step=False)
    B, L, C = x.shape
    K = weight.shape[-1]
    past = x.new_zeros(B, C, K - 1) if past is None else past.to(x.dtype)
    if L == 0:  # conv1d refuses an input shorter than its filter: nothing to convolve, the past passes through
        return x.new_zeros(B, 0, C), past
    if channels_last:
        seq = torch.cat([past.transpose(1, 2), x], 1)  # (B, K−1+L, C)
        y = F.conv1d(seq.transpose(1, 2), weight, bias, groups=C).transpose(1, 2)  # (B, L, C)
        return y, seq[:, L:].transpose(1, 2).contiguous()
    seq = torch.cat([past, x.transpose(1, 2)], -1)  # (B, C, K−1+L)
    y = F.conv1d(seq, weight, bias, groups=C).transpose(1, 2)  # (B, L, C)
    return y, seq[..., L:].contiguous()


def causal_conv_packed(x: Tensor, weight: Tensor, bias: Tensor | None, segments: Segments) -> tuple[Tensor, Tensor]:
    """``causal_conv`` over packed documents (``zoo_core.packing``): every document's window starts at
    its own first step (the inputs of the document before it never enter), as each document alone
    from a zero past.

    Args:
        x: (B, L, C) packed input; weight (C, 1, K); bias (C,) or None.
        segments: the documents' layout.

    Returns:
        y: (B, L, C), ``y_t = bias + Σ_{d<K} w_{K−1−d} · x_{t−d} · [t−d in t's document]``;
        pasts: (N, C, K−1), each document's last K−1 inputs (zeros before its start), its conv state.
    """
    _check(x, weight, bias, None, step=False)
    segments.check(x)
    K = weight.shape[-1]
    w = weight[:, 0].to(x.dtype)  # (C, K)
    y = x * w[:, K - 1]
    pos = segments.position[..., None]  # (B, L, 1)
    for d in range(1, K):  # the input d steps back, where it lies in the same document
        shifted = F.pad(x, (0, 0, d, 0))[:, : x.shape[1]]
        y = y + torch.where(pos >= d, shifted, torch.zeros((), dtype=x.dtype, device=x.device)) * w[:, K - 1 - d]
    if bias is not None:
        y = y + bias.to(x.dtype)
    back = torch.arange(K - 2, -1, -1, device=x.device)  # K−2 .. 0 steps before the end, oldest first
    t = segments.doc_end[:, None] - back  # (N, K−1)
    inside = (t >= segments.doc_start[:, None])[..., None]
    pasts = torch.where(inside, x[segments.doc_row[:, None], t.clamp(min=0)], torch.zeros((), dtype=x.dtype, device=x.device))
    return y, pasts.transpose(1, 2).contiguous()  # (N, C, K−1)


def causal_conv_step(x_t: Tensor, weight: Tensor, bias: Tensor | None, past: Tensor) -> tuple[Tensor, Tensor]:
    """One step of ``causal_conv``: x_t (B, C) after past (B, C, K−1) -> y_t (B, C), the new past (B, C, K−1).

    The window times the filter, summed: at one step this is several times cheaper than conv1d's setup."""
    _check(x_t, weight, bias, past, step=True)
    window = torch.cat([past.to(x_t.dtype), x_t[..., None]], -1)  # (B, C, K)
    y = (window * weight[:, 0]).sum(-1)  # (B, C)
    if bias is not None:
        y = y + bias
    return y, window[..., 1:].contiguous()


def causal_conv_naive(x: Tensor, weight: Tensor, bias: Tensor | None, past: Tensor | None = None, *,
                      channels_last: bool = False) -> tuple[Tensor, Tensor]:
    """Reference for ``causal_conv`` (same signature; ``channels_last`` changes nothing here): the
    explicit sum over time and taps, ``y_t = bias + Σ_j w_j s_{t+j}`` with ``s = [past, x]``."""
    _check(x, weight, bias, past, step=False)
    B, L, C = x.shape
    K = weight.shape[-1]
    past = x.new_zeros(B, C, K - 1) if past is None else past.to(x.dtype)
    s = torch.cat([past.transpose(1, 2), x], 1)  # (B, K−1+L, C)
    ys = []
    for t in range(L):
        y_t = x.new_zeros(B, C) if bias is None else bias.to(x.dtype).expand(B, C)
        for j in range(K):
            y_t = y_t + weight[:, 0, j] * s[:, t + j]
        ys.append(y_t)
    y = torch.stack(ys, 1) if ys else x.new_zeros(B, 0, C)
    return y, s[:, L:].transpose(1, 2).contiguous()

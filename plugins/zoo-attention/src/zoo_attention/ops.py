"""The two backends of the ``attention`` op (``zoo_core.protocols.AttentionOp``), same signature.

Letters: B batch, Hq query heads, Hk key/value heads (Hq = G·Hk), Lq queries, Lk keys, D head_dim.

    out = softmax(q kᵀ · scale + M) v,   M = 0 where ``mask`` is True, −∞ elsewhere

``attention_naive`` writes that out (the reference every other backend is compared against);
``attention_sdpa`` calls ``torch.nn.functional.scaled_dot_product_attention``, which picks a fused
kernel (flash, memory-efficient, cuDNN) where one serves the inputs, else PyTorch's own math path.
A query row with no True entry (a padded query whose window holds only padding keys) gives 0 in
both backends (sdpa's own rule since torch 2.5), never NaN.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo_core.logs import log_once

log = logging.getLogger("zoo_attention.ops")

_TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
_SDPA_GQA = _TORCH >= (2, 5)  # enable_gqa= appeared in torch 2.5


def _expand_kv(x: Tensor, groups: int) -> Tensor:
    """(B, Hk, L, D) -> (B, Hk·groups, L, D): key/value head j serves query heads j·groups … (j+1)·groups − 1."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _check(q: Tensor, k: Tensor, mask: Tensor | None, causal: bool) -> int:
    """The group size G = Hq / Hk, after the checks both backends share."""
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"attention: {q.shape[1]} query heads cannot share {k.shape[1]} key/value heads in equal groups")
    if causal and (mask is not None or q.shape[2] != k.shape[2]):
        raise ValueError("attention: causal=True is the square mask j ≤ i; pass mask=None and as many keys as queries")
    return q.shape[1] // k.shape[1]


def attention_naive(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, causal: bool = False,
                    scale: float) -> Tensor:
    """softmax(q kᵀ · scale + M) v written out: scores (B, Hq, Lq, Lk), a masked softmax, a matmul."""
    g = _check(q, k, mask, causal)
    k, v = _expand_kv(k, g), _expand_kv(v, g)  # (B, Hq, Lk, D)
    scores = (q @ k.transpose(-1, -2)) * scale  # (B, Hq, Lq, Lk)
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is None:
        return torch.softmax(scores, dim=-1) @ v  # (B, Hq, Lq, D)
    # A row with no readable key (a padded query whose window holds only padding) gives 0, as
    # sdpa does, not NaN: a NaN there would reach valid queries of the next layer through 0·NaN
    # in P V, and every gradient. The row's scores are zeroed before the softmax, so no NaN is
    # made in the backward either.
    some = mask.any(-1, keepdim=True)  # (B, ·, Lq, 1)
    scores = scores.masked_fill(~mask, float("-inf")).masked_fill(~some, 0.0)
    return torch.softmax(scores, dim=-1).masked_fill(~some, 0.0) @ v  # (B, Hq, Lq, D)


def attention_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, causal: bool = False,
                   scale: float) -> Tensor:
    """``scaled_dot_product_attention``: fused kernels where they serve (is_causal without a mask is
    flash-eligible on GPUs), grouped heads natively (``enable_gqa``) where torch has it."""
    g = _check(q, k, mask, causal)
    if g > 1 and not _SDPA_GQA:
        log_once(log, logging.INFO, "sdpa-gqa", "attention sdpa: torch %s has no enable_gqa; key/value heads are "
                 "repeated to the query heads (more memory; torch >= 2.5 shares them)", torch.__version__)
        k, v, g = _expand_kv(k, g), _expand_kv(v, g), 1
    extra = {"enable_gqa": True} if g > 1 else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, **extra)

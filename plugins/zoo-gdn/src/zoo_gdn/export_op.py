"""``zoo::gated_delta_chunked``: Gated DeltaNet's chunk form as one opaque op for ``torch.export``
(dynamic length). See ``zoo_core.kernels.export_ops``; ``ops.gated_delta_chunked`` calls it only
while exporting.
"""

# No ``from __future__ import annotations``: torch.library reads the op schema from real annotations.

from typing import Optional

import torch
from torch import Tensor

from zoo_core.kernels.export_ops import refuse_backward


@torch.library.custom_op("zoo::gated_delta_chunked", mutates_args=())
def gated_delta_chunked_op(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, h0: Optional[Tensor], chunk_size: int,
                           reset: Optional[Tensor], ends: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """o (B, L, H, V) and the final states (B, H, K, V), or with ``ends`` the states after those steps, both in
    the compute dtype (float32 at least: the composition casts v before its final ``o.to(v.dtype)``)."""
    from .ops import gated_delta_chunked_composed as gated_delta_chunked  # the Python composition, never this op again

    o, S = gated_delta_chunked(q, k, v, beta, g, h0, chunk_size=chunk_size, reset=reset, ends=ends)
    return o.contiguous(), S.contiguous()


@gated_delta_chunked_op.register_fake
def _fake(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, h0: Optional[Tensor], chunk_size: int,
          reset: Optional[Tensor], ends: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    from .ops import _compute_dtype

    B, L, H, K = q.shape
    V = v.shape[-1]
    dtype = _compute_dtype(q, k, v, beta, g)
    rows = B if ends is None else torch.library.get_ctx().new_dynamic_size()  # how many ends: data-dependent
    return v.new_empty(B, L, H, V, dtype=dtype), q.new_empty(rows, H, K, V, dtype=dtype)


refuse_backward(gated_delta_chunked_op, "zoo::gated_delta_chunked")

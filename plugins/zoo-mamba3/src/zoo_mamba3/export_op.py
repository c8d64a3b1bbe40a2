"""``zoo::trap_scan_chunked``: Mamba-3's chunked trapezoidal scan as one opaque op for ``torch.export``
(dynamic length). See ``zoo_core.kernels.export_ops``; ``scan.trap_scan_chunked`` calls it only
while exporting.
"""

# No ``from __future__ import annotations``: torch.library reads the op schema from real annotations.

from typing import Optional

import torch
from torch import Tensor

from zoo_core.kernels.export_ops import refuse_backward


@torch.library.custom_op("zoo::trap_scan_chunked", mutates_args=())
def trap_scan_chunked_op(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, lam: Optional[Tensor], h0: Optional[Tensor],
                         x_prev: Optional[Tensor], B_prev: Optional[Tensor], chunk_size: int, reset: Optional[Tensor],
                         ends: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """y (Bt, L, H, P) and the final states (Bt, H, P, N), or with ``ends`` the states after those steps."""
    from .scan import trap_scan_chunked_composed as trap_scan_chunked  # the Python composition, never this op again

    y, h = trap_scan_chunked(x, dt, A, B, C, lam, h0, x_prev, B_prev, chunk_size=chunk_size, reset=reset, ends=ends)
    return y.contiguous(), h.contiguous()


@trap_scan_chunked_op.register_fake
def _fake(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, lam: Optional[Tensor], h0: Optional[Tensor],
          x_prev: Optional[Tensor], B_prev: Optional[Tensor], chunk_size: int, reset: Optional[Tensor],
          ends: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    from .scan import _compute_dtype

    Bt, L, H, P = x.shape
    N = B.shape[-1]
    ct = _compute_dtype(x)
    rows = Bt if ends is None else torch.library.get_ctx().new_dynamic_size()  # how many ends: data-dependent
    return x.new_empty(Bt, L, H, P, dtype=ct), x.new_empty(rows, H, P, N, dtype=ct)


refuse_backward(trap_scan_chunked_op, "zoo::trap_scan_chunked")

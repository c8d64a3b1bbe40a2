"""``zoo::ssd_chunked``: Mamba-2's chunked SSD as one opaque op for ``torch.export`` (dynamic length).

See ``zoo_core.kernels.export_ops``; ``ssd.ssd_chunked`` calls it only while exporting.
"""

# No ``from __future__ import annotations``: torch.library reads the op schema from real annotations.

from functools import reduce
from typing import Optional

import torch
from torch import Tensor

from zoo_core.kernels.export_ops import refuse_backward


@torch.library.custom_op("zoo::ssd_chunked", mutates_args=())
def ssd_chunked_op(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int, h0: Optional[Tensor],
                   reset: Optional[Tensor], ends: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """y (Bt, L, Hh, P) and the final states (Bt, Hh, P, N), or with ``ends`` the states after those steps."""
    from .ssd import ssd_chunked_composed as ssd_chunked  # the Python composition, never this op again

    y, h = ssd_chunked(x, dt, A, B, C, chunk_size, h0, reset=reset, ends=ends)
    return y.contiguous(), h.contiguous()


@ssd_chunked_op.register_fake
def _fake(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int, h0: Optional[Tensor],
          reset: Optional[Tensor], ends: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    Bt, L, Hh, P = x.shape
    N = B.shape[-1]
    dtype = reduce(torch.promote_types, [t.dtype for t in (x, dt, A, B, C)])
    rows = Bt if ends is None else torch.library.get_ctx().new_dynamic_size()  # how many ends: data-dependent
    return x.new_empty(Bt, L, Hh, P, dtype=dtype), x.new_empty(rows, Hh, P, N, dtype=dtype)


refuse_backward(ssd_chunked_op, "zoo::ssd_chunked")

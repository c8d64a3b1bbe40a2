"""``zoo::lrcssm_sequential``: LrcSSM's exact loop over time as one opaque op for ``torch.export``.

Under compile and export LrcSSM runs its sequential loop (Newton's stopping test is data-dependent);
traced, that loop unrolls over L and export pins the length. Taken while exporting only (see
``zoo_core.kernels.export_ops``), this op is one node with symbolic sizes whose run time is the same
loop, so an exported forward takes any length. Eager and ``torch.compile`` keep the traced loop.
"""

# No ``from __future__ import annotations``: torch.library reads the op schema from real annotations.

from typing import Optional

import torch
from torch import Tensor

from zoo_core.kernels.export_ops import refuse_backward

from .core import euler_cell


@torch.library.custom_op("zoo::lrcssm_sequential", mutates_args=())
def lrcssm_sequential_op(pf: Tensor, pz: Tensor, h0: Tensor, keep: Optional[Tensor], sigma: Tensor, mu: Tensor,
                         w: Tensor, h: Tensor, e_bias: Tensor, e_kernel: Tensor, e_shift: Optional[Tensor],
                         vleak: Tensor, dt: float) -> tuple[Tensor, Tensor]:
    """The trajectory (B, L, D) and the last state (B, D) from h0 (B, D); ``keep`` (B, L, 1) zeroes the
    state entering each packed document's start."""
    x, xs = h0, []
    for t in range(pf.shape[1]):
        x_in = x if keep is None else x * keep[:, t]
        x = euler_cell(x_in, pf[:, t], pz[:, t], sigma, mu, w, h, e_bias, e_kernel, e_shift, vleak, dt)
        xs.append(x)
    states = torch.stack(xs, 1) if xs else pf.new_empty(pf.shape)
    return states, x.clone()


@lrcssm_sequential_op.register_fake
def _fake(pf: Tensor, pz: Tensor, h0: Tensor, keep: Optional[Tensor], sigma: Tensor, mu: Tensor, w: Tensor,
          h: Tensor, e_bias: Tensor, e_kernel: Tensor, e_shift: Optional[Tensor], vleak: Tensor,
          dt: float) -> tuple[Tensor, Tensor]:
    return pf.new_empty(pf.shape), h0.new_empty(h0.shape)  # contiguous, as the real outputs


refuse_backward(lrcssm_sequential_op, "zoo::lrcssm_sequential")

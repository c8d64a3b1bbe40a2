"""The gated RMSNorm of the SSD mixers (Mamba-2, Mamba-3): mamba_ssm's ``RMSNormGated``.

    norm_before_gate=False:  RMSNorm_groups(y ⊙ SiLU(z)) · w      (Mamba-2's and Mamba-3's default)
    norm_before_gate=True:   RMSNorm_groups(y) · w ⊙ SiLU(z)

The RMS is taken over groups of ``group_size`` channels (Di / n_groups), and the whole norm runs
in float32 at least, as the references do.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GatedRMSNorm(nn.Module):
    """RMSNorm over groups of ``group_size`` channels, gated by SiLU(z) before or after the norm."""

    def __init__(self, d: int, group_size: int, eps: float = 1e-5, norm_before_gate: bool = False, **kw: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, **kw))
        self.group_size, self.eps, self.norm_before_gate = group_size, eps, norm_before_gate

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        """y, z (..., d) -> (..., d) in float32 at least."""
        work = torch.promote_types(y.dtype, torch.float32)
        y, gate = y.to(work), F.silu(z.to(work))
        if not self.norm_before_gate:
            y = y * gate
        g = y.unflatten(-1, (-1, self.group_size))  # (..., G, d/G)
        y = (g * torch.rsqrt(g.square().mean(-1, keepdim=True) + self.eps)).flatten(-2) * self.weight.to(work)
        if self.norm_before_gate:
            y = y * gate
        return y

"""The streaming step of a diagonal complex LTI core in real arithmetic, from cached constants.

Why: a core's ``step`` is what an edge device runs, token after token. For S4D, S5 and LRU it is
h' = ā ⊙ h + B̄ x_t, y = Re(C h') + D ⊙ x_t with ā, B̄, C complex and constant between parameter
updates. Re-discretising them on every call was about a third of the eager step, and complex
tensors have no ONNX translation. Here the constants are computed once (``CoreBase.cached``: reused
while the parameters are unchanged and no gradient is asked for) and kept as real views ``(..., 2)``;
the step is written in real arithmetic on the state's real view, so the same code serves the eager
step (complex state, viewed as real for free) and the exported stream model (whose state inputs are
those real views: ``zoo_core.export``).

Shapes: B batch, H channels (d_model), P states.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class DiagStream:
    """h' = ā ⊙ h + u(x), y = Σ_p Re(c_p h'_p) + d ⊙ x, complex tensors as real views (..., 2).

    Attributes:
        a: the decays ā, (P, 2) (shared across channels: S5, LRU) or (H, P, 2) (per channel: S4D).
        b: the input map: per channel (H, P, 2), u = b ⊙ x[..., None]; else dense (P, H, 2), u = x @ bᵀ.
        c: the readout (H, P, 2): y_h = Σ_p (c_re h_re − c_im h_im).
        d: the skip (H,).
    """

    a: Tensor
    b: Tensor
    c: Tensor
    d: Tensor

    @property
    def per_channel(self) -> bool:
        return self.a.dim() == 3

    @staticmethod
    def of(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> DiagStream:
        """From complex ā, B̄, C (or their real views) and real D; contiguous real views, no grad kept apart."""
        a, b, c = (torch.view_as_real(t) if t.is_complex() else t for t in (a, b, c))
        return DiagStream(a, b, c, d)

    def step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """x_t (B, H) real, h the state's real view ((B, H, P, 2) per channel, else (B, P, 2)) ->
        (y (B, H) in the constants' dtype, h' in h's layout)."""
        x = x_t.to(self.d.dtype)
        ar, ai = self.a.unbind(-1)
        br, bi = self.b.unbind(-1)
        hr, hi = h.unbind(-1)
        if self.per_channel:
            ur, ui = br * x[..., None], bi * x[..., None]  # (B, H, P)
        else:
            ur, ui = x @ br.T, x @ bi.T  # (B, P)
        nr = ar * hr - ai * hi + ur
        ni = ar * hi + ai * hr + ui
        cr, ci = self.c.unbind(-1)
        y = (cr * nr - ci * ni).sum(-1) if self.per_channel else nr @ cr.T - ni @ ci.T  # (B, H)
        return y + self.d * x, torch.stack((nr, ni), -1)

    def step_state(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """``step`` for a complex state or its real view, returning the new state in the same form."""
        if h.is_complex():
            y, new = self.step(x_t, torch.view_as_real(h))
            return y, torch.view_as_complex(new)
        return self.step(x_t, h)

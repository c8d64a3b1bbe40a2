"""The streaming step of a diagonal complex LTI core in real arithmetic, from cached constants.

Why: a core's ``step`` is what an edge device runs, token after token. For S4D, S5 and LRU it is
h' = ā ⊙ h + B̄ x_t, y = Re(C h') + D ⊙ x_t with ā, B̄, C complex and constant between parameter
updates. Re-discretising them on every call was about a third of the eager step, and complex
tensors have no ONNX translation. Here the constants are computed once (``CoreBase.cached``: reused
while the parameters are unchanged and no gradient is asked for) and kept as real views ``(..., 2)``;
the step is written in real arithmetic on the state's real view, so the same code serves the eager
step (complex state, viewed as real for free) and the exported stream model (whose state inputs are
those real views: ``zoo_core.export``).

Three forms: ``DiagStream`` (S4D, S5, LRU: a diagonal complex update), ``DPLRStream`` (S4: the
bilinear diagonal-plus-low-rank step) and ``BlockStream`` (LinOSS: real 2×2 oscillator blocks driven
by a complex input map). Each ``step`` works on the state's real view; ``step_state`` takes the
complex state or its real view and returns the new state in the same form.

Shapes: B batch, H channels (d_model), P states (M: S4's half state, K = 2: an oscillator's pair).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .kernels.dplr import StepMatrices


class _Stream:
    """``step_state`` over a real-view ``step``: the complex state is viewed as real (free) and back."""

    def step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def step_complex(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """``step`` on a complex state (the eager one): through its real view unless a form has fewer ops."""
        y, new = self.step(x_t, torch.view_as_real(h))
        return y, torch.view_as_complex(new)

    def step_state(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """``step`` for a complex state or its real view, returning the new state in the same form."""
        return self.step_complex(x_t, h) if h.is_complex() else self.step(x_t, h)


def _real(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Complex tensors as their real views (..., 2); real ones as they are."""
    return tuple(torch.view_as_real(t) if t.is_complex() else t for t in tensors)


@dataclass(frozen=True)
class DiagStream(_Stream):
    """h' = ā ⊙ h + u(x), y = Σ_p Re(c_p h'_p) + d ⊙ x on the state's real view (..., P, 2), in few ops:
    ā ⊙ h is ``same ⊙ h + swap ⊙ flip(h)`` with same = (Re ā, Re ā), swap = (−Im ā, Im ā), and the
    readout one product with signed = (Re c, −Im c). Built by ``of`` from complex ā, B̄, C.

    Attributes:
        same, swap: (P, 2) (decays shared across channels: S5, LRU) or (H, P, 2) (per channel: S4D).
        b: per channel (H, P, 2), u = b ⊙ x; else (H, 2P), u = x @ b viewed as (B, P, 2).
        c: per channel (H, P, 2) signed; else (2P, H), y = h'.flatten(-2) @ c.
        d: the skip (H,).
    """

    same: Tensor
    swap: Tensor
    b: Tensor
    c: Tensor
    d: Tensor
    # the complex forms ``step_complex`` uses (fewer ops on the eager, complex state): ā; per channel B̄ and conj(C)
    a_c: Tensor
    a_r: Tensor  # ā's real view (..., 2), contiguous: what the fused block kernel reads (zoo_core.nn.lean)
    b_c: Tensor | None
    c_conj: Tensor | None

    @property
    def per_channel(self) -> bool:
        return self.same.dim() == 3

    @staticmethod
    def of(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> DiagStream:
        """From ā ((P,) or (H, P)), B̄ ((H, P) per channel, else (P, H)), C (H, P), complex or real views,
        and real D (H,)."""
        a, b, c = _real(a, b, c)
        same = torch.stack((a[..., 0], a[..., 0]), -1)
        swap = torch.stack((-a[..., 1], a[..., 1]), -1)
        signed = torch.stack((c[..., 0], -c[..., 1]), -1)  # (H, P, 2)
        a = a.contiguous()
        a_c = torch.view_as_complex(a)
        if a.dim() == 3:
            c_conj = torch.view_as_complex(c.contiguous()).conj().resolve_conj()
            return DiagStream(same, swap, b.contiguous(), signed, d, a_c, a, torch.view_as_complex(b.contiguous()), c_conj)
        H = b.shape[1]
        return DiagStream(same, swap, b.transpose(0, 1).reshape(H, -1), signed.reshape(H, -1).T.contiguous(), d,
                          a_c, a, None, None)

    def step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """x_t (B, H) real, h the state's real view ((B, H, P, 2) per channel, else (B, P, 2)) ->
        (y (B, H) in the constants' dtype, h' in h's layout)."""
        x = x_t if x_t.dtype == self.d.dtype else x_t.to(self.d.dtype)
        u = self.b * x.view(*x.shape, 1, 1) if self.per_channel else (x @ self.b).view(h.shape)
        new = torch.addcmul(torch.addcmul(u, self.same, h), self.swap, h.flip(-1))  # few ops: a token's cost is per op
        y = (self.c * new).sum((-2, -1)) if self.per_channel else new.flatten(-2) @ self.c
        return torch.addcmul(y, self.d, x), new

    def step_complex(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """The same maths on the complex state in complex ops: no flip, no views back and forth."""
        if h.dtype != self.a_c.dtype:  # a state of another precision: the real form promotes as arithmetic does
            return super().step_complex(x_t, h)
        x = x_t if x_t.dtype == self.d.dtype else x_t.to(self.d.dtype)
        if self.b_c is not None and self.c_conj is not None:  # per channel: (B, H, P)
            new = torch.addcmul(self.b_c * x.unsqueeze(-1), self.a_c, h)
            y = torch.linalg.vecdot(self.c_conj, new).real  # Σ_p Re(c_p h'_p): vecdot conjugates its first argument
        else:  # shared decays: (B, P)
            new = torch.addcmul(torch.view_as_complex((x @ self.b).view(*h.shape, 2)), self.a_c, h)
            y = torch.view_as_real(new).flatten(-2) @ self.c
        return torch.addcmul(y, self.d, x), new


@dataclass(frozen=True)
class DPLRStream(_Stream):
    """S4's bilinear step on the half state (``zoo_core.kernels.dplr.DPLRStep.step``), real views:
    x ← (2/Δ + Λ) x − P·2Re(P* x) + 2B u; x ← D (x − P·2Re(R x)); y = 2Re(C x) + d ⊙ u.

    Attributes: ``mats``, the ``StepMatrices`` with every field as its real view (H, M, 2); ``d`` (H,).
    """

    mats: StepMatrices
    d: Tensor

    @staticmethod
    def of(mats: StepMatrices, d: Tensor) -> DPLRStream:
        """From complex ``StepMatrices`` and the skip ``d``."""
        return DPLRStream(StepMatrices(*_real(*mats)), d)

    def step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """x_t (B, H), h (B, H, M, 2) -> (y (B, H), h' (B, H, M, 2))."""
        m = self.mats
        u = x_t.to(self.d.dtype)[..., None]  # (B, H, 1)
        hr, hi = h.unbind(-1)
        er, ei = m.E.unbind(-1)
        pr, pi = m.P.unbind(-1)
        br, bi = m.B2.unbind(-1)
        q = 2 * (pr * hr + pi * hi).sum(-1, keepdim=True)  # 2 Re(conj(P) x), (B, H, 1)
        xr = er * hr - ei * hi - pr * q + br * u
        xi = er * hi + ei * hr - pi * q + bi * u
        rr, ri = m.R.unbind(-1)
        r = 2 * (rr * xr - ri * xi).sum(-1, keepdim=True)  # 2 Re(R x)
        xr, xi = xr - pr * r, xi - pi * r
        dr, di = m.D.unbind(-1)
        nr, ni = dr * xr - di * xi, dr * xi + di * xr
        cr, ci = m.C.unbind(-1)
        y = 2 * (cr * nr - ci * ni).sum(-1)  # (B, H)
        return y + self.d * u[..., 0], torch.stack((nr, ni), -1)


@dataclass(frozen=True)
class BlockStream(_Stream):
    """LinOSS's step: real 2×2 blocks ``a`` (P, K, K) on each oscillator's pair, a complex input map
    ``b`` (P, H, K, 2), the readout y = Re(C h[..., 1]) + d ⊙ x with ``c`` (H, P, 2); the state
    h (B, P, K, 2). Real and imaginary parts evolve apart (``a`` is real)."""

    a: Tensor
    b: Tensor
    c: Tensor
    d: Tensor

    @staticmethod
    def of(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> BlockStream:
        b, c = _real(b, c)
        return BlockStream(a, b, c, d)

    def step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        x = x_t.to(self.d.dtype)
        hr, hi = h.unbind(-1)  # (B, P, K)
        br, bi = self.b.unbind(-1)  # (P, H, K)
        nr = torch.einsum("pij,bpj->bpi", self.a, hr) + torch.einsum("bh,phk->bpk", x, br)
        ni = torch.einsum("pij,bpj->bpi", self.a, hi) + torch.einsum("bh,phk->bpk", x, bi)
        cr, ci = self.c.unbind(-1)  # (H, P)
        y = nr[..., 1] @ cr.T - ni[..., 1] @ ci.T  # (B, H)
        return y + self.d * x, torch.stack((nr, ni), -1)

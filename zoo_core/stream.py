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
by a complex input map). Each ``step`` works on the state's real view, in as few ops as the form
allows (the exported stream model's nodes: one matrix product for a state shared across channels,
``_Stream``); ``step_state`` takes the complex state or its real view and returns the new state in the
same form.

Shapes: B batch, H channels (d_model), P states (M: S4's half state, K = 2: an oscillator's pair).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from math import prod
from typing import TypeVar

import torch
from torch import Tensor

from .kernels.dplr import StepMatrices

S = TypeVar("S", bound="_Stream")


class _Stream:
    """``step`` and ``step_state`` over a form's elementwise ``_ops`` and, for a state shared across
    channels, its dense map.

    Each form is linear in (state, input): (h, x) -> (h', y) with no constant term. Where one state is
    shared by all channels (S5, LRU, LinOSS), ``densified`` reads that map off the elementwise step once
    (by stepping the unit vectors) into one matrix ``dense`` (S+H, S+H) on [h flattened, x], and the
    real-view ``step`` is one matrix product: that is what the exported stream model runs, where every
    node costs about as much as a small product (onnxruntime on this machine: 0.7 µs a node, a 64×64
    product 0.8 µs, 160×160 2.6 µs; ``benchmarks/findings/REPORT_STREAM.md``). Per channel (S4D, S4) the
    maps would be H small products, which onnxruntime runs one by one (11 µs for 32 of 33×33): those
    forms stay elementwise, in few ops. The eager step keeps the complex form or the fused kernel."""

    dense: Tensor | None = None
    d: Tensor

    @property
    def per_channel(self) -> bool:
        """Whether each channel has its own state (S4D, S4) rather than one state shared by all (S5, LRU, LinOSS)."""
        raise NotImplementedError

    def state_shape(self) -> tuple[int, ...]:
        """One stream's state, as its real view (without the batch)."""
        raise NotImplementedError

    def _ops(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """The step in elementwise ops: x (B, H) in the constants' dtype, h the state's real view."""
        raise NotImplementedError

    def step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """x_t (B, H), h the state's real view -> (y (B, H) in the constants' dtype, h' in h's layout)."""
        x = x_t if x_t.dtype == self.d.dtype else x_t.to(self.d.dtype)
        m = self.dense
        # a state of another precision: elementwise ops promote, a product does not; under autocast the product
        # would run in half precision (a core's step turns autocast off: this is for a form stepped directly)
        if m is None or h.dtype != m.dtype or torch.is_autocast_enabled(h.device.type):
            return self._ops(x, h)
        n = prod(h.shape[1:])
        out = torch.cat((h.reshape(-1, n), x), -1) @ m  # [h, x] @ M -> [h', y]
        return out[:, n:], out[:, :n].reshape(-1, *h.shape[1:]).contiguous()  # a state as init_state lays it out

    def step_complex(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """``step`` on a complex state (the eager one): through its real view unless a form has fewer ops."""
        y, new = self.step(x_t, torch.view_as_real(h))
        return y, torch.view_as_complex(new)

    def step_state(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """``step`` for a complex state or its real view, returning the new state in the same form."""
        return self.step_complex(x_t, h) if h.is_complex() else self.step(x_t, h)


#: the largest dense map ``densified`` builds, in multiply-adds per stream per step (about 180×180):
#: beyond it the product costs more than the per-node overhead of the elementwise ops it replaces
DENSE_MACS = 1 << 15


def densified(form: S) -> S:
    """``form`` (a state shared across channels) with its dense map (``_Stream``), where that map is small
    (``DENSE_MACS``), nothing traces (a compiled graph fuses the elementwise ops itself) and no gradient
    is asked of its constants (the map is read off under ``no_grad``: a step that is backpropagated keeps
    the elementwise ops; the skip ``d`` is the parameter itself, so a form made under ``no_grad`` is
    densified, and a caller who keeps such a form and steps it with gradients on gets none for ``d``:
    ``core.step`` asks ``stream()`` afresh, which is what a gradient needs). Not for inference tensors:
    ``CoreBase.cached`` cannot keep a form of them, so the map would be read off at every step."""
    shape, channels = form.state_shape(), form.d.shape[0]
    n = prod(shape)
    tensors = [v for v in vars(form).values() if isinstance(v, Tensor)]
    if form.per_channel or (n + channels) ** 2 > DENSE_MACS or torch.compiler.is_compiling() \
            or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) \
            or any(t.is_inference() for t in tensors):
        return form
    with torch.no_grad():  # rows: the unit states, then the unit inputs
        eye = torch.eye(n + channels, dtype=form.d.dtype, device=form.d.device)
        y, new = form._ops(eye[:, n:], eye[:, :n].reshape(-1, *shape))
        m = torch.cat((new.reshape(n + channels, n), y), -1)
    return replace(form, dense=m.contiguous())  # type: ignore[type-var]


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
    dense: Tensor | None = None  # the step as one matrix (``_Stream``, ``densified``), where small

    @property
    def per_channel(self) -> bool:
        return self.same.dim() == 3

    def state_shape(self) -> tuple[int, ...]:
        return tuple(self.same.shape)

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
        return densified(DiagStream(same, swap, b.transpose(0, 1).reshape(H, -1), signed.reshape(H, -1).T.contiguous(),
                                    d, a_c, a, None, None))

    def _ops(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, H), h the state's real view ((B, H, P, 2) per channel, else (B, P, 2))."""
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
    """S4's bilinear step on the half state (``zoo_core.kernels.dplr.DPLRStep.step``):
    x ← E x − P·2Re(P* x) + B₂ u; x ← D (x − P·2Re(R x)); y = 2Re(C x) + d ⊙ u (E, D diagonal).

    Expanded once, the two half-steps are one diagonal-plus-rank-one step: with α = 2Re(Σ R P) and
    β = 2Re(Σ R B₂) per channel, x' = (D E) x − (D P) s + b̄ u where s = 2Re(Σ w x),
    w = (1 − α) P̄ + R E and b̄ = D B₂ − β D P. On real views that is 15 elementwise ops a step (the
    exported stream model's nodes) where the two half-steps took about 50.

    Attributes: ``mats``, the ``StepMatrices`` with every field as its real view (H, M, 2) (the fused
    kernel's); ``d`` (H,); the expanded step's real views (H, M, 2): ``same`` and ``swap`` of D E (as
    ``DiagStream``'s), ``w`` signed (2Re(w x) = Σ w ⊙ x), ``dp``, ``bbar``, ``c`` signed (2Re(C x)).
    """

    mats: StepMatrices
    d: Tensor
    same: Tensor
    swap: Tensor
    w: Tensor
    dp: Tensor
    bbar: Tensor
    c: Tensor

    @property
    def per_channel(self) -> bool:
        return True

    def state_shape(self) -> tuple[int, ...]:
        return tuple(self.mats.E.shape)

    @staticmethod
    def of(mats: StepMatrices, d: Tensor) -> DPLRStream:
        """From complex ``StepMatrices`` and the skip ``d``."""
        E, D, P, B2, R, C = mats
        alpha = 2 * (R * P).real.sum(-1, keepdim=True)  # (H, 1)
        beta = 2 * (R * B2).real.sum(-1, keepdim=True)
        a, dp = torch.view_as_real(D * E), D * P
        w = torch.view_as_real((1 - alpha) * P.conj() + R * E)
        c = torch.view_as_real(C)
        # contiguous real views: what the fused kernel reads in place (zoo_core.nn.lean)
        return DPLRStream(StepMatrices(*(t.contiguous() for t in _real(*mats))), d, torch.stack((a[..., 0], a[..., 0]), -1),
                          torch.stack((-a[..., 1], a[..., 1]), -1), torch.stack((2 * w[..., 0], -2 * w[..., 1]), -1),
                          torch.view_as_real(dp), torch.view_as_real(D * B2 - beta * dp),
                          torch.stack((2 * c[..., 0], -2 * c[..., 1]), -1))

    def _ops(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, H), h (B, H, M, 2) -> (y (B, H), h' (B, H, M, 2))."""
        u = x.reshape(*x.shape, 1, 1)
        s = (self.w * h).sum((-2, -1), keepdim=True)  # 2 Re(w x), (B, H, 1, 1)
        new = torch.addcmul(self.same * h, self.swap, h.flip(-1)) - self.dp * s + self.bbar * u
        return torch.addcmul((self.c * new).sum((-2, -1)), self.d, x), new


@dataclass(frozen=True)
class BlockStream(_Stream):
    """LinOSS's step: real 2×2 blocks ``a`` (P, K, K) on each oscillator's pair, a complex input map
    ``b`` (P, H, K, 2), the readout y = Re(C h[..., 1]) + d ⊙ x with ``c`` (H, P, 2); the state
    h (B, P, K, 2). Real and imaginary parts evolve apart (``a`` is real)."""

    a: Tensor
    b: Tensor
    c: Tensor
    d: Tensor
    dense: Tensor | None = None  # the step as one matrix (``_Stream``, ``densified``), where small

    @property
    def per_channel(self) -> bool:
        return False

    def state_shape(self) -> tuple[int, ...]:
        return (*self.a.shape[:2], 2)

    @staticmethod
    def of(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> BlockStream:
        b, c = _real(b, c)
        return densified(BlockStream(a, b, c, d))

    def _ops(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        hr, hi = h.unbind(-1)  # (B, P, K)
        br, bi = self.b.unbind(-1)  # (P, H, K)
        nr = torch.einsum("pij,bpj->bpi", self.a, hr) + torch.einsum("bh,phk->bpk", x, br)
        ni = torch.einsum("pij,bpj->bpi", self.a, hi) + torch.einsum("bh,phk->bpk", x, bi)
        cr, ci = self.c.unbind(-1)  # (H, P)
        y = nr[..., 1] @ cr.T - ni[..., 1] @ ci.T  # (B, H)
        return y + self.d * x, torch.stack((nr, ni), -1)


@dataclass(frozen=True)
class SelectiveStream:
    """Mamba-1's streaming step as the fused kernel reads it (``stream_block.cpp``'s ``SelectiveCore``):
    the mixer's weights, with A = −exp(A_log) computed once. Not a form the exported model steps with
    (the core's own ``step`` is that, elementwise); a bundle of what does not change between tokens, so
    ``zoo_core.nn.lean`` runs a block around the mixer, and a whole model of them, as one C++ call.
    Absent parts (MambaSL's fixed Δ, B or C; no D; no biases) are None.

    Shapes: Di inner width, N states, K conv width, R Δ's rank. w_in (2Di, H), w_conv (Di, K),
    w_x (R + input-dependent N's, Di), w_dt (Di, R), b_dt (Di,), a (Di, N), b / c fixed (Di, N), d (Di,),
    w_out (H, Di). State: conv (B, Di, K−1), ssm (B, Di, N)."""

    w_in: Tensor
    b_in: Tensor | None
    w_conv: Tensor
    b_conv: Tensor | None
    w_x: Tensor | None
    w_dt: Tensor | None
    b_dt: Tensor
    a: Tensor
    b: Tensor | None
    c: Tensor | None
    d: Tensor | None
    w_out: Tensor
    b_out: Tensor | None

    state_keys = ("conv", "ssm")

    # Both read at every fused step (``zoo_core.nn.lean``) and made once: the form is cached between tokens.
    @cached_property
    def dtype(self) -> torch.dtype | None:
        """The one dtype of every tensor, None where they differ (a half-precision core keeps A and D in
        float32: the kernel does not take it)."""
        dtypes = {t.dtype for t in self.tensors}
        return dtypes.pop() if len(dtypes) == 1 else None

    @cached_property
    def tensors(self) -> list[Tensor]:
        """The kernel's 13 tensors in its order, an absent one as an empty tensor of w_in's dtype."""
        empty = self.w_in.new_empty(0)
        return [empty if t is None else t for t in (self.w_in, self.b_in, self.w_conv, self.b_conv, self.w_x, self.w_dt,
                                                    self.b_dt, self.a, self.b, self.c, self.d, self.w_out, self.b_out)]

"""Mamba-3's trapezoidal SSM scan (SISO): the sequential reference and the chunked SSD-style form.

Letters: Bt batch, L length, H heads, P head width, N state size, Q chunk length.
Both functions have the same signature (``TrapScanOp``) and compute, per head with A < 0,

    α_t = exp(Δ_t A),  γ_t = λ_t Δ_t,  β_t = (1 − λ_t) Δ_t α_t          (Euler: γ_t = Δ_t, β_t = 0)
    h_t = α_t h_{t−1} + γ_t x_t B_tᵀ + β_t x_{t−1} B_{t−1}ᵀ             h (Bt, H, P, N)
    y_t = h_t C_t

with B and C already rotated. The step before the first is (x_prev, B_prev) from the carried state
(none at the start of a sequence: the reference adds no β term at t = 0, as a zero x_prev does).

The chunked form folds the trapezoid into the SSD structure: since β_{s+1} = δ_{s+1} α_{s+1} with
δ = (1 − λ)Δ, input s reaches every later output through the same decay as its γ term,

    y_t = Σ_{s≤t} (C_t·B_s) · exp(Σ_{r=s+1..t} Δ_r A) · (γ_s + δ_{s+1}·[s < t]) · x_s,

a masked, decayed attention-like matrix inside a chunk and state passing between chunks, where the
cross-boundary term δ_{first} x_{last}B_{last}ᵀ joins the state that enters the next chunk.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class TrapScanOp(Protocol):
    """Op ``scan`` for the structure ``"mamba3"``: the trapezoidal scan (see the module docstring)."""

    def __call__(self, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, lam: Tensor | None,
                 h0: Tensor | None = None, x_prev: Tensor | None = None, B_prev: Tensor | None = None,
                 *, chunk_size: int = 64) -> tuple[Tensor, Tensor]: ...


def _compute_dtype(x: Tensor) -> torch.dtype:
    """float32 at least, as the reference keeps h (float64 stays float64)."""
    return torch.promote_types(x.dtype, torch.float32)


def trap_scan_sequential(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, lam: Tensor | None,
                         h0: Tensor | None = None, x_prev: Tensor | None = None, B_prev: Tensor | None = None,
                         *, chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """The reference: ``Mamba3Simple._recurrence`` step by step (chunk_size is ignored).

    x (Bt, L, H, P), dt (Bt, L, H) positive, A (H,) negative, B, C (Bt, L, H, N) rotated,
    lam (Bt, L, H) in (0, 1) or None (Euler), h0 (Bt, H, P, N), x_prev (Bt, H, P), B_prev (Bt, H, N).
    Returns y (Bt, L, H, P) and h_L (Bt, H, P, N), in float32 or wider.
    """
    ct = _compute_dtype(x)
    x, dt, A, B, C = x.to(ct), dt.to(ct), A.to(ct), B.to(ct), C.to(ct)
    Bt, L, H, P = x.shape
    alpha = torch.exp(dt * A)  # (Bt, L, H)
    gamma = dt if lam is None else lam.to(ct) * dt
    beta = None if lam is None else (1 - lam.to(ct)) * dt * alpha
    h = x.new_zeros(Bt, H, P, B.shape[-1]) if h0 is None else h0.to(ct)
    prev = None if (x_prev is None or B_prev is None) else x_prev.to(ct)[..., None] * B_prev.to(ct)[..., None, :]
    ys = []
    for t in range(L):
        bx = x[:, t, :, :, None] * B[:, t, :, None, :]  # (Bt, H, P, N)
        h = alpha[:, t, :, None, None] * h + gamma[:, t, :, None, None] * bx
        if beta is not None and prev is not None:
            h = h + beta[:, t, :, None, None] * prev
        prev = bx
        ys.append(torch.einsum("bhpn,bhn->bhp", h, C[:, t]))
    y = torch.stack(ys, 1) if ys else x.new_zeros(Bt, 0, H, P)
    return y, h


def trap_scan_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, lam: Tensor | None,
                      h0: Tensor | None = None, x_prev: Tensor | None = None, B_prev: Tensor | None = None,
                      *, chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """The same scan in chunks of Q = chunk_size: a (Q × Q) decayed, trapezoid-weighted matrix per
    chunk (matmuls), then one pass over the L/Q chunk states. Same arguments and results as
    ``trap_scan_sequential``; L need not be a multiple of Q (the tail is zero-padded: Δ = 0 there
    decays nothing and adds nothing)."""
    ct = _compute_dtype(x)
    x, dt, A, B, C = x.to(ct), dt.to(ct), A.to(ct), B.to(ct), C.to(ct)
    Bt, L, H, P = x.shape
    N = B.shape[-1]
    h = x.new_zeros(Bt, H, P, N) if h0 is None else h0.to(ct)
    if L == 0:
        return x.new_zeros(Bt, 0, H, P), h
    gamma = dt if lam is None else lam.to(ct) * dt  # (Bt, L, H)
    delta = torch.zeros_like(dt) if lam is None else (1 - lam.to(ct)) * dt  # β_t = δ_t α_t
    if x_prev is not None and B_prev is not None:
        # the previous step's x B enters through β_0 = δ_0 α_0: add δ_0 x_prev B_prevᵀ before the first decay
        h = h + delta[:, 0, :, None, None] * x_prev.to(ct)[..., None] * B_prev.to(ct)[..., None, :]
    Q = min(chunk_size, L)
    nc = -(-L // Q)
    pad = nc * Q - L
    dnext = F.pad(delta[:, 1:], (0, 0, 0, 1 + pad))  # δ_{s+1}, (Bt, nc·Q, H); 0 past the end
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        dt, gamma, delta = (F.pad(t, (0, 0, 0, pad)) for t in (dt, gamma, delta))
    x = x.reshape(Bt, nc, Q, H, P)
    B, C = B.reshape(Bt, nc, Q, H, N), C.reshape(Bt, nc, Q, H, N)
    gamma, delta, dnext = (t.reshape(Bt, nc, Q, H) for t in (gamma, delta, dnext))
    acum = torch.cumsum((dt * A).reshape(Bt, nc, Q, H), dim=2)  # Σ_{r ≤ t in chunk} Δ_r A, (Bt, nc, Q, H)

    # within a chunk: M[t, s] = (C_t·B_s) exp(acum_t − acum_s) (γ_s + δ_{s+1}[s < t]), s ≤ t
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    strict = causal.tril(-1).to(ct)
    diff = acum[:, :, :, None, :] - acum[:, :, None, :, :]  # (Bt, nc, Q_t, Q_s, H)
    decay = torch.exp(torch.where(causal[:, :, None], diff, torch.full_like(diff, -torch.inf)))
    weight = gamma[:, :, None] + dnext[:, :, None] * strict[:, :, None]  # (Bt, nc, Q_t, Q_s, H)
    scores = torch.einsum("bcthn,bcshn->bctsh", C, B) * decay * weight
    y = torch.einsum("bctsh,bcshp->bcthp", scores, x)

    # each chunk's own contribution to the state at its end (zero state in); the last position
    # carries γ only: its δ term belongs to the next chunk's first step
    last = torch.zeros(Q, dtype=ct, device=x.device)
    last[-1] = 1.0
    to_end = torch.exp(acum[:, :, -1:] - acum) * (gamma + dnext * (1 - last)[:, None])  # (Bt, nc, Q, H)
    S = torch.einsum("bcshp,bcshn->bchpn", to_end[..., None] * x, B)  # (Bt, nc, H, P, N)
    # the cross-boundary trapezoid term: δ of chunk c's first step times chunk c−1's last x Bᵀ
    cross = delta[:, 1:, 0, :, None, None] * x[:, :-1, -1, :, :, None] * B[:, :-1, -1, :, None, :]

    # between chunks: Z_c, the state entering chunk c (trapezoid term included); Z_nc is the final state
    # (unbind, not S[:, c]: indexing a slice would backpropagate a full-size zero tensor per chunk)
    chunk_decay = torch.exp(acum[:, :, -1])[..., None, None].unbind(1)  # nc × (Bt, H, 1, 1)
    inputs, crossing = S.unbind(1), cross.unbind(1)
    entering = []
    for c in range(nc):
        entering.append(h)
        h = chunk_decay[c] * h + inputs[c]
        if c + 1 < nc:
            h = h + crossing[c]
    Z = torch.stack(entering, 1)  # (Bt, nc, H, P, N)
    y = y + torch.einsum("bcthn,bchpn->bcthp", torch.exp(acum)[..., None] * C, Z)
    return y.reshape(Bt, nc * Q, H, P)[:, :L], h

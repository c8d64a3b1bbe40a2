"""Mamba-3's trapezoidal SSM scan (SISO): the sequential reference and the chunked SSD-style form.

Letters: Bt batch, L length, H heads, P head width, N state size, Q chunk length.
Both functions have the same signature (``TrapScanOp``) and compute, per head with A < 0 (a rate per
head (H,), or per step and head (Bt, L, H): the released Mamba-3's data-dependent A),

    α_t = exp(Δ_t A_t),  γ_t = λ_t Δ_t,  β_t = (1 − λ_t) Δ_t α_t          (Euler: γ_t = Δ_t, β_t = 0)
    h_t = α_t h_{t−1} + γ_t x_t B_tᵀ + β_t x_{t−1} B_{t−1}ᵀ             h (Bt, H, P, N)
    y_t = h_t C_t

with B and C already rotated. The step before the first is (x_prev, B_prev) from the carried state
(none at the start of a sequence: the reference adds no β term at t = 0, as a zero x_prev does).

The chunked form folds the trapezoid into the SSD structure: since β_{s+1} = δ_{s+1} α_{s+1} with
δ = (1 − λ)Δ, input s reaches every later output through the same decay as its γ term,

    y_t = Σ_{s≤t} (C_t·B_s) · exp(Σ_{r=s+1..t} Δ_r A_r) · (γ_s + δ_{s+1}·[s < t]) · x_s,

a masked, decayed attention-like matrix inside a chunk and state passing between chunks, where the
cross-boundary term δ_{first} x_{last}B_{last}ᵀ joins the state that enters the next chunk.

Packed documents (``zoo_core.packing``) use two optional keywords, both (Bt, L) bool, None by default
(then nothing changes), as the other scans' ops do: ``reset`` marks a document's first step, where
the step restarts as the first of a fresh sequence: α_t·h_{t−1} and the trapezoid's β_t x_{t−1}B_{t−1}ᵀ
are both dropped (h_t = γ_t x_t B_tᵀ); ``ends`` asks for the state after each marked step instead of
the final state, returned (N, H, P, N) in row-major order of the marks. The rotary angle is the
core's: it restarts at each document before B and C reach the scan.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo_core.kernels.export_ops import exporting
from zoo_core.packing import check_step_mask


class TrapScanOp(Protocol):
    """Op ``scan`` for the structure ``"mamba3"``: the trapezoidal scan (see the module docstring)."""

    def __call__(self, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, lam: Tensor | None,
                 h0: Tensor | None = None, x_prev: Tensor | None = None, B_prev: Tensor | None = None,
                 *, chunk_size: int = 64, reset: Tensor | None = None,
                 ends: Tensor | None = None) -> tuple[Tensor, Tensor]: ...


def _check_marks(x: Tensor, reset: Tensor | None, ends: Tensor | None) -> None:
    for name, m in (("reset", reset), ("ends", ends)):
        check_step_mask(m, tuple(x.shape[:2]), name=name, who="Mamba-3 scan")


def _compute_dtype(x: Tensor) -> torch.dtype:
    """float32 at least, as the reference keeps h (float64 stays float64)."""
    return torch.promote_types(x.dtype, torch.float32)


def trap_scan_sequential(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, lam: Tensor | None,
                         h0: Tensor | None = None, x_prev: Tensor | None = None, B_prev: Tensor | None = None,
                         *, chunk_size: int = 64, reset: Tensor | None = None,
                         ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The reference: the release's ``mamba3_siso_step_ref`` recurrence step by step (chunk_size is ignored).

    x (Bt, L, H, P), dt (Bt, L, H) positive, A (H,) or (Bt, L, H) negative, B, C (Bt, L, H, N) rotated,
    lam (Bt, L, H) in (0, 1) or None (Euler), h0 (Bt, H, P, N), x_prev (Bt, H, P), B_prev (Bt, H, N).
    Returns y (Bt, L, H, P) and h_L (Bt, H, P, N), in float32 or wider. With ``reset`` the state and the
    previous step's x Bᵀ entering a marked step are multiplied by 0; with ``ends`` the states after
    the marked steps (N, H, P, N) are returned instead of h_L.
    """
    _check_marks(x, reset, ends)
    ct = _compute_dtype(x)
    x, dt, A, B, C = x.to(ct), dt.to(ct), A.to(ct), B.to(ct), C.to(ct)
    Bt, L, H, P = x.shape
    alpha = torch.exp(dt * A)  # (Bt, L, H); A broadcasts from (H,)
    gamma = dt if lam is None else lam.to(ct) * dt
    beta = None if lam is None else (1 - lam.to(ct)) * dt * alpha
    h = x.new_zeros(Bt, H, P, B.shape[-1]) if h0 is None else h0.to(ct)
    prev = None if (x_prev is None or B_prev is None) else x_prev.to(ct)[..., None] * B_prev.to(ct)[..., None, :]
    keep = None if reset is None else (~reset).to(ct)[..., None, None, None]  # (Bt, L, 1, 1, 1)
    ys, hs = [], []
    # steps by unbind, not x[:, t]: each slice's backward would fill a zero tensor the size of the sequence
    betas = [None] * L if beta is None else beta.unbind(1)
    per_step = zip(*(u.unbind(1) for u in (x, B, C, alpha, gamma)), betas, strict=True)
    for t, (x_t, B_t, C_t, alpha_t, gamma_t, beta_t) in enumerate(per_step):
        if keep is not None:  # a fresh sequence: no state, no previous step
            h = h * keep[:, t]
            prev = None if prev is None else prev * keep[:, t]
        bx = x_t[..., None] * B_t[:, :, None, :]  # (Bt, H, P, N)
        h = alpha_t[..., None, None] * h + gamma_t[..., None, None] * bx
        if beta_t is not None and prev is not None:
            h = h + beta_t[..., None, None] * prev
        prev = bx
        ys.append(torch.einsum("bhpn,bhn->bhp", h, C_t))
        if ends is not None:
            hs.append(h)
    y = torch.stack(ys, 1) if ys else x.new_zeros(Bt, 0, H, P)
    if ends is not None:
        rows, steps = torch.nonzero(ends).unbind(1)
        return y, (torch.stack(hs, 1)[rows, steps] if hs else h[:0])  # (N, H, P, N)
    return y, h


def trap_scan_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, lam: Tensor | None,
                      h0: Tensor | None = None, x_prev: Tensor | None = None, B_prev: Tensor | None = None,
                      *, chunk_size: int = 64, reset: Tensor | None = None,
                      ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The same scan in chunks of Q = chunk_size: a (Q × Q) decayed, trapezoid-weighted matrix per
    chunk (matmuls), then one pass over the L/Q chunk states. Same arguments and results as
    ``trap_scan_sequential``; L need not be a multiple of Q (the tail is zero-padded: Δ = 0 there
    decays nothing and adds nothing).

    With ``reset`` (what mamba_ssm's ``seq_idx`` does for Mamba-2's chunks): within a chunk the exponent
    of every pair (t, s) with a start in (s, t] is set to −inf before the exp (the finite differences
    are masked, never subtracted from −inf);
    a step reaches its chunk's end only if no start follows it there; a chunk's end state is passed
    on only across a chunk holding no start; the entering state reaches step t only if no start in
    the chunk is at or before t. Starts are compared as integer counts within each chunk. The
    trapezoid's term across a start needs nothing more: β_t = δ_t α_t reaches step t only through the
    decay from t − 1, which these masks zero (the δ-carrying cross-boundary term joins Z_c, which a
    chunk starting a document never reads nor passes on).

    With ``ends``, the state after each marked step (chunk c, offset j), as mamba_ssm's
    ``chunk_state_varlen``: [no start in c up to j]·exp(acum_j)·Z_c plus the chunk's own part up to j,
    computed for all marked steps at once from their chunk's steps (no loop over documents)."""
    _check_marks(x, reset, ends)
    if exporting():  # one opaque node: the chunk padding below would pin a symbolic length
        from .export_op import trap_scan_chunked_op

        return trap_scan_chunked_op(x, dt, A, B, C, lam, h0, x_prev, B_prev, chunk_size, reset, ends)
    return trap_scan_chunked_composed(x, dt, A, B, C, lam, h0, x_prev, B_prev, chunk_size=chunk_size, reset=reset, ends=ends)


def trap_scan_chunked_composed(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, lam: Tensor | None,
                               h0: Tensor | None = None, x_prev: Tensor | None = None, B_prev: Tensor | None = None,
                               *, chunk_size: int = 64, reset: Tensor | None = None,
                               ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``trap_scan_chunked`` as PyTorch ops, always (what the export-only op runs)."""
    ct = _compute_dtype(x)
    x, dt, A, B, C = x.to(ct), dt.to(ct), A.to(ct), B.to(ct), C.to(ct)
    Bt, L, H, P = x.shape
    N = B.shape[-1]
    h = x.new_zeros(Bt, H, P, N) if h0 is None else h0.to(ct)
    if L == 0:
        return x.new_zeros(Bt, 0, H, P), (h if ends is None else h[:0])
    dA = dt * A  # Δ_t A_t, (Bt, L, H) whether A is per head or per step
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
        dA, gamma, delta = (F.pad(t, (0, 0, 0, pad)) for t in (dA, gamma, delta))
    x = x.reshape(Bt, nc, Q, H, P)
    B, C = B.reshape(Bt, nc, Q, H, N), C.reshape(Bt, nc, Q, H, N)
    gamma, delta, dnext = (t.reshape(Bt, nc, Q, H) for t in (gamma, delta, dnext))
    seen = None  # (Bt, nc, Q): starts in the chunk at or before each step (the padded tail holds none)
    if reset is not None:
        seen = torch.cumsum(F.pad(reset, (0, pad)).reshape(Bt, nc, Q).long(), dim=2)
    acum = torch.cumsum(dA.reshape(Bt, nc, Q, H), dim=2)  # Σ_{r ≤ t in chunk} Δ_r A_r, (Bt, nc, Q, H)

    # within a chunk: M[t, s] = (C_t·B_s) exp(acum_t − acum_s) (γ_s + δ_{s+1}[s < t]), s ≤ t
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    strict = causal.tril(-1).to(ct)
    diff = acum[:, :, :, None, :] - acum[:, :, None, :, :]  # (Bt, nc, Q_t, Q_s, H)
    live = causal[:, :, None]  # (Q_t, Q_s, 1), or (Bt, nc, Q_t, Q_s, 1): s ≤ t and no start in (s, t]
    if seen is not None:
        live = live & (seen[:, :, :, None] == seen[:, :, None, :])[..., None]
    decay = torch.exp(torch.where(live, diff, torch.full_like(diff, -torch.inf)))
    weight = gamma[:, :, None] + dnext[:, :, None] * strict[:, :, None]  # (Bt, nc, Q_t, Q_s, H)
    scores = torch.einsum("bcthn,bcshn->bctsh", C, B) * decay * weight
    y = torch.einsum("bctsh,bcshp->bcthp", scores, x)

    # each chunk's own contribution to the state at its end (zero state in); the last position
    # carries γ only: its δ term belongs to the next chunk's first step
    last = torch.zeros(Q, dtype=ct, device=x.device)
    last[-1] = 1.0
    to_end = torch.exp(acum[:, :, -1:] - acum) * (gamma + dnext * (1 - last)[:, None])  # (Bt, nc, Q, H)
    if seen is not None:  # only the steps after the chunk's last start reach its end
        to_end = to_end * (seen == seen[:, :, -1:]).to(ct)[..., None]
    S = torch.einsum("bcshp,bcshn->bchpn", to_end[..., None] * x, B)  # (Bt, nc, H, P, N)
    # the cross-boundary trapezoid term: δ of chunk c's first step times chunk c−1's last x Bᵀ
    cross = delta[:, 1:, 0, :, None, None] * x[:, :-1, -1, :, :, None] * B[:, :-1, -1, :, None, :]

    # between chunks: Z_c, the state entering chunk c (trapezoid term included); Z_nc is the final state
    # (unbind, not S[:, c]: indexing a slice would backpropagate a full-size zero tensor per chunk)
    across = torch.exp(acum[:, :, -1])  # (Bt, nc, H)
    if seen is not None:  # nothing passes across a chunk holding a start
        across = across * (seen[:, :, -1:] == 0).to(ct)
    chunk_decay = across[..., None, None].unbind(1)  # nc × (Bt, H, 1, 1)
    inputs, crossing = S.unbind(1), cross.unbind(1)
    entering = []
    for c in range(nc):
        entering.append(h)
        h = chunk_decay[c] * h + inputs[c]
        if c + 1 < nc:
            h = h + crossing[c]
    Z = torch.stack(entering, 1)  # (Bt, nc, H, P, N)
    from_start = torch.exp(acum)[..., None]  # (Bt, nc, Q, H, 1)
    if seen is not None:  # not past a start
        from_start = from_start * (seen == 0).to(ct)[..., None, None]
    y = y + torch.einsum("bcthn,bchpn->bcthp", from_start * C, Z)
    y = y.reshape(Bt, nc * Q, H, P)[:, :L]
    if ends is None:
        return y, h
    return y, _states_at(ends, Q, acum, seen, gamma, dnext, x, B, Z)


def _states_at(ends: Tensor, Q: int, acum: Tensor, seen: Tensor | None, gamma: Tensor, dnext: Tensor, x: Tensor,
               B: Tensor, Z: Tensor) -> Tensor:
    """The state after each marked step (``trap_scan_chunked``'s ``ends``), from the chunked pieces:
    acum, gamma, dnext (Bt, nc, Q, H), seen (Bt, nc, Q) or None, x (Bt, nc, Q, H, P), B (Bt, nc, Q, H, N),
    Z (Bt, nc, H, P, N) the entering states -> (E, H, P, N), E marked steps in row-major order.

    h_j = [no start up to j]·exp(acum_j) Z_c + Σ_{s≤j, no start in (s, j]} exp(acum_j − acum_s)
    (γ_s + δ_{s+1}[s < j]) x_s B_sᵀ: the step j's own δ_{j+1} term belongs to the step after it."""
    rows, steps = torch.nonzero(ends).unbind(1)  # (E,)
    c, j = steps // Q, steps % Q
    k = torch.arange(Q, device=x.device)
    a_e = acum[rows, c]  # (E, Q, H)
    a_j = a_e.gather(1, j[:, None, None].expand(-1, 1, a_e.shape[-1]))  # (E, 1, H)
    live = k <= j[:, None]  # (E, Q)
    carried = torch.exp(a_j[:, 0])  # (E, H)
    if seen is not None:
        seen_e = seen[rows, c]  # (E, Q)
        at_j = seen_e.gather(1, j[:, None])  # (E, 1)
        live = live & (seen_e == at_j)
        carried = carried * (at_j == 0).to(carried.dtype)
    decay = torch.exp(torch.where(live[..., None], a_j - a_e, torch.full_like(a_e, -torch.inf)))  # (E, Q, H)
    w = decay * (gamma[rows, c] + dnext[rows, c] * (k < j[:, None]).to(decay.dtype)[..., None])
    own = torch.einsum("eshp,eshn->ehpn", w[..., None] * x[rows, c], B[rows, c])
    return own + carried[..., None, None] * Z[rows, c]

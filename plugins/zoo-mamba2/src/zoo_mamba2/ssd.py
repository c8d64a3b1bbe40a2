"""The SSD scan of Mamba-2 (Dao & Gu 2024): the sequential recurrence (the reference) and the
chunked algorithm, with one signature.

Letters: Bt batch, L length, Hh heads, P head_dim, G groups, N state size, Q chunk length,
Nc number of chunks. Heads h = g·(Hh/G) + j use group g (mamba_ssm's and transformers' order).

    a_t      = Δ_t · A                                   (Bt, L, Hh), A < 0 a scalar per head
    H_t      = exp(a_t) · H_{t−1} + (Δ_t x_t) ⊗ B_t       (Bt, Hh, P, N)
    y_t      = H_t · C_t                                 (Bt, Hh, P)

Both take x (Bt, L, Hh, P), dt = Δ (Bt, L, Hh) (already softplus'd, clamped and scaled), A (Hh,),
B, C (Bt, L, G, N), chunk_size, h0 (Bt, Hh, P, N) or None, and return (y (Bt, L, Hh, P),
H_L (Bt, Hh, P, N)). The D skip and the gate are the core's. They compute in the inputs' dtype
(the core passes float32 or float64).

Packed documents (``zoo_core.packing``) use two optional keywords, both (Bt, L) bool, None by default
(then nothing changes), as the gated delta rule's op does: ``reset`` marks the steps whose transition
exp(a_t) is zeroed, a document's first step, so H_t = Δ_t x_t ⊗ B_t there and nothing crosses a
document start (mamba_ssm's ``seq_idx``); ``ends`` asks for the state after each marked step instead of
the final state, returned (N, Hh, P, N) in row-major order of the marks (each document's final state,
wherever in a chunk it ends).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from zoo_core.kernels.export_ops import exporting
from zoo_core.packing import check_step_mask


class SSDOp(Protocol):
    """The signature both backends share (registered under op ``scan`` for structure ``ssd``)."""

    def __call__(self, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
                 h0: Tensor | None = None, *, reset: Tensor | None = None,
                 ends: Tensor | None = None) -> tuple[Tensor, Tensor]: ...


def _check_marks(x: Tensor, reset: Tensor | None, ends: Tensor | None) -> None:
    for name, m in (("reset", reset), ("ends", ends)):
        check_step_mask(m, tuple(x.shape[:2]), name=name, who="SSD scan")


def _per_head(t: Tensor, heads: int) -> Tensor:
    """(..., G, N) -> (..., Hh, N): each group's B or C repeated for its heads."""
    return t.repeat_interleave(heads // t.shape[-2], dim=-2)


def ssd_step(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """One step: x (Bt, Hh, P), dt (Bt, Hh), B, C (Bt, G, N), h (Bt, Hh, P, N) -> (y (Bt, Hh, P), h)."""
    Hh = x.shape[1]
    Bh, Ch = _per_head(B, Hh), _per_head(C, Hh)  # (Bt, Hh, N)
    decay = torch.exp(dt * A)[..., None, None]  # (Bt, Hh, 1, 1)
    h = decay * h + (dt[..., None] * x)[..., None] * Bh[:, :, None, :]  # (Bt, Hh, P, N)
    y = (h @ Ch[..., None])[..., 0]  # (Bt, Hh, P)
    return y, h


def ssd_sequential(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
                   h0: Tensor | None = None, *, reset: Tensor | None = None,
                   ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The recurrence, one step at a time under autograd: the reference (``chunk_size`` unused).
    With ``reset`` the state entering a marked step is multiplied by 0 (its transition zeroed); with
    ``ends`` the states after the marked steps (N, Hh, P, N) are returned instead of the last."""
    _check_marks(x, reset, ends)
    Bt, L, Hh, P = x.shape
    h = x.new_zeros(Bt, Hh, P, B.shape[-1]) if h0 is None else h0.to(x.dtype)  # (Bt, Hh, P, N)
    keep = None if reset is None else (~reset).to(x.dtype)[..., None, None, None]  # (Bt, L, 1, 1, 1)
    ys, hs = [], []
    # steps by unbind, not x[:, t]: each slice's backward would fill a zero tensor the size of the sequence
    for t, (x_t, dt_t, B_t, C_t) in enumerate(zip(*(u.unbind(1) for u in (x, dt, B, C)), strict=True)):
        if keep is not None:
            h = h * keep[:, t]
        y, h = ssd_step(x_t, dt_t, A, B_t, C_t, h)
        ys.append(y)
        if ends is not None:
            hs.append(h)
    y = torch.stack(ys, 1) if ys else x.new_zeros(Bt, 0, Hh, P)  # (Bt, L, Hh, P)
    if ends is not None:
        rows, steps = torch.nonzero(ends).unbind(1)
        return y, (torch.stack(hs, 1)[rows, steps] if hs else h[:0])  # (N, Hh, P, N)
    return y, h


def _chunks(t: Tensor, Q: int, pad: int) -> Tensor:
    """(Bt, L, K, D) -> (Bt, K, Nc, Q, D), zero-padded at the end to Nc·Q steps."""
    t = F.pad(t, (0, 0, 0, 0, 0, pad))
    Bt, Lp, K, D = t.shape
    return t.view(Bt, Lp // Q, Q, K, D).permute(0, 3, 1, 2, 4)


def _decay_within(a: Tensor, keep: Tensor | None = None) -> Tensor:
    """exp(a_{s+1} + … + a_l) for s ≤ l and 0 above the diagonal: a (..., Q) -> (..., Q, Q); with
    ``keep`` (0 where a transition is zeroed, broadcastable to a) the factor of step k is
    keep_k · exp(a_k), so every [l, s] with a reset in (s, l] is an exact 0 (no −inf, no difference).

    A running product of the per-step decays down each column, never exp(cs_l − cs_s): in float32 a
    cumulative sum of strong decay is large (−4096 after 256 steps of Δ·A = −16) and the difference
    of two such loses the small segment in their rounding (1e-4 relative error in y). Products of
    factors in (0, 1] stay within a few ulps per step, as the recurrence itself does, and need Q
    exps instead of Q² (half the time of the old differences)."""
    Q = a.shape[-1]
    ones = torch.ones(Q, Q, dtype=torch.bool, device=a.device)
    f = torch.exp(a) if keep is None else torch.exp(a) * keep  # (..., Q) per-step factors
    d = torch.where(ones.tril(-1), f[..., :, None], 1.0)  # (..., Q, Q): row l is the factor of l below the diagonal
    torch.cumprod(d, dim=-2, out=d)  # [l, s] = Π_{s<k≤l} exp(a_k) for s ≤ l (1 on the diagonal)
    return d.masked_fill_(ones.triu(1), 0.0)


def _segsum(v: Tensor) -> Tensor:
    """v_{j+1} + … + v_i for j ≤ i and −inf above the diagonal: v (..., T) -> (..., T, T).

    Each segment summed on its own (a masked cumulative sum, as transformers' Mamba-2 torch path
    does), not as a difference of two whole-sequence cumulative sums, which in float32 loses the
    segment once the sum is large. O(T²) per head, T = chunks + 1 is small; autograd differentiates it."""
    T = v.shape[-1]
    ones = torch.ones(T, T, dtype=torch.bool, device=v.device)
    seg = v[..., :, None].expand(*v.shape, T).masked_fill(~ones.tril(-1), 0.0).cumsum(dim=-2)
    return seg.masked_fill(ones.triu(1), float("-inf"))


class _WithinChunks(torch.autograd.Function):
    """y = (C·Bᵀ ⊙ decay(a)) @ (Δx) per chunk, keeping only C·Bᵀ, a and Δx for backward.

    Autograd over the three products kept two more (…, Q, Q) tensors per head (the decay mask
    and the masked product); this recomputes the mask in backward (Q exps and a running product),
    which keeps the peak memory of a long fwd+bwd below transformers' chunked torch path. Its
    backward works in place, so it is differentiable once (a second order raises, saying so).

    ``keep`` (Bt, 1, Nc, Q) or None, not differentiated, zeroes the transitions at document starts.
    The backward needs no change for it: an entry zeroed by a reset stays 0 in M, so dS = dM ⊙ M is
    0 there, and every other entry's log-decay is still the plain segment sum a_{s+1} + … + a_l."""

    @staticmethod
    def forward(ctx: Any, CB: Tensor, a: Tensor, X: Tensor, keep: Tensor | None) -> Tensor:
        """CB (Bt, G, 1, Nc, Q, Q), a (Bt, Hh, Nc, Q), X (Bt, G, Hh/G, Nc, Q, P) -> (Bt, G, Hh/G, Nc, Q, P)."""
        M = _decay_within(a, keep).view(*X.shape[:-1], X.shape[-2]).mul_(CB)  # (Bt, G, Hh/G, Nc, Q, Q)
        ctx.save_for_backward(CB, a, X, keep)
        return M @ X

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dY: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        CB, a, X, keep = ctx.saved_tensors
        decay = _decay_within(a, keep).view(*X.shape[:-1], X.shape[-2])  # (Bt, G, Hh/G, Nc, Q, Q)
        dM = dY @ X.transpose(-1, -2)  # (Bt, G, Hh/G, Nc, Q, Q)
        dCB = (dM * decay).sum(2, keepdim=True)  # the heads of a group share C·Bᵀ
        M = decay.mul_(CB)
        dX = M.transpose(-1, -2) @ dY
        dS = dM.mul_(M)  # d(log decay[l, s]) = d(cs_l − cs_s), zero above the diagonal
        dcs = (dS.sum(-1) - dS.sum(-2)).view_as(a)
        da = dcs.flip(-1).cumsum(-1).flip(-1)  # a_k is in every segment s < k ≤ l: Σ_{l≥k} dcs_l
        return dCB, da, dX, None


def ssd_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
                h0: Tensor | None = None, *, reset: Tensor | None = None,
                ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The chunked SSD algorithm: within each chunk of Q steps the quadratic (attention-like) form
    as batched matmuls, across chunks the states passed by one (Nc+1)×(Nc+1) decay matmul.

    Nothing of size (L, L) is built: the largest intermediates are (Bt, Hh, Nc, Q, Q). Padding the
    last chunk with Δ = 0 and x = 0 leaves the state unchanged (decay exp(0) = 1, no input).

    With ``reset`` (what mamba_ssm's ``seq_idx`` does in its chunk scan, chunk state and state passing):
    within a chunk the decays are running products of keep·exp(a), exact zeros across a document
    start; a step reaches its chunk's end only if no start follows it there; a chunk-end state is passed
    on only across chunks holding no start; the entering state reaches step l only if no start in the
    chunk is at or before l. Which steps a start separates is decided on integer counts of starts
    (exact in floating point), never by −inf in a log-decay (inf − inf in a difference is NaN).

    With ``ends``, the state after each marked step e (chunk c, offset j), as mamba_ssm's
    ``chunk_state_varlen``: [no start in c up to j]·exp(cs_j)·H_in[c] plus the chunk's own part,
    Σ_{s≤j, no start in (s, j]} exp(a_{s+1} + … + a_j) Δ_s x_s ⊗ B_s, computed for all marked steps at
    once from their chunk's steps (one Q-step window each: N·Hh·Q·P numbers, no loop over documents).
    """
    _check_marks(x, reset, ends)
    if exporting():  # one opaque node: the chunk padding below would pin a symbolic length
        from .export_op import ssd_chunked_op

        return ssd_chunked_op(x, dt, A, B, C, chunk_size, h0, reset, ends)
    return ssd_chunked_composed(x, dt, A, B, C, chunk_size, h0, reset=reset, ends=ends)


def ssd_chunked_composed(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
                         h0: Tensor | None = None, *, reset: Tensor | None = None,
                         ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``ssd_chunked`` as PyTorch ops, always (what the export-only op runs)."""
    Bt, L, Hh, P = x.shape
    G, N = B.shape[-2:]
    Q = max(1, min(chunk_size, L))
    pad = (-L) % Q
    a = (dt * A)[..., None]  # (Bt, L, Hh, 1)
    xdt = _chunks(x * dt[..., None], Q, pad)  # (Bt, Hh, Nc, Q, P)
    ac = _chunks(a, Q, pad)[..., 0].contiguous()  # (Bt, Hh, Nc, Q): per-step log-decays
    cs = torch.cumsum(ac, dim=-1)  # (Bt, Hh, Nc, Q): from each chunk's start (never differenced)
    Bc, Cc = _chunks(B, Q, pad), _chunks(C, Q, pad)  # (Bt, G, Nc, Q, N)
    Nc = cs.shape[2]
    grouped = (Bt, G, Hh // G, Nc, Q)  # heads split as (group, head within group): broadcast B, C
    keep = seen = None
    if reset is not None:  # the padded tail holds no start
        started = _chunks(reset[..., None, None].to(x.dtype), Q, pad)[..., 0]  # (Bt, 1, Nc, Q): 1 at a start
        keep, seen = 1.0 - started, torch.cumsum(started, dim=-1)  # seen: starts in the chunk up to each step

    # 1. within chunks: y_l = Σ_{s≤l} (C_l·B_s) exp(a_{s+1} + … + a_l) Δ_s x_s
    CB = (Cc @ Bc.transpose(-1, -2))[:, :, None]  # (Bt, G, 1, Nc, Q, Q), per group, not per head
    y = _WithinChunks.apply(CB, ac, xdt.view(*grouped, P), keep)  # (Bt, G, Hh/G, Nc, Q, P)

    # 2. each chunk's own contribution to the state at its end: Σ_s exp(a_{s+1} + … + a_Q) Δ_s x_s ⊗ B_s
    after = F.pad(ac[..., 1:], (0, 1)).flip(-1).cumsum(-1).flip(-1)  # (Bt, Hh, Nc, Q): summed from the end
    to_end = torch.exp(after)  # (Bt, Hh, Nc, Q)
    if seen is not None:  # only the steps after the chunk's last start reach its end
        to_end = to_end * (seen == seen[..., -1:]).to(x.dtype)
    own = (xdt * to_end[..., None]).view(*grouped, P).transpose(-1, -2) @ Bc[:, :, None]  # (Bt, G, Hh/G, Nc, P, N)

    # 3. across chunks: the state entering each chunk, H_in[c] = Σ_{z≤c} exp(Σ totals of z..c−1) own[z−1]
    first = x.new_zeros(Bt, Hh, P, N) if h0 is None else h0.to(x.dtype)  # (Bt, Hh, P, N)
    states = torch.cat([first[:, :, None], own.reshape(Bt, Hh, Nc, P, N)], dim=2)  # (Bt, Hh, Nc+1, P, N)
    totals = F.pad(cs[..., -1], (1, 0))  # (Bt, Hh, Nc+1): log-decay across each chunk (0 for h0)
    across = torch.exp(_segsum(totals))  # (Bt, Hh, Nc+1, Nc+1)
    if seen is not None:  # [c, z]: no start in chunks z..c−1, i.e. equal counts of starts before c and before z
        before = F.pad(torch.cumsum(seen[..., -1], dim=-1), (1, 0))  # (Bt, 1, Nc+1)
        across = across * (before[..., :, None] == before[..., None, :]).to(x.dtype)
    passed = (across @ states.flatten(-2)).view(Bt, Hh, Nc + 1, P, N)  # state after each chunk boundary
    h_in, h_last = passed[:, :, :-1], passed[:, :, -1]  # (Bt, Hh, Nc, P, N), (Bt, Hh, P, N)

    # 4. the entering state seen from inside each chunk: y_l += exp(cs_l) C_l · H_in
    from_start = torch.exp(cs)[..., None]  # (Bt, Hh, Nc, Q, 1)
    if seen is not None:  # not past a start
        from_start = from_start * (seen == 0).to(x.dtype)[..., None]
    y_off = Cc[:, :, None] @ h_in.view(*grouped[:4], P, N).transpose(-1, -2)  # (Bt, G, Hh/G, Nc, Q, P)
    y = y.view(Bt, Hh, Nc, Q, P) + from_start * y_off.view(Bt, Hh, Nc, Q, P)
    y = y.permute(0, 2, 3, 1, 4).reshape(Bt, Nc * Q, Hh, P)[:, :L]  # (Bt, L, Hh, P)
    if ends is None:
        return y, h_last
    return y, _states_at(ends, Q, ac, cs, seen, xdt, Bc, h_in)


def _states_at(ends: Tensor, Q: int, ac: Tensor, cs: Tensor, seen: Tensor | None, xdt: Tensor, Bc: Tensor,
               h_in: Tensor) -> Tensor:
    """The state after each marked step (``ssd_chunked``'s ``ends``), from the chunked pieces:
    ac, cs (Bt, Hh, Nc, Q), seen (Bt, 1, Nc, Q) or None, xdt (Bt, Hh, Nc, Q, P), Bc (Bt, G, Nc, Q, N),
    h_in (Bt, Hh, Nc, P, N) -> (E, Hh, P, N), E marked steps in row-major order."""
    rows, steps = torch.nonzero(ends).unbind(1)  # (E,)
    c, j = steps // Q, steps % Q
    E, (Hh, P), (G, N) = len(rows), xdt.shape[1::3], Bc.shape[1::3]
    upto = torch.arange(Q, device=ac.device) <= j[:, None]  # (E, Q): steps s ≤ j of the chunk
    a_e = torch.where(upto[:, None], ac[rows, :, c], 0.0)  # (E, Hh, Q): a_k for k ≤ j only
    w = torch.exp(F.pad(a_e[..., 1:], (0, 1)).flip(-1).cumsum(-1).flip(-1))  # exp(a_{s+1} + … + a_j), summed from j
    reach = upto
    carried = torch.exp(cs[rows, :, c, j])  # (E, Hh): H_in decayed to step j
    if seen is not None:
        seen_e = seen[rows, 0, c]  # (E, Q)
        at_j = seen_e.gather(1, j[:, None])  # (E, 1)
        reach = reach & (seen_e == at_j)  # no start in (s, j]
        carried = carried * (at_j == 0).to(carried.dtype)  # no start in the chunk up to j
    X = xdt[rows, :, c] * (w * reach[:, None].to(w.dtype))[..., None]  # (E, Hh, Q, P)
    own = X.view(E, G, Hh // G, Q, P).transpose(-1, -2) @ Bc[rows, :, c][:, :, None]  # (E, G, Hh/G, P, N)
    return own.reshape(E, Hh, P, N) + carried[..., None, None] * h_in[rows, :, c]

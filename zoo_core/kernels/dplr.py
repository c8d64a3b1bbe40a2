"""DPLR (S4) systems: dense reference, C̃ ↔ C, the Cauchy kernel and the O(N) bilinear step.

Dimensions:
    H: channels.
    M: stored half of the state, one member of each conjugate pair.
    N: full state, 2M, after conjugate completion.
    L: kernel length (also the length C̃ = C (I − Ā^L) belongs to).
    F: rfft frequencies, ⌊L/2⌋ + 1.
    G: frequencies in one chunk of the Cauchy sums.
    S: the four Cauchy sums (C̃B, C̃P, QB, QP).
    B: batch (step mode).

Conventions (see ``DPLRSystem``): ``A = diag(Λ) − P P*`` on the full state ``[x, conj x]``; the
readout is a row, ``y = C x`` with no conjugation. A sum over the full state of a product whose
conjugate half is the conjugate of the stored half is ``2 Re`` of the sum over the stored half.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..discretize import bilinear, complex_dtype, real_dtype
from .naive import check_length as _check_length
from .naive import flush_subnormal, naive_dense
from .systems import DenseSystem, DPLRSystem

# Entries of one (H, M, G) intermediate of kernel_cauchy: 2**18, i.e. 2 MiB in complex64 (4 MiB
# complex128), so a chunk's intermediates stay in cache. Fastest of 2**15..2**21 at H=256, N=64,
# L=1024..16384 on the 2-core reference CPU: 2**21 was 2-4x slower forward, 1.6-2x forward+backward.
CHUNK_ELEMENTS = 1 << 18


def _cast(system: DPLRSystem) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Λ, P, B, C̃ in their common complex dtype and Δ in the matching real dtype."""
    fields = (system.Lambda, system.P, system.B, system.C)
    dtype = fields[0].dtype
    for x in fields[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    dtype = complex_dtype(dtype)
    shape = tuple(system.Lambda.shape)
    if len(shape) != 2 or any(tuple(x.shape) != shape for x in fields):
        raise ValueError(f"DPLRSystem: Lambda, P, B, C must all be (H, M); got "
                         f"{[tuple(x.shape) for x in fields]}")
    if tuple(system.dt.shape) != shape[:1]:
        raise ValueError(f"DPLRSystem: dt must be (H,) = ({shape[0]},), got "
                         f"{tuple(system.dt.shape)}")
    lam, p, b, c = (x.to(dtype) for x in fields)
    return lam, p, b, c, system.dt.to(real_dtype(dtype))


def _full(x: Tensor) -> Tensor:
    """Conjugate completion: (..., M) → (..., N) = [x, conj x]."""
    return torch.cat([x, x.conj()], -1)


def dplr_dense(system: DPLRSystem) -> tuple[Tensor, Tensor, Tensor]:
    """The conjugate-completed continuous system as dense complex matrices.

    Args:
        system: ``DPLRSystem`` with Lambda, P, B, C: (H, M) and dt: (H,).

    Returns:
        (A, B, C̃): A (H, N, N) = diag(Λ_full) − P_full P_full*, B (H, N), C̃ (H, N).
    """
    lam, p, b, c, _ = _cast(system)
    pf = _full(p)  # (H, N)
    A = torch.diag_embed(_full(lam)) - pf[:, :, None] * pf.conj()[:, None, :]  # (H, N, N)
    return A, _full(b), _full(c)


def dplr_discrete_dense(system: DPLRSystem) -> tuple[Tensor, Tensor]:
    """Dense bilinear discretisation of the full system (models.md §1.2).

    Returns:
        (Ā, B̄): (H, N, N) and (H, N) complex.
    """
    A, B, _ = dplr_dense(system)
    d = bilinear(A, B, _cast(system)[-1], structure="dense")
    return d.a, d.b


def _matrix_power(A: Tensor, n: int) -> Tensor:
    """``A^n`` (n ≥ 1) by repeated squaring, every product flushed of subnormals.

    ``torch.linalg.matrix_power`` does the same squarings, but for a stable Ā and long L the
    squares decay through the subnormal range (Ā^L of S4's fastest channels is ≈ e^{−800}), and
    each product then computes on subnormals; flushed, they become exact zeros (``flush_subnormal``:
    entries below ``tiny``, far below float rounding of I − Ā^L).
    """
    out: Tensor | None = None
    while True:
        if n & 1:
            out = A if out is None else flush_subnormal(out @ A)
        n >>= 1
        if not n:
            assert out is not None
            return out
        A = flush_subnormal(A @ A)


def _one_minus_power(system: DPLRSystem, L: int) -> Tensor:
    """I − Ā^L, (H, N, N)."""
    _check_length(L)
    Abar, _ = dplr_discrete_dense(system)  # (H, N, N)
    eye = torch.eye(Abar.shape[-1], dtype=Abar.dtype, device=Abar.device)  # (N, N)
    return eye - _matrix_power(Abar, L)  # (H, N, N)


def c_from_ctilde(system: DPLRSystem, L: int) -> Tensor:
    """The true readout C from the learned C̃ = C (I − Ā^L), by a dense solve on the full state.

    The full solution is conjugate-symmetric (``conj Ā = J Ā J`` with J the half swap), so its
    first half is all of it. O(N³) per channel: compute once and cache.

    Args:
        system: ``DPLRSystem`` whose C holds C̃ (H, M).
        L: the kernel length C̃ belongs to, at least 1.

    Returns:
        (H, M) complex C.
    """
    M = system.C.shape[-1]
    ct = _full(_cast(system)[3])  # (H, N)
    c = torch.linalg.solve(_one_minus_power(system, L).mT, ct)  # (H, N): (I − Ā^L)ᵀ Cᵀ = C̃ᵀ
    return c[:, :M]  # (H, M)


def ctilde_from_c(system: DPLRSystem, L: int) -> Tensor:
    """C̃ = C (I − Ā^L) from the true readout C (the init-time conversion, done once).

    Args:
        system: ``DPLRSystem`` whose C holds the true readout C (H, M).
        L: kernel length, at least 1.

    Returns:
        (H, M) complex C̃.
    """
    M = system.C.shape[-1]
    c = _full(_cast(system)[3])  # (H, N)
    return torch.einsum("hi,hij->hj", c, _one_minus_power(system, L))[:, :M]  # (H, M)


def kernel_dplr_naive(system: DPLRSystem, L: int) -> Tensor:
    """Reference kernel: C from C̃, dense bilinear Ā and B̄, then ``Re(C Ā^l B̄)`` step by step.

    O(N³ log L + N² L) per channel.

    Args:
        system: ``DPLRSystem`` (Lambda, P, B, C̃: (H, M); dt: (H,)); C̃ belongs to length L.
        L: kernel length, at least 1.

    Returns:
        (H, L) real kernel.
    """
    Abar, Bbar = dplr_discrete_dense(system)  # (H, N, N), (H, N)
    C = _full(c_from_ctilde(system, L))  # (H, N)
    _check_length(L)
    return naive_dense(DenseSystem(Abar, Bbar, C), L)


def _nodes(L: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """1 − ω_k and 1 + ω_k at ω_k = exp(−2πik/L), k = 0..⌊L/2⌋, without cancellation.

    Returns:
        (F,), (F,) complex: 2sin²(θ/2) + i sin θ and 2cos²(θ/2) − i sin θ, θ = 2πk/L.
    """
    theta = 2 * math.pi * torch.arange(L // 2 + 1, dtype=torch.float64, device=device) / L  # (F)
    sin = torch.sin(theta)  # (F)
    one_m = torch.complex(2 * torch.sin(theta / 2) ** 2, sin)  # (F)
    one_p = torch.complex(2 * torch.cos(theta / 2) ** 2, -sin)  # (F)
    return one_m.to(dtype), one_p.to(dtype)


def _khat_chunk(v: Tensor, dlam: Tensor, dt: Tensor, one_m: Tensor, one_p: Tensor) -> Tensor:
    """K̂ at G nodes: four conjugate-completed Cauchy sums and a division-free Woodbury step.

    With den_n = 2(1−ω) − (1+ω)Δλ_n, ``Δ/(z − Δλ_n) = Δ(1+ω)/den_n`` and
    ``2/(1+ω) · Δ/(z − Δλ_n) = 2Δ/den_n``: finite at ω = −1 (models.md §2.6).

    Args:
        v: (H, S, M) numerators C̃B, C̃P, conj(P)B, conj(P)P.
        dlam: (H, M) Δλ.
        dt: (H,) Δ.
        one_m, one_p: (G,) 1 − ω and 1 + ω.

    Returns:
        (H, G) complex K̂.
    """
    den = 2 * one_m - one_p * dlam[..., None]  # (H, M, G)
    sums = v @ den.reciprocal()  # (H, S, G)
    # conj_physical, not the lazy conj(): this runs inside the custom op cauchy_khat, whose first call
    # under torch.compile runs with the Conjugate dispatch key excluded, where conj() is a no-op
    den = 2 * one_m - one_p * dlam.conj_physical()[..., None]  # (H, M, G): the conjugate half
    sums = sums + v.conj_physical() @ den.reciprocal()  # (H, S, G)
    cb, cp, qb, qp = sums.unbind(1)  # (H, G) each
    scale = dt[:, None] * one_p  # (H, G): Δ(1+ω)
    return 2 * dt[:, None] * (cb - cp * (scale * qb) / (1 + scale * qp))  # (H, G)


def _chunks(F: int, H: int, M: int) -> list[slice]:
    """Frequency slices of G nodes, G·H·M ≤ ``CHUNK_ELEMENTS`` (at least one node each)."""
    G = max(1, CHUNK_ELEMENTS // max(1, H * M))
    return [slice(s, s + G) for s in range(0, F, G)]


# K̂ chunk by chunk as a custom op (``torch.library``) with a fake (shape-only) implementation and a
# registered backward, so ``torch.compile(fullgraph=True)`` and ``torch.export`` see one opaque node
# (the chunk loop and the recomputing backward are not traced). Backward recomputes each chunk
# (checkpointing by hand): only the O(H·M + F) inputs are saved, so backward memory is bounded like
# forward memory. ``torch.utils.checkpoint`` would do the same but imports torch._dynamo (~1.5 s) on
# first use.
def _khat_chunked(v: Tensor, dlam: Tensor, dt: Tensor, one_m: Tensor, one_p: Tensor) -> Tensor:
    """K̂ (H, F) at every node from v (H, S, M), Δλ (H, M), Δ (H,), 1 ∓ ω (F,): ``_khat_chunk`` per chunk
    (``cauchy_khat``'s body, a plain function so tests can watch its intermediates)."""
    parts = [_khat_chunk(v, dlam, dt, one_m[c], one_p[c])  # (H, G)
             for c in _chunks(one_m.shape[0], *dlam.shape)]
    return torch.cat(parts, -1)  # (H, F)


@torch.library.custom_op("zoo_core::cauchy_khat", mutates_args=())
def cauchy_khat(v: Tensor, dlam: Tensor, dt: Tensor, one_m: Tensor, one_p: Tensor) -> Tensor:
    """K̂ (H, F) at every node, chunk by chunk (``_khat_chunked``), as one opaque op."""
    return _khat_chunked(v, dlam, dt, one_m, one_p)


@cauchy_khat.register_fake
def _cauchy_khat_fake(v: Tensor, dlam: Tensor, dt: Tensor, one_m: Tensor, one_p: Tensor) -> Tensor:
    return v.new_empty((dlam.shape[0], one_m.shape[0]))


@torch.library.custom_op("zoo_core::cauchy_khat_bwd", mutates_args=())
def cauchy_khat_bwd(grad: Tensor, v: Tensor, dlam: Tensor, dt: Tensor, one_m: Tensor, one_p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of ``cauchy_khat`` for v, Δλ and Δ: each chunk recomputed and pulled back by
    ``torch.func.vjp`` (a custom op's body runs below autograd, where ``torch.autograd.grad`` sees no graph)."""
    totals = [torch.zeros_like(x) for x in (v, dlam, dt)]
    for c in _chunks(one_m.shape[0], *dlam.shape):
        def chunk(v_: Tensor, dlam_: Tensor, dt_: Tensor, c: slice = c) -> Tensor:
            return _khat_chunk(v_, dlam_, dt_, one_m[c], one_p[c])  # (H, G)

        pull = torch.func.vjp(chunk, v, dlam, dt)[1]  # (output, pullback): no aux
        for total, g in zip(totals, pull(grad[:, c].contiguous()), strict=True):
            total += g
    return totals[0], totals[1], totals[2]


@cauchy_khat_bwd.register_fake
def _cauchy_khat_bwd_fake(grad: Tensor, v: Tensor, dlam: Tensor, dt: Tensor, one_m: Tensor, one_p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(v), torch.empty_like(dlam), torch.empty_like(dt)


def _cauchy_khat_setup(ctx: Any, inputs: tuple[Tensor, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _cauchy_khat_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    v, dlam, dt, one_m, one_p = ctx.saved_tensors
    return (*cauchy_khat_bwd(grad, v, dlam, dt, one_m, one_p), None, None)


cauchy_khat.register_autograd(_cauchy_khat_backward, setup_context=_cauchy_khat_setup)


def kernel_cauchy(system: DPLRSystem, L: int) -> Tensor:
    """S4's kernel: the truncated generating function at the roots of unity, then an inverse FFT.

    ``K̂_k = Σ_l K_l ω_k^l = C̃ (I − Ā ω_k)⁻¹ B̄`` at ω_k = exp(−2πik/L) (using ω^L = 1), by
    Woodbury over the conjugate-completed spectrum, then ``K = irfft(K̂, n=L)``. Frequencies run
    in chunks of G (``CHUNK_ELEMENTS`` entries per (H, M, G) intermediate), recomputed in
    backward, so forward and backward memory are O(H·(N + L)) plus one chunk.

    Args:
        system: ``DPLRSystem`` (Lambda, P, B, C̃: (H, M); dt: (H,)); C̃ belongs to length L.
        L: kernel length, at least 1.

    Returns:
        (H, L) real kernel, equal to ``kernel_dplr_naive(system, L)``.
    """
    _check_length(L)
    lam, p, b, c, dt = _cast(system)  # (H, M) ×4, (H)
    v = torch.stack([c * b, c * p, p.conj() * b, p.conj() * p], 1)  # (H, S, M)
    one_m, one_p = _nodes(L, lam.dtype, lam.device)  # (F), (F)
    khat = cauchy_khat(v, dt[:, None] * lam, dt, one_m, one_p)  # (H, F)
    return torch.fft.irfft(khat, n=L)  # (H, L)


class StepMatrices(NamedTuple):
    """Everything one O(M) bilinear step needs, per channel, on the stored half state.

    Attributes:
        E: (H, M) 2/Δ + Λ.
        D: (H, M) (2/Δ − Λ)⁻¹.
        P: (H, M) rank-1 factor.
        B2: (H, M) 2B.
        R: (H, M) Woodbury row conj(P)·D / (1 + P* D P), the denominator over the full state.
        C: (H, M) true readout recovered from C̃.
    """

    E: Tensor
    D: Tensor
    P: Tensor
    B2: Tensor
    R: Tensor
    C: Tensor


class DPLRStep:
    """The O(N)-per-token bilinear recurrence ``x_t = Ā x_{t−1} + B̄ u_t``, ``y_t = C x_t``.

    With ``Ā = (2/Δ − A)⁻¹(2/Δ + A)`` and ``B̄ = (2/Δ − A)⁻¹ 2B`` (models.md §2.4): the forward
    half-step is diagonal plus rank one, the backward one is Woodbury with one division.
    """

    @staticmethod
    def precompute(system: DPLRSystem, L: int) -> StepMatrices:
        """Step matrices, with C recovered from C̃ for kernel length L (a dense O(N³) solve).

        Args:
            system: ``DPLRSystem`` whose C holds C̃ (H, M) for length L.
            L: the kernel length C̃ belongs to.

        Returns:
            ``StepMatrices``, every field (H, M).
        """
        lam, p, b, _, dt = _cast(system)  # (H, M) ×4, (H)
        two_dt = (2 / dt)[:, None]  # (H, 1)
        D = (two_dt - lam).reciprocal()  # (H, M)
        denom = 1 + 2 * (p.conj() * D * p).real.sum(-1, keepdim=True)  # (H, 1): 1 + P* D P
        C = c_from_ctilde(system, L).to(lam.dtype)  # (H, M)
        return StepMatrices(two_dt + lam, D, p, 2 * b, p.conj() * D / denom, C)

    @staticmethod
    def init_state(mats: StepMatrices, batch: int) -> Tensor:
        """Zero half state, (B, H, M) complex."""
        return mats.E.new_zeros(batch, *mats.E.shape)

    @staticmethod
    def step(mats: StepMatrices, x: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        """One token: ``x_new = Ā x + B̄ u``, then ``y = C x_new`` (so K_0 = C B̄).

        Args:
            mats: from ``precompute``.
            x: (B, H, M) complex half state.
            u: (B, H) real input.

        Returns:
            (y, x_new): y (B, H) real, x_new (B, H, M) complex.
        """
        qx = 2 * (mats.P.conj() * x).real.sum(-1, keepdim=True)  # (B, H, 1): P* x_full
        x = mats.E * x - mats.P * qx + mats.B2 * u[..., None]  # (B, H, M): (2/Δ + A) x + 2B u
        rx = 2 * (mats.R * x).real.sum(-1, keepdim=True)  # (B, H, 1)
        x = mats.D * (x - mats.P * rx)  # (B, H, M): Woodbury (2/Δ − A)⁻¹
        y = 2 * (mats.C * x).real.sum(-1)  # (B, H)
        return y, x

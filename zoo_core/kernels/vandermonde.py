"""The blocked Vandermonde kernel as a custom op pair, forward and an analytic backward.

``zoo::vandermonde_kernel(log_a, w, L)`` is ``K[h, l] = Re Σ_n w[h, n] · exp(l · log_a[h, n])``,
computed blocked (``kernel.kernel_vandermonde`` documents the method and its subnormal flushing).
As one opaque op with a fake, ``torch.export`` keeps the length L symbolic: traced in Python, the
block size ceil(√L) is an int computed from L and pins it.

Backward (``zoo::vandermonde_kernel_bwd``), for an upstream gradient g (H, L) and p_l = exp(l·log_a):
K is the real part of the holomorphic ``w · p_l``, so (PyTorch's conjugate convention)

    ∂/∂w      = conj(S0),        S0[h, n] = Σ_l g[h, l] · p_l[h, n]
    ∂/∂log_a  = conj(w · S1),    S1[h, n] = Σ_l g[h, l] · l · p_l[h, n]

(no conj for real inputs; the real part for a real input promoted to complex). S0 and S1 are two
more Vandermonde sums, blocked the same way, l = j·T + t: Σ_j ā^{jT} Σ_t G[j, t] ā^t, one batched
matmul of the T inner powers with both weightings, where autograd through the forward would keep
the (H, N, J) and (H, N, T) powers and their graph. Double backward is not supported.
"""

# No ``from __future__ import annotations``: torch.library reads the op schema from real annotations.

import math

import torch
from torch import Tensor

from ..discretize import real_dtype
from .naive import common, flush_subnormal
from .powers import powers


def block_size(L: int) -> int:
    """Block length T of the blocked Vandermonde product: ceil(√L) minimises T + L/T."""
    return max(1, math.ceil(math.sqrt(L)))


def _blocked_powers(log_a: Tensor, L: int) -> tuple[Tensor, Tensor, int, int]:
    """inner ā^t (H, N, T) and outer ā^{jT} (H, N, J), flushed of subnormals; T and J."""
    T = block_size(L)
    J = math.ceil(L / T)
    real = real_dtype(log_a.dtype)
    t = torch.arange(T, dtype=real, device=log_a.device)
    j = torch.arange(J, dtype=real, device=log_a.device) * T
    return powers(log_a, t), powers(log_a, j), T, J


@torch.library.custom_op("zoo::vandermonde_kernel", mutates_args=())
def vandermonde_kernel(log_a: Tensor, w: Tensor, L: int) -> Tensor:
    """(H, L) real kernel ``Re Σ_n w ā^l`` of a diagonal system; log_a, w (H, N), one dtype."""
    inner, outer_p, T, J = _blocked_powers(log_a, L)
    outer = flush_subnormal(w[..., None] * outer_p)  # (H, N, J)
    K = flush_subnormal(torch.real(outer.transpose(-1, -2) @ inner))  # (H, J, T)
    return K.reshape(K.shape[0], J * T)[:, :L].contiguous()  # (H, L)


@vandermonde_kernel.register_fake
def _fwd_fake(log_a: Tensor, w: Tensor, L: int) -> Tensor:
    return log_a.new_empty((log_a.shape[0], L), dtype=real_dtype(log_a.dtype))


@torch.library.custom_op("zoo::vandermonde_kernel_bwd", mutates_args=())
def vandermonde_kernel_bwd(log_a: Tensor, w: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """(∂/∂log_a, ∂/∂w) of Σ g ⊙ K for the upstream gradient g (H, L); see the module docstring."""
    H, L = g.shape
    inner, outer_p, T, J = _blocked_powers(log_a, L)
    pos = torch.arange(L, dtype=g.dtype, device=g.device)
    G = torch.zeros(H, 2, J * T, dtype=g.dtype, device=g.device)
    G[:, 0, :L] = g
    G[:, 1, :L] = g * pos
    G = G.reshape(H, 2 * J, T).to(inner.dtype)  # (H, 2J, T): both weightings, block by block
    M = inner @ G.transpose(-1, -2)  # (H, N, 2J): Σ_t ā^t G[j, t]
    S = (M.reshape(*M.shape[:-1], 2, J) * outer_p[..., None, :]).sum(-1)  # (H, N, 2): S0, S1
    S0, S1 = S[..., 0], S[..., 1]
    # conj_physical, not the lazy conj(): a custom op's outputs must not carry the conjugate bit
    gw = S0.conj_physical() if S0.is_complex() else S0
    gl = (w * S1).conj_physical() if S1.is_complex() else w * S1
    return gl, gw


@vandermonde_kernel_bwd.register_fake
def _bwd_fake(log_a: Tensor, w: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(log_a), torch.empty_like(w)


def _setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    log_a, w, _ = inputs
    ctx.save_for_backward(log_a, w)


def _backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:  # type: ignore[no-untyped-def]
    log_a, w = ctx.saved_tensors
    gl, gw = vandermonde_kernel_bwd(log_a, w, grad.contiguous())
    return gl, gw, None


vandermonde_kernel.register_autograd(_backward, setup_context=_setup_context)


def kernel_from_parts(log_a: Tensor, w: Tensor, L: int) -> Tensor:
    """The op on log_a and w in their common dtype, gradients returned in each input's own dtype."""
    la, wc = common(log_a, w)
    return vandermonde_kernel(la, wc, L)

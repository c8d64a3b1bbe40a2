"""S5's initialisation, as the reference code does it (models.md §5.1, §14.4).

Letters: H features, N = d_state (the S5 code's P before halving), J blocks, b = N/J block size,
P = N/2 stored conjugate half.

    Λ  = tile(Λ_h, J)                        (P,)    Λ_h: the b/2 HiPPO-N eigenvalues with Im < 0
    V  = blockdiag(V_h, …, V_h)              (N, P)  V_h: their eigenvectors (b, b/2), orthonormal
    V⁻¹ := V* = blockdiag(V_h*, …)           (P, N)  (a left inverse: V* V = I)
    B̃  = V⁻¹ B,  B real (N, H), lecun_normal with JAX's fan_in = N
    C̃  = C V,    C complex (H, N), real and imaginary parts drawn as below

JAX fan conventions (``variance_scaling(1, "fan_in", "truncated_normal")``, in_axis = −2): a
standard normal truncated to [−2, 2], divided by its own standard deviation 0.8796…, times
sqrt(1/fan_in), so the variance is exactly 1/fan_in. fan_in is the size of the second-to-last
axis times every leading axis ("receptive field"):

    B (N, H)                      fan_in = N
    C trunc_standard_normal       each row as (1, N, 2): fan_in = N    (the S5 repo default)
    C lecun_normal (H, N, 2)      fan_in = H·N                          (the LinOSS codebase)
    C̃ complex_normal (H, P, 2)    N(0, ½) per part, not truncated, no V

Everything is computed in float64 / complex128; the core casts at the end.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from zoo_core.init.hippo import conj_half, nplr_legs

__all__ = ["block_hippo_n", "lecun_normal", "init_B_tilde", "init_C_tilde", "TRUNC_STD"]

TRUNC_STD = 0.87962566103423978  # standard deviation of N(0, 1) truncated to [−2, 2]


def block_hippo_n(d_state: int, blocks: int) -> tuple[Tensor, Tensor]:
    """Conjugate half of J copies of HiPPO-N of size b = N/J.

    Args:
        d_state: N, even, divisible by ``blocks`` with N/J even.
        blocks: J.

    Returns:
        (Lambda, V): Lambda (P,) complex128 with real parts −½ and negative imaginary parts,
        block-major (block j holds entries j·b/2 … (j+1)·b/2 − 1); V (N, P) complex128.
    """
    half = conj_half(nplr_legs(d_state // blocks))  # Λ_h (b/2,), V_h (b, b/2)
    return half.Lambda.repeat(blocks), torch.block_diag(*[half.V] * blocks)  # (P,), (N, P)


def lecun_normal(shape: tuple[int, ...], fan_in: int) -> Tensor:
    """JAX's ``lecun_normal``: truncated standard normal on [−2, 2] scaled to variance 1/fan_in.

    Args:
        shape: output shape.
        fan_in: the fan-in JAX would compute for the array the reference samples.

    Returns:
        float64 tensor of ``shape`` (global torch RNG).
    """
    x = torch.empty(shape, dtype=torch.float64)
    nn.init.trunc_normal_(x, mean=0.0, std=1.0, a=-2.0, b=2.0)
    return x * (math.sqrt(1.0 / fan_in) / TRUNC_STD)


def init_B_tilde(V: Tensor, d_model: int) -> Tensor:
    """B̃ = V⁻¹B with B (N, H) real lecun_normal (fan_in = N).

    Args:
        V: (N, P) complex128 block eigenvectors.
        d_model: H.

    Returns:
        (P, H) complex128.
    """
    N = V.shape[0]
    B = lecun_normal((N, d_model), fan_in=N)  # (N, H)
    return V.mH @ B.to(V.dtype)  # (P, H)


def init_C_tilde(kind: str, V: Tensor, d_model: int) -> Tensor:
    """C̃ by one of the S5 repo's ``C_init`` options.

    Args:
        kind: "trunc_standard_normal", "lecun_normal" or "complex_normal".
        V: (N, P) complex128 block eigenvectors.
        d_model: H.

    Returns:
        (H, P) complex128.
    """
    N, P = V.shape
    if kind == "complex_normal":
        return torch.complex(*(torch.randn(2, d_model, P, dtype=torch.float64) * math.sqrt(0.5)))  # (H, P)
    if kind == "trunc_standard_normal":
        C = lecun_normal((d_model, N, 2), fan_in=N)  # (H, N, 2): rows drawn one at a time in JAX
    elif kind == "lecun_normal":
        C = lecun_normal((d_model, N, 2), fan_in=d_model * N)  # (H, N, 2)
    else:
        raise ValueError(f"unknown c_init {kind!r}; expected trunc_standard_normal, lecun_normal or complex_normal")
    return torch.complex(C[..., 0], C[..., 1]) @ V  # (H, P)

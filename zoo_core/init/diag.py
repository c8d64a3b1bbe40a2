"""S4D initialisations of a diagonal state matrix, and the log-uniform Δ initialisation.

Letters: H = number of independent SSMs (features), N = full state size, N/2 = stored modes.

Every S4D init returns the continuous half spectrum Λ (H, N/2) and B (H, N/2), both complex;
the kernel takes 2·Re over these N/2 modes. For n = 0 … N/2 − 1:

    lin   λ_n = −½ + iπn                        B_n = 1
    inv   λ_n = −½ + i(N/π)(N/(2n+1) − 1)       B_n = 1
    legs  λ_n = HiPPO-LegS DPLR Λ (conj half)   B_n = (V* B_legs)_n   (not halved, as released code)
    real  λ_n = −(n + 1)                        B_n = 1

Sign convention: lin/inv follow the S4D paper (positive imaginary parts); legs keeps the
conj-half of `zoo_core.init.hippo.conj_half` (negative imaginary parts, as the reference codes).
Under 2·Re with a complex-normal C the two are equivalent.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

from .hippo import check_complex_dtype, conj_half, nplr_legs

__all__ = ["S4DInit", "S4D_INITS", "s4d_init", "log_uniform_dt"]

S4DInit = Literal["legs", "lin", "inv", "real"]
S4D_INITS: tuple[str, ...] = ("legs", "lin", "inv", "real")


def _check_sizes(H: int, N: int) -> None:
    if not isinstance(H, int) or isinstance(H, bool) or H < 1:
        raise ValueError(f"H (number of SSMs) must be a positive int, got {H!r}")
    if not isinstance(N, int) or isinstance(N, bool) or N < 2 or N % 2 != 0:
        raise ValueError(
            f"S4D init needs an even state size N >= 2 (N/2 conjugate pairs are stored), got {N!r}"
        )


def _lin(N: int) -> tuple[Tensor, Tensor]:
    n = torch.arange(N // 2, dtype=torch.float64)  # (N/2,)
    return torch.complex(torch.full_like(n, -0.5), math.pi * n), torch.ones_like(n) + 0j


def _inv(N: int) -> tuple[Tensor, Tensor]:
    n = torch.arange(N // 2, dtype=torch.float64)  # (N/2,)
    imag = (N / math.pi) * (N / (2 * n + 1) - 1)  # (N/2,)
    return torch.complex(torch.full_like(n, -0.5), imag), torch.ones_like(n) + 0j


def _legs(N: int) -> tuple[Tensor, Tensor]:
    half = conj_half(nplr_legs(N))
    return half.Lambda, half.B  # (N/2,), (N/2,)


def _real(N: int) -> tuple[Tensor, Tensor]:
    n = torch.arange(N // 2, dtype=torch.float64)  # (N/2,)
    return torch.complex(-(n + 1), torch.zeros_like(n)), torch.ones_like(n) + 0j


_BUILDERS = {"legs": _legs, "lin": _lin, "inv": _inv, "real": _real}


def s4d_init(
    kind: S4DInit, H: int, N: int, *, dtype: torch.dtype = torch.complex64
) -> tuple[Tensor, Tensor]:
    """Diagonal S4D initialisation, repeated over H independent SSMs.

    For "real" (S4D-Real, Mamba's init) the state also has N/2 entries: the eigenvalues are real,
    so there are no conjugate pairs, and a real-valued model of state N/2 is what is returned
    (imaginary parts exactly 0), keeping every init's shape (H, N/2).

    Args:
        kind: one of "legs", "lin", "inv", "real".
        H: number of independent SSMs.
        N: full state size; even and >= 2.
        dtype: complex dtype of the result (computed in complex128, cast at the end).

    Returns:
        (Lambda, B): both (H, N/2) of `dtype`, contiguous (not expanded views).

    Raises:
        ValueError: unknown kind, bad H or N, or a non-complex dtype.
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown S4D init {kind!r}; expected one of {', '.join(S4D_INITS)}")
    _check_sizes(H, N)
    check_complex_dtype(dtype)
    Lambda, B = _BUILDERS[kind](N)  # (N/2,), (N/2,) complex128
    return Lambda.to(dtype).repeat(H, 1), B.to(dtype).repeat(H, 1)  # (H, N/2) each


def log_uniform_dt(
    H: int,
    dt_min: float,
    dt_max: float,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """log Δ for H SSMs, with log Δ ~ U[log dt_min, log dt_max].

    Args:
        H: number of SSMs.
        dt_min: smallest step, > 0.
        dt_max: largest step, >= dt_min.
        generator: optional torch.Generator for reproducibility.
        dtype: real floating dtype of the result.

    Returns:
        (H,) tensor of log Δ.

    Raises:
        ValueError: if not 0 < dt_min <= dt_max, H is not a positive int, or dtype is not real.
    """
    if not isinstance(H, int) or isinstance(H, bool) or H < 1:
        raise ValueError(f"H (number of SSMs) must be a positive int, got {H!r}")
    if not (math.isfinite(dt_min) and math.isfinite(dt_max) and 0 < dt_min <= dt_max):
        raise ValueError(f"need 0 < dt_min <= dt_max (finite), got dt_min={dt_min}, dt_max={dt_max}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a real floating dtype, got {dtype}")
    lo, hi = math.log(dt_min), math.log(dt_max)
    u = torch.rand(H, generator=generator, dtype=torch.float64)  # (H,)
    return (lo + u * (hi - lo)).to(dtype)  # (H,)


def softplus_inverse_dt(n: int, dt_min: float, dt_max: float, floor: float, **factory: Any) -> Tensor:
    """The Mamba family's Δ bias: softplus⁻¹(Δ₀) with Δ₀ = exp(U[log dt_min, log dt_max]) clamped ≥ floor.

    ``n`` values drawn with ``torch.rand(n, **factory)`` (the references' draw: default dtype unless
    ``factory`` names one), so that softplus(bias) starts log-uniform in [dt_min, dt_max]; used by
    Mamba-1/2/3 and Gated DeltaNet, whose reference code initialise their dt bias this way.
    """
    dt = torch.exp(torch.rand(n, **factory) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))  # y + log(1 − e^{−y}) = softplus⁻¹(y)

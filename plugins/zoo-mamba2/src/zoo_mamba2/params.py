"""Mamba-2's params model: the constructor's keyword arguments (torch-free).

Names follow mamba_ssm's ``Mamba2`` where the zoo has no name of its own (``d_state``, ``d_conv``,
``expand``, ``ngroups`` → ``n_groups``, ``headdim`` → ``head_dim``, ``chunk_size``, ``rmsnorm``,
``norm_before_gate``). The heads are given by ``head_dim`` or ``n_heads`` (or both, consistently):
``n_heads · head_dim = expand · d_model``; with neither, head_dim = gcd(expand · d_model, 64)
(mamba_ssm's 64 wherever it divides the inner width, so every d_model builds).
"""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, model_validator

from zoo_core.params import CoreParams, DtRange, DtScale, resolve_heads

DEFAULT_HEAD_DIM = 64  # mamba_ssm's headdim


class Mamba2Params(CoreParams, DtRange, DtScale):
    # Selective (Δ, B, C input-dependent): no "lti". Δ is a step size, and dt_scale multiplies it,
    # so the sampling rate can be rescaled: "continuous_time". Packed documents run natively: "packing".
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "continuous_time", "packing"})

    d_state: int = Field(128, ge=1, le=1024, description="state size N per head channel")
    d_conv: int = Field(4, ge=1, le=1024, description="kernel width K of the causal depthwise convolution over (x, B, C)")
    expand: int = Field(2, ge=1, le=64, description="inner width Di = expand · d_model")
    head_dim: int | None = Field(None, ge=1, le=65536, description=(
        "channels P per head (None: expand · d_model / n_heads, or gcd(expand · d_model, 64) when n_heads is None too)"))
    n_heads: int | None = Field(None, ge=1, le=65536,
                                description="heads (None: expand · d_model / head_dim); each has a scalar A")
    n_groups: int = Field(1, ge=1, le=65536, description="groups of heads sharing B and C (and the norm's groups)")
    chunk_size: int = Field(256, gt=0, le=65536, description="chunk length Q of the chunked SSD algorithm")
    dt_init_floor: float = Field(1e-4, ge=0.0, allow_inf_nan=False, description="lower clamp of the initial Δ")
    dt_limit_min: float = Field(0.0, ge=0.0, allow_inf_nan=False, description="Δ is clamped to at least this")
    dt_limit_max: float | None = Field(None, gt=0.0, allow_inf_nan=False,
                                       description="Δ is clamped to at most this (None: no upper limit)")
    A_init_min: float = Field(1.0, gt=0.0, allow_inf_nan=False, description="A = −U[A_init_min, A_init_max] per head")
    A_init_max: float = Field(16.0, gt=0.0, allow_inf_nan=False, description="upper end of the initial −A")
    rmsnorm: bool = Field(True, description="gated RMSNorm before out_proj (false: y · SiLU(z) only)")
    norm_before_gate: bool = Field(False, description="RMSNorm(y) · SiLU(z) instead of RMSNorm(y · SiLU(z))")
    norm_eps: float = Field(1e-5, gt=0.0, le=1.0, allow_inf_nan=False, description="epsilon of the gated RMSNorm")
    conv_bias: bool = Field(True, description="the convolution has a bias")
    bias: bool = Field(False, description="in_proj and out_proj have biases")

    @model_validator(mode="after")
    def _check(self) -> Mamba2Params:
        inner = self.d_inner
        if inner > 262_144:
            raise ValueError(f"expand · d_model = {self.expand} · {self.d_model} = {inner} inner channels is more than "
                             "262144; lower expand")
        heads, dim = self.n_heads, self.head_dim
        if heads is None and dim is None:
            dim = math.gcd(inner, DEFAULT_HEAD_DIM)
        if heads is not None and dim is not None and heads * dim != inner:
            raise ValueError(f"n_heads · head_dim = {heads} · {dim} = {heads * dim} must equal expand · d_model = "
                             f"{self.expand} · {self.d_model} = {inner}; set one of them to None to derive it")
        given, name = (dim, "head_dim") if dim is not None else (heads, "n_heads")
        assert given is not None  # one is set (checked above)
        if inner % given:
            raise ValueError(f"{name} = {given} must divide expand · d_model = {self.expand} · {self.d_model} = {inner} "
                             f"(the heads split the inner width); e.g. {name}: {_divisor_near(inner, given)}")
        if self.heads % self.n_groups:
            raise ValueError(f"n_groups = {self.n_groups} must divide the number of heads {self.heads} "
                             "(each group of heads shares B and C)")
        if self.A_init_min > self.A_init_max:
            raise ValueError(f"A_init_min ({self.A_init_min}) must not exceed A_init_max ({self.A_init_max})")
        if self.dt_limit_max is not None and self.dt_limit_min > self.dt_limit_max:
            raise ValueError(f"dt_limit_min ({self.dt_limit_min}) must not exceed dt_limit_max ({self.dt_limit_max})")
        return self

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def heads(self) -> int:
        """n_heads with None resolved."""
        return resolve_heads(self.d_inner, self.head_dim, self.n_heads)[0]


def _divisor_near(n: int, want: int) -> int:
    """The divisor of n closest to want (for the error message's example)."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - want), d))

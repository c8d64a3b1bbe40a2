"""Mamba's params model: the constructor's keyword arguments (torch-free).

Names and defaults are mamba_ssm's ``Mamba`` (models.md §9.5); ``tv_dt``/``tv_B``/``tv_C``/``use_D``
are MambaSL's switches (§11): a false ``tv_*`` makes that quantity time-invariant.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from zoo_core.params import CoreParams, DtRange


class MambaParams(CoreParams, DtRange):
    # Selective (input-dependent): no "lti". Δ is an input-dependent function, not a step size that a
    # sampling rate could rescale, so no "continuous_time".
    # "packing": forward_packed resets the conv window and the scan's state at every document start.
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "packing"})

    d_state: int = Field(16, ge=1, le=1024, description="state size N per inner channel")
    d_conv: int = Field(4, ge=1, le=1024, description="kernel width K of the causal depthwise convolution")
    expand: int = Field(2, ge=1, le=64, description="inner width Di = expand · d_model")
    dt_rank: Literal["auto"] | int = Field(
        "auto", description="rank R of Δ's projection; 'auto' is ceil(d_model / 16)"
    )
    dt_init: Literal["random", "constant"] = Field(
        "random", description="dt_proj.weight init: U[±dt_scale/√R] ('random') or the constant dt_scale/√R"
    )
    dt_scale: float = Field(1.0, gt=0.0, allow_inf_nan=False, description="scale of dt_proj.weight's init")
    dt_init_floor: float = Field(1e-4, ge=0.0, allow_inf_nan=False, description="lower clamp of the initial Δ")
    conv_bias: bool = Field(True, description="the convolution has a bias")
    bias: bool = Field(False, description="in_proj and out_proj have biases")
    tv_dt: bool = Field(True, description="Δ depends on the input (false: Δ = softplus(dt_proj.bias), MambaSL)")
    tv_B: bool = Field(True, description="B depends on the input (false: a learned (Di, N) matrix, MambaSL)")
    tv_C: bool = Field(True, description="C depends on the input (false: a learned (Di, N) matrix, MambaSL)")
    use_D: bool = Field(True, description="the D skip connection (MambaSL's classifier drops it)")

    @model_validator(mode="after")
    def _check(self) -> MambaParams:
        d_inner = self.expand * self.d_model
        if d_inner > 262_144:
            raise ValueError(f"expand · d_model = {self.expand} · {self.d_model} = {d_inner} inner channels is more than 262144; "
                             "lower expand")
        if isinstance(self.dt_rank, int):
            if not self.tv_dt:
                raise ValueError("dt_rank is set but tv_dt is false: a time-invariant Δ has no projection; drop dt_rank or set tv_dt: true")
            if not 1 <= self.dt_rank <= d_inner:
                raise ValueError(
                    f"dt_rank {self.dt_rank} must be between 1 and the inner width expand · d_model = {d_inner} "
                    f"(it is the rank of Δ's bottleneck); 'auto' gives ceil(d_model / 16) = {math.ceil(self.d_model / 16)}"
                )
        return self

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    def rank(self) -> int:
        """dt_rank with 'auto' resolved."""
        return resolve_rank(self.d_model, self.dt_rank)


def resolve_rank(d_model: int, dt_rank: str | int) -> int:
    """Δ's projection rank R: ceil(d_model / 16) for 'auto' (mamba_ssm's rule)."""
    return math.ceil(d_model / 16) if dt_rank == "auto" else int(dt_rank)

"""S5's params model: the constructor's keyword arguments (torch-free).

The shape and step rules live in plain functions so the core's constructor applies the same
checks, with the same messages, when it is called directly rather than from a spec.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from zoo_core.params import CoreParams


def check_state(d_state: int, blocks: int) -> None:
    """Raise ValueError unless d_state is even, blocks divides it and every block is even."""
    if d_state % 2:
        raise ValueError(
            f"d_state must be even: S5 stores d_state/2 conjugate pairs (conjugate symmetry), "
            f"got d_state={d_state}; use {d_state + 1} or {d_state - 1}"
        )
    if d_state % blocks:
        raise ValueError(
            f"blocks must divide d_state: the state is split into J={blocks} HiPPO-N blocks of "
            f"equal size, got d_state={d_state}, blocks={blocks}"
        )
    if (d_state // blocks) % 2:
        raise ValueError(
            f"each block (size d_state/blocks = {d_state}/{blocks} = {d_state // blocks}) must be "
            "even: conjugate pairs are formed inside each HiPPO-N block; use fewer blocks"
        )


def check_dt(dt_min: float, dt_max: float) -> None:
    """Raise ValueError unless 0 < dt_min <= dt_max, both finite."""
    if not (math.isfinite(dt_min) and math.isfinite(dt_max) and 0 < dt_min <= dt_max):
        raise ValueError(f"need 0 < dt_min <= dt_max (finite), got dt_min={dt_min}, dt_max={dt_max}")


class S5Params(CoreParams):
    d_state: int = Field(64, ge=2, le=8192, description="state size N (P in the S5 code; even: N/2 conjugate pairs are stored)")
    blocks: int = Field(8, ge=1, le=4096, description="J: the initial A is J copies of HiPPO-N of size N/J (N/J even)")
    c_init: Literal["trunc_standard_normal", "lecun_normal", "complex_normal"] = Field(
        "trunc_standard_normal", description="C̃ init: S5 repo default, LinOSS codebase's choice, or C̃ complex normal without V")
    discretizer: str = Field("zoh", description="a registered diagonal discretizer: zoh, bilinear, euler")
    dt_min: float = Field(1e-3, gt=0, le=10.0, description="smallest initial step Δ (log-uniform, one per state)")
    dt_max: float = Field(1e-1, gt=0, le=10.0, description="largest initial step Δ")
    dt_scale: float = Field(1.0, gt=0, le=1e6, description="multiplies every Δ (S5's step_rescale): 2.0 runs a half-rate signal")
    clip_eigs: bool = Field(False, description="use min(Re Λ, −1e-4): keeps every eigenvalue in the open left half plane")
    ssm_lr: float | None = Field(1e-3, ge=0, le=1.0, description="learning rate hint for Λ, B̃ and Δ (None: the global one)")

    @model_validator(mode="after")
    def _check(self) -> S5Params:
        check_state(self.d_state, self.blocks)
        check_dt(self.dt_min, self.dt_max)
        return self

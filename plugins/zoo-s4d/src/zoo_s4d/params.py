"""S4D's params model: the constructor's keyword arguments (torch-free)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from zoo_core.params import CoreParams


class S4DParams(CoreParams):
    d_state: int = Field(64, ge=2, le=4096, description="state size N (even: N/2 conjugate pairs are stored)")
    init: Literal["legs", "lin", "inv", "real"] = Field("legs", description="S4D-LegS, S4D-Lin, S4D-Inv or S4D-Real spectrum")
    discretizer: str = Field("zoh", description="a registered diagonal discretizer: zoh, bilinear, euler")
    dt_min: float = Field(1e-3, gt=0, le=10.0, description="smallest initial step Δ (log-uniform per channel)")
    dt_max: float = Field(1e-1, gt=0, le=10.0, description="largest initial step Δ")
    dt_scale: float = Field(1.0, gt=0, le=1e6, description="multiplies every Δ: 2.0 runs a half-rate signal")
    ssm_lr: float | None = Field(1e-3, ge=0, le=1.0, description="learning rate hint for Δ, A, B (None: the global one)")

    @model_validator(mode="after")
    def _check(self) -> S4DParams:
        if self.d_state % 2:
            raise ValueError(f"d_state must be even (conjugate pairs), got {self.d_state}")
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min ({self.dt_min}) must not exceed dt_max ({self.dt_max})")
        return self

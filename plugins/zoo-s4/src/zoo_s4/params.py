"""S4's params model: the constructor's keyword arguments (torch-free)."""

from __future__ import annotations

from pydantic import Field, model_validator

from zoo_core.params import CoreParams


class S4Params(CoreParams):
    d_state: int = Field(64, ge=2, le=1024, description="state size N (even: N/2 conjugate pairs are stored)")
    dt_min: float = Field(1e-3, gt=0, le=10.0, description="smallest initial step Δ (log-uniform per channel)")
    dt_max: float = Field(1e-1, gt=0, le=10.0, description="largest initial step Δ")
    dt_scale: float = Field(1.0, gt=0, le=1e6, description="multiplies every Δ: 2.0 runs a half-rate signal")
    l_max: int = Field(1024, ge=1, le=2**22, description="kernel length C̃ is defined for; longer inputs convert C̃ exactly")
    ssm_lr: float | None = Field(1e-3, ge=0, le=1.0, description="learning rate hint for Δ, Λ, P, B (None: the global one)")

    @model_validator(mode="after")
    def _check(self) -> S4Params:
        if self.d_state % 2:
            raise ValueError(f"d_state must be even (N/2 conjugate pairs are stored), got {self.d_state}")
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min ({self.dt_min}) must not exceed dt_max ({self.dt_max})")
        return self

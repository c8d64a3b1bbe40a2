"""S4's params model: the constructor's keyword arguments and the capabilities (torch-free)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from zoo_core.params import CoreParams, DtRange, DtScale, SsmLr


class S4Params(CoreParams, DtRange, DtScale, SsmLr):
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "lti", "complex_params", "continuous_time",
                                                             "packing"})

    d_state: int = Field(64, ge=2, le=1024, description="state size N (even: N/2 conjugate pairs are stored)")
    l_max: int = Field(1024, ge=1, le=2**22, description="kernel length C̃ is defined for; longer inputs convert C̃ exactly")

    @model_validator(mode="after")
    def _check(self) -> S4Params:
        if self.d_state % 2:
            raise ValueError(f"d_state must be even (N/2 conjugate pairs are stored), got {self.d_state}")
        return self

"""S4D's params model: the constructor's keyword arguments and the capabilities (torch-free)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from zoo_core.params import CoreParams, DtRange, DtScale, SsmLr


class S4DParams(CoreParams, DtRange, DtScale, SsmLr):
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "lti", "complex_params", "continuous_time",
                                                             "packing"})

    d_state: int = Field(64, ge=2, le=4096, description="state size N (even: N/2 conjugate pairs are stored)")
    init: Literal["legs", "lin", "inv", "real"] = Field("legs", description="S4D-LegS, S4D-Lin, S4D-Inv or S4D-Real spectrum")
    discretizer: str = Field("zoh", description="a registered diagonal discretizer: zoh, bilinear, euler")

    @model_validator(mode="after")
    def _check(self) -> S4DParams:
        if self.d_state % 2:
            raise ValueError(f"d_state must be even (conjugate pairs), got {self.d_state}")
        return self

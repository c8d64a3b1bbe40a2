"""LRU's params model: the constructor's keyword arguments and the capabilities (torch-free)."""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, model_validator

from zoo_core.params import CoreParams, SsmLr


class LRUParams(CoreParams, SsmLr):
    # Discrete-time: no step size Δ, so no "continuous_time" (the sampling rate cannot be rescaled).
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "lti", "complex_params",
                                                             "packing"})

    d_state: int = Field(64, ge=1, le=4096, description="number of complex states N (one recurrence shared by all H features)")
    r_min: float = Field(0.0, ge=0.0, lt=1.0, allow_inf_nan=False,
                         description="inner radius of the ring init: |λ|² ~ U[r_min², r_max²]")
    r_max: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False,
                         description="outer radius of the ring init (1 allowed: |λ| = exp(−e^ν) < 1 for any finite ν)")
    max_phase: float = Field(6.28, gt=0.0, le=2 * math.pi, allow_inf_nan=False,
                             description="largest initial phase: arg λ ~ U[0, max_phase], at most 2π")
    ssm_lr: float | None = Field(5e-4, ge=0.0, le=1.0, allow_inf_nan=False,
                                 description="learning-rate hint for ν, θ, γ and B, no weight decay (None: the global settings)")

    @model_validator(mode="after")
    def _check(self) -> LRUParams:
        if not self.r_min < self.r_max:
            raise ValueError(
                f"r_min ({self.r_min}) must be smaller than r_max ({self.r_max}): the ring "
                "0 ≤ r_min ≤ |λ| < r_max ≤ 1 would be empty; e.g. r_min: 0.9, r_max: 0.999"
            )
        return self

"""LinOSS's params model: the constructor's keyword arguments and the capabilities (torch-free)."""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, model_validator

from zoo_core.params import CoreParams, DtRange, DtScale, SsmLr

# σ(1): the reference draws steps ~ U[0, 1) and uses Δ = σ(steps), so Δ ∈ [0.5, σ(1)) at init.
DT_MAX_DEFAULT = 1.0 / (1.0 + math.exp(-1.0))

# Largest Δ²A for which a discretizer's 2×2 transition keeps |eig| ≤ 1 (models.md §7.3, §14.3).
# A discretizer absent here is stable for every A ≥ 0, Δ > 0 (linoss-im) or declares nothing.
DT2A_MAX: dict[str, float] = {"linoss-imex": 4.0}


def stability_problem(discretizer: str, *, A_max: float, dt_max: float, dt_scale: float) -> str | None:
    """Why an init range can violate ``discretizer``'s stability rule Δ²A ≤ limit, or None."""
    limit = DT2A_MAX.get(discretizer)
    dt = dt_max * dt_scale
    worst = dt * dt * A_max
    if limit is None or worst <= limit:
        return None
    return (
        f"discretizer {discretizer!r} is stable only while Δ²A ≤ {limit:g} for every oscillator "
        f"(beyond it M has a real eigenvalue above 1 and the state explodes), but the init range "
        f"allows Δ²A up to (dt_max·dt_scale)²·A_max = ({dt_max:g}·{dt_scale:g})²·{A_max:g} = {worst:.4g}; "
        f"lower A_max to at most {limit / (dt * dt):.4g}, lower dt_max or dt_scale, or use "
        f"discretizer 'linoss-im' (stable for every A ≥ 0)"
    )


class LinOSSParams(CoreParams, DtRange, DtScale, SsmLr):
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "lti", "complex_params", "continuous_time",
                                                             "packing"})

    d_state: int = Field(64, ge=1, le=65536, description="number of oscillators P; the state holds a complex (z, y) pair per oscillator")
    discretizer: str = Field("linoss-im", description="a registered block2x2 discretizer: linoss-im (implicit Euler, "
                             "dissipative) or linoss-imex (symplectic Euler, needs Δ²A ≤ 4)")
    A_min: float = Field(0.0, ge=0, le=1e6, description="A_diag ~ U[A_min, A_max) at init; the stiffness is A = ReLU(A_diag)")
    A_max: float = Field(1.0, ge=0, le=1e6, description="upper end of the A_diag init range")
    dt_min: float = Field(0.5, gt=0, lt=1, description="smallest initial Δ = sigmoid(steps); steps ~ U[logit dt_min, logit dt_max)")
    dt_max: float = Field(DT_MAX_DEFAULT, gt=0, lt=1, description="largest initial Δ (default σ(1), as the reference's steps ~ U[0, 1))")
    ssm_lr: float | None = Field(None, ge=0, le=1.0, description="learning rate hint for A_diag and steps, no weight decay "
                                 "(None: the global settings, as the reference)")

    @model_validator(mode="after")
    def _check(self) -> LinOSSParams:
        if self.A_min > self.A_max:
            raise ValueError(f"need 0 ≤ A_min ≤ A_max (A = ReLU(A_diag) is a stiffness ≥ 0), got A_min={self.A_min}, A_max={self.A_max}")
        problem = stability_problem(self.discretizer, A_max=self.A_max, dt_max=self.dt_max, dt_scale=self.dt_scale)
        if problem:
            raise ValueError(problem)
        return self

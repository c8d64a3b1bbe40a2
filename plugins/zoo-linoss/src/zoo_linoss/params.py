"""LinOSS's params model: the constructor's keyword arguments (torch-free).

The init-range rules live here as plain functions so the params model (spec validation) and the
core's constructor (direct construction) refuse the same inputs with the same message.
"""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from zoo_core.params import CoreParams

# σ(1): the reference draws steps ~ U[0, 1) and uses Δ = σ(steps), so Δ ∈ [0.5, σ(1)) at init.
DT_MAX_DEFAULT = 1.0 / (1.0 + math.exp(-1.0))

# Largest Δ²A for which a discretizer's 2×2 transition keeps |eig| ≤ 1 (models.md §7.3, §14.3).
# A discretizer absent here is stable for every A ≥ 0, Δ > 0 (linoss-im) or declares nothing.
DT2A_MAX: dict[str, float] = {"linoss-imex": 4.0}


def init_problems(*, d_state: int, discretizer: str, A_min: float, A_max: float, dt_min: float,
                  dt_max: float, dt_scale: float) -> list[str]:
    """Everything wrong with an init range, each with its fix; empty when the range is valid."""
    out = []
    if not (isinstance(d_state, int) and d_state >= 1):
        out.append(f"d_state (the number of oscillators P) must be a positive int, got {d_state!r}")
    if not (0.0 <= A_min <= A_max):
        out.append(f"need 0 ≤ A_min ≤ A_max (A = ReLU(A_diag) is a stiffness ≥ 0), got A_min={A_min}, A_max={A_max}")
    if not (0.0 < dt_min <= dt_max < 1.0):
        out.append(f"need 0 < dt_min ≤ dt_max < 1 (Δ = sigmoid(steps) lies in (0, 1) before dt_scale), "
                   f"got dt_min={dt_min}, dt_max={dt_max}")
    if not (dt_scale > 0 and math.isfinite(dt_scale)):
        out.append(f"dt_scale must be a positive finite number, got {dt_scale}")
    if not out:
        problem = stability_problem(discretizer, A_max=A_max, dt_max=dt_max, dt_scale=dt_scale)
        if problem:
            out.append(problem)
    return out


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


class LinOSSParams(CoreParams):
    d_state: int = Field(64, ge=1, le=65536, description="number of oscillators P; the state holds a complex (z, y) pair per oscillator")
    discretizer: str = Field("linoss-im", description="a registered block2x2 discretizer: linoss-im (implicit Euler, dissipative) or linoss-imex (symplectic Euler, needs Δ²A ≤ 4)")
    A_min: float = Field(0.0, ge=0, le=1e6, description="A_diag ~ U[A_min, A_max) at init; the stiffness is A = ReLU(A_diag)")
    A_max: float = Field(1.0, ge=0, le=1e6, description="upper end of the A_diag init range")
    dt_min: float = Field(0.5, gt=0, lt=1, description="smallest initial Δ = sigmoid(steps); steps ~ U[logit dt_min, logit dt_max)")
    dt_max: float = Field(DT_MAX_DEFAULT, gt=0, lt=1, description="largest initial Δ (default σ(1), as the reference's steps ~ U[0, 1))")
    dt_scale: float = Field(1.0, gt=0, le=1e6, description="multiplies every Δ: 2.0 runs a half-rate signal")
    ssm_lr: float | None = Field(None, ge=0, le=1.0, description="learning rate hint for A_diag and steps, no weight decay (None: the global settings, as the reference)")

    @model_validator(mode="after")
    def _check(self) -> LinOSSParams:
        problems = init_problems(d_state=self.d_state, discretizer=self.discretizer, A_min=self.A_min,
                                 A_max=self.A_max, dt_min=self.dt_min, dt_max=self.dt_max, dt_scale=self.dt_scale)
        if problems:
            raise ValueError("; ".join(problems))
        return self

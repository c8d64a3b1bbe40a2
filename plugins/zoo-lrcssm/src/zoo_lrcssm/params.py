"""LrcSSM's params model: the constructor's keyword arguments and the capabilities (torch-free)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from zoo_core.params import CoreParams

DEFAULT_MAX_ITER = 100


class LrcSSMParams(CoreParams):
    # Nonlinear and input-dependent: no "lti" (no convolution), real state, Δt fixed (no rescaling).
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "packing"})

    d_state: int | None = Field(
        None, ge=1, le=65536,
        description="state size D; None: D = d_model and the output is the state itself (the paper's "
                    "hidden = state = 64, no extra parameters); otherwise a Linear(D → d_model) maps the states out")
    elastance: Literal["asymmetric", "symmetric"] = Field(
        "asymmetric",
        description="ε = dt·σ(k x + b) (asymmetric, the reference default) or "
                    "dt·(σ(k x + b + s) − σ(k x + b − s)) (symmetric, adds the shift s)")
    dt: float = Field(1.0, gt=0.0, le=1e3, allow_inf_nan=False,
                      description="Euler step Δt (a constant, not trained; the reference uses 1.0)")
    tol: float | None = Field(
        None, gt=0.0, lt=1.0, allow_inf_nan=False,
        description="Newton (deer backend) stopping tolerance on max|x^(k+1) − x^(k)|; None: 1e-4 in "
                    "float32, 1e-7 in float64")
    max_iter: int = Field(
        DEFAULT_MAX_ITER, ge=1, le=1_000_000,
        description="Newton iteration cap (deer backend); each iteration freezes at least one more step, so "
                    "max_iter ≥ L always converges")
    on_nonconvergence: Literal["fallback", "error"] = Field(
        "fallback",
        description="deer backend, cap reached above tol: 'fallback' warns with the residual and reruns the "
                    "exact sequential loop; 'error' raises NewtonConvergenceError")

"""Registers the LinOSS core and its two discretizers. Metadata only: no torch, no model code."""

from __future__ import annotations

from zoo_core.hookspecs import RegisterCore, RegisterDiscretizer, hookimpl

from .params import LinOSSParams

zoo_api = 1

CARD = """LinOSS (Rusch & Rus 2025): P uncoupled forced oscillators y'' = −Ay + Bu, o = Re(Cy) + Du,
A = ReLU(A_diag) ≥ 0, Δ = sigmoid(steps) per oscillator, B and C complex; implicit Euler (IM,
dissipative, default) or symplectic Euler (IMEX, energy-conserving while Δ²A ≤ 4); the 2×2 block
transition is scanned as is (never diagonalised: A = 0 makes it a Jordan block)."""


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register(
        "linoss",
        "zoo_linoss.core:LinOSS",
        params=LinOSSParams,
        presets={
            "tiny": {"d_state": 8},
            "paper": {"d_state": 64},
            "imex": {"d_state": 64, "discretizer": "linoss-imex"},
        },
        card=CARD,
    )


@hookimpl
def zoo_register_discretizers(register: RegisterDiscretizer) -> None:
    register("linoss-im", "zoo_linoss.discretize:linoss_im", structures=("block2x2",),
             description="LinOSS implicit Euler: M = S[[1, −ΔA], [Δ, 1]], F = S[Δ, Δ²]·Bu, S = 1/(1 + Δ²A); "
                         "|eig| = (1 + Δ²A)^(−1/2), stable for every A ≥ 0")
    register("linoss-imex", "zoo_linoss.discretize:linoss_imex", structures=("block2x2",),
             description="LinOSS symplectic Euler: M = [[1, −ΔA], [Δ, 1 − Δ²A]], F = [Δ, Δ²]·Bu; "
                         "det M = 1, |eig| = 1 iff Δ²A ≤ 4 (explodes beyond)")

"""Default discretizers: ZOH, bilinear and forward Euler (diagonal and dense)."""

from __future__ import annotations

from ..hookspecs import RegisterDiscretizer, hookimpl

zoo_api = 1


@hookimpl
def zoo_register_discretizers(register: RegisterDiscretizer) -> None:
    structures = ("diag", "dense")
    register("zoh", "zoo_core.discretize:zoh", structures=structures,
             description="zero-order hold: exp(ΔA), A⁻¹(exp(ΔA) − I)B")
    register("bilinear", "zoo_core.discretize:bilinear", structures=structures,
             description="bilinear (Tustin): (I − ΔA/2)⁻¹(I + ΔA/2), (I − ΔA/2)⁻¹ΔB")
    register("euler", "zoo_core.discretize:euler", structures=structures,
             description="forward Euler: I + ΔA, ΔB (stable only for small Δ)")

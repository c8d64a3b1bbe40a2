"""Default stacking policies: independent (ABCDEF) and periodic sharing (ABCABC, ABABAB, AAAAAA)."""

from __future__ import annotations

from ..hookspecs import RegisterSimple, hookimpl

zoo_api = 1


@hookimpl
def zoo_register_stacking_policies(register: RegisterSimple) -> None:
    register("independent", "zoo_core.stacking_policies:Independent",
             description="every depth position has its own block (ABCDEF)")
    register("periodic", "zoo_core.stacking_policies:Periodic",
             description="period m blocks reused cyclically, θ_ℓ = θ_((ℓ−1) mod m)+1 (ABCABC for m=3, AAAAAA for m=1)")

"""Registers the S4 core. Metadata only: the model code is imported when a model is built."""

from __future__ import annotations

from zoo_core.hookspecs import RegisterCore, hookimpl

from .params import S4Params

zoo_api = 1

CARD = """S4 (Gu, Goel, Ré 2022): one SISO state space model per channel with the HiPPO-LegS matrix in
diagonal-plus-low-rank form A = Λ − PP*, bilinear discretisation, the learned output vector C̃,
kernels by the Cauchy/Woodbury algorithm at the roots of unity, O(N) recurrent steps."""


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register(
        "s4",
        "zoo_s4.core:S4",
        params=S4Params,
        presets={
            "tiny": {"d_state": 8, "l_max": 64},
            "small": {"d_state": 32, "l_max": 1024},
            "base": {"d_state": 64, "l_max": 1024},
            "pathx": {"d_state": 64, "l_max": 16384, "dt_min": 1e-4, "dt_max": 1e-2},
        },
        card=CARD,
    )

"""Registers the S4D core. Metadata only: the model code is imported when a model is built."""

from __future__ import annotations

from zoo_core.hookspecs import RegisterCore, hookimpl

from .params import S4DParams

zoo_api = 1

CARD = """S4D (Gu, Gupta, Goel, Ré 2022): one diagonal SISO state space model per channel,
x' = Λx + Bu, y = 2Re(Cx) + Du, N/2 conjugate pairs stored; S4D-LegS/Lin/Inv/Real spectra;
ZOH or bilinear; log-uniform Δ per channel; Vandermonde kernel + FFT convolution for training,
the diagonal recurrence for streaming."""


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register(
        "s4d",
        "zoo_s4d.core:S4D",
        params=S4DParams,
        presets={
            "tiny": {"d_state": 8},
            "small": {"d_state": 32},
            "base": {"d_state": 64},
            "lin": {"d_state": 64, "init": "lin"},
            "bilinear": {"d_state": 64, "discretizer": "bilinear"},
        },
        card=CARD,
    )

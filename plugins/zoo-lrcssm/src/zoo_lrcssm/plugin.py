"""Registers the LrcSSM core. Metadata only: the model code is imported when a model is built."""

from __future__ import annotations

from zoo_core.hookspecs import RegisterCore, hookimpl

from .params import LrcSSMParams

zoo_api = 1

CARD = """LrcSSM (Farsang, Hasani, Rus, Grosu 2025): a liquid-resistance liquid-capacitance neuron per
state unit, x_t = x_{t−1} + ε(x_{t−1}) ⊙ (−σ(f) ⊙ x_{t−1} + v_L ⊙ tanh(zz)), with f and zz mixing
all inputs through sigmoid synapses but the state only elementwise, so ∂x_t/∂x_{t−1} is diagonal.
Backends: 'naive' is the sequential loop; the 'deer' path solves the whole trajectory by
quasi-DEER/Newton, each iteration one diagonal time-varying linear scan (zoo_core's scan
backends), converging under no_grad and then taking one differentiable Newton step from the
fixed point, which gives the implicit-function (exact) gradients."""


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register(
        "lrcssm",
        "zoo_lrcssm.core:LrcSSM",
        params=LrcSSMParams,
        presets={
            "tiny": {"d_state": 4},
            "small": {"d_state": 16},
            "paper": {"d_state": 64},  # run_*.sh: nstates 64 (= ninp_enc 64, so no output map)
            "symmetric": {"d_state": 64, "elastance": "symmetric"},
        },
        card=CARD,
    )

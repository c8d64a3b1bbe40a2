"""Registers the S5 cores. Metadata only: the model code is imported when a model is built."""

from __future__ import annotations

from zoo_core.hookspecs import RegisterCore, hookimpl

from .params import S5BidirectionalParams, S5Params

zoo_api = 1

PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"d_state": 8, "blocks": 2},
    "small": {"d_state": 32, "blocks": 4},
    "paper": {"d_state": 64, "blocks": 8},
    "lra": {"d_state": 256, "blocks": 8},
    "linoss": {"d_state": 64, "blocks": 4, "c_init": "lecun_normal", "clip_eigs": True},
    "bilinear": {"d_state": 64, "blocks": 8, "discretizer": "bilinear"},
}

CARD = """S5 (Smith, Warrington, Linderman 2023): one MIMO diagonal state space model for all H
features, x' = Λx + B̃u, y = 2Re(C̃x) + Du, N/2 conjugate pairs stored; Λ from J blocks of
HiPPO-N diagonalised in float64, B̃ = V⁻¹B, C̃ = CV; ZOH or bilinear with one Δ per state;
a parallel scan for training, the diagonal recurrence for streaming."""

BIDIRECTIONAL_CARD = """S5, bidirectional: a second scan in reverse time shares Λ̄ and B̄ and has its
own readout, y_t = 2Re(C̃₁x_t + C̃₂x^rev_t) + Du_t. Non-causal, so it has no step/streaming mode."""


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register("s5", "zoo_s5.core:S5", params=S5Params, presets=PRESETS, card=CARD)
    register("s5-bidirectional", "zoo_s5.core:S5Bidirectional", params=S5BidirectionalParams, presets=PRESETS,
             card=BIDIRECTIONAL_CARD)

"""Registers the LRU core. Metadata only: the model code is imported when a model is built."""

from __future__ import annotations

from zoo_core.hookspecs import RegisterCore, hookimpl

from .params import LRUParams

zoo_api = 1

CARD = """LRU (Orvieto, Smith, Gu, Fernando, Gulcehre, Pascanu, De 2023): one diagonal complex
recurrence shared by all H features (MIMO), λ = exp(−e^ν + i e^θ) with a ring initialisation
(|λ|² uniform on [r_min², r_max²], phase uniform on [0, max_phase]), rows of B scaled by a trained
γ = sqrt(1 − |λ|²) at init; x_t = λ x_{t−1} + γB u_t, y = Re(Cx) + Du. Discrete-time (no Δ);
parallel scan for training, the same recurrence for streaming."""


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register(
        "lru",
        "zoo_lru.core:LRU",
        params=LRUParams,
        presets={
            "tiny": {"d_state": 4},
            "small": {"d_state": 16},
            "paper": {"d_state": 64},
            "minimal-lru": {"d_state": 128},  # minimal-LRU run_train.py default d_hidden
        },
        card=CARD,
    )

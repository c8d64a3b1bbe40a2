"""Registers the RG-LRU (Hawk recurrent block) core. Metadata only: the model code is imported when
a model is built."""

from __future__ import annotations

from zoo_core.hookspecs import RegisterCore, hookimpl

from .params import RGLRUParams

zoo_api = 1

CARD = """RG-LRU / Hawk recurrent block (De et al. 2024, Griffin): two branches, GeLU(linear_y u) and
linear_x u → causal depthwise conv (width 4) → RG-LRU, multiplied and projected back. RG-LRU:
gates r_t, i_t = σ(block-diagonal linear of x_t), log a_t = −c·softplus(−Λ)·r_t (c = 8),
h_t = a_t ⊙ h_(t−1) + sqrt(1 − a_t²) ⊙ (i_t ⊙ x_t); a document's first token resets (a_0 = 0,
multiplier 1) as RecurrentGemma does. Λ init: σ(Λ)^c ~ U[0.9, 0.999] (the paper's; 'recurrentgemma'
gives the reference code's σ(Λ)² ~ U[0.81, 0.998]). Discrete-time (no Δ). Training: gates in
parallel and the registered diagonal scan; streaming: the same recurrence one token at a time."""


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register(
        "rglru",
        "zoo_rglru.core:RGLRU",
        params=RGLRUParams,
        presets={
            "tiny": {"lru_width": 6, "num_heads": 2},  # any d_model: the width is explicit
            "small": {"lru_width": 64, "num_heads": 4},
            # Hawk's recurrent block: lru_width = 4/3 · d_model in the paper; set d_model accordingly
            "recurrentgemma-2b": {"lru_width": 2560, "num_heads": 10, "a_init": "recurrentgemma"},
        },
        card=CARD,
    )

"""Registers the Gated DeltaNet core and its two gated-delta-rule backends.

Metadata only: the model code is imported when a model is built (or a backend is loaded).
"""

from __future__ import annotations

from zoo_core.hookspecs import RegisterBackend, RegisterCore, hookimpl
from zoo_core.plugin_registry import Problem

from .params import GatedDeltaNetParams

zoo_api = 1

CARD = """Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024), fla's GatedDeltaNet layer: q/k/v projections with
short causal depthwise convs + SiLU, L2-normalised q (scaled K^−½) and k, β = sigmoid(b_proj x),
α = exp(g), g = −exp(A_log)·softplus(a_proj x + dt_bias) (Mamba-2 init), per-head state K × V:
S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t, then RMSNorm(o) ⊙ SiLU(g_proj x), o_proj.
Discrete-time (no Δ to rescale). Backends: gdn-sequential (`sequential`: the recurrence, the reference)
and gdn-chunked (`chunked`: the WY / UT-transform form, one triangular solve per chunk, chunk_size)."""

PRESETS = {
    "tiny": {"num_heads": 1, "head_dim": 5, "expand_v": 1.4, "conv_size": 3, "chunk_size": 8},  # K 5, V 7: odd sizes
    "small": {"num_heads": 4, "head_dim": 16, "expand_v": 1.0, "conv_size": 4, "chunk_size": 32},
    # fla's GatedDeltaNet defaults (the 1.3B configuration at hidden size 2048): 6 heads, K 256, V 512
    "fla": {"num_heads": 6, "head_dim": 256, "expand_v": 2.0, "conv_size": 4, "chunk_size": 64},
}


def _gated_delta(p: Problem) -> str | None:
    if p.structure != "gated_delta":
        return f"it computes the gated delta rule (structure 'gated_delta'), not a {p.structure!r} recurrence"
    return None


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register("gdn", "zoo_gdn.core:GatedDeltaNet", params=GatedDeltaNetParams, presets=PRESETS, card=CARD)


@hookimpl
def zoo_register_backends(register: RegisterBackend) -> None:
    register("gdn-sequential", "scan", "zoo_gdn.ops:gated_delta_sequential", priority=0, supports=_gated_delta,
             aliases=("sequential",),
             description="gated delta rule, reference: the recurrence one step at a time under autograd")
    register("gdn-chunked", "scan", "zoo_gdn.ops:gated_delta_chunked", priority=10, supports=_gated_delta,
             aliases=("chunked",),
             description="gated delta rule in chunks: WY / UT transform by one triangular solve per chunk, "
                         "matmuls within chunks, state passed across them; spec name 'chunked'")

"""Registers the Mamba-2 core, its two SSD backends and the Mamba-2 checkpoint converters.

Metadata only: model code is imported when a model is built (or a backend/converter is used).
"""

from __future__ import annotations

from typing import Any

from zoo_core.hookspecs import RegisterBackend, RegisterCore, RegisterSimple, hookimpl
from zoo_core.plugin_registry import Problem

from .params import Mamba2Params

zoo_api = 1

CARD = """Mamba-2 (Dao & Gu 2024, SSD): in_proj to (z, x, B, C, Δ), causal depthwise conv1d + SiLU over
(x, B, C), per head a scalar A = −exp(A_log): H_t = exp(Δ_t A) H_{t−1} + Δ_t x_t ⊗ B_t, y = H C + D x,
with B, C shared by n_groups groups of heads; Δ = clamp(softplus(dt + dt_bias), dt_limit) · dt_scale
(dt_bias the inverse-softplus of a log-uniform Δ₀); gated RMSNorm (norm_before_gate either way);
out_proj. A ~ U[1, 16] as mamba_ssm. Backends: ssd-chunked (`chunked`: the chunked SSD algorithm, the
quadratic form within chunks as matmuls, states passed across chunks; auto) and ssd-sequential
(`sequential`: the recurrence, the reference). Parameter names equal transformers' Mamba2Mixer, so
transformers and mamba_ssm Mamba-2 checkpoints convert by renaming (`zoo convert`)."""

PRESETS: dict[str, dict[str, Any]] = {
    # odd sizes for tests: 2 heads of head_dim d_model (5 in the suite: not a power of two), 2 groups,
    # a chunk that does not divide the suite's lengths
    "tiny": {"d_state": 3, "d_conv": 3, "expand": 2, "head_dim": None, "n_heads": 2, "n_groups": 2, "chunk_size": 4},
    # mamba2-130m's mixer (d_model 768: 24 heads of 64); head_dim is gcd(expand · d_model, 64) at any width
    "130m": {"d_state": 128, "d_conv": 4, "expand": 2, "n_groups": 1, "chunk_size": 256},
    # a small classifier's mixer (the JapaneseVowels specs)
    "small": {"d_state": 16, "d_conv": 4, "expand": 2, "n_groups": 1, "chunk_size": 64},
}


def _ssd(p: Problem) -> str | None:
    if p.structure != "ssd":
        return f"it computes Mamba-2's SSD scan (structure 'ssd'), not a {p.structure!r} recurrence"
    return None


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register("mamba2", "zoo_mamba2.core:Mamba2", params=Mamba2Params, presets=PRESETS, card=CARD)


@hookimpl
def zoo_register_backends(register: RegisterBackend) -> None:
    register("ssd-sequential", "scan", "zoo_mamba2.ssd:ssd_sequential", priority=0, supports=_ssd,
             aliases=("sequential",),
             description="Mamba-2's SSD scan, reference: the recurrence one step at a time under autograd")
    register("ssd-chunked", "scan", "zoo_mamba2.ssd:ssd_chunked", priority=10, supports=_ssd, aliases=("chunked",),
             description="Mamba-2's chunked SSD algorithm: the quadratic form within chunks as matmuls, states "
                         "passed across chunks by one decay matmul; spec name 'chunked'")


@hookimpl
def zoo_register_converters(register: RegisterSimple) -> None:
    register("transformers-mamba2", "zoo_mamba2.convert:TRANSFORMERS",
             description="Hugging Face transformers Mamba2ForCausalLM folders (config.json + model.safetensors)")
    register("mamba-ssm-mamba2", "zoo_mamba2.convert:MAMBA_SSM",
             description="state-spaces/mamba2-* (mamba_ssm MambaLMHeadModel with Mamba2 layers) folders (config.json + "
                         "pytorch_model.bin, read with torch's weights-only loader)")

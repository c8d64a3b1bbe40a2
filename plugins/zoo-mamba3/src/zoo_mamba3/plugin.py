"""Registers the Mamba-3 (SISO) core and its two trapezoidal-scan backends.

Metadata only: model code is imported when a model is built (or a backend is used).
"""

from __future__ import annotations

from zoo_core.hookspecs import RegisterBackend, RegisterCore, hookimpl
from zoo_core.plugin_registry import Problem

from .params import Mamba3Params

zoo_api = 1

CARD = """Mamba-3, SISO (Lahoti et al. 2026, arXiv 2603.15569), as mamba_ssm's released Mamba3
(is_mimo false): in_proj to (z, x, B, C, Δ, a, λ, θ); no convolution; data-dependent A_t =
−max(softplus(a_t), A_floor); B, C RMS-normed per group, per-head biases (init 1), pairs rotated by
the cumulative angle Σ π·tanh(θ)·Δ (R = N·rope_fraction / 2 shared angles, each head at its own Δ);
trapezoidal discretisation h_t = e^{ΔA} h_{t−1} + λΔ x_t B_tᵀ + (1−λ)Δ e^{ΔA} x_{t−1} B_{t−1}ᵀ,
y = h C + D x, gated by SiLU(z) (outproj_norm: a per-head RMSNorm first), out_proj. Backends:
mamba3-sequential (the recurrence of the release's mamba3_siso_step_ref) and mamba3-chunked
(SSD-style chunks, the trapezoid folded into the chunk matrix; chunk_size). Streams with a constant
state (h, the last x and B, the angle); Δ (and the angle's rate with it) rescale with dt_scale. No
peer runs on CPU (the release's kernels are Triton/CUDA): checked against its reference recurrence,
a float64 L×L re-derivation, and step = forward."""

PRESETS = {
    # odd sizes for tests: 2 heads of d_model (5 in the suite), 2 groups, a chunk that divides no test length
    "tiny": {"d_state": 4, "expand": 2, "nheads": 2, "ngroups": 2, "chunk_size": 4},
    # a small classifier's mixer (the JapaneseVowels specs): headdim gcd(expand · d_model, 64)
    "small": {"d_state": 16, "expand": 2, "ngroups": 1, "chunk_size": 64},
    # the paper's mixer settings (d_state 128, headdim 64 where it divides, chunk 64)
    "paper": {"d_state": 128, "expand": 2, "ngroups": 1, "chunk_size": 64},
}


def _trapezoidal(p: Problem) -> str | None:
    if p.structure != "mamba3":
        return f"it computes Mamba-3's trapezoidal scan (structure 'mamba3'), not a {p.structure!r} recurrence"
    return None


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register("mamba3", "zoo_mamba3.core:Mamba3", params=Mamba3Params, presets=PRESETS, card=CARD)


@hookimpl
def zoo_register_backends(register: RegisterBackend) -> None:
    register("mamba3-sequential", "scan", "zoo_mamba3.scan:trap_scan_sequential", priority=0, supports=_trapezoidal,
             aliases=("sequential",),
             description="Mamba-3's trapezoidal scan, reference: the release's mamba3_siso_step_ref recurrence step by step under autograd")
    register("mamba3-chunked", "scan", "zoo_mamba3.scan:trap_scan_chunked", priority=10, supports=_trapezoidal,
             aliases=("chunked",),
             description="Mamba-3's trapezoidal scan in SSD-style chunks (Q × Q matmuls within a chunk, state "
                         "passing between chunks; chunk_size); spec name 'chunked'")

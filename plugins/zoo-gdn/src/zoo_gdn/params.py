"""Gated DeltaNet's params model: the constructor's keyword arguments and capabilities (torch-free).

Names and defaults follow fla's ``GatedDeltaNet`` layer (``num_heads``, ``head_dim``, ``expand_v``,
``conv_size``, ``conv_bias``, ``use_gate``, ``allow_neg_eigval``, ``norm_eps``). The key width is
either given per head (``head_dim``, any d_model, as fla) or as a multiple of ``d_model``
(``head_dim: auto`` with ``expand_k``; fla's docstring suggests heads · head_dim = 0.75 · hidden_size),
and the rule tying them is checked once, here.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from zoo_core.params import CoreParams


class GatedDeltaNetParams(CoreParams):
    # Input-dependent gates (no "lti"); α_t = exp(g_t) is a per-step decay, not a step size Δ that a
    # sampling rate could rescale, so no "continuous_time": the zoo refuses Δ rescaling for it.
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "packing"})

    num_heads: int = Field(4, ge=1, le=4096, description="heads h, each with its own K × V state")
    head_dim: Literal["auto"] | int = Field(
        16, description="key width K per head (any d_model, as fla); 'auto': expand_k · d_model / num_heads")
    expand_k: float | None = Field(None, gt=0.0, le=16.0, allow_inf_nan=False,
                                   description="with head_dim 'auto': total key width num_heads · K = expand_k · d_model "
                                               "(None: 1.0; fla suggests 0.75)")
    expand_v: float = Field(2.0, gt=0.0, le=16.0, allow_inf_nan=False,
                            description="value width V per head = expand_v · head_dim")
    conv_size: int = Field(4, ge=1, le=1024, description="width of the causal depthwise convolutions on q, k, v")
    conv_bias: bool = Field(False, description="the short convolutions have biases")
    use_gate: bool = Field(True, description="output gate: RMSNorm(o) ⊙ SiLU(g_proj(x)); false: RMSNorm(o) alone")
    allow_neg_eigval: bool = Field(False, description="β = 2·sigmoid(·) ∈ (0, 2): I − βkkᵀ may have a negative eigenvalue")
    norm_eps: float = Field(1e-5, gt=0.0, le=1.0, allow_inf_nan=False, description="ε of the output RMSNorm")
    chunk_size: int = Field(64, ge=1, le=4096, description="chunk length of the chunked (WY) backend")

    @model_validator(mode="after")
    def _widths(self) -> GatedDeltaNetParams:
        if self.head_dim == "auto":
            ek = 1.0 if self.expand_k is None else self.expand_k
            key = ek * self.d_model
            if not (math.isclose(key, round(key)) and round(key) > 0 and round(key) % self.num_heads == 0):
                raise ValueError(
                    f"head_dim 'auto' needs expand_k · d_model = {ek:g} · {self.d_model} = {key:g} to be a positive whole "
                    f"multiple of num_heads = {self.num_heads} (the key width is split evenly across the heads); pick "
                    f"num_heads dividing it, change expand_k, or set head_dim explicitly")
        elif self.head_dim < 1:
            raise ValueError(f"head_dim must be ≥ 1 or 'auto', got {self.head_dim}")
        elif self.expand_k is not None:
            raise ValueError(
                f"head_dim = {self.head_dim} and expand_k = {self.expand_k:g} both set the key width "
                f"(num_heads · head_dim = {self.num_heads * self.head_dim} vs expand_k · d_model = "
                f"{self.expand_k * self.d_model:g}); set one: head_dim with expand_k left unset, or head_dim: auto")
        value = self.expand_v * self.key_head_dim
        if not math.isclose(value, round(value)) or round(value) < 1:
            raise ValueError(f"expand_v · head_dim = {self.expand_v} · {self.key_head_dim} = {value:g} must be a positive "
                             "whole number (the value width per head); pick expand_v so that it is")
        return self

    @property
    def key_head_dim(self) -> int:
        """K: head_dim with 'auto' resolved."""
        if self.head_dim == "auto":
            return round((1.0 if self.expand_k is None else self.expand_k) * self.d_model) // self.num_heads
        return self.head_dim

    @property
    def value_head_dim(self) -> int:
        """V = expand_v · K."""
        return round(self.expand_v * self.key_head_dim)

"""RG-LRU's params model: the Hawk recurrent block's constructor arguments (torch-free).

Names follow transformers' ``RecurrentGemmaConfig`` where one exists (``lru_width``,
``conv_width`` for ``conv1d_width``, ``num_heads`` for ``num_attention_heads``), so a converted
block reads the same; ``c`` and the Λ initialisation are De et al. (2024)'s.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from zoo_core.params import CoreParams


class RGLRUParams(CoreParams):
    # Input-dependent decays: no "lti". Discrete-time: a = σ(Λ)^(c·r_t) has no step size Δ a sampling
    # rate could rescale, so no "continuous_time" (rescale_dt refuses it, naming the core).
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "packing"})

    lru_width: int | None = Field(None, ge=1, le=262_144,
                                  description="width W of the recurrence (linear_x/linear_y outputs); None: d_model")
    num_heads: int = Field(1, ge=1, le=4096,
                           description="blocks of the block-diagonal gate weights; must divide lru_width")
    conv_width: int = Field(4, ge=1, le=1024,
                            description="kernel width K of the causal depthwise temporal convolution (1: pointwise)")
    c: float = Field(8.0, gt=0.0, le=1e4, allow_inf_nan=False,
                     description="the constant c in a_t = σ(Λ)^(c·r_t) (8 in the paper and the reference)")
    a_min: float = Field(0.9, gt=0.0, lt=1.0, allow_inf_nan=False, description="lower end of the decay init range")
    a_max: float = Field(0.999, gt=0.0, lt=1.0, allow_inf_nan=False, description="upper end of the decay init range")
    a_init: Literal["paper", "recurrentgemma"] = Field(
        "paper",
        description="'paper': a^c = σ(Λ)^c ~ U[a_min, a_max] (De et al. 2024); "
                    "'recurrentgemma': σ(Λ)² ~ U[a_min², a_max²] (the reference code's init)",
    )
    gelu_approximate: Literal["tanh", "none"] = Field(
        "tanh", description="GeLU of the y branch: 'tanh' (RecurrentGemma's gelu_pytorch_tanh) or 'none' (exact erf)")

    @model_validator(mode="after")
    def _check(self) -> RGLRUParams:
        width = self.width
        if width % self.num_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must divide lru_width ({width}{'' if self.lru_width else ', = d_model'}): "
                "the gate weights are block-diagonal with lru_width / num_heads channels per head; "
                f"e.g. num_heads: {_a_divisor(width, self.num_heads)}")
        if not self.a_min < self.a_max:
            raise ValueError(f"a_min ({self.a_min}) must be smaller than a_max ({self.a_max}): the decay init range "
                             "0 < a_min < a_max < 1 would be empty; e.g. a_min: 0.9, a_max: 0.999")
        return self

    @property
    def width(self) -> int:
        """W: lru_width with None resolved to d_model."""
        return self.lru_width if self.lru_width is not None else self.d_model


def _a_divisor(width: int, near: int) -> int:
    """The divisor of ``width`` closest to ``near`` (for the error message's example)."""
    return min((d for d in range(1, width + 1) if width % d == 0), key=lambda d: (abs(d - near), d))

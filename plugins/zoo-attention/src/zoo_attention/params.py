"""Attention's params models: the constructor's keyword arguments and the capabilities (torch-free).

Two models because capabilities belong to a core: ``attention`` is causal and streams with a KV
cache (``growing_state``: without a window the cache grows with length; with one it is a ring
buffer of ``window`` slots, so ``grows_state()`` is False); ``attention-bidirectional`` reads the
whole sequence, so it is neither causal nor streamable. Both run packed documents natively
(``packing``: masked to each document). Their fields are the same.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from zoo_core.params import CoreParams


class AttentionParams(CoreParams):
    capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state", "growing_state", "packing"})

    n_heads: int = Field(4, ge=1, le=4096, description="query heads; head_dim = d_model / n_heads")
    n_kv_heads: int | None = Field(None, ge=1, le=4096,
                                   description="key/value heads (grouped-query attention; None: n_heads); divides n_heads")
    window: int | None = Field(None, ge=1, le=2**31 - 1,
                               description="sliding window: a query reads its last `window` positions, itself included "
                                           "(None: all; the streaming cache is then a ring buffer of this size)")
    rope: bool = Field(True, description="rotary position embeddings on queries and keys (head_dim must be even)")
    rope_base: float = Field(10000.0, gt=1.0, le=1e9, allow_inf_nan=False, description="RoPE base θ: frequency i is θ^(−2i/head_dim)")
    bias: bool = Field(False, description="biases on the q, k, v and output projections")

    def grows_state(self) -> bool:
        """The KV cache grows with length without a window; a window makes it a fixed ring buffer."""
        return self.window is None and "growing_state" in self.capabilities

    @model_validator(mode="after")
    def _check(self) -> AttentionParams:
        d, h = self.d_model, self.n_heads
        if d % h:
            raise ValueError(f"n_heads must divide d_model (each head reads d_model / n_heads channels), got d_model={d}, "
                             f"n_heads={h}; use a divisor of {d}, e.g. {max(k for k in range(1, min(d, h) + 1) if d % k == 0)}")
        kv = self.n_kv_heads
        if kv is not None and h % kv:
            raise ValueError(f"n_kv_heads must divide n_heads (query heads share key/value heads in equal groups), "
                             f"got n_heads={h}, n_kv_heads={kv}; use a divisor of {h}")
        if self.rope and (d // h) % 2:
            raise ValueError(f"head_dim = d_model / n_heads = {d}/{h} = {d // h} must be even with rope: true (RoPE rotates "
                             "channel pairs); change d_model or n_heads, or set rope: false")
        return self


class AttentionBidirectionalParams(AttentionParams):
    capabilities: ClassVar[frozenset[str]] = frozenset({"packing"})

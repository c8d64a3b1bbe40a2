"""Registers the attention cores and the two backends of the ``attention`` op. Metadata only: the
model code (torch) is imported when a model is built or a backend is loaded."""

from __future__ import annotations

from zoo_core.hookspecs import RegisterBackend, RegisterCore, hookimpl
from zoo_core.plugin_registry import Problem

from .params import AttentionBidirectionalParams, AttentionParams

zoo_api = 1

PRESETS: dict[str, dict[str, object]] = {
    "tiny": {"n_heads": 1},  # one head of d_model channels: valid with RoPE at every even width the zoo's tests use
    "local": {"n_heads": 4, "n_kv_heads": 1, "window": 64},  # Griffin-style local MQA (paper: window 1024/2048)
    "small": {"n_heads": 4},
    "gqa": {"n_heads": 4, "n_kv_heads": 2},
}

CARD = """Causal multi-head softmax attention (Vaswani et al. 2017) behind the core contract:
y = softmax(QKᵀ/√d + M)V W_o with rotary positions on Q and K (Su et al. 2021), optional grouped
key/value heads (Ainslie et al. 2023) and an optional sliding window (local attention, as in Griffin,
De et al. 2024). Streams with a KV cache: it grows with length, or is a ring buffer of `window` slots."""

BIDIRECTIONAL_CARD = """Bidirectional (non-causal) multi-head softmax attention: every query reads every
valid key (padded keys masked by `lengths`), with the same RoPE, grouped heads and optional symmetric
window as `attention`. For classification; no streaming mode."""


def _softmax(p: Problem) -> str | None:
    return None if p.structure == "softmax" else f"it computes softmax attention, not a {p.structure!r} system"


@hookimpl
def zoo_register_cores(register: RegisterCore) -> None:
    register("attention", "zoo_attention.core:Attention", params=AttentionParams, presets=PRESETS, card=CARD)
    register("attention-bidirectional", "zoo_attention.core:AttentionBidirectional", params=AttentionBidirectionalParams,
             presets=PRESETS, card=BIDIRECTIONAL_CARD)


@hookimpl
def zoo_register_backends(register: RegisterBackend) -> None:
    register("naive", "attention", "zoo_attention.ops:attention_naive", priority=0, supports=_softmax,
             description="softmax(QKᵀ·scale + mask)V written out (the reference; B·H·L² scores in memory)")
    register("sdpa", "attention", "zoo_attention.ops:attention_sdpa", priority=10, supports=_softmax,
             description="torch.nn.functional.scaled_dot_product_attention: flash / memory-efficient kernels where they serve")

"""Weights of transformers' ``RecurrentGemmaRecurrentBlock`` into an ``RGLRU`` core, and its config
into the core's params.

Usage::

    from zoo_rglru.convert import from_transformers_block
    core = from_transformers_block(block.state_dict(), block_config)   # an RGLRU with the same outputs

The mapping is explicit (``RENAMES``); the one change of value is Λ = −recurrent_param (transformers
stores the argument of the softplus, log a = −8·r_t·softplus(recurrent_param); the zoo stores the
paper's Λ, log a = −c·r_t·softplus(−Λ)). Only the recurrent (temporal) block converts: a full
RecurrentGemma checkpoint also has local-attention blocks and MLPs, which the zoo does not build,
so there is no ``zoo convert`` converter for a RecurrentGemma folder.

Torch-free to import (the core is imported when a core is built).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zoo_core.errors import CheckpointError

if TYPE_CHECKING:
    from torch import Tensor

    from .core import RGLRU

# transformers RecurrentGemmaRecurrentBlock key -> RGLRU key
RENAMES: dict[str, str] = {
    **{f"{lin}.{p}": f"{lin}.{p}" for lin in ("linear_y", "linear_x", "linear_out", "conv_1d") for p in ("weight", "bias")},
    "rg_lru.recurrent_param": "Lambda",  # negated
    "rg_lru.input_gate_weight": "input_gate_weight",
    "rg_lru.input_gate_bias": "input_gate_bias",
    "rg_lru.recurrent_gate_weight": "recurrent_gate_weight",
    "rg_lru.recurrent_gate_bias": "recurrent_gate_bias",
}
NEGATED = frozenset({"rg_lru.recurrent_param"})
# which params set each tensor's shape (named in a shape-mismatch error)
_SHAPED_BY = {"linear_y": "lru_width, d_model", "linear_x": "lru_width, d_model", "linear_out": "d_model, lru_width",
              "conv_1d": "lru_width, conv_width", "Lambda": "lru_width", "input_gate": "num_heads, lru_width",
              "recurrent_gate": "num_heads, lru_width"}
_GELU = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}


def _get(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)


def params_from_config(config: Any) -> dict[str, Any]:
    """RGLRU params from a ``RecurrentGemmaConfig`` (or its dict): hidden_size → d_model,
    lru_width (None: hidden_size), num_attention_heads → num_heads, conv1d_width → conv_width,
    hidden_activation → gelu_approximate; c = 8 (the reference's constant)."""
    missing = [k for k in ("hidden_size", "num_attention_heads", "conv1d_width") if _get(config, k) is None]
    if missing:
        raise CheckpointError(f"RecurrentGemma config: missing {', '.join(missing)}; pass a RecurrentGemmaConfig or its "
                              "to_dict() (config.json of a RecurrentGemma checkpoint)")
    act = _get(config, "hidden_activation") or "gelu_pytorch_tanh"
    if act not in _GELU:
        raise CheckpointError(f"RecurrentGemma config: hidden_activation {act!r} has no RGLRU equivalent; the block's "
                              f"y branch is a GeLU: one of {', '.join(sorted(_GELU))}")
    width = _get(config, "lru_width") or _get(config, "hidden_size")
    return {"d_model": int(_get(config, "hidden_size")), "lru_width": int(width),
            "num_heads": int(_get(config, "num_attention_heads")), "conv_width": int(_get(config, "conv1d_width")),
            "c": 8.0, "a_init": "recurrentgemma", "gelu_approximate": _GELU[act]}


def state_dict_from_transformers(state_dict: Mapping[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """Rename (and negate Λ) a ``RecurrentGemmaRecurrentBlock`` state dict, keys under ``prefix``
    (e.g. ``"model.layers.0.temporal_block."``); refuse missing or unexpected keys, naming them."""
    keys = {k.removeprefix(prefix) for k in state_dict if k.startswith(prefix)}
    missing, extra = sorted(set(RENAMES) - keys), sorted(keys - set(RENAMES))
    if missing or extra:
        raise CheckpointError(
            f"not a RecurrentGemmaRecurrentBlock state dict under prefix {prefix!r}: "
            + "; ".join(p for p in (f"missing {missing}" if missing else "", f"unexpected {extra}" if extra else "") if p)
            + ". Pass block.state_dict() of a RecurrentGemmaRecurrentBlock (or the model's with its layer prefix)")
    return {new: (-1 if old in NEGATED else 1) * state_dict[prefix + old] for old, new in RENAMES.items()}


def load_transformers_block(core: RGLRU, state_dict: Mapping[str, Tensor], prefix: str = "") -> RGLRU:
    """Copy a ``RecurrentGemmaRecurrentBlock``'s weights into ``core`` (in its dtype); a tensor whose
    shape differs is refused naming it, both shapes and the params that set it."""
    import torch  # lazy: the module stays torch-free to import

    mapped = state_dict_from_transformers(state_dict, prefix)
    own = core.state_dict()
    bad = [f"{k}: checkpoint {tuple(v.shape)} vs core {tuple(own[k].shape)} (set by {_shaped_by(k)})"
           for k, v in mapped.items() if tuple(v.shape) != tuple(own[k].shape)]
    if bad:
        raise CheckpointError("RecurrentGemmaRecurrentBlock weights do not fit this RGLRU: " + "; ".join(bad)
                              + ". Build the core with params_from_config(config) of the checkpoint's config")
    with torch.no_grad():
        for k, v in mapped.items():
            own[k].copy_(v.to(own[k].dtype))
    return core


def from_transformers_block(state_dict: Mapping[str, Tensor], config: Any, prefix: str = "", **overrides: Any) -> RGLRU:
    """An ``RGLRU`` built from a ``RecurrentGemmaConfig`` (params ``overrides`` win: dtype, backend)
    with the block's weights loaded."""
    from .core import RGLRU  # lazy: imports torch

    return load_transformers_block(RGLRU(**{**params_from_config(config), **overrides}), state_dict, prefix)


def state_dict_to_transformers(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of ``state_dict_from_transformers``: an RGLRU state dict in the
    ``RecurrentGemmaRecurrentBlock`` layout (e.g. to run the reference on the zoo's weights)."""
    return {old: (-1 if old in NEGATED else 1) * state_dict[new] for old, new in RENAMES.items()}


def _shaped_by(key: str) -> str:
    return next((v for k, v in _SHAPED_BY.items() if key.startswith(k)), "the config")

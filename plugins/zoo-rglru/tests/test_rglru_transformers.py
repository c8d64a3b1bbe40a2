"""Parity with transformers' ``RecurrentGemmaRecurrentBlock`` (test-only dependency): both built
locally from one small odd config (hidden 24, lru_width 36, 3 heads), weights copied through the
converter, outputs to 1e-5 relative in float32; prefill + decode of the reference equals the zoo's
forward + step; and the converter's errors name what does not fit."""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.errors import CheckpointError
from zoo_rglru.convert import (
    from_transformers_block,
    load_transformers_block,
    params_from_config,
    state_dict_to_transformers,
)
from zoo_rglru.core import RGLRU

tr = pytest.importorskip("transformers")
from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRecurrentBlock  # noqa: E402

B, L, DECODE = 2, 19, 6


def _reference(hidden: int = 24, width: int = 36, heads: int = 3, conv: int = 4, seed: int = 0) -> tuple:
    cfg = tr.RecurrentGemmaConfig(hidden_size=hidden, lru_width=width, num_attention_heads=heads, conv1d_width=conv,
                                  num_hidden_layers=1, vocab_size=11, intermediate_size=8)
    torch.manual_seed(seed)
    block = RecurrentGemmaRecurrentBlock(cfg, layer_idx=0).eval()
    with torch.no_grad():  # random weights, biases included, and the reference's decay init
        for p in block.parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else 10
            p.copy_(torch.randn_like(p) / math.sqrt(fan_in))
        u = torch.empty(width).uniform_(0.9**2, 0.999**2)
        block.rg_lru.recurrent_param.copy_(torch.log(1 / u.sqrt() - 1))  # softplus(·) = −log a, a² ~ U[0.81, 0.998]
    return cfg, block


def _rel(ref: torch.Tensor, out: torch.Tensor) -> float:
    return ((out - ref).norm() / ref.norm()).item()


def _positions(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n)[None].expand(B, n)


@pytest.mark.parametrize("backend,sizes", [("naive", (24, 36, 3, 4)), ("scan", (24, 36, 3, 4)), ("auto", (24, 36, 3, 4)),
                                           ("auto", (10, 14, 2, 3))])  # (hidden, lru_width, heads, conv width)
def test_outputs_equal_the_reference_block(backend, sizes):
    cfg, block = _reference(*sizes)
    core = from_transformers_block(block.state_dict(), cfg, backend=backend).eval()
    x = torch.randn(B, L, sizes[0])
    with torch.no_grad():
        ref, _ = block(x, _positions(0, L), None, use_cache=False)
        out = core(x)
    assert _rel(ref, out) < 1e-5
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


def test_prefill_then_decode_equals_zoo_forward_and_step():
    cfg, block = _reference(seed=1)
    core = from_transformers_block(block.state_dict(), cfg).eval()
    x = torch.randn(B, L + DECODE, 24)
    with torch.no_grad():
        block.conv1d_state = None
        ref = [block(x[:, :L], _positions(0, L), None, use_cache=True)[0]]
        for t in range(L, L + DECODE):  # the reference's decoding mode, one token and its position at a time
            ref.append(block(x[:, t : t + 1], _positions(t, 1), None, use_cache=True)[0])
        ref_all = torch.cat(ref, 1)  # (B, L + DECODE, H)
        y, state = core.forward_with_state(x[:, :L])
        ys = [y]
        for t in range(L, L + DECODE):
            y_t, state = core.step(x[:, t], state)
            ys.append(y_t[:, None])
        stepped = [core.step(x[:, t], s)[0] for t, s in _unroll_states(core, x)]
    assert _rel(ref_all, torch.cat(ys, 1)) < 1e-5
    assert _rel(ref_all, torch.stack(stepped, 1)) < 1e-5  # the zoo's step from scratch, every token
    # the reference's recurrent state is the zoo's h
    torch.testing.assert_close(state["h"], block.rg_lru.recurrent_states, rtol=1e-5, atol=1e-6)


def _unroll_states(core: RGLRU, x: torch.Tensor) -> list[tuple[int, dict]]:
    """(t, state before step t) for every t, stepping from init_state."""
    state, out = core.init_state(x.shape[0]), []
    for t in range(x.shape[1]):
        out.append((t, state))
        _, state = core.step(x[:, t], state)
    return out


def test_params_from_config_map_each_field():
    cfg, _ = _reference()
    assert params_from_config(cfg) == {"d_model": 24, "lru_width": 36, "num_heads": 3, "conv_width": 4, "c": 8.0,
                                       "a_init": "recurrentgemma", "gelu_approximate": "tanh"}
    assert params_from_config({**cfg.to_dict(), "lru_width": None})["lru_width"] == 24
    with pytest.raises(CheckpointError, match="hidden_activation 'relu'"):
        params_from_config({**cfg.to_dict(), "hidden_activation": "relu"})


def test_lambda_is_the_negated_recurrent_param():
    cfg, block = _reference()
    core = from_transformers_block(block.state_dict(), cfg)
    torch.testing.assert_close(core.Lambda.detach(), -block.rg_lru.recurrent_param.detach())


def test_mismatched_shapes_are_named_with_the_params_that_set_them():
    cfg, block = _reference()
    core = RGLRU(**{**params_from_config(cfg), "lru_width": 30})
    with pytest.raises(CheckpointError, match=r"linear_x\.weight: checkpoint \(36, 24\) vs core \(30, 24\) \(set by lru_width"):
        load_transformers_block(core, block.state_dict())


def test_missing_and_unexpected_keys_are_named():
    cfg, block = _reference()
    sd = dict(block.state_dict())
    sd.pop("rg_lru.recurrent_param")
    sd["extra.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"missing \['rg_lru.recurrent_param'\]; unexpected \['extra.weight'\]"):
        from_transformers_block(sd, cfg)
    prefixed = {f"model.layers.0.temporal_block.{k}": v for k, v in block.state_dict().items()}
    core = from_transformers_block(prefixed, cfg, prefix="model.layers.0.temporal_block.")
    assert torch.equal(core.linear_x.weight, block.linear_x.weight)


def test_state_dict_to_transformers_is_the_inverse():
    cfg, block = _reference()
    back = state_dict_to_transformers(from_transformers_block(block.state_dict(), cfg).state_dict())
    ref = block.state_dict()
    assert set(back) == set(ref)
    for k, v in ref.items():
        assert torch.equal(back[k], v), k

"""The Gated DeltaNet layer: equal to fla's pipeline written out from the same weights, prefill then
step equals one forward, the initialisation is fla's (Mamba-2's), backends are chosen by name, bad
params are refused naming the field and the rule, and Δ rescaling is refused (discrete-time)."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from zoo_core.build import build_model
from zoo_core.errors import CoreArgumentError, SpecError
from zoo_core.nn.model import rescale_sampling_rate
from zoo_gdn.core import GatedDeltaNet
from zoo_gdn.ops import gated_delta_sequential
from zoo_gdn.params import GatedDeltaNetParams

F64 = torch.float64
HERE = os.path.dirname(__file__)


def perturbed(core: GatedDeltaNet, seed: int = 0) -> GatedDeltaNet:
    """Move every parameter away from its init (the norm weight off 1, conv biases off 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return core


def written_out(core: GatedDeltaNet, x: torch.Tensor, recurrence) -> torch.Tensor:
    """fla's GatedDeltaNet.forward, step by step from the parameters, with ``recurrence`` fla's
    naive op (q scaled by it: scale=None means K^−½) or this package's."""
    h, K, V, W = core.num_heads, core.head_k_dim, core.head_v_dim, core.conv_size

    def short_conv(conv: torch.nn.Conv1d, u: torch.Tensor) -> torch.Tensor:  # ShortConvolution, SiLU
        return F.silu(F.conv1d(F.pad(u.transpose(1, 2), (W - 1, 0)), conv.weight, conv.bias, groups=u.shape[-1])).transpose(1, 2)

    def l2(u: torch.Tensor) -> torch.Tensor:
        return u / torch.sqrt(u.square().sum(-1, keepdim=True) + 1e-6)

    q = l2(short_conv(core.q_conv1d, core.q_proj(x)).unflatten(-1, (h, K)))
    k = l2(short_conv(core.k_conv1d, core.k_proj(x)).unflatten(-1, (h, K)))
    v = short_conv(core.v_conv1d, core.v_proj(x)).unflatten(-1, (h, V))
    beta = torch.sigmoid(core.b_proj(x)) * (2.0 if core.allow_neg_eigval else 1.0)
    g = -core.A_log.exp() * F.softplus(core.a_proj(x) + core.dt_bias)
    o, _ = recurrence(q, k, v, beta, g)
    o = o.to(x.dtype)
    o = o / torch.sqrt(o.square().mean(-1, keepdim=True) + core.o_norm.eps) * core.o_norm.weight
    if core.g_proj is not None:
        o = o * F.silu(core.g_proj(x).unflatten(-1, (h, V)))
    return core.o_proj(o.flatten(-2))


@pytest.mark.parametrize("backend", ["sequential", "chunked"])
@pytest.mark.parametrize("kw", [{}, {"use_gate": False, "allow_neg_eigval": True, "conv_bias": True}])
def test_layer_equals_fla_pipeline_written_out(backend, kw):
    core = perturbed(GatedDeltaNet(7, num_heads=2, head_dim=3, expand_v=5 / 3, conv_size=3, chunk_size=4,
                                   backend=backend, dtype=F64, **kw))
    x = torch.randn(2, 13, 7, dtype=F64)

    def ours(q, k, v, beta, g):
        return gated_delta_sequential(q * q.shape[-1] ** -0.5, k, v, beta, g)

    torch.testing.assert_close(core(x), written_out(core, x, ours), rtol=1e-10, atol=1e-10)


def test_layer_equals_fla_pipeline_with_flas_naive_recurrence():
    """fla's own naive op (and its default scale K^−½) inside the written-out layer: to 1e-5 (it computes in float32)."""
    pytest.importorskip("einops", reason="needs einops: pip install -e 'plugins/zoo-gdn[test]'")
    from zoo_gdn.fla_reference import FlaUnavailableError, load_fla_naive

    try:
        fla = load_fla_naive()
    except FlaUnavailableError as exc:
        pytest.skip(str(exc))
    core = perturbed(GatedDeltaNet(6, num_heads=2, head_dim=3, expand_v=2.0, conv_size=4, chunk_size=5))
    x = torch.randn(2, 11, 6)
    ref = written_out(core, x, lambda q, k, v, beta, g: fla.naive_recurrent_gated_delta_rule(q, k, v, beta, g))
    torch.testing.assert_close(core(x), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["sequential", "chunked"])
def test_prefill_then_step_equals_one_forward(backend):
    core = perturbed(GatedDeltaNet(5, num_heads=1, head_dim=3, expand_v=1.0, conv_size=4, chunk_size=4,
                                   backend=backend, dtype=F64))
    x = torch.randn(2, 19, 5, dtype=F64)
    whole, final = core.forward_with_state(x)
    y, state = core.forward_with_state(x[:, :6])
    ys = [y]
    for t in range(6, 19):
        y_t, state = core.step(x[:, t], state)
        ys.append(y_t[:, None])
    torch.testing.assert_close(torch.cat(ys, 1), whole)
    for key in ("conv", "ssm"):
        assert state[key].shape == final[key].shape == core.init_state(2)[key].shape
        torch.testing.assert_close(state[key], final[key])
    assert final["conv"].shape == (2, 3 + 3 + 3, 3) and final["ssm"].shape == (2, 1, 3, 3)


def test_the_conv_state_holds_the_last_projected_inputs():
    core = GatedDeltaNet(4, num_heads=2, head_dim=2, expand_v=1.0, conv_size=3, dtype=F64)
    x = torch.randn(1, 6, 4, dtype=F64)
    _, state = core.forward_with_state(x)
    qkv = torch.cat([core.q_proj(x), core.k_proj(x), core.v_proj(x)], -1)  # (1, 6, 12)
    torch.testing.assert_close(state["conv"], qkv[:, -2:].transpose(1, 2))


def test_backends_by_name_and_auto():
    assert GatedDeltaNet(4).backend_choice.label() == "delta: scan=gdn-chunked"
    assert GatedDeltaNet(4, backend="naive").backend_choice.label() == "delta: scan=gdn-sequential"
    assert GatedDeltaNet(4, backend="sequential").backend_choice.label() == "delta: scan=gdn-sequential"
    assert GatedDeltaNet(4, backend="chunked").backend_choice.label() == "delta: scan=gdn-chunked"


def test_initialisation_is_mamba2s_as_fla_has_it():
    torch.manual_seed(0)
    core = GatedDeltaNet(8, num_heads=512, head_dim=1, expand_v=1.0)
    A = core.A_log.detach().exp()
    assert core.A_log.dtype == torch.float32 and float(A.min()) >= 0.0 and float(A.max()) <= 16.0
    assert 6.0 < float(A.mean()) < 10.0  # U[0, 16]
    dt = F.softplus(core.dt_bias.detach())
    assert float(dt.min()) >= 1e-3 * (1 - 1e-5) and float(dt.max()) <= 0.1 * (1 + 1e-5)
    assert abs(float(dt.log().mean()) - 0.5 * (math.log(1e-3) + math.log(0.1))) < 0.3  # log-uniform
    assert torch.equal(core.o_norm.weight, torch.ones(1))
    assert set(core.optim_hints()) == {"A_log", "dt_bias"}


def test_parameter_names_are_flas():
    names = {n for n, _ in GatedDeltaNet(8, conv_bias=True).named_parameters()}
    assert names == {"q_proj.weight", "k_proj.weight", "v_proj.weight", "a_proj.weight", "b_proj.weight", "A_log",
                     "dt_bias", "q_conv1d.weight", "q_conv1d.bias", "k_conv1d.weight", "k_conv1d.bias",
                     "v_conv1d.weight", "v_conv1d.bias", "g_proj.weight", "o_norm.weight", "o_proj.weight"}


@pytest.mark.parametrize("bad,field,rule", [
    ({"chunk_size": 0}, "chunk_size", "greater than or equal to 1"),
    ({"chunk_size": -4}, "chunk_size", "greater than or equal to 1"),
    ({"num_heads": 0}, "num_heads", "greater than or equal to 1"),
    ({"head_dim": "auto", "num_heads": 3}, "num_heads", "whole multiple of num_heads"),
    ({"head_dim": "auto", "expand_k": 0.3}, "expand_k", "whole multiple of num_heads"),
    ({"head_dim": 4, "expand_k": 0.75}, "expand_k", "both set the key width"),
    ({"head_dim": 0}, "head_dim", "must be ≥ 1"),
    ({"head_dim": "half"}, "head_dim", "'auto'"),
    ({"expand_v": 1.1}, "expand_v", "positive whole number"),
    ({"conv_size": 0}, "conv_size", "greater than or equal to 1"),
    ({"norm_eps": 0.0}, "norm_eps", "greater than 0"),
    ({"use_gate": 1}, "use_gate", "valid boolean"),
    ({"dt_scale": 2.0}, "dt_scale", "Extra inputs are not permitted"),
])
def test_bad_params_are_refused_naming_the_field(bad, field, rule):
    with pytest.raises(ValidationError) as info:
        GatedDeltaNetParams.model_validate({"d_model": 8, **bad})
    assert field in str(info.value) and rule in str(info.value)
    if "dt_scale" not in bad:
        with pytest.raises(CoreArgumentError, match=f"^GatedDeltaNet: invalid constructor argument.*{rule}"):
            GatedDeltaNet(8, **bad)


def test_bad_spec_names_the_key_path():
    spec = {"schema_version": 1, "task": {"kind": "lm"}, "input": {"vocab_size": 9},
            "model": {"d_model": 8, "depth": 1, "core": {"kind": "gdn", "preset": "tiny", "chunk_size": 0}}}
    with pytest.raises(SpecError, match="chunk_size"):
        build_model(spec)


def test_rescaling_the_sampling_rate_is_refused_discrete_time():
    model = build_model(os.path.join(HERE, "..", "specs", "gdn-classifier.yaml"), seed=0)
    assert "continuous_time" not in type(model.cores()[0]).capabilities
    with pytest.raises(ValueError, match="discrete-time"):
        rescale_sampling_rate(model, 2.0)


def test_example_specs_build():
    for name, params in (("gdn-lm-tiny", 75_024), ("gdn-classifier", 12_113)):
        model = build_model(os.path.join(HERE, "..", "specs", f"{name}.yaml"), seed=0)
        assert sum(p.numel() for p in model.parameters()) == params


@pytest.mark.parametrize("drop", ["conv", "ssm"])
def test_a_state_without_its_keys_is_refused_naming_them(drop):
    core = GatedDeltaNet(4, num_heads=1, head_dim=2)
    state = core.init_state(1)
    del state[drop]
    with pytest.raises(ValueError, match=rf"GatedDeltaNet state lacks \['{drop}'\].*init_state"):
        core(torch.randn(1, 3, 4), state)
    with pytest.raises(ValueError, match=rf"GatedDeltaNet state lacks \['{drop}'\]"):
        core.step(torch.randn(1, 4), state)

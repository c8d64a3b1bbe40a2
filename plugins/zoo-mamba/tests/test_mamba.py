"""The Mamba mixer's own maths: transformers' MambaMixer with the same weights gives the same
output, MambaSL's switches equal a written-out loop, the initialisation is mamba_ssm's, prefill then
step equals one forward, and bad params are refused with the field named."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from zoo_core.build import build_model
from zoo_core.errors import CoreArgumentError, SpecError
from zoo_mamba.core import Mamba
from zoo_mamba.params import MambaParams

F64 = torch.float64


def perturbed(core: Mamba, seed: int = 0) -> Mamba:
    """Move every parameter away from its init so no symmetry hides a mistake."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return core


@pytest.mark.requires("transformers")
def test_equals_transformers_mambamixer_with_the_same_weights():
    import transformers as tf
    from transformers.models.mamba.modeling_mamba import MambaMixer

    torch.manual_seed(0)
    cfg = tf.MambaConfig(hidden_size=21, state_size=5, conv_kernel=3, expand=2, num_hidden_layers=1, use_bias=True)
    ref = MambaMixer(cfg, 0).double().eval()
    with torch.no_grad():
        ref.init_mamba_weights()
    ours = Mamba(21, d_state=5, d_conv=3, expand=2, bias=True, dtype=F64)
    assert sorted(ours.state_dict()) == sorted(ref.state_dict())  # conversion is renaming
    ours.load_state_dict(perturbed(ref).state_dict())
    x = torch.randn(2, 13, 21, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-6, atol=1e-8)  # transformers runs parts in float32


def mambasl_reference(core: Mamba, x: torch.Tensor) -> torch.Tensor:
    """models.md §11 written out step by step, independent of the core's code paths."""
    Di, N, K = core.d_inner, core.d_state, core.d_conv
    xi, z = core.in_proj(x).chunk(2, -1)  # (B, L, Di)
    pad = torch.cat([x.new_zeros(x.shape[0], K - 1, Di), xi], 1)  # (B, K−1+L, Di)
    w = core.conv1d.weight[:, 0]  # (Di, K)
    A = -torch.exp(core.A_log)  # (Di, N)
    h = x.new_zeros(x.shape[0], Di, N)
    ys = []
    for t in range(x.shape[1]):
        u = F.silu((pad[:, t:t + K] * w.T).sum(1) + core.conv1d.bias)  # (B, Di)
        parts = dict(zip(("dt", "B", "C"), core.x_proj(u).split(core._split, -1), strict=True)) if core.x_proj is not None else {}
        dt = F.softplus(core.dt_proj(parts["dt"]) if core.tv_dt else core.dt_proj.bias.expand(u.shape))  # (B, Di)
        Bt = parts["B"][:, None] if core.tv_B else core.B  # (B, 1, N) | (Di, N)
        Ct = parts["C"][:, None] if core.tv_C else core.C
        h = torch.exp(dt[..., None] * A) * h + (dt * u)[..., None] * Bt
        y = (h * Ct).sum(-1) + (core.D * u if core.use_D else 0)
        ys.append(y * F.silu(z[:, t]))
    return core.out_proj(torch.stack(ys, 1))


@pytest.mark.parametrize("tv_dt,tv_B,tv_C,use_D", [(1, 1, 1, 1), (0, 0, 0, 0), (1, 0, 1, 0), (0, 1, 0, 1), (1, 1, 0, 1)])
@pytest.mark.parametrize("backend", ["naive", "scan"])
def test_mambasl_switches_equal_the_written_out_loop(tv_dt, tv_B, tv_C, use_D, backend):
    torch.manual_seed(1)
    core = perturbed(Mamba(6, d_state=3, d_conv=3, expand=1, tv_dt=bool(tv_dt), tv_B=bool(tv_B), tv_C=bool(tv_C),
                           use_D=bool(use_D), backend=backend, dtype=F64))
    x = torch.randn(2, 11, 6, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(core(x), mambasl_reference(core, x), rtol=1e-10, atol=1e-12)


def test_mambasl_layout_names_and_missing_pieces():
    full = Mamba(8, d_state=4)
    assert set(dict(full.named_parameters())) == {"in_proj.weight", "conv1d.weight", "conv1d.bias", "x_proj.weight",
                                                  "dt_proj.weight", "dt_proj.bias", "A_log", "D", "out_proj.weight"}
    sl = Mamba(8, d_state=4, expand=1, tv_dt=False, tv_B=False, tv_C=False, use_D=False)
    assert set(dict(sl.named_parameters())) == {"in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_proj.bias",
                                                "B", "C", "A_log", "out_proj.weight"}  # MambaSL's names
    assert sl.x_proj is None and sl.D is None and sl.B.shape == (8, 4)
    assert bool((sl.B >= 0).all() and (sl.B < 1).all())  # U[0, 1)
    only_C = Mamba(8, d_state=4, tv_dt=False, tv_B=False)
    assert only_C.x_proj.weight.shape == (4, 16)  # x_proj emits only C
    assert set(only_C.optim_hints()) == {"A_log", "D", "B"}
    assert all(h.weight_decay == 0.0 for h in only_C.optim_hints().values())


def test_initialisation_is_mamba_ssms():
    torch.manual_seed(2)
    core = Mamba(64, d_state=16, expand=2, dt_min=1e-3, dt_max=0.1, dtype=F64)
    Di, R = 128, 4  # dt_rank auto = ceil(64 / 16)
    assert core.dt_rank == R and core.x_proj.weight.shape == (R + 32, Di) and core.dt_proj.weight.shape == (Di, R)
    torch.testing.assert_close(core.A_log, torch.log(torch.arange(1, 17, dtype=F64)).expand(Di, 16))
    torch.testing.assert_close(core.D, torch.ones(Di, dtype=F64))
    dt = F.softplus(core.dt_proj.bias)
    assert bool((dt >= 1e-3 * (1 - 1e-9)).all() and (dt <= 0.1 * (1 + 1e-9)).all())
    logdt = torch.log(dt)  # log-uniform on [log dt_min, log dt_max]: mean at the midpoint
    assert abs(logdt.mean().item() - (math.log(1e-3) + math.log(0.1)) / 2) < 0.4
    assert core.dt_proj.weight.abs().max() <= R**-0.5 and core.dt_proj.weight.std() > 0.2 * R**-0.5
    const = Mamba(64, dt_init="constant", dt_scale=2.0, dtype=F64)
    torch.testing.assert_close(const.dt_proj.weight, torch.full((128, 4), 2.0 * R**-0.5, dtype=F64))
    floor = Mamba(8, dt_min=1e-6, dt_max=1e-5, dt_init_floor=1e-4, dtype=F64)
    torch.testing.assert_close(F.softplus(floor.dt_proj.bias), torch.full((16,), 1e-4, dtype=F64))
    assert Mamba(8, dtype=torch.bfloat16).A_log.dtype == torch.float32  # A_log and D never half


def test_prefill_then_step_equals_one_forward():
    torch.manual_seed(3)
    core = perturbed(Mamba(7, d_state=4, d_conv=4, dtype=F64)).eval()
    x = torch.randn(2, 19, 7, dtype=F64)
    with torch.no_grad():
        full = core(x)
        y, state = core.forward_with_state(x[:, :9])
        outs = [y]
        for t in range(9, 19):
            y_t, state = core.step(x[:, t], state)
            outs.append(y_t[:, None])
        torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-12)
        # chunks shorter than the convolution's memory (K − 1 = 3) carry it too
        state, outs = None, []
        for t0 in range(0, 19, 2):
            y, state = core.forward_with_state(x[:, t0:t0 + 2], state)
            outs.append(y)
        torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-12)


def test_state_holds_the_last_conv_inputs_and_the_ssm_state():
    core = Mamba(5, d_state=3, d_conv=4, dtype=F64)
    x = torch.randn(2, 6, 5, dtype=F64)
    with torch.no_grad():
        _, state = core.forward_with_state(x)
        xi = core.in_proj(x)[..., :core.d_inner]  # (B, L, Di): the convolution's inputs
    assert state["conv"].shape == (2, 10, 3) and state["ssm"].shape == (2, 10, 3)
    torch.testing.assert_close(state["conv"], xi[:, -3:].transpose(1, 2))
    init = Mamba(5, d_conv=1).init_state(3)
    assert init["conv"].shape == (3, 10, 0) and init["ssm"].dtype == torch.float32
    assert Mamba(5, dtype=torch.bfloat16).init_state(1)["ssm"].dtype == torch.float32


@pytest.mark.parametrize("bad,field,rule", [
    ({"dt_min": 0.2, "dt_max": 0.1}, "dt_min", "must not exceed dt_max"),
    ({"dt_rank": 0}, "dt_rank", "between 1 and the inner width"),
    ({"dt_rank": 11}, "dt_rank", "between 1 and the inner width"),
    ({"dt_rank": 2, "tv_dt": False}, "dt_rank", "tv_dt is false"),
    ({"dt_rank": "full"}, "dt_rank", "auto"),
    ({"expand": 0}, "expand", "greater than or equal to 1"),
    ({"expand": 1.5}, "expand", "valid integer"),
    ({"d_state": 0}, "d_state", "greater than or equal to 1"),
    ({"dt_init": "normal"}, "dt_init", "'random' or 'constant'"),
    ({"dt_min": 0.0}, "dt_min", "greater than 0"),
    ({"tv_B": 1}, "tv_B", "valid boolean"),
    ({"d_inner": 10}, "d_inner", "Extra inputs are not permitted"),
])
def test_bad_params_are_refused_naming_the_field(bad, field, rule):
    with pytest.raises(ValidationError) as info:
        MambaParams.model_validate({"d_model": 5, **bad})
    assert field in str(info.value) and rule in str(info.value)
    if "d_inner" not in bad:
        with pytest.raises(CoreArgumentError, match=f"^Mamba: invalid constructor argument.*{field}.*{rule}"):
            Mamba(5, **bad)  # the constructor checks the same rules, with the core named


def test_bad_spec_names_the_key_path():
    spec = {"schema_version": 1, "task": {"kind": "lm"}, "input": {"vocab_size": 9},
            "model": {"d_model": 8, "depth": 1, "core": {"kind": "mamba", "preset": "tiny", "dt_rank": 99}}}
    with pytest.raises(SpecError, match="dt_rank"):
        build_model(spec)


def test_example_specs_build():
    here = os.path.join(os.path.dirname(__file__), "..", "specs")
    for name, params in (("mamba-lm-tiny", 71_616), ("mambasl-heartbeat", None)):
        model = build_model(os.path.join(here, f"{name}.yaml"), seed=0)
        if params is not None:
            assert sum(p.numel() for p in model.parameters()) == params


def test_half_input_runs_at_the_cores_own_dtype():
    """A float32 core casts bfloat16 input up (it used to fail inside in_proj with a matmul dtype error);
    a core built in bfloat16 runs it in bfloat16, its selective scan accumulating in float32. Both
    return bfloat16, and a float16 input to the bfloat16 core is cast to bfloat16, not refused."""
    x = torch.randn(2, 5, 8)
    core = Mamba(8)
    y = core(x.bfloat16())
    assert y.dtype == torch.bfloat16 and (y.float() - core(x.bfloat16().float())).norm() / y.float().norm() < 1e-2
    half = Mamba(8, dtype=torch.bfloat16)
    assert half.compute_dtype() == torch.bfloat16
    for dtype in (torch.bfloat16, torch.float16):
        y = half(x.to(dtype))
        assert y.dtype == dtype and bool(torch.isfinite(y.float()).all())

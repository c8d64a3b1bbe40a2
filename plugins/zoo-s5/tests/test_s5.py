"""S5's own maths: the conjugate half against the full state, the block HiPPO-N spectrum, the
init scales (JAX fan conventions), the bidirectional scan, the parameter count, bad params."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from pydantic import ValidationError

from zoo_core.init.hippo import legs_normal
from zoo_core.nn.blocks import count_params
from zoo_s5.core import S5, NotCausalError, S5Bidirectional
from zoo_s5.init import TRUNC_STD, block_hippo_n
from zoo_s5.params import S5Params

F64 = torch.float64


def _perturbed(cls=S5, seed=0, **kw):
    """A float64 layer whose Λ and D are moved off their init, so no symmetry hides a bug."""
    torch.manual_seed(seed)
    layer = cls(dtype=F64, **{"d_model": 3, "d_state": 8, "blocks": 2, **kw})
    with torch.no_grad():
        layer.Lambda_re.add_(0.3 * torch.rand_like(layer.Lambda_re) - 0.2)
        layer.Lambda_im.mul_(1 + 0.1 * torch.randn_like(layer.Lambda_im))
        layer.log_step.add_(torch.rand_like(layer.log_step))
    return layer


def _by_hand(layer, disc):
    """(Λ̄, B̄) from the paper's formulas, per state."""
    lam = torch.complex(layer.Lambda_re, layer.Lambda_im)  # (P,)
    dt = torch.exp(layer.log_step) * layer.dt_scale  # (P,)
    Bt = torch.view_as_complex(layer.B)  # (P, H)
    if disc == "zoh":
        a = torch.exp(lam * dt)
        return a, ((a - 1) / lam)[:, None] * Bt
    a = (1 + dt * lam / 2) / (1 - dt * lam / 2)
    return a, (dt / (1 - dt * lam / 2))[:, None] * Bt


def _loop(a, b_bar, u, reverse=False):
    """Sequential x_t = a ⊙ x_{t∓1} + B̄ u_t; (B, L, P)."""
    steps = range(u.shape[1] - 1, -1, -1) if reverse else range(u.shape[1])
    x = torch.zeros(u.shape[0], a.shape[0], dtype=a.dtype)
    out = [None] * u.shape[1]
    for t in steps:
        x = a * x + u[:, t].to(a.dtype) @ b_bar.T
        out[t] = x
    return torch.stack(out, 1)


@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
@pytest.mark.parametrize("backend", ["naive", "scan"])
def test_conj_half_equals_the_full_state_system(disc, backend):
    """Expanding x and C̃ with their conjugates gives the N-state system y = Re(C_full x_full) + Du,
    written out from the paper's formulas (no factor 2 there): the stored half is exact."""
    layer = _perturbed(discretizer=disc, backend=backend, dt_scale=1.7)
    u = torch.randn(2, 41, 3, dtype=F64)
    a, b_bar = _by_hand(layer, disc)
    a_full, b_full = torch.cat([a, a.conj()]), torch.cat([b_bar, b_bar.conj()])  # (N,), (N, H)
    C = torch.view_as_complex(layer.C)  # (H, P)
    C_full = torch.cat([C, C.conj()], -1)  # (H, N)
    x_full = _loop(a_full, b_full, u)  # (B, L, N)
    y_full = (x_full @ C_full.T).real + layer.D * u
    with torch.no_grad():
        y, state = layer.forward_with_state(u)
    torch.testing.assert_close(y, y_full, rtol=1e-10, atol=1e-12)
    P = layer.d_state // 2
    torch.testing.assert_close(state["h"], x_full[:, -1, :P], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(state["h"].conj(), x_full[:, -1, P:], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("N,J", [(8, 1), (8, 2), (16, 4), (64, 8), (64, 1)])
def test_block_hippo_n_spectrum(N, J):
    """blockdiag(HiPPO-N): real parts −½, imaginary parts in ± pairs; the stored half plus its
    conjugates is exactly that spectrum, and 2 Re(V diag(Λ) V*) rebuilds the block matrix."""
    S = torch.block_diag(*[legs_normal(N // J)] * J)  # (N, N) float64
    eig = torch.linalg.eigvals(S)  # (N,)
    torch.testing.assert_close(eig.real, torch.full((N,), -0.5, dtype=F64), rtol=0, atol=1e-10)
    im = torch.sort(eig.imag).values
    torch.testing.assert_close(im, -im.flip(0), rtol=0, atol=1e-10)
    assert bool((im.abs() > 1e-6).all())  # even blocks: no unpaired ω = 0
    lam, V = block_hippo_n(N, J)  # (N/2,), (N, N/2)
    assert bool((lam.imag < 0).all())
    both = torch.sort(torch.cat([lam, lam.conj()]).imag).values
    torch.testing.assert_close(both, im, rtol=0, atol=1e-10)
    torch.testing.assert_close(2 * (V @ torch.diag(lam) @ V.mH).real, S, rtol=0, atol=1e-12)
    torch.testing.assert_close(V.mH @ V, torch.eye(N // 2, dtype=V.dtype), rtol=0, atol=1e-12)


def test_layer_init_is_the_block_spectrum_and_dt_per_state():
    layer = S5(d_model=4, d_state=16, blocks=4, dt_min=1e-3, dt_max=1e-1, dtype=F64)
    lam, _ = block_hippo_n(16, 4)
    torch.testing.assert_close(layer.Lambda(), lam)
    torch.testing.assert_close(layer.Lambda_im[:2], layer.Lambda_im[2:4])  # blocks repeat
    dt = layer.step_sizes()
    assert dt.shape == (8,) and dt.min() >= 1e-3 * (1 - 1e-9) and dt.max() <= 1e-1 * (1 + 1e-9)


def test_B_tilde_is_V_inverse_of_a_real_lecun_normal_B():
    """B = 2Re(V B̃) is real with V⁻¹B = B̃ again, variance 1/N (fan_in = N), |B| ≤ 2σ/0.8796."""
    torch.manual_seed(0)
    N, H = 64, 128
    layer = S5(d_model=H, d_state=N, blocks=8, dtype=F64)
    _, V = block_hippo_n(N, 8)
    Bt = torch.view_as_complex(layer.B)  # (P, H)
    B = 2 * (V @ Bt).real  # (N, H)
    torch.testing.assert_close(V.mH @ B.to(V.dtype), Bt, rtol=0, atol=1e-12)
    assert abs(B.var().item() * N - 1) < 0.05
    assert B.abs().max() <= 2 / math.sqrt(N) / TRUNC_STD + 1e-12


@pytest.mark.parametrize("c_init,mean_sq", [
    ("trunc_standard_normal", lambda H, N: 2 / N),      # each row as (1, N, 2): fan_in = N
    ("lecun_normal", lambda H, N: 2 / (H * N)),         # (H, N, 2): fan_in = H·N
    ("complex_normal", lambda H, N: 1.0),               # C̃ directly, N(0, ½) per part
])
def test_C_tilde_scale_follows_the_jax_fan_conventions(c_init, mean_sq):
    """E|C̃_hp|² = Var(Re C) + Var(Im C) since V's columns are orthonormal."""
    torch.manual_seed(0)
    H, N = 64, 64
    C = torch.view_as_complex(S5(d_model=H, d_state=N, blocks=8, c_init=c_init, dtype=F64).C)
    assert abs(C.abs().square().mean().item() / mean_sq(H, N) - 1) < 0.1


def test_D_is_standard_normal():
    torch.manual_seed(0)
    D = S5(d_model=4096, d_state=4, blocks=1, dtype=F64).D
    assert abs(D.mean().item()) < 0.05 and abs(D.std().item() - 1) < 0.05 and bool((D < 0).any())


@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
@pytest.mark.parametrize("backend", ["naive", "scan"])
def test_bidirectional_equals_a_manual_reverse_loop(disc, backend):
    """y_t = 2Re(C̃₁x_t + C̃₂x^r_t) + Du_t with x^r_t = Λ̄x^r_{t+1} + B̄u_t (includes u_t)."""
    layer = _perturbed(S5Bidirectional, discretizer=disc, backend=backend)
    u = torch.randn(2, 29, 3, dtype=F64)
    a, b_bar = _by_hand(layer, disc)
    C1, C2 = torch.view_as_complex(layer.C), torch.view_as_complex(layer.C_reverse)
    fwd, rev = _loop(a, b_bar, u), _loop(a, b_bar, u, reverse=True)
    expect = 2 * (fwd @ C1.T + rev @ C2.T).real + layer.D * u
    with torch.no_grad():
        torch.testing.assert_close(layer(u), expect, rtol=1e-10, atol=1e-12)


def test_bidirectional_refuses_to_stream():
    layer = S5Bidirectional(d_model=3, d_state=8, blocks=2)
    assert "step" not in S5Bidirectional.capabilities and "initial_state" not in S5Bidirectional.capabilities
    assert {"step", "initial_state"} <= S5.capabilities
    with pytest.raises(NotCausalError, match="use the causal core 's5'"):
        layer.step(torch.randn(2, 3), {})
    with pytest.raises(NotCausalError, match="no causal step"):
        layer.init_state(2)
    y, state = layer.forward_with_state(torch.randn(2, 5, 3))
    assert state == {} and y.shape == (2, 5, 3)
    with pytest.raises(NotCausalError, match="carried state"):
        layer.forward_with_state(torch.randn(2, 5, 3), state)


def test_bidirectional_model_step_fails_clearly():
    from zoo_core.build import build_model

    spec = {"schema_version": 1, "task": {"kind": "classification", "classes": 2}, "input": {"channels": 3},
            "model": {"d_model": 8, "depth": 2, "core": {"kind": "s5-bidirectional", "preset": "tiny"}}}
    model = build_model(spec, seed=0)
    assert model(torch.randn(2, 9, 3)).shape == (2, 2)
    with pytest.raises(NotCausalError):
        model.init_state(2)


def test_parameter_count_at_h64_state64_is_8352():
    """models.md §12.2: Λ 2·32, B̃ 32·64·2, C̃ 64·32·2, D 64, Δ 32."""
    for blocks in (1, 2, 8):
        layer = S5(d_model=64, d_state=64, blocks=blocks)
        assert count_params(layer) == sum(p.numel() for p in layer.parameters()) == 8352
    assert count_params(S5Bidirectional(d_model=64, d_state=64)) == 8352 + 64 * 32 * 2


def test_dt_scale_runs_a_half_rate_signal_exactly_under_zoh():
    """Δ·2 on u equals Δ on u held for two samples, read every second step (ZOH is exact)."""
    torch.manual_seed(0)
    slow = S5(d_model=3, d_state=8, blocks=2, dtype=F64)
    fast = S5(d_model=3, d_state=8, blocks=2, dtype=F64)
    fast.load_state_dict(slow.state_dict())
    slow.rescale_dt(2.0)
    u = torch.randn(2, 17, 3, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(slow(u), fast(u.repeat_interleave(2, dim=1))[:, 1::2], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="positive finite"):
        slow.rescale_dt(0.0)


def test_optim_hints_are_the_s5_standard_groups():
    layer = S5(d_model=2, d_state=4, blocks=1)
    hints = layer.optim_hints()
    assert set(hints) == {"Lambda_re", "Lambda_im", "B", "log_step"}  # C̃ and D: global lr and decay
    assert all(h.lr == 1e-3 and h.weight_decay == 0.0 for h in hints.values())
    assert S5(d_model=2, d_state=4, blocks=1, ssm_lr=None).optim_hints() == {}


def test_clip_eigs_keeps_re_lambda_negative():
    layer = S5(d_model=2, d_state=4, blocks=1, clip_eigs=True, dtype=F64)
    with torch.no_grad():
        layer.Lambda_re.fill_(0.3)
    assert bool((layer.Lambda().real == -1e-4).all())
    assert bool(torch.isfinite(layer(torch.randn(1, 300, 2, dtype=F64))).all())


def test_auto_backend_is_the_parallel_scan_and_logged_once(caplog):
    with caplog.at_level(logging.INFO, logger="zoo_core.backends"):
        a = S5(d_model=2, d_state=4, blocks=1)
        S5(d_model=2, d_state=4, blocks=1)
    from zoo_core.kernels.scan_cpu import unavailable_reason

    # CPU: the fused C++ scan is fastest; without a compiler, the loop (faster there than the parallel scan)
    assert a.backend_choice.label() == f"recurrent: scan={'cpu-scan' if unavailable_reason() is None else 'naive'}"
    assert len([r for r in caplog.records if "backend auto" in r.message]) == 1


def test_state_is_constant_size():
    layer = S5(d_model=3, d_state=8, blocks=2).eval()
    state = layer.init_state(2)
    for _ in range(20):
        _, state = layer.step(torch.randn(2, 3), state)
    assert state["h"].shape == (2, 4) and state["h"].dtype == torch.complex64


@pytest.mark.parametrize("params,field,rule", [
    ({"d_state": 7, "blocks": 1}, "d_state", "must be even"),
    ({"d_state": 12, "blocks": 5}, "blocks", "must divide d_state"),
    ({"d_state": 12, "blocks": 4}, "block", "must be even"),
    ({"dt_min": 0.2, "dt_max": 0.1}, "dt_min", "dt_min <= dt_max"),
    ({"dt_min": 0.0}, "dt_min", "greater than 0"),
    ({"blocks": 0}, "blocks", "greater than or equal to 1"),
    ({"c_init": "xavier"}, "c_init", "trunc_standard_normal"),
    ({"conj_sym": False}, "conj_sym", "Extra inputs are not permitted"),
])
def test_bad_params_name_the_field_and_the_rule(params, field, rule):
    with pytest.raises(ValidationError) as info:
        S5Params.model_validate({"d_model": 4, **params})
    assert field in str(info.value) and rule in str(info.value)


@pytest.mark.parametrize("params,rule", [
    ({"d_state": 7, "blocks": 1}, "d_state must be even"),
    ({"d_state": 12, "blocks": 5}, "blocks must divide d_state"),
    ({"d_state": 12, "blocks": 4}, r"each block \(size d_state/blocks = 12/4 = 3\) must be even"),
    ({"dt_min": 0.2, "dt_max": 0.1}, "0 < dt_min <= dt_max"),
])
def test_the_constructor_applies_the_same_rules(params, rule):
    with pytest.raises(ValueError, match=rule):
        S5(d_model=4, **params)


def test_unknown_discretizer_is_refused_with_suggestions():
    from zoo_core.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="did you mean 'bilinear'"):
        S5(d_model=2, d_state=4, blocks=1, discretizer="bilinaer")


def test_presets_validate_and_paper_is_state_64_blocks_8():
    from zoo_core.plugins import get_registry

    for name in ("s5", "s5-bidirectional"):
        entry = get_registry().core(name)
        for preset in entry.presets:
            S5Params.model_validate({**entry.preset(preset), "d_model": 16})
    assert get_registry().core("s5").preset("paper") == {"d_state": 64, "blocks": 8}

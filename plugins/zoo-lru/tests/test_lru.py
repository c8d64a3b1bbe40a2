"""LRU's own maths: the ring it starts from, γ, its recurrence written out by hand, its size,
its params' validation, and what it must not do (Δ rescaling; lru-pytorch's deviations)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from zoo_core.build import build_model
from zoo_core.errors import SpecError
from zoo_core.nn.blocks import count_params
from zoo_core.nn.model import rescale_sampling_rate
from zoo_lru.core import LRU, ring_init
from zoo_lru.params import LRUParams

F64 = torch.float64
RINGS = [(0.0, 1.0, 6.28), (0.5, 0.9, math.pi), (0.9, 0.999, 0.314)]  # (r_min, r_max, max_phase)


def _ks_uniform(sample: torch.Tensor, lo: float, hi: float) -> float:
    """Kolmogorov–Smirnov distance between the sample's empirical CDF and U[lo, hi]."""
    s = torch.sort(sample.to(F64)).values
    n = s.numel()
    cdf = ((s - lo) / (hi - lo)).clamp(0, 1)
    i = torch.arange(1, n + 1, dtype=F64)
    return max((i / n - cdf).max().item(), (cdf - (i - 1) / n).max().item())


def _ks_bound(n: int) -> float:
    return 1.95 / math.sqrt(n)  # α = 0.001: a fixed seed, but not tuned to it


def _ring_lam(N: int, r_min: float, r_max: float, max_phase: float = 6.28) -> torch.Tensor:
    """λ of the ring init at N states, as LRU.lam() computes it (N beyond the params model's d_state
    bound: the statistics need many draws)."""
    nu_log, theta_log, _ = ring_init(N, r_min, r_max, max_phase)
    return torch.exp(torch.complex(-torch.exp(nu_log), torch.exp(theta_log)))  # (N,)


# ring initialisation ----------------------------------------------------------------------
@pytest.mark.parametrize("r_min,r_max,max_phase", RINGS)
def test_ring_init_is_uniform_on_the_ring(r_min, r_max, max_phase):
    torch.manual_seed(0)
    N = 20000
    lam = _ring_lam(N, r_min, r_max, max_phase)
    mag = lam.abs()
    phase = torch.angle(lam) % (2 * math.pi)  # arg λ in [0, 2π)
    assert mag.min() >= r_min and mag.max() < r_max
    assert phase.min() >= 0 and phase.max() <= max_phase * (1 + 1e-12)
    assert _ks_uniform(mag**2, r_min**2, r_max**2) < _ks_bound(N)
    assert _ks_uniform(phase, 0.0, max_phase) < _ks_bound(N)
    # The same statistic rejects a ring whose radius (not radius²) is uniform.
    assert _ks_uniform(mag, r_min**2, r_max**2) > 5 * _ks_bound(N)


def test_ring_init_quantiles():
    """|λ|² quantiles at 10%..90% sit where U[r_min², r_max²] puts them."""
    torch.manual_seed(1)
    r_min, r_max = 0.4, 0.95
    lam = _ring_lam(20000, r_min, r_max)
    q = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=F64)
    expect = r_min**2 + q * (r_max**2 - r_min**2)
    torch.testing.assert_close(torch.quantile(lam.abs() ** 2, q), expect, rtol=0, atol=0.01)


def test_ring_init_near_the_unit_circle_is_finite():
    """r_min close to 1 and r_max = 1: 1 − |λ|² is formed without cancellation, so nothing is ±inf."""
    torch.manual_seed(2)
    nu_log, theta_log, gamma_log = ring_init(5000, 0.999999, 1.0, 2 * math.pi)
    assert all(bool(torch.isfinite(t).all()) for t in (nu_log, theta_log, gamma_log))
    mag = torch.exp(-torch.exp(nu_log))
    assert bool((mag < 1).all()) and bool((mag >= 0.999999 - 1e-15).all())


# γ normalisation ----------------------------------------------------------------------------
@pytest.mark.parametrize("r_min,r_max,max_phase", RINGS)
def test_gamma_is_sqrt_one_minus_abs_lambda_squared_at_init(r_min, r_max, max_phase):
    torch.manual_seed(3)
    layer = LRU(d_model=3, d_state=256, r_min=r_min, r_max=r_max, max_phase=max_phase, dtype=F64)
    with torch.no_grad():
        mag2 = layer.lam().abs() ** 2
        torch.testing.assert_close(layer.gamma_log, torch.log(torch.sqrt(1 - mag2)), rtol=1e-9, atol=1e-12)
        stable = 0.5 * torch.log(-torch.expm1(-2 * torch.exp(layer.nu_log)))  # models.md §6.4
        torch.testing.assert_close(layer.gamma_log, stable, rtol=1e-12, atol=1e-14)


def test_gamma_is_a_trained_parameter_not_recomputed_from_lambda():
    """minimal-LRU trains γ_log (lru-pytorch recomputes γ from |λ| instead, models.md §13)."""
    layer = LRU(d_model=2, d_state=4, dtype=F64)
    assert isinstance(layer.gamma_log, torch.nn.Parameter) and layer.gamma_log.requires_grad
    x = torch.randn(1, 6, 2, dtype=F64)
    layer(x).sum().backward()
    assert layer.gamma_log.grad is not None and bool((layer.gamma_log.grad != 0).any())
    before = layer.gamma_log.detach().clone()
    with torch.no_grad():
        layer.nu_log.add_(0.5)
    layer(x)
    assert torch.equal(layer.gamma_log.detach(), before)


# the recurrence, written out ---------------------------------------------------------------
@pytest.mark.parametrize("backend", ["naive", "scan", "auto"])
def test_forward_is_the_explicit_recurrence(backend):
    """x_t = λ x_{t−1} + (γ ⊙ B) u_t, y_t = Re(C x_t) + D u_t, from a nonzero x_0, in float64,
    with every parameter perturbed away from init (so γ ≠ sqrt(1 − |λ|²))."""
    torch.manual_seed(4)
    H, N, L = 3, 5, 37
    layer = LRU(d_model=H, d_state=N, backend=backend, dtype=F64)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    u = torch.randn(2, L, H, dtype=F64)
    x0 = torch.randn(2, N, dtype=torch.complex128)
    with torch.no_grad():
        y, state = layer.forward_with_state(u, {"h": x0})
        lam = torch.exp(-torch.exp(layer.nu_log) + 1j * torch.exp(layer.theta_log))  # (N,)
        B = torch.complex(layer.B[..., 0], layer.B[..., 1]) * torch.exp(layer.gamma_log)[:, None]  # (N, H)
        C = torch.complex(layer.C[..., 0], layer.C[..., 1])  # (H, N)
        x, ys = x0, []
        for t in range(L):
            x = lam * x + u[:, t].to(torch.complex128) @ B.T  # (2, N)
            ys.append((x @ C.T).real + layer.D * u[:, t])  # (2, H)
    torch.testing.assert_close(y, torch.stack(ys, 1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state["h"], x, rtol=1e-12, atol=1e-12)


def test_auto_backend_is_the_parallel_scan():
    from zoo_core.kernels.scan_cpu import unavailable_reason

    # CPU: the fused C++ scan is fastest; without a compiler, the loop (faster there than the parallel scan)
    on_cpu = "cpu-scan" if unavailable_reason() is None else "naive"
    assert LRU(d_model=2, d_state=4).backend_choice.label() == f"recurrent: scan={on_cpu}"
    assert LRU(d_model=2, d_state=4, backend="naive").backend_choice.label() == "recurrent: scan=naive"


def test_step_state_is_constant_size():
    layer = LRU(d_model=3, d_state=8).eval()
    state = layer.init_state(2)
    for _ in range(50):
        _, state = layer.step(torch.randn(2, 3), state)
    assert set(state) == {"h"} and state["h"].shape == (2, 8) and state["h"].dtype == torch.complex64


# size and layout ---------------------------------------------------------------------------
def test_parameter_count_at_h_n_64_is_16640():
    """ν, θ, γ_log: N each; B, C: 2·N·H each; D: H (models.md §12.2)."""
    layer = LRU(d_model=64, d_state=64)
    assert count_params(layer) == 16_640
    shapes = {n: tuple(p.shape) for n, p in layer.named_parameters()}
    assert shapes == {"nu_log": (64,), "theta_log": (64,), "gamma_log": (64,),
                      "B": (64, 64, 2), "C": (64, 64, 2), "D": (64,)}


def test_init_scales_follow_the_paper():
    """Re and Im of B ~ N(0, 1/(2H)), of C ~ N(0, 1/N); D ~ N(0, 1)."""
    torch.manual_seed(5)
    H, N = 200, 300
    layer = LRU(d_model=H, d_state=N, dtype=F64)
    for name, std in (("B", 1 / math.sqrt(2 * H)), ("C", 1 / math.sqrt(N))):
        for part in (0, 1):
            s = getattr(layer, name)[..., part]
            assert abs(s.std().item() / std - 1) < 0.03 and abs(s.mean().item()) < 0.03 * std
    assert abs(LRU(d_model=20000, d_state=1, dtype=F64).D.std().item() - 1) < 0.03


def test_float32_and_float64_builds_agree():
    torch.manual_seed(6)
    a = LRU(d_model=3, d_state=6, dtype=torch.float32)
    torch.manual_seed(6)
    b = LRU(d_model=3, d_state=6, dtype=F64)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(p.to(F64), q, rtol=1e-6, atol=1e-7, msg=n)


# what lru-pytorch does differently (models.md §13) -----------------------------------------
def test_d_is_diagonal_and_no_state_lives_on_the_module():
    layer = LRU(d_model=4, d_state=3, dtype=F64).eval()
    assert layer.D.shape == (4,)  # lru-pytorch: a dense (out × in) matrix
    assert list(layer.buffers()) == []
    x = torch.randn(2, 9, 4, dtype=F64)
    first = layer(x)
    layer.forward_with_state(torch.randn(2, 5, 4, dtype=F64))
    assert torch.equal(layer(x), first)  # lru-pytorch carries its state between calls


# discrete time: no Δ to rescale ------------------------------------------------------------
def test_lru_refuses_sampling_rate_rescaling():
    spec = {"schema_version": 1, "task": {"kind": "regression", "outputs": 1}, "input": {"channels": 2},
            "model": {"d_model": 8, "depth": 2, "core": {"kind": "lru", "preset": "tiny"}}}
    model = build_model(spec, seed=0)
    assert "continuous_time" not in type(model.cores()[0]).capabilities
    with pytest.raises(ValueError, match="discrete-time"):
        model.cores()[0].rescale_dt(2.0)
    with pytest.raises(ValueError, match="discrete-time"):
        rescale_sampling_rate(model, 2.0)


# hints --------------------------------------------------------------------------------------
def test_optim_hints_are_minimal_lrus_ssm_group():
    """ν, θ, γ and B: smaller lr (0.5 × 1e-3) and no weight decay; C and D train normally."""
    hints = LRU(d_model=2, d_state=4).optim_hints()
    assert set(hints) == {"nu_log", "theta_log", "gamma_log", "B"}
    assert all(h.lr == 5e-4 and h.weight_decay == 0.0 for h in hints.values())
    assert LRU(d_model=2, d_state=4, ssm_lr=None).optim_hints() == {}


# params validation --------------------------------------------------------------------------
@pytest.mark.parametrize("bad,field,rule", [
    ({"r_min": -0.1}, "r_min", "greater than or equal to 0"),
    ({"r_min": 1.0}, "r_min", "less than 1"),
    ({"r_max": 1.5}, "r_max", "less than or equal to 1"),
    ({"r_max": 0.0, "r_min": 0.0}, "r_max", "greater than 0"),
    ({"r_max": float("nan")}, "r_max", "finite number"),
    ({"r_min": 0.9, "r_max": 0.5}, "r_min", "must be smaller than r_max"),
    ({"r_min": 0.5, "r_max": 0.5}, "r_min", "must be smaller than r_max"),
    ({"max_phase": 0.0}, "max_phase", "greater than 0"),
    ({"max_phase": 7.0}, "max_phase", "less than or equal to 6.28318"),
    ({"d_state": 0}, "d_state", "greater than or equal to 1"),
    ({"d_state": 4.0}, "d_state", "valid integer"),
    ({"ssm_lr": -1e-3}, "ssm_lr", "greater than or equal to 0"),
    ({"dt_min": 1e-3}, "dt_min", "Extra inputs are not permitted"),
])
def test_bad_params_are_rejected_naming_the_field(bad, field, rule):
    with pytest.raises(ValidationError) as info:
        LRUParams.model_validate({"d_model": 4, **bad})
    assert field in str(info.value) and rule in str(info.value)


def test_good_params_and_defaults():
    p = LRUParams.model_validate({"d_model": 4, "r_min": 0, "r_max": 1, "max_phase": 2 * math.pi})
    assert (p.r_min, p.r_max, p.max_phase) == (0.0, 1.0, 2 * math.pi)
    d = LRUParams.model_validate({"d_model": 4})
    assert (d.d_state, d.r_min, d.r_max, d.max_phase, d.ssm_lr) == (64, 0.0, 1.0, 6.28, 5e-4)


def test_bad_spec_error_names_the_key_path():
    spec = {"schema_version": 1, "task": {"kind": "regression", "outputs": 1}, "input": {"channels": 2},
            "model": {"d_model": 8, "depth": 1, "core": {"kind": "lru", "preset": "tiny", "r_max": 1.2}}}
    with pytest.raises(SpecError, match="r_max"):
        build_model(spec)

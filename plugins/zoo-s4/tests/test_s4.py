"""S4's own behaviour: HiPPO-LegS DPLR init, C̃ conversions (longer inputs, rescaled Δ), the step
cache, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.init.hippo import dplr_legs
from zoo_core.kernels.dplr import kernel_dplr_naive
from zoo_core.testing.helpers import assert_slice_backward_linear
from zoo_s4.core import S4
from zoo_s4.params import S4Params

F64 = torch.float64


def _unroll(layer, x):
    state = layer.init_state(x.shape[0])
    ys = []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t], state)
        ys.append(y)
    return torch.stack(ys, 1)


def test_init_is_hippo_legs_dplr():
    layer = S4(d_model=3, d_state=16, dtype=F64)
    lam, p, b = dplr_legs(16, dtype=torch.complex128)
    torch.testing.assert_close(torch.complex(-torch.exp(layer.log_A_real), layer.A_imag), lam.expand(3, 8))
    torch.testing.assert_close(torch.view_as_complex(layer.P), p.expand(3, 8))
    torch.testing.assert_close(torch.view_as_complex(layer.B), b.expand(3, 8))
    dt = torch.exp(layer.log_dt)
    assert bool(((dt >= 1e-3 * (1 - 1e-9)) & (dt <= 1e-1 * (1 + 1e-9))).all())


@pytest.mark.parametrize("backend", ["cauchy", "naive"])
def test_inputs_longer_than_l_max_convert_c_tilde_exactly(backend):
    torch.manual_seed(0)
    layer = S4(d_model=2, d_state=8, l_max=16, backend={"kernel": backend, "conv": "fft"}, dtype=F64).eval()
    x = torch.randn(1, 41, 2, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _unroll(layer, x), rtol=1e-9, atol=1e-9)
        # the first 16 outputs do not depend on whether the kernel was converted
        torch.testing.assert_close(layer(x[:, :16]), layer(x)[:, :16], rtol=1e-9, atol=1e-9)


def test_kernel_matches_the_dense_reference_at_l_max():
    layer = S4(d_model=2, d_state=8, l_max=32, dtype=F64)
    with torch.no_grad():
        system, n = layer.system(32)
        k = layer.backend_choice.fn("kernel")(system, n)
        torch.testing.assert_close(k, kernel_dplr_naive(system, n), rtol=1e-10, atol=1e-12)


def test_step_cache_follows_parameter_changes():
    layer = S4(d_model=2, d_state=8, l_max=16, dtype=F64).eval()
    x = torch.randn(1, 9, 2, dtype=F64)
    with torch.no_grad():
        _unroll(layer, x)
        layer.log_dt.add_(0.3)
        layer.C.mul_(1.5)
        torch.testing.assert_close(_unroll(layer, x), layer(x), rtol=1e-9, atol=1e-9)


def test_half_rate_with_doubled_dt_tracks_the_full_rate_output():
    """Speech Commands' zero-shot trick: a smooth signal at half the rate with Δ doubled gives
    (nearly) the full-rate outputs at the kept samples; without rescaling it does not."""
    torch.manual_seed(1)
    layer = S4(d_model=4, d_state=16, l_max=256, dt_min=0.01, dt_max=0.05, dtype=F64).eval()
    t = torch.arange(400, dtype=F64)
    x = torch.stack([torch.sin(2 * math.pi * t / p) for p in (97, 131, 173, 211)], -1)[None]  # (1, 400, 4)
    with torch.no_grad():
        full = layer(x)[:, 1::2]
        plain = layer(x[:, 1::2])
        layer.rescale_dt(2.0)
        half = layer(x[:, 1::2])
    err_rescaled = (half - full).norm() / full.norm()
    err_plain = (plain - full).norm() / full.norm()
    assert err_rescaled < 0.05 and err_rescaled < err_plain / 5, (err_rescaled, err_plain)


def test_length_one_and_optim_hints():
    layer = S4(d_model=3, d_state=4, l_max=8, dtype=F64)
    x = torch.randn(2, 1, 3, dtype=F64)
    torch.testing.assert_close(layer(x), _unroll(layer.eval(), x))
    assert set(layer.optim_hints()) == {"log_dt", "log_A_real", "A_imag", "P", "B"}


@pytest.mark.parametrize("bad,match", [
    ({"d_state": 7}, "even"),
    ({"dt_min": 0.2, "dt_max": 0.1}, "must not exceed"),
    ({"dt_min": 0.0}, "greater than 0"),
    ({"dt_min": -1e-3}, "greater than 0"),
    ({"l_max": 0}, "greater than or equal to 1"),
])
def test_bad_params_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        S4Params.model_validate({"d_model": 4, **bad})


def test_equal_dt_bounds_give_one_step_for_every_channel():
    layer = S4(d_model=5, d_state=4, dt_min=0.01, dt_max=0.01)
    torch.testing.assert_close(torch.exp(layer.log_dt), torch.full((5,), 0.01))


def test_the_final_state_loop_does_not_slice_each_step():
    """The final state is stepped through the input by ``unbind``: a slice per step would make the
    backward zero-fill L tensors of the input's size (quadratic in L)."""
    layer = S4(d_model=2, d_state=4, l_max=64, dtype=F64)
    def outputs_at(L):
        y, state = layer.forward_with_state(torch.randn(1, L, 2, dtype=F64, requires_grad=True))
        return y, state["h"]

    assert_slice_backward_linear(outputs_at, 16)

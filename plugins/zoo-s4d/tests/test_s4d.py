"""S4D's own maths: the spectrum it starts from, its kernel written out by hand, its hints."""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.init.hippo import dplr_legs
from zoo_s4d.core import S4D


def _lambda(layer: S4D) -> torch.Tensor:
    return torch.complex(-torch.exp(layer.log_A_real), layer.A_imag)  # (H, P)


def test_legs_init_is_the_s4_dplr_spectrum():
    layer = S4D(d_model=3, d_state=16, init="legs", dtype=torch.float64)
    lam, _, b = dplr_legs(16, dtype=torch.complex128)
    torch.testing.assert_close(_lambda(layer), lam.expand(3, 8))
    torch.testing.assert_close(torch.view_as_complex(layer.B), b.expand(3, 8))


@pytest.mark.parametrize("init,imag0", [("lin", 0.0), ("inv", 16 / math.pi * (16 - 1)), ("real", 0.0)])
def test_other_inits(init, imag0):
    lam = _lambda(S4D(d_model=2, d_state=16, init=init, dtype=torch.float64))
    assert torch.allclose(lam.imag[:, 0], torch.tensor(imag0, dtype=torch.float64))
    expect_real = -torch.arange(1, 9, dtype=torch.float64) if init == "real" else torch.full((8,), -0.5, dtype=torch.float64)
    torch.testing.assert_close(lam.real[0], expect_real)


@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
@pytest.mark.parametrize("backend", ["naive", "scan", {"kernel": "vandermonde", "conv": "fft"}, {"kernel": "naive", "conv": "naive"}])
def test_impulse_response_is_the_closed_form_kernel(disc, backend):
    """y = K * u + D u with K_l = 2 Re Σ_p C_p B̄_p Ā_p^l, written out from the paper's formulas."""
    torch.manual_seed(0)
    layer = S4D(d_model=4, d_state=8, discretizer=disc, backend=backend, dtype=torch.float64)
    L = 33
    u = torch.zeros(1, L, 4, dtype=torch.float64)
    u[0, 0] = 1.0
    with torch.no_grad():
        y = layer(u)[0] - layer.D * u[0]  # (L, H)
        dt = torch.exp(layer.log_dt)[:, None]  # (H, 1)
        lam, B, C = _lambda(layer), torch.view_as_complex(layer.B), torch.view_as_complex(layer.C)
        if disc == "zoh":
            a_bar, b_bar = torch.exp(dt * lam), (torch.exp(dt * lam) - 1) / lam * B
        else:
            a_bar, b_bar = (1 + dt * lam / 2) / (1 - dt * lam / 2), dt / (1 - dt * lam / 2) * B
        ls = torch.arange(L, dtype=torch.float64)
        K = 2 * torch.einsum("hp,hpl->lh", C * b_bar, a_bar[..., None] ** ls).real  # (L, H)
    torch.testing.assert_close(y, K, rtol=1e-10, atol=1e-12)


def test_dt_init_range_and_optim_hints():
    layer = S4D(d_model=500, d_state=4, dt_min=1e-3, dt_max=1e-1)
    dt = torch.exp(layer.log_dt)
    assert dt.min() >= 1e-3 * (1 - 1e-6) and dt.max() <= 1e-1 * (1 + 1e-6)
    hints = layer.optim_hints()
    assert set(hints) == {"log_dt", "log_A_real", "A_imag", "B"}
    assert all(h.lr == 1e-3 and h.weight_decay == 0.0 for h in hints.values())
    assert S4D(d_model=2, d_state=4, ssm_lr=None).optim_hints() == {}


def test_auto_backend_is_vandermonde_fft_and_logged_once(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="zoo_core.backends"):
        a = S4D(d_model=2, d_state=4)
        S4D(d_model=2, d_state=4)
    assert a.backend_choice.label() == "conv: kernel=vandermonde, conv=fft"
    assert len([r for r in caplog.records if "backend auto" in r.message]) == 1


def test_step_state_is_constant_size():
    layer = S4D(d_model=3, d_state=8).eval()
    state = layer.init_state(2)
    for _ in range(50):
        _, state = layer.step(torch.randn(2, 3), state)
    assert state["h"].shape == (2, 3, 4) and state["h"].dtype == torch.complex64

"""Every registered conv backend against conv_naive, and the causal (never circular) worked example.

Letters: B batch, L length, H channels.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from zoo_core.kernels.conv import conv_fft, conv_naive
from zoo_core.testing import assert_rel_close as assert_close
from zoo_core.testing.helpers import backends_for

F32, F64 = torch.float32, torch.float64
# the registry's conv backends, not a list of names: a plugin's conv is held to the same tests
CONVS = [pytest.param(e, id=e.name, marks=pytest.mark.requires(*e.requires)) for e in backends_for("conv")]
FAST = [p for p in CONVS if p.values[0].name != "naive"]


def _seq(*xs: float) -> tuple[Tensor, int]:
    return torch.tensor(xs, dtype=F64).reshape(1, -1, 1), len(xs)  # (B=1, L, H=1)


@pytest.mark.parametrize("entry", CONVS)
def test_worked_example_is_causal_not_circular(entry) -> None:
    conv = entry.load()
    # K = (1, 2) * u = (3, 4) is (3, 10, 8); its causal part at L = 2 is (3, 10). A circular
    # convolution of length 2 wraps the 8 onto the first entry: (11, 10).
    u, L = _seq(3.0, 4.0)
    y = conv(u, torch.tensor([[1.0, 2.0]], dtype=F64)).flatten()
    k_f = torch.fft.rfft(torch.tensor([1.0, 2.0], dtype=F64))
    circular = torch.fft.irfft(k_f * torch.fft.rfft(u.flatten()), n=L)  # no zero padding
    assert torch.allclose(circular, torch.tensor([11.0, 10.0], dtype=F64))
    assert torch.allclose(y, torch.tensor([3.0, 10.0], dtype=F64))
    assert not torch.allclose(y, circular)
    u3, _ = _seq(3.0, 4.0, 0.0)
    y3 = conv(u3, torch.tensor([[1.0, 2.0, 0.0]], dtype=F64)).flatten()
    assert torch.allclose(y3, torch.tensor([3.0, 10.0, 8.0], dtype=F64))


def test_naive_is_the_textbook_sum() -> None:
    torch.manual_seed(0)
    u, k = torch.randn(2, 6, 3, dtype=F64), torch.randn(3, 6, dtype=F64)
    y = torch.zeros_like(u)
    for t in range(6):
        for s in range(t + 1):
            y[:, t] += k[:, s] * u[:, t - s]
    assert_close("y", y, conv_naive(u, k), 1e-14)


@pytest.mark.parametrize("entry", FAST)
@pytest.mark.parametrize("L", [1, 7, 37, 257, 1000])
def test_every_backend_matches_naive_f64(entry, L: int) -> None:
    torch.manual_seed(L)
    u, k = torch.randn(2, L, 3, dtype=F64), torch.randn(3, L, dtype=F64)
    assert_close("y", conv_naive(u, k), entry.load()(u, k), 1e-12)


@pytest.mark.parametrize("L", [7, 257])
def test_fft_f32_keeps_dtype(L: int) -> None:
    torch.manual_seed(L)
    u, k = torch.randn(2, L, 3), torch.randn(3, L)
    out = conv_fft(u, k)
    assert out.dtype == F32
    assert_close("y", conv_naive(u, k), out, 1e-5)


@pytest.mark.parametrize("entry", FAST)
@pytest.mark.parametrize("L", [7, 37])
def test_gradients_match(entry, L: int) -> None:
    torch.manual_seed(L)
    u0, k0 = torch.randn(2, L, 3, dtype=F64), torch.randn(3, L, dtype=F64)
    g = torch.randn(2, L, 3, dtype=F64)
    grads = []
    for conv in (conv_naive, entry.load()):
        u, k = u0.clone().requires_grad_(), k0.clone().requires_grad_()
        grads.append(torch.autograd.grad(conv(u, k), (u, k), g))
    for name, ref, out in zip(("du", "dk"), *grads):
        assert_close(name, ref, out, 1e-12)


@pytest.mark.parametrize("entry", CONVS)
def test_kernel_length_must_match(entry) -> None:
    conv = entry.load()
    with pytest.raises(ValueError, match=r"must be \(H, L\) = \(3, 8\)"):
        conv(torch.randn(2, 8, 3), torch.randn(3, 5))
    with pytest.raises(ValueError, match=r"\(B, L, H\)"):
        conv(torch.randn(8, 3), torch.randn(3, 8))

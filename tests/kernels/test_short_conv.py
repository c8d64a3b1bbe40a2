"""The short causal depthwise conv with a carried past (zoo_core.kernels.short_conv), held to an
explicit loop: the parallel form in both layouts, the one-step form, a sequence in pieces, K = 1,
pieces shorter than the past, empty pieces, gradients, and the shape errors.

Letters: B batch, L length, C channels, K filter width.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from zoo_core.kernels.short_conv import causal_conv, causal_conv_naive, causal_conv_step
from zoo_core.testing import assert_rel_close as assert_close

F32, F64 = torch.float32, torch.float64
B, C = 2, 5


def _loop(x: Tensor, weight: Tensor, bias: Tensor | None, past: Tensor) -> tuple[Tensor, Tensor]:
    """The definition, element by element: y[b, t, c] = bias[c] + Σ_j w[c, j] · s[b, c, t + j], s = [past, x]."""
    s = torch.cat([past, x.transpose(1, 2)], -1)  # (B, C, K−1+L)
    Bn, L, Cn = x.shape
    K = weight.shape[-1]
    y = torch.zeros(Bn, L, Cn, dtype=x.dtype)
    for b in range(Bn):
        for t in range(L):
            for c in range(Cn):
                acc = 0.0 if bias is None else float(bias[c])
                for j in range(K):
                    acc += float(weight[c, 0, j]) * float(s[b, c, t + j])
                y[b, t, c] = acc
    return y, s[..., s.shape[-1] - (K - 1):]


def _params(K: int, bias: bool, dtype: torch.dtype = F64) -> tuple[Tensor, Tensor | None]:
    return torch.randn(C, 1, K, dtype=dtype), (torch.randn(C, dtype=dtype) if bias else None)


def _steps(x: Tensor, weight: Tensor, bias: Tensor | None, past: Tensor) -> tuple[Tensor, Tensor]:
    ys = []
    for x_t in x.unbind(1):
        y_t, past = causal_conv_step(x_t, weight, bias, past)
        ys.append(y_t)
    return (torch.stack(ys, 1) if ys else x.new_zeros(x.shape[0], 0, x.shape[2])), past


@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("L", [0, 1, 2, 7])  # L = 0, L < K − 1, L ≥ K
@pytest.mark.parametrize("bias", [True, False])
def test_every_form_is_the_loop(K: int, L: int, bias: bool) -> None:
    torch.manual_seed(100 * K + 10 * L + bias)
    weight, b = _params(K, bias)
    x, past = torch.randn(B, L, C, dtype=F64), torch.randn(B, C, K - 1, dtype=F64)
    y_ref, past_ref = _loop(x, weight, b, past)
    for name, (y, new) in {
        "channels-first": causal_conv(x, weight, b, past),
        "channels-last": causal_conv(x, weight, b, past, channels_last=True),
        "naive": causal_conv_naive(x, weight, b, past),
        "steps": _steps(x, weight, b, past),
    }.items():
        assert y.shape == (B, L, C) and new.shape == (B, C, K - 1), name
        assert_close(f"{name} y", y_ref, y, 1e-13)
        assert torch.equal(new, past_ref), f"{name}: the new past is not the last K−1 inputs of [past, x]"


def test_the_past_carries_across_pieces() -> None:
    """A sequence cut anywhere (pieces shorter than the past, empty ones) gives the outputs and the
    past of the whole, in every form."""
    torch.manual_seed(0)
    K, L = 4, 11
    weight, b = _params(K, True)
    x = torch.randn(B, L, C, dtype=F64)
    y_whole, past_whole = causal_conv(x, weight, b)
    for form in (causal_conv, causal_conv_naive, lambda *a: causal_conv(*a, channels_last=True)):
        past, ys = torch.zeros(B, C, K - 1, dtype=F64), []
        for lo, hi in [(0, 1), (1, 1), (1, 3), (3, 8), (8, 9), (9, 11)]:
            y, past = form(x[:, lo:hi], weight, b, past)
            ys.append(y)
        assert_close("pieces y", y_whole, torch.cat(ys, 1), 1e-13)
        assert torch.equal(past, past_whole)


def test_none_past_is_zeros_and_k1_has_no_past() -> None:
    torch.manual_seed(1)
    weight, b = _params(3, True)
    x = torch.randn(B, 6, C, dtype=F64)
    assert torch.equal(causal_conv(x, weight, b)[0], causal_conv(x, weight, b, torch.zeros(B, C, 2, dtype=F64))[0])
    w1, b1 = _params(1, True)  # K = 1: a per-channel scale and shift, an empty past
    y, past = causal_conv(x, w1, b1, torch.zeros(B, C, 0, dtype=F64))
    assert_close("K=1", x * w1[:, 0, 0] + b1, y, 1e-15)
    assert past.shape == (B, C, 0)


def test_empty_piece_passes_the_past_through() -> None:
    """conv1d refuses an input shorter than its filter; an empty piece is no error and changes nothing."""
    weight, b = _params(4, True)
    past = torch.randn(B, C, 3, dtype=F64)
    for channels_last in (False, True):
        y, new = causal_conv(torch.zeros(B, 0, C, dtype=F64), weight, b, past, channels_last=channels_last)
        assert y.shape == (B, 0, C) and torch.equal(new, past)


def test_past_is_cast_to_the_input_dtype_and_copied() -> None:
    """A float64 past meeting a float32 piece is cast (as the cores' states are); the new past is
    a contiguous copy, never a view that keeps the whole joined sequence alive."""
    torch.manual_seed(2)
    weight, b = _params(3, True, F32)
    x, past = torch.randn(B, 5, C), torch.randn(B, C, 2, dtype=F64)
    for channels_last in (False, True):
        y, new = causal_conv(x, weight, b, past, channels_last=channels_last)
        assert y.dtype == new.dtype == F32 and new.is_contiguous()
        assert new.untyped_storage().nbytes() == new.numel() * new.element_size()
    y_t, new_t = causal_conv_step(x[:, 0], weight, b, past)
    assert y_t.dtype == new_t.dtype == F32 and new_t.is_contiguous()


@pytest.mark.parametrize("channels_last", [False, True])
def test_gradients_match_the_naive_loop(channels_last: bool) -> None:
    """Gradients of x, weight, bias and the carried past, parallel vs naive vs stepwise, float64."""
    torch.manual_seed(3)
    K, L = 4, 6
    leaves = [torch.randn(B, L, C, dtype=F64), *_params(K, True), torch.randn(B, C, K - 1, dtype=F64)]
    names = ("x", "weight", "bias", "past")
    grads = {}
    runs = {"fast": lambda *a: causal_conv(*a, channels_last=channels_last), "naive": causal_conv_naive, "steps": _steps}
    for form, fn in runs.items():
        ins = [t.detach().clone().requires_grad_() for t in leaves]
        y, past = fn(*ins)
        ((y * torch.linspace(-1, 1, y.numel(), dtype=F64).view_as(y)).sum() + (past**2).sum()).backward()
        grads[form] = [t.grad for t in ins]
    for form in ("fast", "steps"):
        for name, g_ref, g in zip(names, grads["naive"], grads[form], strict=True):
            assert g is not None, f"{form}: no gradient reached {name}"
            assert_close(f"{form} d{name}", g_ref, g, 1e-13)


def test_shapes_are_refused_by_name() -> None:
    weight, b = _params(4, True)
    x = torch.randn(B, 3, C, dtype=F64)
    with pytest.raises(ValueError, match=r"x must be \(B, L, C\)"):
        causal_conv(x[0], weight, b)
    with pytest.raises(ValueError, match=r"weight must be conv1d's depthwise \(C, 1, K\) with C = 5"):
        causal_conv(x, weight[:, 0], b)
    with pytest.raises(ValueError, match=r"bias must be \(C,\) = \(5,\)"):
        causal_conv(x, weight, b[:3])
    with pytest.raises(ValueError, match=r"past must be \(B, C, K−1\) = \(2, 5, 3\).*got \(2, 5, 4\)"):
        causal_conv(x, weight, b, torch.zeros(B, C, 4, dtype=F64))
    with pytest.raises(ValueError, match=r"x must be \(B, C\)"):
        causal_conv_step(x, weight, b, torch.zeros(B, C, 3, dtype=F64))

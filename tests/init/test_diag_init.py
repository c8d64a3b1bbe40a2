"""S4D diagonal initialisations and the log-uniform Δ initialisation."""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.init.diag import S4D_INITS, log_uniform_dt, s4d_init
from zoo_core.init.hippo import conj_half, dplr_legs, hippo_legs, nplr_legs

C128 = torch.complex128


@pytest.mark.parametrize("kind", S4D_INITS)
@pytest.mark.parametrize("dtype", [torch.complex64, C128])
def test_shapes_dtypes_and_stability(kind: str, dtype: torch.dtype) -> None:
    H, N = 3, 16
    Lam, B = s4d_init(kind, H, N, dtype=dtype)  # type: ignore[arg-type]
    for t in (Lam, B):
        assert tuple(t.shape) == (H, N // 2) and t.dtype == dtype and t.is_contiguous()
        assert t.stride() != (0, 1)  # a real copy, safe to wrap in nn.Parameter
        assert torch.equal(t, t[:1].expand_as(t))  # same init for every SSM
    assert torch.all(Lam.real < 0)


def test_lin_formula() -> None:
    Lam, B = s4d_init("lin", 2, 8, dtype=C128)
    expected = torch.tensor([complex(-0.5, math.pi * n) for n in range(4)], dtype=C128)
    torch.testing.assert_close(Lam[0], expected, rtol=0, atol=1e-15)
    assert torch.equal(B, torch.ones(2, 4, dtype=C128))


def test_inv_formula() -> None:
    N = 8
    Lam, B = s4d_init("inv", 1, N, dtype=C128)
    imag = [(N / math.pi) * (N / (2 * n + 1) - 1) for n in range(N // 2)]
    expected = torch.tensor([complex(-0.5, w) for w in imag], dtype=C128)
    torch.testing.assert_close(Lam[0], expected, rtol=0, atol=1e-14)
    torch.testing.assert_close(Lam[0, 0].imag.item(), 56 / math.pi, rtol=0, atol=1e-13)  # 17.825
    assert torch.equal(B, torch.ones(1, 4, dtype=C128))


def test_real_formula() -> None:
    Lam, B = s4d_init("real", 2, 8, dtype=C128)
    assert torch.equal(Lam[0], torch.tensor([-1, -2, -3, -4], dtype=C128))
    assert torch.equal(Lam.imag, torch.zeros(2, 4, dtype=torch.float64))
    assert torch.equal(B, torch.ones(2, 4, dtype=C128))


@pytest.mark.parametrize("N", [8, 64])
def test_legs_equals_s4_dplr(N: int) -> None:
    Lam, B = s4d_init("legs", 2, N, dtype=torch.complex64)
    Lam_s4, _, B_s4 = dplr_legs(N)
    assert torch.equal(Lam[0], Lam_s4) and torch.equal(Lam[1], Lam_s4)
    assert torch.equal(B[0], B_s4)


def test_legs_B_is_not_halved() -> None:
    """B = V* B_legs exactly: half plus conjugate half rebuild B_legs, not B_legs / 2."""
    N = 16
    _, B = s4d_init("legs", 1, N, dtype=C128)
    half = conj_half(nplr_legs(N))
    _, B_legs = hippo_legs(N)
    torch.testing.assert_close(B[0], half.V.mH @ B_legs.to(C128), rtol=0, atol=1e-14)
    torch.testing.assert_close(2 * (half.V @ B[0]).real, B_legs, rtol=0, atol=1e-12)


def test_legs_at_N8_matches_explainer() -> None:
    Lam, _ = s4d_init("legs", 1, 8, dtype=C128)
    assert torch.equal(Lam.real, torch.full((1, 4), -0.5, dtype=torch.float64))
    expected = torch.tensor([[-19.857, -5.354, -1.958, -0.427]], dtype=torch.float64)
    assert torch.equal(torch.round(Lam.imag, decimals=3), expected)


@pytest.mark.parametrize("N", [0, 1, 7, -2, 4.0])
@pytest.mark.parametrize("kind", S4D_INITS)
def test_bad_N_raises(N: object, kind: str) -> None:
    with pytest.raises(ValueError, match="even state size"):
        s4d_init(kind, 2, N)  # type: ignore[arg-type]


def test_bad_kind_H_and_dtype_raise() -> None:
    with pytest.raises(ValueError, match="unknown S4D init 'legt'"):
        s4d_init("legt", 2, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="H"):
        s4d_init("lin", 0, 8)
    with pytest.raises(ValueError, match="complex"):
        s4d_init("lin", 2, 8, dtype=torch.float32)


# --- log-uniform Δ ----------------------------------------------------------------------------


def test_log_uniform_dt_range_and_distribution() -> None:
    H, lo, hi = 10_000, 1e-3, 1e-1
    g = torch.Generator().manual_seed(0)
    log_dt = log_uniform_dt(H, lo, hi, generator=g)
    assert tuple(log_dt.shape) == (H,) and log_dt.dtype == torch.float32
    a, b = math.log(lo), math.log(hi)
    tol = 1e-6  # float32 rounding at the ends
    assert log_dt.min() >= a - tol and log_dt.max() <= b + tol
    assert log_dt.min() < a + 0.01 and log_dt.max() > b - 0.01  # fills the range
    # Uniform on [a, b]: mean (a+b)/2 (standard error (b−a)/sqrt(12H) ≈ 0.013), and quartiles.
    assert abs(log_dt.double().mean().item() - (a + b) / 2) < 0.05
    q = torch.quantile(log_dt.double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    expected = torch.tensor([a + 0.25 * (b - a), (a + b) / 2, a + 0.75 * (b - a)], dtype=torch.float64)
    torch.testing.assert_close(q, expected, rtol=0, atol=0.1)
    dt = log_dt.exp()
    assert dt.min() >= lo * (1 - 1e-5) and dt.max() <= hi * (1 + 1e-5)


def test_log_uniform_dt_generator_dtype_and_degenerate_range() -> None:
    x = log_uniform_dt(5, 1e-3, 1e-1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = log_uniform_dt(5, 1e-3, 1e-1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert x.dtype == torch.float64 and torch.equal(x, y)
    const = log_uniform_dt(4, 0.01, 0.01, dtype=torch.float64)
    torch.testing.assert_close(const, torch.full((4,), math.log(0.01), dtype=torch.float64))


@pytest.mark.parametrize(
    "dt_min, dt_max", [(0.0, 0.1), (-1e-3, 0.1), (0.1, 1e-3), (float("nan"), 0.1), (1e-3, float("inf"))]
)
def test_log_uniform_dt_bad_range_raises(dt_min: float, dt_max: float) -> None:
    with pytest.raises(ValueError, match="dt_min"):
        log_uniform_dt(3, dt_min, dt_max)


def test_log_uniform_dt_bad_H_and_dtype_raise() -> None:
    with pytest.raises(ValueError, match="H"):
        log_uniform_dt(0, 1e-3, 1e-1)
    with pytest.raises(ValueError, match="floating"):
        log_uniform_dt(3, 1e-3, 1e-1, dtype=torch.complex64)

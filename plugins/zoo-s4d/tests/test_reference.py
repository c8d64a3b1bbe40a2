"""The readable reference S4D (zoo_s4d.reference) against the S4D core, float64.

The teaching layer is what a reader checks the core against, so the two must agree to rounding:
same parameters copied in, outputs and every gradient (input and each shared parameter).
"""

from __future__ import annotations

import pytest
import torch

from zoo_s4d.core import S4D
from zoo_s4d.reference import StraightforwardS4D, copy_from_zoo

BACKENDS = ["auto", {"kernel": "vandermonde", "conv": "fft"}, {"scan": "naive"}]


@pytest.mark.parametrize("backend", BACKENDS, ids=["auto", "vandermonde-fft", "scan-naive"])
@pytest.mark.parametrize("dt_scale", [1.0, 3.0])
def test_reference_equals_core_forward_and_gradients(backend: object, dt_scale: float) -> None:
    torch.manual_seed(0)
    core = S4D(d_model=6, d_state=8, dt_scale=dt_scale, backend=backend, dtype=torch.float64)  # type: ignore[arg-type]
    ref = copy_from_zoo(core)
    assert isinstance(ref, StraightforwardS4D) and ref.D.dtype == torch.float64
    x = torch.randn(3, 37, 6, dtype=torch.float64)  # (B, L, H), an odd length on purpose
    g = torch.randn(3, 37, 6, dtype=torch.float64)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    ys = [core(xs[0]), ref(xs[1])]
    torch.testing.assert_close(ys[1], ys[0], rtol=1e-10, atol=1e-10)
    for y in ys:
        y.backward(g)
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-10, atol=1e-10)
    for name in ("log_dt", "log_A_real", "A_imag", "B", "C", "D"):
        want, got = getattr(core, name).grad, getattr(ref, name).grad
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10, msg=f"d{name} differs")


def test_reference_refuses_other_discretizers() -> None:
    core = S4D(d_model=2, d_state=4, discretizer="bilinear")
    with pytest.raises(ValueError, match="ZOH only"):
        copy_from_zoo(core)

"""LinOSS on packed documents, natively: one block2x2 scan whose 2×2 transition is zeroed at every
document start, in both scan backends and both schemes. The right-padded prefill of transformers issue
48256 and float32 at length 300 with documents of length 1 and documents crossing the scan's chunk
boundaries. (The conformance check ``packing`` covers float64 and gradients.)"""

from __future__ import annotations

import pytest
import torch

from zoo_core.testing.packed import assert_matches_solo, assert_padded_prefill, long_layout, packed_input
from zoo_linoss.core import LinOSS

BACKENDS = ("naive", "scan")
SCHEMES = ("linoss-im", "linoss-imex")


def make(backend: str, discretizer: str, dtype: torch.dtype = torch.float64) -> LinOSS:
    torch.manual_seed(0)
    return LinOSS(d_model=6, d_state=5, discretizer=discretizer, dt_min=0.05, dt_max=0.1,
                  backend={"scan": backend}, dtype=dtype).eval()


@pytest.mark.parametrize("discretizer", SCHEMES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_prefill_keeps_each_state(backend: str, discretizer: str) -> None:
    assert_padded_prefill(make(backend, discretizer), 6)


@pytest.mark.parametrize("discretizer", SCHEMES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_float32(backend: str, discretizer: str) -> None:
    core = make(backend, discretizer, torch.float32)  # small steps: slowly damped, a missed reset would show
    seg = long_layout()
    assert_matches_solo(core, packed_input(seg, 6, dtype=torch.float32), seg, rtol=1e-4, atol=1e-4)

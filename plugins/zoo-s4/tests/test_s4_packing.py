"""S4 on packed documents, natively: one kernel and one convolution over the documents right-aligned
(exact for an LTI system: zeros before a document leave the state at zero). The right-padded prefill of
transformers issue 48256 and float32 at length 300 with documents of length 1, with C̃ converted when the
longest document exceeds l_max. (The conformance check ``packing`` covers float64 and gradients.)"""

from __future__ import annotations

import pytest
import torch

from zoo_core.testing.packed import assert_matches_solo, assert_padded_prefill, long_layout, packed_input
from zoo_s4.core import S4

BACKENDS = ({"kernel": "naive", "conv": "naive"}, {"kernel": "cauchy", "conv": "fft"})
IDS = ("naive", "cauchy-fft")


def make(backend: dict[str, str], dtype: torch.dtype = torch.float64, l_max: int = 1024) -> S4:
    torch.manual_seed(0)
    return S4(d_model=6, d_state=8, dt_min=1e-3, dt_max=1e-2, l_max=l_max, backend=backend, dtype=dtype).eval()


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_padded_prefill_keeps_each_state(backend: dict[str, str]) -> None:
    assert_padded_prefill(make(backend), 6)


@pytest.mark.parametrize("l_max", [1024, 64])  # 64: documents longer than l_max (C̃ converted) and shorter
@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_long_float32(backend: dict[str, str], l_max: int) -> None:
    core = make(backend, torch.float32, l_max)
    seg = long_layout()
    assert_matches_solo(core, packed_input(seg, 6, dtype=torch.float32), seg, rtol=1e-4, atol=1e-4)

"""S4D on packed documents, natively, in both paths: the convolution on the documents right-aligned
(one kernel, one conv), the recurrence as one scan restarting at every document start. The right-padded
prefill of transformers issue 48256 and float32 at length 300 with documents of length 1 and documents
crossing the scans' chunk boundaries. (The conformance check ``packing`` covers float64 and gradients
in every backend combination.)"""

from __future__ import annotations

import pytest
import torch

from zoo_core.testing.packed import assert_matches_solo, assert_padded_prefill, long_layout, packed_input
from zoo_s4d.core import S4D

BACKENDS = ({"kernel": "naive", "conv": "naive"}, {"kernel": "vandermonde", "conv": "fft"},
            {"scan": "naive"}, {"scan": "scan"}, {"scan": "chunked"})
IDS = ("conv-naive", "conv-fft", "scan-naive", "scan-parallel", "scan-chunked")


def make(backend: dict[str, str], dtype: torch.dtype = torch.float64) -> S4D:
    torch.manual_seed(0)
    return S4D(d_model=6, d_state=8, dt_min=1e-3, dt_max=1e-2, backend=backend, dtype=dtype).eval()


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_padded_prefill_keeps_each_state(backend: dict[str, str]) -> None:
    assert_padded_prefill(make(backend), 6)


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_long_float32(backend: dict[str, str]) -> None:
    core = make(backend, torch.float32)  # small steps: long memory, a missed reset would show
    seg = long_layout()
    assert_matches_solo(core, packed_input(seg, 6, dtype=torch.float32), seg, rtol=1e-4, atol=1e-4)

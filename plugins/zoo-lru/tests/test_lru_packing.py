"""LRU on packed documents, natively (one scan with a reset at every document start) in every scan
backend: the right-padded prefill of transformers issue 48256 and a float32 run at length 300 with
documents of length 1 and documents crossing the scans' chunk boundaries. (The conformance check
``packing`` compares outputs, final states and gradients in float64.)"""

from __future__ import annotations

import pytest
import torch

from zoo_core.testing.packed import assert_matches_solo, assert_padded_prefill, long_layout, packed_input
from zoo_lru.core import LRU

BACKENDS = ("naive", "scan", "chunked")


def make(backend: str, dtype: torch.dtype = torch.float64, **kw: float) -> LRU:
    torch.manual_seed(0)
    return LRU(d_model=6, d_state=8, backend={"scan": backend}, dtype=dtype, **kw).eval()


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_prefill_keeps_each_state(backend: str) -> None:
    assert_padded_prefill(make(backend), 6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_float32(backend: str) -> None:
    core = make(backend, torch.float32, r_min=0.9, r_max=0.999)  # long memory: a missed reset would show
    seg = long_layout()
    assert_matches_solo(core, packed_input(seg, 6, dtype=torch.float32), seg, rtol=1e-4, atol=1e-4)

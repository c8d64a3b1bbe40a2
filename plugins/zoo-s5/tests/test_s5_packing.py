"""S5 on packed documents, natively (the scan restarts at every document start) in every scan backend;
s5-bidirectional too, its reverse scan running on time reversed inside each document. The right-padded
prefill of transformers issue 48256 and float32 at length 300 with documents of length 1 and documents
crossing the scans' chunk boundaries. (The conformance check ``packing`` covers float64 and gradients.)"""

from __future__ import annotations

import pytest
import torch

from zoo_core.testing.packed import assert_matches_solo, assert_padded_prefill, long_layout, packed_input
from zoo_s5.core import S5, S5Bidirectional

BACKENDS = ("naive", "scan", "chunked")


def make(cls: type[S5], backend: str, dtype: torch.dtype = torch.float64) -> S5:
    torch.manual_seed(0)
    return cls(d_model=6, d_state=8, blocks=2, dt_min=1e-3, dt_max=1e-2, backend={"scan": backend}, dtype=dtype).eval()


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_prefill_keeps_each_state(backend: str) -> None:
    assert_padded_prefill(make(S5, backend), 6)


@pytest.mark.parametrize("cls", [S5, S5Bidirectional])
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_float32(cls: type[S5], backend: str) -> None:
    core = make(cls, backend, torch.float32)  # small steps: long memory, a missed reset would show
    seg = long_layout()
    assert_matches_solo(core, packed_input(seg, 6, dtype=torch.float32), seg, rtol=1e-4, atol=1e-4)


def test_bidirectional_padding_reaches_no_document() -> None:
    """Huge padding after the last document: the reverse scan runs inside each document, so it stays out."""
    core = make(S5Bidirectional, "scan")
    seg = long_layout()
    assert_matches_solo(core, packed_input(seg, 6, pad=1e6), seg, rtol=1e-9, atol=1e-9)

"""LrcSSM on packed documents, natively in both paths: the sequential loop zeroes the state entering
each document start; Newton (DEER) zeroes the previous state and the Jacobian there, so every sweep's
linear scan restarts at each start (also across Newton windows). The right-padded prefill of
transformers issue 48256 and float32 at length 300 with documents of length 1. (The conformance
check ``packing`` covers float64 and gradients.)"""

from __future__ import annotations

import pytest
import torch

from zoo_core.testing.packed import assert_matches_solo, assert_padded_prefill, long_layout, packed_input
from zoo_lrcssm.core import LrcSSM

BACKENDS = ({"scan": "naive"}, {"scan": "scan"}, "sequential")
IDS = ("deer-naive", "deer-parallel", "sequential")


def make(backend: dict[str, str] | str, dtype: torch.dtype = torch.float64) -> LrcSSM:
    torch.manual_seed(0)
    return LrcSSM(d_model=6, d_state=4, backend=backend, on_nonconvergence="error", dtype=dtype).eval()


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_padded_prefill_keeps_each_state(backend: dict[str, str] | str) -> None:
    assert_padded_prefill(make(backend), 6, rtol=1e-6, atol=1e-6)  # Newton stops at tol 1e-7


@pytest.mark.parametrize("window", [None, 64])  # 64: Newton windows that cut documents
@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_long_float32(backend: dict[str, str] | str, window: int | None) -> None:
    core = make(backend, torch.float32)
    core.window_elems = window  # type: ignore[misc]  # the class's cache-sized default gives one window here
    seg = long_layout()
    assert_matches_solo(core, packed_input(seg, 6, dtype=torch.float32), seg, rtol=1e-4, atol=1e-4)

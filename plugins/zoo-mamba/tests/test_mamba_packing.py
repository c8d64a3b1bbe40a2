"""Mamba-1 on packed documents, natively (one pass: the conv window cut and the scan's state reset
at every document start) in every scan backend: the right-padded prefill of transformers issue
48256, a float32 run at length 300 with documents of length 1 and documents crossing the chunked
scan's 64-step chunks, states that continue with ``step`` like each document's own, and that the
tests catch a missing reset in either the conv or the scan. (The conformance check ``packing``
compares outputs, final states and gradients in float64.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import zoo_mamba.core as mamba_core
from zoo_core.kernels.short_conv import causal_conv
from zoo_core.packing import run_packed
from zoo_core.testing.packed import (
    assert_matches_solo,
    assert_padded_prefill,
    layout,
    long_layout,
    native_only,
    packed_input,
)
from zoo_mamba.core import Mamba

BACKENDS = ("selective-naive", "selective-chunked")
MAMBASL = {"expand": 1, "tv_dt": False, "tv_B": False, "tv_C": False, "use_D": False}  # no x_proj at all


def make(backend: str, dtype: torch.dtype = torch.float64, **kw: Any) -> Mamba:
    torch.manual_seed(0)
    core = Mamba(6, d_state=4, d_conv=4, backend={"scan": backend}, dtype=dtype, **kw).eval()
    with torch.no_grad():  # away from the init, so no symmetry hides a mistake
        for p in core.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype))
    return core


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("switches", [{}, MAMBASL], ids=["mamba", "mambasl"])
def test_padded_prefill_keeps_each_state(backend: str, switches: dict[str, Any]) -> None:
    assert_padded_prefill(make(backend, **switches), 6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_float32(backend: str) -> None:
    core = make(backend, torch.float32, dt_min=1e-4, dt_max=1e-3)  # small Δ: long memory, a missed reset would show
    seg = long_layout()
    assert_matches_solo(core, packed_input(seg, 6, dtype=torch.float32), seg, rtol=1e-4, atol=1e-5)


def test_states_continue_with_step_like_each_document() -> None:
    """Each document's packed final state (conv window and scan state) continues with ``step``
    exactly as the document's own prefill does."""
    core = make("selective-chunked")
    seg = layout(((5, 1, 2), (3,)), 9)
    x = packed_input(seg, 6, pad=1e4)
    nxt = torch.randn(seg.num_docs, 6, dtype=torch.float64)
    with torch.no_grad():
        _, states = run_packed(core, x, seg, with_states=True)
        assert states is not None
        y_packed, _ = core.step(nxt, states)
        for n, (b, s, ln) in enumerate(zip(seg.doc_row.tolist(), seg.doc_start.tolist(), seg.doc_len.tolist(), strict=True)):
            want = core(torch.cat([x[b, s: s + ln], nxt[n: n + 1]])[None])[0, -1]
            torch.testing.assert_close(y_packed[n], want, rtol=1e-10, atol=1e-12)


def test_outputs_without_states_are_the_same() -> None:
    core, seg = make("selective-chunked"), layout(((4, 3), (6,)), 8)
    x = packed_input(seg, 6)
    with native_only(), torch.no_grad():
        y, states = core.forward_packed(x, seg, with_states=True)
        y2, none = core.forward_packed(x, seg, with_states=False)
    assert none is None and torch.equal(y, y2)
    assert states is not None and states["ssm"].shape == (3, 12, 4) and states["conv"].shape == (3, 12, 3)


def test_a_missing_reset_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison against each document alone fails when either reset is dropped: the conv
    window reading the previous document, or the scan carrying its state."""
    core, seg = make("selective-chunked"), layout(((5, 4, 3),), 12)
    x = packed_input(seg, 6)
    assert_matches_solo(core, x, seg, rtol=1e-9, atol=1e-10)

    packed_conv = mamba_core.causal_conv_packed

    def conv_across(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, segments: Any) -> Any:
        """The row's plain causal conv (windows reach into the previous document), right pasts."""
        return causal_conv(x, w, b)[0], packed_conv(x, w, b, segments)[1]

    with monkeypatch.context() as m:
        m.setattr(mamba_core, "causal_conv_packed", conv_across)
        with pytest.raises(AssertionError, match="outputs"):
            assert_matches_solo(core, x, seg, rtol=1e-9, atol=1e-10)
    scan = core.ops.selective_scan

    class NoReset:  # the chosen scan, told of no document start
        selective_scan = staticmethod(lambda *a, starts=None, **k: scan(*a, **k))  # noqa: ARG005

    with monkeypatch.context() as m:
        m.setattr(core, "ops", NoReset())
        with pytest.raises(AssertionError, match="outputs"):
            assert_matches_solo(core, x, seg, rtol=1e-9, atol=1e-10)

"""RG-LRU on packed documents, natively on every path (the recurrent path's gates reset at each
document's first step, the hand-written adjoint scan through those zeroed decays; the sequential
path's per-step reset): every gradient incl. through the final states, the right-padded prefill of
transformers issue 48256, and float32 at length 300. (The conformance check ``packing`` compares
outputs, final states and the input and parameter gradients on a short float64 layout.)"""

from __future__ import annotations

import pytest
import torch

from zoo_core.packing import run_packed
from zoo_core.testing.packed import (
    assert_matches_solo,
    assert_padded_prefill,
    layout,
    long_layout,
    native_only,
    packed_input,
)
from zoo_rglru.core import RGLRU

F64 = torch.float64
# the recurrent path with either scan, and the sequential path (the string "naive" alone names that path)
BACKENDS = ({"scan": "naive"}, {"scan": "scan"}, "sequential")
IDS = ("recurrent-naive", "recurrent-scan", "sequential")


def make(backend: str | dict[str, str], dtype: torch.dtype = F64) -> RGLRU:
    """Two heads of 3, conv width 4, every parameter moved off its init (nonzero biases, gates off 1/2)."""
    torch.manual_seed(0)
    core = RGLRU(d_model=5, lru_width=6, num_heads=2, conv_width=4, backend=backend, dtype=dtype)
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return core


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_every_gradient_through_outputs_and_final_states(backend: str | dict[str, str]) -> None:
    """A loss on the outputs and on each document's final h and conv state: the gradients of the input
    and of every parameter equal the sum over the documents run alone (float64). Documents start mid-row
    after documents of 1 step; on the recurrent path this runs the gates' reset and the adjoint scan's
    backward across every start."""
    seg = layout(((3, 1, 6, 1), (2, 5, 4)), 12)
    core = make(backend)
    assert core.backend_choice.path == ("sequential" if backend == "sequential" else "recurrent")
    x = packed_input(seg, 5, seed=3).requires_grad_()
    gen = torch.Generator().manual_seed(7)
    with native_only():
        y, states = run_packed(core, x, seg, with_states=True)
    assert states is not None
    wy = torch.randn(y.shape, generator=gen, dtype=F64) * seg.valid[..., None]
    wh, wc = (torch.randn(states[k].shape, generator=gen, dtype=F64) for k in ("h", "conv"))
    params = list(core.parameters())
    got = torch.autograd.grad((y * wy).sum() + (states["h"] * wh).sum() + (states["conv"] * wc).sum(), [x, *params])
    xs = [x.detach()[b:b + 1, s:s + n].clone().requires_grad_() for b, s, n in
          zip(seg.doc_row.tolist(), seg.doc_start.tolist(), seg.doc_len.tolist(), strict=True)]
    total = torch.zeros((), dtype=F64)
    for d, (xd, b, s) in enumerate(zip(xs, seg.doc_row.tolist(), seg.doc_start.tolist(), strict=True)):
        yd, sd = core.forward_with_state(xd)
        total = total + (yd[0] * wy[b, s:s + xd.shape[1]]).sum() + (sd["h"][0] * wh[d]).sum() + (sd["conv"][0] * wc[d]).sum()
    want = torch.autograd.grad(total, [*xs, *params])
    for d, (b, s, n) in enumerate(zip(seg.doc_row.tolist(), seg.doc_start.tolist(), seg.doc_len.tolist(), strict=True)):
        torch.testing.assert_close(got[0][b, s:s + n], want[d][0], rtol=1e-9, atol=1e-11)
    for (name, _), g, w in zip(core.named_parameters(), got[1:], want[len(xs):], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11, msg=lambda m, name=name: f"grad {name}: {m}")


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_padded_prefill_keeps_each_state(backend: str | dict[str, str]) -> None:
    """transformers issue 48256: padding holding values ~1e4 never reaches an output or a final state."""
    assert_padded_prefill(make(backend), 5)


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_long_float32(backend: str | dict[str, str]) -> None:
    """L = 300, seven documents (lengths 1 and 2, long ones crossing the scan's blocks), float32; decays near 1
    (a ≥ 0.9 per step at init range) so a missed reset would carry far."""
    core = make(backend, torch.float32)
    seg = long_layout()
    _, states = assert_matches_solo(core, packed_input(seg, 5, dtype=torch.float32), seg, rtol=1e-4, atol=1e-5)
    assert states is not None and states["start"].shape == (seg.num_docs,) and not bool(states["start"].any())

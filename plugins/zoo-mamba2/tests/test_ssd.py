"""The chunked SSD algorithm against the sequential recurrence: outputs, final state and every
gradient, float64, odd lengths, lengths on and off chunk boundaries, with and without h0."""

import pytest
import torch

from zoo_mamba2.ssd import ssd_chunked, ssd_sequential

F64 = torch.float64


def _inputs(Bt, L, Hh, P, G, N, seed=0, h0=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    ins = {"x": r(Bt, L, Hh, P), "dt": torch.nn.functional.softplus(r(Bt, L, Hh)), "A": -torch.rand(Hh, generator=g, dtype=F64) * 3,
           "B": r(Bt, L, G, N), "C": r(Bt, L, G, N), "h0": r(Bt, Hh, P, N) if h0 else None}
    return {k: (v.requires_grad_() if v is not None else None) for k, v in ins.items()}


def _run(fn, ins, Q):
    y, h = fn(ins["x"], ins["dt"], ins["A"], ins["B"], ins["C"], Q, ins["h0"])
    g = torch.Generator().manual_seed(9)
    loss = (y * torch.randn(y.shape, generator=g, dtype=F64)).sum() + (h * torch.randn(h.shape, generator=g, dtype=F64)).sum()
    leaves = [v for v in ins.values() if v is not None]
    return [y, h, *torch.autograd.grad(loss, leaves)]


@pytest.mark.parametrize("L,Q", [(1, 4), (7, 4), (8, 4), (13, 5), (16, 16), (9, 64), (21, 1)])
@pytest.mark.parametrize("h0", [True, False])
def test_chunked_equals_the_recurrence_with_all_gradients(L, Q, h0):
    ins = _inputs(2, L, 4, 3, 2, 5, seed=L + Q, h0=h0)
    names = ["y", "h_last", *[k for k, v in ins.items() if v is not None]]
    for name, ref, out in zip(names, _run(ssd_sequential, ins, Q), _run(ssd_chunked, ins, Q), strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


def test_chunked_in_pieces_equals_the_whole():
    ins = _inputs(1, 23, 2, 3, 1, 4, seed=3, h0=False)
    with torch.no_grad():
        y, h = ssd_chunked(ins["x"], ins["dt"], ins["A"], ins["B"], ins["C"], 4)
        cut = 10
        y1, h1 = ssd_chunked(*(ins[k][:, :cut] for k in ("x", "dt")), ins["A"], ins["B"][:, :cut], ins["C"][:, :cut], 4)
        y2, h2 = ssd_chunked(*(ins[k][:, cut:] for k in ("x", "dt")), ins["A"], ins["B"][:, cut:], ins["C"][:, cut:], 4, h1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y)
    torch.testing.assert_close(h2, h)


def test_strong_decay_stays_finite_in_float32():
    """Large Δ·A over a long chunk: the masked differences never overflow exp."""
    ins = _inputs(1, 300, 2, 2, 1, 2, seed=1, h0=False)
    with torch.no_grad():
        y, h = ssd_chunked(ins["x"].float(), ins["dt"].float() * 50, ins["A"].float() * 10, ins["B"].float(),
                           ins["C"].float(), 256)
    assert torch.isfinite(y).all() and torch.isfinite(h).all()

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


def _rel(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("L,Q", [(1024, 64), (256, 256)])
def test_float32_keeps_its_precision_after_strong_decay(L, Q):
    """Strong decay (Δ·A = −16 a step) for the first half, then almost none (Δ = 1e-3): a cumulative
    sum over the sequence (or over one long chunk) reaches thousands, and differences of it lost
    the small decays of the second half to rounding (1e-4 relative error in float32). The segment
    sums must be formed on their own: float32 chunked within 2e-5 of the float64 recurrence."""
    Hh = 2
    ins = _inputs(1, L, Hh, 3, 1, 4, seed=5, h0=False)
    dt = torch.full((1, L, Hh), 1.0, dtype=F64)
    dt[:, L // 2:] = 1e-3
    A = torch.full((Hh,), -16.0, dtype=F64)
    with torch.no_grad():
        y_ref, h_ref = ssd_sequential(ins["x"], dt, A, ins["B"], ins["C"], Q)
        y, h = ssd_chunked(ins["x"].float(), dt.float(), A.float(), ins["B"].float(), ins["C"].float(), Q)
    half = L // 2
    errors = {"y, strong half": _rel(y[:, :half], y_ref[:, :half]), "y, weak half": _rel(y[:, half:], y_ref[:, half:]),
              "final state": _rel(h, h_ref)}
    assert max(errors.values()) < 2e-5, errors


def test_a_second_order_gradient_is_refused_by_name():
    """The within-chunk backward works in place: differentiating it again must say so, not fail
    later on a tensor 'modified by an inplace operation'."""
    ins = _inputs(1, 6, 2, 3, 1, 4, seed=2, h0=False)
    y, _ = ssd_chunked(ins["x"], ins["dt"], ins["A"], ins["B"], ins["C"], 4)
    (gx,) = torch.autograd.grad(y.square().sum(), ins["x"], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gx.sum().backward()

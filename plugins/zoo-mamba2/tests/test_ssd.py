"""The chunked SSD algorithm against the sequential recurrence: outputs, final state and every
gradient, float64, odd lengths, lengths on and off chunk boundaries, with and without h0."""

import pytest
import torch

from zoo_core.testing.helpers import assert_slice_backward_linear
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


# packed documents: reset / ends --------------------------------------------------------------------
def _marks(lengths_per_row, L):
    """reset (document starts) and ends (document last steps), (Bt, L) bool, from each row's lengths."""
    from zoo_core.packing import Segments

    seq = torch.full((len(lengths_per_row), L), -1, dtype=torch.long)
    for b, lens in enumerate(lengths_per_row):
        seq[b, : sum(lens)] = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    seg = Segments.from_seq_idx(seq)
    ends = torch.zeros(seg.shape, dtype=torch.bool)
    ends[seg.doc_row, seg.doc_end] = True
    return seg, seg.starts, ends


# Q = 4: starts on a boundary (8), just after (5, 13), just before (3, 11), lengths 1, and a document
# spanning three chunks; Q = 1 (every step its own chunk) and Q > L (one chunk)
LAYOUT = [[3, 2, 3, 1, 4, 2], [1, 10, 3, 1]]


@pytest.mark.parametrize("Q", [1, 2, 3, 4, 5, 8, 64])
def test_resets_chunked_equal_the_recurrence_and_each_document_alone_with_all_gradients(Q):
    L = 16
    seg, reset, ends = _marks(LAYOUT, L)
    ins = _inputs(2, L, 4, 3, 2, 5, seed=Q, h0=False)
    g = torch.Generator().manual_seed(9)
    wy = torch.randn(2, L, 4, 3, generator=g, dtype=F64) * seg.valid[..., None, None]
    wh = torch.randn(seg.num_docs, 4, 3, 5, generator=g, dtype=F64)
    leaves = [ins[k] for k in ("x", "dt", "A", "B", "C")]

    def run(fn):
        y, h = fn(*leaves, Q, reset=reset, ends=ends)
        return [y[seg.valid], h, *torch.autograd.grad((y * wy).sum() + (h * wh).sum(), leaves)]

    ref, out = run(ssd_sequential), run(ssd_chunked)
    for name, r, o in zip(["y", "states", "x", "dt", "A", "B", "C"], ref, out, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"Q={Q} {n}: {m}")
    # the ground truth: each document alone from the zero state (no reset involved)
    with torch.no_grad():
        for i, (b, s, n) in enumerate(zip(seg.doc_row.tolist(), seg.doc_start.tolist(), seg.doc_len.tolist(), strict=True)):
            x1, dt1, B1, C1 = (ins[k][b: b + 1, s: s + n] for k in ("x", "dt", "B", "C"))
            y1, h1 = ssd_sequential(x1, dt1, ins["A"], B1, C1, Q)
            torch.testing.assert_close(out[0][seg.doc_id[seg.valid] == i], y1[0], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(out[1][i], h1[0], rtol=1e-10, atol=1e-10)


def test_ends_without_reset_are_the_states_along_one_sequence():
    """``ends`` alone reads the running state at any step, wherever in a chunk, h0 included."""
    ins = _inputs(2, 13, 2, 3, 1, 4, seed=4, h0=True)
    ends = torch.zeros(2, 13, dtype=torch.bool)
    ends[0, [0, 3, 4, 12]] = True
    ends[1, [7]] = True
    args = [ins[k] for k in ("x", "dt", "A", "B", "C")]
    with torch.no_grad():
        _, ref = ssd_sequential(*args, 4, ins["h0"], ends=ends)
        _, out = ssd_chunked(*args, 4, ins["h0"], ends=ends)
        _, h7 = ssd_sequential(*(t[1:, :8] if t.dim() > 1 else t for t in args), 4, ins["h0"][1:])
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out[-1], h7[0], rtol=1e-10, atol=1e-10)


def test_resets_keep_float32_gradients_finite_under_strong_decay():
    """Δ·A = −60 a step: exp underflows to 0 inside a document; the reset masks must not turn that
    (or anything across a start) into NaN in the values or the gradients."""
    seg, reset, ends = _marks([[40, 1, 90, 29], [160]], 160)
    ins = _inputs(2, 160, 2, 2, 1, 3, seed=6, h0=False)
    leaves = [ins["x"].float().detach().requires_grad_(), (ins["dt"] * 20).float().detach().requires_grad_(),
              torch.full((2,), -3.0, requires_grad=True), ins["B"].float(), ins["C"].float()]
    y, h = ssd_chunked(*leaves, 64, reset=reset, ends=ends)
    grads = torch.autograd.grad(y.sum() + h.sum(), leaves[:3])
    assert all(torch.isfinite(t).all() for t in (y, h, *grads))


def test_bad_marks_are_refused_naming_the_shape():
    ins = _inputs(1, 6, 2, 3, 1, 4, seed=2, h0=False)
    args = [ins[k] for k in ("x", "dt", "A", "B", "C")]
    for fn in (ssd_chunked, ssd_sequential):
        with pytest.raises(ValueError, match=r"reset must be a bool \(B, L\) mask of shape \(1, 6\)"):
            fn(*args, 4, reset=torch.zeros(1, 6))
        with pytest.raises(ValueError, match=r"ends must be a bool \(B, L\) mask of shape \(1, 6\)"):
            fn(*args, 4, ends=torch.zeros(1, 5, dtype=torch.bool))


@pytest.mark.parametrize("fn", [ssd_chunked, ssd_sequential])
def test_the_backward_does_not_grow_a_slice_per_chunk_or_step(fn):
    """The recurrence takes its steps by ``unbind`` (a slice per step would backpropagate a zero tensor
    the size of the whole sequence for each, quadratic in the length); the chunked form has no loop.
    Either way the backward's slice nodes do not multiply with the length."""
    def outputs_at(L):  # 4 and 16 chunks of 4
        ins = _inputs(1, L, 2, 3, 1, 4)
        return fn(ins["x"], ins["dt"], ins["A"], ins["B"], ins["C"], 4, ins["h0"])

    assert_slice_backward_linear(outputs_at, 16)

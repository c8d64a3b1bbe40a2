"""Packed documents in Mamba-3: the trapezoidal scan's ``reset``/``ends`` marks (chunked against the
recurrence and against each document run alone, every gradient, starts on, just before and just after
chunk boundaries), and the core's native ``forward_packed`` (the rotary angle and the trapezoid's
previous-step term restart per document; right-padded prefill; float32 at a longer length)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo_core.packing import Segments
from zoo_core.testing.packed import assert_matches_solo, assert_padded_prefill
from zoo_mamba3.core import Mamba3
from zoo_mamba3.scan import trap_scan_chunked, trap_scan_sequential

F64 = torch.float64
SCANS = {"sequential": trap_scan_sequential, "chunked": trap_scan_chunked}
# Q = 4: starts on a boundary (8), just after (5, 13), just before (3, 11), lengths 1, a document over
# three chunks; Q = 1 (every step its own chunk) and Q > L (one chunk) too
LAYOUT = [[3, 2, 3, 1, 4, 2], [1, 10, 3, 1]]


def _segments(lengths_per_row: list[list[int]], L: int) -> Segments:
    seq = torch.full((len(lengths_per_row), L), -1, dtype=torch.long)
    for b, lens in enumerate(lengths_per_row):
        seq[b, : sum(lens)] = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    return Segments.from_seq_idx(seq)


def _ends(seg: Segments) -> torch.Tensor:
    ends = torch.zeros(seg.shape, dtype=torch.bool)
    ends[seg.doc_row, seg.doc_end] = True
    return ends


def _inputs(Bt: int, L: int, H: int = 3, P: int = 2, N: int = 4, *, seed: int, trapezoidal: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    return {"x": r(Bt, L, H, P), "dt": F.softplus(r(Bt, L, H)), "A": -torch.rand(H, generator=g, dtype=F64) * 2 - 0.1,
            "B": r(Bt, L, H, N), "C": r(Bt, L, H, N), "lam": torch.sigmoid(r(Bt, L, H)) if trapezoidal else None}


# the scan -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("trapezoidal", [True, False])
@pytest.mark.parametrize("Q", [1, 2, 3, 4, 5, 8, 64])
def test_resets_chunked_equal_the_recurrence_and_each_document_alone_with_all_gradients(Q, trapezoidal):
    L = 16
    seg = _segments(LAYOUT, L)
    ins = {k: (v.requires_grad_() if v is not None else None) for k, v in _inputs(2, L, seed=Q, trapezoidal=trapezoidal).items()}
    leaves = [v for v in ins.values() if v is not None]
    g = torch.Generator().manual_seed(9)
    wy = torch.randn(2, L, 3, 2, generator=g, dtype=F64) * seg.valid[..., None, None]
    wh = torch.randn(seg.num_docs, 3, 2, 4, generator=g, dtype=F64)

    def run(fn):
        y, h = fn(ins["x"], ins["dt"], ins["A"], ins["B"], ins["C"], ins["lam"], chunk_size=Q,
                  reset=seg.starts, ends=_ends(seg))
        return [y[seg.valid], h, *torch.autograd.grad((y * wy).sum() + (h * wh).sum(), leaves)]

    ref, out = run(trap_scan_sequential), run(trap_scan_chunked)
    names = ["y", "states", *[k for k, v in ins.items() if v is not None]]
    for name, r, o in zip(names, ref, out, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"Q={Q} {n}: {m}")
    with torch.no_grad():  # the ground truth: each document alone from a fresh start, no marks involved
        for i, (b, s, n) in enumerate(zip(seg.doc_row.tolist(), seg.doc_start.tolist(), seg.doc_len.tolist(), strict=True)):
            piece = {k: (v[b: b + 1, s: s + n] if v is not None and v.dim() > 1 else v) for k, v in ins.items()}
            y1, h1 = trap_scan_sequential(piece["x"], piece["dt"], piece["A"], piece["B"], piece["C"], piece["lam"])
            torch.testing.assert_close(out[0][seg.doc_id[seg.valid] == i], y1[0], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(out[1][i], h1[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(SCANS))
def test_ends_without_reset_are_the_states_along_one_sequence_with_the_carried_step(name):
    """``ends`` alone reads the running state at any step (h0, x_prev, B_prev carried in)."""
    ins = _inputs(1, 13, seed=4)
    g = torch.Generator().manual_seed(5)
    carry = (torch.randn(1, 3, 2, 4, generator=g, dtype=F64), torch.randn(1, 3, 2, generator=g, dtype=F64),
             torch.randn(1, 3, 4, generator=g, dtype=F64))
    ends = torch.zeros(1, 13, dtype=torch.bool)
    ends[0, [0, 3, 4, 9, 12]] = True
    args = [ins[k] for k in ("x", "dt", "A", "B", "C", "lam")]
    _, out = SCANS[name](*args, *carry, chunk_size=4, ends=ends)
    for i, t in enumerate([0, 3, 4, 9, 12]):
        cut = [a[:, : t + 1] if a.dim() > 1 else a for a in args]
        _, h = trap_scan_sequential(*cut, *carry)
        torch.testing.assert_close(out[i], h[0], rtol=1e-10, atol=1e-10)


def test_a_start_at_step_0_drops_the_carried_state_and_step():
    """A reset at step 0 is a fresh sequence: h0, x_prev and B_prev play no part."""
    ins = _inputs(1, 9, seed=6)
    args = [ins[k] for k in ("x", "dt", "A", "B", "C", "lam")]
    carry = (torch.ones(1, 3, 2, 4, dtype=F64), torch.ones(1, 3, 2, dtype=F64), torch.ones(1, 3, 4, dtype=F64))
    reset = torch.zeros(1, 9, dtype=torch.bool)
    reset[0, 0] = True
    y_fresh, h_fresh = trap_scan_sequential(*args)
    for fn in SCANS.values():
        y, h = fn(*args, *carry, chunk_size=4, reset=reset)
        torch.testing.assert_close(y, y_fresh, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(h, h_fresh, rtol=1e-10, atol=1e-10)


def test_resets_keep_float32_gradients_finite_under_strong_decay():
    seg = _segments([[40, 1, 90, 29], [160]], 160)
    ins = _inputs(2, 160, seed=7)
    leaves = [ins["x"].float().requires_grad_(), (ins["dt"] * 20).float().requires_grad_(),
              torch.full((3,), -3.0, requires_grad=True)]
    y, h = trap_scan_chunked(*leaves, ins["B"].float(), ins["C"].float(), ins["lam"].float(), chunk_size=64,
                             reset=seg.starts, ends=_ends(seg))
    grads = torch.autograd.grad(y.sum() + h.sum(), leaves)
    assert all(bool(torch.isfinite(t).all()) for t in (y, h, *grads))


@pytest.mark.parametrize("name", list(SCANS))
def test_bad_marks_are_refused_naming_the_shape(name):
    ins = _inputs(1, 6, seed=2)
    args = [ins[k] for k in ("x", "dt", "A", "B", "C", "lam")]
    with pytest.raises(ValueError, match=r"reset must be a bool \(B, L\) mask of shape \(1, 6\)"):
        SCANS[name](*args, reset=torch.zeros(1, 6))
    with pytest.raises(ValueError, match=r"ends must be a bool \(B, L\) mask of shape \(1, 6\)"):
        SCANS[name](*args, ends=torch.zeros(1, 5, dtype=torch.bool))


# the core -------------------------------------------------------------------------------------------
def _core(backend: str, dtype=F64, chunk_size: int = 4, **kw) -> Mamba3:
    torch.manual_seed(3)
    return Mamba3(d_model=6, d_state=4, nheads=2, ngroups=2, chunk_size=chunk_size, backend=backend, dtype=dtype, **kw)


@pytest.mark.parametrize("backend", list(SCANS))
def test_packed_runs_natively_not_document_by_document(backend, monkeypatch):
    import zoo_core.packing as packing

    def refuse(*args, **kwargs):
        raise AssertionError("by_documents was called: the native packed path was not used")

    monkeypatch.setattr(packing, "by_documents", refuse)
    seg = Segments.from_seq_idx(torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, -1], [0, 1, 1, 1, 1, 1, 1, 1, 1]]))
    y, states = packing.run_packed(_core(backend), torch.randn(2, 9, 6, dtype=F64), seg, with_states=True)
    assert y.shape == (2, 9, 6)
    assert {k: tuple(v.shape) for k, v in states.items()} == {"ssm": (5, 2, 6, 4), "x_prev": (5, 2, 6),
                                                             "B_prev": (5, 2, 4), "angle": (5, 2, 1)}


@pytest.mark.parametrize("backend", list(SCANS))
def test_right_padded_prefill_keeps_each_sample_state_whatever_the_padding_holds(backend):
    """transformers issue 48256: Δ not masked on right padding corrupted the carried state. Here the
    padding holds values of 1e4, and each sample's final state (all four parts) is still its own."""
    assert_padded_prefill(_core(backend, dtype=torch.float32), 6, lengths=(11, 3, 1, 16), L=16, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", list(SCANS))
def test_packed_float32_at_length_300_equals_each_document_alone(backend):
    """Nine documents in two rows of 300 steps, chunks of 64: lengths 1, documents crossing one and
    several chunk boundaries, one starting exactly on a boundary (128), padding at the end."""
    with torch.no_grad():
        assert_matches_solo(_core(backend, dtype=torch.float32, chunk_size=64), torch.randn(2, 300, 6),
                            _segments([[1, 127, 70, 2, 100], [64, 1, 200, 30]], 300), rtol=1e-4, atol=1e-5)


def test_the_angle_restarts_per_document_exactly_after_a_long_prefix():
    """The per-document angle is a difference of row cumulative sums; formed in float64 it keeps a
    late document's angle as its own cumulative sum would, even after a row prefix of 1e4 rad."""
    from zoo_mamba3.core import cumsum_per_document

    seg = _segments([[5000, 7]], 5007)
    theta = torch.full((1, 5007, 1), 2.0) + torch.rand(1, 5007, 1) * 1e-3
    got = cumsum_per_document(theta, seg)[0, 5000:]
    torch.testing.assert_close(got, torch.cumsum(theta[0, 5000:], 0), rtol=0, atol=2e-6)

"""``reset`` in every diagonal/block scan backend: a document start drops the previous state, so a
packed row equals each document scanned alone, in values and gradients; without it nothing changes."""

from __future__ import annotations

import pytest
import torch

from zoo_core.kernels import scan_lti
from zoo_core.kernels.scan import scan_naive, scan_parallel
from zoo_core.kernels.scan_lti import scan_chunked
from zoo_core.packing import Segments

F64 = torch.float64
C128 = torch.complex128


def _layout(L: int) -> Segments:
    """Row 0: lengths 1, 5, 40, 1, rest; row 1: one long document crossing chunk boundaries, then padding."""
    r0 = torch.repeat_interleave(torch.arange(5), torch.tensor([1, 5, 40, 1, L - 47]))
    r1 = torch.where(torch.arange(L) < L - 3, 0, -1)
    return Segments.from_seq_idx(torch.stack([r0, r1]))


def _solo(scan, a, b, seg: Segments):
    """Each document scanned alone (the reference), packed back, and its final state."""
    hs, last = [], []
    for r, s, n in zip(seg.doc_row.tolist(), seg.doc_start.tolist(), seg.doc_len.tolist(), strict=True):
        ad = a if a.shape[0] == 1 and a.shape[1] == 1 else a[r:r + 1, s:s + n]
        h, hl = scan(ad, b[r:r + 1, s:s + n])
        hs.append(h[0])
        last.append(hl[0])
    return seg.pack(torch.nn.utils.rnn.pad_sequence(hs, batch_first=True)), torch.stack(last)


@pytest.mark.parametrize("chunk", [4, 32])
@pytest.mark.parametrize("scan", [scan_naive, scan_parallel, scan_chunked], ids=["naive", "parallel", "chunked"])
def test_reset_equals_documents_alone_lti(scan, chunk, monkeypatch):
    monkeypatch.setattr(scan_lti, "CHUNK", chunk)  # 4: the carry recurrence recurses twice (with resets)
    g = torch.Generator().manual_seed(0)
    L = 70
    seg = _layout(L)
    a = (torch.rand(1, 1, 3, 2, generator=g, dtype=F64) * 0.4 + 0.6) * torch.exp(1j * torch.rand(1, 1, 3, 2, generator=g, dtype=F64))
    a = a.to(C128).requires_grad_(True)
    b = torch.randn(2, L, 3, 2, generator=g, dtype=C128).requires_grad_(True)
    h, h_last = scan(a, b, None, reset=seg.starts)
    ref, ref_last = _solo(scan_naive, a, b, seg)
    v = seg.valid
    torch.testing.assert_close(h[v], ref[v])
    torch.testing.assert_close(seg.at_ends(h), ref_last)
    w = torch.randn(h.shape, generator=g, dtype=C128) * v[..., None, None]
    ga = torch.autograd.grad((h * w).real.sum(), [a, b])
    gr = torch.autograd.grad((ref * w).real.sum(), [a, b])
    for x, y in zip(ga, gr, strict=True):
        assert bool(torch.isfinite(torch.view_as_real(x)).all())
        torch.testing.assert_close(x, y)
    assert h_last.shape == (2, 3, 2)


@pytest.mark.parametrize("structure", ["diag", "block2x2"])
@pytest.mark.parametrize("scan", [scan_naive, scan_parallel], ids=["naive", "parallel"])
def test_reset_time_varying(scan, structure):
    g = torch.Generator().manual_seed(1)
    L = 70
    seg = _layout(L)
    extra = (2, 2) if structure == "block2x2" else ()
    a = (torch.randn(2, L, 3, *extra, generator=g, dtype=F64) * 0.5).requires_grad_(True)
    b = torch.randn(2, L, 3, *extra[:1], generator=g, dtype=F64).requires_grad_(True)
    h0 = torch.randn(2, 3, *extra[:1], generator=g, dtype=F64)  # dropped: every row starts a document at step 0
    h, _ = scan(a, b, h0, structure=structure, reset=seg.starts)
    ref, ref_last = _solo(lambda a_, b_: scan_naive(a_, b_, structure=structure), a, b, seg)
    v = seg.valid
    torch.testing.assert_close(h[v], ref[v])
    torch.testing.assert_close(seg.at_ends(h), ref_last)
    ga = torch.autograd.grad((h * v.reshape(2, L, *[1] * (h.dim() - 2))).sum(), [a, b])
    gr = torch.autograd.grad(ref.sum(), [a, b])
    for x, y in zip(ga, gr, strict=True):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("scan", [scan_naive, scan_parallel, scan_chunked], ids=["naive", "parallel", "chunked"])
def test_no_reset_and_all_false_unchanged(scan):
    g = torch.Generator().manual_seed(2)
    a = torch.rand(1, 1, 4, generator=g, dtype=F64)
    b = torch.randn(2, 50, 4, generator=g, dtype=F64)
    h0 = torch.randn(2, 4, generator=g, dtype=F64)
    h, hl = scan(a, b, h0)
    h2, hl2 = scan(a, b, h0, reset=torch.zeros(2, 50, dtype=torch.bool))
    torch.testing.assert_close(h2, h, rtol=0, atol=1e-12)
    torch.testing.assert_close(hl2, hl, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scan", [scan_naive, scan_parallel, scan_chunked], ids=["naive", "parallel", "chunked"])
def test_reset_refused_when_not_a_bool_mask(scan):
    b = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match="reset must be a bool"):
        scan(torch.rand(1, 1, 3), b, reset=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="segments.starts"):
        scan(torch.rand(1, 1, 3), b, reset=torch.zeros(2, 5))

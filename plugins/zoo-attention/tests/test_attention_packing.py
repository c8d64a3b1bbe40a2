"""Packed batches (``zoo_core.packing``) on both attention cores, natively: one attention call over
the packed rows, each document on its own (RoPE restarting, a block-diagonal mask), in both
backends. The conformance check ``packing`` compares outputs and gradients; it asks no final states
of a core declaring ``growing_state``, so the KV caches and ring buffers are checked here, by
continuing each document with ``step``, which only holds when the cached keys carry the document's
own RoPE positions (a relative score would not tell). Also: the right-padded prefill of
transformers issue 48256 with huge values in the padding, float32 at length 300, and the padding
rows that read nothing valid."""

from __future__ import annotations

import pytest
import torch

import zoo_core.packing
from zoo_attention.core import Attention, AttentionBidirectional
from zoo_core.packing import Segments, by_documents, run_packed
from zoo_core.testing import assert_close
from zoo_core.testing.checks import ConformanceError, case_from_registry, check_packing

F64 = torch.float64
TIGHT = {"rtol": 1e-10, "atol": 1e-12}
BACKENDS = ("naive", "sdpa")


def make(cls: type = Attention, *, backend: str = "naive", dtype: torch.dtype = F64, seed: int = 0, **kw: object) -> Attention:
    torch.manual_seed(seed)
    kw = {"d_model": 12, "n_heads": 6, "n_kv_heads": 2, **kw}
    return cls(**kw, backend={"attention": backend}, dtype=dtype).eval()


def layout(rows: list[list[int]], L: int) -> Segments:
    """seq_idx from each row's document lengths, padding to L."""
    seq_idx = torch.full((len(rows), L), -1, dtype=torch.long)
    for b, lens in enumerate(rows):
        seq_idx[b, : sum(lens)] = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    return Segments.from_seq_idx(seq_idx)


def xs(seg: Segments, dtype: torch.dtype = F64, seed: int = 1, pad: float = 1.0) -> torch.Tensor:
    """Random input for the layout; padding steps scaled by ``pad``."""
    x = torch.randn(*seg.shape, 12, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return torch.where(seg.valid[..., None], x, x * pad)


def solo(core: Attention, x: torch.Tensor, seg: Segments) -> list[tuple[torch.Tensor, dict]]:
    """Each document alone from nothing seen: (outputs (ℓ, H), final state, batch 1)."""
    out = []
    for b, s, n in zip(seg.doc_row.tolist(), seg.doc_start.tolist(), seg.doc_len.tolist(), strict=True):
        y, st = core.forward_with_state(x[b : b + 1, s : s + n])
        out.append((y[0], st))
    return out


def assert_matches_solo(core: Attention, x: torch.Tensor, seg: Segments, y: torch.Tensor, states: dict | None,
                        tol: dict[str, float]) -> None:
    for n, (yd, sd) in enumerate(solo(core, x, seg)):
        b, s, ln = int(seg.doc_row[n]), int(seg.doc_start[n]), int(seg.doc_len[n])
        assert_close(f"document {n} outputs", yd, y[b, s : s + ln], **tol)
        if states is not None:
            assert set(states) == set(sd)
            for k in sd:
                assert_close(f"document {n} state {k!r}", sd[k][0], states[k][n], **tol)


def assert_continues(core: Attention, x: torch.Tensor, seg: Segments, states: dict) -> None:
    """Stepping every document on from its packed final state gives its solo continuation."""
    more = torch.randn(seg.num_docs, 4, 12, generator=torch.Generator().manual_seed(9), dtype=F64)
    state = states
    for t in range(more.shape[1]):
        y_t, state = core.step(more[:, t], state)
    for n, (_, sd) in enumerate(solo(core, x, seg)):
        assert_close(f"document {n} continued", core(more[n : n + 1], sd)[0, -1], y_t[n], **TIGHT)


WINDOWED = [(5, 1, 7), (9, 3)]  # documents shorter than, equal to and longer than a window of 5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls,kw", [(Attention, {}), (Attention, {"window": 5, "bias": True}), (Attention, {"rope": False}),
                                    (AttentionBidirectional, {}), (AttentionBidirectional, {"window": 4})])
def test_native_path_runs_without_the_by_documents_reference(monkeypatch, cls, kw, backend):
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("by_documents ran: the native packed path was not used")

    monkeypatch.setattr(zoo_core.packing, "by_documents", refuse)
    core = make(cls, backend=backend, **kw)
    seg = layout([list(r) for r in WINDOWED], 14)
    x = xs(seg)
    y, states = run_packed(core, x, seg, with_states=core.window is not None or cls is AttentionBidirectional)
    assert_matches_solo(core, x, seg, y, states, TIGHT)
    assert bool(torch.isfinite(y).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_buffers_per_document_continue_like_each_document_alone(backend):
    """The windowed state of every document (wrapped, exactly full, short, length 1) equals its solo
    ring buffer, and stepping on from it gives the solo continuation token by token."""
    core = make(window=5, backend=backend)
    seg = layout([[5, 1, 7], [9, 3, 2]], 16)
    x = xs(seg)
    y, states = run_packed(core, x, seg, with_states=True)
    assert states is not None and states["k"].shape == (seg.num_docs, 2, 5, 2)
    assert_matches_solo(core, x, seg, y, states, TIGHT)
    assert_continues(core, x, seg, states)


@pytest.mark.parametrize("backend", BACKENDS)
def test_growing_caches_batch_for_equal_lengths_and_are_refused_clearly_otherwise(backend):
    core = make(backend=backend)
    seg = layout([[4, 4], [4]], 9)  # equal lengths, padding after the second row's
    x = xs(seg)
    y, states = run_packed(core, x, seg, with_states=True)
    assert states is not None and states["k"].shape == (3, 2, 4, 2) and states["pos"].tolist() == [4, 4, 4]
    assert_matches_solo(core, x, seg, y, states, TIGHT)
    assert_continues(core, x, seg, states)
    ragged = layout([[5, 1, 7], [9, 3]], 14)
    with pytest.raises(ValueError, match="cannot batch these documents' final states.*outputs only"):
        run_packed(core, xs(ragged), ragged, with_states=True)
    y2, none = run_packed(core, xs(ragged), ragged)
    assert none is None
    assert_matches_solo(core, xs(ragged), ragged, y2, None, TIGHT)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls,kw,lengths", [(Attention, {"window": 4}, [7, 2, 10, 1]), (Attention, {}, [6, 6, 6]),
                                            (AttentionBidirectional, {}, [7, 2, 10, 1])])
def test_right_padded_prefill_keeps_each_sample_solo_state_with_huge_padding(cls, kw, lengths, backend):
    """transformers issue 48256 (Mamba's dt not masked on padding corrupted the carried state): a
    right-padded batch is one document per row; padding of size 1e6 must not reach any output of a
    valid step nor any sample's final state, and every output stays finite."""
    core = make(cls, backend=backend, **kw)
    seg = Segments.from_lengths(torch.tensor(lengths), 12)
    x = xs(seg, pad=1e6)
    y, states = run_packed(core, x, seg, with_states=True)
    assert bool(torch.isfinite(y).all())
    assert_matches_solo(core, x, seg, y, states, TIGHT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_at_length_300(backend):
    """Seven documents in two rows of 300 (lengths 1, 2 and 150-odd, one across the window many
    times), float32: equal to each document alone within float32 rounding; gradients finite."""
    core = make(window=32, backend=backend, dtype=torch.float32)
    seg = layout([[1, 150, 37, 100], [2, 260, 30]], 300)
    x = xs(seg, torch.float32).requires_grad_(True)
    y, states = run_packed(core, x, seg, with_states=True)
    tol = {"rtol": 2e-4, "atol": 2e-5}
    with torch.no_grad():
        assert_matches_solo(core, x, seg, y, states, tol)
        ref, ref_states = by_documents(core, x, seg)
        assert_close("outputs vs by_documents", ref[seg.valid], y[seg.valid], **tol)
    (y * seg.valid[..., None]).square().sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in core.parameters())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls", [Attention, AttentionBidirectional])
def test_padding_steps_read_only_themselves_and_stay_finite_in_gradients(cls, backend):
    """Mostly padding (a row of it entirely): no query row is all-masked, so no backend can give NaN
    there; outputs and every gradient finite, and valid steps unaffected by padding values."""
    core = make(cls, backend=backend, window=3)
    seg = Segments.from_seq_idx(torch.tensor([[0, 0, -1, -1, -1, -1], [-1] * 6]))
    x = xs(seg, pad=1e3).requires_grad_(True)
    y, _ = run_packed(core, x, seg)
    y.sum().backward()
    assert bool(torch.isfinite(y).all()) and x.grad is not None and bool(torch.isfinite(x.grad).all())
    mask = core._packed_mask(seg)
    assert bool(mask.any(-1).all())
    assert not bool((mask[:, 0] & ~seg.valid[:, None, :] & seg.valid[:, :, None]).any())  # valid never reads padding
    y_other, _ = run_packed(core, xs(seg, pad=-5.0), seg)
    assert_close("valid outputs", y_other[seg.valid], y.detach()[seg.valid], **TIGHT)


def test_the_conformance_check_fails_when_documents_see_each_other(monkeypatch):
    """check_packing catches a mask without the document boundary (every valid key readable)."""
    case = case_from_registry("attention", d_model=8)
    case.params.update(n_heads=2)
    check_packing(case)
    monkeypatch.setattr(Segments, "same_document", lambda self: self.valid[:, :, None] & self.valid[:, None, :])
    with pytest.raises(ConformanceError, match="outputs vs each document alone"):
        check_packing(case)

"""zoo_core.packing: the documents of a packed batch, moving tensors between layouts, the
by-documents reference, the packed short conv, and the conformance check catching a core that
lets one document's state reach the next."""

from __future__ import annotations

import logging

import pytest
import torch

from zoo_core.kernels.short_conv import causal_conv_naive, causal_conv_packed
from zoo_core.packing import Segments, by_documents, run_packed
from zoo_core.testing.checks import ConformanceError, case_from_registry, check_packing

SEQ_IDX = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, -1, -1],
                        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                        [0, 1, 2, 3, -1, -1, -1, -1, -1, -1]])


def test_layout_fields():
    s = Segments.from_seq_idx(SEQ_IDX)
    assert s.num_docs == 8 and s.shape == (3, 10) and s.max_len == 10
    assert s.doc_row.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert s.doc_start.tolist() == [0, 3, 5, 0, 0, 1, 2, 3]
    assert s.doc_len.tolist() == [3, 2, 3, 10, 1, 1, 1, 1]
    assert s.doc_end.tolist() == [2, 4, 7, 9, 0, 1, 2, 3]
    assert s.position[0].tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 0, 0]
    assert s.doc_id[2].tolist() == [4, 5, 6, 7, -1, -1, -1, -1, -1, -1]
    assert s.starts[0].tolist() == [True, False, False, True, False, True, False, False, False, False]


def test_unpack_pack_reverse_ends_round_trip():
    s = Segments.from_seq_idx(SEQ_IDX)
    x = torch.randn(3, 10, 4)
    docs = s.unpack(x)  # (8, 10, 4)
    assert torch.equal(docs[1, :2], x[0, 3:5]) and bool((docs[1, 2:] == 0).all())
    back = s.pack(docs)
    assert torch.equal(back[s.valid], x[s.valid]) and bool((back[~s.valid] == 0).all())
    r = s.reverse(x)
    assert torch.equal(r[0, :3], x[0, :3].flip(0)) and torch.equal(r[0, 5:8], x[0, 5:8].flip(0))
    assert torch.equal(r[0, 8:], x[0, 8:])  # padding stays
    assert torch.equal(s.reverse(r), x)
    assert torch.equal(s.at_ends(x)[2], x[0, 7])
    right = s.unpack(x, align="right")
    assert torch.equal(right[1, -2:], x[0, 3:5]) and bool((right[1, :-2] == 0).all())
    assert torch.equal(s.pack(right, align="right")[s.valid], x[s.valid])
    same = s.same_document()
    assert bool(same[0, 3, 4]) and not bool(same[0, 2, 3]) and not bool(same[0, 8, 8])


def test_from_lengths_and_cu_seqlens():
    s = Segments.from_lengths(torch.tensor([3, 5]), 5)
    assert s.doc_len.tolist() == [3, 5] and s.seq_idx[0].tolist() == [0, 0, 0, -1, -1]
    c = Segments.from_cu_seqlens(torch.tensor([0, 2, 7]))
    assert c.seq_idx.tolist() == [[0, 0, 1, 1, 1, 1, 1]]


@pytest.mark.parametrize("bad, words", [
    (torch.tensor([[0, -1, 0]]), "padding (-1) comes before"),
    (torch.tensor([[1, 1, 2]]), "starts at document 1"),
    (torch.tensor([[0, 2, 2]]), "from document 0 to 2"),
    (torch.tensor([[0, 1, 0]]), "from document 1 to 0"),
    (torch.tensor([[0, -3, -3]]), "-1"),
    (torch.tensor([[0.0, 1.0]]), "integer tensor"),
    (torch.tensor([0, 0, 1]), "integer tensor (B, L)"),
])
def test_bad_seq_idx_is_refused_with_the_fix(bad, words):
    with pytest.raises(ValueError, match=None) as err:
        Segments.from_seq_idx(bad)
    assert words in str(err.value)


def test_bad_cu_seqlens_and_shape_mismatch():
    with pytest.raises(ValueError, match="strictly increasing"):
        Segments.from_cu_seqlens(torch.tensor([0, 3, 3]))
    s = Segments.from_seq_idx(SEQ_IDX)
    with pytest.raises(ValueError, match="give seq_idx the input's"):
        s.check(torch.zeros(3, 9, 2))


@pytest.mark.parametrize("K", [2, 4])
def test_packed_short_conv_equals_each_document_alone(K):
    s = Segments.from_seq_idx(SEQ_IDX)
    C = 3
    x = torch.randn(3, 10, C, dtype=torch.float64)
    w = torch.randn(C, 1, K, dtype=torch.float64)
    b = torch.randn(C, dtype=torch.float64)
    y, pasts = causal_conv_packed(x, w, b, s)
    for n in range(s.num_docs):
        r, st, ln = int(s.doc_row[n]), int(s.doc_start[n]), int(s.doc_len[n])
        ref, past = causal_conv_naive(x[r : r + 1, st : st + ln], w, b)
        torch.testing.assert_close(y[r, st : st + ln], ref[0])
        torch.testing.assert_close(pasts[n], past[0])


class _Leaky(torch.nn.Module):
    """A causal running sum that claims native packing but never resets: must fail the check."""

    capabilities = frozenset({"causal", "packing"})

    def forward_with_state(self, x, state=None):
        y = x.cumsum(1)
        return y, {"h": y[:, -1]}

    def forward(self, x, state=None):
        return self.forward_with_state(x, state)[0]

    def forward_packed(self, x, segments, *, with_states=True):
        y = x.cumsum(1)
        return y, {"h": segments.at_ends(y)}


def test_by_documents_is_exact_and_run_packed_announces_the_fallback(caplog):
    core = _Leaky()
    s = Segments.from_seq_idx(SEQ_IDX)
    x = torch.randn(3, 10, 2)
    y, states = by_documents(core, x, s)
    assert torch.allclose(y[0, 3:5], x[0, 3:5].cumsum(0)) and torch.allclose(states["h"][1], x[0, 3:5].sum(0))
    leaky_y, _ = run_packed(core, x, s)  # native: the leak shows
    assert not torch.allclose(leaky_y[0, 3:5], y[0, 3:5])

    class Plain(_Leaky):
        capabilities = frozenset({"causal"})

    with caplog.at_level(logging.INFO, logger="zoo_core.packing"):
        run_packed(Plain(), x, s)
        run_packed(Plain(), x, s)
    said = [r for r in caplog.records if "no native packed path" in r.getMessage()]
    assert len(said) == 1 and "Plain" in said[0].getMessage()


def test_conformance_check_catches_a_state_leaking_across_documents(monkeypatch):
    case = case_from_registry("s4d")
    from zoo_s4d.core import S4D

    def leaky(self, x, segments, *, with_states=True):  # the row run whole: document 2 starts from document 1's state
        y, h = self.forward_with_state(x)
        return y, {k: v[segments.doc_row] for k, v in h.items()}

    monkeypatch.setattr(S4D, "forward_packed", leaky, raising=False)
    monkeypatch.setattr(S4D, "capabilities", S4D.capabilities | {"packing"})
    case.capabilities = case.capabilities | {"packing"}
    with pytest.raises(ConformanceError, match="outputs vs each document alone"):
        check_packing(case)


def test_pack_batch_puts_every_sequence_in_one_row_intact():
    from zoo_core.packing import pack_batch

    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([29, 7, 12, 15, 9, 20, 3, 29, 11])
    x = torch.randn(9, 29, 2, generator=g)
    packed, seq_idx, order = pack_batch(x, lengths)
    assert packed.shape[1] == 29 and packed.shape[0] < 9
    seg = Segments.from_seq_idx(seq_idx)
    assert sorted(order.tolist()) == list(range(9)) and seg.num_docs == 9
    for n in range(9):
        i = int(order[n])
        assert int(seg.doc_len[n]) == int(lengths[i])
        r, s = int(seg.doc_row[n]), int(seg.doc_start[n])
        assert torch.equal(packed[r, s : s + int(lengths[i])], x[i, : int(lengths[i])])
    assert bool((packed[~seg.valid] == 0).all())
    assert int(seg.valid.sum()) == int(lengths.sum())
    with pytest.raises(ValueError, match="does not fit a packed row of 10"):
        pack_batch(x, lengths, capacity=10)


def _every_core() -> list[str]:
    from zoo_core.plugins import get_registry

    return sorted(get_registry().cores)


@pytest.mark.parametrize("core", _every_core())
def test_a_packed_batch_scores_as_the_padded_one(core):
    """model(packed, seq_idx)[n] is model(padded, lengths)[order[n]]: what training with pack relies on."""
    from zoo_core.build import build_model
    from zoo_core.packing import pack_batch
    from zoo_core.testing.helpers import model_spec

    model = build_model(model_spec(core, d_model=8, inp={"channels": 3}), seed=0, dtype=torch.float64).eval()
    lengths = torch.tensor([9, 4, 1, 6, 9, 2])
    x = torch.randn(6, 9, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    packed, seq_idx, order = pack_batch(x, lengths)
    with torch.no_grad():
        torch.testing.assert_close(model(packed, seq_idx=seq_idx), model(x, lengths)[order])


def test_packed_period_outputs_and_features():
    """Blockwise supervision and per-step features take seq_idx too: the last period is forward's output."""
    from zoo_core.build import build_model
    from zoo_core.packing import pack_batch
    from zoo_core.testing.helpers import model_spec

    model = build_model(model_spec("s4d", d_model=8, depth=4, stacking={"policy": "periodic", "period": 2}), seed=0,
                        dtype=torch.float64).eval()
    lengths = torch.tensor([7, 3, 5, 2])
    x = torch.randn(4, 7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    packed, seq_idx, order = pack_batch(x, lengths)
    with torch.no_grad():
        outs = model.period_outputs(packed, seq_idx=seq_idx)
        assert len(outs) == 2
        torch.testing.assert_close(outs[-1], model(packed, seq_idx=seq_idx))
        torch.testing.assert_close(outs[0], model.period_outputs(x, lengths)[0][order])
        feats = model.features(packed, seq_idx=seq_idx)
        seg = Segments.from_seq_idx(seq_idx)
        torch.testing.assert_close(seg.unpack(feats)[0, :7], model.features(x[int(order[0]) : int(order[0]) + 1])[0])
    with pytest.raises(Exception, match="lengths .* or seq_idx .*not both"):
        model(packed, torch.tensor([7] * packed.shape[0]), seq_idx=seq_idx)


@pytest.mark.parametrize("pool", ["mean", "last", "mean_logits"])
def test_a_packed_prefill_of_a_pooled_model_continues_each_document(pool):
    from zoo_core.build import build_model
    from zoo_core.testing.helpers import model_spec

    model = build_model(model_spec("lru", d_model=8, pool=pool, inp={"channels": 3, "include_time": True, "length": 20}),
                        seed=0, dtype=torch.float64).eval()
    x = torch.randn(1, 10, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    seq_idx = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, -1]])
    nxt = torch.randn(2, 3, dtype=torch.float64)
    with torch.no_grad():
        y, state = model.forward_with_state(x, seq_idx=seq_idx)
        stepped, _ = model.step(nxt, state)
        for d, (s, e) in enumerate([(0, 4), (4, 9)]):
            doc = x[:, s:e]
            torch.testing.assert_close(y[d], model(doc)[0])
            torch.testing.assert_close(stepped[d], model(torch.cat([doc, nxt[d : d + 1, None]], 1))[0])

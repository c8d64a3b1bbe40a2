"""block.bidirectional: any causal core run forward and time-reversed, combined (zoo_core.nn.bidirectional).

For every registered causal core: the block equals a hand-built composition of the same two cores
(forward, and flip → core → flip), padded batches give exactly what each sequence gives alone (the
reversal stays inside the valid steps, whatever the padding holds), packed rows equal each document
alone, and the model refuses to stream, naming the block."""

from __future__ import annotations

import pytest
import torch

from zoo_core.build import build_model, summary
from zoo_core.errors import NotCausalError, SpecError
from zoo_core.factory import load_pretrained
from zoo_core.io.pretrained import save_pretrained
from zoo_core.nn.bidirectional import Bidirectional
from zoo_core.packing import Segments
from zoo_core.spec import load_spec
from zoo_core.testing.helpers import cores_with, model_spec

F64 = torch.float64
CAUSAL = cores_with("causal")


def _model(core: str, combine: str = "concat", shared: bool = False, **kw):
    spec = model_spec(core, d_model=8, depth=2, block={"bidirectional": {"combine": combine, "shared": shared}}, **kw)
    return build_model(spec, seed=0, dtype=F64).eval()


def _hand_built(bi: Bidirectional, u: torch.Tensor) -> torch.Tensor:
    """The composition written out: y_f = core_f(u), y_b = flip(core_b(flip(u))), then the combine."""
    back = bi.forward_core if bi.backward_core is None else bi.backward_core
    y_f = bi.forward_core(u)
    y_b = back(u.flip(1)).flip(1)
    if bi.combine == "sum":
        return y_f + y_b
    assert bi.mix is not None
    z = torch.cat([y_f, y_b], -1) @ bi.mix.weight.T + bi.mix.bias
    if bi.combine == "concat":
        return z
    g = torch.sigmoid(z)
    return g * y_f + (1 - g) * y_b


@pytest.mark.parametrize("core", CAUSAL)
def test_equals_the_hand_built_composition_and_padding_is_exact(core):
    model = _model(core, combine="gate")
    bi = model.stack.block(0).core
    assert isinstance(bi, Bidirectional) and bi.backward_core is not None
    assert not any(p1 is p2 for p1 in bi.forward_core.parameters() for p2 in bi.backward_core.parameters())
    g = torch.Generator().manual_seed(1)
    u = torch.randn(2, 9, 8, generator=g, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(bi(u), _hand_built(bi, u))
        x = torch.randn(3, 11, 3, generator=g, dtype=F64)
        lengths = torch.tensor([11, 6, 1])
        padded = x.clone()
        padded[1, 6:] = 1e3  # whatever the padding holds
        padded[2, 1:] = -7.0
        y = model(padded, lengths)
        for i, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(y[i], model(x[i : i + 1, :n])[0])


@pytest.mark.parametrize("core", CAUSAL)
def test_packed_rows_equal_each_document_alone(core):
    model = _model(core, combine="sum", shared=True)
    assert model.stack.block(0).core.backward_core is None
    seq_idx = torch.tensor([[0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, -1],
                            [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]])
    x = torch.randn(2, 12, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    seg = Segments.from_seq_idx(seq_idx)
    with torch.no_grad():
        y = model(x, seq_idx=seq_idx)  # (N, O): one row per document
        assert y.shape == (seg.num_docs, 3)
        for n in range(seg.num_docs):
            r, s, ln = int(seg.doc_row[n]), int(seg.doc_start[n]), int(seg.doc_len[n])
            torch.testing.assert_close(y[n], model(x[r : r + 1, s : s + ln])[0])


def test_every_combine_and_sharing_builds_saves_loads_and_trains_both_directions(tmp_path):
    x = torch.randn(2, 7, 3)
    for combine in ("sum", "concat", "gate"):
        for shared in (False, True):
            model = build_model(model_spec("s4d", d_model=8, block={"bidirectional": {"combine": combine, "shared": shared}}), seed=0)
            model(x).sum().backward()
            bi = model.stack.block(0).core
            for name, p in bi.named_parameters():
                assert p.grad is not None and bool(p.grad.abs().sum() > 0), (combine, shared, name)
            save_pretrained(model.eval(), tmp_path / f"{combine}-{shared}")
            again = load_pretrained(tmp_path / f"{combine}-{shared}").eval()
            with torch.no_grad():
                torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)
    text = summary(model)
    assert "bidirectional: every core forward and time-reversed (one core both ways), combined by gate" in text


def test_separate_directions_draw_their_own_parameters():
    bi = _model("lru").stack.block(0).core
    f = dict(bi.forward_core.named_parameters())
    b = dict(bi.backward_core.named_parameters())
    assert f.keys() == b.keys() and any(not torch.equal(f[k], b[k]) for k in f)


def test_streaming_is_refused_naming_the_block():
    model = _model("mamba")
    with pytest.raises(NotCausalError, match="bidirectional block .*cannot stream .*drop block.bidirectional"):
        model.init_state(1)


def test_hybrid_stacks_wrap_every_core():
    model = _model("lru", cores={"att": {"kind": "s4d", "preset": "tiny"}}, pattern=["core", "att"])
    kinds = [type(model.stack.block(i).core.forward_core).__name__ for i in range(2)]
    assert kinds == ["LRU", "S4D"]


def test_sampling_rate_rescales_both_directions():
    from zoo_core.nn.model import rescale_sampling_rate

    model = _model("s4d")
    bi = model.stack.block(0).core
    rescale_sampling_rate(model, 2.0)
    assert bi.forward_core.dt_scale == bi.backward_core.dt_scale == 2.0 and model.spec["model"]["core"]["dt_scale"] == 2.0
    with pytest.raises(ValueError, match="discrete-time"):
        rescale_sampling_rate(_model("lru"), 2.0)


def test_refusals():
    with pytest.raises(SpecError, match="reads the sequence backwards too"):
        load_spec(model_spec("lru", task={"kind": "lm"}, inp={"vocab_size": 5}, block={"bidirectional": {}}))
    with pytest.raises(SpecError, match="combine"):
        load_spec(model_spec("lru", block={"bidirectional": {"combine": "max"}}))
    with pytest.raises(ValueError, match="s5-bidirectional.*not causal|S5Bidirectional is not causal"):
        build_model(model_spec("s5-bidirectional", block={"bidirectional": {}}), seed=0)


def test_backend_labels_list_the_cores_not_the_bidirectional_wrapper():
    """build.backend_labels (what a training run records): the wrapper delegates backend_choice to its
    forward core, so it is not listed again; the cores of both directions bound the same choice."""
    from zoo_core.build import backend_labels

    labels = backend_labels(_model("lru"))
    assert len(labels) == 1 and labels[0].startswith("LRU: "), labels

"""The Mamba-2 core beyond the conformance suite: bad parameters named by the params model, Δ
rescaling (continuous time), the un-normed gate, chunked streaming across chunk boundaries, and
the zoo's workflows (one epoch of `zoo train` on JapaneseVowels, `zoo eval --adaptive`,
`zoo stream`, save/load, `zoo build` of the example specs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zoo_core.build import build_model
from zoo_core.cli.zoo import main as zoo_main
from zoo_core.errors import CoreArgumentError
from zoo_core.nn.model import rescale_sampling_rate
from zoo_core.testing.workflows import check_workflows
from zoo_mamba2.core import Mamba2

F64 = torch.float64
SPECS = Path(__file__).resolve().parents[1] / "specs"


# bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,rule", [
    ({"n_heads": 3, "head_dim": 4}, r"n_heads · head_dim = 3 · 4 = 12 must equal expand · d_model = 2 · 8 = 16"),
    ({"head_dim": 5}, r"head_dim = 5 must divide expand · d_model = 2 · 8 = 16"),
    ({"n_heads": 4, "n_groups": 3}, r"n_groups = 3 must divide the number of heads 4"),
    ({"chunk_size": 0}, r"chunk_size = 0: Input should be greater than 0"),
    ({"chunk_size": -4}, r"chunk_size = -4: Input should be greater than 0"),
    ({"dt_limit_min": 0.2, "dt_limit_max": 0.1}, r"dt_limit_min \(0.2\) must not exceed dt_limit_max"),
])
def test_bad_parameters_name_the_field_and_the_rule(kw, rule):
    with pytest.raises(CoreArgumentError, match=rf"^Mamba2: invalid constructor argument.*{rule}"):
        Mamba2(d_model=8, **kw)


def test_bad_parameters_in_a_spec_are_refused_too():
    from zoo_core.errors import SpecError

    spec = {"schema_version": 1, "task": {"kind": "sequence", "outputs": 2}, "input": {"channels": 3},
            "model": {"d_model": 8, "depth": 1, "core": {"kind": "mamba2", "n_heads": 3, "head_dim": 4}}}
    with pytest.raises(SpecError, match="n_heads · head_dim"):
        build_model(spec)


def test_heads_default_to_gcd_with_64():
    assert (Mamba2(d_model=768).n_heads, Mamba2(d_model=768).head_dim) == (24, 64)
    assert (Mamba2(d_model=5).n_heads, Mamba2(d_model=5).head_dim) == (5, 2)


# continuous time -----------------------------------------------------------------------------------
def test_rescaling_dt_is_the_same_mixer_with_every_step_doubled():
    torch.manual_seed(0)
    a = Mamba2(d_model=6, d_state=3, n_heads=2, chunk_size=4, dtype=F64)
    b = Mamba2(d_model=6, d_state=3, n_heads=2, chunk_size=4, dt_scale=2.0, dtype=F64)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 11, 6, dtype=F64)
    before = a(x)
    a.rescale_dt(2.0)
    torch.testing.assert_close(a(x), b(x))
    assert not torch.allclose(a(x), before)
    xs, dt, *_ = a._ssm_inputs(torch.zeros(1, a.conv_dim, dtype=F64), torch.zeros(1, 2, dtype=F64))
    xs, dt1, *_ = b._ssm_inputs(torch.zeros(1, a.conv_dim, dtype=F64), torch.zeros(1, 2, dtype=F64))
    torch.testing.assert_close(dt, dt1)


def test_rescale_sampling_rate_on_a_model_updates_the_spec():
    model = build_model({k: v for k, v in _spec().items() if k != "training"}, seed=0)
    rescale_sampling_rate(model, 2.0)
    assert model.spec["model"]["core"]["dt_scale"] == 2.0 and model.cores()[0].dt_scale == 2.0


# the un-normed gate, streaming ----------------------------------------------------------------------
def test_without_rmsnorm_chunked_equals_sequential_and_steps():
    torch.manual_seed(1)
    fast = Mamba2(d_model=5, d_state=4, n_heads=5, n_groups=5, rmsnorm=False, chunk_size=3, dtype=F64)
    slow = Mamba2(d_model=5, d_state=4, n_heads=5, n_groups=5, rmsnorm=False, chunk_size=3, backend="sequential",
                  dtype=F64)
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 10, 5, dtype=F64)
    torch.testing.assert_close(fast(x), slow(x))
    state, ys = fast.init_state(2), []
    for t in range(10):
        y, state = fast.step(x[:, t], state)
        ys.append(y)
    torch.testing.assert_close(torch.stack(ys, 1), fast(x))


def test_chunked_streaming_in_pieces_that_straddle_chunks_equals_the_whole():
    torch.manual_seed(2)
    core = Mamba2(d_model=6, d_state=3, n_heads=3, n_groups=3, chunk_size=4, dtype=F64)
    x = torch.randn(2, 19, 6, dtype=F64)
    whole, last = core.forward_with_state(x)
    state, outs = None, []
    for piece in (x[:, :5], x[:, 5:6], x[:, 6:15], x[:, 15:]):
        y, state = core.forward_with_state(piece, state)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), whole)
    for key in ("conv", "ssm"):
        torch.testing.assert_close(state[key], last[key])


# the zoo's workflows --------------------------------------------------------------------------------
def _spec() -> dict:
    return {"schema_version": 1, "name": "mamba2-jv-smoke",
            "task": {"kind": "classification", "classes": 9}, "input": {"channels": 12},
            "model": {"d_model": 8, "depth": 2, "stacking": {"policy": "periodic", "period": 1, "damping": 0.5},
                      "block": {"norm": "rms", "prenorm": True, "activation": "identity", "output": "none",
                                "residual": True, "dropout": 0.0},
                      "core": {"kind": "mamba2", "d_state": 4, "n_heads": 4, "chunk_size": 8}},
            "training": {"dataset": "JapaneseVowels", "protocol": "seed-split", "epochs": 1, "batch_size": 64,
                         "lr": 3e-3}}


@pytest.mark.requires("aeon")
def test_train_eval_stream_and_save_load_on_japanese_vowels(tmp_path):
    """zoo_core.testing.workflows, with one block shared across depth and damped (α = 0.5)."""
    check_workflows(_spec()["model"]["core"], tmp_path, stacking=_spec()["model"]["stacking"])


@pytest.mark.parametrize("name", sorted(p.name for p in SPECS.glob("*.yaml") if "130m" not in p.name))
def test_the_example_specs_build(name):
    """(mamba2-130m.yaml builds too, in seconds: `zoo build` it by hand; kept out of the fast suite.)"""
    assert zoo_main(["build", str(SPECS / name)]) == 0


# empty sequences and incomplete states ---------------------------------------------------------------
@pytest.mark.parametrize("backend", ["chunked", "sequential"])
def test_an_empty_sequence_passes_the_state_through(backend):
    core = Mamba2(d_model=6, d_state=3, n_heads=2, chunk_size=4, backend=backend, dtype=F64)
    _, state = core.forward_with_state(torch.randn(2, 5, 6, dtype=F64))
    y, after = core.forward_with_state(torch.zeros(2, 0, 6, dtype=F64), state)
    assert y.shape == (2, 0, 6) and all(torch.equal(after[k], state[k]) for k in state)
    y, fresh = core.forward_with_state(torch.zeros(2, 0, 6, dtype=F64))
    assert y.shape == (2, 0, 6) and {k: v.shape for k, v in fresh.items()} == {k: v.shape for k, v in state.items()}


def test_a_state_without_its_parts_is_refused_naming_them():
    core = Mamba2(d_model=6, d_state=3, n_heads=2, chunk_size=4)
    state = core.init_state(1)
    with pytest.raises(ValueError, match=r"Mamba2 state lacks \['conv'\].*init_state"):
        core.forward_with_state(torch.randn(1, 3, 6), {"ssm": state["ssm"]})
    with pytest.raises(ValueError, match=r"Mamba2 state lacks \['ssm'\]"):
        core.step(torch.randn(1, 6), {"conv": state["conv"]})


# packed documents ---------------------------------------------------------------------------------
def _packed_core(backend: str, dtype=F64, chunk_size: int = 4) -> Mamba2:
    torch.manual_seed(3)
    return Mamba2(d_model=6, d_state=3, n_heads=3, n_groups=3, chunk_size=chunk_size, backend=backend, dtype=dtype)


@pytest.mark.parametrize("backend", ["chunked", "sequential"])
def test_packed_runs_natively_not_document_by_document(backend, monkeypatch):
    import zoo_core.packing as packing

    def refuse(*args, **kwargs):
        raise AssertionError("by_documents was called: the native packed path was not used")

    monkeypatch.setattr(packing, "by_documents", refuse)
    seg = packing.Segments.from_seq_idx(torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, -1], [0, 1, 1, 1, 1, 1, 1, 1, 1]]))
    y, states = packing.run_packed(_packed_core(backend), torch.randn(2, 9, 6, dtype=F64), seg, with_states=True)
    assert y.shape == (2, 9, 6) and states["ssm"].shape == (5, 3, 4, 3) and states["conv"].shape == (5, 30, 3)


@pytest.mark.parametrize("backend", ["chunked", "sequential"])
def test_right_padded_prefill_keeps_each_sample_state_whatever_the_padding_holds(backend):
    """transformers issue 48256: Δ not masked on right padding corrupted the carried state. Here the
    padding holds values of 1e4, and each sample's final state is still its own."""
    from zoo_core.testing.packed import assert_padded_prefill

    assert_padded_prefill(_packed_core(backend, dtype=torch.float32), 6, lengths=(11, 3, 1, 16), L=16, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["chunked", "sequential"])
def test_packed_float32_at_length_300_equals_each_document_alone(backend):
    """Eight documents in two rows of 300 steps, chunks of 64: lengths 1, documents crossing one and
    several chunk boundaries, one starting exactly on a boundary (128), padding at the end."""
    from zoo_core.testing.packed import assert_matches_solo, layout

    with torch.no_grad():
        assert_matches_solo(_packed_core(backend, dtype=torch.float32, chunk_size=64), torch.randn(2, 300, 6),
                            layout([[1, 127, 70, 2, 100], [64, 1, 200, 30]], 300), rtol=1e-4, atol=1e-5)

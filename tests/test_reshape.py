"""Input reshaping: the cut itself, padding through lengths, streaming equal to the parallel path
at every prefix (concat buffers steps, rechunk splits them), and bad c values."""

from __future__ import annotations

import textwrap

import pytest
import torch

from zoo_core.build import build_model
from zoo_core.errors import SpecError
from zoo_core.factory import load_pretrained
from zoo_core.io.pretrained import save_pretrained
from zoo_core.nn.reshape import InputReshaper
from zoo_core.spec import load_spec
from zoo_core.testing.helpers import cores_with, unroll

F64 = torch.float64


def spec(c, channels=3, core="lru", pool="mean", **inp):
    return {"schema_version": 1, "task": {"kind": "classification", "classes": 3},
            "input": {"channels": channels, "reshape": {"c": c}, **inp},
            "model": {"d_model": 6, "depth": 2, "pool": pool, "core": {"kind": core, "preset": "tiny"},
                      "stacking": {"policy": "periodic", "period": 1, "damping": 0.7}}}


def test_concat_puts_consecutive_steps_side_by_side():
    r = InputReshaper(2, 6)
    x = torch.arange(1, 15, dtype=F64).reshape(1, 7, 2)  # steps (1,2), (3,4), ..., (13,14)
    y, n = r(x, torch.tensor([7]))
    assert r.mode == "concat" and y.shape == (1, 3, 6)
    assert y[0, 0].tolist() == [1, 2, 3, 4, 5, 6]
    assert y[0, 2].tolist() == [13, 14, 0, 0, 0, 0]  # zero end padding
    assert n.tolist() == [3]


def test_rechunk_spreads_a_step_and_pads_when_c_does_not_divide_d():
    r = InputReshaper(5, 2)
    x = torch.arange(1, 16, dtype=F64).reshape(1, 3, 5)
    y, _ = r(x)
    assert r.mode == "rechunk" and y.shape == (1, 8, 2)
    assert y[0, 2].tolist() == [5, 6]  # straddles raw steps 0 and 1
    assert y[0, 7].tolist() == [15, 0]


def test_lengths_zero_the_values_past_each_sample_and_count_model_steps():
    r = InputReshaper(2, 6)
    x = torch.ones(2, 7, 2)
    y, n = r(x, torch.tensor([7, 4]))
    assert n.tolist() == [3, 2]  # ceil(4·2 / 6) = 2
    assert y[1, 1].tolist() == [1, 1, 0, 0, 0, 0] and y[1, 2].abs().sum() == 0


@pytest.mark.parametrize("core", cores_with("step"))
@pytest.mark.parametrize("c,channels", [(6, 3), (9, 3), (2, 5), (4, 5)])
def test_step_gives_the_parallel_prediction_at_every_prefix(core, c, channels):
    model = build_model(spec(c, channels, core=core), seed=0).double().eval()
    x = torch.randn(2, 7, channels, dtype=F64)
    with torch.no_grad():
        streamed = unroll(model, x)
        for t in range(x.shape[1]):
            torch.testing.assert_close(streamed[t], model(x[:, : t + 1]), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("pool", ["last", "mean_logits"])
def test_other_pools_stream_through_reshaping(pool):
    model = build_model(spec(6, 2, pool=pool), seed=0).double().eval()
    x = torch.randn(2, 8, 2, dtype=F64)
    with torch.no_grad():
        streamed = unroll(model, x)
        for t in (0, 2, 5, 7):
            torch.testing.assert_close(streamed[t], model(x[:, : t + 1]), rtol=1e-8, atol=1e-10)


def test_chunked_forward_with_state_carries_the_buffer():
    model = build_model(spec(9, 3), seed=0).double().eval()
    x = torch.randn(2, 11, 3, dtype=F64)
    with torch.no_grad():
        full = model(x)
        _, st = model.forward_with_state(x[:, :4])  # 4 raw steps: one model step and a third
        assert int(st.reshape.fill[0]) == 3 and int(st.t[0]) == 4
        y, st = model.forward_with_state(x[:, 4:8], st)
        torch.testing.assert_close(y, model(x[:, :8]))
        y, st = model.step(x[:, 8], st)
        for t in range(9, 11):
            y, st = model.step(x[:, t], st)
        torch.testing.assert_close(y, full)


def test_padded_batches_equal_samples_alone():
    model = build_model(spec(4, 5), seed=0).double().eval()
    x = torch.randn(3, 9, 5, dtype=F64)
    lengths = torch.tensor([9, 3, 6])
    with torch.no_grad():
        y = model(x, lengths)
        for i, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(y[i], model(x[i : i + 1, :n])[0])
        assert model.period_outputs(x, lengths)[-1].shape == y.shape


def test_time_channel_is_a_raw_feature_before_reshaping():
    model = build_model(spec(8, 3, include_time=True, length=20), seed=0).double().eval()
    assert model.reshaper.d == 4 and model.encoder.in_features == 8
    x = torch.randn(2, 9, 3, dtype=F64)
    with torch.no_grad():
        streamed = unroll(model, x)
        torch.testing.assert_close(streamed[-1], model(x))
        torch.testing.assert_close(streamed[4], model(x[:, :5]))


def test_adaptive_streaming_through_reshaping():
    s = spec(6, 3)
    s["model"]["depth"] = 4
    model = build_model(s, seed=0).double().eval()
    x = torch.randn(2, 7, 3, dtype=F64)
    state = model.adaptive_init_state(2, max_depth=6, stop_at="block")
    for t in range(7):
        res, state = model.adaptive_step(x[:, t], state, epsilon=0.05)
        ref = model.adaptive(x[:, : t + 1], epsilon=0.05, max_depth=6, stop_at="block", count_flops=False)
        assert res.depth.tolist() == ref.depth.tolist()
        torch.testing.assert_close(res.output, ref.output)


BASE = """\
schema_version: 1
task: {kind: classification, classes: 2}
input:
  channels: 6
  reshape: {c: 8}
model:
  d_model: 8
  depth: 2
  core: {kind: lru, preset: tiny}
"""


@pytest.mark.parametrize("text,fragments", [
    (BASE, ["spec.yaml:5", "input.reshape.c", "c = 8 does not fit 6 input features", "12, 18, 24", "c < 6"]),
    (BASE.replace("channels: 6", "channels: 3\n  include_time: true\n  length: 10").replace("c: 8", "c: 6"),
     ["input.reshape.c", "time channel", "c = 6 does not fit 4"]),
    (BASE.replace("c: 8", "c: 0"), ["input.reshape.c", "greater than 0"]),
    (BASE.replace("channels: 6", "vocab_size: 6"), ["input.reshape", "real features"]),
    (BASE.replace("{kind: classification, classes: 2}", "{kind: sequence, outputs: 2}"), ["input.reshape", "pooled tasks"]),
])
def test_bad_reshape_specs_name_the_key(tmp_path, text, fragments):
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))


def test_good_reshape_spec_round_trips():
    s = load_spec(spec(12, 3))
    once = s.resolved()
    assert once["input"]["reshape"] == {"c": 12}
    assert load_spec(once).resolved() == once


def test_a_saved_reshaping_adaptive_model_reloads_with_the_same_behaviour(tmp_path):
    s = spec(12, 3)
    s["model"]["depth"] = 4
    s["model"]["stacking"] = {"policy": "periodic", "period": 2, "damping": "learned",
                              "adaptive": {"epsilon": 0.05, "max_depth": 8, "stop_at": "block"}}
    model = build_model(s, seed=0).eval()
    save_pretrained(model, str(tmp_path / "m"))
    loaded = load_pretrained(str(tmp_path / "m"))
    assert loaded.spec == model.spec and loaded.reshaper.c == 12
    x = torch.randn(2, 10, 3)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    a, b = model.adaptive(x, count_flops=False), loaded.adaptive(x, count_flops=False)
    assert a.depth.tolist() == b.depth.tolist() and loaded.adaptive_config == model.adaptive_config

"""ModelState: a typed streaming state, flattened to named tensors only to save it; a stream saved
mid-way and restored continues exactly; states of the wrong kind are refused with the fix."""

from __future__ import annotations

import pytest
import torch

from zoo_core.build import build_model
from zoo_core.errors import UsageError
from zoo_core.nn.model_state import AdaptiveStream, ModelState

F64 = torch.float64


def spec(task, inp, **model):
    body = {"d_model": 6, "depth": 2, "core": {"kind": "lru", "preset": "tiny"}}
    body.update(model)
    return {"schema_version": 1, "task": task, "input": inp, "model": body}


CLS = {"kind": "classification", "classes": 3}
CASES = {
    "mean": spec(CLS, {"channels": 2}),
    "per-step": spec({"kind": "sequence", "outputs": 2}, {"channels": 2}, core={"kind": "s4d", "preset": "tiny"}),
    "rechunk-time": spec(CLS, {"channels": 5, "reshape": {"c": 2}, "include_time": True, "length": 20}, pool="last"),
    "mamba-lm": spec({"kind": "lm"}, {"vocab_size": 7}, core={"kind": "mamba", "preset": "tiny"}),
}


def _inputs(model, name):
    if name == "mamba-lm":
        return torch.randint(0, 7, (2, 9))
    return torch.randn(2, 9, CASES[name]["input"]["channels"], dtype=F64)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_stream_saved_midway_and_restored_continues_exactly(name):
    model = build_model(CASES[name], seed=0).double().eval()
    x = _inputs(model, name)
    with torch.no_grad():
        state = model.init_state(2)
        for t in range(4):
            _, state = model.step(x[:, t], state)
        flat = state.flatten()
        assert all(isinstance(v, torch.Tensor) for v in flat.values()) and "input.t" in flat
        restored, resumed = ModelState.unflatten({k: v.clone() for k, v in flat.items()}), state
        for t in range(4, x.shape[1]):
            y, resumed = model.step(x[:, t], resumed)
            y_r, restored = model.step(x[:, t], restored)
            torch.testing.assert_close(y_r, y, rtol=0, atol=0)
    assert restored.flatten().keys() == resumed.flatten().keys()


def test_the_flat_names_are_the_documented_ones():
    model = build_model(CASES["rechunk-time"], seed=0)
    names = set(model.init_state(1).flatten())
    core_names = set(model.stack.init_state(1)[0])
    assert names == ({"input.t", "reshape.buf", "reshape.fill", "pool2.total", "pool2.count", "pool2.last"}
                     | {f"layer{p}.{n}" for p in (0, 1) for n in core_names})


def test_an_adaptive_stream_round_trips_with_its_settings():
    model = build_model(spec(CLS, {"channels": 2}, depth=2), seed=0).double().eval()
    state = model.adaptive_init_state(2, max_depth=4, stop_at="block")
    assert state.adaptive == AdaptiveStream(4, "block") and state.depth == 4 and sorted(state.pools) == [0, 1, 2, 3, 4]
    x = torch.randn(2, 5, 2, dtype=F64)
    with torch.no_grad():
        _, state = model.adaptive_step(x[:, 0], state, epsilon=0.05)
        restored = ModelState.unflatten(state.flatten())
        assert restored.adaptive == state.adaptive and sorted(restored.pools) == sorted(state.pools)
        a, _ = model.adaptive_step(x[:, 1], state, epsilon=0.05)
        b, _ = model.adaptive_step(x[:, 1], restored, epsilon=0.05)
    assert torch.equal(a.output, b.output) and torch.equal(a.depth, b.depth)


def test_states_of_the_wrong_kind_are_refused_with_the_fix():
    plain = build_model(CASES["mean"], seed=0)
    reshaping = build_model(CASES["rechunk-time"], seed=0)
    with pytest.raises(UsageError, match="adaptive_init_state"):
        plain.adaptive_step(torch.randn(1, 2), plain.init_state(1))
    with pytest.raises(UsageError, match="no reshaping buffer"):
        reshaping.step(torch.randn(1, 5), plain.init_state(1))
    with pytest.raises(UsageError, match="ModelState.flatten"):
        ModelState.unflatten({"layer0.h": torch.zeros(1)})  # no input.t
    with pytest.raises(UsageError, match="unknown entries"):
        ModelState.unflatten({"input.t": torch.zeros(1, dtype=torch.long), "cache.k": torch.zeros(1)})


def test_positions_that_keep_no_tensors_survive_with_the_depth_given():
    state = ModelState(torch.zeros(1, dtype=torch.long), [{"h": torch.ones(1, 2)}, {}, {}])
    assert ModelState.unflatten(state.flatten()).depth == 1  # the names alone cannot say
    restored = ModelState.unflatten(state.flatten(), depth=3)
    assert restored.depth == 3 and torch.equal(restored.layers[0]["h"], state.layers[0]["h"])

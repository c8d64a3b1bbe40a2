"""zoo_core.stream and CoreBase.cached: the real-arithmetic step of S4, S4D, S5, LRU and LinOSS from cached constants."""

from __future__ import annotations

import pytest
import torch

from zoo_core.plugins import get_registry


def _core(kind: str, dtype=torch.float32):
    return get_registry().core(kind).load()(d_model=4, d_state=16, dtype=dtype)


@pytest.mark.parametrize("kind", ["s4", "s4d", "s5", "lru", "linoss"])
def test_real_view_step_equals_the_complex_step_and_the_forward(kind):
    core = _core(kind, torch.float64)
    state = core.init_state(3)
    real = {"h": torch.view_as_real(state["h"]).clone()}
    x = torch.randn(3, 7, 4, dtype=torch.float64)
    with torch.no_grad():
        y_all, h_last = core.forward_with_state(x)  # the parallel path: independent of zoo_core.stream
        for t in range(7):
            y, state = core.step(x[:, t], state)
            y_r, real = core.step(x[:, t], real)
            assert not real["h"].is_complex() and real["h"].shape == (*state["h"].shape, 2)
            torch.testing.assert_close(y, y_all[:, t], rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(y_r, y, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state["h"], h_last["h"], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(torch.view_as_complex(real["h"]), state["h"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["s4", "s4d", "s5", "lru", "linoss"])
def test_cached_constants_follow_parameter_updates_and_gradients(kind):
    core = _core(kind)
    x, state = torch.randn(2, 4), core.init_state(2)
    with torch.no_grad():
        first = core.stream()
        assert core.stream() is first  # reused while nothing changed
        y0, _ = core.step(x, state)
        for p in core.parameters():
            p.mul_(1.1)  # in place, as an optimiser step: the version changes
        assert core.stream() is not first
        y1, _ = core.step(x, state)
    assert not torch.equal(y0, y1)
    other = _core(kind)
    with torch.no_grad():
        core.load_state_dict(other.state_dict())  # copies into the same tensors: their versions move on
        torch.testing.assert_close(core.step(x, state)[0], other.step(x, state)[0])
        if "continuous_time" in core.capabilities:
            h = {"h": torch.randn_like(state["h"])}
            core.rescale_dt(2.0)  # not a parameter: rescale_dt forgets the cache
            torch.testing.assert_close(core.step(x, h)[0], core.forward_with_state(x[:, None], h)[0][:, 0])
            before = core.step(x, h)[0]
            core.dt_scale = core.dt_scale * 1.5  # set directly (as rescale_sampling_rate restores it): in the key
            after = core.step(x, h)[0]
            assert not torch.equal(before, after)
            torch.testing.assert_close(after, core.forward_with_state(x[:, None], h)[0][:, 0])
    with torch.inference_mode():  # cached there too, as normal tensors (usable once inference mode ends)
        kept = core.stream()
        assert core.stream() is kept
    assert not any(v.is_inference() for v in vars(kept).values() if isinstance(v, torch.Tensor))
    with torch.no_grad():
        assert core.stream() is kept
        name, p = next((n, p) for n, p in core.named_parameters() if "." not in n)
        setattr(core, name, torch.nn.Parameter(p.detach().clone()))  # replaced (load_state_dict(assign=True)): a new key
        assert core.stream() is not kept
    # with gradients the constants are computed in the graph: every parameter the step reads gets one
    y, _ = core.step(x, {"h": torch.randn_like(state["h"])})  # a non-zero state: the decays matter
    y.sum().backward()
    missing = [n for n, p in core.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert not missing, f"{kind}: no gradient through step for {missing}"


@pytest.mark.parametrize("kind", ["s5", "lru", "linoss", "s4d", "s4"])
def test_dense_step_is_the_elementwise_step_as_one_matrix(kind):
    """The real-view step's dense map (what the exported stream model runs, for a state shared across channels)
    equals the elementwise ops it is read off, for states and inputs it was not read off at; with gradients asked
    for, the step keeps the ops. Per-channel states (S4D, S4) keep their elementwise ops."""
    core = _core(kind, torch.float64)
    with torch.no_grad():
        form = core.stream()
        assert (form.dense is None) == form.per_channel
        h = torch.randn(5, *form.state_shape(), dtype=torch.float64)
        x = torch.randn(5, 4, dtype=torch.float64)
        y, new = form.step(x, h)
        y_ops, new_ops = form._ops(x, h)
        torch.testing.assert_close(y, y_ops, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(new, new_ops, rtol=1e-12, atol=1e-12)
        if kind != "linoss":  # a state of another precision: the elementwise ops, promoted (LinOSS's einsums do not)
            torch.testing.assert_close(form.step(x, h.float())[1], new_ops, rtol=1e-6, atol=1e-6)
    real = torch.randn(2, *form.state_shape(), dtype=torch.float64)
    with_grad = core.stream()
    assert with_grad.dense is None  # backpropagated: the ops, whose gradients reach the parameters
    y, new = core.step(x[:2], {"h": real})
    (y.sum() + new["h"].sum()).backward()
    assert all(p.grad is not None for p in core.parameters())
    torch.testing.assert_close(y.detach(), form.step(x[:2], real)[0], rtol=1e-12, atol=1e-12)


def test_a_large_state_keeps_the_elementwise_step():
    """Past ``DENSE_MACS`` the dense map would cost more than the ops it replaces: none is built."""
    from zoo_core import stream

    big = get_registry().core("s5").load()(d_model=4, d_state=256)
    with torch.no_grad():
        form = big.stream()
        n = 1
        for size in form.state_shape():  # the real view of d_state / 2 complex states
            n *= size
        assert form.dense is None and (n + 4) ** 2 > stream.DENSE_MACS
        h = torch.randn(2, *form.state_shape())
        torch.testing.assert_close(form.step(torch.randn(2, 4), h)[1].shape, h.shape)


def test_inference_tensors_keep_the_elementwise_step():
    """A core made under inference_mode cannot cache its form (its parameters have no version counter), so the
    dense map, read off at every step, would cost more than it saves: none is built."""
    with torch.inference_mode():
        core = _core("s5")
        assert core.stream().dense is None
        y, _ = core.step(torch.randn(2, 4), core.init_state(2))
        assert y.shape == (2, 4)
